"""A recompute job that failed: ended Failed and its work queued again as its next attempt,
after a backoff (`Engine.retry`), unless no retry can mend the failure; or completed, when its
flip landed before the failure."""

from datetime import datetime

from rollup_assets.model.errors import FenceMovedError, RecomputeAbortedError, RollupsError
from rollup_assets.model.jobs import JobState
from rollup_assets.model.operations import Operation
from rollup_assets.model.placement import buckets_in
from rollup_assets.model.propagation import completed_after_flip
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import Window
from rollup_assets.services.engine import Engine


def record_failure(
    engine: Engine, spec: RollupSpec, job_id: str, reason: str, *, permanent: bool = False
) -> None:
    """End job `job_id` Failed with `reason` and queue its work again as its next attempt
    (`Job.fail`; not for a `permanent` failure): only its buckets that still end by the
    watermark (a rewind gave the rest to the forward lane). A job whose flip landed before the
    failure is completed instead, queuing the levels above as its completion would have. A
    job someone else ended already (a disable queued its work again, a delete dropped it) is
    left as it is."""
    current = engine.ledger.job(job_id)
    if current is None or current.state.terminal:
        return
    if current.state is JobState.SWAPPING and job_id in engine.rollups.flipped_jobs(spec):
        why = f"completed after its flip, though its run then failed: {reason}"
        at = engine.rollups.committed_by(spec, job_id, Operation.FLIP) if current.corrects else None
        engine.ledger.record(
            completed_after_flip(
                engine.catalog, spec, current, engine.states.all(), why, flipped_at=at
            )
        )
        return
    mark = engine.states.get(spec.name).watermark
    kept = tuple(before_mark(spec, current.windows, mark))
    again = None if kept == current.windows else kept
    engine.ledger.record(
        current.fail(reason, policy=engine.retry, windows=again, permanent=permanent)
    )


def before_mark(
    spec: RollupSpec, windows: tuple[Window, ...], mark: datetime | None
) -> list[Window]:
    """The part of `windows` whose buckets end by `mark` (none without one). A window that
    spans `mark` (a range of many buckets: a new formula's, a manual request's) keeps its
    buckets before it; dropping it whole would lose them, with nothing queued."""
    if mark is None:
        return []
    kept = []
    for w in windows:
        if w.end <= mark:
            kept.append(w)
        elif w.start < mark:
            ends = [b.end for b in buckets_in(spec, [w]) if b.end <= mark]
            if ends:
                kept.append(Window(w.start, max(ends)))
    return kept


def permanent_failure(exc: BaseException) -> bool:
    """Can no retry mend this failure? The project's own refusals (work over raw rows retention
    removed, a changed spec, a rollup not activated) cannot, except a lost race (the fence moved,
    the job was stopped before its flip), which the next attempt wins."""
    return isinstance(exc, RollupsError) and not isinstance(
        exc, FenceMovedError | RecomputeAbortedError
    )


def failure_reason(exc: BaseException) -> str:
    """`exc` as a failed job records it: its type and message, at most 500 characters."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 500 else text[:497] + "..."
