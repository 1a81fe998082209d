"""The run launcher every home gets (`orchestration/launcher.py`), against a real code server:
runs start in a worker made ready beforehand, a worker that died idle or holds code older than
the server's is replaced, and a run is terminated from another process's instance."""

import os
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.launcher.base import WorkerStatus
from dagster._core.test_utils import poll_for_finished_run
from dagster._core.workspace.context import WorkspaceProcessContext, WorkspaceRequestContext
from dagster._core.workspace.load_target import ModuleTarget

from rollup_assets.orchestration.launcher import WarmRunLauncher
from rollup_assets.orchestration.tags import worker_pid
from tests.system.daemon import REPO, wait_for, write_home
from tests.system.launcher_location import probe as probe_job

LOCATION = "launcher_probe"


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[dg.DagsterInstance]:
    write_home(tmp_path / "home")
    with dg.DagsterInstance.from_config(str(tmp_path / "home")) as inst:
        yield inst


@pytest.fixture
def workspace(instance: dg.DagsterInstance) -> Iterator[WorkspaceProcessContext]:
    target = ModuleTarget(
        module_name="tests.system.launcher_location",
        attribute=None,
        working_directory=str(REPO),
        location_name=LOCATION,
    )
    with WorkspaceProcessContext(instance, target) as context:
        yield context


def launch(
    instance: dg.DagsterInstance, request: WorkspaceRequestContext, tags: dict[str, str]
) -> str:
    location = request.get_code_location(LOCATION)
    remote = location.get_repository("__repository__").get_full_job("probe")
    run = instance.create_run_for_job(
        job_def=probe_job,
        remote_job_origin=remote.get_remote_origin(),
        job_code_origin=remote.get_python_origin(),
        tags=tags,
    )
    instance.launch_run(run.run_id, request)
    return run.run_id


def finished(instance: dg.DagsterInstance, run_id: str) -> dg.DagsterRun:
    return poll_for_finished_run(instance, run_id, timeout=120)


def probe_pid(instance: dg.DagsterInstance, request: WorkspaceRequestContext, probe: Path) -> int:
    """Launch a probe run to its end (it must succeed); the pid of the process that ran it."""
    run = finished(instance, launch(instance, request, {"probe": str(probe)}))
    assert run.status == dg.DagsterRunStatus.SUCCESS, run.status
    pid = int(probe.read_text())
    assert worker_pid(run.tags, run.run_id) == pid
    return pid


@pytest.fixture
def launcher(instance: dg.DagsterInstance) -> WarmRunLauncher:
    assert isinstance(instance.run_launcher, WarmRunLauncher)
    return instance.run_launcher


def ready_worker(launcher: WarmRunLauncher) -> int:
    """The pid of the worker made ready for the probe's code location, once there is one."""

    def ready() -> int | None:
        workers = list(launcher._ready.values())
        return workers[0].proc.pid if workers else None

    return wait_for(ready, 120, interval=0.1, what="a ready run worker")


def test_each_run_starts_in_the_worker_made_ready_when_the_run_before_it_launched(
    instance: dg.DagsterInstance,
    launcher: WarmRunLauncher,
    workspace: WorkspaceProcessContext,
    tmp_path: Path,
) -> None:
    request = workspace.create_request_context()
    pids = [probe_pid(instance, request, tmp_path / "probe-0")]
    for i in (1, 2):
        warm = ready_worker(launcher)
        pids.append(probe_pid(instance, request, tmp_path / f"probe-{i}"))
        assert pids[-1] == warm  # the worker that was ready before the launch ran it
    assert len(set(pids)) == 3  # each run had a process of its own


def test_a_ready_worker_that_died_or_holds_older_code_is_replaced(
    instance: dg.DagsterInstance,
    launcher: WarmRunLauncher,
    workspace: WorkspaceProcessContext,
    tmp_path: Path,
) -> None:
    request = workspace.create_request_context()
    probe_pid(instance, request, tmp_path / "first")

    dead = ready_worker(launcher)
    os.kill(dead, 9)
    wait_for(lambda: not _alive(dead), 30, interval=0.1, what="the ready worker to die")
    assert probe_pid(instance, request, tmp_path / "after-death") != dead

    stale = ready_worker(launcher)
    workspace.reload_code_location(LOCATION)  # a new server: the ready worker's code is older
    request = workspace.create_request_context()
    assert probe_pid(instance, request, tmp_path / "after-reload") != stale
    wait_for(lambda: not _alive(stale), 30, interval=0.1, what="the stale worker to be discarded")


def test_a_run_is_terminated_from_another_process_instance(
    instance: dg.DagsterInstance, workspace: WorkspaceProcessContext, tmp_path: Path
) -> None:
    request = workspace.create_request_context()
    probe = tmp_path / "probe"
    run_id = launch(instance, request, {"probe": str(probe), "hold": str(tmp_path / "never")})
    wait_for(probe.exists, 120, interval=0.1, what="the run to start its op")
    # The UI terminates through an instance of its own, with a launcher that launched nothing.
    with dg.DagsterInstance.from_ref(instance.get_ref()) as other:
        assert other.run_launcher.terminate(run_id)
    run = finished(instance, run_id)
    assert run.status == dg.DagsterRunStatus.CANCELED, run.status
    wait_for(lambda: not _alive(int(probe.read_text())), 30, interval=0.1, what="its worker to end")


def test_run_monitoring_learns_that_a_run_whose_worker_is_gone_failed(
    instance: dg.DagsterInstance,
    launcher: WarmRunLauncher,
    workspace: WorkspaceProcessContext,
    tmp_path: Path,
) -> None:
    request = workspace.create_request_context()
    probe = tmp_path / "probe"
    run_id = launch(instance, request, {"probe": str(probe), "hold": str(tmp_path / "never")})
    wait_for(probe.exists, 120, interval=0.1, what="the run to start its op")
    run = instance.get_run_by_id(run_id)
    assert run is not None
    assert launcher.check_run_worker_health(run).status == WorkerStatus.RUNNING
    os.kill(int(probe.read_text()), 9)  # as an out-of-memory kill would
    wait_for(lambda: not _alive(int(probe.read_text())), 30, interval=0.1, what="the worker's end")
    # Gone once the launcher's thread waiting on the worker has reaped it (at once, unless the
    # machine is busy).
    wait_for(
        lambda: launcher.check_run_worker_health(run).status == WorkerStatus.FAILED,
        30,
        interval=0.1,
        what="run monitoring to learn that the worker is gone",
    )
    # A run no worker of this launcher holds is left to the code server, as before.
    other = dg.DagsterRun(job_name="probe", run_id="not-handed", status=dg.DagsterRunStatus.STARTED)
    assert launcher.check_run_worker_health(other).status == WorkerStatus.RUNNING


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A worker that ended but is not reaped yet is a zombie: gone for this test's purpose.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[-1][:1] != "Z"
