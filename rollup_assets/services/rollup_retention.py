"""Rollup retention: drop the buckets of each rollup older than its horizon.

Run by maintenance (`rollups maintain`, the nightly schedule), after raw retention. For every
activated rollup whose spec declares a `retention`, the buckets before
`model.retention.bucket_cut` go: ending at or before `now - retention`, already aggregated by
every rollup reading this one (the levels directly above: their watermark is past them) and by
this one, and outside the pending or running work of all of them. A rollup with a recompute
under way is left for the next pass, so retention never makes a running flip fail.

The levels above keep their values: what they aggregated from the dropped buckets is the only
record. A recompute that would read the dropped buckets (a level above's, or this rollup's own
over them) is refused (`Engine.require_source_rows`); a correction skips them at this level and
still corrects the levels above (`services.recompute`).

Three effects, intent first, each of which can be made again:

1. the archive state: the new `retained_from` (a compare-and-set, monotonic). From then on a
   recompute of this rollup or of a level above that places its buckets is refused there;
2. the pointer table: the pointers of the dropped buckets go, in one commit that records the
   instant (`RETAINED_FROM_KEY`) and moves the rollup's fence: a recompute that read the fence
   before fails its flip instead of pointing readers at rows about to go;
3. the row table: every row of the dropped buckets (base and difference rows of every
   generation) goes in one commit.

Then the surface is published. A pass that dies after (1) leaves `retained_from` ahead of the
tables; the next pass finishes (2) and (3), even when the spec no longer declares a retention.
One rollup failing does not stop the others.
"""

import logging
from dataclasses import dataclass
from datetime import datetime

from rollup_assets.faults import checkpoint
from rollup_assets.model.bucketing import Bucketing, first_bucket_start
from rollup_assets.model.retention import bucket_cut
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.states import ArchiveStatus
from rollup_assets.model.windows import as_utc, iso_utc
from rollup_assets.services.engine import Engine
from rollup_assets.services.retention import advance_retained_from
from rollup_assets.services.surface import publish

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RollupRetentionOutcome:
    rollup: str
    retained_from: datetime | None  # the bucket boundary every earlier bucket is dropped before
    rows: int = 0  # rows deleted by this pass (base and difference rows)
    pointer_version: int | None = None  # the pointer commit of this pass (None: none)
    held_by: str = ""  # what kept the cut before the horizon, if anything
    error: str = ""

    def describe(self) -> str:
        if self.error:
            return f"{self.rollup}: retention failed: {self.error}"
        kept = iso_utc(self.retained_from) if self.retained_from else "-"
        held = f" (held back by {self.held_by})" if self.held_by else ""
        if not self.rows and self.pointer_version is None:
            return f"{self.rollup}: retention: no bucket before {kept} left to drop{held}"
        return (
            f"{self.rollup}: retention dropped {self.rows} row(s) of the buckets before {kept}"
            f"{held}"
        )


def _holds(engine: Engine, spec: RollupSpec) -> tuple[list[tuple[datetime, str]], str]:
    """What still needs `spec`'s buckets: the watermark of `spec` and of each rollup reading it
    (later buckets are the forward lane's), and the pending or running work of all of them;
    and, when `spec` has work running, what it is (retention then waits for the next pass)."""
    statuses = engine.states.all()
    snapshot = engine.ledger.snapshot()
    holds: list[tuple[datetime, str]] = []
    own = statuses.get(spec.name)
    if own is not None and own.watermark is not None:
        holds.append((own.watermark, f"the watermark of {spec.name}"))
    running = ""
    for rollup in [spec, *engine.catalog.dependents(spec.name)]:
        state = statuses.get(rollup.name)
        if rollup is not spec:
            if state is None or state.watermark is None:
                continue  # never activated: nothing of it to protect yet
            holds.append((state.watermark, f"the watermark of {rollup.name}"))
        for job in snapshot.for_rollup(rollup.name):
            if job.state.terminal or not job.windows:
                continue
            holds.append((min(w.start for w in job.windows), f"work queued for {rollup.name}"))
            if rollup is spec and job.state.active and not running:
                running = f"job {job.job_id} of {spec.name} ({job.state.value})"
    return holds, running


def retain_rollup(engine: Engine, spec: RollupSpec, now: datetime) -> RollupRetentionOutcome:
    """Apply `spec`'s retention at `now` (see the module), or finish what an earlier pass
    recorded."""
    state = engine.states.get(spec.name)
    held_by = ""
    if spec.retention is not None:
        holds, running = _holds(engine, spec)
        if running:
            return RollupRetentionOutcome(
                spec.name, state.retained_from, held_by=f"{running}; retention waits for it"
            )
        b = Bucketing.of(spec)
        cut = bucket_cut(now, spec.retention, b.floor, [t for t, _ in holds])
        horizon = b.floor(now - spec.retention)
        if cut < horizon:
            held_by = next(why for t, why in sorted(holds) if b.floor(t) < horizon)
        if cut > first_bucket_start(spec):
            reason = f"retention {spec.retention}: buckets kept from {iso_utc(cut)}"
            state = advance_retained_from(engine, spec.name, cut, reason)
    if state.status is not ArchiveStatus.ACTIVATED or state.retained_from is None:
        return RollupRetentionOutcome(spec.name, state.retained_from, held_by=held_by)
    kept_from = state.retained_from
    checkpoint("rollup_retention_state", spec.name)
    # The state is the intent: from here every step can run again, and the next pass does.
    version = engine.rollups.drop_pointers_before(spec, kept_from)
    checkpoint("rollup_retention_pointers", spec.name)
    rows = engine.rollups.delete_before(spec, kept_from)
    if version is not None or rows:
        publish(engine, spec)  # plain readers of the surface lose the dropped buckets too
    return RollupRetentionOutcome(spec.name, kept_from, rows, version, held_by)


def apply_rollup_retention(engine: Engine, now: datetime) -> list[RollupRetentionOutcome]:
    """Apply the retention of every activated rollup that declares one, and finish a pass that
    died, at `now` (UTC). Lower levels first: a level's cut waits for the levels above."""
    now = as_utc(now)
    statuses = engine.states.all()
    outcomes = []
    for spec in engine.catalog.rollups.values():
        state = statuses.get(spec.name)
        if state is None or state.status is not ArchiveStatus.ACTIVATED:
            continue
        if spec.retention is None and state.retained_from is None:
            continue
        try:
            outcome = retain_rollup(engine, spec, now)
        except Exception as exc:  # one rollup failing must not keep the others' buckets
            log.exception("retention of %s failed", spec.name)
            outcome = RollupRetentionOutcome(spec.name, state.retained_from, error=str(exc))
        log.info("%s", outcome.describe())
        outcomes.append(outcome)
    return outcomes
