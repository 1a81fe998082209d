"""Chain propagation inside the run: a recompute carries its change up every level in the same
run when it can take each level's pool slot, and leaves a level to the sensors when another run
holds it."""

from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import SparkSession

from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.jobs import Job, JobState, Trigger
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.instance import pool_name
from rollup_assets.orchestration.runner import tick
from rollup_assets.services import correction as corrections
from rollup_assets.services import recompute_work
from rollup_assets.services.recompute import run_recompute
from rollup_assets.services.rollback import rollback
from rollup_assets.services.surface_lag import surface_lag
from tests.conftest import World, days, world_of
from tests.oracle import compare_all

NOW = datetime(2025, 6, 20, 12, 0, tzinfo=UTC)
FIRST = date(2025, 6, 2)
HOUR_START = datetime(2025, 6, 10, 12, 0, tzinfo=UTC)  # Vienna local 14:00


def setup_chain(world: World) -> None:
    world.ops.activate("energy_raw", now=NOW)
    world.ingest(pa.concat_tables([day_batch(d, 2, seed=8) for d in days(FIRST, 9)]))
    world.activate_all(NOW)
    world.backfill([Window(datetime(2025, 6, 2, tzinfo=UTC), datetime(2025, 6, 11, tzinfo=UTC))])
    world.tick(NOW)
    assert compare_all(world.query, world.raw(), world.catalog) == []


def correction(value: float) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                "entity_id": "meter-0001",
                "ts": HOUR_START + timedelta(minutes=15 * i),
                "energy_kwh": value + i,
            }
            for i in range(4)
        ]
    )


def chain_jobs(world: World, since: datetime) -> dict[str, list]:
    out: dict[str, list] = {}
    for name in world.catalog.rollups:
        out[name] = [
            j
            for j in world.engine.ledger.history(name)
            if j.created_at >= since and j.trigger is Trigger.CHAIN
        ]
    return out


def test_one_run_carries_a_correction_through_every_level(world: World) -> None:
    setup_chain(world)
    since = datetime.now(UTC)
    world.ingest(correction(40.0), source="Manual")
    reports = world.tick(NOW)
    runs = [r for rep in reports for r in rep.runs]
    # One run: the hourly correction, then in the same run the daily and weekly corrections and
    # the refresh of the open month and year, which now contain the corrected hour. The hourly
    # open bucket is far from the correction, so no forward run is launched either. Then one
    # publish run brings the surfaces of every level it changed up to date.
    names = [r.job_name for r in runs]
    assert names == ["energy_hourly_job", "publish_surfaces"], names
    assert set(runs[1].tags["rollups/surfaces"].split(",")) == set(world.catalog.rollups)
    jobs = chain_jobs(world, since)
    first = [j for j in world.engine.ledger.history("energy_hourly") if j.created_at >= since]
    assert [j.technique for j in first] == ["difference"]
    for name in ("energy_daily", "energy_weekly"):
        assert [j.state for j in jobs[name]] == [JobState.COMPLETED], (name, jobs[name])
        assert jobs[name][0].run_id == runs[0].run_id
        # Corrected from the change rows the run carried up, reading no rows of the level below.
        job = jobs[name][0]
        assert job.technique == "difference" and job.cells_applied == 1, (job.technique, job.plan)
        assert not job.source_rows and job.change_rows, job.plan
    for name in ("energy_monthly", "energy_yearly"):
        refreshed = [
            j
            for j in world.engine.ledger.history(name)
            if j.created_at >= since and j.trigger is Trigger.OPEN_BUCKET
        ]
        assert [j.run_id for j in refreshed] == [runs[0].run_id], (name, refreshed)
    assert compare_all(world.query, world.raw(), world.catalog) == []


