"""What the commits of a raw or time-range archive changed, read from its Delta log and its change
data feed: the one reader behind change detection (`change_feed.read_changes`) and behind the
row changes corrections, held writes and lineage read (`row_changes`).

A commit's row changes are its change files' rows where it has them (a MERGE that rewrote whole
files changed only those), otherwise the rows of the files it added (inserts) and removed
(deletes), as the change data feed defines; a commit that deleted rows through deletion vectors
has neither, and delta-rs derives its changes. Commits that change no row (compaction, vacuum,
checkpoints) and retention commits (old rows dropped on purpose, which the rollups keep) have
none. A columns commit (the switch to new formulas) rewrites every row but changes no reading:
detection queues a recompute of a re-formulated column instead, and row changes cannot be read
across it.
"""

import datetime as dt
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.exceptions import DeltaError

from rollup_assets.compute.window_bounds import WindowBounds
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.operations import OPERATION_KEY, Operation, is_data_change
from rollup_assets.model.specs import DAY_COLUMN, SourceSpec
from rollup_assets.model.windows import Window, merge_windows
from rollup_assets.resources.delta_tables import commit_info, read_commit
from rollup_assets.resources.raw_columns import formula_changed
from rollup_assets.resources.raw_tables import RawTables
from rollup_assets.resources.readers import read_ahead
from rollup_assets.resources.rollup_table import in_windows
from rollup_assets.resources.schemas import archive_data_schema
from rollup_assets.resources.warehouse import filesystem_for

# The change data feed's columns: what a row change was, and the commit that made it.
CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
# Change rows read before those outside the asked spans and entities are dropped: many small
# change files are filtered as one table, a commit's large data files a million rows at a time.
_KEPT_ROWS = 1_000_000


class ChangeFeedGone(Exception):
    """The change feed no longer reaches back to a version (log cleaned up, files vacuumed)."""


@dataclass(frozen=True)
class SourceCommit:
    """One commit of a source table, as its log records it."""

    version: int
    actions: list[dict]
    info: dict  # its commit info (`delta_tables.commit_info`)

    @property
    def change_files(self) -> list[dict]:
        """The bodies of its `cdc` actions."""
        return [a["cdc"] for a in self.actions if "cdc" in a]

    @property
    def changes_rows(self) -> bool:
        """Could it change rows the rollups aggregate (`operations.is_data_change`)?"""
        return is_data_change(self.info, writes_change_files=bool(self.change_files))

    @property
    def switches_columns(self) -> bool:
        """Is it the switch to new computed columns (`raw_columns.rewrite_columns`)?"""
        return self.info.get(OPERATION_KEY) == Operation.COLUMNS

    @property
    def formula_of(self) -> str | None:
        """The column whose formula it changed, if it is such a commit."""
        return formula_changed(self.info)

    @property
    def committed_at(self) -> dt.datetime | None:
        """When it was made (its commit info's timestamp; None when the log does not say)."""
        at = self.info.get("timestamp")
        return None if at is None else dt.datetime.fromtimestamp(int(at) / 1000, tz=dt.UTC)

    @property
    def change_source(self) -> ChangeSource | None:
        """The change source its writer recorded (None: none, or one this project lacks)."""
        source = self.info.get("rollups.change_source")
        if isinstance(source, str) and source in ChangeSource._value2member_map_:
            return ChangeSource(source)
        return None

    @property
    def time_range(self) -> tuple[dt.datetime, dt.datetime] | None:
        """The first and last time of the rows it changed, as this project's commits record
        them (None for a commit that records none)."""
        lo, hi = self.info.get("rollups.min_ts"), self.info.get("rollups.max_ts")
        if lo is None or hi is None:
            return None
        return dt.datetime.fromisoformat(lo), dt.datetime.fromisoformat(hi)

    @property
    def data_files(self) -> list[dict]:
        """The bodies of its actions that change data: the files it added and removed, and its
        change files."""
        return [
            body
            for action in self.actions
            for kind, body in action.items()
            if kind == "cdc" or (kind in ("add", "remove") and body.get("dataChange", True))
        ]

    @property
    def changed_files(self) -> list[tuple[dict, str | None]]:
        """The files holding its row changes, each with the change type of its every row (None
        for a change file, whose rows carry their own)."""
        cdc = self.change_files
        if cdc:
            return [(body, None) for body in cdc]
        return [
            (a[kind], "insert" if kind == "add" else "delete")
            for a in self.actions
            for kind in ("add", "remove")
            if kind in a and a[kind].get("dataChange", True)
        ]


