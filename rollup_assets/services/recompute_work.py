"""What a recompute job computes and writes (`services.recompute` runs it).

A correction's difference rows, made from its source changes without reading the cells it
corrects (`services.correction`), while the change feed still holds them; a fold's (maintenance)
rewrite of its buckets whole from their visible rows (on the driver, a group of storage
partitions at a time, each read once the one before is written); otherwise its cells aggregated
again from their source and compared with the stored ones (`services.comparison`). The rows are
written and not committed: the lane commits and flips them. A job that meets a cell whose rows
a fold cannot know, in its source or (a fold) its own rollup, refreshes it first
(`refresh_first`).
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from pyspark.sql import SparkSession

from rollup_assets.model.bucketing import Bucketing
from rollup_assets.model.cells import Cells
from rollup_assets.model.jobs import Job, JobState, Trigger
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import Window, merge_windows
from rollup_assets.resources.commit_changes import ChangeFeedGone
from rollup_assets.resources.fill import Fill
from rollup_assets.resources.rollup_reads import CellsUnknowable, Unknown
from rollup_assets.resources.rollup_snapshots import Snapshot
from rollup_assets.resources.rollup_table import Written
from rollup_assets.services.comparison import CellOutcome, Recomputed, filled, recompute_cells
from rollup_assets.services.correction import (
    DIFFERENCE,
    Correction,
    SourceChange,
    correct,
    undone_below,
)
from rollup_assets.services.engine import Engine

# How a job computed its rows (recorded as its technique).
RECOMPUTE = "recompute"
FOLD = "fold"


# The rollup rows a fold on the driver holds at once: a rollup row, with its spare extremes,
# takes several times the memory of a source row (`Partials.driver_rows`).
FOLD_ROWS = 100_000


@dataclass(frozen=True)
class DriverFold:
    """A fold on the driver: its buckets' visible rows in `snapshot`, read and written one group
    of storage partitions at a time (`Partials.in_groups`: at most `FOLD_ROWS` rows each)."""

    snapshot: Snapshot
    groups: list[list[Window]]


@dataclass
class Work:
    """What a job computes: difference rows (a correction), partials aggregated from the
    source (a table on the driver, a Spark frame, or a first fill written as it aggregates), or
    a fold's rows (a Spark frame, or groups read on the driver as they are written: `fold`)."""

    technique: str
    reason: str
    versions: dict[str, int]
    correction: Correction | None = None
    recomputed: Recomputed | None = None
    fold: DriverFold | None = None  # a fold on the driver (read as it is written)
    change_rows: int = 0
    cells_applied: int = 0
    read_version: int | None = None
    nothing: str = "nothing changed: every recomputed cell equals the stored one"

    def release(self) -> None:
        if self.recomputed is not None:
            self.recomputed.release()


def compute_work(
    engine: Engine,
    spark: SparkSession,
    spec: RollupSpec,
    job: Job,
    cells: Cells,
    below: SourceChange | None,
    say: Callable[[str], None],
) -> Work:
    """The job's rows: a correction's differences when it is one and the change feed still
    holds its changes; a fold's rows (maintenance: the cells' visible state, rewritten whole);
    otherwise the cells aggregated again from their source."""
    gone = undone_below(engine, spec, job) if job.corrects else None
    if gone is not None:
        say(
            f"{spec.name}: job {gone} below, whose change this correction carries, was rolled "
            "back since: its cells are aggregated again from the level below"
        )
    if job.corrects and gone is None:
        try:
            fix = correct(engine, spec, job, cells, below)
            return Work(
                DIFFERENCE,
                fix.reason,
                engine.partials.source_versions(spec),
                correction=fix,
                change_rows=fix.change_rows,
                cells_applied=fix.rows.num_rows,
                nothing="nothing changed: every change was held already or changed no value",
            )
        except ChangeFeedGone as gone:
            say(f"{spec.name}: {gone}: its cells are aggregated again from the source")
    if job.trigger is Trigger.MAINTENANCE:
        # Read as a reader sees them: on the driver when their files hold few rows.
        reason = (
            f"{len(cells)} bucket(s) rewritten whole from their visible rows (their "
            "differences and cell pointers folded), "
        )
        snap = engine.rollups.snapshot(spec)
        held = engine.partials.rows_at_most(spec, cells, snap)
        if engine.partials.fits_driver(held):
            groups = engine.partials.in_groups(spec, snap, sorted(cells.windows), FOLD_ROWS)
            return Work(
                FOLD,
                f"{reason}read on the driver in {len(groups)} group(s) of storage partitions: "
                f"their files hold {held:,} rows",
                {},
                fold=DriverFold(snap, groups),
                nothing="nothing to fold",
            )
        spans = merge_windows(list(cells.windows))
        frame = engine.rollups.read_spark(
            spark, spec, spans, cells.entities, snapshot=snap, unknown=Unknown.REFUSE
        )
        return Work(
            FOLD,
            f"{reason}read on Spark",
            {},
            recomputed=Recomputed(frame, None, {}),
            nothing="nothing to fold",
        )
    result = recompute_cells(engine, spark, spec, cells)
    reason = result.reason or "aggregated again from the source"
    if gone is not None:
        reason = f"job {gone} below was rolled back since; {reason}"
    return Work(
        RECOMPUTE,
        reason,
        result.versions,
        recomputed=result,
        read_version=engine.partials.read_version(spec, result.versions),
        nothing=(
            "nothing to fill: the source holds no row in these buckets"
            if isinstance(result.rows, Fill)
            else "nothing changed: every recomputed cell equals the stored one"
        ),
    )


