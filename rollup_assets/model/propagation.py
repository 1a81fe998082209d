"""Chain propagation: a level that changed makes the containing cells of the next level dirty
(`model.dirty.lifted_cells`), and queues their work."""

from dataclasses import replace
from datetime import UTC, datetime

from rollup_assets.model.cells import Cells
from rollup_assets.model.dirty import dirty_before, lifted_cells
from rollup_assets.model.jobs import ChangeKind, ChangePart, Job, JobState, Trigger
from rollup_assets.model.placement import buckets_in, cells_of, job_scope
from rollup_assets.model.specs import Catalog, RollupSpec
from rollup_assets.model.states import ArchiveState


def propagation_jobs(
    catalog: Catalog,
    spec: RollupSpec,
    cells: Cells,
    version: int | None,
    states: dict[str, ArchiveState],
    parts: tuple[ChangePart, ...] | None = None,
) -> list[Job]:
    """Pending jobs for `spec`'s direct dependents: the cells of their already-consumed buckets
    that contain `cells` (written at table `version`), for the same entities; a dependent that
    consumed nothing yet gets none. With `parts` (a correction's, shown by `spec`'s flip) the
    jobs are corrections applying the same source changes; otherwise they aggregate their
    cells again from `spec`."""
    jobs = []
    for dep in catalog.dependents(spec.name):
        consumed = dirty_before(states.get(dep.name))
        if consumed is None:
            continue
        # Past the entity limit a bucket above is recomputed for every entity (one pointer, and
        # rewritten whole if most cells changed).
        lifted = lifted_cells(dep, cells, consumed)
        if not lifted:
            continue
        windows, entities, exact = job_scope(lifted)
        mine = None
        if parts is not None:
            mine = tuple(q for q in (p.within(windows) for p in parts) if q.cells)
            if not mine:
                continue
        jobs.append(
            Job(
                rollup=dep.name,
                trigger=Trigger.CHAIN,
                windows=windows,
                entities=entities,
                cells=exact,
                source_archive=spec.name,
                source_version=version,
                change_kind=ChangeKind.RETROACTIVE_MODIFY,
                parts=mine,
            )
        )
    return jobs


def carries_up(job: Job) -> bool:
    """Does the flip of `job` give the levels above anything to take? Not a fold's (maintenance):
    it rewrites what readers already saw and never changes a value, which the levels above hold
    already."""
    return job.trigger is not Trigger.MAINTENANCE


def completed_after_flip(
    catalog: Catalog,
    spec: RollupSpec,
    job: Job,
    states: dict[str, ArchiveState],
    why: str,
    now: datetime | None = None,
    flipped_at: int | None = None,
) -> list[Job]:
    """The events of a job whose flip landed but whose run ended before recording it (a crash,
    or a failure after the flip): it is completed, and the levels above are queued for its cells
    as its own completion would have queued them. Queuing them again is never wrong; missing
    them would leave the levels above behind with no work queued. A correction's changes go up
    as corrections when its flip's version (`flipped_at`) is known; otherwise the cells above
    are aggregated again (which holds them too)."""
    done = job.next(
        state=JobState.COMPLETED,
        finished_at=now or datetime.now(UTC),
        windows_processed=len(buckets_in(spec, list(job.windows))),
        error=why,
    )
    parts = None
    if job.parts is not None and flipped_at is not None:
        parts = tuple(replace(p, seen_at=flipped_at) for p in job.parts)
    if not carries_up(job):
        return [done]
    above = propagation_jobs(catalog, spec, cells_of(spec, job), flipped_at, states, parts)
    return [done, *above]