def test_the_parts_handed_up_a_chain_name_its_rows_and_are_worked_out_once(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each level hands up the rows it applied with the parts (commits and first-level cells)
    naming them: the same parts as worked out afresh from those rows, though a level that
    applied every row handed to it passes on the parts it was handed."""
    setup_chain(world)
    worked_out: list[int] = []
    handed: list[tuple[str, corrections.SourceChange]] = []
    real_parts, real_correct = corrections._parts_of, corrections.correct

    def parts_of(rows: pa.Table, *args: object) -> tuple:
        worked_out.append(rows.num_rows)
        return real_parts(rows, *args)  # type: ignore[arg-type]

    def correct(engine, spec, job, ready, below=None):  # type: ignore[no-untyped-def]
        done = real_correct(engine, spec, job, ready, below)
        handed.append((spec.name, done.applied))
        return done

    monkeypatch.setattr(corrections, "_parts_of", parts_of)
    monkeypatch.setattr(recompute_work, "correct", correct)
    world.ingest(correction(55.0), source="Manual")
    world.tick(NOW)
    assert [name for name, _ in handed] == ["energy_hourly", "energy_daily", "energy_weekly"]
    root = world.catalog.rollup("energy_hourly")
    for name, applied in handed:
        assert applied.rows.num_rows == 8, name  # four readings replaced: out and in
        assert applied.parts == real_parts(applied.rows, root, applied.time_column), name
    assert worked_out == [8]  # at the first level only
    assert compare_all(world.query, world.raw(), world.catalog) == []


def test_a_level_whose_pool_is_taken_is_left_to_the_sensor(world: World) -> None:
    setup_chain(world)
    storage = world.instance.event_log_storage
    daily = world.catalog.rollup("energy_daily")
    # Another writer of the daily rollup holds its pool slot.
    assert storage.claim_concurrency_slot(pool_name(daily), "other-run", "energy_daily").is_claimed
    try:
        since = datetime.now(UTC)
        world.ingest(correction(70.0), source="Manual")
        # One tick (a second would launch the daily run, which would wait for the slot).
        hourly = tick(world.defs, world.instance, NOW, sensors=("retroactive_write_sensor",))
        assert [r.job_name for r in hourly.runs] == ["energy_hourly_job"]
        assert all(r.success for r in hourly.runs), [r.error for r in hourly.runs]
        waiting = chain_jobs(world, since)["energy_daily"]
        assert [j.state for j in waiting] == [JobState.PENDING], waiting
        # A publish holds no pool: the hourly flip is published while the daily slot is taken.
        published = tick(world.defs, world.instance, NOW, sensors=("surface_publish_sensor",))
        assert [(r.job_name, r.success) for r in published.runs] == [("publish_surfaces", True)]
        hourly_spec = world.catalog.rollup("energy_hourly")
        assert not surface_lag(world.engine, hourly_spec).needs_publish
    finally:
        storage.free_concurrency_slot_for_step("other-run", "energy_daily")
    # Once the slot is free, the sensor launches the daily level, which carries on above it.
    reports = world.tick(NOW)
    assert next(r.job_name for rep in reports for r in rep.runs) == "energy_daily_job"
    done = chain_jobs(world, since)
    assert [j.state for j in done["energy_daily"]] == [JobState.COMPLETED]
    assert compare_all(world.query, world.raw(), world.catalog) == []


def scaled(world: World, hour: datetime, factor: float) -> pa.Table:
    """meter-0001's stored readings of `hour`, scaled by `factor`."""
    stored = world.engine.raw.read_arrow(world.catalog.raw["energy_raw"])
    ts = stored["ts"]
    rows = stored.filter(
        pc.and_(
            pc.equal(stored["entity_id"], "meter-0001"),
            pc.and_(
                pc.greater_equal(ts, pa.scalar(hour, ts.type)),
                pc.less(ts, pa.scalar(hour + timedelta(hours=1), ts.type)),
            ),
        )
    ).select(["entity_id", "ts", "energy_kwh"])
    return rows.set_column(2, "energy_kwh", pc.multiply(rows["energy_kwh"], factor))


def corrected_below_only(world: World, hour: datetime, factor: float) -> tuple[Job, Job]:
    """A correction of meter-0001's `hour`, carried by the sensor to the hourly level while
    another writer holds the daily level's slot: the hourly job, and the daily job it left
    pending."""
    storage = world.instance.event_log_storage
    daily = world.catalog.rollup("energy_daily")
    since = datetime.now(UTC)
    assert storage.claim_concurrency_slot(pool_name(daily), "other-run", "energy_daily").is_claimed
    try:
        world.ingest(scaled(world, hour, factor), source="Manual")
        hourly = tick(world.defs, world.instance, NOW, sensors=("retroactive_write_sensor",))
        assert all(r.success for r in hourly.runs), [r.error for r in hourly.runs]
    finally:
        storage.free_concurrency_slot_for_step("other-run", "energy_daily")
    [job] = [
        j
        for j in world.engine.ledger.history("energy_hourly")
        if j.created_at >= since and j.state is JobState.COMPLETED and j.windows_processed
    ]
    [day] = [j for j in chain_jobs(world, since)["energy_daily"] if j.state is JobState.PENDING]
    assert job.technique == "difference" and day.corrects
    return job, day


def test_two_corrections_of_a_day_carried_up_out_of_order_are_each_applied_once(
    world: World,
) -> None:
    """Two corrections of one meter's day, the first's propagation still pending when the
    second's run carries it up: the day takes the second's difference at once and the first's
    when its pending job runs, each exactly once."""
    setup_chain(world)
    corrected_below_only(world, HOUR_START, 2.0)  # its day's job stays pending
    since = datetime.now(UTC)
    world.ingest(scaled(world, HOUR_START + timedelta(hours=3), 3.0), source="Manual")
    world.tick(NOW)  # the second in one run up the chain, and the first's pending day job
    days_ = [j for j in world.engine.ledger.history("energy_daily") if j.created_at >= since]
    assert days_ and all(j.technique == "difference" for j in days_ if j.technique), days_
    assert compare_all(world.query, world.raw(), world.catalog) == []


@pytest.fixture
def kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark) -> Iterator[World]:
    """A world whose superseded generations stay (rollback needs them)."""
    yield from world_of(tmp_path, monkeypatch, load_catalog(), retention_hours=168)


