"""Low-level Delta plumbing: executor-side Parquet writers, file stats, commits, log reads.

Spark executors write Parquet files straight into the table directory (through `mapInArrow`,
so no listing is needed and object stores work); the driver then commits them with delta-rs in
one transaction that carries per-file statistics. Nothing here collects table rows to the driver.
"""

import datetime as dt
import json
import logging
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from resources.warehouse import filesystem_for

log = logging.getLogger(__name__)

TABLE_CONFIGURATION = {"delta.checkpointInterval": "10"}
WRITTEN_FILES_SCHEMA = pa.schema(
    [
        ("path", pa.string()),
        ("size", pa.int64()),
        ("partition_values", pa.string()),
        ("stats", pa.string()),
        ("mtime", pa.int64()),
        ("num_rows", pa.int64()),
    ]
)
WRITTEN_FILES_DDL = (
    "path string, size long, partition_values string, stats string, mtime long, num_rows long"
)


# ---------------------------------------------------------------------------------------------
# Statistics


def _stat_value(v: object, is_max: bool = False) -> object:
    if v is None:
        return None
    if isinstance(v, dt.datetime):
        # Delta stats carry milliseconds: floor the min, ceil the max, so pruning stays safe.
        extra = v.microsecond % 1000
        if extra:
            v = (
                v
                - dt.timedelta(microseconds=extra)
                + (dt.timedelta(milliseconds=1) if is_max else dt.timedelta())
            )
        if v.tzinfo is None:
            v = v.replace(tzinfo=dt.UTC)
        return v.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    if isinstance(v, dt.date):
        return v.isoformat()
    if isinstance(v, bytes):
        return None
    if isinstance(v, float) and v != v:
        return None
    return v


def stats_from_metadata(md: pq.FileMetaData, skip: Sequence[str] = (), max_str: int = 64) -> dict:
    """Delta `stats` JSON (numRecords, minValues, maxValues, nullCount) from a Parquet footer."""
    mins: dict[str, object] = {}
    maxs: dict[str, object] = {}
    nulls: dict[str, int] = {}
    arrow_schema = md.schema.to_arrow_schema()
    for ci in range(md.num_columns):
        name = md.schema.column(ci).path
        if "." in name or name in skip:
            continue
        typ = arrow_schema.field(name).type
        lo = hi = None
        ncount = 0
        complete = True
        for rg in range(md.num_row_groups):
            st = md.row_group(rg).column(ci).statistics
            if st is None or not st.has_null_count:
                complete = False
                break
            ncount += st.null_count
            if st.has_min_max:
                a, b = st.min, st.max
                if pa.types.is_timestamp(typ) and isinstance(a, int):
                    a, b = pa.scalar(a, typ).as_py(), pa.scalar(b, typ).as_py()
                lo = a if lo is None or a < lo else lo
                hi = b if hi is None or b > hi else hi
        if not complete:
            continue
        nulls[name] = ncount
        if lo is None or (isinstance(lo, str) and (len(lo) > max_str or len(str(hi)) > max_str)):
            continue
        fmin, fmax = _stat_value(lo), _stat_value(hi, is_max=True)
        if fmin is not None and fmax is not None:
            mins[name], maxs[name] = fmin, fmax
    return {"numRecords": md.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}


# ---------------------------------------------------------------------------------------------
# Executor-side writer


def partition_dir(column: str | None, value: str | None) -> str:
    if column is None:
        return ""
    v = "__HIVE_DEFAULT_PARTITION__" if value is None else urllib.parse.quote(value, safe="-_.")
    return f"{column}={v}/"


# Rows per Parquet row group in rollup and raw files. Files are sorted by entity, so a read for a
# few entities (a correction's recompute) skips every row group but theirs; scans of whole
# ranges lose little with groups this size.
ROW_GROUP_ROWS = 4_096


