"""The recompute lane: the optimistic atomic swap.

1. Running:  claim a new generation N and compute the job's rows (`services.recompute_work`):
             a correction's difference rows, made from its source changes without reading the
             cells it corrects (`services.correction`); a fold's (maintenance) rewrite of its
             buckets from their visible rows; otherwise its cells aggregated again from their
             source and compared with the stored ones: unchanged cells are left as they are (not
             written, not flipped, not propagated; a job where nothing changed completes here).
             The rows are written and committed (still invisible).
2. Swapping: re-check that the rollup is still activated and the job still ours, then flip the
             pointers to N in one commit - the moment readers switch (a difference flip for a
             correction's cells, a base flip otherwise). The flip is fenced: it commits only if
             the rollup's fence (read before anything else) has not moved, so a rewind,
             rollback, retention or disable that came in between makes it fail instead of
             pointing readers at rows that action removed or computed from what it changed.
3. Completed, together with the jobs the changed cells cause one level up (one ledger commit):
   a correction queues the same source changes for the cells above, a recompute their
   aggregation again from the level below, a fold nothing (`model.propagation.carries_up`).
   Then the generations the flip superseded are swept.

A run does not publish the rollup's surface (`services.surface`): the surface publish sensor
does, off the correction's critical path, within `ROLLUPS_SURFACE_MAX_LAG_SECONDS` of the flip.

A recompute never touches buckets at or past the watermark (the forward lane owns those, the
open bucket included), and buckets whose end lies in the frozen range stay pending.

A job that fails (any exception, or Dagster stopping the run) is recorded Failed and its work is
queued again as its next attempt, after a backoff (`Engine.retry`; `services.job_failure`); after
the last attempt it ends Failed for good, which health and `rollups status` show. A job a rewind
stopped is queued again for its part before the rewind point (the forward lane aggregates the
rest again).
"""

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

from pyspark.sql import SparkSession

from rollup_assets import metrics
from rollup_assets.faults import checkpoint
from rollup_assets.model.cells import Cells
from rollup_assets.model.errors import (
    ArchiveNotActivatedError,
    RecomputeAbortedError,
    RollupsError,
)
from rollup_assets.model.jobs import Job, JobState, Trigger
from rollup_assets.model.operations import OPERATION_KEY, Operation
from rollup_assets.model.placement import buckets_in, cells_of, place
from rollup_assets.model.progress import Progress
from rollup_assets.model.propagation import carries_up, propagation_jobs
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.states import ArchiveStatus
from rollup_assets.model.windows import Window
from rollup_assets.resources.genmap import read_pointers
from rollup_assets.resources.memory import returning_memory
from rollup_assets.resources.rollup_reads import CellsUnknowable
from rollup_assets.services.correction import SourceChange, shown_again
from rollup_assets.services.engine import Engine
from rollup_assets.services.job_failure import failure_reason, permanent_failure, record_failure
from rollup_assets.services.recompute_work import compute_work, refresh_first, write_work
from rollup_assets.services.run_outcome import RunOutcome

log = logging.getLogger(__name__)


def describe_cells(cells: Cells) -> str:
    """'3 bucket(s) for every entity' / '2 bucket(s), 5 cell(s)' and the like."""
    whole = sum(1 for _, scope in cells if scope is None)
    named = sum(len(scope) for _, scope in cells if scope is not None)
    parts = []
    if whole:
        parts.append(f"{whole} bucket(s) for every entity")
    if named:
        buckets = len(cells) - whole
        parts.append(f"{named} cell(s) in {buckets} bucket(s)")
    return " and ".join(parts) or "no cell"


