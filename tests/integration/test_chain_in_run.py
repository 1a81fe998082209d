"""Chain propagation inside the run: a recompute carries its change up every level in the same
run when it can take each level's pool slot, and leaves a level to the sensors when another run
holds it."""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import SparkSession

from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.jobs import Job, JobState, Trigger
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.instance import pool_name
from rollup_assets.orchestration.runner import tick
from rollup_assets.services.chain import Chain
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


@pytest.mark.parametrize("where", ["driver", "tasks"])
def test_one_run_carries_a_correction_through_every_level(
    world: World, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    if (
        where == "tasks"
    ):  # the hourly cell is aggregated in Spark tasks, which hand its change up too
        for module in ("engine", "incremental"):
            monkeypatch.setattr(f"rollup_assets.services.{module}.DRIVER_CELLS", 0)
    setup_chain(world)
    since = datetime.now(UTC)
    world.ingest(correction(40.0), source="Manual")
    reports = world.tick(NOW)
    runs = [r for rep in reports for r in rep.runs]
    # One run: the hourly recompute, then in the same run the daily and weekly recomputes and
    # the refresh of the open month and year, which now contain the corrected hour. The hourly
    # open bucket is far from the correction, so no forward run is launched either. Then one
    # publish run brings the surfaces of every level it changed up to date.
    names = [r.job_name for r in runs]
    assert names == ["energy_hourly_job", "publish_surfaces"], names
    assert set(runs[1].tags["rollups/surfaces"].split(",")) == set(world.catalog.rollups)
    jobs = chain_jobs(world, since)
    first = [j for j in world.engine.ledger.history("energy_hourly") if j.created_at >= since]
    assert [j.technique for j in first] == ["delta" if where == "driver" else "recompute"]
    for name in ("energy_daily", "energy_weekly"):
        assert [j.state for j in jobs[name]] == [JobState.COMPLETED], (name, jobs[name])
        assert jobs[name][0].run_id == runs[0].run_id
        # Corrected from the level below's old and new partials, reading none of its rows.
        job = jobs[name][0]
        assert job.technique == "delta" and job.cells_applied == 1, (job.technique, job.plan)
        assert job.source_rows == 0 and job.change_rows == 1, job.plan
    for name in ("energy_monthly", "energy_yearly"):
        refreshed = [
            j
            for j in world.engine.ledger.history(name)
            if j.created_at >= since and j.trigger is Trigger.OPEN_BUCKET
        ]
        assert [j.run_id for j in refreshed] == [runs[0].run_id], (name, refreshed)
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


def manual_correction(world: World, spark: SparkSession, hour: datetime, factor: float):
    """meter-0001's readings of `hour` scaled by `factor`, and a manual recompute of that hourly
    cell run on its own (what it queues above stays pending)."""
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
    world.ingest(rows.set_column(2, "energy_kwh", pc.multiply(rows["energy_kwh"], factor)))
    job = Job(
        rollup="energy_hourly",
        trigger=Trigger.MANUAL,
        windows=(Window(hour, hour + timedelta(hours=1)),),
        entities=frozenset(["meter-0001"]),
    )
    hourly = world.catalog.rollup("energy_hourly")
    return run_recompute(world.engine, spark, hourly, job, run_id="test")


class OpenGate:
    """Every level's slot is free and no other run is about."""

    @contextmanager
    def hold(self, spec: RollupSpec) -> Iterator[bool]:
        yield True

    def launched_for(self, job_id: str) -> bool:
        return False

    def forward_in_flight(self) -> set[str]:
        return set()


def test_a_cell_above_with_a_change_below_not_yet_applied_is_merged_again(
    world: World, spark: SparkSession
) -> None:
    """Two corrections of one meter's day, the first's propagation still pending when the
    second's run carries it up: the day's stored row does not reflect the first, so taking the
    second's old partials out would lose it. The day is merged again from the hours (with both),
    and the levels above it, which did reflect the day as the run found it, are corrected from
    its old and new partials."""
    setup_chain(world)
    hourly = world.catalog.rollup("energy_hourly")
    first = manual_correction(world, spark, HOUR_START, 2.0)  # its day's job stays pending
    assert [j.rollup for j in first.propagated] == ["energy_daily"]
    second = manual_correction(world, spark, HOUR_START + timedelta(hours=3), 3.0)  # same day
    assert second.change is not None and len(second.change.cells) == 1
    done = {
        s.name: o
        for s, o in Chain(world.engine, spark, OpenGate(), "test", NOW).run(hourly, second)
    }
    # Every level is right before the first correction's pending day job even runs.
    assert compare_all(world.query, world.raw(), world.catalog) == []
    day, week = done["energy_daily"].job, done["energy_weekly"].job
    assert day.technique == "delta+recompute" and day.cells_applied == 0, day.plan
    assert "energy_hourly changed below it since it was stored" in (day.plan or "")
    assert week.technique == "delta" and week.cells_applied == 1, week.plan
    world.tick(NOW)
    assert compare_all(world.query, world.raw(), world.catalog) == []


def test_a_bucket_above_queued_for_every_entity_takes_the_entities_that_changed_below(
    world: World, spark: SparkSession
) -> None:
    """A day queued for every meter (as past the entity limit) in the run that changed an hour
    below it is corrected for the meter whose hour changed, from its old and new partials."""
    setup_chain(world)
    change = manual_correction(world, spark, HOUR_START, 2.0)
    assert change.change is not None
    day = next(j for j in change.propagated if j.rollup == "energy_daily")
    whole = replace(day, entities=None, cells=None)  # the same job, for every meter
    daily = world.catalog.rollup("energy_daily")
    done = run_recompute(world.engine, spark, daily, whole, run_id="test", below=change.change)
    assert done.job.technique == "delta" and done.job.cells_applied == 1, done.job.plan
    assert "queued for every entity" in (done.job.plan or "")
    # The day is right at once (the hourly and daily levels; the pending jobs above run next).
    names = ["energy_hourly", "energy_daily"]
    assert compare_all(world.query, world.raw(), world.catalog, names=names) == []
    world.tick(NOW)
    assert compare_all(world.query, world.raw(), world.catalog) == []


@pytest.fixture
def kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark) -> Iterator[World]:
    """A world whose superseded generations stay (rollback needs them)."""
    yield from world_of(tmp_path, monkeypatch, load_catalog(), retention_hours=168)


