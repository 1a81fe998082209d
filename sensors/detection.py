"""Retroactive-write detection: turn new commits of source tables into dirty buckets.

For every raw or time-range archive that activated rollups read, each commit after the cursor is
examined: its changed rows come from the change data feed (inserts, deletes, and both images of
an update), or, for a table without CDF or a commit too large to read row by row, from the
per-file time statistics of the files it added and removed (an over-approximation). A changed
row is retroactive for a dependent when `ts < consumed watermark` (a write exactly at the
watermark is an Append, which the forward lane picks up). It is value-agnostic: re-ingesting
identical data still marks its buckets dirty. Each dirty set becomes a Pending job for that
dependent, scoped to the touched entities when they are few.
"""

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc

from resources.control import ArchiveState, ArchiveStatus
from resources.delta_io import read_commit
from resources.ledger import ChangeKind, ChangeSource, Job, LedgerSnapshot, Trigger
from rollup_assets.engine import Engine
from rollup_assets.ingest import key_columns
from rollup_assets.partitions import Bucketing, Window
from rollup_assets.specs import RawArchiveSpec, RollupSpec, TimeRangeArchiveSpec

log = logging.getLogger(__name__)
MAX_VERSIONS_PER_TICK = int(os.environ.get("ROLLUPS_MAX_VERSIONS_PER_TICK", "100"))
MAX_CDF_ROWS = int(os.environ.get("ROLLUPS_MAX_CDF_ROWS", "2000000"))
ENTITY_SCOPE_LIMIT = int(os.environ.get("ROLLUPS_ENTITY_SCOPE_LIMIT", "32"))
SKIPPED_OPERATIONS = {"OPTIMIZE", "VACUUM START", "VACUUM END", "SET TBLPROPERTIES", "CREATE TABLE"}


@dataclass
class Changes:
    """The rows (or the file-level ranges) one commit changed."""

    version: int
    change_source: ChangeSource | None
    rows: pa.Table | None = None  # entity_id, ts
    ranges: list[tuple[datetime, datetime, str | None]] = field(
        default_factory=list
    )  # min, max, entity


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


@dataclass(frozen=True)
class Detection:
    jobs: list[Job]
    cursors: dict[str, int]
    versions_read: int
    rows_classified: int
    notes: list[str]
    commits: list[CommitSummary] = field(default_factory=list)


def classify(ts: datetime, consumed: datetime | None) -> ChangeKind:
    """RetroactiveModify iff the write lands before what a dependent already consumed."""
    if consumed is not None and ts < consumed:
        return ChangeKind.RETROACTIVE_MODIFY
    return ChangeKind.APPEND


def scope_of(entities: Iterable[str | None]) -> frozenset[str] | None:
    ids = set(entities)
    if None in ids or len(ids) > ENTITY_SCOPE_LIMIT:
        return None
    return frozenset(e for e in ids if e is not None)


def read_changes(
    engine: Engine, spec: RawArchiveSpec | TimeRangeArchiveSpec, version: int
) -> Changes | None:
    """What commit `version` of a source table changed, or None for a commit without data change."""
    uri = engine.raw.uri(spec)
    actions = read_commit(uri, version, engine.warehouse.storage_options)
    info: dict = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    if info.get("operation") in SKIPPED_OPERATIONS and not any("cdc" in a for a in actions):
        return None
    data = [a for a in actions if any(k in a for k in ("add", "remove", "cdc"))]
    data = [a for a in data if next(iter(a.values())).get("dataChange", True) or "cdc" in a]
    if not data:
        return None
    source = info.get("rollups.change_source")
    change_source = (
        ChangeSource(source)
        if isinstance(source, str) and source in ChangeSource._value2member_map_
        else None
    )
    time_col = key_columns(spec)[1]
    estimate = sum(_num_records(next(iter(a.values()))) for a in data if "cdc" not in a)
    table = engine.raw.table(spec)
    cdf = (
        table is not None
        and table.metadata().configuration.get("delta.enableChangeDataFeed") == "true"
    )
    if cdf and table is not None and estimate <= MAX_CDF_ROWS:
        reader = table.load_cdf(
            starting_version=version, ending_version=version, columns=["entity_id", time_col]
        )
        rows = pa.table(reader).select(["entity_id", time_col]).rename_columns(["entity_id", "ts"])
        rows = rows.cast(
            pa.schema([("entity_id", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))])
        )
        return Changes(version, change_source, rows=rows)
    ranges = [_file_range(engine, spec, version, next(iter(a.values())), time_col) for a in data]
    return Changes(version, change_source, ranges=ranges)


def detect(
    engine: Engine,
    states: dict[str, ArchiveState],
    snapshot: LedgerSnapshot,
    max_versions: int = MAX_VERSIONS_PER_TICK,
) -> Detection:
    jobs: list[Job] = []
    cursors: dict[str, int] = {}
    notes: list[str] = []
    commits: list[CommitSummary] = []
    versions_read = rows_classified = 0
    catalog = engine.catalog
    bases: list[RawArchiveSpec | TimeRangeArchiveSpec] = [
        *catalog.raw.values(),
        *catalog.time_range.values(),
    ]
    for base in bases:
        deps = [d for d in catalog.first_levels(base.name) if _consumes(states.get(d.name))]
        table = engine.raw.table(base) if deps else None
        if table is None:
            continue
        latest = table.version()
        cursor = snapshot.cursors.get(base.name)
        if cursor is None:
            cursors[base.name] = latest  # first sight: history before now is a backfill's business
            notes.append(f"{base.name}: change detection starts at version {latest}")
            continue
        if latest <= cursor:
            continue
        end = min(latest, cursor + max_versions)
        for version in range(cursor + 1, end + 1):
            changes = read_changes(engine, base, version)
            versions_read += 1
            if changes is None:
                continue
            rows_classified += changes.rows.num_rows if changes.rows is not None else 0
            dirty = []
            for dep in deps:
                job = _dirty_job(dep, base.name, changes, states[dep.name], engine)
                if job is not None:
                    jobs.append(job)
                    dirty.append(dep.name)
            commits.append(_summary(base.name, changes, dirty))
        cursors[base.name] = end
        if end < latest:
            notes.append(
                f"{base.name}: read versions {cursor + 1}..{end}, {latest - end} left for next tick"
            )
    return Detection(jobs, cursors, versions_read, rows_classified, notes, commits)


