"""Forward planning: which rollups have buckets to close or open buckets to refresh.

A rollup gets one forward run per tick at most, without the buckets that read cells a refresh of
its source pending or in flight aggregates again (`ForwardWork.without`), and none while a run
writing it or any level below it is in flight: that run carries its changes up the chain itself
(services/chain.py), and whatever it leaves is planned on a later tick. What a forward run does
is the model's rule (`model.forward.forward_work`: the buckets that may close, and the open
buckets its source changed in); this planner tells whether the source changed inside an open
bucket since the last forward run that read it (a raw source: the time span each ingest commit
records; a rollup source: its own completed jobs), or no forward run has read it yet, so an idle
chain, or a correction far back, costs no refresh.
"""

from collections.abc import Mapping
from datetime import datetime
from functools import partial
from typing import Protocol

from rollup_assets.model.forward import forward_work
from rollup_assets.model.jobs import Job, JobState, Lane, LedgerSnapshot
from rollup_assets.model.specs import Catalog, RawArchiveSpec, RollupSpec, TimeRangeArchiveSpec
from rollup_assets.model.states import ArchiveState, ArchiveStatus
from rollup_assets.model.windows import Window
from rollup_assets.sensors.drain import Launch


class SourceLog(Protocol):
    """What the forward planner may ask of the source tables' logs."""

    def version(self, spec: RawArchiveSpec | TimeRangeArchiveSpec | RollupSpec) -> int | None:
        """The table's newest version (None: no table)."""
        ...

    def changed_within(
        self, spec: RawArchiveSpec | TimeRangeArchiveSpec, after: int, window: Window
    ) -> bool:
        """Could a commit after version `after` have changed rows placed in `window`?"""
        ...


def plan_forward(
    catalog: Catalog,
    states: dict[str, ArchiveState],
    snapshot: LedgerSnapshot,
    in_flight: set[str],
    now: datetime,
    sources: SourceLog,
    deleted: Mapping[str, datetime],
) -> list[Launch]:
    """`deleted`: when each archive deleted at some time was last deleted (its tables now are
    newer)."""
    launches = []
    for spec in catalog.rollups.values():
        state = states.get(spec.name) or ArchiveState(spec.name)
        if state.status is not ArchiveStatus.ACTIVATED or _busy(catalog, spec, in_flight):
            continue
        changed_in = partial(_source_changed, catalog, spec, snapshot, sources, deleted)
        work = forward_work(catalog, spec, state, now, states, changed_in)
        if spec.source in catalog.rollups:
            # What reads cells a refresh of the source aggregates again waits for it.
            work = work.without(snapshot.refreshing(spec.source))
        if work:
            launches.append(Launch(spec.name, Lane.FORWARD, work.trigger, work.buckets))
    # A level below that is launched now carries its changes up into the levels above it.
    starting = {launch.rollup for launch in launches}
    return [
        launch
        for launch in launches
        if not _busy(catalog, catalog.rollup(launch.rollup), starting - {launch.rollup})
    ]


def _busy(catalog: Catalog, spec: RollupSpec, in_flight: set[str]) -> bool:
    """Does a run in flight write `spec` or a level below it in its chain?"""
    name = spec.name
    while name in catalog.rollups:
        if name in in_flight:
            return True
        name = catalog.rollup(name).source
    return False


def _source_changed(
    catalog: Catalog,
    spec: RollupSpec,
    snapshot: LedgerSnapshot,
    sources: SourceLog,
    deleted: Mapping[str, datetime],
    bucket: Window,
) -> bool:
    """Did the source change inside the open `bucket` since the last forward run read it?"""
    source = catalog.archive(spec.source)
    # A run from before the rollup or its source was last deleted (and created again) read
    # other tables: its source version means nothing now.
    since = max((deleted[n] for n in (spec.name, source.name) if n in deleted), default=None)
    read = [
        j
        for j in snapshot.for_rollup(spec.name)
        if j.trigger.lane is Lane.FORWARD
        and j.state is JobState.COMPLETED
        and j.windows_processed  # a run that wrote nothing (waited for a refresh) read nothing
        and any(w.start <= bucket.start < w.end for w in j.windows)
        and (since is None or j.created_at >= since)
    ]
    if not read:
        return True  # no forward run has read this open bucket yet
    last = max(read, key=lambda j: j.created_at)
    if isinstance(source, RollupSpec):
        return _source_jobs_reach(snapshot, source.name, last, bucket)
    current = sources.version(source)
    if last.source_version is None or current is None:
        return True
    if current == last.source_version:
        return False
    # A raw source: a correction far back (the recompute lane's work) leaves it alone.
    return sources.changed_within(source, last.source_version, bucket)


def _source_jobs_reach(snapshot: LedgerSnapshot, source: str, last: Job, bucket: Window) -> bool:
    """A rollup source changes only through its own jobs: did one that finished after `last`
    started reading write into `bucket`? A job's end is recorded after its flip, so a flip that
    raced the read still counts (run hosts are assumed to share a synchronized clock)."""
    if last.started_at is None:
        return True
    since = last.started_at
    return any(
        j.state is JobState.COMPLETED
        and j.windows_processed
        and j.finished_at is not None
        and j.finished_at >= since
        and any(w.overlaps(bucket) for w in j.windows)
        for j in snapshot.for_rollup(source)
    )