def read_source_commit(tables: RawTables, spec: SourceSpec, version: int) -> SourceCommit:
    """Commit `version` of the archive's table; ChangeFeedGone when its log no longer holds it."""
    try:
        actions = read_commit(tables.uri(spec), version, tables.options)
    except FileNotFoundError:
        raise ChangeFeedGone(
            f"'{spec.name}': commit {version} is no longer in the table's log"
        ) from None
    return SourceCommit(version, actions, commit_info(actions))


def rows_changed_by(
    tables: RawTables,
    spec: SourceSpec,
    commit: SourceCommit,
    schema: pa.Schema,
    spans: Sequence[Window] | WindowBounds | None = None,
) -> Iterable[pa.Table]:
    """The row changes of `commit` (one table per file it read): the columns of `schema` (of
    the archive's columns as stored) and `CHANGE_TYPE`. With `spans` (merged), only the files
    of UTC days that may hold rows in them are read. Raises ChangeFeedGone when a file it names
    is no longer there."""
    files = commit.changed_files
    bounds = WindowBounds.of(spans) if isinstance(spans, Sequence) else spans
    if not commit.change_files and any(body.get("deletionVector") for body, _ in files):
        # Rows deleted through deletion vectors: the commit has no change files, and its files
        # read whole would hold the deleted rows.
        return [_derived_changes(tables, spec, commit.version, schema)]
    wanted = [
        (b["path"], kind) for b, kind in files if bounds is None or _day_may_overlap(b, bounds)
    ]
    # Side by side: a wave of late readings touches hundreds of small change files, each
    # costing an open and a footer more than its rows; a few at a time, as a caller may keep
    # only some rows of each.
    return read_ahead(lambda f: _read_change_file(tables, spec, f[0], f[1], schema), wanted)


def row_changes(
    tables: RawTables,
    spec: SourceSpec,
    after: int,
    upto: int,
    spans: Sequence[Window],
    entities: frozenset[str] | None,
) -> tuple[pa.Table, int]:
    """Every row change committed after version `after` up to `upto` to rows whose time
    falls in `spans` (and entity in `entities`): the archive's columns, `CHANGE_TYPE`
    (insert, delete, update_preimage, update_postimage) and `COMMIT_VERSION`; and how many
    change rows were read to find them.

    Commits that change no row, commits of this project's ingests outside `spans` (their time
    range is in the commit) and retention commits are skipped. Raises ChangeFeedGone when a
    commit or a file it names is no longer there, or when a columns commit is among them.
    """
    commits: list[SourceCommit] = []
    for version in range(after + 1, upto + 1):
        commit = read_source_commit(tables, spec, version)
        if commit.switches_columns:
            # The stored partials predate new formulas: changes cannot bring them up to date.
            raise ChangeFeedGone(f"'{spec.name}': its computed columns changed at {version}")
        commits.append(commit)
    merged = merge_windows(list(spans))
    bounds = WindowBounds.of(merged)
    stored = archive_data_schema(spec)
    schema = archive_data_schema(tables.applied(spec))
    out_schema = schema.append(pa.field(CHANGE_TYPE, pa.string())).append(
        pa.field(COMMIT_VERSION, pa.int64())
    )
    wanted = None if entities is None else pa.array(sorted(entities), pa.string())

    def kept(files: list[pa.Table], version: int) -> pa.Table:
        rows = pa.concat_tables(files)
        mask = in_windows(rows[spec.time_column], bounds)
        if wanted is not None:
            mask = pc.and_(mask, pc.is_in(rows["entity_id"], value_set=wanted))
        rows = rows.filter(mask)
        rows = rows.append_column(COMMIT_VERSION, pa.repeat(pa.scalar(version), rows.num_rows))
        return rows.select(out_schema.names).cast(out_schema)

    parts: list[pa.Table] = []
    read = 0
    for commit in commits:
        if not commit.changes_rows:
            continue
        recorded = commit.time_range
        if recorded is not None:
            first, last = recorded
            if not any(first < w.end and w.start <= last for w in merged):
                continue
        # A wave of late readings is hundreds of change files of a few rows: they are kept or
        # dropped together, up to `_KEPT_ROWS` rows at a time (a commit of whole data files,
        # such as a first ingest, is filtered as it is read).
        held: list[pa.Table] = []
        count = 0
        for rows in rows_changed_by(tables, spec, commit, stored, bounds):
            read += rows.num_rows
            held.append(rows)
            count += rows.num_rows
            if count >= _KEPT_ROWS:
                parts.append(kept(held, commit.version))
                held, count = [], 0
        if held:
            parts.append(kept(held, commit.version))
    parts = [p for p in parts if p.num_rows]
    return (pa.concat_tables(parts) if parts else out_schema.empty_table()), read