def build_file_writer(
    table_root: str,
    partition_column: str | None,
    storage_options: dict[str, str] | None = None,
    row_group_rows: int = ROW_GROUP_ROWS,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A `mapInArrow` function: write each task's rows as Parquet files under `table_root`.

    Rows are routed by `partition_column` (dropped from the files, as Delta expects) to one
    streaming writer per value, flushed every `row_group_rows` rows, so a task holds at most one
    row group per open partition. Sort the frame within partitions first for useful row-group
    statistics. Each task yields one row per file: path (relative, URI-encoded), size, partition
    values (JSON), Delta stats (JSON), mtime (ms) and row count.
    """

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fs, root = filesystem_for(table_root, storage_options)
        open_files: dict[str | None, tuple[pq.ParquetWriter, object, str]] = {}
        pending: dict[str | None, list[pa.Table]] = {}
        counts: dict[str | None, int] = {}

        def flush(value: str | None) -> None:
            parts = pending.pop(value, [])
            counts[value] = 0
            if not parts:
                return
            data = pa.concat_tables(parts)
            if value not in open_files:
                rel = partition_dir(partition_column, value) + f"part-{uuid.uuid4()}.snappy.parquet"
                path = f"{root}/{rel}"
                fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
                sink = fs.open_output_stream(path)
                open_files[value] = (
                    pq.ParquetWriter(sink, data.schema, compression="snappy"),
                    sink,
                    rel,
                )
            open_files[value][0].write_table(data, row_group_size=row_group_rows)

        try:
            for rb in batches:
                if rb.num_rows == 0:
                    continue
                tbl = pa.Table.from_batches([rb])
                if partition_column is None:
                    groups = [(None, tbl)]
                else:
                    col = tbl.column(partition_column)
                    groups = []
                    for value in pc.unique(col).to_pylist():
                        mask = pc.equal(col, value) if value is not None else pc.is_null(col)
                        groups.append((value, tbl.filter(mask).drop_columns([partition_column])))
                for value, part in groups:
                    pending.setdefault(value, []).append(part)
                    counts[value] = counts.get(value, 0) + part.num_rows
                    if counts[value] >= row_group_rows:
                        flush(value)
            for value in list(pending):
                flush(value)
        finally:
            for writer, sink, _ in open_files.values():
                writer.close()
                sink.close()  # type: ignore[attr-defined]
        rows = []
        for value, (_, _, rel) in open_files.items():
            with fs.open_input_file(f"{root}/{rel}") as f:
                md = pq.ParquetFile(f).metadata
                size = f.size()
            pv = {partition_column: value} if partition_column else {}
            rows.append(
                {
                    "path": urllib.parse.quote(rel, safe="/=-_."),
                    "size": size,
                    "partition_values": json.dumps(pv),
                    "stats": json.dumps(stats_from_metadata(md)),
                    "mtime": int(time.time() * 1000),
                    "num_rows": md.num_rows,
                }
            )
        if rows:
            yield pa.RecordBatch.from_pylist(rows, schema=WRITTEN_FILES_SCHEMA)

    return write


def add_actions_from_rows(rows: Sequence[dict]) -> list[AddAction]:
    return [
        AddAction(
            path=r["path"],
            size=int(r["size"]),
            partition_values=json.loads(r["partition_values"]),
            modification_time=int(r["mtime"]),
            data_change=True,
            stats=r["stats"],
        )
        for r in rows
    ]


# ---------------------------------------------------------------------------------------------
# Tables and commits


def open_table(
    uri: str, storage_options: dict[str, str] | None = None, version: int | None = None
) -> DeltaTable | None:
    """The table at `uri`, or None if there is none yet."""
    try:
        return DeltaTable(uri, version=version, storage_options=storage_options or None)
    except TableNotFoundError:
        return None


def commit_file(root: str, version: int) -> str:
    return f"{root}/_delta_log/{version:020d}.json"


def committed_after(
    uri: str, version: int | None, storage_options: dict[str, str] | None = None
) -> bool:
    """Has the table at `uri` a commit after `version` (None: has it been created)?

    One existence check of the next commit file, instead of opening the table again.
    """
    fs, root = filesystem_for(uri, storage_options)
    return _exists(fs, commit_file(root, 0 if version is None else version + 1))


T = TypeVar("T")


class LatestCache(Generic[T]):
    """Something derived from a small Delta table's latest version, derived again only when the
    table has moved.

    A hit costs two file stats: the cached version's commit file is unchanged (the same table,
    not one re-created at the location since) and no next commit exists. A Delta version never
    changes once written, so a hit returns exactly what reading the table would.
    """

    def __init__(self, derive: Callable[[DeltaTable], T]) -> None:
        self._derive = derive
        self._entries: dict[str, tuple[int, tuple[int | None, int | None], T]] = {}
        self._lock = threading.Lock()

    def get(self, uri: str, storage_options: dict[str, str] | None = None) -> tuple[T, int] | None:
        """(derived value, version) of the table's latest version; None if there is no table."""
        fs, root = filesystem_for(uri, storage_options)
        with self._lock:
            entry = self._entries.get(uri)
        if entry is not None:
            version, stamp, value = entry
            if _stamp(fs, commit_file(root, version)) == stamp and not _exists(
                fs, commit_file(root, version + 1)
            ):
                return value, version
        table = open_table(uri, storage_options)
        if table is None:
            return None
        version = table.version()
        value = self._derive(table)
        stamp = _stamp(fs, commit_file(root, version))
        with self._lock:
            self._entries[uri] = (version, stamp, value)
        return value, version


