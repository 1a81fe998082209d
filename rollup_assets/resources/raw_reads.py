"""Reads of a raw or time-range archive's rows, pruned to the files and row groups that may
hold them: with Spark, on the driver with Arrow, and the stored rows an upsert matches."""

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from rollup_assets.compute.filters import rows_within
from rollup_assets.compute.key_index import rows_with_keys
from rollup_assets.model.cells import Cells
from rollup_assets.model.specs import (
    DAY_COLUMN,
    ENTITY_COLUMN,
    RawArchiveSpec,
    SourceSpec,
    TimeRangeArchiveSpec,
    key_columns,
)
from rollup_assets.model.windows import Window, merge_windows
from rollup_assets.resources.delta_files import TargetIndex, Targets, read_row_groups, targets_of
from rollup_assets.resources.delta_tables import file_actions, prune_files, refuse_deletion_vectors
from rollup_assets.resources.latest_versions import LatestCache
from rollup_assets.resources.raw_tables import RawTables
from rollup_assets.resources.rollup_table import in_windows
from rollup_assets.resources.schemas import archive_data_schema, archive_schema, spark_schema
from rollup_assets.resources.warehouse import data_file_uri, spark_uri

_DAY = dt.timedelta(days=1)
_LAST_DAYS = (dt.datetime.max - 2 * _DAY).date()  # later days: no window ends after them


def _utc_midnight(day: dt.date) -> dt.datetime:
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC)


def files_for(
    table: DeltaTable,
    spec: SourceSpec,
    spans: Sequence[Window] | None,
    entities: frozenset[str] | None,
) -> list[dict]:
    """Live files that may hold rows whose time falls in `spans` (partition day + stats);
    UnsupportedTableFeatureError when one of them has rows deleted by a deletion vector."""
    files = _pruned(file_actions(table, deletion_vectors="mark"), spec, spans, entities)
    refuse_deletion_vectors(table, table.version(), files)
    return files


def _pruned(
    files: list[dict],
    spec: SourceSpec,
    spans: Sequence[Window] | None,
    entities: frozenset[str] | None,
) -> list[dict]:
    return prune_files(
        files, time_column=spec.time_column, spans=spans, entities=entities, day_column=DAY_COLUMN
    )


@dataclass(frozen=True)
class LatestFiles:
    """A raw table's live files at one version (`file_actions`, deletion vectors marked)."""

    uri: str
    version: int
    files: tuple[dict, ...]

    @classmethod
    def of(cls, table: DeltaTable) -> "LatestFiles":
        marked = file_actions(table, deletion_vectors="mark")
        return cls(table.table_uri, table.version(), tuple(marked))


# Each raw table's latest files, listed again only when the table has moved: a read of its
# newest rows (a real-time read's live buckets) between ingests replays no log.
_LATEST: LatestCache[LatestFiles] = LatestCache(LatestFiles.of)


def latest_files_for(
    tables: RawTables,
    spec: SourceSpec,
    spans: Sequence[Window] | None,
    entities: frozenset[str] | None,
) -> tuple[list[dict], int] | None:
    """`files_for` the table's latest version, and that version (None: no table)."""
    latest = _LATEST.get(tables.uri(spec), tables.options)
    if latest is None:
        return None
    state = latest[0]
    files = _pruned(list(state.files), spec, spans, entities)
    refuse_deletion_vectors(state.uri, state.version, files)
    return files, state.version


def read_spark(
    tables: RawTables,
    spark: SparkSession,
    spec: SourceSpec,
    spans: Sequence[Window] | None = None,
    entities: frozenset[str] | None = None,
    table: DeltaTable | None = None,
) -> tuple[DataFrame, int | None]:
    """Rows whose time falls in `spans` (and entity in `entities`), and the version read."""
    table = table or tables.table(spec)
    schema = spark_schema(archive_data_schema(spec))
    if table is None:
        return spark.createDataFrame([], schema), None
    files = files_for(table, spec, spans, entities)
    if not files:
        return spark.createDataFrame([], schema), table.version()
    root = tables.uri(spec)
    df = spark.read.schema(schema).parquet(
        *[spark_uri(data_file_uri(root, f["path"])) for f in files]
    )
    df = rows_within(df, spec.time_column, spans, entities)
    return df, table.version()


def read_rows(
    tables: RawTables,
    spec: SourceSpec,
    spans: Sequence[Window],
    entities: frozenset[str] | None,
    table: DeltaTable | None = None,
    cells: Cells | None = None,
) -> tuple[pa.Table, int | None]:
    """On the driver: rows whose time falls in `spans` (and entity in `entities`), and the
    version read (of `table` when given). Only the files and row groups whose statistics
    may hold such rows (of `cells`, when given) are read: a few cells' rows cost about a row
    group each, not the cross product of their buckets and entities."""
    schema = archive_data_schema(spec)
    if table is not None:
        files, version = files_for(table, spec, spans, entities), table.version()
    else:
        latest = latest_files_for(tables, spec, spans, entities)
        if latest is None:
            return schema.empty_table(), None
        files, version = latest
    listed = list(cells) if cells is not None else targets_of(spans, entities)
    targets = None if listed is None else TargetIndex(listed)
    parts = [_read_file(tables, spec, f, targets) for f in files]
    data = pa.concat_tables(
        [p.select(schema.names).cast(schema) for p in parts] or [schema.empty_table()]
    )
    mask = in_windows(data[spec.time_column], spans)
    if entities is not None:
        wanted = pa.array(sorted(entities), pa.string())
        mask = pc.and_(mask, pc.is_in(data["entity_id"], value_set=wanted))
    return data.filter(mask), version


