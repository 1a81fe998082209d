"""What each commit of a source table changed, as change detection reads it, from the best
evidence the table has.

The changed rows come from the change data feed, read as every reader of it reads it
(`commit_changes`: inserts, deletes, and both images of an update), here only their keys; for
a table without CDF, or a commit too large to read row by row, from the per-file time
statistics of the files it added and removed (an over-approximation). Commits that change no
row (compaction, vacuum, checkpoints) are skipped, and so are retention deletes (old rows
dropped on purpose, which the rollups keep).
"""

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pyarrow as pa

from rollup_assets.compute.arrow_types import TS
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.specs import ENTITY_COLUMN, RollupSpec, SourceSpec
from rollup_assets.model.windows import Window
from rollup_assets.resources.commit_changes import (
    change_file_rows,
    read_source_commit,
    rows_changed_by,
)
from rollup_assets.resources.delta_tables import open_table
from rollup_assets.resources.raw_store import RawStore
from rollup_assets.resources.raw_tables import RawTables
from rollup_assets.resources.rollup_store import RollupStore
from rollup_assets.resources.schemas import archive_data_schema


@dataclass
class Changes:
    """The rows (or the file-level ranges) one commit changed."""

    version: int
    change_source: ChangeSource | None
    rows: pa.Table | None = None  # entity_id, ts
    ranges: list[tuple[datetime, datetime, str | None]] = field(
        default_factory=list
    )  # min, max, entity
    # A computed column whose formula the commit changed: every value of it changed.
    formula_of: str | None = None
    # When the commit was made (its commit info's timestamp; None when the log does not say).
    committed_at: datetime | None = None


class SourceLog:
    """The newest version of a source table, and whether commits since a version reached a
    window: what the forward planner asks before refreshing an open bucket."""

    def __init__(self, raw: RawStore, rollups: RollupStore) -> None:
        self.raw = raw
        self.rollups = rollups

    def version(self, spec: SourceSpec | RollupSpec) -> int | None:
        uri = self.rollups.uri(spec) if isinstance(spec, RollupSpec) else self.raw.uri(spec)
        table = open_table(uri, self.raw.options)
        return None if table is None else table.version()

    def changed_within(self, spec: SourceSpec, after: int, window: Window) -> bool:
        return self.raw.changed_within(spec, after, window)


class ChangeFeed:
    """Reads source commits for change detection (delta-rs only: no Spark)."""

    def __init__(
        self,
        raw: RawStore,
        max_cdf_rows: int,
        removed: Callable[[SourceSpec], list[Window]] = lambda _spec: [],
    ) -> None:
        self.raw = raw
        self.max_cdf_rows = max_cdf_rows
        self._removed = removed

    def removed_spans(self, spec: SourceSpec) -> list[Window]:
        """The time ranges whose rows retention removed (`Engine.removed_spans`)."""
        return self._removed(spec)

    def latest_version(self, spec: SourceSpec) -> int | None:
        table = self.raw.table(spec)
        return None if table is None else table.version()

    def table_id(self, spec: SourceSpec) -> str | None:
        table = self.raw.table(spec)
        return None if table is None else str(table.metadata().id)

    def changes(self, spec: SourceSpec, version: int) -> "Changes | None":
        """What commit `version` changed, or None for a commit without data change."""
        return read_changes(self.raw, spec, version, self.max_cdf_rows)


def read_changes(
    raw: RawTables, spec: SourceSpec, version: int, max_cdf_rows: int
) -> Changes | None:
    """What commit `version` of a source table changed, or None for a commit without data change."""
    commit = read_source_commit(raw, spec, version)
    if not commit.changes_rows:
        return None
    committed_at = commit.committed_at
    if commit.switches_columns:
        # The table switched to new formulas: no row is an insert or a delete, but every value
        # of a re-formulated column changed (an added or removed column changes no rollup).
        column = commit.formula_of
        return (
            None
            if column is None
            else Changes(version, None, formula_of=column, committed_at=committed_at)
        )
    data = commit.data_files
    if not data:
        return None
    change_source = commit.change_source
    time_col = spec.time_column
    cdc = commit.change_files
    # The rows the change feed holds for this commit: its change files' rows when it has them
    # (a MERGE that rewrote whole files changed only those), otherwise the files it added and
    # removed (every row of which is an insert or a delete).
    try:
        estimate = change_file_rows(raw, spec, cdc) if cdc else sum(map(_num_records, data))
    except FileNotFoundError:  # change files vacuumed: the file statistics still tell
        estimate = max_cdf_rows + 1
    table = raw.table(spec)
    cdf = (
        table is not None
        and table.metadata().configuration.get("delta.enableChangeDataFeed") == "true"
    )
    if cdf and estimate <= max_cdf_rows:
        stored = archive_data_schema(spec)
        keys = pa.schema([stored.field(ENTITY_COLUMN), stored.field(time_col)])
        changed = [t.select(keys.names) for t in rows_changed_by(raw, spec, commit, keys)]
        rows = pa.concat_tables(changed or [keys.empty_table()])
        rows = rows.rename_columns([ENTITY_COLUMN, "ts"])
        rows = rows.cast(pa.schema([(ENTITY_COLUMN, pa.string()), ("ts", TS)]))
        return Changes(version, change_source, rows=rows, committed_at=committed_at)
    ranges = [_file_range(raw, spec, version, body, time_col) for body in data]
    return Changes(version, change_source, ranges=ranges, committed_at=committed_at)


def _file_range(
    raw: RawTables,
    spec: SourceSpec,
    version: int,
    body: dict,
    time_col: str,
) -> tuple[datetime, datetime, str | None]:
    """The time range (and entity, if single) a changed file covers, from the best evidence:
    its own stats, its UTC-day partition, or its stats in the snapshot it was removed from."""
    stats = _stats(body)
    if not stats and "deletionTimestamp" in body:
        stats = _stats_before(raw, spec, version, body["path"])
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


def _stats_before(raw: RawTables, spec: SourceSpec, version: int, path: str) -> dict:
    table = raw.table(spec, version=version - 1)
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
