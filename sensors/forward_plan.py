"""Forward planning: which rollups have buckets to close or an open bucket to refresh.

A rollup gets one forward run per tick at most, and none while one is in flight. The open bucket
is refreshed when its source changed since the last forward run (or the open bucket moved on),
so an idle chain costs nothing; a closing run always refreshes it too.
"""

from datetime import datetime

from resources.control import ArchiveState, ArchiveStatus
from resources.delta_io import open_table
from resources.ledger import JobState, LedgerSnapshot, Trigger
from rollup_assets.engine import Engine
from rollup_assets.forward import closed_buckets, open_bucket, source_limit
from rollup_assets.specs import RollupSpec
from sensors.drain import Launch


def source_version(engine: Engine, spec: RollupSpec) -> int | None:
    source = engine.catalog.archive(spec.source)
    if isinstance(source, RollupSpec):
        table = open_table(engine.rollups.uri(source), engine.warehouse.storage_options)
    else:
        table = engine.raw.table(source)
    return None if table is None else table.version()


def plan_forward(
    engine: Engine,
    states: dict[str, ArchiveState],
    snapshot: LedgerSnapshot,
    in_flight: set[str],
    now: datetime,
) -> list[Launch]:
    launches = []
    for spec in engine.catalog.rollups.values():
        state = states.get(spec.name) or ArchiveState(spec.name)
        if state.status is not ArchiveStatus.ACTIVATED or spec.name in in_flight:
            continue
        closed = closed_buckets(spec, state, now, source_limit(engine, spec, states))
        ob = open_bucket(spec, state, now)
        if ob is not None and not closed and not _source_changed(engine, spec, snapshot, ob.start):
            ob = None
        buckets = [*closed, *([ob] if ob is not None and ob not in closed else [])]
        if buckets:
            trigger = Trigger.FORWARD if closed else Trigger.OPEN_BUCKET
            launches.append(Launch(spec.name, "forward", trigger, buckets))
    return launches


def _source_changed(
    engine: Engine, spec: RollupSpec, snapshot: LedgerSnapshot, open_start: datetime
) -> bool:
    done = [
        j
        for j in snapshot.for_rollup(spec.name)
        if j.trigger in (Trigger.FORWARD, Trigger.OPEN_BUCKET)
        and j.state is JobState.COMPLETED
        and j.windows
    ]
    if not done:
        return True
    last = max(done, key=lambda j: j.created_at)
    if not any(w.start <= open_start < w.end for w in last.windows):
        return True  # a new open bucket has never been refreshed
    return last.source_version is None or last.source_version != source_version(engine, spec)
