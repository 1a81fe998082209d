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
its process, which ends the run as Dagster's own run worker does. A run whose worker of this
host is gone is failed by run monitoring (`check_run_worker_health`) and by the run lookup's
reaping. The tag names its run too: a re-executed run, which carries its parent's tags, is not
taken for the parent's worker.

`python -m rollup_assets.orchestration.launcher FD` is the worker. It reads its preload (the
repository's origin, the instance's ref, and whether it is made ready ahead of its run: a line
each) from stdin; made ready ahead, it makes the code location's engines and reads what every
run reads first (`resources.prepare_engines`: the ledger, above all, which a new process would
otherwise read whole) while it waits. Then it reads a run id, and reports on `FD`.
"""

import contextlib
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
from dagster._core.launcher.base import CheckRunHealthResult, LaunchRunContext, WorkerStatus
from dagster._core.origin import RepositoryPythonOrigin
from dagster._core.remote_representation.code_location import GrpcServerCodeLocation
from dagster._serdes import ConfigurableClassData, deserialize_value, serialize_value
from dagster._utils.hosted_user_process import recon_repository_from_origin
from dagster._utils.interrupts import capture_interrupts

from rollup_assets.orchestration.resources import prepare_engines
from rollup_assets.orchestration.tags import TAG_HOST, TAG_WORKER, worker_pid, worker_tag
from rollup_assets.resources.processes import exit_after_python, pid_alive

log = logging.getLogger(__name__)

WORKER = "rollup_assets.orchestration.launcher"
# A new worker imports Dagster and the code location before it can take a run.
HANDOFF_TIMEOUT_S = 300.0
# The preload line of a worker made ready ahead of its run: it prepares the engines as it waits.
PREPARE = "prepare"


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
        cls,
        origin: RepositoryPythonOrigin,
        ref: InstanceRef,
        key: tuple[str, str],
        *,
        ahead: bool = False,
    ) -> "_Worker":
        """A worker loading the code location; made `ahead` of its run, it also prepares the
        engines while it waits (a worker started for a run at hand leaves that to the run)."""
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
        worker = cls(proc, read, key)
        stdin: IO[bytes] = proc.stdin  # type: ignore[assignment]
        try:
            preload = (
                f"{serialize_value(origin)}\n{serialize_value(ref)}\n{PREPARE if ahead else ''}\n"
            )
            stdin.write(preload.encode())
            stdin.flush()
        except BaseException:
            worker.discard()
            raise
        return worker

    def usable(self) -> bool:
        return self.proc.poll() is None

    def hand(self, run_id: str, timeout: float) -> None:
        """Give the worker `run_id`; returns once the worker says it holds the run."""
        stdin: IO[bytes] = self.proc.stdin  # type: ignore[assignment]
        try:
            stdin.write(run_id.encode() + b"\n")
            stdin.flush()
            said = _read_report(self.report, timeout)
        except OSError as exc:  # the worker is gone (a broken pipe)
            said = f"error it could not be written to ({exc})"
        finally:
            _close(stdin)
            os.close(self.report)
        if said.startswith("started "):
            return
        if self.proc.poll() is None:
            self.proc.kill()
        code = self.proc.wait()
        reason = said.removeprefix("error ") or f"it exited with status {code}"
        raise WorkerFailedError(
            f"the run worker (pid {self.proc.pid}) did not start run {run_id}: {reason}"
        )

    def discard(self) -> None:
        _close(self.proc.stdin)  # type: ignore[arg-type]
        os.close(self.report)
        if self.proc.poll() is None:
            self.proc.kill()  # idle: it holds no run
        self.proc.wait()


def _close(stream: IO[bytes]) -> None:
    with contextlib.suppress(OSError):  # unflushed bytes for a worker that is gone
        stream.close()


def _read_report(fd: int, timeout: float) -> str:
    """The worker's one-line report, or what is known when it ends or times out first."""
    deadline = time.monotonic() + timeout
    data = b""
    poller = select.poll()  # any fd number (select() takes none past 1023)
    poller.register(fd, select.POLLIN)
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            return f"error no report within {timeout:.0f} s"
        if not poller.poll(left * 1000):
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
        server = _local_server(context, run)
        if origin is None or server is None or not _same_python(origin.executable_path):
            super().launch_run(context)
            return
        key = (origin.get_id(), server)
        ready = self._take(origin.get_id(), key)
        worker = ready or _Worker.start(origin, self._instance.get_ref(), key)
        try:
            self._hand(worker, run)
        except WorkerFailedError:
            now = self._instance.get_run_by_id(run.run_id)
            if ready is None or now is None or now.status != dg.DagsterRunStatus.STARTING:
                raise
            # A worker made ready earlier failed (its load, or it died idle): a new one loads
            # the code location as it is now, and says why if it fails too.
            worker = _Worker.start(origin, self._instance.get_ref(), key)
            self._hand(worker, run)
        self._run_ids.add(run.run_id)
        try:
            # Reaped when it ends; meanwhile the next worker loads on another core, so a run
            # launched right after this one (a publish, then a correction) finds it ready or
            # nearly.
            threading.Thread(
                target=worker.proc.wait, name="rollups-run-worker", daemon=True
            ).start()
            self._make_ready(origin, key)
        except Exception:
            log.exception("run %s started; making the next run worker ready failed", run.run_id)

    def _hand(self, worker: _Worker, run: dg.DagsterRun) -> None:
        """Tag `run` with its worker, then hand it over: a terminate or a health check finds the
        worker from the moment it may hold the run."""
        self._instance.add_run_tags(
            run.run_id,
            {TAG_HOST: socket.gethostname(), TAG_WORKER: worker_tag(worker.proc.pid, run.run_id)},
        )
        worker.hand(run.run_id, HANDOFF_TIMEOUT_S)

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
                self._ready[origin.get_id()] = _Worker.start(
                    origin, self._instance.get_ref(), key, ahead=True
                )
            except OSError as exc:
                log.warning("could not make a run worker ready (%s); the next run starts one", exc)

    def _held_here(self, run: dg.DagsterRun) -> int | None:
        """The pid of the worker of this host that `run` was handed to (None: another host's, or
        a run the code server started)."""
        pid = worker_pid(run.tags, run.run_id)
        return pid if pid is not None and run.tags.get(TAG_HOST) == socket.gethostname() else None

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id) if self.has_instance else None
        if run is None or worker_pid(run.tags, run.run_id) is None:
            return super().terminate(run_id)
        if run.is_finished:
            return False
        self._instance.report_run_canceling(run)
        pid = self._held_here(run)
        if pid is None or not pid_alive(pid):
            self._instance.report_engine_event(
                f"the run's worker ({run.tags.get(TAG_WORKER)} on {run.tags.get(TAG_HOST)}) is "
                "not running on this host: cannot interrupt it",
                dagster_run=run,
                cls=self.__class__,
            )
            return False
        os.kill(pid, signal.SIGINT)
        return True

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        """Run monitoring's question for a started run: a worker of this host that is gone failed
        (an out-of-memory kill, say). Runs the code server started, or other hosts' workers, are
        reported running, as Dagster's default launcher leaves them to the code server."""
        pid = self._held_here(run)
        if pid is None:
            return CheckRunHealthResult(WorkerStatus.RUNNING, "not held by a worker of this host")
        if pid_alive(pid):
            return CheckRunHealthResult(WorkerStatus.RUNNING, f"worker pid {pid} is running")
        return CheckRunHealthResult(WorkerStatus.FAILED, f"run worker (pid {pid}) is gone")

    def dispose(self) -> None:
        with self._lock:
            self._disposed = True
            ready, self._ready = list(self._ready.values()), {}
        for worker in ready:
            worker.discard()
        super().dispose()


