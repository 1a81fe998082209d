"""An archive deleted and re-created under its name inherits nothing of the deleted one: no
detection cursor, pending work, pointers or watermarks; a correction after it lands."""

from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc

from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.jobs import JobState
from rollup_assets.model.states import ArchiveStatus
from rollup_assets.model.windows import Window
from tests.conftest import World, days
from tests.oracle import compare_all

NOW = datetime(2025, 11, 15, 12, 0, tzinfo=UTC)
FIRST = date(2025, 10, 20)
METER = "meter-0001"
TOP_DOWN = ["energy_yearly", "energy_monthly", "energy_weekly", "energy_daily", "energy_hourly"]


def build(world: World, first: date, n_days: int) -> None:
    """Activate everything, ingest one file per day, backfill, and let the sensors settle."""
    world.ops.activate("energy_raw", now=NOW)
    for d in days(first, n_days):
        world.ingest(day_batch(d, 3, seed=11), source="Import")
    world.activate_all(NOW)
    start = datetime(first.year, first.month, first.day, tzinfo=UTC)
    world.backfill([Window(start, start + timedelta(days=n_days))])
    world.tick(NOW)


def delete_everything(world: World) -> None:
    for name in [*TOP_DOWN, "energy_raw"]:
        world.ops.disable(name)
        world.ops.delete(name)


def corrected(day: date) -> pa.Table:
    batch = day_batch(day, 3, seed=11)
    one = batch.filter(pc.equal(batch["entity_id"], METER))
    return one.set_column(2, "energy_kwh", pc.multiply(one["energy_kwh"], 3.0))


def test_a_correction_after_delete_and_recreate_is_not_lost(world: World) -> None:
    build(world, FIRST, 12)
    old_cursor = world.engine.ledger.snapshot().cursors["energy_raw"]
    assert old_cursor >= 12
    delete_everything(world)

    build(world, date(2025, 11, 3), 1)
    assert compare_all(world.query, world.raw(), world.catalog) == []
    fresh = world.engine.raw.table(world.catalog.raw["energy_raw"])
    assert fresh is not None and fresh.version() < old_cursor  # the new table counts from 0

    world.ingest(corrected(date(2025, 11, 3)), source="Manual")
    world.tick(NOW)
    assert compare_all(world.query, world.raw(), world.catalog) == []
    # The correction is in the raw data and the levels followed it.
    hourly = world.query("energy_hourly", entities=[METER])
    raw = world.raw()
    assert (
        abs(
            sum(hourly["energy_kwh_sum"].to_pylist())
            - raw["energy_kwh"][raw["entity_id"] == METER].sum()
        )
        < 1e-6
    )

    snapshot = world.engine.ledger.snapshot()
    assert (
        snapshot.cursors["energy_raw"]
        == world.engine.raw.table(world.catalog.raw["energy_raw"]).version()
    )
    assert not [j for j in snapshot.jobs.values() if not j.state.terminal]


def test_a_deleted_archive_leaves_no_state_behind(world: World) -> None:
    build(world, FIRST, 3)
    delete_everything(world)
    snapshot = world.engine.ledger.snapshot()
    assert "energy_raw" not in snapshot.cursors
    for name in world.catalog.rollups:
        assert all(
            j.state in (JobState.COMPLETED, JobState.FAILED, JobState.COALESCED)
            for j in snapshot.for_rollup(name)
        )
    states = world.engine.states.all()
    for name in world.catalog.names():
        state = states[name]
        assert state.status is ArchiveStatus.DELETED
        assert (state.watermark, state.claimed_until, state.frozen_until) == (None, None, None)
    for spec in world.catalog.rollups.values():
        pointers = world.engine.rollups.snapshot(spec)
        assert pointers.table is None and pointers.pointers.num_rows == 0
