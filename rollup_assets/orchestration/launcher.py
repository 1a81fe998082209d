"""Runs that start in a process which has already loaded the code location.

Dagster's `DefaultRunLauncher` asks the code server to start each run, and the server spawns a
new Python process that imports Dagster and the code location before the run can begin: a third
of a one-reading correction's latency through the daemon. `WarmRunLauncher` (the launcher of every
home `rollups` writes) keeps one process ready per code location instead. That process has
imported the code location and opened the instance, and it waits on its stdin for a run id. A
launch hands the run over, waits for the process to say it holds the run, and starts the next
process (its imports take one core while the run takes another). Each run still has a process of
its own, started fresh (spawned, never forked from one that ran anything).

When no ready process fits, a new one is started for the run, as slow as Dagster's own. That
happens for the first run after the launcher starts, and for a code location whose server was
reloaded since its process was made ready (that process holds the old code and is discarded).
A run whose code runs in another Python goes through the code server, as before.

A run handed to a worker carries its host and the worker's pid (`tags.TAG_HOST`, `TAG_WORKER`).
`terminate` (the UI's, from any process on that host) marks the run canceling and interrupts
its process, which ends the run as Dagster's own run worker does. A worker whose process is
gone is failed by the run lookup's reaping.

`python -m rollup_assets.orchestration.launcher FD` is the worker. It reads its preload (the
repository's origin and the instance's ref, a line each) from stdin, then a run id, and reports
on `FD`.
"""

import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any, NoReturn

import dagster as dg
from dagster._cli.api import _execute_run_command_body
from dagster._core.errors import DagsterLaunchFailedError
from dagster._core.instance import InstanceRef
from dagster._core.launcher.base import LaunchRunContext
from dagster._core.origin import RepositoryPythonOrigin
from dagster._core.remote_representation.code_location import GrpcServerCodeLocation
from dagster._serdes import ConfigurableClassData, deserialize_value, serialize_value
from dagster._utils.hosted_user_process import recon_repository_from_origin
from dagster._utils.interrupts import capture_interrupts

from rollup_assets.orchestration.tags import TAG_HOST, TAG_WORKER
from rollup_assets.resources.processes import exit_after_python, pid_alive

log = logging.getLogger(__name__)

WORKER = "rollup_assets.orchestration.launcher"
# A new worker imports Dagster and the code location before it can take a run.
HANDOFF_TIMEOUT_S = 300.0


class WorkerFailedError(DagsterLaunchFailedError):
    """A run's worker ended, or said it could not run it, before it held the run."""


@dataclass
class _Worker:
    """One worker process: its stdin (preload, then a run id) and the read end it reports on."""

    proc: subprocess.Popen
    report: int
    key: tuple[str, str]

    @classmethod
    def start(
        cls, origin: RepositoryPythonOrigin, ref: InstanceRef, key: tuple[str, str]
    ) -> "_Worker":
        read, write = os.pipe()
        try:
            proc = subprocess.Popen(
                [origin.executable_path, "-m", WORKER, str(write)],
                stdin=subprocess.PIPE,
                pass_fds=(write,),
            )
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        stdin: IO[bytes] = proc.stdin  # type: ignore[assignment]
        stdin.write(f"{serialize_value(origin)}\n{serialize_value(ref)}\n".encode())
        stdin.flush()
        return cls(proc, read, key)

    def usable(self) -> bool:
        return self.proc.poll() is None

    def hand(self, run_id: str, timeout: float) -> int:
        """Give the worker `run_id`; its pid once it holds the run."""
        stdin: IO[bytes] = self.proc.stdin  # type: ignore[assignment]
        try:
            stdin.write(run_id.encode() + b"\n")
            stdin.close()
            said = _read_report(self.report, timeout)
        except OSError as exc:  # the worker is gone (a broken pipe)
            said = f"error it could not be written to ({exc})"
        finally:
            os.close(self.report)
        if said.startswith("started "):
            return int(said.split()[1])
        if self.proc.poll() is None:
            self.proc.kill()
        code = self.proc.wait()
        reason = said.removeprefix("error ") or f"it exited with status {code}"
        raise WorkerFailedError(
            f"the run worker (pid {self.proc.pid}) did not start run {run_id}: {reason}"
        )

    def discard(self) -> None:
        os.close(self.report)
        if self.proc.poll() is None:
            self.proc.kill()  # idle: it holds no run
        self.proc.wait()


def _read_report(fd: int, timeout: float) -> str:
    """The worker's one-line report, or what is known when it ends or times out first."""
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            return f"error no report within {timeout:.0f} s"
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


