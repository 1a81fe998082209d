"""Real Spark processes for system tests, started from the installed pyspark (no downloads).

A standalone master and worker (`spark-class ...deploy.master.Master` / `...worker.Worker`) and a
Spark Connect server (`spark-submit --class ...SparkConnectServer` with the bundled connect jar),
each a separate JVM on free ports, each waited for by polling what it serves (the master's JSON
status, the Connect gRPC port plus its start line), and each stopped by its process group.
"""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rollup_assets.resources.delta_jars import delta_conf
from rollup_assets.resources.spark_server import SERVER_CLASS as CONNECT_SERVER
from rollup_assets.resources.spark_server import SPARK_HOME, connect_jar, spawn
from rollup_assets.settings import Settings

HOST = "127.0.0.1"
READY_TIMEOUT_S = 120.0
MASTER_URL = r"Starting Spark master at (spark://\S+)"
MASTER_UI_PORT = r"Successfully started service 'MasterUI' on port (\d+)\."


class SparkProcessError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@dataclass
class SparkProcess:
    name: str
    process: subprocess.Popen
    log: Path

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise SparkProcessError(
                f"{self.name} exited with {self.process.returncode}:\n{self.tail()}"
            )

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the process group (a worker's executors go with it), then SIGKILL."""
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout_s)


def launch(name: str, args: list[str], scratch: Path) -> SparkProcess:
    log = scratch / f"{name}.log"
    return SparkProcess(name, spawn(args, scratch, log, environ=os.environ), log)


def wait_until(what: str, ready: Callable[[], bool], procs: list[SparkProcess]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        for p in procs:
            p.check_alive()
        if ready():
            return
        time.sleep(0.5)
    logs = "\n".join(f"--- {p.name}\n{p.tail()}" for p in procs)
    raise SparkProcessError(f"{what} not ready after {READY_TIMEOUT_S:.0f} s\n{logs}")


@dataclass
class StandaloneCluster:
    master_url: str
    ui_url: str
    processes: list[SparkProcess]

    def status(self) -> dict:
        """The master's JSON status page (workers, apps)."""
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=5) as r:
            return json.load(r)

    def stop(self) -> None:
        for p in reversed(self.processes):  # worker first, then master
            p.stop()


def _status_or_none(cluster: StandaloneCluster) -> dict | None:
    try:
        return cluster.status()
    except (OSError, ValueError):  # not serving yet, or not (yet) its JSON
        return None


def _bound(process: SparkProcess, pattern: str) -> str | None:
    """The first group of `pattern` in the process's log so far, None while it is absent."""
    text = process.log.read_text(errors="replace") if process.log.exists() else ""
    found = re.search(pattern, text)
    return found.group(1) if found else None


@contextlib.contextmanager
def standalone_cluster(
    scratch: Path, cores: int = 2, memory: str = "1g"
) -> Iterator[StandaloneCluster]:
    """A master and one worker (`cores`, `memory`), stopped on exit whatever happened.

    Every port is the one the process itself bound (port 0, read back from its log): a port
    picked here and handed over could be taken in between, by a process of a test running
    beside this one, whose page then answers for the master."""
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    cluster = StandaloneCluster("", "", [])
    try:
        # The master's REST submission server binds a fixed port (6066) by default: off.
        (scratch / "conf").mkdir(parents=True, exist_ok=True)
        (scratch / "conf" / "spark-defaults.conf").write_text("spark.master.rest.enabled false\n")
        master_args = ["--host", HOST, "--port", "0", "--webui-port", "0"]
        master = launch(
            "master", [spark_class, "org.apache.spark.deploy.master.Master", *master_args], scratch
        )
        cluster.processes.append(master)
        wait_until(
            "spark master's ports",
            lambda: bool(_bound(master, MASTER_URL) and _bound(master, MASTER_UI_PORT)),
            [master],
        )
        cluster.master_url = str(_bound(master, MASTER_URL))
        cluster.ui_url = f"http://{HOST}:{_bound(master, MASTER_UI_PORT)}"
        wait_until(
            "spark master",
            lambda: (_status_or_none(cluster) or {}).get("status") == "ALIVE",
            [master],
        )
        worker_args = ["--host", HOST, "--port", "0", "--webui-port", "0"]
        worker_args += ["--cores", str(cores), "--memory", memory]
        worker_args += ["--work-dir", str(scratch / "work")]
        worker = launch(
            "worker",
            [
                spark_class,
                "org.apache.spark.deploy.worker.Worker",
                *worker_args,
                cluster.master_url,
            ],
            scratch,
        )
        cluster.processes.append(worker)
        wait_until(
            "spark worker",
            lambda: (_status_or_none(cluster) or {}).get("aliveworkers") == 1,
            [master, worker],
        )
        yield cluster
    finally:
        cluster.stop()


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((HOST, port)) == 0


@dataclass
class ConnectServer:
    url: str
    process: SparkProcess


@contextlib.contextmanager
def connect_server(scratch: Path, master: str = "local[2]") -> Iterator[ConnectServer]:
    """pyspark's bundled Spark Connect server (its own driver JVM, `master` for its executors),
    with Delta loaded as a deployment's server has it (docs/deployment.md)."""
    port = free_port()
    scratch.mkdir(parents=True, exist_ok=True)
    args = [str(SPARK_HOME / "bin" / "spark-submit"), "--class", CONNECT_SERVER]
    args += ["--master", master, "--name", "rollups-connect-test"]
    for conf in (
        f"spark.connect.grpc.binding.address={HOST}",
        f"spark.connect.grpc.binding.port={port}",
        "spark.connect.grpc.port.maxRetries=0",  # that port or fail, never another one
        "spark.ui.enabled=false",
        "spark.driver.memory=1g",
        "spark.sql.shuffle.partitions=4",
        *[f"{k}={v}" for k, v in delta_conf(Settings.from_env().delta_jars).items()],
    ):
        args += ["--conf", conf]
    server = launch("connect-server", [*args, str(connect_jar())], scratch)
    try:
        wait_until(
            "spark connect server",
            lambda: "Spark Connect server started" in server.tail(200) and _accepts(port),
            [server],
        )
        yield ConnectServer(f"sc://{HOST}:{port}", server)
    finally:
        server.stop()


def run_chain_scenario(
    spark_url: str, scratch: Path, warehouse: str | None = None, timeout_s: float = 540.0
) -> dict:
    """`tests.system.chain_scenario` in a fresh interpreter against `spark_url`; its result."""
    out = scratch / "result.json"
    confs = {
        "spark.driver.memory": "1g",
        "spark.executor.memory": "1g",
        "spark.sql.shuffle.partitions": "4",
    }
    args = [sys.executable, "-m", "tests.system.chain_scenario", "--spark", spark_url]
    args += ["--root", str(scratch), "--out", str(out)]
    if warehouse:
        args += ["--warehouse", warehouse]
    for k, v in confs.items():
        args += ["--conf", f"{k}={v}"]
    log = scratch / "scenario.log"
    with log.open("wb") as f:
        done = subprocess.run(
            args,
            cwd=Path(__file__).resolve().parents[2],
            env={k: v for k, v in os.environ.items() if not k.startswith("ROLLUPS_SPARK")},
            stdin=subprocess.DEVNULL,
            stdout=f,
            stderr=subprocess.STDOUT,
            timeout=timeout_s,
        )
    if not out.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-60:])
        raise SparkProcessError(f"scenario wrote no result (exit {done.returncode}):\n{tail}")
    result = json.loads(out.read_text())
    result["exit_code"] = done.returncode
    return result
