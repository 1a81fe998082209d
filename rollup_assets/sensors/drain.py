"""Draining the ledger: pending jobs become at most one recompute run per rollup.

Per rollup, each tick:
  * a job whose Dagster runs all ended while it was still open died mid-way: if its pointers were
    already flipped it is completed (and its dependents queued, its superseded rows swept);
    otherwise it is failed and its buckets are queued again as its next attempt (after a
    backoff; after the last attempt it ends Failed for good). A pending retry waits out its
    backoff;
  * nothing is launched while a recompute of the rollup is in flight, or while the rollup is not
    activated (pending work waits);
  * nothing is launched either when every pending job was queued by chain propagation while a
    run that writes the rollup's source is still in flight: that run carries the chain to this
    level itself, and a run launched meanwhile would only take the level from it (a new process
    and Spark session per level). When that run ends, whatever it left is launched;
  * a job over buckets of the rollup's source that a refresh pending or in flight aggregates
    again waits for it: those cells are what the job reads (`Trigger.REFRESH`); so does a fold
    over buckets of the rollup's own pending refresh (one waiting out its backoff, say). Work
    merged with a refresh is recorded as one;
  * the cells of all pending jobs that are ready (below the watermark, not frozen) merge into
    one job, their union per bucket (never the cross product of buckets and entities); the jobs
    it absorbed are recorded as Coalesced, the rest keeps waiting.
"""

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from rollup_assets.model.cells import Cells
from rollup_assets.model.jobs import (
    Job,
    JobState,
    Lane,
    LedgerSnapshot,
    RetryPolicy,
    Trigger,
    refreshed_first,
)
from rollup_assets.model.placement import buckets_in, cells_of, job_scope, place
from rollup_assets.model.propagation import completed_after_flip
from rollup_assets.model.specs import Catalog, RollupSpec
from rollup_assets.model.states import ArchiveState, ArchiveStatus
from rollup_assets.model.windows import Window

log = logging.getLogger(__name__)


class RunLookup(Protocol):
    def runs_of_job(self, job_id: str, owner: str | None = None) -> list[tuple[str, bool]]:
        """(run_id, finished) of every Dagster run launched for a job, and of its owner run."""


@dataclass(frozen=True)
class Launch:
    rollup: str
    lane: Lane
    trigger: Trigger
    buckets: list[Window]
    job_id: str | None = None


@dataclass
class DrainPlan:
    launches: list[Launch] = field(default_factory=list)
    events: list[Job] = field(default_factory=list)
    sweeps: list[Job] = field(default_factory=list)  # completed on recovery: sweep their buckets
    notes: list[str] = field(default_factory=list)