def test_a_change_below_undone_before_the_level_above_runs_is_not_applied(
    kept: World, spark: SparkSession
) -> None:
    """An hour corrected, then rolled back before the day above it runs: its change no longer
    holds below, so the day is aggregated again from the hours as they are (not corrected with
    the undone change)."""
    world = kept
    setup_chain(world)
    job, day = corrected_below_only(world, HOUR_START, 2.0)
    rollback(world.engine, "energy_hourly", job.job_id)
    daily = world.catalog.rollup("energy_daily")
    done = run_recompute(world.engine, spark, daily, day, run_id="test")
    assert f"job {job.job_id} below was rolled back since" in (done.job.plan or ""), done.job
    span = day.windows[0]
    hours = world.query("energy_hourly", start=span.start, end=span.end, entities=["meter-0001"])
    days_ = world.query("energy_daily", start=span.start, end=span.end, entities=["meter-0001"])
    assert days_["energy_kwh_sum"].to_pylist() == [
        pytest.approx(sum(hours["energy_kwh_sum"].to_pylist()))
    ]


def test_a_late_reading_in_an_hour_with_nothing_stored_is_carried_up(world: World) -> None:
    """A cell of an hour with nothing stored yet (after the data, before the watermark): its
    difference has no base to fold into, at any level."""
    setup_chain(world)
    empty = datetime(2025, 6, 15, 12, 0, tzinfo=UTC)
    reading = [{"entity_id": "meter-0001", "ts": empty, "energy_kwh": 5.0}]
    world.ingest(pa.Table.from_pylist(reading), source="Manual")
    world.tick(NOW)
    assert compare_all(world.query, world.raw(), world.catalog) == []
