"""Retroactive-write detection: turn new commits of source tables into dirty buckets.

For every raw or time-range archive that activated rollups read, each commit after the cursor is
examined (what it changed comes from a `ChangeReader`: the change feed in production, anything
in tests). A changed row is retroactive for a dependent when `ts < consumed watermark` (a write
exactly at the watermark is an Append, which the forward lane picks up). A job of changed rows
the change feed names is a correction (`Job.parts`): its run applies them as differences.
Re-ingesting identical
rows makes nothing dirty: the ingest does not rewrite them, so they are not in the change feed
(`RawStore.ingest`). Each commit's dirty cells (bucket, entity: `model.dirty`) become a Pending
job for that dependent; a bucket touched for more entities than the limit is dirty for every
entity.
"""

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.exceptions import DeltaError

from rollup_assets.compute.arrow_types import TS, instants_of
from rollup_assets.model.bucketing import first_bucket_start
from rollup_assets.model.dirty import dirty_before, dirty_cells
from rollup_assets.model.jobs import ChangeKind, ChangePart, Job, LedgerSnapshot, Trigger
from rollup_assets.model.placement import buckets_in, job_scope
from rollup_assets.model.specs import (
    Catalog,
    RawArchiveSpec,
    RollupSpec,
    SourceSpec,
    TimeRangeArchiveSpec,
)
from rollup_assets.model.states import ArchiveState
from rollup_assets.model.windows import Window
from rollup_assets.resources.change_feed import Changes
from rollup_assets.settings import DetectionLimits

log = logging.getLogger(__name__)
DEFAULT_LIMITS = DetectionLimits()


class ChangeReader(Protocol):
    def latest_version(self, spec: SourceSpec) -> int | None:
        """The source table's newest version (None: no table)."""
        ...

    def changes(self, spec: SourceSpec, version: int) -> Changes | None:
        """What commit `version` changed (None: no data change)."""
        ...

    def table_id(self, spec: SourceSpec) -> str | None:
        """The Delta id of the source's table: a table created again under the same name has
        another id (and counts its versions from 0 again)."""
        ...

    def removed_spans(self, spec: SourceSpec) -> list[Window]:
        """The time ranges of the source whose rows retention removed."""
        ...


@dataclass(frozen=True)
class CommitSummary:
    """What one source commit changed, for the source asset's observations in Dagster."""

    archive: str
    version: int
    change_source: str | None
    rows: int | None  # changed rows from the feed; None when only file statistics were read
    min_ts: datetime | None
    max_ts: datetime | None
    dirty_rollups: list[str]
    committed_at: datetime | None = None  # when the commit was made (None: not recorded)


@dataclass(frozen=True)
class Detection:
    jobs: list[Job]
    cursors: dict[str, int]
    versions_read: int
    rows_classified: int
    notes: list[str]
    commits: list[CommitSummary] = field(default_factory=list)
    tables: dict[str, str | None] = field(default_factory=dict)  # the table each cursor is on
    forget: list[str] = field(default_factory=list)  # sources whose cursor is dropped


def classify(ts: datetime, consumed: datetime | None) -> ChangeKind:
    """RetroactiveModify iff the write lands before what a dependent already consumed."""
    if consumed is not None and ts < consumed:
        return ChangeKind.RETROACTIVE_MODIFY
    return ChangeKind.APPEND


def detect(
    catalog: Catalog,
    states: dict[str, ArchiveState],
    snapshot: LedgerSnapshot,
    reader: ChangeReader,
    limits: DetectionLimits = DEFAULT_LIMITS,
) -> Detection:
    """The dirty jobs and cursor moves for the source commits after each cursor (at most
    `limits.max_versions_per_tick` per source)."""
    jobs: list[Job] = []
    cursors: dict[str, int] = {}
    notes: list[str] = []
    commits: list[CommitSummary] = []
    versions_read = rows_classified = 0
    bases: list[RawArchiveSpec | TimeRangeArchiveSpec] = [
        *catalog.raw.values(),
        *catalog.time_range.values(),
    ]
    tables: dict[str, str | None] = {}
    forget: list[str] = []
    for base in bases:
        deps = [
            d
            for d in catalog.first_levels(base.name)
            if dirty_before(states.get(d.name)) is not None
        ]
        cursor = snapshot.cursors.get(base.name)
        latest = reader.latest_version(base) if deps else None
        if latest is None:
            # Nobody consumes the source (or its table is gone): its commits are nobody's dirty
            # work, and whoever consumes it next starts from first sight.
            if cursor is not None:
                forget.append(base.name)
            continue
        table = reader.table_id(base)
        recorded = snapshot.tables.get(base.name)
        if cursor is not None and (latest < cursor or recorded not in (None, table)):
            notes.append(
                f"{base.name}: the table was created again under this name; change detection "
                "starts over on the new table"
            )
            cursor = None
        if cursor is None:
            cursors[base.name] = latest  # first sight: history before now is a backfill's business
            tables[base.name] = table
            notes.append(f"{base.name}: change detection starts at version {latest}")
            continue
        if latest <= cursor:
            continue
        end = min(latest, cursor + limits.max_versions_per_tick)
        removed = reader.removed_spans(base)
        for version in range(cursor + 1, end + 1):
            changes = reader.changes(base, version)
            versions_read += 1
            if changes is None:
                continue
            rows_classified += changes.rows.num_rows if changes.rows is not None else 0
            dirty = []
            for dep in deps:
                job = _dirty_job(dep, base.name, changes, states[dep.name], limits, removed)
                if job is not None:
                    jobs.append(job)
                    dirty.append(dep.name)
            commits.append(_summary(base.name, changes, dirty))
        cursors[base.name] = end
        tables[base.name] = table
        if end < latest:
            notes.append(
                f"{base.name}: read versions {cursor + 1}..{end}, {latest - end} left for next tick"
            )
    return Detection(jobs, cursors, versions_read, rows_classified, notes, commits, tables, forget)


