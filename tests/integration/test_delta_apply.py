"""Corrections applied as differences from the change feed equal a fresh aggregation at every
level.

The data spans the autumn DST switch (a 25-hour Vienna day), ISO weeks, month ends and the end
of 2025 (closed at NOW). Waves of mixed changes land in several source versions before the
sensors run: late inserts, updates, deletes, retractions of the stored minimum and maximum, a
value going NaN, an optional column left null (COALESCE keeps the stored value) and identical
re-ingests; then more retractions of one day's highest voltage than a cell keeps spare extremes.
After each wave every level equals the pandas oracle, every level corrected its cells as
differences from the changes without reading a stored cell (aggregating again from the source
only a cell whose spare extremes ran out), and the job records say so.
"""

from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.jobs import ChangeSource, Job, JobState, Trigger
from rollup_assets.model.partials import SPARES
from rollup_assets.model.windows import Window
from rollup_assets.resources.rollup_reads import CellsUnknowable, Unknown
from rollup_assets.services.maintenance import maintain
from rollup_assets.services.query import query_arrow
from tests.conftest import World, days
from tests.oracle import compare_all

NOW = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
FIRST = date(2025, 10, 20)  # a Monday: ISO week 2025-W43, with the DST day, is whole
DAYS = 73  # to 2025-12-31, the day of 2025's last quarter hour (local)
# The archive holds the UTC days of those the waves touch (first day, number of days), backfilled
# in one run over all 73: the days between them are empty at every level, as in the oracle.
SPANS = [
    (FIRST, 7),  # ISO week 2025-W43 with the 25-hour day (2025-10-26)
    (date(2025, 11, 3), 3),  # a raised lowest voltage (11-03), a day re-ingested unchanged (11-05)
    (date(2025, 11, 12), 1),  # the folded hours
    (date(2025, 11, 18), 3),  # the local day 2025-11-19 (wave 3), a null optional column (11-20)
    (date(2025, 11, 30), 2),  # the month end: December's first local hour is on 11-30 (UTC)
    (date(2025, 12, 31), 1),  # 2025's last quarter hour (local), in ISO week 2026-W01
]
METERS = 3
HELD_BACK = 6  # base readings kept out of the first ingest, to arrive late


def base() -> pa.Table:
    return pa.concat_tables(
        [day_batch(d, METERS, seed=11) for first, n in SPANS for d in days(first, n)]
    )


def pick(table: pa.Table, entity: str, ts: datetime) -> pa.Table:
    """The meter's first stored reading at or after `ts` (the sample data misses a few)."""
    mask = pc.and_(
        pc.equal(table["entity_id"], entity),
        pc.greater_equal(table["ts"], pa.scalar(ts, table["ts"].type)),
    )
    return table.filter(mask).sort_by([("ts", "ascending")]).slice(0, 1)


def jobs_since(world: World, since: datetime, rollup: str = "energy_hourly") -> list[Job]:
    return [
        j
        for j in world.engine.ledger.history(rollup, limit=500)
        if j.created_at >= since and j.state is JobState.COMPLETED and j.technique
    ]


def corrected_from_below(world: World, since: datetime) -> None:
    for name in ("energy_daily", "energy_weekly", "energy_monthly", "energy_yearly"):
        jobs = jobs_since(world, since, name)
        assert jobs and all(j.technique == "difference" and not j.source_rows for j in jobs), [
            (name, j.technique, j.plan) for j in jobs
        ]
        assert all("no stored cell read" in (j.plan or "") for j in jobs)


def extreme_reading(table: pa.Table, entity: str, hour: datetime, lowest: bool) -> pa.Table:
    """The reading holding the meter's lowest (highest) voltage in `hour`."""
    ts = table["ts"]
    mask = pc.and_(
        pc.equal(table["entity_id"], entity),
        pc.and_(
            pc.greater_equal(ts, pa.scalar(hour, ts.type)),
            pc.less(ts, pa.scalar(hour + timedelta(hours=1), ts.type)),
        ),
    )
    rows = table.filter(pc.and_(mask, pc.is_valid(table["voltage_v"])))
    order = "ascending" if lowest else "descending"
    return rows.sort_by([("voltage_v", order)]).slice(0, 1)