def stored_rows_of(
    tables: RawTables,
    spec: RawArchiveSpec | TimeRangeArchiveSpec,
    batch: pa.RecordBatch | pa.Table,
    files: list[dict],
    values: Sequence[str] | None = None,
) -> pa.Table:
    """The stored rows with the keys of `batch` rows (their key columns and `values`; None:
    every column), from the live `files` of the snapshot it upserts into. Only the row
    groups that may hold one of its (UTC day, entity) cells are read, and each file's rows
    are narrowed to the batch's keys as it is read, so a batch of scattered late rows holds
    about its own size, not every row between its first and last instant. Reads files with
    Arrow only (it runs inside a MERGE's input stream, where delta-rs cannot be called)."""
    schema = archive_data_schema(spec)
    key_names = key_columns(spec)
    if values is not None:
        schema = pa.schema([schema.field(n) for n in [*key_names, *values]])
    if not files or batch.num_rows == 0:
        return schema.empty_table()
    wanted_keys = pa.table({k: batch.column(k) for k in key_names}).cast(
        pa.schema([schema.field(k) for k in key_names])
    )

    def read(f: dict, targets: TargetIndex | None) -> pa.Table:
        data = _read_file(tables, spec, f, targets, schema.names)
        return rows_with_keys(data.select(schema.names).cast(schema), wanted_keys, key_names)

    keys = (
        pa.table(
            {
                "day": pc.cast(batch.column(spec.time_column), pa.date32()),
                "entity": batch.column(ENTITY_COLUMN),
            }
        )
        .group_by(["day", "entity"])
        .aggregate([])
    )
    if pc.max(keys["day"]).as_py() > _LAST_DAYS:
        # A row in the last representable days (no window ends after them): read all.
        return pa.concat_tables([read(f, None) for f in files])
    days = {d: _utc_midnight(d) for d in pc.unique(keys["day"]).to_pylist()}
    if not prune_files(
        files,
        time_column=spec.time_column,
        spans=merge_windows([Window(t, t + _DAY) for t in days.values()]),
        entities=None,
        day_column=DAY_COLUMN,
    ):
        return schema.empty_table()  # new days (a first load): nothing stored to match
    pairs = {
        (Window(days[d], days[d] + _DAY), e)
        for d, e in zip(keys["day"].to_pylist(), keys["entity"].to_pylist(), strict=True)
    }
    cells = Cells.from_pairs(pairs, limit=len(pairs))
    spans = merge_windows(list(cells.windows))
    wanted = prune_files(
        files,
        time_column=spec.time_column,
        spans=spans,
        entities=cells.entities,
        day_column=DAY_COLUMN,
    )
    targets = TargetIndex(list(cells))
    return pa.concat_tables([read(f, targets) for f in wanted] or [schema.empty_table()])


def _read_file(
    tables: RawTables,
    spec: SourceSpec,
    f: dict,
    targets: Targets | TargetIndex | None,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """The row groups of one data file that may hold rows of `targets` (every stored
    column, or `columns`)."""
    return read_row_groups(
        tables.uri(spec),
        tables.options,
        f["path"],
        list(columns) if columns is not None else archive_data_schema(spec).names,
        spec.time_column,
        targets,
    )


def read_arrow(
    tables: RawTables,
    spec: SourceSpec,
    spans: Sequence[Window] | None = None,
    entities: frozenset[str] | None = None,
    table: DeltaTable | None = None,
) -> pa.Table:
    """Rows with their time in `spans` (and entity in `entities`), of `table` when given (a
    snapshot of this archive), else of the latest version."""
    table = table or tables.table(spec)
    schema = archive_schema(tables.applied(spec, table))
    if table is None:
        return schema.empty_table()
    time_col = spec.time_column
    # One conjunction per merged window (OR-ed), so rows in gaps between spans stay out.
    filters = [
        [(time_col, ">=", w.start), (time_col, "<", w.end)]
        for w in merge_windows(list(spans or []))
    ]
    data = pa.table(table.to_pyarrow_table(filters=filters or None))
    data = data.select(schema.names).cast(schema)
    if entities is not None:
        # Filtered here, not pushed down: MERGE writes string_view files, whose statistics
        # pyarrow cannot compare with a string `in` filter.
        wanted = pa.array(sorted(entities), pa.string())
        data = data.filter(pc.is_in(data["entity_id"], value_set=wanted))
    return data
