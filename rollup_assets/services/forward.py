"""The forward lane: close buckets past the watermark, and keep the open buckets live.

Which buckets may close, and which is open, is the model's rule (`model.forward`). A forward run
first *claims* the buckets it will close (so a source write racing the run is classified as
retroactive and recomputed later, never lost), replaces their generation-0 rows in one atomic
commit, records the job, and then advances the watermark. The open buckets (the one containing
`now`, and an ended one still inside the watermark lag) are re-aggregated without moving the
watermark. The buckets are aggregated on the driver when their source files are small
(`Partials.fits_driver`), as they are for a lane that keeps up; on Spark otherwise. Frozen
buckets are never written. A source cell whose rows a fold cannot know is refreshed first: the run
writes nothing and its buckets are planned again after the refresh. The rollup's surface
(`services.surface`) is published by the surface publish sensor, off the run's critical path.
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
from rollup_assets.model.errors import ArchiveNotActivatedError
from rollup_assets.model.forward import ForwardWork, closed_buckets, open_buckets, source_limit
from rollup_assets.model.jobs import Job, JobState, Trigger
from rollup_assets.model.operations import OPERATION_KEY
from rollup_assets.model.placement import buckets_in
from rollup_assets.model.progress import Progress
from rollup_assets.model.propagation import propagation_jobs
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.states import ArchiveState, ArchiveStatus
from rollup_assets.model.windows import Window
from rollup_assets.resources.memory import returning_memory
from rollup_assets.resources.rollup_reads import CellsUnknowable
from rollup_assets.services.engine import Engine
from rollup_assets.services.recompute_work import refresh_job, waited
from rollup_assets.services.run_outcome import RunOutcome

log = logging.getLogger(__name__)


@returning_memory
def run_forward(
    engine: Engine,
    spark: SparkSession,
    spec: RollupSpec,
    *,
    requested: list[Window],
    now: datetime,
    run_id: str,
    log_progress: Callable[[str], None] | None = None,
    progress: Progress | None = None,
) -> RunOutcome:
    """Close and refresh the `requested` buckets that may be (see the module); `progress`
    hears how many of them are done (none when it starts, all when written)."""
    say = log_progress or log.info
    t0 = time.monotonic()
    # The row table's identity before the state: a rollup deleted and created again after this
    # fails the commit below rather than taking rows aggregated for the deleted one.
    identity = engine.rollups.identity(spec)
    states = engine.states.all()
    state = states.get(spec.name) or ArchiveState(spec.name)
    started = datetime.now(UTC)
    if state.status is not ArchiveStatus.ACTIVATED:
        reason = f"Archive is not activated (status {state.status.value})"
        engine.ledger.record(
            [
                Job(
                    spec.name,
                    Trigger.FORWARD,
                    tuple(requested),
                    state=JobState.FAILED,
                    error=reason,
                    run_id=run_id,
                    started_at=started,
                    finished_at=datetime.now(UTC),
                )
            ]
        )
        raise ArchiveNotActivatedError(f"'{spec.name}': {reason}")
    engine.require_same_schema(spec, state)

    wanted = {w.start for w in buckets_in(spec, requested)}
    closed = []
    for w in closed_buckets(spec, state, now, source_limit(engine.catalog, spec, states)):
        if w.start not in wanted:
            break
        closed.append(w)
    refresh = [
        ob for ob in open_buckets(spec, state, now) if ob.start in wanted and ob not in closed
    ]
    work = ForwardWork(closed, refresh)
    buckets = work.buckets
    job = Job(
        spec.name, work.trigger, tuple(buckets), run_id=run_id, started_at=started, generation=0
    )
    if not buckets:
        note = "nothing to do: no bucket has closed and no open bucket was requested"
        done = job.next(
            state=JobState.COMPLETED,
            windows_processed=0,
            rows_processed=0,
            finished_at=datetime.now(UTC),
            duration_ms=0,
        )
        engine.ledger.record([done])
        say(f"{spec.name}: {note}")
        return RunOutcome(done, [], note=note)

    old_watermark = state.watermark
    claim = closed[-1].end if closed else None
    what = f"closing {len(closed)} bucket(s)" if closed else ""
    if refresh:
        what += (" and " if what else "") + (
            "refreshing the open bucket"
            if len(refresh) == 1
            else f"refreshing {len(refresh)} open buckets"
        )
    try:
        if claim is not None:
            engine.states.update(
                spec.name,
                lambda s: (
                    replace(s, claimed_until=claim)
                    if s.consumed_until is None or s.consumed_until < claim
                    else None
                ),
                reason=f"forward claims buckets up to {claim.isoformat()}",
                actor=run_id,
            )
            checkpoint("after_claim", spec.name)
        say(f"{spec.name}: forward {what}")
        if progress is not None:
            progress(spec.name, 0, len(buckets))
        cells = Cells.of(buckets)
        bound = engine.partials.source_rows_at_most(spec, cells)
        on_driver = engine.partials.fits_driver(bound)
        plan = (
            f"aggregated on the driver: its source files hold {bound:,} rows"
            if on_driver
            else "aggregated on Spark: its source files hold "
            + ("an unknown number of rows" if bound is None else f"{bound:,} rows")
            + (
                f" (the driver takes at most {engine.partials.driver_rows:,})"
                if engine.partials.driver_rows
                else " (ROLLUPS_DRIVER_SOURCE_ROWS is 0: such work always runs on Spark)"
            )
        )
        say(f"{spec.name}: forward {plan}")
        try:
            frame, versions = (
                engine.partials.on_driver(spec, cells)
                if on_driver
                else engine.partials.on_spark(spark, spec, cells)
            )
        except CellsUnknowable as unknown:
            return _wait_for_refresh(engine, spec, job, unknown, claim, run_id, say)
        written = engine.rollups.write_rows(
            frame, spec, generation=0, job_id=job.job_id, run_id=run_id, source_versions=versions
        )
        version = engine.rollups.replace_forward(
            spec,
            written,
            buckets,
            identity=identity,
            metadata={
                OPERATION_KEY: work.trigger.value,
                "rollups.job_id": job.job_id,
                "dagster.run_id": run_id,
            },
        )
    except BaseException as exc:
        metrics.failed("forward", exc)
        # Dagster stops a run with a BaseException: record the failure and let go of the claim
        # whatever ended the run (the forward sensor plans the buckets again from the watermark).
        engine.ledger.record(
            [
                job.next(
                    state=JobState.FAILED,
                    error=f"{type(exc).__name__}: {exc}"[:500],
                    finished_at=datetime.now(UTC),
                )
            ]
        )
        if claim is not None:
            _release_claim(engine, spec, claim, run_id)
        raise
    duration = int((time.monotonic() - t0) * 1000)
    src = next(iter(versions.items()))
    done = job.next(
        state=JobState.COMPLETED,
        windows_processed=len(buckets),
        rows_processed=written.rows,
        finished_at=datetime.now(UTC),
        duration_ms=duration,
        plan=plan,
        source_archive=src[0],
        source_version=src[1],
        read_version=engine.partials.read_version(spec, versions),
    )
    propagated = propagation_jobs(engine.catalog, spec, Cells.of(buckets), version, states)
    engine.ledger.record([done, *propagated])
    if closed:
        metrics.buckets_closed(spec.name, len(closed))
        new_mark = closed[-1].end
        engine.states.update(
            spec.name,
            lambda s: replace(s, watermark=new_mark) if s.watermark == old_watermark else None,
            reason=f"forward closed {len(closed)} bucket(s) up to {new_mark.isoformat()}",
            actor=run_id,
        )
    checkpoint("after_forward", spec.name)
    if progress is not None:
        progress(spec.name, len(buckets), len(buckets))
    return RunOutcome(
        done, buckets, written.rows, 0, version, versions, duration, propagated=propagated
    )


def _wait_for_refresh(
    engine: Engine,
    spec: RollupSpec,
    job: Job,
    unknown: CellsUnknowable,
    claim: datetime | None,
    run_id: str,
    say: Callable[[str], None],
) -> RunOutcome:
    """A forward run whose source holds cells a fold cannot know ends having written nothing,
    behind a refresh of them (`services.recompute_work.refresh_job`): the forward sensor plans
    its buckets again once the refresh is done."""
    done = waited(job, unknown)
    engine.ledger.record([refresh_job(engine, unknown), done])
    if claim is not None:
        _release_claim(engine, spec, claim, run_id)
    note = done.plan or ""
    say(f"{spec.name}: forward {note}")
    return RunOutcome(done, [], note=note)


def _release_claim(engine: Engine, spec: RollupSpec, claim: datetime, run_id: str) -> None:
    """Take back a failed forward run's claim, unless something moved it since (a newer claim,
    a rewind): writes up to it stop counting as retroactive, as before the run."""
    engine.states.update(
        spec.name,
        lambda s: replace(s, claimed_until=None) if s.claimed_until == claim else None,
        reason=f"forward run {run_id} failed; its claim up to {claim.isoformat()} released",
        actor=run_id,
    )