def hour_of_every_meter(stored: pa.Table, hour: datetime, factor: float) -> pa.Table:
    ts = stored["ts"]
    mask = pc.and_(
        pc.greater_equal(ts, pa.scalar(hour, ts.type)),
        pc.less(ts, pa.scalar(hour + timedelta(hours=1), ts.type)),
    )
    rows = stored.filter(mask)
    return rows.set_column(2, "energy_kwh", pc.multiply(rows["energy_kwh"], factor))


def cell_pointers(world: World, rollup: str, start: datetime) -> int:
    pointers = world.engine.rollups.snapshot(world.catalog.rollup(rollup)).pointers
    rows = pointers.filter(
        pc.equal(
            pointers["bucket_start"], pa.scalar(start, pointers.schema.field("bucket_start").type)
        )
    )
    return sum(1 for e in rows["entity_id"].to_pylist() if e is not None)


def test_mixed_waves_applied_as_differences_equal_the_oracle(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = base()
    late = data.slice(1000, HELD_BACK)
    rest = pa.concat_tables([data.slice(0, 1000), data.slice(1000 + HELD_BACK)])
    world.ops.activate("energy_raw", now=NOW)
    world.ingest(rest, source="Import")
    world.activate_all(NOW)
    start = datetime(FIRST.year, FIRST.month, FIRST.day, tzinfo=UTC)
    world.backfill([Window(start, start + timedelta(days=DAYS))])
    world.tick(NOW)
    assert compare_all(world.query, world.raw(), world.catalog) == []
    # As a producer would send them: without the partition and the computed column.
    stored = world.engine.raw.read_arrow(world.catalog.raw["energy_raw"])
    stored = stored.drop_columns(["day", "current_a"])

    # Wave 1: six source versions before the sensors run.
    wave1 = datetime.now(UTC)
    world.ingest(late, source="Manual")  # late inserts into existing cells
    meter, other = "meter-0001", "meter-0002"
    dst_day = datetime(2025, 10, 26, 1, 0, tzinfo=UTC)  # inside the 25-hour local day
    updated = pick(stored, meter, dst_day)
    updated = updated.set_column(2, "energy_kwh", pc.multiply(updated["energy_kwh"], 3.0))
    new_year = datetime(2025, 12, 31, 22, 45, tzinfo=UTC)  # the last quarter hour of 2025 (local)
    world.ingest(updated, source="Manual")
    lowest = extreme_reading(stored, meter, datetime(2025, 11, 3, 9, 0, tzinfo=UTC), True)
    highest = extreme_reading(stored, other, datetime(2025, 12, 1, 14, 0, tzinfo=UTC), False)
    lowest = lowest.set_column(4, "voltage_v", pc.add(lowest["voltage_v"], 50.0))
    highest = highest.set_column(4, "voltage_v", pc.subtract(highest["voltage_v"], 50.0))
    world.ingest(pa.concat_tables([lowest, highest]), source="Manual")
    # An optional column left null keeps the stored value: nothing changes.
    kept = pick(stored, meter, datetime(2025, 11, 20, 8, 15, tzinfo=UTC))
    kept = kept.set_column(3, "power_kw", pa.nulls(1, pa.float64()))
    world.ingest(kept, source="Manual")
    # An identical re-ingest of one day for every meter commits nothing.
    same_day = day_batch(date(2025, 11, 5), METERS, seed=11)
    version = world.engine.raw.table(world.catalog.raw["energy_raw"]).version()
    assert world.ingest(same_day, source="Manual") == version
    uri = world.engine.raw.uri(world.catalog.raw["energy_raw"])
    gone = pick(stored, other, datetime(2025, 11, 30, 23, 0, tzinfo=UTC))  # December's first
    when = gone["ts"][0].as_py().strftime("%Y-%m-%dT%H:%M:%SZ")
    DeltaTable(uri).delete(f"entity_id = '{other}' AND ts = '{when}'")
    # Another Delta writer sets a voltage to NaN and back (ingest reads NaN as missing): a NaN
    # cannot be retracted, so the cell is recomputed.
    row = pick(stored, other, new_year)
    where = f"entity_id = '{other}' AND ts = '{row['ts'][0].as_py():%Y-%m-%dT%H:%M:%SZ}'"
    DeltaTable(uri).update(updates={"voltage_v": "CAST('NaN' AS DOUBLE)"}, predicate=where)
    restore = repr(row["voltage_v"][0].as_py())
    DeltaTable(uri).update(updates={"voltage_v": restore}, predicate=where)
    world.tick(NOW)
    assert compare_all(world.query, world.raw(), world.catalog) == []

    jobs = jobs_since(world, wave1)
    assert jobs and all(j.technique == "difference" for j in jobs), [
        (j.technique, j.plan) for j in jobs
    ]
    assert all("no stored cell read" in (j.plan or "") for j in jobs)
    late_cells = {
        (e, t.replace(minute=0))
        for e, t in zip(late["entity_id"].to_pylist(), late["ts"].to_pylist(), strict=True)
    }
    # The late inserts' cells, the tripled reading's, the two retracted extremes', the deleted
    # reading's and the NaN one's (set and restored: two differences that cancel out).
    applied = sum(j.cells_applied or 0 for j in jobs)
    assert applied == len(late_cells) + 5, [(j.cells_applied, j.plan) for j in jobs]
    assert sum(j.change_rows or 0 for j in jobs) >= HELD_BACK + 2
    # The first level read no source rows and no stored cell: differences only.
    assert sum(j.source_rows or 0 for j in jobs) == 0
    # Every level above applied the same change rows as differences, reading none of the level
    # below's rows (the run carried the change up).
    corrected_from_below(world, wave1)
    mid, raw_mid = datetime.now(UTC), world.raw()

    # Wave 2: the same cells change again (their visible state now folds earlier differences).
    wave2 = datetime.now(UTC)
    again = updated.set_column(2, "energy_kwh", pc.multiply(updated["energy_kwh"], 0.5))
    world.ingest(again, source="Manual")
    world.ingest(late.set_column(2, "energy_kwh", pc.add(late["energy_kwh"], 1.0)))
    world.tick(NOW)
    assert compare_all(world.query, world.raw(), world.catalog) == []
    jobs = jobs_since(world, wave2)
    assert jobs and all(j.technique == "difference" for j in jobs), [
        (j.technique, j.plan) for j in jobs
    ]
    assert sum(j.source_rows or 0 for j in jobs) == 0
    assert sum(j.cells_changed or 0 for j in jobs) >= 2
    corrected_from_below(world, wave2)

    # Wave 3: one meter's nine highest voltages of a day lowered, one more than a cell keeps
    # spare extremes: the day's maximum is no longer known from its differences, so reads (and
    # a fold) aggregate that cell again from its source; every level still equals the oracle.
    day = datetime(2025, 11, 18, 23, 0, tzinfo=UTC)  # the local (Vienna) day 2025-11-19
    ts = stored["ts"]
    in_day = pc.and_(
        pc.equal(stored["entity_id"], meter),
        pc.and_(
            pc.greater_equal(ts, pa.scalar(day, ts.type)),
            pc.less(ts, pa.scalar(day + timedelta(days=1), ts.type)),
        ),
    )
    rows = stored.filter(pc.and_(in_day, pc.is_valid(stored["voltage_v"])))
    top = rows.sort_by([("voltage_v", "descending")]).slice(0, SPARES + 1)
    world.ingest(
        top.set_column(4, "voltage_v", pc.subtract(top["voltage_v"], 50.0)), source="Manual"
    )
    world.tick(NOW)
    assert compare_all(world.query, world.raw(), world.catalog) == []
    # As of the time between the first and second waves (differences flipped, none folded).
    at_mid = lambda name: query_arrow(world.engine, name, as_of=mid)  # noqa: E731
    assert compare_all(at_mid, raw_mid, world.catalog) == []

    # Folding: an hour corrected for named meters carries one cell pointer per meter; maintenance
    # queues it, the recompute lane rewrites it whole under one bucket pointer.
    monkeypatch.setattr("rollup_assets.model.cells.FOLD_MIN_POINTERS", METERS)
    hour, kept_hour = (datetime(2025, 11, 12, h, 0, tzinfo=UTC) for h in (7, 8))
    for h in (hour, kept_hour):
        world.ingest(hour_of_every_meter(stored, h, 1.5), source="Manual")
    world.tick(NOW)  # named cells: one cell pointer per meter
    assert cell_pointers(world, "energy_hourly", hour) == METERS
    assert compare_all(world.query, world.raw(), world.catalog) == []
    before = world.query("energy_hourly", start=hour, end=hour + timedelta(hours=1))
    # Retention reached the second hour: its stored rows are the only record, so it stays.
    world.engine.raw.delete_rows(
        world.catalog.raw["energy_raw"],
        Window(kept_hour, kept_hour + timedelta(minutes=15)),
        None,
        ChangeSource.MANUAL,
        retention=True,
    )
    report = maintain(world.engine, now=NOW)
    queued = [
        j
        for j in world.engine.ledger.snapshot().pending("energy_hourly")
        if j.trigger is Trigger.MAINTENANCE
    ]
    assert report.buckets_to_fold >= 1 and len(queued) == 1, report.details
    assert hour in [w.start for w in queued[0].windows]
    assert kept_hour not in [w.start for w in queued[0].windows]
    world.tick(NOW)
    fold = world.engine.ledger.job(queued[0].job_id)  # on Spark: `test_chain_oracle`
    assert fold is not None and "read on the driver" in (fold.plan or ""), fold
    assert cell_pointers(world, "energy_hourly", hour) == 0
    assert cell_pointers(world, "energy_hourly", kept_hour) == METERS
    after = world.query("energy_hourly", start=hour, end=hour + timedelta(hours=1))
    assert after.num_rows == METERS
    order = [("entity_id", "ascending")]
    pairs = zip(before.sort_by(order).to_pylist(), after.sort_by(order).to_pylist(), strict=True)
    for was, now in pairs:
        assert was.keys() == now.keys()
        assert all(
            abs(was[k] - now[k]) <= 1e-9 * max(1.0, abs(was[k]))
            if isinstance(was[k], float)
            else was[k] == now[k]
            for k in was
        ), (was, now)


# Where a Spark read folds its corrected cells: on the driver (few cells), or in executor tasks
# (past `FOLD_TASK_CELLS`; 0 sends every corrected cell there).
FOLD_SITES = pytest.mark.parametrize("fold_cells", [None, 0], ids=["driver", "executors"])


def two_meters_two_days(
    world: World, monkeypatch: pytest.MonkeyPatch, fold_cells: int | None
) -> datetime:
    """Two meters' readings of 2025-11-03 and 04 (UTC), every level up to date, Spark reads
    folding at the site asked for; the first day's UTC midnight."""
    if fold_cells is not None:
        monkeypatch.setattr("rollup_assets.resources.rollup_reads.FOLD_TASK_CELLS", fold_cells)
    world.ops.activate("energy_raw", now=NOW)
    world.ingest(pa.concat_tables([day_batch(d, 2, seed=5) for d in days(date(2025, 11, 3), 2)]))
    world.activate_all(NOW)
    midnight = datetime(2025, 11, 3, tzinfo=UTC)
    world.backfill([Window(midnight, midnight + timedelta(days=2))])
    world.tick(NOW)
    return midnight


@FOLD_SITES
def test_a_spark_read_of_cells_whose_every_reading_was_deleted_leaves_them_out(
    world: World, spark, monkeypatch: pytest.MonkeyPatch, fold_cells: int | None
) -> None:
    """Every reading of an hour deleted: the hour's difference leaves no row. A read on Spark
    (what aggregates the level above again from this one) folds the changed cells and leaves
    that cell out, even when it is the only changed cell, wherever it folds them."""
    start = two_meters_two_days(world, monkeypatch, fold_cells)
    hour = start + timedelta(hours=7)
    world.engine.raw.delete_rows(
        world.catalog.raw["energy_raw"],
        Window(hour, hour + timedelta(hours=1)),
        frozenset({"meter-0000"}),
        ChangeSource.MANUAL,
        retention=False,
    )
    world.tick(NOW)
    spec = world.catalog.rollup("energy_hourly")
    rows = world.engine.rollups.read_spark(spark, spec, [Window(start, start + timedelta(days=1))])
    cells = {
        (r["entity_id"], r["bucket_start"])
        for r in rows.select("entity_id", "bucket_start").collect()
    }
    naive = hour.replace(tzinfo=None)  # Spark hands back UTC instants without a zone
    assert ("meter-0000", naive) not in cells and ("meter-0001", naive) in cells
    assert compare_all(world.query, world.raw(), world.catalog) == []


@FOLD_SITES
def test_a_spark_read_gives_cells_whose_kept_extremes_ran_out_as_asked(
    world: World, spark, monkeypatch: pytest.MonkeyPatch, fold_cells: int | None
) -> None:
    """A day's highest voltages lowered past its kept extremes: a Spark read of the daily level
    aggregates that cell again (as the query path does), leaves it blank, or refuses, naming
    it, wherever the corrected cells are folded."""
    two_meters_two_days(world, monkeypatch, fold_cells)
    start = datetime(2025, 11, 2, 23, tzinfo=UTC)  # the local (Vienna) day 2025-11-03
    stored = world.engine.raw.read_arrow(world.catalog.raw["energy_raw"])
    stored = stored.drop_columns(["day", "current_a"])
    ts = stored["ts"]
    in_day = pc.and_(
        pc.equal(stored["entity_id"], "meter-0000"),
        pc.and_(
            pc.greater_equal(ts, pa.scalar(start, ts.type)),
            pc.less(ts, pa.scalar(start + timedelta(days=1), ts.type)),
        ),
    )
    rows = stored.filter(pc.and_(in_day, pc.is_valid(stored["voltage_v"])))
    top = rows.sort_by([("voltage_v", "descending")]).slice(0, SPARES + 1)
    world.ingest(top.set_column(4, "voltage_v", pc.subtract(top["voltage_v"], 50.0)))
    world.tick(NOW)
    spec = world.catalog.rollup("energy_daily")
    span = [Window(start, start + timedelta(days=2))]
    with pytest.raises(CellsUnknowable) as refused:
        world.engine.rollups.read_spark(spark, spec, span, unknown=Unknown.REFUSE)
    assert refused.value.keys == [("meter-0000", start)]

    def read(unknown: Unknown) -> dict:
        frame = world.engine.rollups.read_spark(spark, spec, span, unknown=unknown)
        cells = frame.select("entity_id", "bucket_start", "voltage_v_max").collect()
        return {(r["entity_id"], r["bucket_start"]): r["voltage_v_max"] for r in cells}

    naive = start.replace(tzinfo=None)  # Spark hands back UTC instants without a zone
    refilled, blank = read(Unknown.REFILL), read(Unknown.BLANK)
    assert len(refilled) == len(blank) == 4  # two meters, two days
    truth = pc.max(pc.subtract(top["voltage_v"], 50.0)).as_py()
    truth = max(truth, rows.sort_by([("voltage_v", "descending")])["voltage_v"][SPARES + 1].as_py())
    assert refilled[("meter-0000", naive)] == truth
    assert blank[("meter-0000", naive)] is None
    assert {k: v for k, v in blank.items() if k[0] != "meter-0000" or k[1] != naive} == {
        k: v for k, v in refilled.items() if k[0] != "meter-0000" or k[1] != naive
    }
    assert compare_all(world.query, world.raw(), world.catalog) == []