def _same_python(executable: str | None) -> bool:
    """Does the code location run in this Python environment (which holds the worker)? The same
    `bin` directory, as written: the interpreters of two virtual environments may both link to
    one system Python."""
    if not executable:
        return False
    here = os.path.dirname(os.path.abspath(sys.executable))
    return os.path.dirname(os.path.abspath(executable)) == here


def _local_server(context: LaunchRunContext, run: dg.DagsterRun) -> str | None:
    """The id of the code server serving the run's code location when it runs on this host
    (None otherwise: its runs start through it). The id changes when the location is reloaded,
    and a worker made ready before then holds the old code."""
    origin = run.remote_job_origin
    if context.workspace is None or origin is None:
        return None
    location = context.workspace.get_code_location(
        origin.repository_origin.code_location_origin.location_name
    )
    if not isinstance(location, GrpcServerCodeLocation):
        return None
    local = location.socket is not None or location.host in {
        "localhost",
        "127.0.0.1",
        "::1",
        socket.gethostname(),
    }
    return location.server_id if local else None


def serve(report_fd: int) -> int:
    """The worker: load the code location and open the instance, wait for a run id, say it holds
    the run, and run it as Dagster's own run worker does. 0 when it was handed no run."""
    os.set_inheritable(report_fd, False)  # nothing the code location starts holds it open
    report = os.fdopen(report_fd, "w")
    failure = None
    instance = None
    try:
        # The whole preload is read first: a line that fails to load leaves no other behind,
        # to be taken for the run id.
        preload = [sys.stdin.readline() for _ in range(3)]
        origin = deserialize_value(preload[0], RepositoryPythonOrigin)
        ref = deserialize_value(preload[1], InstanceRef)
        ahead = preload[2].strip() == PREPARE
        instance = dg.DagsterInstance.from_ref(ref)
        recon_repository_from_origin(origin).get_definition()
    except Exception as exc:
        failure = f"loading the code location failed: {type(exc).__name__}: {exc}"
        ahead = False
    if ahead and failure is None:
        try:
            prepare_engines()
        except Exception as exc:  # the run reads what could not be read now
            log.warning("preparing the engines failed: %s: %s", type(exc).__name__, exc)
    run_id = sys.stdin.readline().strip()
    if not run_id:
        return 0  # discarded, or its launcher ended
    # The run names this worker already: a terminate from here on is held until the run can
    # stop, as in Dagster's own run worker.
    with capture_interrupts():
        if failure is None and instance is not None and instance.get_run_by_id(run_id) is None:
            failure = f"run {run_id} is not in the instance"
        if failure is not None or instance is None:
            report.write(f"error {failure}\n")
            report.close()
            return 1
        report.write(f"started {os.getpid()}\n")
        report.close()
        with instance:
            code = _execute_run_command_body(
                run_id, instance, lambda _event: None, set_exit_code_on_failure=False
            )
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminate arriving now finds the run over
    return code


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