def start_job(
    engine: Engine,
    spec: RollupSpec,
    *,
    job_id: str | None,
    requested: list[Window],
    entities: frozenset[str] | None,
    trigger: Trigger,
) -> Job | None:
    """The job this run executes: the sensor's pending job (None when it already ended, e.g.
    coalesced into another), or a new one for a manual launch, refused at once over a range
    retention removed (`RawRowsRetainedError`), held back or not, as a requested one is."""
    if job_id:
        job = engine.ledger.job(job_id)
        if job is None:
            raise RollupsError(f"job {job_id} of '{spec.name}' is not in the ledger")
        return None if job.state.terminal else job
    windows = tuple(buckets_in(spec, requested))
    engine.require_source_rows(spec, list(windows))
    return Job(rollup=spec.name, trigger=trigger, windows=windows, entities=entities)


@returning_memory
def run_recompute(
    engine: Engine,
    spark: SparkSession,
    spec: RollupSpec,
    job: Job,
    *,
    run_id: str,
    log_progress: Callable[[str], None] | None = None,
    progress: Progress | None = None,
    below: SourceChange | None = None,
) -> RunOutcome:
    """Execute `job` (see the module); `log_progress` hears what happens, `progress` how many
    of the job's ready buckets are done (none when it starts, all when it has completed).
    `below` is the source rows the run that queued `job` applied to the level below (so a
    correction up the chain does not read them again)."""
    say = log_progress or log.info
    t0 = time.monotonic()
    # The fence first: whatever moves it after this (a rewind, rollback, retention, disable)
    # makes this job's flip fail, whatever this job reads from now on.
    fence = engine.rollups.fence(spec)
    # And the row table's identity: rows written for a rollup deleted (and created again) since
    # are never committed to the new table (`RollupTable.identity`).
    identity = engine.rollups.identity(spec)
    state = engine.states.get(spec.name)
    if state.status is not ArchiveStatus.ACTIVATED:
        reason = (
            f"Archive is not activated (status {state.status.value}) - "
            "activate it before recomputing"
        )
        failed = job.next(
            state=JobState.FAILED, error=reason, finished_at=datetime.now(UTC), run_id=run_id
        )
        # Queued work (a pending job the sensor launched) waits for the rollup to be enabled;
        # a run asked for by hand is refused; a deleted rollup's work is gone.
        queued = engine.ledger.job(job.job_id) is not None
        kept = [job.again()] if queued and state.status is not ArchiveStatus.DELETED else []
        engine.ledger.record([failed, *kept])
        raise ArchiveNotActivatedError(f"'{spec.name}': {reason}")
    engine.require_same_schema(spec, state)

    placement = place(buckets_in(spec, list(job.windows)), state)
    ready = placement.ready
    if job.trigger is Trigger.MAINTENANCE:
        # A fold leaves alone what was flipped since it was queued and may still be rolled back.
        foldable = engine.buckets_to_fold(spec, now=datetime.now(UTC))
        ready = [w for w in ready if w in foldable]
    waiting = placement.waiting(job.trigger)
    events: list[Job] = []
    if waiting:
        events.append(job.again(tuple(sorted(waiting))))
    carried: list[Job] = []
    dropped = _dropped(state.retained_from, ready) if job.corrects else []
    if dropped:
        # Retention dropped these buckets here: a difference would bring back a partial bucket.
        # The levels above still hold them, and take the change as their own correction.
        ready = [w for w in ready if w not in set(dropped)]
        carried = _carry_up(engine, spec, job, dropped)
        events += carried
        say(
            f"{spec.name}: {len(dropped)} bucket(s) before {state.retained_from} were dropped by "
            f"retention; their change goes to the levels above ({len(carried)} job(s))"
        )
    if not ready:
        note = (
            "nothing to recompute: every bucket is at/after the watermark "
            "(open or not yet aggregated)"
        )
        if waiting:
            note = f"{len(waiting)} bucket(s) are frozen or past the watermark and stay pending"
        if dropped:
            note = f"{len(dropped)} bucket(s) dropped by retention; the levels above corrected"
        done = job.next(
            state=JobState.COMPLETED,
            windows_processed=0,
            rows_processed=0,
            run_id=run_id,
            started_at=datetime.now(UTC),
            finished_at=datetime.now(UTC),
            duration_ms=0,
            error=None,
        )
        engine.ledger.record([*events, done])
        say(f"{spec.name}: {note}")
        return RunOutcome(done, [], note=note, propagated=carried)

    if progress is not None:
        progress(spec.name, 0, len(ready))
    cells = cells_of(spec, job).restrict(ready)
    generation = engine.next_generation(spec)
    running = job.narrowed(tuple(ready)).next(
        state=JobState.RUNNING,
        run_id=run_id,
        started_at=datetime.now(UTC),
        generation=generation,
    )
    engine.ledger.record([*events, running])
    try:
        checkpoint("before_correct", spec.name)
        reclaimed = engine.rollups.reclaim(spec, flipped=engine.flipped_generations(spec))
        if reclaimed:
            say(
                f"{spec.name}: reclaimed {reclaimed} row(s) left by an earlier run "
                "that died before its flip"
            )
        say(f"{spec.name}: correcting {describe_cells(cells)} at generation {generation}")
        try:  # a fold on the driver reads as it writes: either may meet such cells
            work = compute_work(engine, spark, spec, running, cells, below, say)
            say(f"{spec.name}: {work.technique}: {work.reason}")
            try:
                written, found = write_work(
                    engine, spark, spec, work, generation, running, run_id, cells
                )
            finally:
                work.release()
        except CellsUnknowable as unknown:
            events = refresh_first(engine, running, unknown)
            engine.ledger.record(events)
            done = events[-1]
            note = done.plan or done.error or ""
            say(f"{spec.name}: {note}")
            return RunOutcome(done, [], note=note)
        changed = found.cells
        say(
            f"{spec.name}: {found.cells_changed} cell(s) changed, {found.cells_skipped} "
            f"unchanged (left as they are), from {found.source_rows} source row(s) and "
            f"{work.change_rows} change row(s)"
        )
        counted = {
            "technique": work.technique,
            "plan": work.reason,
            "source_rows": found.source_rows,
            "change_rows": work.change_rows,
            "cells_applied": work.cells_applied,
            "cells_changed": found.cells_changed,
            "cells_skipped": found.cells_skipped,
            "read_version": work.read_version,
        }
        if not changed:
            duration = int((time.monotonic() - t0) * 1000)
            done = running.next(
                state=JobState.COMPLETED,
                windows_processed=0,
                rows_processed=0,
                finished_at=datetime.now(UTC),
                duration_ms=duration,
                **counted,
            )
            engine.ledger.record([done])
            if progress is not None:
                progress(spec.name, len(ready), len(ready))
            say(f"{spec.name}: {work.nothing}")
            return RunOutcome(
                done, [], 0, generation, None, work.versions, duration, note=work.nothing
            )
        checkpoint("after_write", spec.name)
        version = engine.rollups.commit_generation(
            spec,
            written,
            {
                OPERATION_KEY: Operation.RECOMPUTE,
                "rollups.job_id": job.job_id,
                "rollups.generation": str(generation),
                "dagster.run_id": run_id,
            },
            identity,
        )
        checkpoint("after_commit", spec.name)
        swapping = running.next(state=JobState.SWAPPING, rows_processed=written.rows, **counted)
        engine.ledger.record([swapping])
        _check_still_ours(engine, spec, running)
        checkpoint("before_flip", spec.name)
        flipped = engine.rollups.flip(
            spec,
            changed,
            generation,
            job_id=job.job_id,
            run_id=run_id,
            fence=fence,
            delta=work.correction is not None,
        )
        checkpoint("after_flip", spec.name)
        duration = int((time.monotonic() - t0) * 1000)
        done = swapping.next(
            state=JobState.COMPLETED,
            windows_processed=len(changed),
            finished_at=datetime.now(UTC),
            duration_ms=duration,
        )
        change = None if work.correction is None else work.correction.applied.shown_at(flipped)
        if change is not None:
            again = shown_again(engine, spec, changed, generation)
            if again:
                # The levels above hold what a rollback propagated: aggregate them again.
                say(
                    f"{spec.name}: {describe_cells(again)} show again differences a rollback "
                    "hid; the levels above are aggregated again there"
                )
                change = None
        states = engine.states.all()
        propagated: list[Job] = []
        if carries_up(job):
            propagated = propagation_jobs(
                engine.catalog,
                spec,
                changed,
                flipped if change is not None else version,
                states,
                parts=None if change is None else change.parts,
            )
        current = engine.ledger.job(job.job_id)
        if current is not None and current.state is JobState.COMPLETED:
            # An operator action found the flip landed and completed the job, queuing the levels
            # above itself (`Operations._requeue_running`): nothing more to record or carry up.
            done, propagated, change = current, [], None
        else:
            engine.ledger.record([done, *propagated])
        checkpoint("during_sweep", spec.name)
        swept = engine.rollups.sweep(
            spec,
            list(changed.windows),
            changed.entities,
            flipped=written,
            generation=generation,
        )
        say(
            f"{spec.name}: generation {generation} visible on {describe_cells(changed)}; "
            f"swept {swept} superseded row(s)"
        )
        if progress is not None:
            progress(spec.name, len(ready), len(ready))
        return RunOutcome(
            done,
            list(changed.windows),
            written.rows,
            generation,
            version,
            work.versions,
            duration,
            propagated=[*carried, *propagated],
            change=change,
        )
    except BaseException as exc:
        metrics.failed("recompute", exc)
        # Dagster stops a run with a BaseException: the job must not stay Running behind it.
        record_failure(
            engine, spec, job.job_id, failure_reason(exc), permanent=permanent_failure(exc)
        )
        raise


