"""Lineage of a value: the job, run, generation and source versions behind a rollup's active row,
down to the raw commits it reflects.

Every rollup row records the job and Dagster run that wrote it, its generation and the versions
of its source that run read (`source_versions`). A first-level row reflects its raw (or
time-range) table at that version: the commits up to that version that changed rows of the
row's cell (its bucket and entity) are the writes behind the value. A row of a level above
reflects the rows of the level below as the run read them (that level's row and pointer table
versions); each of those is traced the same way, down to the raw commits.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc

from rollup_assets.model.bucketing import Bucketing, first_bucket_start
from rollup_assets.model.errors import InvalidTimeRangeError, RowNotFoundError
from rollup_assets.model.jobs import Job, LedgerSnapshot
from rollup_assets.model.partials import CELL_COLUMNS, GENERATION, WRITTEN_BY
from rollup_assets.model.specs import RawArchiveSpec, RollupSpec, TimeRangeArchiveSpec
from rollup_assets.model.windows import Window, as_utc
from rollup_assets.resources.commit_changes import CHANGE_TYPE, COMMIT_VERSION, ChangeFeedGone
from rollup_assets.resources.delta_tables import commit_info, read_commit
from rollup_assets.resources.rollup_snapshots import Snapshot
from rollup_assets.services.engine import Engine

ROW_COLUMNS = [*CELL_COLUMNS, *WRITTEN_BY]


@dataclass(frozen=True)
class SourceCommit:
    """A commit of a raw or time-range table that changed rows of a cell."""

    archive: str
    version: int
    committed_at: datetime | None
    operation: str | None
    rows: int  # rows of the cell it changed (an update once)
    metadata: dict[str, str]  # what the write recorded with it (`rollups.*`: source, file, ...)


@dataclass(frozen=True)
class RowLineage:
    """What one active row of a rollup reflects."""

    rollup: str
    entity: str
    bucket: Window
    generation: int
    job_id: str | None
    run_id: str | None
    job: Job | None  # the ledger's record of the job that wrote the row
    source_versions: dict[str, int]
    sources: tuple["RowLineage", ...] = ()  # a level above: the rows below it reflects
    commits: tuple[SourceCommit, ...] = ()  # a first level: the raw commits behind the cell
    note: str | None = None  # what could not be traced, and why

    def walk(self, depth: int = 0) -> list[tuple[int, "RowLineage"]]:
        """This row and every row below it, depth first, with their depth."""
        out = [(depth, self)]
        for s in self.sources:
            out += s.walk(depth + 1)
        return out


@dataclass
class _Context:
    engine: Engine
    entity: str
    ledger: LedgerSnapshot
    commit_infos: dict[tuple[str, int], dict] = field(default_factory=dict)


def lineage(engine: Engine, rollup: str, bucket: datetime, entity: str) -> RowLineage:
    """The lineage of `rollup`'s active row of `entity` in the bucket containing `bucket`.

    Raises RowNotFoundError when there is no such row (an unknown entity, or a bucket not
    aggregated), InvalidTimeRangeError for an instant before the rollup's first bucket."""
    spec = engine.catalog.rollup(rollup)
    engine.require_activated(spec)
    at = as_utc(bucket)
    if at < first_bucket_start(spec):
        raise InvalidTimeRangeError(
            f"--bucket {at.isoformat()} is before the first bucket of '{rollup}' "
            f"({first_bucket_start(spec).isoformat()})"
        )
    window = Bucketing.of(spec).window_of(at)
    ctx = _Context(engine, entity, engine.ledger.snapshot())
    found = _trace(ctx, spec, [window], engine.rollups.snapshot(spec))
    if not found:
        raise RowNotFoundError(
            f"'{rollup}' has no row of entity '{entity}' in bucket {window} "
            "(an unknown entity, or a bucket not aggregated yet)"
        )
    return found[0]