def plan_drain(
    catalog: Catalog,
    states: dict[str, ArchiveState],
    snapshot: LedgerSnapshot,
    runs: RunLookup,
    flipped: Mapping[str, int | None] | None = None,
    entity_scope_limit: int = 32,
    policy: RetryPolicy | None = None,
    now: datetime | None = None,
) -> DrainPlan:
    """What to launch, record and sweep this tick. `flipped` holds the ids of jobs whose pointers
    are in their rollup's pointer table (a dead job among them had flipped before it died), each
    with its flip's version when known.
    `now` is the wall clock (a retry waits out its backoff by it); `policy` how often failed
    work is tried again."""
    plan = DrainPlan()
    policy = policy or RetryPolicy()
    now = now or datetime.now(UTC)
    settled = {
        spec.name: _settle(catalog, spec, snapshot, runs, states, flipped or {}, plan, policy, now)
        for spec in catalog.rollups.values()
    }
    for spec in catalog.rollups.values():
        state = states.get(spec.name) or ArchiveState(spec.name)
        pending, busy = settled[spec.name]
        # Jobs this plan already queued for the rollup (propagated by a job recovered one level
        # down) drain in this tick too: a tick that launches nothing must mean nothing is ready.
        pending += [
            j
            for j in plan.events
            if j.rollup == spec.name and j.state is JobState.PENDING and j not in pending
        ]
        if busy or not pending:
            continue
        due = [j for j in pending if j.due(now)]
        if len(due) < len(pending):
            first = min(j.not_before for j in pending if j.not_before and not j.due(now))
            plan.notes.append(
                f"{spec.name}: {len(pending) - len(due)} job(s) retry after their backoff "
                f"(next at {first.isoformat()})"
            )
        pending = due
        if not pending:
            continue
        below = snapshot.refreshing(spec.source) if spec.source in catalog.rollups else []
        own = snapshot.refreshing(spec.name)
        held = [
            j
            for j in pending
            if refreshed_first(j.windows, below)
            or (j.trigger is Trigger.MAINTENANCE and refreshed_first(j.windows, own))
        ]
        if held:
            plan.notes.append(f"{spec.name}: {len(held)} pending job(s) wait for a refresh")
            pending = [j for j in pending if j not in held]
            if not pending:
                continue
        since = _carried_since(spec, snapshot, runs)
        if since is not None and all(
            j.trigger is Trigger.CHAIN and j.created_at >= since for j in pending
        ):
            plan.notes.append(
                f"{spec.name}: {len(pending)} pending job(s) wait for the run in flight on "
                f"{spec.source}, which carries the chain"
            )
            continue
        if state.status is not ArchiveStatus.ACTIVATED:
            plan.notes.append(
                f"{spec.name}: {len(pending)} pending job(s) wait ({state.status.value})"
            )
            continue
        _merge(spec, state, pending, plan, entity_scope_limit)
    return plan


def _carried_since(spec: RollupSpec, snapshot: LedgerSnapshot, runs: RunLookup) -> datetime | None:
    """When the run now in flight on `spec`'s source (a rollup) started its source job; None
    when no run is writing the source. The source's open jobs and its newest completed one
    (whose run may still be carrying the chain above it) are the candidates."""
    jobs = snapshot.for_rollup(spec.source)
    done = [j for j in jobs if j.state is JobState.COMPLETED and j.run_id]
    newest = max(done, key=lambda j: j.finished_at or j.created_at, default=None)
    candidates = [j for j in jobs if not j.state.terminal] + ([newest] if newest else [])
    starts = []
    for job in candidates:
        if any(not finished for _, finished in runs.runs_of_job(job.job_id, job.run_id)):
            starts.append(job.started_at or job.created_at)
    return min(starts, default=None)


def _settle(
    catalog: Catalog,
    spec: RollupSpec,
    snapshot: LedgerSnapshot,
    runs: RunLookup,
    states: dict[str, ArchiveState],
    flipped: Mapping[str, int | None],
    plan: DrainPlan,
    policy: RetryPolicy,
    now: datetime,
) -> tuple[list[Job], bool]:
    """Recover dead jobs (a dead job's work is queued again as its next attempt, `policy`
    permitting); return the pending jobs and whether a recompute is in flight."""
    pending: list[Job] = []
    busy = False
    for job in snapshot.for_rollup(spec.name):
        if job.state.terminal or job.trigger.lane is Lane.FORWARD:
            continue
        if job.trigger is Trigger.ROLLBACK:
            # An operator's rollback runs in its own process, not a Dagster run; one it left
            # unfinished is finished or undone by `services.rollback.recover_rollbacks`.
            busy = True
            continue
        # A job a run took over in its own chain has no run launched for it: its owner counts.
        owner = job.run_id if job.state.active else None
        launched = runs.runs_of_job(job.job_id, owner)
        if any(not finished for _, finished in launched):
            busy = True
            continue
        if not launched and job.state is JobState.PENDING:
            pending.append(job)
            continue
        last_run = launched[-1][0] if launched else job.run_id
        if job.state is JobState.SWAPPING and job.job_id in flipped:
            events = completed_after_flip(
                catalog,
                spec,
                job,
                states,
                f"completed on recovery: run {last_run} ended after the flip",
                now,
                flipped_at=flipped[job.job_id],
            )
            plan.events += events
            plan.sweeps.append(events[0])
            plan.notes.append(
                f"{spec.name}: job {job.job_id} had flipped before its run ended; completed it"
            )
            continue
        why = job.error or f"run {last_run} ended before the job completed ({job.state.value})"
        events = job.fail(why, policy=policy, now=now)
        plan.events += events
        retried = [e for e in events if e.state is JobState.PENDING]
        pending += retried
        plan.notes.append(
            f"{spec.name}: job {job.job_id} died ({job.state.value}); "
            + (f"queued again as {retried[0].job_id}" if retried else events[0].error or "")
        )
    return pending, busy