def undetected(
    catalog: Catalog,
    states: dict[str, ArchiveState],
    snapshot: LedgerSnapshot,
    reader: ChangeReader,
) -> list[str]:
    """The sources with commits past their cursor that `detect` has yet to turn into work (a
    source nobody consumes, or one seen for the first time, has none)."""
    pending = []
    bases: list[RawArchiveSpec | TimeRangeArchiveSpec] = [
        *catalog.raw.values(),
        *catalog.time_range.values(),
    ]
    for base in bases:
        cursor = snapshot.cursors.get(base.name)
        if cursor is None or not any(
            dirty_before(states.get(d.name)) is not None for d in catalog.first_levels(base.name)
        ):
            continue
        latest = reader.latest_version(base)
        if latest is not None and latest > cursor:
            pending.append(base.name)
    return pending


def commits_pending(
    catalog: Catalog,
    states: dict[str, ArchiveState],
    snapshot: LedgerSnapshot,
    reader: ChangeReader,
) -> bool:
    """Does a source hold commits detection has yet to read (`undetected`)? A source that
    cannot be opened says no (logged): the change sensor reports it, and nothing waits on it."""
    try:
        return bool(undetected(catalog, states, snapshot, reader))
    except (DeltaError, OSError, ValueError) as exc:
        log.warning("sources' commits not told (%s): nothing waits for them", exc)
        return False


def _summary(archive: str, changes: Changes, dirty: list[str]) -> CommitSummary:
    source = changes.change_source.value if changes.change_source else None
    if changes.rows is not None:
        n = changes.rows.num_rows
        lo, hi = pc.min_max(changes.rows["ts"]).values() if n else (None, None)
        return CommitSummary(
            archive,
            changes.version,
            source,
            n,
            lo and lo.as_py(),
            hi and hi.as_py(),
            dirty,
            changes.committed_at,
        )
    lo = min((r[0] for r in changes.ranges), default=None)
    hi = max((r[1] for r in changes.ranges), default=None)
    return CommitSummary(
        archive, changes.version, source, None, lo, hi, dirty, changes.committed_at
    )


def _dirty_job(
    dep: RollupSpec,
    base: str,
    changes: Changes,
    state: ArchiveState,
    limits: DetectionLimits,
    removed: list[Window],
) -> Job | None:
    """The job a source commit leaves `dep`: its cells the commit dirtied (`dirty_cells`)."""
    consumed = state.consumed_until
    if consumed is None:
        return None
    if changes.formula_of is not None:
        return _reformulated(dep, base, changes, consumed, removed)
    rows: list[tuple[datetime, str | None]] = []
    if changes.rows is not None and changes.rows.num_rows:
        retro = changes.rows.filter(pc.less(changes.rows["ts"], pa.scalar(consumed, TS)))
        if retro.num_rows == 0:
            return None
        # An update shows a reading twice (its old and its new row): each is placed once.
        keys = retro.group_by(["entity_id", "ts"]).aggregate([])
        rows = list(zip(instants_of(keys["ts"]), keys["entity_id"].to_pylist(), strict=True))
    cells = dirty_cells(
        dep,
        consumed,
        rows=rows,
        spans=changes.ranges,
        removed=removed,
        limit=limits.entity_scope_limit,
    )
    if not cells:
        return None
    windows, entities, exact = job_scope(cells, limits.entity_scope_limit)
    return Job(
        rollup=dep.name,
        trigger=Trigger.PERIODIC,
        windows=windows,
        entities=entities,
        cells=exact,
        source_archive=base,
        source_version=changes.version,
        change_kind=ChangeKind.RETROACTIVE_MODIFY,
        change_source=changes.change_source,
        # Changed rows the change feed names are applied as differences; a commit known only by
        # its files' statistics has its cells aggregated again.
        parts=(ChangePart((changes.version,), cells),) if changes.rows is not None else None,
    )


def _reformulated(
    dep: RollupSpec, base: str, changes: Changes, consumed: datetime, removed: list[Window]
) -> Job | None:
    """A formula of `base` changed: if `dep` aggregates that column, every bucket it has
    consumed (whose raw rows retention left) is dirty, for every entity."""
    if changes.formula_of not in {a.column for a in dep.aggregations}:
        return None
    closed = buckets_in(dep, [Window(first_bucket_start(dep), consumed)])
    kept = tuple(w for w in closed if w.end <= consumed and not any(w.overlaps(r) for r in removed))
    if not kept:
        return None
    return Job(
        rollup=dep.name,
        trigger=Trigger.PERIODIC,
        windows=kept,
        entities=None,
        source_archive=base,
        source_version=changes.version,
        change_kind=ChangeKind.RETROACTIVE_MODIFY,
    )
