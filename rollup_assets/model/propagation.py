"""Chain propagation: a level that changed makes the containing cells of the next level dirty."""

from rollup_assets.model.cells import Cells
from rollup_assets.model.jobs import ChangeKind, Job, Trigger
from rollup_assets.model.placement import buckets_in, job_scope
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