def _merge(
    spec: RollupSpec,
    state: ArchiveState,
    pending: list[Job],
    plan: DrainPlan,
    entity_scope_limit: int,
) -> None:
    ready_by_job: dict[str, list[Window]] = {}
    waiting_by_job: dict[str, list[Window]] = {}
    for job in pending:
        placement = place(buckets_in(spec, list(job.windows)), state)
        ready_by_job[job.job_id] = placement.ready
        waiting_by_job[job.job_id] = placement.waiting(job.trigger)
        if (
            job.trigger is Trigger.MANUAL
            and placement.later
            and not placement.ready
            and not placement.frozen
        ):
            # Manual work past the watermark is a no-op.
            plan.events.append(
                job.next(
                    state=JobState.COMPLETED,
                    windows_processed=0,
                    rows_processed=0,
                    finished_at=datetime.now(UTC),
                    error=None,
                )
            )
            plan.notes.append(
                f"{spec.name}: manual job {job.job_id} covers only open/unaggregated buckets: no-op"
            )
            ready_by_job[job.job_id] = []
    contributors = [j for j in pending if ready_by_job[j.job_id]]
    if not contributors:
        return
    # A run takes one kind of work, in `Job.run_order`: aggregations from the source before
    # corrections (whose changes they may hold already, `services.correction`), folds last.
    first_kind = min(j.run_order for j in contributors)
    contributors = [j for j in contributors if j.run_order == first_kind]
    if len(contributors) == 1 and not waiting_by_job[contributors[0].job_id]:
        job = contributors[0]
        plan.launches.append(
            Launch(spec.name, Lane.RECOMPUTE, job.trigger, ready_by_job[job.job_id], job.job_id)
        )
        return
    first = contributors[0]
    cells = Cells.collect(
        (item for j in contributors for item in cells_of(spec, j).restrict(ready_by_job[j.job_id])),
        entity_scope_limit,
    )
    windows, entities, exact = job_scope(cells, entity_scope_limit)
    parts = None
    if first.corrects:
        # Each job's changes to its own cells: parts are joined, never crossed.
        parts = tuple(p for j in contributors for p in j.parts_within(ready_by_job[j.job_id]) or ())
    # A refresh merged into other work stays one: the levels above wait for it.
    refresh = any(j.trigger is Trigger.REFRESH for j in contributors)
    merged = Job(
        spec.name,
        Trigger.REFRESH if refresh else first.trigger,
        windows,
        entities=entities,
        cells=exact,
        source_archive=first.source_archive,
        source_version=first.source_version,
        change_kind=first.change_kind,
        change_source=first.change_source,
        parts=parts,
    )
    plan.events.append(merged)
    for job in contributors:
        rest = waiting_by_job[job.job_id]
        if rest:
            plan.events.append(job.narrowed(tuple(rest)))
        else:
            plan.events.append(
                job.next(
                    state=JobState.COALESCED,
                    coalesced_into=merged.job_id,
                    finished_at=datetime.now(UTC),
                )
            )
    plan.launches.append(
        Launch(spec.name, Lane.RECOMPUTE, merged.trigger, list(windows), merged.job_id)
    )
    plan.notes.append(f"{spec.name}: coalesced {len(contributors)} job(s) into {merged.job_id}")
