"""Parquet data files of Delta tables: writing them (on executors or the driver), and the add
actions that commit them, with per-file statistics from their footers.

Spark executors write a rollup's files straight into the table directory (through `mapInArrow`,
so no listing is needed and object stores work); the driver commits them with delta-rs in one
transaction. Every file, wherever it is written, is described once (`describe_file`) and
committed with `add_action`.
"""

import bisect
import contextlib
import datetime as dt
import json
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake.transaction import AddAction

from rollup_assets.model.windows import Window
from rollup_assets.resources.warehouse import filesystem_for

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
# Rows per Parquet row group in rollup and raw files. Files are sorted by entity, so a read for a
# few entities (a correction's recompute) skips every row group but theirs; scans of whole
# ranges lose little with groups this size.
ROW_GROUP_ROWS = 4_096


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


def describe_file(
    fs: pafs.FileSystem, root: str, rel: str, partition_values: dict[str, str | None]
) -> dict:
    """What an add action needs to know of the file at `root/rel` (just written): its relative
    path (URI-encoded, as the Delta log wants it), size, partition values and stats (JSON), mtime
    (ms) and row count. A plain dict, so executors can return it as a row."""
    with fs.open_input_file(f"{root}/{rel}") as f:
        md = pq.ParquetFile(f).metadata
        size = f.size()
    return describe_written(rel, size, md, partition_values)


def describe_written(
    rel: str, size: int, md: pq.FileMetaData, partition_values: dict[str, str | None]
) -> dict:
    """`describe_file` of a file whose writer still knows its footer (`md`) and size, without
    opening it again."""
    return {
        "path": urllib.parse.quote(rel, safe="/=-_."),
        "size": size,
        "partition_values": json.dumps(partition_values),
        "stats": json.dumps(stats_from_metadata(md)),
        "mtime": int(time.time() * 1000),
        "num_rows": md.num_rows,
    }


def add_action(entry: dict) -> AddAction:
    """The add action committing a file described by `describe_file`."""
    return AddAction(
        path=entry["path"],
        size=int(entry["size"]),
        partition_values=json.loads(entry["partition_values"]),
        modification_time=int(entry["mtime"]),
        data_change=True,
        stats=entry["stats"],
    )


def write_file(
    fs: pafs.FileSystem,
    root: str,
    directory: str,
    data: pa.Table,
    partition_values: dict[str, str | None] | None = None,
    row_group_rows: int | None = ROW_GROUP_ROWS,
) -> dict:
    """Write `data` as a new Parquet file under `root/directory`; its `describe_file` entry (a
    plain dict, so executors can return it as a row; `add_action` makes it an add action)."""
    rel = f"{directory}part-{uuid.uuid4()}.snappy.parquet"
    fs.create_dir(f"{root}/{directory}".rstrip("/"), recursive=True)
    with fs.open_output_stream(f"{root}/{rel}") as out:
        pq.write_table(data, out, compression="snappy", row_group_size=row_group_rows)
    return describe_file(fs, root, rel, partition_values or {})


# ---------------------------------------------------------------------------------------------
# Executor-side writer


def partition_dir(column: str | None, value: str | None) -> str:
    if column is None:
        return ""
    v = "__HIVE_DEFAULT_PARTITION__" if value is None else urllib.parse.quote(value, safe="-_.")
    return f"{column}={v}/"


