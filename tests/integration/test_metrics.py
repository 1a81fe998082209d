"""Metrics end to end: after an ingest, a refused batch, a correction (one of whose runs fails
once and is retried) and a closed bucket, every instrument holds what the raw batches, the
ledger and the archive states say happened."""

from collections import Counter
from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.errors import IngestValidationError
from rollup_assets.model.jobs import Job, JobState, Lane
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.runner import tick_until_quiet
from tests.conftest import World, days, fault_at
from tests.metric_points import Instrument, read, reading

NOW = datetime(2025, 11, 15, 12, 0, tzinfo=UTC)
FIRST = date(2025, 8, 4)
DAYS = 10
METERS = 3
METER = "meter-0001"
# The local (Vienna) day 2025-08-08 is 2025-08-07 22:00Z .. 2025-08-08 22:00Z.
DAY_START = datetime(2025, 8, 7, 22, 0, tzinfo=UTC)
CHAIN = ("energy_hourly", "energy_daily", "energy_weekly", "energy_monthly")


def readings() -> pa.Table:
    return pa.concat_tables([day_batch(d, METERS, seed=3) for d in days(FIRST, DAYS)])


def correction(batch: pa.Table) -> pa.Table:
    """The meter's readings of that local day, doubled."""
    ts = batch["ts"]
    keep = pc.and_(
        pc.equal(batch["entity_id"], METER),
        pc.and_(
            pc.greater_equal(ts, pa.scalar(DAY_START, ts.type)),
            pc.less(ts, pa.scalar(DAY_START + timedelta(days=1), ts.type)),
        ),
    )
    day = batch.filter(keep)
    return day.set_column(2, "energy_kwh", pc.multiply(day["energy_kwh"], 2.0))


def outcome(job: Job) -> str:
    if job.state is JobState.FAILED:
        return "given_up" if job.gave_up else "failed"
    return job.state.value.lower()


def ended(world: World) -> list[Job]:
    return [j for j in world.engine.ledger.snapshot().jobs.values() if j.state.terminal]


def seconds(h: Instrument, **attrs: str) -> tuple[int, float, float, float]:
    """(count, sum, min, max) over the histogram's points with `attrs`."""
    points = h.recorded(**attrs)
    assert points, attrs
    return (
        sum(p.count for p in points),
        sum(p.sum for p in points),
        min(p.min for p in points),
        max(p.max for p in points),
    )


@pytest.mark.timeout(900)
def test_every_instrument_after_an_ingest_and_a_correction(world: World) -> None:
    with reading() as reader:
        batch = readings()
        world.ops.activate("energy_raw", now=NOW)
        world.ingest(batch, source="Import")
        world.activate_all(NOW)
        start = datetime(FIRST.year, FIRST.month, FIRST.day, tzinfo=UTC)
        world.backfill([Window(start, start + timedelta(days=DAYS))])
        world.tick(NOW)

        bad = correction(batch).slice(0, 3)
        bad = bad.set_column(2, "energy_kwh", pa.array([1.0, None, 2.0], pa.float64()))
        with pytest.raises(IngestValidationError):
            world.ingest(bad, source="Manual")

        before = read(reader)
        fixed = correction(batch)
        world.ingest(fixed, source="Manual")
        # The daily level's first run for the correction fails; its retry completes.
        with fault_at("before_correct", "raise", archive="energy_daily"):
            tick_until_quiet(world.defs, world.instance, NOW)
        world.tick(NOW)
        hourly_mark = world.engine.states.get("energy_hourly").watermark
        world.tick(NOW + timedelta(hours=2))  # the forward lane closes two more hours
        closed = (world.engine.states.get("energy_hourly").watermark - hourly_mark) // timedelta(
            hours=1
        )
        seen = read(reader)

    # Rows ingested: every row of the first batch inserted; the correction's rows updated,
    # except readings of zero, which doubling leaves as they were.
    rows = seen["rollups.ingest.rows"]
    assert rows.total(archive="energy_raw", change_source="Import", result="inserted") == len(batch)
    zeros = pc.sum(pc.equal(fixed["energy_kwh"], 0.0)).as_py()
    assert rows.total(change_source="Manual", result="updated") == len(fixed) - zeros
    assert rows.total(change_source="Manual") == len(fixed)
    assert rows.total() == len(batch) + len(fixed)
    # The batch with a null required value: refused whole, at a row.
    assert seen["rollups.ingest.refused"].counts == {
        frozenset({("archive", "energy_raw"), ("reason", "row")}): 1
    }

    # Dirty cells: the (hour, meter) pairs the correction touched, all named cells.
    cells = seen["rollups.detection.cells"]
    hours = {t.replace(minute=0) for t in fixed["ts"].to_pylist()}
    assert before.get("rollups.detection.cells") is None
    assert cells.total(rollup="energy_hourly", scope="entity") == len(hours)
    assert cells.total() == len(hours)
    count, _, low, high = seconds(seen["rollups.detection.lag"], archive="energy_raw")
    assert count >= 1 and 0 <= low <= high < 300

    # Jobs by outcome: exactly the ledger's ended jobs, per rollup, lane and outcome.
    jobs = seen["rollups.jobs"]
    expected = Counter((j.rollup, j.trigger.lane.value, outcome(j)) for j in ended(world))
    for (rollup, lane, out), n in expected.items():
        assert jobs.total(rollup=rollup, lane=lane, outcome=out) == n, (rollup, lane, out)
    assert jobs.total() == sum(expected.values())
    for rollup in CHAIN:
        assert jobs.total(rollup=rollup, lane="recompute", outcome="completed") >= 1, rollup
    assert jobs.total(rollup="energy_daily", lane="recompute", outcome="failed") == 1
    assert jobs.total(outcome="given_up") == 0
    failures = seen["rollups.failures"]
    assert failures.total(**{"where": "recompute", "error.type": "FaultInjected"}) == 1
    assert failures.total() == 1

    # Run time: the ledger's durations of the completed recompute jobs, in seconds.
    duration = seen["rollups.job.duration"]
    for rollup in CHAIN:
        done = [
            j.duration_ms
            for j in ended(world)
            if j.rollup == rollup
            and j.trigger.lane is Lane.RECOMPUTE
            and j.state is JobState.COMPLETED
            and j.duration_ms is not None
        ]
        count, total, _, high = seconds(
            duration, rollup=rollup, lane="recompute", outcome="completed"
        )
        assert count == len(done) and total == pytest.approx(sum(done) / 1000)
        assert high > 0

    # The forward lane closed the hours the clock moved past.
    forward = seen["rollups.forward.closed"].total(rollup="energy_hourly")
    earlier = before.get("rollups.forward.closed")
    assert closed >= 1
    assert forward - (earlier.total(rollup="energy_hourly") if earlier else 0) == closed

    # Surface lag: each corrected level published its flip, a moment after it.
    lag = seen["rollups.surface.lag"]
    for rollup in CHAIN:
        count, _, low, high = seconds(lag, rollup=rollup)
        assert count >= 1 and 0 <= low <= high < 120, rollup
