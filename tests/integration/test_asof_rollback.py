"""As-of reads return what a reader saw before and after a correction; rolling the correction
back restores the exact earlier values at every level (across a month boundary); superseded
generations stay for the generation retention and are swept after it."""

import time
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.errors import AsOfUnavailableError, RollbackRefusedError
from rollup_assets.model.jobs import Job, JobState, Trigger
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.runner import execute
from rollup_assets.services.engine import Engine
from rollup_assets.services.health import health
from rollup_assets.services.maintenance import maintain
from rollup_assets.services.query import query_arrow, query_spark
from rollup_assets.services.rollback import rollback
from tests.conftest import World, days, world_of
from tests.integration.test_surface import surface
from tests.oracle import compare_all

NOW = datetime(2025, 8, 6, 12, 0, tzinfo=UTC)
FIRST = date(2025, 7, 28)
DAYS = 9
METER = "meter-0002"
# Vienna's August starts at 2025-07-31 22:00Z: the corrected span crosses the month boundary.
SPAN = Window(datetime(2025, 7, 31, 12, 0, tzinfo=UTC), datetime(2025, 8, 1, 12, 0, tzinfo=UTC))
HOURLY = "energy_hourly"


@pytest.fixture
def kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark) -> Iterator[World]:
    """A world whose superseded generations stay a week (the default retention)."""
    yield from world_of(tmp_path, monkeypatch, load_catalog(), retention_hours=168)


def loaded(world: World) -> None:
    world.ops.activate("energy_raw", now=NOW)
    world.ingest(
        pa.concat_tables([day_batch(d, 4, seed=5) for d in days(FIRST, DAYS)]), source="Import"
    )
    world.activate_all(NOW)
    start = datetime(FIRST.year, FIRST.month, FIRST.day, tzinfo=UTC)
    world.backfill([Window(start, start + timedelta(days=DAYS))])
    world.tick(NOW)


def correction(factor: float) -> pa.Table:
    """The meter's readings in SPAN, multiplied by `factor`."""
    batch = pa.concat_tables(
        [day_batch(d, 4, seed=5) for d in (date(2025, 7, 31), date(2025, 8, 1))]
    )
    ts = batch["ts"]
    keep = pc.and_(
        pc.equal(batch["entity_id"], METER),
        pc.and_(
            pc.greater_equal(ts, pa.scalar(SPAN.start, ts.type)),
            pc.less(ts, pa.scalar(SPAN.end, ts.type)),
        ),
    )
    part = batch.filter(keep)
    return part.set_column(2, "energy_kwh", pc.multiply(part["energy_kwh"], factor))


def corrected(world: World, factor: float) -> Job:
    """Ingest a correction, let every level recompute; the first level's job that flipped it."""
    since = datetime.now(UTC)
    world.ingest(correction(factor), source="Manual")
    world.tick(NOW)
    jobs = [
        j
        for j in world.engine.ledger.history(HOURLY)
        if j.created_at >= since and j.state is JobState.COMPLETED and j.windows_processed
    ]
    assert len(jobs) == 1, jobs
    return jobs[0]


def instant() -> datetime:
    """Now, strictly between the commits before and after (commit times have milliseconds)."""
    time.sleep(0.01)
    t = datetime.now(UTC)
    time.sleep(0.01)
    return t


def as_of(world: World, at: datetime):
    return lambda name: query_arrow(world.engine, name, as_of=at)