def _trace(
    ctx: _Context, spec: RollupSpec, windows: Sequence[Window], snap: Snapshot
) -> list[RowLineage]:
    """The lineage of the entity's rows of `spec` in buckets starting in `windows`, as of
    `snap`, in bucket order."""
    engine = ctx.engine
    rows = engine.rollups.read_arrow(
        spec, windows, frozenset([ctx.entity]), snapshot=snap, columns=ROW_COLUMNS
    )
    rows = rows.sort_by([("bucket_start", "ascending")]).to_pylist()
    out = [
        RowLineage(
            rollup=spec.name,
            entity=ctx.entity,
            bucket=Window(r["bucket_start"], r["bucket_end"]),
            generation=r[GENERATION],
            job_id=r["job_id"],
            run_id=r["run_id"],
            job=ctx.ledger.jobs.get(r["job_id"] or ""),
            source_versions=_versions(r["source_versions"]),
        )
        for r in rows
    ]
    source = engine.catalog.archive(spec.source)
    if isinstance(source, RollupSpec):
        return [_below(ctx, source, row) for row in out]
    return _commits(ctx, source, out)


def _versions(text: str | None) -> dict[str, int]:
    return {k: int(v) for k, v in json.loads(text or "{}").items()}


def _below(ctx: _Context, source: RollupSpec, row: RowLineage) -> RowLineage:
    """`row` with the rows of the level below it reflects (as that level stood when read)."""
    version = row.source_versions.get(source.name)
    if version is None or version < 0:
        return _noted(row, f"no version of '{source.name}' recorded")
    try:
        snap = ctx.engine.rollups.snapshot_of(
            source, version, row.source_versions.get(source.genmap_name)
        )
        below = _trace(ctx, source, [row.bucket], snap)
    except FileNotFoundError as exc:
        return _noted(row, f"'{source.name}' as read is no longer readable ({exc})")
    return replace(row, sources=tuple(below))


def _commits(
    ctx: _Context, source: RawArchiveSpec | TimeRangeArchiveSpec, rows: list[RowLineage]
) -> list[RowLineage]:
    """`rows` (of a first level) with the commits of `source` behind each, up to the version
    each read."""
    versions = [row.source_versions.get(source.name, -1) for row in rows]
    if not rows or max(versions) < 0:
        return rows
    raw = ctx.engine.raw
    try:
        changes, _ = raw.changes(
            source, -1, max(versions), [r.bucket for r in rows], frozenset([ctx.entity])
        )
    except ChangeFeedGone as exc:
        return [
            _noted(r, f"the commits of '{source.name}' are no longer all readable: {exc}")
            for r in rows
        ]
    changes = changes.filter(pc.not_equal(changes[CHANGE_TYPE], pa.scalar("update_preimage")))
    times = changes[source.time_column].to_pylist()
    commit_of = changes[COMMIT_VERSION].to_pylist()
    out = []
    for row, upto in zip(rows, versions, strict=True):
        counts: dict[int, int] = {}
        for t, v in zip(times, commit_of, strict=True):
            if v <= upto and row.bucket.start <= t < row.bucket.end:
                counts[v] = counts.get(v, 0) + 1
        commits = tuple(_commit(ctx, source, v, n) for v, n in sorted(counts.items()))
        out.append(replace(row, commits=commits))
    return out


def _commit(
    ctx: _Context, source: RawArchiveSpec | TimeRangeArchiveSpec, version: int, rows: int
) -> SourceCommit:
    key = (source.name, version)
    info = ctx.commit_infos.get(key)
    if info is None:
        actions = read_commit(ctx.engine.raw.uri(source), version, ctx.engine.raw.options)
        info = ctx.commit_infos[key] = commit_info(actions)
    stamp = info.get("timestamp")
    return SourceCommit(
        archive=source.name,
        version=version,
        committed_at=None if stamp is None else datetime.fromtimestamp(stamp / 1000, UTC),
        operation=info.get("operation"),
        rows=rows,
        metadata={k: str(v) for k, v in info.items() if k.startswith("rollups.")},
    )


def _noted(row: RowLineage, note: str) -> RowLineage:
    return replace(row, note=note)
