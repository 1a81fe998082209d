"""A run whose process is gone is found by the run lookup, whatever says which process it was: an
in-process run's own tag, or the launcher's worker it was handed to, before that worker reported
anything. A re-executed run carries its parent's tags: the parent's worker says nothing of it."""

import os
import socket
import subprocess
import sys

import dagster as dg
import pytest

from rollup_assets.model.jobs import Lane
from rollup_assets.orchestration.runs import DagsterRunLookup
from rollup_assets.orchestration.tags import TAG_HOST, TAG_LANE, TAG_PID, TAG_WORKER, worker_tag


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _tags(pid_tag: str, pid: int, run_id: str) -> dict[str, str]:
    value = worker_tag(pid, run_id) if pid_tag == TAG_WORKER else str(pid)
    return {TAG_LANE: Lane.RECOMPUTE.value, TAG_HOST: socket.gethostname(), pid_tag: value}


@pytest.mark.parametrize("pid_tag", [TAG_PID, TAG_WORKER])
def test_an_unfinished_run_whose_process_is_gone_is_dead(pid_tag: str) -> None:
    with dg.DagsterInstance.ephemeral() as instance:
        runs = {}
        for name, pid in (("gone", _dead_pid()), ("alive", os.getpid())):
            run_id = f"run-{name}"
            run = dg.DagsterRun(
                job_name="probe",
                run_id=run_id,
                status=dg.DagsterRunStatus.STARTING,
                tags=_tags(pid_tag, pid, run_id),
            )
            runs[name] = instance.add_run(run).run_id
        dead = DagsterRunLookup(instance).dead_runs(Lane.RECOMPUTE)
        assert [r.run_id for r in dead] == [runs["gone"]]


def test_a_run_carrying_its_parents_worker_is_not_taken_for_dead() -> None:
    with dg.DagsterInstance.ephemeral() as instance:
        run = dg.DagsterRun(
            job_name="probe",
            run_id="re-executed",
            status=dg.DagsterRunStatus.STARTING,
            tags=_tags(TAG_WORKER, _dead_pid(), "its-parent"),
        )
        instance.add_run(run)
        assert DagsterRunLookup(instance).dead_runs(Lane.RECOMPUTE) == []
