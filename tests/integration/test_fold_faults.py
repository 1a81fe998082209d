"""A fold that fails or dies at any point of its run leaves every level equal to the oracle, and
a later run folds what it did not.

A fold is a recompute job (trigger Maintenance) that rewrites buckets whole from their visible
rows (base and differences), under one bucket pointer. It fails here at each point of a
recompute: before anything is written, after its files are written, after its commit (rows
there, pointers not flipped), and after its flip (the job not yet recorded completed). Readers
see the old layout or the new one, never a mix, and the values never change.

The corrected chain (its hour's difference pointers not yet folded) is built once per module and
copied per fault point. The correction gave the levels above cell pointers too; they are folded
in that build, so the maintenance pass of each case queues the hour's fold alone.
"""

from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from rollup_assets import faults
from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.jobs import JobState, Trigger
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.runner import tick
from rollup_assets.resources.delta_tables import file_actions
from rollup_assets.resources.rollup_reads import CellsUnknowable, RollupReads, Unknown
from rollup_assets.services.maintenance import fold_jobs, maintain
from tests.conftest import World, days
from tests.integration.test_crash_points import open_world, template_root, world_copy
from tests.oracle import compare_all

NOW = datetime(2025, 6, 20, 12, 0, tzinfo=UTC)
FIRST = date(2025, 6, 9)  # a Monday
N_DAYS = 2
METERS = 3
HOUR = datetime(2025, 6, 10, 7, 0, tzinfo=UTC)
HOURLY = "energy_hourly"


def cell_pointers(world: World, start: datetime) -> int:
    pointers = world.engine.rollups.snapshot(world.catalog.rollup(HOURLY)).pointers
    at = pa.scalar(start, pointers.schema.field("bucket_start").type)
    rows = pointers.filter(pc.equal(pointers["bucket_start"], at))
    return sum(1 for e in rows["entity_id"].to_pylist() if e is not None)


def build_corrected(root: Path) -> None:
    """Two days backfilled and ticked, then every meter's readings of one hour corrected: a
    difference pointer per meter, not yet folded (the levels above folded theirs)."""
    world = open_world(root)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("rollup_assets.model.cells.FOLD_MIN_POINTERS", METERS)
            world.ops.activate("energy_raw", now=NOW)
            world.ingest(
                pa.concat_tables([day_batch(d, METERS, seed=5) for d in days(FIRST, N_DAYS)])
            )
            world.activate_all(NOW)
            start = datetime(FIRST.year, FIRST.month, FIRST.day, tzinfo=UTC)
            world.backfill([Window(start, start + timedelta(days=N_DAYS))])
            world.tick(NOW)
            # Every meter's readings of one hour corrected: a difference pointer per meter.
            double_hour(world, HOUR)
            assert cell_pointers(world, HOUR) == METERS
            # The levels above got a cell pointer per meter too: fold them here, once, as
            # maintenance would (the hourly level left out), so each case folds the hour alone.
            above = fold_jobs(world.engine, {HOURLY}, NOW)
            assert above and HOURLY not in {j.rollup for j in above}
            world.engine.ledger.record(above)
            world.tick(NOW)
            assert {j.rollup for j in fold_jobs(world.engine, set(), NOW)} == {HOURLY}
            assert cell_pointers(world, HOUR) == METERS
            assert compare_all(world.query, world.raw(), world.catalog) == []
    finally:
        world.instance.dispose()


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory, spark) -> Path:
    return template_root(tmp_path_factory, "fold-template", build_corrected)


