"""A first backfill is filled one storage partition per task (`rollup_assets.resources.fill`): the
same partials as the Spark aggregation (nulls and missing readings included) across the autumn DST
switch and a year end; the job records what it wrote; a fill over a corrected level reads its
active rows only; a second backfill of the same range (rows stored) takes the comparing path
and changes nothing."""

from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rollup_assets.model.cells import Cells
from rollup_assets.model.jobs import Job, JobState
from rollup_assets.model.placement import buckets_in
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.partitions import key_range_for, partitions_def_for
from rollup_assets.resources.delta_tables import file_actions
from rollup_assets.resources.fill import plan_parts
from tests.conftest import ON_SPARK, World, day_spans, meter_readings, world_of
from tests.oracle import compare_all

NOW = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
SPANS = [(date(2025, 10, 24), 4), (date(2025, 12, 30), 3)]
METERS = 3
HOURLY = "energy_hourly"
ALONE = {"ops": {HOURLY: {"config": {"propagate_in_run": False}}}}


def first_level_jobs(world: World) -> list[Job]:
    jobs = world.engine.ledger.history(HOURLY, limit=100)
    return [j for j in jobs if j.state is JobState.COMPLETED and j.windows_processed]


def stored(world: World) -> pa.Table:
    spec = world.catalog.rollup(HOURLY)
    names = ["entity_id", "bucket_start", "bucket_end", *(c.name for c in spec.stored_columns)]
    rows = world.engine.rollups.read_arrow(spec, columns=names).select(names)
    return rows.sort_by([("entity_id", "ascending"), ("bucket_start", "ascending")])


# A first fill is Spark's work: this small archive's would run on the driver.
FILLS_ON_SPARK = pytest.mark.parametrize("world", [ON_SPARK], indirect=True)


@FILLS_ON_SPARK
def test_first_fill_equals_spark_and_records_what_it_wrote(world: World, spark) -> None:
    world.ops.activate("energy_raw", now=NOW)
    world.ingest(meter_readings(SPANS, METERS, seed=5), source="Import")
    world.activate_all(NOW)
    world.backfill(day_spans(SPANS))

    jobs = first_level_jobs(world)
    assert len(jobs) == len(SPANS)
    assert all("a first fill" in (j.plan or "") for j in jobs), [j.plan for j in jobs]
    got = stored(world)
    assert sum(j.cells_changed or 0 for j in jobs) == got.num_rows
    raw = world.engine.raw.read_arrow(world.catalog.archive("energy_raw"))
    assert sum(j.source_rows or 0 for j in jobs) == raw.num_rows

    # The same cells aggregated by Spark (the general path), value for value, NaN included.
    spec = world.catalog.rollup(HOURLY)
    buckets = buckets_in(spec, day_spans(SPANS))
    fresh, _ = world.engine.partials.on_spark(spark, spec, Cells.of(buckets))
    want = sorted_like(got, pa.Table.from_pandas(fresh.toPandas(), preserve_index=False))
    assert_same_partials(got, want)

    # On the driver, for every entity of some buckets and one entity of the others, alike.
    entity = got["entity_id"][0].as_py()
    mixed = Cells(tuple((w, None if i % 2 else frozenset({entity})) for i, w in enumerate(buckets)))
    here, _ = world.engine.partials.on_driver(spec, mixed)
    every = {w.start for w, scope in mixed if scope is None}
    keep = pc.or_(
        pc.is_in(want["bucket_start"], pa.array(sorted(every), want["bucket_start"].type)),
        pc.equal(want["entity_id"], entity),
    )
    assert_same_partials(sorted_like(got, here), want.filter(keep))

    # Named cells aggregated in Spark tasks, one storage partition each (a job of more cells
    # than the driver aggregates), alike: two entities on different buckets.
    other = got["entity_id"][got.num_rows - 1].as_py()
    pairs = [(w, entity) for w in buckets[::2]] + [(w, other) for w in buckets[::3]]
    named = Cells.from_pairs(pairs)
    tasks, versions = world.engine.partials.in_tasks(spark, spec, named, None, None)
    assert versions == {
        "energy_raw": world.engine.raw.table(world.catalog.archive("energy_raw")).version()
    }
    wanted = {(w.start, e) for w, e in pairs}
    picked = [
        (t, e) in wanted
        for t, e in zip(
            want["bucket_start"].to_pylist(), want["entity_id"].to_pylist(), strict=True
        )
    ]
    assert_same_partials(sorted_like(got, tasks), want.filter(pa.array(picked)))

    # A second backfill of the same range finds rows stored: it compares, and nothing changed.
    world.backfill(day_spans(SPANS))
    again = first_level_jobs(world)
    assert len(again) == len(jobs)  # no new job wrote anything
    latest = world.engine.ledger.history(HOURLY, limit=len(SPANS))
    assert all("a first fill" not in (j.plan or "") for j in latest)
    assert all(j.cells_changed == 0 and (j.cells_skipped or 0) > 0 for j in latest)
    assert stored(world).equals(got)


def sorted_like(stored: pa.Table, rows: pa.Table) -> pa.Table:
    """`rows` with `stored`'s columns and types, in its order (entity, then bucket)."""
    return (
        rows.select(stored.column_names)
        .cast(stored.schema)
        .sort_by([("entity_id", "ascending"), ("bucket_start", "ascending")])
    )