def test_a_change_below_undone_before_the_level_above_runs_is_not_applied(
    kept: World, spark: SparkSession
) -> None:
    """An hour corrected, then rolled back before the day above it runs: the pointers are as
    the correction found them, but its change no longer holds, so the day is merged again from
    the hours as they are (not corrected from the undone change)."""
    world = kept
    setup_chain(world)
    change = manual_correction(world, spark, HOUR_START, 2.0)
    assert change.change is not None
    rollback(world.engine, "energy_hourly", change.job.job_id)
    day = next(j for j in change.propagated if j.rollup == "energy_daily")
    daily = world.catalog.rollup("energy_daily")
    done = run_recompute(world.engine, spark, daily, day, run_id="test", below=change.change)
    assert "changed again" in (done.job.plan or ""), done.job.plan
    span = day.windows[0]
    hours = world.query("energy_hourly", start=span.start, end=span.end, entities=["meter-0001"])
    days_ = world.query("energy_daily", start=span.start, end=span.end, entities=["meter-0001"])
    assert days_["energy_kwh_sum"].to_pylist() == [
        pytest.approx(sum(hours["energy_kwh_sum"].to_pylist()))
    ]


def test_a_late_reading_in_an_hour_with_nothing_stored_is_carried_up_from_spark(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hourly level on Spark, for a cell of an hour with nothing stored yet (after the
    data, before the watermark): it hands its change up with no old partials."""
    for module in ("engine", "incremental"):
        monkeypatch.setattr(f"rollup_assets.services.{module}.DRIVER_CELLS", 0)
    setup_chain(world)
    empty = datetime(2025, 6, 15, 12, 0, tzinfo=UTC)
    reading = [{"entity_id": "meter-0001", "ts": empty, "energy_kwh": 5.0}]
    world.ingest(pa.Table.from_pylist(reading), source="Manual")
    world.tick(NOW)
    assert compare_all(world.query, world.raw(), world.catalog) == []