def build_file_writer(
    table_root: str,
    partition_column: str | None,
    storage_options: dict[str, str] | None = None,
    row_group_rows: int = ROW_GROUP_ROWS,
    filesystem: tuple[pafs.FileSystem, str] | None = None,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A `mapInArrow` function: write each task's rows as Parquet files under `table_root`.

    Rows are routed by `partition_column` (dropped from the files, as Delta expects) to one
    streaming writer per value, flushed every `row_group_rows` rows, so a task holds at most one
    row group per open partition. Sort the frame within partitions first for useful row-group
    statistics. Each task yields one row per file: path (relative, URI-encoded), size, partition
    values (JSON), Delta stats (JSON), mtime (ms) and row count. A task that fails deletes the
    files it wrote (committed nowhere). `filesystem` (the table's, from `filesystem_for`) spares
    a driver that writes many calls' worth of files looking it up for each.
    """

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fs, root = filesystem or filesystem_for(table_root, storage_options)
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

        def close(value: str | None) -> dict:
            """Close the partition's file; its entry, from the footer its writer wrote."""
            writer, sink, rel = open_files[value]
            writer.close()
            size = sink.tell()  # type: ignore[attr-defined]
            sink.close()  # type: ignore[attr-defined]
            parts = {partition_column: value} if partition_column else {}
            return describe_written(rel, size, writer.writer.metadata, parts)

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
            rows = [close(value) for value in list(open_files)]
        except BaseException:
            for writer, sink, rel in open_files.values():
                with contextlib.suppress(Exception):  # the error that ended the task goes on
                    writer.close()
                    sink.close()  # type: ignore[attr-defined]
                with contextlib.suppress(Exception):
                    fs.delete_file(f"{root}/{rel}")
            raise
        if rows:
            yield pa.RecordBatch.from_pylist(rows, schema=WRITTEN_FILES_SCHEMA)

    return write


Targets = Sequence[tuple[Window, frozenset[str] | None]]  # (bucket or span, entities or all)


class TargetIndex:
    """`Targets` ordered by start, to find those overlapping a row group's time range without
    going through all of them (a recompute of thousands of scattered cells reads every row
    group of hundreds of files against them). Build it once for the files of one read."""

    def __init__(self, targets: Targets) -> None:
        self.targets = sorted(targets, key=lambda t: t[0].start)
        self._starts = [w.start for w, _ in self.targets]
        self._longest = max((w.end - w.start for w, _ in self.targets), default=dt.timedelta(0))

    def overlapping(
        self, lo: dt.datetime | None, hi: dt.datetime | None
    ) -> Iterable[tuple[Window, frozenset[str] | None]]:
        """The targets whose window overlaps [lo, hi] (every target when a bound is unknown)."""
        if lo is None or hi is None:
            return self.targets
        try:
            first = bisect.bisect_left(self._starts, lo - self._longest)
        except OverflowError:  # a target without a finite start
            first = 0
        last = bisect.bisect_right(self._starts, hi)
        return (t for t in self.targets[first:last] if t[0].start <= hi and lo < t[0].end)


def targets_of(spans: Sequence[Window] | None, entities: frozenset[str] | None) -> Targets | None:
    """Every span for the same entities (None: no limit at all)."""
    if not spans and entities is None:
        return None
    if not spans:
        return [
            (
                Window(
                    dt.datetime.min.replace(tzinfo=dt.UTC), dt.datetime.max.replace(tzinfo=dt.UTC)
                ),
                entities,
            )
        ]
    return [(w, entities) for w in spans]


def read_row_groups(
    table_uri: str,
    storage_options: dict[str, str] | None,
    path: str,
    columns: Sequence[str] | None,
    time_column: str,
    targets: Targets | TargetIndex | None,
    dictionary: Sequence[str] = (),
) -> pa.Table:
    """The rows of the table's file at `path` (its `columns`); with `targets`, only the row
    groups whose statistics say they may hold a row of one target: `time_column` in its window
    and `entity_id` among its entities (files are sorted by entity, in row groups). Rows are
    not filtered further. A caller reading many files passes a `TargetIndex` built once. A
    column the file predates (added to the table after it was written) reads as nulls (of the
    null type: the caller casts), as Delta reads it. The `dictionary` columns read as the file
    codes them (dictionary arrays, the file's own dictionary), not decoded."""
    fs, root = filesystem_for(table_uri, storage_options)
    with fs.open_input_file(f"{root}/{urllib.parse.unquote(path)}") as fh:
        pf = pq.ParquetFile(fh, read_dictionary=list(dictionary) or None)
        names = pf.schema_arrow.names
        wanted = list(columns) if columns is not None else names
        cols = [c for c in wanted if c in names]
        meta = pf.metadata
        groups = None
        if targets is not None:
            index = targets if isinstance(targets, TargetIndex) else TargetIndex(targets)
            groups = row_groups_for(meta, time_column, index)
        if groups is None or len(groups) == meta.num_row_groups:
            rows = pf.read(columns=cols)
        elif not groups:
            rows = pf.schema_arrow.empty_table().select(cols)
        else:
            rows = pf.read_row_groups(groups, columns=cols)
    if len(cols) == len(wanted):
        return rows
    for c in wanted:
        if c not in names:
            rows = rows.append_column(c, pa.nulls(rows.num_rows))
    return rows.select(wanted)


def row_groups_for(meta: pq.FileMetaData, time_column: str, targets: TargetIndex) -> list[int]:
    """The row groups of a file whose statistics say they may hold a row of one of `targets`."""
    return [
        i for i in range(meta.num_row_groups) if _may_hold(meta.row_group(i), time_column, targets)
    ]


def _may_hold(group: pq.RowGroupMetaData, time_column: str, targets: TargetIndex) -> bool:
    """Could a row group hold a row of one of `targets`, by its statistics?"""
    stats = {}
    for j in range(group.num_columns):
        col = group.column(j)
        if col.path_in_schema in (time_column, "entity_id") and col.statistics is not None:
            st = col.statistics
            if st.has_min_max:
                stats[col.path_in_schema] = (st.min, st.max)
    t_lo = t_hi = e_lo = e_hi = None
    if time_column in stats:
        lo, hi = stats[time_column]
        if isinstance(lo, dt.datetime) and isinstance(hi, dt.datetime):
            t_lo, t_hi = _utc(lo), _utc(hi)
    if "entity_id" in stats:
        lo, hi = stats["entity_id"]
        if isinstance(lo, bytes) and isinstance(hi, bytes):
            lo, hi = lo.decode("utf-8", "replace"), hi.decode("utf-8", "replace")
        if isinstance(lo, str) and isinstance(hi, str):
            e_lo, e_hi = lo, hi
    for _, entities in targets.overlapping(t_lo, t_hi):
        if entities is None or e_lo is None or e_hi is None:
            return True
        if any(e_lo <= e <= e_hi for e in entities):
            return True
    return False


def _utc(t: dt.datetime) -> dt.datetime:
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t
