"""Chain propagation: a level that changed makes the containing cells of the next level dirty."""

from datetime import UTC, datetime

from rollup_assets.model.cells import Cells
from rollup_assets.model.jobs import ChangeKind, Job, JobState, Trigger
from rollup_assets.model.placement import buckets_in, cells_of, job_scope
from rollup_assets.model.specs import Catalog, RollupSpec
from rollup_assets.model.states import ArchiveState, ArchiveStatus


def propagation_jobs(
    catalog: Catalog,
    spec: RollupSpec,
    cells: Cells,
    version: int | None,
    states: dict[str, ArchiveState],
) -> list[Job]:
    """Pending jobs for `spec`'s direct dependents: the cells of their already-consumed buckets
    that contain `cells` (written at table `version`), for the same entities; a dependent that
    consumed nothing yet gets none."""
    jobs = []
    for dep in catalog.dependents(spec.name):
        state = states.get(dep.name) or ArchiveState(dep.name)
        consumed = state.consumed_until
        if consumed is None or state.status in (ArchiveStatus.CREATED, ArchiveStatus.DELETED):
            continue
        # A bucket above gathers the entities of many buckets below: past the limit it is
        # recomputed for every entity (one pointer, and rewritten whole if most cells changed).
        lifted = Cells.collect(
            (up, scope)
            for window, scope in cells
            if window.start < consumed
            for up in buckets_in(dep, [window])
            if up.start < consumed
        )
        if not lifted:
            continue
        windows, entities, exact = job_scope(lifted)
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
            )
        )
    return jobs


def completed_after_flip(
    catalog: Catalog,
    spec: RollupSpec,
    job: Job,
    states: dict[str, ArchiveState],
    why: str,
    now: datetime | None = None,
) -> list[Job]:
    """The events of a job whose flip landed but whose run ended before recording it (a crash,
    or a failure after the flip): it is completed, and the levels above are queued for its cells
    as its own completion would have queued them. Queuing them again is never wrong; missing
    them would leave the levels above behind with no work queued."""
    done = job.next(
        state=JobState.COMPLETED,
        finished_at=now or datetime.now(UTC),
        windows_processed=len(buckets_in(spec, list(job.windows))),
        error=why,
    )
    return [done, *propagation_jobs(catalog, spec, cells_of(spec, job), None, states)]
