"""A warm Spark: a long-lived local Spark Connect server that runs attach to instead of each
starting a JVM.

`rollups dev` (and so `make dev`) starts one beside the Dagster daemon and stops it on exit;
`rollups spark-server start|stop|restart|status` manage it by hand. Its state lives in one
directory (by default `$DAGSTER_HOME/spark-connect`): `server.json` (URL, pid, the code it
started with) and `server.log`. A run uses the server when it is up and was started with the
code on disk now; otherwise it starts local Spark and says why. The code matters because the
server's Python workers import this project's modules once and keep them: after a code change
they would run the old code, so a stale server is never used (`restart` brings it up to date).
"""

import contextlib
import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyspark

from rollup_assets.resources.delta_jars import delta_conf
from rollup_assets.resources.processes import pid_alive
from rollup_assets.resources.spark import LOCAL_DEFAULTS, REQUIRED_CONF
from rollup_assets.settings import DEFAULT_DELTA_JARS

log = logging.getLogger(__name__)

SPARK_HOME = Path(pyspark.__file__).parent
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
HOST = "127.0.0.1"
DEFAULT_PORT = 15002
STATE_FILE = "server.json"
LOG_FILE = "server.log"
READY_LINE = "Spark Connect server started"
START_TIMEOUT_S = 180.0
# The packages whose code the server's Python workers run.
CODE_PACKAGES = ("rollup_assets", "resources", "sensors")


class SparkServerError(RuntimeError):
    """The warm Spark server could not be started, stopped or found."""


@dataclass(frozen=True)
class ServerState:
    url: str
    pid: int
    port: int
    master: str
    code: str
    started_at: str


@dataclass(frozen=True)
class Status:
    """What `status` found: `usable` means runs attach to `state.url`."""

    state: ServerState | None
    running: bool
    current: bool
    reason: str

    @property
    def usable(self) -> bool:
        return self.state is not None and self.running and self.current