def _summary(archive: str, changes: Changes, dirty: list[str]) -> CommitSummary:
    source = changes.change_source.value if changes.change_source else None
    if changes.rows is not None:
        n = changes.rows.num_rows
        lo, hi = pc.min_max(changes.rows["ts"]).values() if n else (None, None)
        return CommitSummary(
            archive, changes.version, source, n, lo and lo.as_py(), hi and hi.as_py(), dirty
        )
    lo = min((r[0] for r in changes.ranges), default=None)
    hi = max((r[1] for r in changes.ranges), default=None)
    return CommitSummary(archive, changes.version, source, None, lo, hi, dirty)


def _consumes(state: ArchiveState | None) -> bool:
    return (
        state is not None
        and state.status not in (ArchiveStatus.CREATED, ArchiveStatus.DELETED)
        and state.consumed_until is not None
    )


def _dirty_job(
    dep: RollupSpec, base: str, changes: Changes, state: ArchiveState, engine: Engine
) -> Job | None:
    consumed = state.consumed_until
    if consumed is None:
        return None
    b = Bucketing.of(dep)
    buckets: set[Window] = set()
    entities: list[str | None] = []
    if changes.rows is not None and changes.rows.num_rows:
        retro = changes.rows.filter(
            pc.less(changes.rows["ts"], pa.scalar(consumed, pa.timestamp("us", tz="UTC")))
        )
        if retro.num_rows == 0:
            return None
        starts = pc.unique(retro["ts"]).to_pylist()
        buckets = {b.window_of(t) for t in starts}
        entities = pc.unique(retro["entity_id"]).to_pylist()
    for lo, hi, entity in changes.ranges:
        if classify(lo, consumed) is ChangeKind.APPEND:
            continue
        hi = min(hi, consumed - timedelta(microseconds=1))
        buckets.update(b.windows(lo, hi + timedelta(microseconds=1)))
        entities.append(entity)
    valid = [w for w in engine.buckets_in(dep, sorted(buckets)) if w.start < consumed]
    if not valid:
        return None
    return Job(
        rollup=dep.name,
        trigger=Trigger.PERIODIC,
        windows=tuple(valid),
        entities=scope_of(entities),
        source_archive=base,
        source_version=changes.version,
        change_kind=ChangeKind.RETROACTIVE_MODIFY,
        change_source=changes.change_source,
    )


def _file_range(
    engine: Engine,
    spec: RawArchiveSpec | TimeRangeArchiveSpec,
    version: int,
    body: dict,
    time_col: str,
) -> tuple[datetime, datetime, str | None]:
    """The time range (and entity, if single) a changed file covers, from the best evidence:
    its own stats, its UTC-day partition, or its stats in the snapshot it was removed from."""
    stats = _stats(body)
    if not stats and "deletionTimestamp" in body:
        stats = _stats_before(engine, spec, version, body["path"])
    lo = stats.get("minValues", {}).get(time_col)
    hi = stats.get("maxValues", {}).get(time_col)
    elo, ehi = (
        stats.get("minValues", {}).get("entity_id"),
        stats.get("maxValues", {}).get("entity_id"),
    )
    entity = elo if elo is not None and elo == ehi else None
    if lo is not None and hi is not None:
        return _parse(lo), _parse(hi), entity
    day = (body.get("partitionValues") or {}).get("day")
    if day:
        d0 = _parse(day + "T00:00:00Z")
        return d0, d0 + timedelta(days=1) - timedelta(microseconds=1), entity
    raise ValueError(
        f"cannot tell which times commit {version} of '{spec.name}' changed: "
        f"file {body.get('path')} "
        "has neither time statistics nor a day partition"
    )


def _stats_before(
    engine: Engine, spec: RawArchiveSpec | TimeRangeArchiveSpec, version: int, path: str
) -> dict:
    table = engine.raw.table(spec, version=version - 1)
    if table is None:
        return {}
    for f in pa.table(table.get_add_actions(flatten=False)).to_pylist():
        if f["path"] == path:
            iso = {
                k: v.isoformat() if isinstance(v, datetime) else v
                for k, v in (f.get("min") or {}).items()
            }
            iso_max = {
                k: v.isoformat() if isinstance(v, datetime) else v
                for k, v in (f.get("max") or {}).items()
            }
            return {"minValues": iso, "maxValues": iso_max}
    return {}


def _num_records(body: dict) -> int:
    return int(_stats(body).get("numRecords", 0) or 0)


def _stats(body: dict) -> dict:
    raw = body.get("stats")
    if not raw:
        return {}
    return json.loads(raw) if isinstance(raw, str) else raw


def _parse(text: str) -> datetime:
    t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=UTC)