def write_work(
    engine: Engine,
    spark: SparkSession,
    spec: RollupSpec,
    work: Work,
    generation: int,
    job: Job,
    run_id: str,
    cells: Cells,
) -> tuple[Written, CellOutcome]:
    """Write the job's rows (nothing committed yet): what was written and which cells change."""
    stamp = {
        "generation": generation,
        "job_id": job.job_id,
        "run_id": run_id,
        "source_versions": work.versions,
    }
    if work.correction is not None:
        fix = work.correction
        found = CellOutcome(fix.changed, fix.rows.num_rows, 0, 0)  # a difference row per cell
        if not fix.changed:
            return Written([], 0), found
        return engine.rollups.write_rows(fix.rows, spec, **stamp), found  # type: ignore[arg-type]
    if work.fold is not None:
        fold = work.fold
        groups = (
            engine.rollups.read_arrow(
                spec, spans, cells.entities, snapshot=fold.snapshot, unknown=Unknown.REFUSE
            )
            for spans in fold.groups
        )
        written = engine.rollups.write_rows(groups, spec, **stamp)  # type: ignore[arg-type]
        return written, CellOutcome(Cells.of(cells.windows), written.rows, 0, 0)
    result = work.recomputed
    assert result is not None
    if isinstance(result.rows, Fill):
        # A first fill is aggregated as it is written; what it wrote is what changed.
        written = engine.rollups.write_fill(spark, result.rows, **stamp)  # type: ignore[arg-type]
        return written, filled(cells, written.counts)
    if result.found is None:  # a fold: every cell of its buckets is rewritten whole
        written = engine.rollups.write_rows(result.rows, spec, **stamp)  # type: ignore[arg-type]
        return written, CellOutcome(Cells.of(cells.windows), written.rows, 0, 0)
    found = result.found
    if not found.cells:
        return Written([], 0), found
    return engine.rollups.write_rows(result.rows, spec, **stamp), found  # type: ignore[arg-type]


def refresh_first(engine: Engine, running: Job, unknown: CellsUnknowable) -> list[Job]:
    """The events of a recompute (`running`) whose read met cells it cannot know (`unknown`):
    a Refresh of them (`refresh_job`), the job's work queued again behind it as its next
    attempt (a fold of its own rollup runs after it, `Job.run_order`; a job reading the level
    below waits while that level is refreshed: the drain), and the job ended having done
    nothing (`waited`). After its last attempt (the cells stay unknowable however often they
    are refreshed: their source rows are gone, say) it ends Failed for good instead."""
    if running.attempt >= engine.retry.attempts:
        failed = running.next(
            state=JobState.FAILED,
            error=f"gave up after {running.attempt} attempt(s): {unknown}, and refreshing "
            "them did not make them known",
            finished_at=datetime.now(UTC),
            gave_up=True,
        )
        return [failed]
    again = dataclasses.replace(running.again(), attempt=running.attempt + 1)
    return [refresh_job(engine, unknown), again, waited(running, unknown)]


def waited(job: Job, unknown: CellsUnknowable) -> Job:
    """`job` ended having done nothing, behind a refresh of the cells it could not know
    (Completed, no bucket processed, its plan saying why)."""
    return job.next(
        state=JobState.COMPLETED,
        windows_processed=0,
        rows_processed=0,
        finished_at=datetime.now(UTC),
        plan=f"waits for a refresh: {unknown}",
    )


def refresh_job(engine: Engine, unknown: CellsUnknowable) -> Job:
    """A job aggregating again the cells `unknown` names (`Trigger.REFRESH`): it records the
    version of the source it read, so a correction queued meanwhile is not applied twice, and
    it writes each cell a base row a fold can know."""
    spec = engine.catalog.rollup(unknown.rollup)
    bucketing = Bucketing.of(spec)
    cells = Cells.collect(
        ((bucketing.window_of(start), frozenset([e])) for e, start in unknown.keys), limit=None
    )
    return Job(
        spec.name,
        Trigger.REFRESH,
        tuple(sorted(cells.windows)),
        entities=cells.entities,
        cells=cells,
    )