def code_fingerprint(packages: Iterable[str] = CODE_PACKAGES) -> str:
    """A digest of the project's Python files (path, size, modification time)."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            st = path.stat()
            digest.update(f"{path.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def connect_jar() -> Path:
    jars = sorted((SPARK_HOME / "jars").glob("spark-connect_*.jar"))
    if not jars:
        raise SparkServerError(f"pyspark has no spark-connect jar in {SPARK_HOME / 'jars'}")
    return jars[-1]


def read_state(state_dir: Path) -> ServerState | None:
    try:
        return ServerState(**json.loads((state_dir / STATE_FILE).read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as exc:
        raise SparkServerError(f"{state_dir / STATE_FILE} is not a server state: {exc}") from None


def _is_server(pid: int) -> bool:
    """Is `pid` alive and a Spark Connect server (not another process that reused the pid)?"""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return pid_alive(pid)  # no /proc (macOS): alive is the best we can tell
    return SERVER_CLASS.encode() in cmdline


def accepts(port: int, host: str = HOST, timeout_s: float = 0.5) -> bool:
    with socket.socket() as s:
        s.settimeout(timeout_s)
        return s.connect_ex((host, port)) == 0


def status(state_dir: Path) -> Status:
    state = read_state(state_dir)
    if state is None:
        return Status(None, False, False, f"no warm Spark server recorded in {state_dir}")
    if not _is_server(state.pid):
        return Status(state, False, False, f"the server recorded at {state.url} is not running")
    if not accepts(state.port):
        return Status(state, False, False, f"the server at {state.url} does not accept connections")
    if state.code != code_fingerprint():
        return Status(
            state,
            True,
            False,
            f"the code changed since the server at {state.url} started ({state.started_at}); "
            "restart it: rollups spark-server restart",
        )
    return Status(
        state, True, True, f"up at {state.url} (pid {state.pid}, since {state.started_at})"
    )


def usable_url(state_dir: Path) -> str | None:
    """The URL runs attach to, or None (logging why, when a server was recorded but cannot be
    used) so that they start local Spark."""
    found = status(state_dir)
    if found.usable and found.state is not None:
        return found.state.url
    if found.state is not None:
        log.warning("not using the warm Spark server: %s; starting local Spark", found.reason)
    return None


def launch_env(
    directory: Path, *, environ: Mapping[str, str], python: str | None = None
) -> dict[str, str]:
    """The environment a Spark process is launched with from the installed pyspark: `environ`
    (the launching process's, passed down from its edge: its PATH and JAVA_HOME find Java) with
    `python` (default: this interpreter) for Python workers, logs under `directory`, and an
    empty conf dir there, so no machine-wide spark-defaults.conf leaks in."""
    conf_dir = directory / "conf"
    conf_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_CONF_DIR": str(conf_dir),
        "SPARK_LOG_DIR": str(directory / "logs"),
        "SPARK_LOCAL_IP": HOST,
        "PYSPARK_PYTHON": python or sys.executable,
    }
    for var in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED"):
        env.pop(var, None)
    return env


def spawn(
    args: list[str],
    directory: Path,
    log: Path,
    *,
    environ: Mapping[str, str],
    python: str | None = None,
) -> subprocess.Popen:
    """Start a Spark process (`args`) in `directory`, output to `log`, in its own process
    group so that it is stopped as a whole (a JVM and the workers it starts); its environment
    is `launch_env`'s."""
    with log.open("wb") as out:
        return subprocess.Popen(
            args,
            env=launch_env(directory, environ=environ, python=python),
            cwd=directory,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def start(
    state_dir: Path,
    *,
    environ: Mapping[str, str],
    port: int = DEFAULT_PORT,
    master: str = "local[2]",
    conf: Mapping[str, str] | None = None,
    timeout_s: float = START_TIMEOUT_S,
    delta_jars: Path = DEFAULT_DELTA_JARS,
    python: str | None = None,
) -> ServerState:
    """Start the server in `environ` with `python` for its Python workers (`launch_env`), with
    Delta's jars from `delta_jars` (its sessions read and write Delta tables through
    delta-spark), and wait until it accepts connections; its state is then recorded."""
    current = status(state_dir)
    if current.running and current.state is not None:
        raise SparkServerError(
            f"a warm Spark server is already running at {current.state.url} "
            "(rollups spark-server restart replaces it)"
        )
    if accepts(port):
        raise SparkServerError(
            f"port {port} is already in use by another process; choose another with "
            "ROLLUPS_SPARK_SERVER_PORT"
        )
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    settings = {
        **LOCAL_DEFAULTS,
        **REQUIRED_CONF,
        "spark.connect.grpc.binding.address": HOST,
        "spark.connect.grpc.binding.port": str(port),
        "spark.connect.grpc.port.maxRetries": "0",  # that port or fail, never another one
        **(conf or {}),
    }
    # Static settings: a Connect client cannot set them, so the server loads Delta at launch.
    settings.update(delta_conf(delta_jars, settings))
    args = [str(SPARK_HOME / "bin" / "spark-submit"), "--class", SERVER_CLASS]
    args += ["--master", master, "--name", "rollups-warm-spark"]
    for key, value in settings.items():
        args += ["--conf", f"{key}={value}"]
    args.append(str(connect_jar()))
    code = code_fingerprint()
    log = state_dir / LOG_FILE
    process = spawn(args, state_dir, log, environ=environ, python=python)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SparkServerError(
                f"the warm Spark server exited with {process.returncode} while starting:\n"
                + _tail(log)
            )
        if READY_LINE in _tail(log, 400) and accepts(port):
            state = ServerState(
                url=f"sc://{HOST}:{port}",
                pid=process.pid,
                port=port,
                master=master,
                code=code,
                started_at=datetime.now(UTC).isoformat(timespec="seconds"),
            )
            (state_dir / STATE_FILE).write_text(json.dumps(asdict(state), indent=2))
            return state
        time.sleep(0.5)
    _kill_group(process.pid, timeout_s=10)
    raise SparkServerError(
        f"the warm Spark server did not accept connections within {timeout_s:.0f} s:\n" + _tail(log)
    )


def stop(state_dir: Path, timeout_s: float = 30.0) -> ServerState | None:
    """Stop the recorded server (its whole process group) and forget it; None if none was
    recorded."""
    state = read_state(state_dir)
    if state is None:
        return None
    if _is_server(state.pid):
        _kill_group(state.pid, timeout_s)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    return state


def _kill_group(pid: int, timeout_s: float) -> None:
    """SIGTERM the process group (the JVM and its Python workers), then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not _group_alive(pid):
                return
            time.sleep(0.2)
    raise SparkServerError(f"the warm Spark server (process group {pid}) would not stop")


def _group_alive(pgid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-pgid, os.WNOHANG)[0]:
            pass  # reap the children this process started
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _tail(log: Path, lines: int = 40) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    return "\n".join(text.splitlines()[-lines:])