def assert_same_partials(got: pa.Table, want: pa.Table) -> None:
    assert got.num_rows == want.num_rows and got.num_rows > 0
    for name in got.column_names:
        a, b = got[name], want[name]
        if pa.types.is_floating(a.type):
            # Sums add in another order on Spark: equal up to the last few bits.
            x, y = (c.to_numpy(zero_copy_only=False).astype(float) for c in (a, b))
            assert np.array_equal(np.isnan(x), np.isnan(y)), name
            assert np.allclose(x, y, rtol=1e-12, equal_nan=True), name
        else:
            assert a.equals(b), name


@FILLS_ON_SPARK
def test_every_level_equals_pandas_after_a_first_fill(world: World) -> None:
    world.ops.activate("energy_raw", now=NOW)
    world.ingest(meter_readings(SPANS, METERS, seed=5))
    world.activate_all(NOW)
    world.backfill(day_spans(SPANS))
    assert all("a first fill" in (j.plan or "") for j in first_level_jobs(world))
    world.tick(NOW)  # the forward lane closes the rest
    assert compare_all(world.query, world.raw(), world.catalog) == []


@pytest.fixture
def kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark) -> Iterator[World]:
    """A world that keeps superseded generations a day (a fill must skip their rows), its work
    on Spark."""
    yield from world_of(
        tmp_path, monkeypatch, load_catalog(), retention_hours=24, driver_source_rows=0
    )


def test_a_fill_over_a_corrected_level_reads_its_active_rows_only(kept: World) -> None:
    world = kept
    world.ops.activate("energy_raw", now=NOW)
    data = meter_readings(SPANS, METERS, seed=5)
    world.ingest(data)
    world.activate_all(NOW)
    spec = world.catalog.rollup(HOURLY)
    mark = world.engine.states.get(HOURLY).watermark
    assert mark is not None
    ranges = []
    for span in day_spans(SPANS):  # the first level alone: the levels above stay empty for now
        buckets = [w for w in buckets_in(spec, [span]) if w.end <= mark]
        ranges.append(key_range_for(partitions_def_for(spec), buckets))
        run = world.materialize(HOURLY, ranges[-1].start, ranges[-1].end, ALONE)
        assert run.success, run.error
    # Corrected readings: the hourly cells they touch get a new generation; the old rows stay.
    first = day_spans(SPANS)[0].start
    hit = pc.and_(
        pc.is_in(data["entity_id"], pa.array(["meter-0000", "meter-0002"])),
        pc.less(data["ts"], pa.scalar(first + timedelta(hours=30), data["ts"].type)),
    )
    fixed = data.filter(hit)
    bumped = pc.add(fixed["energy_kwh"], 1.5)
    world.ingest(fixed.set_column(fixed.schema.get_field_index("energy_kwh"), "energy_kwh", bumped))
    # Recomputed before the level above is built: it compares, and flips the changed cells.
    run = world.materialize(HOURLY, ranges[0].start, ranges[0].end, ALONE)
    assert run.success, run.error
    active = world.engine.rollups.read_arrow(spec, columns=["bucket_start", "generation"])
    snap = world.engine.rollups.snapshot(spec)
    assert snap.table is not None
    stored_rows = sum(f["num_records"] for f in file_actions(snap.table))
    assert stored_rows > active.num_rows  # superseded rows of the corrected cells are kept
    assert set(active["generation"].to_pylist()) == {1, 2, 3}  # two ranges, one correction
    world.tick(NOW)  # the levels above: first fills, over the corrected hourly level
    daily = world.engine.ledger.history("energy_daily", limit=100)
    assert any("a first fill" in (j.plan or "") for j in daily), [j.plan for j in daily]
    assert compare_all(world.query, world.raw(), world.catalog) == []


def test_plan_parts_groups_buckets_by_storage_partition_with_their_source_files() -> None:
    catalog = load_catalog()
    hourly, daily = catalog.rollup(HOURLY), catalog.rollup("energy_daily")
    d1 = datetime(2025, 3, 30, tzinfo=UTC)
    hour = timedelta(hours=1)
    files = {
        "day=2025-03-30/a.parquet": Window(d1, d1 + 24 * hour),
        "day=2025-03-31/b.parquet": Window(d1 + 24 * hour, d1 + 48 * hour),
    }

    def files_for(span: Window) -> list[dict]:
        return [{"path": p} for p, w in files.items() if w.overlaps(span)]

    buckets = [Window(d1 + i * hour, d1 + (i + 1) * hour) for i in (0, 5, 24, 60)]
    parts = plan_parts(hourly, buckets, files_for)
    assert [(p.part, p.paths, len(p.buckets)) for p in parts] == [
        ("2025-03-30", ("day=2025-03-30/a.parquet",), 2),
        ("2025-03-31", ("day=2025-03-31/b.parquet",), 1),
    ]  # 2025-04-01 has no source file: nothing to fill there
    # A Vienna day from 2025-03-30T22:00Z (the DST switch was that morning) spans two UTC
    # days: its partition is the month of its UTC start, and it reads both days' files.
    local = Window(datetime(2025, 3, 30, 22, tzinfo=UTC), datetime(2025, 3, 31, 22, tzinfo=UTC))
    (part,) = plan_parts(daily, [local], files_for)
    assert part.part == "2025-03" and len(part.paths) == 2
