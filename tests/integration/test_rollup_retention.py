"""Rollup retention end to end: maintenance drops the hourly buckets older than the hourly
level's horizon (base rows, difference rows and pointers), every level above still equals the
oracle of the raw rows, a late reading in a dropped hour corrects the levels above without
bringing back a partial hour, work over the dropped buckets is refused without writing anything,
and a pass that dies after recording its intent is finished by the next."""

import dataclasses
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.errors import RawRowsRetainedError
from rollup_assets.model.jobs import JobState, Trigger
from rollup_assets.model.retention import BEGINNING
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.windows import Window
from rollup_assets.resources.genmap import read_pointers
from rollup_assets.services.health import health
from rollup_assets.services.maintenance import maintain
from tests.conftest import World, days, fault_at, world_of
from tests.oracle import compare_all

NOW = datetime(2025, 11, 20, 12, 0, tzinfo=UTC)
FIRST = date(2025, 5, 5)  # a Monday: six days in one ISO week and one month
N_DAYS = 6
METERS = 3
D = timedelta(days=1)
HOURLY = "energy_hourly"
ABOVE = ["energy_daily", "energy_weekly", "energy_monthly", "energy_yearly"]
KEEP = timedelta(days=3)  # the hourly level's retention here


def midnight(d: date) -> datetime:
    return datetime(d.year, d.month, d.day, tzinfo=UTC)


@pytest.fixture
def kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark) -> Iterator[World]:
    """The shipped catalog, its hourly level keeping three days."""
    catalog = load_catalog()
    hourly = dataclasses.replace(catalog.rollups[HOURLY], retention=KEEP)
    catalog = dataclasses.replace(catalog, rollups={**catalog.rollups, HOURLY: hourly})
    yield from world_of(tmp_path, monkeypatch, catalog)


def readings(n_days: int) -> pa.Table:
    return pa.concat_tables([day_batch(d, METERS, seed=11) for d in days(FIRST, n_days)])


def changed(at: datetime, meter: str, factor: float) -> pa.Table:
    """The meter's readings of the hour starting `at`, their energy multiplied by `factor`."""
    batch = day_batch(at.date(), METERS, seed=11)
    ts = batch["ts"]
    keep = pc.and_(
        pc.equal(batch["entity_id"], meter),
        pc.and_(
            pc.greater_equal(ts, pa.scalar(at, ts.type)),
            pc.less(ts, pa.scalar(at + timedelta(hours=1), ts.type)),
        ),
    )
    hour = batch.filter(keep)
    i = hour.schema.get_field_index("energy_kwh")
    return hour.set_column(i, "energy_kwh", pc.multiply(hour["energy_kwh"], factor))


def stored(world: World, name: str) -> tuple[pa.Table, pa.Table]:
    """Every row of the rollup's row table (any generation, base or difference) and every
    pointer, read from the tables themselves."""
    spec = world.catalog.rollup(name)
    rows = DeltaTable(world.engine.rollups.uri(spec)).to_pyarrow_table(
        columns=["bucket_start", "entity_id", "generation", "delta"]
    )
    pointers, _ = read_pointers(world.engine.rollups.genmap_uri(spec))
    return rows, pointers


def before(table: pa.Table, cut: datetime) -> pa.Table:
    return table.filter(pc.less(table["bucket_start"], pa.scalar(cut, table["bucket_start"].type)))


def is_delta(table: pa.Table) -> pa.ChunkedArray:
    return pc.fill_null(table["delta"], False)


