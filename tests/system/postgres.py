"""A throwaway PostgreSQL server for system tests, from the machine's PostgreSQL binaries.

`throwaway_postgres()` finds `initdb`/`pg_ctl`/`createdb` (Debian's /usr/lib/postgresql/<ver>/bin,
or `$PG_BIN`, or PATH), initialises a fresh cluster in a temporary directory with trust
authentication, starts it on a free TCP port on 127.0.0.1 (no Unix socket), creates one database,
yields its connection parameters, and stops the server and removes the directory on exit, also
when the body failed. PostgreSQL refuses to run as root: as root the server commands run as the
`postgres` user (which Debian's package creates) via `runuser`, on a directory that user owns.
"""

import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest

HOST = "127.0.0.1"
SUPERUSER = "postgres"
TIMEOUT_S = 120


class PostgresUnavailable(RuntimeError):
    """No usable PostgreSQL binaries (or, as root, no `postgres` user to run them as)."""


class PostgresError(RuntimeError):
    pass


@dataclass(frozen=True)
class PgParams:
    hostname: str
    port: int
    username: str
    db_name: str

    @property
    def url(self) -> str:
        return f"postgresql://{self.username}@{self.hostname}:{self.port}/{self.db_name}"

    def connect_kwargs(self) -> dict[str, object]:
        """For `psycopg2.connect(**...)`."""
        return {
            "host": self.hostname,
            "port": self.port,
            "user": self.username,
            "dbname": self.db_name,
        }


def find_bin_dir() -> Path:
    """The directory holding initdb, pg_ctl and createdb; the newest Debian version wins."""
    candidates: list[Path] = []
    if os.environ.get("PG_BIN"):
        candidates.append(Path(os.environ["PG_BIN"]))
    debian = Path("/usr/lib/postgresql")
    if debian.is_dir():
        versions = [p for p in debian.iterdir() if p.name.replace(".", "").isdigit()]
        versions.sort(key=lambda p: [int(x) for x in p.name.split(".")], reverse=True)
        candidates += [p / "bin" for p in versions]
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    for d in candidates:
        if all(os.access(d / tool, os.X_OK) for tool in ("initdb", "pg_ctl", "createdb")):
            return d
    raise PostgresUnavailable(
        "PostgreSQL server binaries (initdb, pg_ctl, createdb) not found in $PG_BIN, "
        "/usr/lib/postgresql/<version>/bin or on PATH; install Debian's `postgresql` package"
    )


def server_user() -> pwd.struct_passwd | None:
    """The account the server runs as: None for the current user, `postgres` when root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise PostgresUnavailable(
            "running as root, and PostgreSQL refuses to; no `postgres` user exists to run it as "
            "(Debian's `postgresql` package creates one)"
        ) from None


def require_postgres() -> Path:
    """The binaries' directory, or: fail on CI (`$CI` set), skip elsewhere, with the reason."""
    try:
        bin_dir = find_bin_dir()
        server_user()
    except PostgresUnavailable as e:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL is required on CI: {e}", pytrace=False)
        pytest.skip(f"no PostgreSQL server here: {e}")
    return bin_dir


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _as_server_user(cmd: list[str], user: pwd.struct_passwd | None) -> list[str]:
    if user is None:
        return cmd
    if shutil.which("runuser"):
        return ["runuser", "-u", user.pw_name, "--", *cmd]
    return ["su", user.pw_name, "-s", "/bin/sh", "-c", shlex.join(cmd)]


def _run(cmd: list[str], what: str, log: Path | None = None, cwd: Path | None = None) -> None:
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False, cwd=cwd
    )
    if proc.returncode != 0:
        server_log = log.read_text(errors="replace")[-4000:] if log and log.exists() else ""
        raise PostgresError(
            f"{what} failed ({proc.returncode}): {shlex.join(cmd)}\n"
            f"{proc.stdout}{proc.stderr}{server_log}"
        )


@contextmanager
def throwaway_postgres(db_name: str = "dagster", bin_dir: Path | None = None) -> Iterator[PgParams]:
    bin_dir = bin_dir or find_bin_dir()
    user = server_user()
    data = Path(tempfile.mkdtemp(prefix="pg-throwaway-"))
    if user is not None:
        os.chown(data, user.pw_uid, user.pw_gid)
    log = data / "server.log"
    port = free_port()
    cluster = data / "cluster"
    started = False
    try:
        _run(
            _as_server_user(
                [
                    str(bin_dir / "initdb"),
                    "-D",
                    str(cluster),
                    "-U",
                    SUPERUSER,
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                ],
                user,
            ),
            "initdb",
            cwd=data,  # the server user may not enter the caller's directory (root's home)
        )
        with open(cluster / "postgresql.conf", "a") as conf:
            # Loopback TCP only, no socket file; durability is pointless for a throwaway server.
            conf.write(
                f"\nlisten_addresses = '{HOST}'\nport = {port}\nunix_socket_directories = ''\n"
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
                "max_connections = 200\n"
            )
        started = True  # from here on, always try to stop it
        _run(
            _as_server_user(
                [
                    str(bin_dir / "pg_ctl"),
                    "start",
                    "-w",
                    "-t",
                    str(TIMEOUT_S),
                    "-D",
                    str(cluster),
                    "-l",
                    str(log),
                ],
                user,
            ),
            "pg_ctl start",
            log,
            cwd=data,
        )
        _run(
            [str(bin_dir / "createdb"), "-h", HOST, "-p", str(port), "-U", SUPERUSER, db_name],
            "createdb",
            log,
        )
        yield PgParams(hostname=HOST, port=port, username=SUPERUSER, db_name=db_name)
    finally:
        if started:
            _stop(bin_dir, cluster, user)
        shutil.rmtree(data, ignore_errors=True)


def _stop(bin_dir: Path, cluster: Path, user: pwd.struct_passwd | None) -> None:
    """Stop the server; never raise (that would hide the body's own failure)."""
    stop = [str(bin_dir / "pg_ctl"), "stop", "-w", "-t", "60", "-m", "fast", "-D", str(cluster)]
    with suppress(subprocess.TimeoutExpired):
        subprocess.run(
            _as_server_user(stop, user), cwd=cluster.parent, capture_output=True, timeout=90
        )
    # Still running? Kill the postmaster, if the pid file's process really is ours.
    try:
        pid = int((cluster / "postmaster.pid").read_text().split()[0])
        if str(cluster) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
            os.kill(pid, signal.SIGKILL)
            warnings.warn(f"killed PostgreSQL postmaster {pid}: pg_ctl stop failed", stacklevel=2)
    except (OSError, ValueError, IndexError):
        pass