def test_as_of_reads_and_rollback_restore_exact_values_at_every_level(kept: World, spark) -> None:
    world = kept
    loaded(world)
    raw0, rows0 = world.raw(), world.query("energy_raw")
    assert compare_all(world.query, raw0, world.catalog) == []
    before = instant()

    first = corrected(world, 2.0)
    raw1 = world.raw()
    assert compare_all(world.query, raw1, world.catalog) == []
    between = instant()
    second = corrected(world, 3.0)
    raw2 = world.raw()
    assert compare_all(world.query, raw2, world.catalog) == []

    # As-of reads: exactly what readers saw before and after each correction, raw included.
    assert compare_all(as_of(world, before), raw0, world.catalog) == []
    assert compare_all(as_of(world, between), raw1, world.catalog) == []
    assert query_arrow(world.engine, "energy_raw", as_of=before).equals(rows0)
    then = query_arrow(world.engine, "energy_monthly", as_of=before)
    via_spark = query_spark(world.engine, spark, "energy_monthly", as_of=before).toArrow()
    assert via_spark.num_rows == then.num_rows > 0
    assert via_spark.select(then.column_names).to_pylist() == then.to_pylist()
    with pytest.raises(AsOfUnavailableError, match="'energy_daily' did not exist yet at 2020"):
        query_arrow(world.engine, "energy_daily", as_of=datetime(2020, 1, 1, tzinfo=UTC))

    # Upkeep within the retention keeps both the superseded rows (sweep, reclaim) and the files
    # of earlier versions (vacuum never goes below the generation retention).
    maintain(world.engine, now=NOW, retention_hours=0, enforce_retention=False)
    assert compare_all(as_of(world, before), raw0, world.catalog) == []

    # Refusals change nothing.
    with pytest.raises(RollbackRefusedError, match="no such job of 'energy_hourly'"):
        rollback(world.engine, HOURLY, "nope")
    with pytest.raises(RollbackRefusedError, match=f"changed again since, by job.*{second.job_id}"):
        rollback(world.engine, HOURLY, first.job_id)
    assert compare_all(world.query, raw2, world.catalog) == []

    # Newest first: undo the second correction, then the first; the levels above follow.
    # The first through the launchpad's operator job.
    config = {"ops": {"rollback": {"config": {"rollup": HOURLY, "job_id": second.job_id}}}}
    run = execute(world.defs, world.instance, "rollback_rollup", {}, config)
    assert run is not None and run.success, run and run.error
    undone = world.engine.ledger.snapshot().last_rollback(HOURLY)
    assert undone is not None and undone.undoes == second.job_id
    queued = [j for j in world.engine.ledger.snapshot().pending("energy_daily")]
    assert queued and all(j.trigger is Trigger.CHAIN for j in queued)
    world.tick(NOW)
    assert compare_all(world.query, raw1, world.catalog) == []
    with pytest.raises(RollbackRefusedError, match=f"already rolled back by job {undone.job_id}"):
        rollback(world.engine, HOURLY, second.job_id)

    out = rollback(world.engine, HOURLY, first.job_id, run_id="test")
    # The rollback published the surface: a plain Delta reader sees the restored values at once.
    assert surface(world, HOURLY).to_pylist() == world.query(HOURLY).to_pylist()
    world.tick(NOW)
    # Every level equals the oracle of the raw data before any correction (July's and
    # August's months, the weeks and days around the boundary, the hours in SPAN), on the read
    # path and on the surface tables.
    assert compare_all(world.query, raw0, world.catalog) == []
    assert compare_all(lambda n: surface(world, n), raw0, world.catalog) == []

    job = world.engine.ledger.job(out.job.job_id)
    assert job is not None and job.trigger is Trigger.ROLLBACK and job.undoes == first.job_id
    assert job.state is JobState.COMPLETED and job.technique == "rollback"
    assert out.generations and max(out.generations) < first.generation
    assert {w.start for w in out.cells.windows} == {
        SPAN.start + timedelta(hours=h) for h in range(24)
    }
    assert out.cells.entities == frozenset({METER})
    h = health(world.catalog, HOURLY, world.engine.ledger.snapshot(), world.engine.states.all())
    assert h.last_rollback is not None and h.last_rollback.startswith(
        f"{out.job.job_id} undid {first.job_id} at "
    )
    # What readers saw in between is still what they saw then.
    assert compare_all(as_of(world, between), raw1, world.catalog) == []
    third = retention_keeps_then_sweeps(world)

    pending = world.ops.request_recompute(HOURLY, SPAN.start, SPAN.end)
    with pytest.raises(RollbackRefusedError, match="has not flipped a generation"):
        rollback(world.engine, HOURLY, pending.job_id)
    # A recompute in flight may flip the same cells: a rollback waits for it.
    world.engine.ledger.record([pending.next(state=JobState.RUNNING, run_id="elsewhere")])
    with pytest.raises(RollbackRefusedError, match=f"job {pending.job_id} is recomputing"):
        rollback(world.engine, HOURLY, third.job_id)


