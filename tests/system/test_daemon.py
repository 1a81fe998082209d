"""The real daemon corrects a late write at every level without any manual step.

The chain is built in-process against a persistent Dagster home; then `dagster-daemon run`
takes over: its sensors detect the write in the raw table's change feed, launch the recomputes
level by level (each run a subprocess with its own Spark), and refresh the open buckets. The
end-to-end latency (raw commit -> last level's commit) is written to test-artifacts/.
"""

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rollup_assets.assembly import build_definitions
from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.instance import ensure_pools
from rollup_assets.orchestration.resources import WarehouseResource
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.engine import Engine
from rollup_assets.settings import Settings
from tests.conftest import REPO_ARTIFACTS, World, days
from tests.oracle import compare_all
from tests.system.daemon import (
    daemon_env,
    latency_phases,
    running_daemon,
    settled,
    wait_for,
    write_home,
)

METER = "meter-0001"
DAYS = 10  # of history: the corrected day (six back) and at least two ISO weeks


def make_world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, storage_yaml: str = "") -> World:
    home, wh = tmp_path / "home", tmp_path / "warehouse"
    write_home(home, storage_yaml)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("ROLLUPS_WAREHOUSE", str(wh))
    catalog = load_catalog()
    instance = dg.DagsterInstance.from_config(str(home))
    ensure_pools(instance, catalog)
    defs = build_definitions(catalog, WarehouseResource(root=str(wh)), settings=Settings.from_env())
    return World(tmp_path, catalog, Engine(catalog, Warehouse(str(wh))), defs, instance)


def late_correction(day_start: datetime) -> pa.Table:
    batch = pa.concat_tables(
        [
            day_batch(d, 3, seed=9)
            for d in (day_start.date(), (day_start + timedelta(days=1)).date())
        ]
    )
    ts = batch["ts"]
    keep = pc.and_(
        pc.equal(batch["entity_id"], METER),
        pc.and_(
            pc.greater_equal(ts, pa.scalar(day_start, ts.type)),
            pc.less(ts, pa.scalar(day_start + timedelta(days=1), ts.type)),
        ),
    )
    day = batch.filter(keep)
    return day.set_column(2, "energy_kwh", pc.add(day["energy_kwh"], 1.0))


def build_history(world: World) -> datetime:
    """DAYS days of three meters, the whole chain built and equal to the raw data; the hour the
    history ends at."""
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    first = (now - timedelta(days=DAYS)).date()
    world.ops.activate("energy_raw", now=now)
    world.ingest(
        pa.concat_tables([day_batch(d, 3, seed=9) for d in days(first, DAYS)]), source="Import"
    )
    world.activate_all(now)
    start = datetime(first.year, first.month, first.day, tzinfo=UTC)
    world.backfill([Window(start, now)])
    # The wall clock, not the hour: the forward lane closes here what has closed by now, so the
    # daemon starts idle unless an hour closes during the test.
    world.tick(datetime.now(UTC))
    assert compare_all(world.query, world.raw(), world.catalog) == []
    return now


def run_daemon_scenario(world: World, tmp_path: Path, label: str) -> dict:
    now = build_history(world)

    env = daemon_env(Path(world.instance.root_directory), Path(world.engine.warehouse.root))
    with running_daemon(env, tmp_path / f"daemon-{label}.log"):
        wait_for(
            lambda: world.instance.get_daemon_heartbeats().get("SENSOR"),
            120,
            what="the sensor daemon",
        )
        # Let the forward lane finish what the real clock gave it (an hour may have closed since
        # the chain was built), so the latency below is the correction's own.
        wait_for(lambda: settled(world.instance), 300, what="the daemon to go idle")
        # A day six days back (UTC midnight to midnight) gets corrected values for one meter.
        day_start = (now - timedelta(days=6)).replace(hour=0)
        version = world.ingest(late_correction(day_start), source="Manual")
        committed = datetime.fromtimestamp(
            world.engine.raw.table(world.catalog.raw["energy_raw"]).history(1)[0]["timestamp"]
            / 1000,
            UTC,
        )
        raw = world.raw()

        def corrected() -> bool:
            return compare_all(world.query, raw, world.catalog) == []

        wait_for(corrected, 600, interval=5, what="every level to equal the raw data")
        done = datetime.now(UTC)
        # Stop only once no run is in flight: a run cut off by the stop would stay STARTING in
        # one read of the run storage and move on in the next.
        wait_for(lambda: settled(world.instance), 300, what="the daemon to go idle again")
    # The jobs that wrote after the correction's commit, up to the moment every level was seen
    # equal to the raw data (later ones, e.g. the next hour closing, are not the correction's).
    jobs = [
        j
        for n in world.catalog.rollups
        for j in world.engine.ledger.history(n, limit=200)
        if j.finished_at
        and j.created_at >= committed
        and j.finished_at <= done
        and j.windows_processed
    ]
    last_commit = max(j.finished_at for j in jobs)
    # The first level's correction was applied on the driver: its run never started Spark.
    hourly = world.instance.fetch_materializations(
        dg.AssetRecordsFilter(
            asset_key=dg.AssetKey("energy_hourly"), after_timestamp=committed.timestamp()
        ),
        limit=1000,
    ).records
    spark_use = sorted(
        {
            str(meta["spark"].value)
            for r in hourly
            # A run's last materialization carries its figures, what Spark it used among them.
            if (meta := r.asset_materialization.metadata)  # type: ignore[union-attr]
            and "spark" in meta
            and meta["trigger"].value not in ("Forward", "OpenBucket")
        }
    )
    result = {
        "storage": label,
        "raw_version": version,
        "commit_to_last_level_commit_s": round((last_commit - committed).total_seconds(), 1),
        "commit_to_verified_s": round((done - committed).total_seconds(), 1),
        # The daemon was stopped (its process group signalled) after this instant.
        "stopped_after": done.timestamp(),
        "runs": sorted({(j.rollup, j.trigger.value) for j in jobs}),
        "first_level_spark": spark_use,
        "phases": latency_phases(world.instance, committed, last_commit),
    }
    REPO_ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (REPO_ARTIFACTS / f"daemon_latency_{label}.json").write_text(
        json.dumps(result, indent=2, default=str)
    )
    levels = {j.rollup for j in jobs}
    assert {"energy_hourly", "energy_daily"} <= levels, levels
    assert spark_use == ["not started"], spark_use
    return result


def test_daemon_corrects_a_late_write_end_to_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark
) -> None:
    world = make_world(tmp_path, monkeypatch)
    try:
        result = run_daemon_scenario(world, tmp_path, "sqlite")
    finally:
        world.instance.dispose()
    assert result["commit_to_last_level_commit_s"] > 0