def test_maintenance_drops_old_hours_whole_and_the_levels_above_keep_the_oracle(
    kept: World,
) -> None:
    world = kept
    world.ops.activate("energy_raw", now=NOW)
    world.ingest(readings(N_DAYS))
    world.activate_all(NOW)
    start = midnight(FIRST)
    world.backfill([Window(start, start + N_DAYS * D)])
    world.tick(NOW)
    # Two late readings, one in an hour retention will drop, one in an hour it keeps: each
    # leaves difference rows and difference pointers at every level.
    early, late = midnight(FIRST + D) + timedelta(hours=7), midnight(FIRST + 4 * D)
    world.ingest(changed(early, "meter-0001", 2.0), source="Manual")
    world.ingest(changed(late, "meter-0002", 3.0), source="Manual")
    world.tick(NOW)
    raw = world.raw()
    assert compare_all(world.query, raw, world.catalog) == []

    # now - retention falls at 10:20 on the fourth day: every hour before 10:00 goes.
    cut = midnight(FIRST + 3 * D) + timedelta(hours=10)
    rows, pointers = stored(world, HOURLY)
    assert before(rows, cut).filter(is_delta(before(rows, cut))).num_rows > 0
    assert before(pointers, cut).filter(is_delta(before(pointers, cut))).num_rows > 0
    kept_rows = rows.num_rows - before(rows, cut).num_rows
    above_before = {n: world.query(n) for n in ABOVE}

    report = maintain(world.engine, now=cut + KEEP + timedelta(minutes=20))
    assert report.retention_failures == 0, report.details
    assert report.raw_days_dropped == 0  # the raw archive keeps its 180 days
    assert report.rollup_rows_dropped > 0, report.details
    assert world.engine.states.get(HOURLY).retained_from == cut
    h = health(world.catalog, HOURLY, world.engine.ledger.snapshot(), world.engine.states.all())
    assert h.retained_from == cut
    assert world.engine.states.get("energy_daily").retained_from is None

    # Nothing of the hourly level is older than its horizon: no base row, no difference row,
    # no pointer; what is after it is all still there.
    rows, pointers = stored(world, HOURLY)
    assert before(rows, cut).num_rows == 0 and before(pointers, cut).num_rows == 0
    assert rows.num_rows == kept_rows
    assert pointers.filter(is_delta(pointers)).num_rows > 0  # the kept hour's correction
    assert pc.min(world.query(HOURLY)["bucket_start"]).as_py() == cut
    # The hourly level equals the oracle from its horizon on; the levels above, over every raw
    # row (none was dropped), still equal it and hold exactly what they held.
    gone = [Window(BEGINNING, cut)]
    assert compare_all(world.query, raw, world.catalog, names=[HOURLY], removed=gone) == []
    assert compare_all(world.query, raw, world.catalog, names=[HOURLY]) != []
    assert compare_all(world.query, raw, world.catalog, names=ABOVE) == []
    assert {n: world.query(n) for n in ABOVE} == above_before

    # A late reading in a dropped hour: the hourly level does not bring back a partial hour,
    # and every level above takes the change.
    world.ingest(changed(early + timedelta(hours=2), "meter-0000", 5.0), source="Manual")
    world.tick(NOW)
    raw = world.raw()
    rows, pointers = stored(world, HOURLY)
    assert before(rows, cut).num_rows == 0 and before(pointers, cut).num_rows == 0
    assert compare_all(world.query, raw, world.catalog, names=ABOVE) == []
    assert compare_all(world.query, raw, world.catalog, names=[HOURLY], removed=gone) == []
    skipped = [
        j
        for j in world.engine.ledger.history(HOURLY)
        if j.corrects and j.state is JobState.COMPLETED and not j.windows_processed
    ]
    assert skipped, "the hourly correction of the dropped hour"

    # Work over the dropped hours is refused, naming the rollup and the range; nothing queued.
    jobs = len(world.engine.ledger.snapshot().jobs)
    hour = Window(early, early + timedelta(hours=1))
    with pytest.raises(RawRowsRetainedError, match=r"'energy_hourly' again over .* dropped by"):
        world.ops.request_recompute(HOURLY, hour.start, hour.end)
    vienna_day = Window(midnight(FIRST + D) - timedelta(hours=2), midnight(FIRST + 2 * D))
    with pytest.raises(RawRowsRetainedError, match=r"needs rows of 'energy_hourly'"):
        world.ops.request_recompute("energy_daily", vienna_day.start, vienna_day.end)
    assert len(world.engine.ledger.snapshot().jobs) == jobs
    # After the horizon, both still recompute.
    ok = world.ops.request_recompute(HOURLY, cut + D, cut + D + timedelta(hours=1))
    world.tick(NOW)
    done = world.engine.ledger.job(ok.job_id)
    assert done is not None and done.state is JobState.COMPLETED, done
    assert done.trigger is Trigger.MANUAL
    assert compare_all(world.query, raw, world.catalog, names=ABOVE) == []


def test_a_pass_that_dies_after_its_intent_is_finished_by_the_next(kept: World) -> None:
    world = kept
    world.ops.activate("energy_raw", now=NOW)
    world.ingest(readings(4))
    world.activate_all(NOW)
    start = midnight(FIRST)
    world.backfill([Window(start, start + 4 * D)])
    world.tick(NOW)
    raw = world.raw()
    cut = midnight(FIRST + 2 * D)
    now = cut + KEEP

    with fault_at("rollup_retention_state", "raise", HOURLY):
        report = maintain(world.engine, now=now)
    assert report.retention_failures == 1, report.details
    # The intent is recorded and already in force: nothing dropped yet, work there refused.
    assert world.engine.states.get(HOURLY).retained_from == cut
    rows, pointers = stored(world, HOURLY)
    assert before(rows, cut).num_rows > 0
    with pytest.raises(RawRowsRetainedError):
        world.ops.request_recompute(HOURLY, start, start + timedelta(hours=1))

    # Dying after the pointers went (the fence moved) leaves the rows to the next pass too.
    with fault_at("rollup_retention_pointers", "raise", HOURLY):
        report = maintain(world.engine, now=now)
    rows, pointers = stored(world, HOURLY)
    assert before(pointers, cut).num_rows == 0 and before(rows, cut).num_rows > 0
    assert world.engine.rollups.pointers_retained_from(world.catalog.rollup(HOURLY)) == cut

    report = maintain(world.engine, now=now)
    assert report.retention_failures == 0 and report.rollup_rows_dropped > 0, report.details
    rows, pointers = stored(world, HOURLY)
    assert before(rows, cut).num_rows == 0 and before(pointers, cut).num_rows == 0
    gone = [Window(BEGINNING, cut)]
    assert compare_all(world.query, raw, world.catalog, names=[HOURLY], removed=gone) == []
    assert compare_all(world.query, raw, world.catalog, names=ABOVE) == []
    # A pass with nothing left to drop changes nothing.
    again = maintain(world.engine, now=now)
    assert again.rollup_rows_dropped == 0
    assert all(o.pointer_version is None for o in again.rollup_retention), again.details
