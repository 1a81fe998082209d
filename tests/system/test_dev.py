"""`make dev`'s processes: `rollups dev` starts a warm Spark server and `dagster dev` (UI,
daemon, code server); a correction the daemon picks up runs on the warm server, no JVM of its
own; a Ctrl-C stops everything, and no process is left behind."""

import os
import signal
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest

from rollup_assets.resources import spark_server
from tests.oracle import compare_all
from tests.system.cluster import free_port
from tests.system.daemon import BIN, REPO, daemon_env, settled, wait_for
from tests.system.test_daemon import build_history, late_correction, make_world


def processes_with(marker: str) -> list[int]:
    """Pids of this user's processes whose environment holds `marker` (here: the test's Dagster
    home, which every process `rollups dev` starts inherits)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_dev_runs_a_correction_on_the_warm_spark_server_and_stops_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark
) -> None:
    world = make_world(tmp_path, monkeypatch)
    home = Path(world.instance.root_directory)
    state_dir = home / "spark-connect"
    try:
        now = build_history(world)
        env = daemon_env(
            home,
            Path(world.engine.warehouse.root),
            {
                "ROLLUPS_SPARK_SERVER_PORT": str(free_port()),
                # A change to one meter recomputes whole buckets, and whole buckets are Spark's
                # work however small: the runs must use the warm server.
                "ROLLUPS_ENTITY_SCOPE_LIMIT": "0",
                "ROLLUPS_DRIVER_SOURCE_ROWS": "0",
            },
        )
        env.pop("ROLLUPS_SPARK_MASTER")  # the warm server serves the default local Spark
        ui_port = free_port()
        log_path = tmp_path / "dev.log"
        with log_path.open("wb") as log:
            dev = subprocess.Popen(
                [str(BIN / "rollups"), "dev", "--host", "127.0.0.1", "-p", str(ui_port)],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # as a terminal's foreground job: Ctrl-C reaches it
            )
        try:
            wait_for(
                lambda: spark_server.status(state_dir).usable or dev.poll() is not None,
                240,
                what="the warm Spark server",
            )
            assert dev.poll() is None, log_path.read_text()
            server = spark_server.read_state(state_dir)
            assert server is not None
            wait_for(
                lambda: world.instance.get_daemon_heartbeats().get("SENSOR"),
                180,
                what="the sensor daemon",
            )
            wait_for(lambda: settled(world.instance), 300, what="the daemon to go idle")

            committed = datetime.now(UTC)
            day_start = (now - timedelta(days=6)).replace(hour=0)
            world.ingest(late_correction(day_start), source="Manual")
            raw = world.raw()
            wait_for(
                lambda: compare_all(world.query, raw, world.catalog) == [],
                300,
                interval=3,
                what="every level to equal the raw data",
            )
            # The correction was applied as differences, on the driver. A recompute of the day
            # for every meter (queued by the command line, run by the daemon) is Spark's work.
            queued = subprocess.run(
                [
                    str(BIN / "rollups"),
                    "recompute",
                    "energy_hourly",
                    "--from",
                    day_start.isoformat(),
                    "--to",
                    (day_start + timedelta(days=1)).isoformat(),
                    "--no-wait",
                ],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert queued.returncode == 0, queued.stdout + queued.stderr

            def used() -> dict[str, set[str]]:
                records = world.instance.fetch_materializations(
                    dg.AssetRecordsFilter(
                        asset_key=dg.AssetKey("energy_hourly"),
                        after_timestamp=committed.timestamp(),
                    ),
                    limit=1000,
                ).records
                out: dict[str, set[str]] = {}
                for r in records:
                    meta = r.asset_materialization.metadata  # type: ignore[union-attr]
                    # A run's last materialization carries its figures (the Spark it used).
                    if (
                        meta
                        and "spark" in meta
                        and meta["trigger"].value not in ("Forward", "OpenBucket")
                    ):
                        out.setdefault(str(meta["trigger"].value), set()).add(
                            str(meta["spark"].value)
                        )
                return out

            wait_for(lambda: "Manual" in used(), 300, interval=3, what="the manual recompute")
            seen = used()
            started = {u for urls in seen.values() for u in urls if u != "not started"}
            assert started and all(u.startswith(server.url) for u in started), seen
            assert all(u.startswith(server.url) for u in seen["Manual"]), seen
            # What the recompute queued above it runs too before `rollups dev` is stopped.
            wait_for(lambda: settled(world.instance), 300, what="the daemon to go idle")
        finally:
            if dev.poll() is None:
                os.kill(dev.pid, signal.SIGINT)  # what Ctrl-C delivers to the foreground job
            code = dev.wait(120)
        assert code in (0, -signal.SIGINT, 128 + signal.SIGINT), log_path.read_text()[-3000:]
        assert spark_server.read_state(state_dir) is None
        # Nothing `rollups dev` started outlives it: server JVM, its Python workers, the UI,
        # the daemon, the code server and the runs.
        wait_for(lambda: not processes_with(str(home)), 30, what="every process to exit")
    finally:
        world.instance.dispose()
        for pid in processes_with(str(home)):
            os.kill(pid, signal.SIGKILL)
