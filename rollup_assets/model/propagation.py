"""Chain propagation: a level that changed makes the containing buckets of the next level dirty."""

from rollup_assets.model.jobs import ChangeKind, Job, Trigger
from rollup_assets.model.placement import buckets_in
from rollup_assets.model.specs import Catalog, RollupSpec
from rollup_assets.model.states import ArchiveState, ArchiveStatus
from rollup_assets.model.windows import Window


def propagation_jobs(
    catalog: Catalog,
    spec: RollupSpec,
    buckets: list[Window],
    entities: frozenset[str] | None,
    version: int | None,
    states: dict[str, ArchiveState],
) -> list[Job]:
    """Pending jobs for `spec`'s direct dependents whose already-consumed buckets contain
    `buckets` (written at table `version`); a dependent that consumed nothing yet gets none."""
    jobs = []
    for dep in catalog.dependents(spec.name):
        state = states.get(dep.name) or ArchiveState(dep.name)
        consumed = state.consumed_until
        if consumed is None or state.status in (ArchiveStatus.CREATED, ArchiveStatus.DELETED):
            continue
        touched = [w for w in buckets if w.start < consumed]
        if not touched:
            continue
        dep_buckets = [w for w in buckets_in(dep, touched) if w.start < consumed]
        if dep_buckets:
            jobs.append(
                Job(
                    rollup=dep.name,
                    trigger=Trigger.CHAIN,
                    windows=tuple(dep_buckets),
                    entities=entities,
                    source_archive=spec.name,
                    source_version=version,
                    change_kind=ChangeKind.RETROACTIVE_MODIFY,
                )
            )
    return jobs