def change_file_rows(tables: RawTables, spec: SourceSpec, cdc: list[dict]) -> int:
    """Rows in the change files of `cdc` actions (their footers only)."""
    fs, root = filesystem_for(tables.uri(spec), tables.options)

    def rows(body: dict) -> int:
        with fs.open_input_file(f"{root}/{urllib.parse.unquote(body['path'])}") as fh:
            return pq.ParquetFile(fh).metadata.num_rows

    return sum(read_ahead(rows, cdc))


def _derived_changes(
    tables: RawTables, spec: SourceSpec, version: int, schema: pa.Schema
) -> pa.Table:
    """The row changes of commit `version`, derived by delta-rs, with `schema`'s columns and
    `CHANGE_TYPE`."""
    table = tables.table(spec)
    if table is None:
        raise ChangeFeedGone(f"'{spec.name}': its table is gone")
    try:
        data = pa.table(table.load_cdf(starting_version=version, ending_version=version))
    except DeltaError as exc:
        raise ChangeFeedGone(f"'{spec.name}': commit {version}'s changes: {exc}") from None
    kinds = data[CHANGE_TYPE].cast(pa.string())
    return data.select(schema.names).cast(schema).append_column(CHANGE_TYPE, kinds)


def _read_change_file(
    tables: RawTables, spec: SourceSpec, path: str, change_type: str | None, schema: pa.Schema
) -> pa.Table:
    """One change file (its `CHANGE_TYPE` column), or a data file whose every row had
    `change_type`, with `schema`'s columns."""
    fs, root = filesystem_for(tables.uri(spec), tables.options)
    names = [*schema.names, *([CHANGE_TYPE] if change_type is None else [])]
    try:
        with fs.open_input_file(f"{root}/{urllib.parse.unquote(path)}") as fh:
            data = pq.read_table(fh, columns=names)
    except FileNotFoundError:
        raise ChangeFeedGone(f"'{spec.name}': file {path} is no longer there") from None
    kinds = (
        data[CHANGE_TYPE].cast(pa.string())
        if change_type is None
        else pa.array([change_type] * data.num_rows, pa.string())
    )
    return data.select(schema.names).cast(schema).append_column(CHANGE_TYPE, kinds)


def _day_may_overlap(body: dict, bounds: WindowBounds) -> bool:
    """Could a file of the UTC-day partition in `body` hold rows in `bounds`?"""
    day = (body.get("partitionValues") or {}).get(DAY_COLUMN)
    if not day:
        return True
    d0 = dt.datetime.combine(dt.date.fromisoformat(day), dt.time(0), tzinfo=dt.UTC)
    return bounds.overlaps(d0, d0 + dt.timedelta(days=1))
