"""Operator actions and lifecycle: the Python API behind the CLI and the Dagster operator jobs.

Lifecycle: Created -> Activated -> Disabled / Failed (-> Activated again), and Deleted. Inserts,
queries and recomputes need Activated; an activated archive's schema-relevant spec is frozen.
Every action is recorded in the archive-state history (who, when, why).
"""

import logging
from dataclasses import replace
from datetime import UTC, datetime

from rollup_assets.model.errors import (
    ArchiveActivationFailedError,
    ArchiveNotActivatedError,
    InvalidArchiveStateTransitionError,
    InvalidTimeRangeError,
    RollupSourceInUseError,
    RollupSourceMissingError,
)
from rollup_assets.model.forward import initial_watermark
from rollup_assets.model.jobs import Job, JobState, Trigger
from rollup_assets.model.operations import Operation
from rollup_assets.model.placement import buckets_in, held_cells
from rollup_assets.model.propagation import completed_after_flip
from rollup_assets.model.specs import ArchiveSpec, RollupSpec, schema_fingerprint
from rollup_assets.model.states import ArchiveState, ArchiveStatus
from rollup_assets.model.windows import Window, as_utc
from rollup_assets.services.engine import Engine
from rollup_assets.services.recovery import finish_interrupted
from rollup_assets.services.rewind import rewind
from rollup_assets.services.rollback import RollbackOutcome, rollback

log = logging.getLogger(__name__)


