"""The per-rollup health fields (the reference's RollupArchiveInfo), from the ledger and state."""

from dataclasses import dataclass, field
from datetime import UTC, datetime

from rollup_assets.model.intents import Intent
from rollup_assets.model.jobs import JobState, Lane, LedgerSnapshot
from rollup_assets.model.placement import buckets_in, held_cells
from rollup_assets.model.specs import Catalog
from rollup_assets.model.states import ArchiveState
from rollup_assets.model.windows import Window, iso_utc, merge_windows


@dataclass(frozen=True)
class Health:
    """The per-rollup health fields (the reference's RollupArchiveInfo)."""

    archive: str
    status: str
    watermark: datetime | None
    frozen_until: datetime | None
    recompute_in_progress: bool
    last_recompute_started_at: datetime | None
    last_recompute_success_at: datetime | None
    last_recompute_failure_at: datetime | None
    last_recompute_failure_reason: str | None
    dirty_windows_pending: int
    pending_recompute_ranges: list[Window]
    # Writes into the frozen range, held until the unfreeze (`services.held`): how many, and
    # the spans of the buckets they hold.
    held_writes: int = 0
    held_ranges: list[Window] = field(default_factory=list)
    # The newest rollback: "<rollback job> undid <job> at <time>" (None: never rolled back).
    last_rollback: str | None = None
    # Work whose last attempt failed (queued by nobody now): how many jobs, and the newest as
    # "<job> at <time>: <reason>".
    jobs_given_up: int = 0
    last_given_up: str | None = None
    # An operator action of several commits under way or left unfinished (`model.intents`).
    action_under_way: str | None = None
    # Retention dropped every bucket before this boundary (None: every bucket is kept).
    retained_from: datetime | None = None


def health(
    catalog: Catalog, name: str, snap: LedgerSnapshot, states: dict[str, ArchiveState]
) -> Health:
    state = states.get(name) or ArchiveState(name)
    jobs = [j for j in snap.for_rollup(name) if j.trigger.lane is Lane.RECOMPUTE]
    pending = [j for j in jobs if j.state is JobState.PENDING]
    started = [j.started_at for j in jobs if j.started_at]
    ok = [j.finished_at for j in jobs if j.state is JobState.COMPLETED and j.finished_at]
    failed = sorted(
        (j for j in jobs if j.state is JobState.FAILED and j.finished_at),
        key=lambda j: j.finished_at or datetime.min.replace(tzinfo=UTC),
    )
    spec = catalog.rollup(name)
    held = [c for c in (held_cells(spec, j, state) for j in pending) if c]
    given_up = [j for j in failed if j.gave_up]
    intent = Intent.decode(state.intent)
    return Health(
        archive=name,
        status=state.status.value,
        watermark=state.watermark,
        frozen_until=state.frozen_until,
        recompute_in_progress=any(j.state.active for j in jobs),
        last_recompute_started_at=max(started) if started else None,
        last_recompute_success_at=max(ok) if ok else None,
        last_recompute_failure_at=failed[-1].finished_at if failed else None,
        last_recompute_failure_reason=failed[-1].error if failed else None,
        dirty_windows_pending=len(buckets_in(spec, [w for j in pending for w in j.windows])),
        pending_recompute_ranges=merge_windows([w for j in pending for w in j.windows]),
        held_writes=len(held),
        held_ranges=merge_windows([w for c in held for w in c.windows]),
        last_rollback=_describe_rollback(snap, name),
        jobs_given_up=len(given_up),
        last_given_up=(
            f"{given_up[-1].job_id} at {iso_utc(given_up[-1].finished_at)}: {given_up[-1].error}"
            if given_up and given_up[-1].finished_at
            else None
        ),
        action_under_way=intent.describe() if intent else None,
        retained_from=state.retained_from,
    )


def _describe_rollback(snap: LedgerSnapshot, name: str) -> str | None:
    job = snap.last_rollback(name)
    if job is None:
        return None
    at = iso_utc(job.finished_at) if job.finished_at else "?"
    return f"{job.job_id} undid {job.undoes} at {at}"