def _stamp(fs: pafs.FileSystem, path: str) -> tuple[int | None, int | None]:
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        return None, None
    return info.mtime_ns, info.size


def _exists(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def nullable_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_nullable(True) for f in schema])


@dataclass(frozen=True)
class CommitPlan:
    """What one Delta commit adds and removes. Built fresh from the snapshot on each attempt."""

    adds: Sequence[AddAction]
    removes: Sequence[RemoveAction] = ()


def commit(
    uri: str,
    plan: Callable[[DeltaTable | None], CommitPlan],
    *,
    schema: pa.Schema,
    partition_by: Sequence[str] = (),
    metadata: dict[str, str] | None = None,
    storage_options: dict[str, str] | None = None,
    app_txn: tuple[str, int] | None = None,
    attempts: int = 8,
) -> int:
    """Commit `plan(snapshot)` in one transaction, creating the table if needed; return its version.

    `plan` is called again with a fresh snapshot after a conflict, so removals always refer to
    files that still exist. With `app_txn=(app_id, version)` the commit is a compare-and-set:
    a concurrent commit carrying the same app id makes this one fail and retry.
    """
    props = CommitProperties(
        custom_metadata=metadata,
        app_transactions=[Transaction(app_txn[0], app_txn[1])] if app_txn else None,
    )
    for attempt in range(attempts):
        table = open_table(uri, storage_options)
        p = plan(table)
        actions: list[AddAction | RemoveAction] = [*p.removes, *p.adds]
        if table is not None and not actions:
            return table.version()  # nothing to change: no empty commit
        try:
            if table is None:
                create_table_with_add_actions(
                    uri,
                    DeltaSchema.from_arrow(nullable_schema(schema)),
                    list(p.adds),
                    mode="error",
                    partition_by=list(partition_by) or None,
                    configuration=TABLE_CONFIGURATION,
                    commit_properties=props,
                    storage_options=storage_options or None,
                )
                created = open_table(uri, storage_options)
                assert created is not None
                return created.version()
            table.create_write_transaction(
                actions,
                mode="append",
                schema=table.schema(),
                partition_by=list(partition_by) or None,
                commit_properties=props,
            )
            table.update_incremental()
            return table.version()
        except (CommitFailedError, DeltaError) as exc:
            retryable = isinstance(exc, CommitFailedError) or (
                table is None and "already exists" in str(exc).lower()
            )
            if not retryable or attempt == attempts - 1:
                raise
            log.debug("commit to %s conflicted (%s); retrying with a fresh snapshot", uri, exc)
            time.sleep(0.02 * 2**attempt)
    raise AssertionError("unreachable")


def remove_action(add: dict, now_ms: int | None = None) -> RemoveAction:
    """A RemoveAction for a row of `DeltaTable.get_add_actions(flatten=True)`."""
    pv = {k.split(".", 1)[1]: _pv_string(v) for k, v in add.items() if k.startswith("partition.")}
    return RemoveAction(
        path=add["path"],
        data_change=True,
        deletion_timestamp=now_ms or int(time.time() * 1000),
        size=int(add["size_bytes"]),
        partition_values=pv,
    )


def _pv_string(v: object) -> str | None:
    if v is None:
        return None
    if isinstance(v, dt.datetime):
        return v.strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(v, dt.date):
        return v.isoformat()
    return str(v)


def file_actions(table: DeltaTable) -> list[dict]:
    """Every live file of the snapshot with its stats.

    Keys: `min.<col>`, `max.<col>`, `partition.<col>`.
    """
    return pa.table(table.get_add_actions(flatten=True)).to_pylist()


def read_commit(
    uri: str, version: int, storage_options: dict[str, str] | None = None
) -> list[dict]:
    """The actions of one commit, parsed from `_delta_log/<version>.json`."""
    fs, root = filesystem_for(uri, storage_options)
    path = f"{root}/_delta_log/{version:020d}.json"
    with fs.open_input_stream(path) as f:
        text = f.read().decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]