class Operations:
    def __init__(self, engine: Engine, actor: str = "cli") -> None:
        self.engine = engine
        self.catalog = engine.catalog
        self.actor = actor

    # -- lifecycle ---------------------------------------------------------------------------

    def activate(self, name: str, now: datetime | None = None) -> ArchiveState:
        spec = self.catalog.archive(name)
        now = as_utc(now or datetime.now(UTC))
        current = self.engine.states.get(name)
        if current.status is ArchiveStatus.ACTIVATED:
            self.engine.require_same_schema(spec, current)
            return current
        if isinstance(spec, RollupSpec):
            src = self.engine.states.get(spec.source)
            if src.status is not ArchiveStatus.ACTIVATED:
                raise RollupSourceMissingError(
                    f"cannot activate '{name}': its source '{spec.source}' is {src.status.value}; "
                    f"activate the source first"
                )
            self._require_applied_columns(spec)
        if current.status is ArchiveStatus.DISABLED:
            self.engine.require_same_schema(spec, current)
        try:
            if not isinstance(spec, RollupSpec):
                self.engine.raw.ensure_table(spec)
        except Exception as exc:
            self.engine.states.update(
                name,
                lambda s: replace(s, status=ArchiveStatus.FAILED),
                reason=f"activation failed: {exc}",
                actor=self.actor,
            )
            raise ArchiveActivationFailedError(f"activating '{name}' failed: {exc}") from exc

        def change(s: ArchiveState) -> ArchiveState:
            fresh = s.status in (ArchiveStatus.CREATED, ArchiveStatus.DELETED)
            watermark = s.watermark
            if isinstance(spec, RollupSpec) and (fresh or watermark is None):
                watermark = initial_watermark(spec, now)
            return replace(
                s,
                status=ArchiveStatus.ACTIVATED,
                fingerprint=schema_fingerprint(spec),
                watermark=watermark,
                claimed_until=None if fresh else s.claimed_until,
                frozen_until=None if fresh else s.frozen_until,
                activated_at=now,
            )

        verb = "enable" if current.status is ArchiveStatus.DISABLED else "activate"
        return self.engine.states.update(name, change, reason=verb, actor=self.actor)

    def enable(self, name: str, now: datetime | None = None) -> ArchiveState:
        self.catalog.archive(name)  # an unknown name is reported as such, not as "Created"
        current = self.engine.states.get(name)
        if current.status not in (
            ArchiveStatus.DISABLED,
            ArchiveStatus.FAILED,
            ArchiveStatus.ACTIVATED,
        ):
            raise InvalidArchiveStateTransitionError(
                f"cannot enable '{name}' from status {current.status.value}; use activate"
            )
        return self.activate(name, now)

    def disable(self, name: str) -> ArchiveState:
        self.catalog.archive(name)
        current = self.engine.states.get(name)
        if current.status is not ArchiveStatus.ACTIVATED:
            raise InvalidArchiveStateTransitionError(
                f"cannot disable '{name}': it is {current.status.value}, not Activated"
            )
        state = self.engine.states.update(
            name,
            lambda s: replace(s, status=ArchiveStatus.DISABLED),
            reason="disable",
            actor=self.actor,
        )
        spec = self.catalog.archive(name)
        if isinstance(spec, RollupSpec):
            # A recompute in flight must not flip now that its work is queued again.
            self.engine.rollups.move_fence(spec, "disable")
        self._requeue_running(name, "archive was disabled")
        return state

    def delete(self, name: str) -> ArchiveState:
        spec = self.catalog.archive(name)
        readers = [
            d.name
            for d in self.catalog.dependents(name)
            if self.engine.states.get(d.name).status is ArchiveStatus.ACTIVATED
        ]
        if readers:
            raise RollupSourceInUseError(
                f"cannot delete '{name}': activated rollups read from it ({', '.join(readers)}); "
                "disable or delete them first"
            )
        state = self.engine.states.update(
            name,
            lambda s: ArchiveState(name, seq=s.seq, status=ArchiveStatus.DELETED),
            reason="delete (data dropped)",
            actor=self.actor,
        )
        self._purge(name, "archive was deleted")
        if not isinstance(spec, RollupSpec):
            # A table created again under this name is another table: change detection must
            # not go on from where it read the deleted one.
            self.engine.ledger.record(forget=[name])
        self._drop_tables(spec)
        return state

    def _require_applied_columns(self, spec: RollupSpec) -> None:
        """A first-level rollup aggregates the computed columns its source's table applies: a
        declared column not yet added (or whose new formula is not applied) must be first."""
        source = self.catalog.archive(spec.source)
        if isinstance(source, RollupSpec):
            return
        applied = self.engine.raw.applied(source)
        for agg in spec.aggregations:
            declared, current = source.column(agg.column), applied.column(agg.column)
            if declared is None or declared.formula is None:
                continue
            if (
                current is None
                or current.formula is None
                or (current.formula.text != declared.formula.text)
            ):
                verb = "add-column" if current is None else "set-formula"
                raise RollupSourceMissingError(
                    f"cannot activate '{spec.name}': computed column '{agg.column}' of "
                    f"'{source.name}' is not applied as declared; run `rollups {verb} "
                    f"{source.name} {agg.column}` first"
                )

    def _drop_tables(self, spec: ArchiveSpec) -> None:
        if isinstance(spec, RollupSpec):
            self.engine.rollups.drop(spec)
        else:
            self.engine.raw.drop(spec)

    def _requeue_running(self, name: str, why: str) -> list[Job]:
        """Fail the rollup's running jobs with `why` and queue their work again.

        A disabled rollup's pending work waits for it to be enabled (as work detected while it is
        disabled does): dropping it would lose the corrections it stands for. A running job's
        run stops before its flip (it re-checks the status, and the fence moved), so its buckets
        are queued again; a job whose flip already landed is completed instead, as its run would
        have completed it (queuing its correction again would apply its change twice).
        """
        snap = self.engine.ledger.snapshot()
        spec = self.catalog.archive(name)
        now = datetime.now(UTC)
        events: list[Job] = []
        for j in snap.for_rollup(name):
            if not j.state.active:
                continue
            flipped = (
                self.engine.rollups.committed_by(spec, j.job_id, Operation.FLIP)
                if isinstance(spec, RollupSpec) and j.state is JobState.SWAPPING
                else None
            )
            if flipped is not None:
                assert isinstance(spec, RollupSpec)
                events += completed_after_flip(
                    self.catalog,
                    spec,
                    j,
                    self.engine.states.all(),
                    f"completed: its flip landed before it was stopped ({why})",
                    now,
                    flipped_at=flipped if j.corrects else None,
                )
                continue
            events.append(j.next(state=JobState.FAILED, error=f"stopped: {why}", finished_at=now))
            events.append(j.again())
        self.engine.ledger.record(events)
        return events

    def _purge(self, name: str, why: str) -> list[Job]:
        """Fail the archive's pending and active jobs with `why` (a deleted archive)."""
        snap = self.engine.ledger.snapshot()
        now = datetime.now(UTC)
        ended = [
            j.next(state=JobState.FAILED, error=f"purged: {why}", finished_at=now)
            for j in snap.for_rollup(name)
            if not j.state.terminal
        ]
        self.engine.ledger.record(ended)
        return ended

    # -- operator controls -------------------------------------------------------------------

    def freeze(self, name: str, until: datetime) -> ArchiveState:
        self.catalog.rollup(name)
        until = as_utc(until)

        def change(s: ArchiveState) -> ArchiveState:
            if s.status is ArchiveStatus.DELETED:
                raise InvalidArchiveStateTransitionError(f"cannot freeze '{name}': it is deleted")
            if s.frozen_until is not None and until < s.frozen_until:
                raise InvalidArchiveStateTransitionError(
                    f"freeze of '{name}' is monotonic: {until.isoformat()} is before the current "
                    f"frozen_until {s.frozen_until.isoformat()}"
                )
            return replace(s, frozen_until=until)

        return self.engine.states.update(
            name, change, reason=f"freeze until {until.isoformat()}", actor=self.actor
        )

    def unfreeze(self, name: str, accept_gaps: bool = False) -> ArchiveState:
        """Lift the freeze. The held writes (`services.held`) are released: the next drain
        recomputes their cells. `accept_gaps` is recorded for audit (in the state and its
        history), as the reference does; it changes nothing else."""
        spec = self.catalog.rollup(name)
        state = self.engine.states.get(name)
        held = sum(
            1 for j in self.engine.ledger.snapshot().pending(name) if held_cells(spec, j, state)
        )
        reason = f"unfreeze (accept_gaps={str(accept_gaps).lower()})"
        if held:
            reason += f"; released {held} held write(s)"
        return self.engine.states.update(
            name,
            lambda s: replace(s, frozen_until=None, accept_gaps=accept_gaps),
            reason=reason,
            actor=self.actor,
        )

    def rewind(self, name: str, to: datetime) -> tuple[ArchiveState, int]:
        """Move the watermark of rollup `name` back to bucket boundary `to` (`services.rewind`):
        the new state and the recomputed rows deleted."""
        return rewind(self.engine, name, to, actor=self.actor)

    def finish_interrupted(self, name: str) -> str | None:
        """Finish the action an interrupted process left on archive `name` (`services.recovery`):
        what was finished, or None when nothing was left."""
        return finish_interrupted(self.engine, name, actor=self.actor)

    def rollback(self, name: str, job_id: str) -> RollbackOutcome:
        """Give the cells recompute job `job_id` changed back the generation it replaced, in one
        pointer commit (`services.rollback`); the levels above are queued for recompute."""
        return rollback(self.engine, name, job_id, run_id=self.actor)

    def request_recompute(
        self, name: str, start: datetime, end: datetime, entities: frozenset[str] | None = None
    ) -> Job:
        """Queue a Manual recompute of the buckets covering [start, end). Fails fast (and records a
        Failed job) when the rollup is not activated; refuses, recording nothing, a first-level
        range whose raw rows retention removed (`RawRowsRetainedError`)."""
        spec = self.catalog.rollup(name)
        start, end = as_utc(start), as_utc(end)
        if start >= end:
            raise InvalidTimeRangeError(
                f"--from {start.isoformat()} must be before --to {end.isoformat()}"
            )
        buckets = buckets_in(spec, [Window(start, end)])
        job = Job(name, Trigger.MANUAL, tuple(buckets), entities=entities)
        state = self.engine.states.get(name)
        if state.status is not ArchiveStatus.ACTIVATED:
            reason = (
                f"Archive is not activated (status {state.status.value}) - "
                "activate it before recomputing"
            )
            failed = job.next(state=JobState.FAILED, error=reason, finished_at=datetime.now(UTC))
            self.engine.ledger.record([failed])
            raise ArchiveNotActivatedError(
                f"recompute of '{name}' failed: {reason} (job {job.job_id})"
            )
        self.engine.require_same_schema(spec, state)
        self.engine.require_source_rows(spec, buckets)
        self.engine.ledger.record([job])
        return job
