"""Raw retention end to end: maintenance drops the old raw days, every level keeps its values,
the oracle leaves the dropped range out, a first-level recompute over it is refused without
writing anything, and the level above still recomputes from the level below."""

from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
import pytest

from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.errors import RawRowsRetainedError
from rollup_assets.model.jobs import JobState, Trigger
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.partitions import key_range_for, partitions_def_for
from rollup_assets.services.maintenance import maintain
from tests.conftest import World, days
from tests.oracle import compare_all

NOW = datetime(2025, 11, 20, 12, 0, tzinfo=UTC)
FIRST = date(2025, 5, 5)  # a Monday: six days in one ISO week and one month
N_DAYS = 6
METERS = 3
D = timedelta(days=1)


def midnight(d: date) -> datetime:
    return datetime(d.year, d.month, d.day, tzinfo=UTC)


def every_level(world: World) -> dict[str, pa.Table]:
    return {
        name: world.query(name).sort_by([("bucket_start", "ascending"), ("entity_id", "ascending")])
        for name in world.catalog.rollups
    }


def test_retention_keeps_every_level_and_refuses_first_level_work_over_dropped_days(
    world: World,
) -> None:
    world.ops.activate("energy_raw", now=NOW)
    world.ingest(pa.concat_tables([day_batch(d, METERS, seed=11) for d in days(FIRST, N_DAYS)]))
    world.activate_all(NOW)
    start = midnight(FIRST)
    world.backfill([Window(start, start + N_DAYS * D)])
    world.tick(NOW)
    assert compare_all(world.query, world.raw(), world.catalog) == []
    before = every_level(world)
    raw_before = world.raw()

    # now - retention falls inside the fourth day: the first three UTC days go.
    retention = world.catalog.raw["energy_raw"].retention
    assert retention is not None
    kept_from = midnight(FIRST + 3 * D)
    report = maintain(world.engine, now=kept_from + retention + timedelta(hours=10))
    assert report.raw_days_dropped == 3 and report.retention_failures == 0, report.details
    left = world.raw()
    assert sorted(set(left["ts"].dt.date)) == [FIRST + i * D for i in range(3, N_DAYS)]
    assert len(left) == (raw_before["ts"] >= kept_from).sum()

    # Every level still holds exactly what it held: a retention delete is not a correction.
    world.tick(NOW)
    assert every_level(world) == before
    assert compare_all(world.query, raw_before, world.catalog) == []

    # The oracle over the raw rows left: the dropped range is left out (and counted), the rest
    # still equals a fresh aggregation; without leaving it out, the comparison fails.
    removed = world.engine.removed_spans(world.catalog.raw["energy_raw"])
    assert removed == [Window(removed[0].start, kept_from)]
    skipped: dict[str, int] = {}
    assert compare_all(world.query, left, world.catalog, removed=removed, skipped=skipped) == []
    assert skipped["energy_hourly"] == 3 * 24
    assert skipped["energy_daily"] == 4  # Vienna days of 05-05..05-08 (05-08 starts 05-07 22:00Z)
    assert skipped["energy_weekly"] == 1 and skipped["energy_yearly"] == 1
    assert compare_all(world.query, left, world.catalog, names=["energy_hourly"]) != []

    # A first-level recompute over the dropped days: refused, naming the rollup and the range.
    hourly = world.catalog.rollup("energy_hourly")
    version = world.engine.rollups.snapshot(hourly).version
    jobs = len(world.engine.ledger.snapshot().jobs)
    gone = Window(midnight(FIRST + D), midnight(FIRST + 2 * D))
    with pytest.raises(RawRowsRetainedError, match=r"'energy_hourly' again over \[2025-05-06"):
        world.ops.request_recompute("energy_hourly", gone.start, gone.end)
    assert len(world.engine.ledger.snapshot().jobs) == jobs
    # The same through Dagster (a manual materialization of those partitions): the run fails
    # with the same reason, and nothing is written.
    keys = key_range_for(
        partitions_def_for(hourly), [Window(gone.start, gone.start + 2 * timedelta(hours=1))]
    )
    run = world.materialize("energy_hourly", keys.start, keys.end)
    assert not run.success and "retention removed" in (run.error or ""), run.error
    assert world.engine.rollups.snapshot(hourly).version == version
    assert every_level(world) == before
    # Refused at once even when a freeze holds those buckets back: nothing is left pending to
    # fail once the freeze is lifted.
    world.ops.freeze("energy_hourly", until=gone.end)
    run = world.materialize("energy_hourly", keys.start, keys.end)
    assert not run.success and "retention removed" in (run.error or ""), run.error
    assert len(world.engine.ledger.snapshot().jobs) == jobs
    world.ops.unfreeze("energy_hourly")
    world.tick(NOW)  # fails on any failed run
    assert every_level(world) == before

    # The level above recomputes the same range from the stored level below.
    daily = world.ops.request_recompute("energy_daily", gone.start, gone.end)
    world.tick(NOW)
    done = world.engine.ledger.job(daily.job_id)
    assert done is not None and done.state is JobState.COMPLETED, done
    assert done.trigger is Trigger.MANUAL and (done.source_rows or 0) > 0, done
    assert every_level(world) == before