class WarmRunLauncher(dg.DefaultRunLauncher):
    """Starts each run in a process of its own that has already loaded the code location (see
    the module's docstring); Dagster's code server starts the rest."""

    def __init__(self, inst_data: ConfigurableClassData | None = None) -> None:
        super().__init__(inst_data=inst_data)
        self._lock = threading.Lock()
        self._ready: dict[str, _Worker] = {}  # repository origin id -> its ready worker
        self._disposed = False

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]
    ) -> "WarmRunLauncher":
        return cls(inst_data=inst_data)

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        origin = run.job_code_origin.repository_origin if run.job_code_origin else None
        if origin is None or not _same_python(origin.executable_path):
            super().launch_run(context)
            return
        key = (origin.get_id(), _server_id(context, run))
        ready = self._take(origin.get_id(), key)
        worker = ready or _Worker.start(origin, self._instance.get_ref(), key)
        try:
            pid = worker.hand(run.run_id, HANDOFF_TIMEOUT_S)
        except WorkerFailedError:
            if ready is None:
                raise
            # A worker made ready earlier failed (its load, or it died idle): a new one loads
            # the code location as it is now, and says why if it fails too.
            worker = _Worker.start(origin, self._instance.get_ref(), key)
            pid = worker.hand(run.run_id, HANDOFF_TIMEOUT_S)
        self._instance.add_run_tags(
            run.run_id, {TAG_HOST: socket.gethostname(), TAG_WORKER: str(pid)}
        )
        self._run_ids.add(run.run_id)
        # Reaped when it ends; meanwhile the next worker loads on another core, so a run
        # launched right after this one (a publish, then a correction) finds it ready or nearly.
        threading.Thread(target=worker.proc.wait, name=f"rollups-run-{pid}", daemon=True).start()
        self._make_ready(origin, key)

    def _take(self, origin_id: str, key: tuple[str, str]) -> _Worker | None:
        """The ready worker for this code location, if it still fits; None when a new one is
        needed (none ready, one of an earlier server's code, or one that died)."""
        with self._lock:
            worker = self._ready.pop(origin_id, None)
        if worker is not None and (worker.key != key or not worker.usable()):
            worker.discard()
            return None
        return worker

    def _make_ready(self, origin: RepositoryPythonOrigin, key: tuple[str, str]) -> None:
        """Start the next worker of this code location, unless one is ready already."""
        with self._lock:
            if self._disposed or origin.get_id() in self._ready:
                return
            try:
                self._ready[origin.get_id()] = _Worker.start(origin, self._instance.get_ref(), key)
            except OSError as exc:
                log.warning("could not make a run worker ready (%s); the next run starts one", exc)

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id) if self.has_instance else None
        pid = run.tags.get(TAG_WORKER) if run else None
        if run is None or pid is None:
            return super().terminate(run_id)
        if run.is_finished:
            return False
        self._instance.report_run_canceling(run)
        if run.tags.get(TAG_HOST) != socket.gethostname() or not pid_alive(int(pid)):
            self._instance.report_engine_event(
                f"run worker (pid {pid}) is not running on this host: cannot interrupt it",
                dagster_run=run,
                cls=self.__class__,
            )
            return False
        os.kill(int(pid), signal.SIGINT)
        return True

    def dispose(self) -> None:
        with self._lock:
            self._disposed = True
            ready, self._ready = list(self._ready.values()), {}
        for worker in ready:
            worker.discard()
        super().dispose()


def _same_python(executable: str | None) -> bool:
    """Does the code location run in this Python (whose environment holds the worker)?"""
    if not executable:
        return False
    try:
        return os.path.samefile(executable, sys.executable)
    except OSError:
        return False


def _server_id(context: LaunchRunContext, run: dg.DagsterRun) -> str:
    """The id of the code server that serves the run's code location now: it changes when the
    location is reloaded, and a worker made ready before then holds the old code."""
    origin = run.remote_job_origin
    if context.workspace is None or origin is None:
        return ""
    location = context.workspace.get_code_location(
        origin.repository_origin.code_location_origin.location_name
    )
    return location.server_id if isinstance(location, GrpcServerCodeLocation) else ""


def serve(report_fd: int) -> int:
    """The worker: load the code location and open the instance, wait for a run id, say it holds
    the run, and run it as Dagster's own run worker does. 0 when it was handed no run."""
    report = os.fdopen(report_fd, "w")
    failure = None
    instance = None
    try:
        origin = deserialize_value(sys.stdin.readline(), RepositoryPythonOrigin)
        ref = deserialize_value(sys.stdin.readline(), InstanceRef)
        instance = dg.DagsterInstance.from_ref(ref)
        recon_repository_from_origin(origin).get_definition()
    except Exception as exc:
        failure = f"loading the code location failed: {type(exc).__name__}: {exc}"
    run_id = sys.stdin.readline().strip()
    if not run_id:
        return 0  # discarded, or its launcher ended
    if failure is None and instance is not None and instance.get_run_by_id(run_id) is None:
        failure = f"run {run_id} is not in the instance"
    if failure is not None or instance is None:
        report.write(f"error {failure}\n")
        report.close()
        return 1
    # Interrupts (terminate()) are held from before the launcher learns the pid until the run
    # reaches a point where it can stop, as in Dagster's own run worker.
    with instance, capture_interrupts():
        report.write(f"started {os.getpid()}\n")
        report.close()
        return _execute_run_command_body(
            run_id, instance, lambda _event: None, set_exit_code_on_failure=False
        )


def main() -> NoReturn:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # inherited as ignored, maybe
    try:
        code = serve(int(sys.argv[1]))
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    exit_after_python(code)


if __name__ == "__main__":
    main()
