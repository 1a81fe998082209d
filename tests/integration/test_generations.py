"""Generation swaps: the changed cells of a re-materialized partition get a new generation (the
unchanged ones are left as they are), the superseded rows are swept, and a run that dies between
its row commit and its pointer flip changes nothing visible."""

from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rollup_assets.compute.arrow_types import TS
from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.jobs import JobState
from rollup_assets.model.windows import Window
from tests.conftest import World, days, fault_at

NOW = datetime(2025, 6, 20, 12, 0, tzinfo=UTC)
FIRST = date(2025, 6, 1)
HOUR = "2025-06-10-14:00"  # Vienna local: 12:00-13:00 UTC
HOUR_START = datetime(2025, 6, 10, 12, 0, tzinfo=UTC)


def setup_chain(world: World) -> None:
    world.ops.activate("energy_raw", now=NOW)
    world.ingest(pa.concat_tables([day_batch(d, 3, seed=3) for d in days(FIRST, 14)]))
    world.activate_all(NOW)
    world.backfill([Window(datetime(2025, 6, 1, tzinfo=UTC), datetime(2025, 6, 15, tzinfo=UTC))])


def corrected_hour() -> pa.Table:
    rows = [
        {
            "entity_id": "meter-0001",
            "ts": HOUR_START + timedelta(minutes=15 * i),
            "energy_kwh": 100.0 + i,
        }
        for i in range(4)
    ]
    return pa.Table.from_pylist(rows)


def table_rows(world: World, rollup: str) -> pa.Table:
    """Every stored row (all generations) of a rollup, straight from the Delta snapshot."""
    from rollup_assets.resources.delta_tables import open_table

    t = open_table(world.engine.rollups.uri(world.catalog.rollup(rollup)))
    assert t is not None
    return pa.table(t.to_pyarrow_table())


def generations_in(world: World, start: datetime, entity: str | None = None) -> set[int]:
    rows = table_rows(world, "energy_hourly")
    rows = rows.filter(pc.equal(rows["bucket_start"], pa.scalar(start, TS)))
    if entity is not None:
        rows = rows.filter(pc.equal(rows["entity_id"], entity))
    return set(rows["generation"].to_pylist())


def test_rematerializing_one_partition_swaps_only_that_window(world: World) -> None:
    setup_chain(world)
    before = world.query("energy_hourly")
    gen_before = generations_in(world, HOUR_START)
    other_before = {
        g
        for r in table_rows(world, "energy_hourly").to_pylist()
        if r["bucket_start"] != HOUR_START
        for g in [r["generation"]]
    }

    world.ingest(corrected_hour(), source="Manual")
    still_old = world.query("energy_hourly")
    assert still_old.equals(before)  # nothing recomputed yet: readers see the old values

    run = world.materialize("energy_hourly", HOUR, HOUR)
    assert run.success, run.error
    after = world.query("energy_hourly")

    in_hour = pc.equal(after["bucket_start"], pa.scalar(HOUR_START, TS))
    changed = after.filter(pc.and_(in_hour, pc.equal(after["entity_id"], "meter-0001"))).to_pylist()
    assert changed[0]["energy_kwh_sum"] == pytest.approx(sum(100.0 + i for i in range(4)))
    # Every other window is untouched (same values, same rows).
    assert after.filter(pc.invert(in_hour)).equals(
        before.filter(pc.invert(pc.equal(before["bucket_start"], pa.scalar(HOUR_START, TS))))
    )
    # The corrected cell moved to a new generation and its superseded row was swept; the
    # window's other meters did not change, so their rows were left as they were.
    gen_after = generations_in(world, HOUR_START, "meter-0001")
    assert len(gen_after) == 1 and min(gen_after) > max(gen_before)
    assert generations_in(world, HOUR_START, "meter-0002") == gen_before
    pointers = world.engine.rollups.snapshot(world.catalog.rollup("energy_hourly")).pointers
    flipped = pointers.filter(pc.equal(pointers["generation"], min(gen_after)))
    assert flipped.select(["bucket_start", "entity_id"]).to_pylist() == [
        {"bucket_start": HOUR_START, "entity_id": "meter-0001"}
    ]
    other_after = {
        r["generation"]
        for r in table_rows(world, "energy_hourly").to_pylist()
        if r["bucket_start"] != HOUR_START
    }
    assert other_after == other_before


def test_a_run_that_dies_before_the_flip_changes_nothing(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup_chain(world)
    before = world.query("energy_hourly")
    world.ingest(corrected_hour(), source="Manual")

    with fault_at("after_commit"):
        run = world.materialize("energy_hourly", HOUR, HOUR)
    assert not run.success and "after_commit" in (run.error or "")
    # The new generation's rows are committed but unreferenced: readers still see the old values.
    assert world.query("energy_hourly").equals(before)
    dead_gens = generations_in(world, HOUR_START, "meter-0001")
    assert len(dead_gens) == 2

    run = world.materialize("energy_hourly", HOUR, HOUR)
    assert run.success, run.error
    after = world.query("energy_hourly")
    assert not after.equals(before)
    # The next run reclaimed the dead run's rows and swept the superseded ones: one generation left
    # for the corrected cell (the unchanged meters keep theirs).
    gens = generations_in(world, HOUR_START, "meter-0001")
    assert len(gens) == 1 and min(gens) > max(dead_gens)
    assert generations_in(world, HOUR_START) == {min(dead_gens), *gens}
    jobs = world.engine.ledger.history("energy_hourly")
    failed = [j for j in jobs if j.state is JobState.FAILED]
    assert len(failed) == 1 and "after_commit" in (failed[0].error or "")
    # The failed run's work was queued again as its second attempt (the fault fired once).
    [retry] = [j for j in jobs if j.attempt == 2]
    assert retry.state is JobState.PENDING and f"retried as {retry.job_id}" in failed[0].error
