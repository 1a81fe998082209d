"""The forward lane: close buckets past the watermark, and keep the open bucket live.

Buckets close in order once `bucket_end <= now - watermark_lag` (and, for a rollup of a rollup,
once the source level has closed them too). A forward run first *claims* the buckets it will
close (so a source write racing the run is classified as retroactive and recomputed later, never
lost), replaces their generation-0 rows in one atomic commit, records the job, and then advances
the watermark. The open bucket (the one containing `now`) is re-aggregated without moving the
watermark. Frozen buckets are never written.
"""

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

from pyspark.sql import SparkSession

from resources.control import ArchiveState, ArchiveStatus
from resources.ledger import Job, JobState, Trigger
from rollup_assets.engine import Engine, RunOutcome
from rollup_assets.errors import ArchiveNotActivatedError
from rollup_assets.partitions import Bucketing, Window, as_utc, first_bucket_start
from rollup_assets.specs import RollupSpec

log = logging.getLogger(__name__)
MAX_BUCKETS_PER_RUN = 20_000


def source_limit(
    engine: Engine, spec: RollupSpec, states: dict[str, ArchiveState]
) -> datetime | None:
    """How far the source lets this rollup close buckets: a rollup source's watermark."""
    if spec.source in engine.catalog.rollups:
        src = states.get(spec.source)
        return (
            src.watermark
            if src is not None and src.watermark is not None
            else datetime.min.replace(tzinfo=UTC)
        )
    return None


def closed_buckets(
    spec: RollupSpec, state: ArchiveState, now: datetime, limit: datetime | None
) -> list[Window]:
    """Buckets after the watermark that may close now, in order (stopping at a frozen one)."""
    if state.watermark is None:
        return []
    horizon = as_utc(now) - spec.watermark_lag
    if limit is not None:
        horizon = min(horizon, limit)
    b = Bucketing.of(spec)
    out: list[Window] = []
    start = state.watermark
    while len(out) < MAX_BUCKETS_PER_RUN:
        end = b.next_start(start)
        if end > horizon or state.is_frozen(end):
            break
        out.append(Window(start, end))
        start = end
    return out


def open_bucket(spec: RollupSpec, state: ArchiveState, now: datetime) -> Window | None:
    if not spec.refresh_open_bucket:
        return None
    w = Bucketing.of(spec).window_of(now)
    if w.start < first_bucket_start(spec) or state.is_frozen(w.end):
        return None
    if state.watermark is not None and w.start < state.watermark:
        return None
    return w


def run_forward(
    engine: Engine,
    spark: SparkSession,
    spec: RollupSpec,
    *,
    requested: list[Window],
    now: datetime,
    run_id: str,
    log_progress: Callable[[str], None] | None = None,
) -> RunOutcome:
    say = log_progress or log.info
    t0 = time.monotonic()
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

    wanted = {w.start for w in engine.buckets_in(spec, requested)}
    closed = []
    for w in closed_buckets(spec, state, now, source_limit(engine, spec, states)):
        if w.start not in wanted:
            break
        closed.append(w)
    ob = open_bucket(spec, state, now)
    refresh = ob if ob is not None and ob.start in wanted and ob not in closed else None
    trigger = Trigger.FORWARD if closed else Trigger.OPEN_BUCKET
    buckets = [*closed, *([refresh] if refresh else [])]
    job = Job(spec.name, trigger, tuple(buckets), run_id=run_id, started_at=started, generation=0)
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
    if closed:
        claim = closed[-1].end
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
    what = f"closing {len(closed)} bucket(s)" if closed else ""
    if refresh:
        what += (" and " if what else "") + "refreshing the open bucket"
    say(f"{spec.name}: forward {what}")
    try:
        frame, versions = engine.partials(spark, spec, buckets, None)
        written = engine.rollups.write_rows(
            frame, spec, generation=0, job_id=job.job_id, run_id=run_id, source_versions=versions
        )
        version = engine.rollups.replace_forward(
            spec,
            written,
            buckets,
            {
                "rollups.operation": trigger.value,
                "rollups.job_id": job.job_id,
                "dagster.run_id": run_id,
            },
        )
    except Exception as exc:
        engine.ledger.record(
            [
                job.next(
                    state=JobState.FAILED,
                    error=f"{type(exc).__name__}: {exc}"[:500],
                    finished_at=datetime.now(UTC),
                )
            ]
        )
        raise
    duration = int((time.monotonic() - t0) * 1000)
    src = next(iter(versions.items()))
    done = job.next(
        state=JobState.COMPLETED,
        windows_processed=len(buckets),
        rows_processed=written.rows,
        finished_at=datetime.now(UTC),
        duration_ms=duration,
        source_archive=src[0],
        source_version=src[1],
    )
    propagated = engine.propagation_jobs(spec, buckets, None, version, states)
    engine.ledger.record([done, *propagated])
    if closed:
        new_mark = closed[-1].end
        engine.states.update(
            spec.name,
            lambda s: replace(s, watermark=new_mark) if s.watermark == old_watermark else None,
            reason=f"forward closed {len(closed)} bucket(s) up to {new_mark.isoformat()}",
            actor=run_id,
        )
    return RunOutcome(
        done, buckets, written.rows, 0, version, versions, duration, propagated=propagated
    )
