"""A warehouse restored from a backup into an empty root reads like the original at every level,
with the same control state, and keeps working: a later correction is detected and every level
follows it."""

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from rollup_assets.assembly import build_definitions
from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.errors import AsOfUnavailableError
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.resources import WarehouseResource
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.backup import backup, restore
from rollup_assets.services.engine import Engine
from rollup_assets.services.query import query_arrow
from rollup_assets.settings import Settings
from tests.conftest import World, days, instance_in
from tests.oracle import compare_all

NOW = datetime(2025, 11, 15, 12, 0, tzinfo=UTC)
FIRST = date(2025, 10, 30)
N_DAYS = 4
METER = "meter-0001"


def reads(world: World) -> dict[str, pa.Table]:
    return {name: world.query(name) for name in world.catalog.names()}


def test_a_restored_warehouse_reads_the_same_and_follows_a_later_correction(
    world: World, tmp_path: Path
) -> None:
    world.ops.activate("energy_raw", now=NOW)
    for d in days(FIRST, N_DAYS):
        world.ingest(day_batch(d, 3, seed=7), source="Import")
    world.activate_all(NOW)
    start = datetime(FIRST.year, FIRST.month, FIRST.day, tzinfo=UTC)
    world.backfill([Window(start, start + timedelta(days=N_DAYS))])
    world.tick(NOW)
    assert compare_all(world.query, world.raw(), world.catalog) == []
    before = reads(world)
    assert all(t.num_rows for t in before.values())

    manifest = backup(world.engine, str(tmp_path / "backup"))
    source_root = Path(world.engine.warehouse.root)
    every_table = {str(p.parent.relative_to(source_root)) for p in source_root.rglob("_delta_log")}
    assert {t.path for t in manifest.tables} == every_table
    assert {"raw/energy_raw", "_control/archives", "_control/ledger"} < every_table
    assert {f"rollups/{n}" for n in world.catalog.rollups} < every_table

    root = tmp_path / "restored"
    home = tmp_path / "restored_home"
    home.mkdir()
    defs = build_definitions(
        world.catalog, WarehouseResource(root=str(root)), settings=Settings.from_env()
    )
    with instance_in(home, world.catalog) as instance:
        engine = Engine(world.catalog, Warehouse(str(root)))
        restore(engine, str(tmp_path / "backup"))
        restored = World(tmp_path, world.catalog, engine, defs, instance)

        assert reads(restored) == before
        assert engine.states.all() == world.engine.states.all()
        assert engine.ledger.snapshot() == world.engine.ledger.snapshot()
        # As of each earlier commit of a rollup, the restored warehouse reads what the original
        # does, or (the files of that version were not backed up) says so: never a raw error.
        hourly = world.catalog.rollup("energy_hourly")
        history = DeltaTable(world.engine.rollups.uri(hourly)).history()
        for commit in history:
            at = datetime.fromtimestamp(commit["timestamp"] / 1000, UTC)
            original = query_arrow(world.engine, "energy_hourly", as_of=at)
            try:
                assert query_arrow(engine, "energy_hourly", as_of=at) == original
            except AsOfUnavailableError as exc:
                assert "energy_hourly" in str(exc)
        # Nothing was pending: the restored sensors find no work.
        assert sum(len(r.runs) for r in restored.tick(NOW)) == 0

        batch = day_batch(FIRST + timedelta(days=1), 3, seed=7)
        fix = batch.filter(pc.equal(batch["entity_id"], METER))
        restored.ingest(fix.set_column(2, "energy_kwh", pc.multiply(fix["energy_kwh"], 5.0)))
        runs = sum(len(r.runs) for r in restored.tick(NOW))
        assert runs > 0
        assert compare_all(restored.query, restored.raw(), restored.catalog) == []
        after = reads(restored)
        for name in ("energy_hourly", "energy_daily", "energy_monthly"):
            assert after[name] != before[name], name
    # The original warehouse did not see the correction.
    assert reads(world) == before