def _dropped(retained_from: datetime | None, buckets: list[Window]) -> list[Window]:
    """The buckets retention dropped: those starting before the rollup's `retained_from`."""
    if retained_from is None:
        return []
    return [w for w in buckets if w.start < retained_from]


def _carry_up(engine: Engine, spec: RollupSpec, job: Job, dropped: list[Window]) -> list[Job]:
    """Corrections of the levels above for the part of correction `job` in buckets `spec` no
    longer holds (retention dropped them): the same source changes, shown from the pointer
    table's current version. That version is past retention's pointer commit, and so past
    every version from which a level above aggregated those cells: no aggregation above can
    hold the change already (a recompute above over them is refused since)."""
    parts = job.parts_within(dropped) or ()
    if not parts:
        return []
    _, seen = read_pointers(engine.rollups.genmap_uri(spec), engine.warehouse.storage_options)
    return propagation_jobs(
        engine.catalog,
        spec,
        cells_of(spec, job).restrict(dropped),
        seen,
        engine.states.all(),
        parts=tuple(replace(p, seen_at=seen) for p in parts),
    )


def _check_still_ours(engine: Engine, spec: RollupSpec, job: Job) -> None:
    """Before the flip: a disable/delete may have failed this job meanwhile; then stop."""
    state = engine.states.get(spec.name)
    current = engine.ledger.job(job.job_id)
    if state.status is not ArchiveStatus.ACTIVATED:
        raise RecomputeAbortedError(
            f"'{spec.name}' became {state.status.value} during the recompute; nothing was flipped"
        )
    if state.watermark is None or any(w.end > state.watermark for w in job.windows):
        raise RecomputeAbortedError(
            f"'{spec.name}' was rewound during the recompute; "
            "the forward lane now owns these buckets"
        )
    if current is not None and current.state.terminal:
        raise RecomputeAbortedError(
            f"job {job.job_id} was ended ({current.state.value}: {current.error}); "
            "nothing was flipped"
        )