@pytest.fixture
def corrected(template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    """A copy of the corrected chain, its hour's difference pointers not yet folded."""
    yield from world_copy(template, tmp_path, monkeypatch)


@pytest.mark.parametrize("point", ["before_correct", "after_write", "after_commit", "after_flip"])
def test_a_fold_failing_at_any_point_changes_no_value_and_is_done_later(
    corrected: World, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    world = corrected
    monkeypatch.setattr("rollup_assets.model.cells.FOLD_MIN_POINTERS", METERS)
    assert cell_pointers(world, HOUR) == METERS
    truth = world.raw()

    maintain(world.engine, now=NOW)  # queues the fold
    [fold] = [
        j
        for j in world.engine.ledger.snapshot().pending(HOURLY)
        if j.trigger is Trigger.MAINTENANCE
    ]

    fired: list[str] = []

    def fail(at: str, archive: str | None) -> None:
        if at == point and archive == HOURLY and not fired:
            fired.append(at)
            raise faults.FaultInjected(f"{at}: storage unavailable")

    with faults.hooked(fail):
        reports = tick(world.defs, world.instance, NOW)
    failed = [r for r in reports.runs if not r.success]
    assert fired and failed and all("storage unavailable" in (r.error or "") for r in failed)
    # Whatever the fold got to, every value is as it was.
    assert compare_all(world.query, truth, world.catalog) == []

    # The next ticks finish it (a retry, or the recovery of a flip that landed).
    world.tick(NOW)
    left = world.engine.ledger.job(fold.job_id)
    assert left is not None and left.state in (JobState.COMPLETED, JobState.FAILED), left
    done = [
        j
        for j in world.engine.ledger.history(HOURLY)
        if j.trigger is Trigger.MAINTENANCE
        and j.state is JobState.COMPLETED
        and j.windows_processed
    ]
    assert done, world.engine.ledger.history(HOURLY)
    assert cell_pointers(world, HOUR) == 0
    assert compare_all(world.query, world.raw(), world.catalog) == []


def correct_another_day(world: World) -> datetime:
    """Every meter's readings of an hour of the first day doubled as well: the hourly fold then
    spans two storage partitions (UTC days). The hour's start."""
    hour = HOUR - timedelta(days=1)
    double_hour(world, hour)
    return hour


def double_hour(world: World, hour: datetime) -> None:
    """Every meter's energy readings of the hour from `hour` doubled (a Manual ingest), ticked."""
    stored = world.engine.raw.read_arrow(world.catalog.raw["energy_raw"])
    ts = stored["ts"]
    rows = stored.filter(
        pc.and_(
            pc.greater_equal(ts, pa.scalar(hour, ts.type)),
            pc.less(ts, pa.scalar(hour + timedelta(hours=1), ts.type)),
        )
    ).select(["entity_id", "ts", "energy_kwh"])
    world.ingest(
        rows.set_column(2, "energy_kwh", pc.multiply(rows["energy_kwh"], 2.0)),
        "energy_raw",
        "Manual",
    )
    world.tick(NOW)


def data_files(table: Path) -> set[Path]:
    return {p for p in table.rglob("*.parquet") if "_delta_log" not in p.parts}


def test_a_fold_on_the_driver_reads_and_writes_a_group_of_partitions_at_a_time(
    corrected: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each storage partition a group of its own (`FOLD_ROWS` 1): the fold reads and writes
    them one after another, into one generation under one flip; every value is unchanged."""
    world = corrected
    monkeypatch.setattr("rollup_assets.model.cells.FOLD_MIN_POINTERS", METERS)
    monkeypatch.setattr("rollup_assets.services.recompute_work.FOLD_ROWS", 1)
    other = correct_another_day(world)
    truth = world.raw()
    assert compare_all(world.query, truth, world.catalog) == []
    maintain(world.engine, now=NOW)
    [fold] = [
        j
        for j in world.engine.ledger.snapshot().pending(HOURLY)
        if j.trigger is Trigger.MAINTENANCE
    ]
    assert {w.start for w in fold.windows} >= {HOUR, other}
    world.tick(NOW)
    done = world.engine.ledger.job(fold.job_id)
    assert done is not None and done.state is JobState.COMPLETED, done
    assert "read on the driver in 2 group(s)" in (done.plan or ""), done.plan
    assert cell_pointers(world, HOUR) == cell_pointers(world, other) == 0
    assert compare_all(world.query, truth, world.catalog) == []


def test_a_fold_meeting_unknowable_cells_in_a_later_group_refreshes_them_first(
    corrected: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fold on the driver reads its second group only once the first is written: cells it
    cannot know met there still queue their refresh, and the fold runs again after it, as they
    would met in the first group."""
    world = corrected
    monkeypatch.setattr("rollup_assets.model.cells.FOLD_MIN_POINTERS", METERS)
    monkeypatch.setattr("rollup_assets.services.recompute_work.FOLD_ROWS", 1)
    correct_another_day(world)
    truth = world.raw()
    read_arrow = RollupReads.read_arrow
    reads: list[int] = []

    def second_unknowable(self, spec, spans=None, *args, unknown=Unknown.REFILL, **kwargs):
        rows = read_arrow(self, spec, spans, *args, unknown=unknown, **kwargs)
        if spec.name == HOURLY and unknown is Unknown.REFUSE:
            reads.append(len(reads))
            if len(reads) == 2:  # the fold's second group, as a cell's spares had run out
                start = spans[0].start
                raise CellsUnknowable(spec.name, [(rows["entity_id"][0].as_py(), start)])
        return rows

    monkeypatch.setattr(RollupReads, "read_arrow", second_unknowable)
    maintain(world.engine, now=NOW)
    [fold] = [
        j
        for j in world.engine.ledger.snapshot().pending(HOURLY)
        if j.trigger is Trigger.MAINTENANCE
    ]
    table = Path(world.engine.rollups.uri(world.catalog.rollup(HOURLY)))
    before = data_files(table)
    world.tick(NOW)
    # The first group's file, written before the second group was read, went with the attempt.
    live = {table / unquote(f["path"]) for f in file_actions(DeltaTable(str(table)))}
    assert data_files(table) - before <= live
    waited = [
        j
        for j in world.engine.ledger.history(HOURLY)
        if j.job_id == fold.job_id and "waits for a refresh" in (j.plan or "")
    ]
    assert len(reads) >= 2 and waited, world.engine.ledger.history(HOURLY)
    assert compare_all(world.query, truth, world.catalog) == []
    monkeypatch.setattr(RollupReads, "read_arrow", read_arrow)
    world.tick(NOW)
    assert cell_pointers(world, HOUR) == 0
    assert compare_all(world.query, world.raw(), world.catalog) == []
