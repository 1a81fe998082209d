"""The warm Spark server's bookkeeping, against a stand-in process (no JVM): runs use a server
only when it is recorded, alive, accepting connections and started with the code on disk now;
`stop` takes its whole process group down and forgets it."""

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from rollup_assets.resources import spark_server
from rollup_assets.settings import Settings
from tests.system.cluster import free_port

# Listens on the port given, then waits; its command line names the server class, as the
# real server's does, and it starts a child in its process group (as the JVM starts workers).
STAND_IN = (
    "import socket, subprocess, sys, time; s = socket.socket(); "
    "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)"
)


@pytest.fixture
def stand_in(tmp_path: Path):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", STAND_IN, str(port), spark_server.SERVER_CLASS],
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while not spark_server.accepts(port):
        assert time.monotonic() < deadline, "stand-in server did not listen"
        time.sleep(0.05)
    yield proc, port
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def record(state_dir: Path, pid: int, port: int, code: str) -> spark_server.ServerState:
    state = spark_server.ServerState(
        url=f"sc://127.0.0.1:{port}",
        pid=pid,
        port=port,
        master="local[2]",
        code=code,
        started_at="2026-11-23T00:00:00+00:00",
    )
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / spark_server.STATE_FILE).write_text(json.dumps(asdict(state)))
    return state


def test_nothing_recorded_is_not_usable(tmp_path: Path) -> None:
    found = spark_server.status(tmp_path / "none")
    assert not found.usable and found.state is None
    assert "no warm Spark server recorded" in found.reason


def test_a_live_current_server_is_used_and_stop_takes_its_group_down(
    tmp_path: Path, stand_in
) -> None:
    proc, port = stand_in
    state = record(tmp_path, proc.pid, port, spark_server.code_fingerprint())
    found = spark_server.status(tmp_path)
    assert found.usable and found.state == state, found.reason

    assert spark_server.stop(tmp_path, timeout_s=10) == state
    assert proc.wait(10) is not None
    assert not spark_server._group_alive(proc.pid)  # the child went with it
    assert spark_server.read_state(tmp_path) is None
    assert spark_server.stop(tmp_path) is None


def test_a_server_started_with_other_code_is_not_used(tmp_path: Path, stand_in) -> None:
    proc, port = stand_in
    record(tmp_path, proc.pid, port, "0123456789abcdef")
    found = spark_server.status(tmp_path)
    assert found.running and not found.usable
    assert "code changed" in found.reason and "restart" in found.reason


def test_a_recorded_pid_that_is_not_a_server_is_not_used(tmp_path: Path, stand_in) -> None:
    _, port = stand_in
    # This test process: alive, but not a Spark Connect server (a reused pid).
    record(tmp_path, os.getpid(), port, spark_server.code_fingerprint())
    found = spark_server.status(tmp_path)
    assert not found.usable and "not running" in found.reason
    # Stopping forgets it without signalling the process the pid now belongs to.
    assert spark_server.stop(tmp_path) is not None


def test_start_refuses_a_port_in_use(tmp_path: Path, stand_in) -> None:
    _, port = stand_in
    with pytest.raises(spark_server.SparkServerError, match=f"port {port} is already in use"):
        spark_server.start(tmp_path / "state", environ=os.environ, port=port)


def test_a_broken_state_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / spark_server.STATE_FILE).write_text("{not json")
    with pytest.raises(spark_server.SparkServerError, match="is not a server state"):
        spark_server.status(tmp_path)


def test_settings_place_the_server_in_the_home_unless_a_cluster_is_configured(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    s = Settings.from_env({"DAGSTER_HOME": str(home)})
    assert s.warm_spark_dir == home.resolve() / "spark-connect"
    assert s.uses_warm_spark and s.spark_server_port == 15002
    s = Settings.from_env(
        {
            "DAGSTER_HOME": str(home),
            "ROLLUPS_SPARK_SERVER_DIR": str(tmp_path / "elsewhere"),
            "ROLLUPS_SPARK_SERVER_PORT": "16000",
        }
    )
    assert s.warm_spark_dir == (tmp_path / "elsewhere").resolve()
    assert s.spark_server_port == 16000
    assert not Settings.from_env({"ROLLUPS_SPARK_MASTER": "spark://h:7077"}).uses_warm_spark
    assert not Settings.from_env({"ROLLUPS_SPARK_REMOTE": "sc://h:15002"}).uses_warm_spark


def test_runs_get_the_url_of_a_current_server_only_and_are_told_why_not(
    tmp_path: Path, stand_in, caplog: pytest.LogCaptureFixture
) -> None:
    proc, port = stand_in
    state = record(tmp_path, proc.pid, port, spark_server.code_fingerprint())
    assert spark_server.usable_url(tmp_path) == state.url
    record(tmp_path, proc.pid, port, "0123456789abcdef")
    with caplog.at_level("WARNING", logger="rollup_assets.resources.spark_server"):
        assert spark_server.usable_url(tmp_path) is None
    assert "code changed" in caplog.text
    assert spark_server.usable_url(tmp_path / "none") is None  # nothing recorded: no warning
