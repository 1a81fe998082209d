"""Chain propagation inside the run: a recompute carries its change up every level in the same
run when it can take each level's pool slot, and leaves a level to the sensors when another run
holds it."""

from datetime import UTC, date, datetime, timedelta

import pyarrow as pa

from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.jobs import JobState, Trigger
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.instance import pool_name
from rollup_assets.orchestration.runner import tick
from tests.conftest import World, days
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
    # One run: the hourly recompute, then in the same run the daily and weekly recomputes and
    # the refresh of the open month and year, which now contain the corrected hour. The hourly
    # open bucket is far from the correction, so no forward run is launched either.
    assert [r.job_name for r in runs] == ["energy_hourly_job"], [r.job_name for r in runs]
    jobs = chain_jobs(world, since)
    for name in ("energy_daily", "energy_weekly"):
        assert [j.state for j in jobs[name]] == [JobState.COMPLETED], (name, jobs[name])
        assert jobs[name][0].run_id == runs[0].run_id
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
    finally:
        storage.free_concurrency_slot_for_step("other-run", "energy_daily")
    # Once the slot is free, the sensor launches the daily level, which carries on above it.
    reports = world.tick(NOW)
    assert next(r.job_name for rep in reports for r in rep.runs) == "energy_daily_job"
    done = chain_jobs(world, since)
    assert [j.state for j in done["energy_daily"]] == [JobState.COMPLETED]
    assert compare_all(world.query, world.raw(), world.catalog) == []
