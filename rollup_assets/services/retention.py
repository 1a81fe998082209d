"""Raw retention: drop the UTC days of each raw or time-range archive older than its horizon.

Run by maintenance (`rollups maintain`, the nightly schedule). For every activated archive whose
spec declares a `retention`, the days before `model.retention.retention_cut` go: older than
`now - retention`, already aggregated by every first-level rollup reading the archive, and
outside their pending or running work. The archive's state records the new `retained_from`
first (so a first-level recompute is refused from that moment on, and the record outlives the
table's log), then one retention commit drops the days' files. That commit is marked as
retention: detection, the forward lane and the change feed skip it, so the rollups keep their
values. One archive failing does not stop the others.
"""

import logging
from dataclasses import dataclass, replace
from datetime import date, datetime

from rollup_assets.faults import checkpoint
from rollup_assets.model.retention import retention_cut, retention_horizon
from rollup_assets.model.specs import SourceSpec
from rollup_assets.model.states import ArchiveState, ArchiveStatus
from rollup_assets.model.windows import as_utc, iso_utc
from rollup_assets.services.engine import Engine

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RetentionOutcome:
    archive: str
    retained_from: datetime | None  # the UTC midnight every earlier day is dropped before
    days: tuple[date, ...] = ()  # the UTC days dropped by this pass
    rows: int = 0
    version: int | None = None  # the retention commit (None: nothing dropped)
    held_by: str = ""  # what kept the cut before the horizon, if anything
    error: str = ""

    def describe(self) -> str:
        if self.error:
            return f"{self.archive}: retention failed: {self.error}"
        kept = iso_utc(self.retained_from) if self.retained_from else "-"
        held = f" (held back by {self.held_by})" if self.held_by else ""
        if not self.days:
            return f"{self.archive}: retention: no UTC day before {kept} left to drop{held}"
        return (
            f"{self.archive}: retention dropped {len(self.days)} UTC day(s) "
            f"{self.days[0].isoformat()}..{self.days[-1].isoformat()} ({self.rows} row(s)); "
            f"raw kept from {kept}{held}"
        )


def _holds(engine: Engine, spec: SourceSpec) -> list[tuple[datetime, str]]:
    """What a first-level rollup still needs raw rows for: up to its watermark it has
    aggregated (later buckets are the forward lane's), and its pending or running work."""
    statuses = engine.states.all()
    snapshot = engine.ledger.snapshot()
    holds = []
    for rollup in engine.catalog.first_levels(spec.name):
        state = statuses.get(rollup.name)
        if state is None or state.watermark is None:
            continue  # never activated: nothing of it to protect yet
        holds.append((state.watermark, f"the watermark of {rollup.name}"))
        for job in snapshot.for_rollup(rollup.name):
            if not job.state.terminal and job.windows:
                holds.append((min(w.start for w in job.windows), f"work queued for {rollup.name}"))
    return holds


def retain(engine: Engine, spec: SourceSpec, now: datetime) -> RetentionOutcome:
    """Apply `spec`'s retention at `now` (see the module)."""
    assert spec.retention is not None
    holds = _holds(engine, spec)
    cut = retention_cut(now, spec.retention, [t for t, _ in holds])
    horizon = retention_horizon(now, spec.retention)
    held_by = ""
    if cut < horizon:
        held_by = next(why for t, why in sorted(holds) if t < horizon)

    state = advance_retained_from(
        engine, spec.name, cut, f"retention {spec.retention}: raw kept from {iso_utc(cut)}"
    )
    if state.status is not ArchiveStatus.ACTIVATED or state.retained_from is None:
        return RetentionOutcome(spec.name, state.retained_from, held_by=held_by)
    checkpoint("retention_state", spec.name)
    # The state is the intent: a pass that dies here leaves `retained_from` ahead of the table,
    # and the next pass drops up to it. The drop records the instant in the table, so an ingest
    # racing it conflicts and sees it (`rollup_assets.resources.raw_tables`); with no day left to
    # drop, a commit of its own records it.
    dropped = engine.raw.drop_days_before(spec, state.retained_from)
    if dropped.version is None:
        engine.raw.fence_retention(spec, state.retained_from)
    return RetentionOutcome(
        spec.name, state.retained_from, dropped.days, dropped.rows, dropped.version, held_by
    )


def advance_retained_from(engine: Engine, archive: str, cut: datetime, reason: str) -> ArchiveState:
    """Record `cut` as `archive`'s `retained_from` (retention's intent, raw or rollup): only
    while it is activated, and only forward (a shorter horizon never brings rows back). The
    archive's state after, changed or not."""

    def advance(s: ArchiveState) -> ArchiveState | None:
        if s.status is not ArchiveStatus.ACTIVATED:
            return None  # disabled or deleted meanwhile: leave it alone
        if s.retained_from is not None and s.retained_from >= cut:
            return None  # monotonic
        return replace(s, retained_from=cut)

    return engine.states.update(archive, advance, reason=reason, actor="maintenance")


def apply_retention(engine: Engine, now: datetime) -> list[RetentionOutcome]:
    """Apply the retention of every activated archive that declares one, at `now` (UTC)."""
    now = as_utc(now)
    statuses = engine.states.all()
    outcomes = []
    specs: list[SourceSpec] = [*engine.catalog.raw.values(), *engine.catalog.time_range.values()]
    for spec in specs:
        state = statuses.get(spec.name)
        if spec.retention is None or state is None or state.status is not ArchiveStatus.ACTIVATED:
            continue
        try:
            outcome = retain(engine, spec, now)
        except Exception as exc:  # one archive failing must not keep the others' days
            log.exception("retention of %s failed", spec.name)
            outcome = RetentionOutcome(spec.name, state.retained_from, error=str(exc))
        log.info("%s", outcome.describe())
        outcomes.append(outcome)
    return outcomes