def physical_rows(world: World, name: str) -> int:
    return (
        DeltaTable(world.engine.rollups.uri(world.catalog.rollup(name))).to_pyarrow_table().num_rows
    )


def generation_rows(world: World, name: str, generations: set[int | None]) -> int:
    rows = DeltaTable(world.engine.rollups.uri(world.catalog.rollup(name))).to_pyarrow_table()
    return sum(1 for g in rows["generation"].to_pylist() if g in generations)


def retention_keeps_then_sweeps(world: World) -> Job:
    """Superseded generations stay for the retention, and are swept after it; the job of a
    third correction, whose replaced rows were swept."""
    kept_before = physical_rows(world, HOURLY) - world.query(HOURLY).num_rows
    assert kept_before > 0  # what the corrections and rollbacks above superseded
    jobs = world.engine.ledger.snapshot().for_rollup(HOURLY)
    undone = {j.undoes for j in jobs if j.trigger is Trigger.ROLLBACK}
    undone_gens = {j.generation for j in jobs if j.job_id in undone}
    assert len(undone_gens) == 2  # the two corrections rolled back above
    undone_rows = generation_rows(world, HOURLY, undone_gens)
    assert 0 < undone_rows <= kept_before
    job = corrected(world, 4.0)
    active = world.query(HOURLY).num_rows
    superseded = physical_rows(world, HOURLY) - active
    # The rows of rolled-back generations stay like every superseded row (an as-of read of the
    # time between their flip and the rollback reads them; a reclaim never deletes a generation
    # that was flipped), and so do the meter's 24 hours in SPAN this correction replaced.
    assert generation_rows(world, HOURLY, undone_gens) == undone_rows
    assert superseded == kept_before + 24

    maintain(world.engine, now=NOW)
    assert physical_rows(world, HOURLY) - active == superseded

    # A rollup without a retention refuses the rollback: nothing it replaced is guaranteed.
    warehouse = world.engine.warehouse
    none = Engine(world.catalog, warehouse, generation_retention=timedelta(0))
    with pytest.raises(RollbackRefusedError, match=r"generation retention \(0s"):
        rollback(none, HOURLY, job.job_id)

    # A freeze over the job's buckets holds every writer still, a rollback too.
    world.ops.freeze(HOURLY, SPAN.end + timedelta(days=1))
    with pytest.raises(RollbackRefusedError, match="frozen until 2025-08-02T12:00:00Z"):
        rollback(world.engine, HOURLY, job.job_id)
    world.ops.unfreeze(HOURLY)

    # Once the retention has passed since the flip, the sweep deletes the superseded rows: one
    # base row per cell is left, and the difference rows still visible (until a fold takes
    # them in): the rolled-back generations' too, which the third correction's difference
    # pointer shows again (a cell's differences are visible up to its pointer, so a correction
    # after a rollback brings the cell back to its source, as a recompute would).
    short = Engine(world.catalog, warehouse, generation_retention=timedelta(seconds=1))
    time.sleep(1.1)
    maintain(short, now=NOW)
    rows = DeltaTable(world.engine.rollups.uri(world.catalog.rollup(HOURLY))).to_pyarrow_table()
    base = rows.filter(pc.invert(pc.fill_null(rows["delta"], False)))
    assert base.num_rows == active
    assert generation_rows(world, HOURLY, undone_gens) == undone_rows
    assert world.query(HOURLY).num_rows == active
    assert compare_all(world.query, world.raw(), world.catalog) == []
    return job
