"""A first fill: whole buckets of a rollup, with nothing stored in them yet, aggregated and
written one storage partition per step, in one Spark stage without a shuffle.

When nothing is stored in the buckets (a first backfill), every cell is new, so nothing needs
comparing. And every bucket belongs to one storage partition of the rollup (a UTC day below a
day, a month for days, a year above: `schemas.part_values`). So one task can own a partition:
read the source files that may hold rows of its buckets (by their statistics), keep the active
rows (a rollup source: by its pointers), aggregate them with Arrow (`compute.arrow_partials`,
NaN ordered as on Spark), sort them by entity and write the partition's file. No shuffle, no
sort of the whole range, no row-by-row conversion between the JVM and Python: Spark only
schedules the partitions on its executors. A source file at a partition's edge (a UTC day
holding the end of one local month and the start of the next) is read by both tasks, each
keeping the rows of its own buckets.

Each task reports, with the file it wrote, how many cells it wrote per bucket and from how many
source rows: all a first fill needs to know to flip and record the job.
"""

import json
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql.pandas.types import from_arrow_schema

from rollup_assets.compute.aggregation import SOURCE_ROWS
from rollup_assets.compute.arrow_partials import partials_arrow
from rollup_assets.compute.arrow_types import TS
from rollup_assets.compute.fold_tables import fold
from rollup_assets.model.cells import Cells
from rollup_assets.model.partials import WRITTEN_BY
from rollup_assets.model.specs import ENTITY_COLUMN, ArchiveSpec, RollupSpec
from rollup_assets.model.windows import EPOCH, Window, micros
from rollup_assets.resources.delta_files import (
    WRITTEN_FILES_SCHEMA,
    TargetIndex,
    add_action,
    partition_dir,
    row_groups_for,
    write_file,
)
from rollup_assets.resources.rollup_table import Written, cell_keys
from rollup_assets.resources.schemas import (
    PART_COLUMN,
    archive_data_schema,
    data_schema,
    part_values,
    with_row_shape,
)
from rollup_assets.resources.visible_rows import visible_mask
from rollup_assets.resources.warehouse import filesystem_for

# What each task returns per file: the written file, and per bucket (start in microseconds
# since the epoch) the cells written and the source rows behind them, as JSON.
# And the source rows the task decoded for it (and for partitions it found nothing to fill).
FILLED_SCHEMA = WRITTEN_FILES_SCHEMA.append(pa.field("counts", pa.string())).append(
    pa.field("rows_read", pa.int64())
)
# A task aggregates one storage partition in memory (about 1 GB for this many source rows, with
# the copies filtering and grouping make): a job with a partition whose source files hold more
# rows is left to the general path (Spark aggregates it with a shuffle, spilling as it needs
# to).
MAX_FILL_SOURCE_ROWS = 5_000_000
FILLED_DDL = ", ".join(
    f"{f.name} {'long' if f.type == pa.int64() else 'string'}" for f in FILLED_SCHEMA
)
NO_FILE = {
    "path": "",
    "size": 0,
    "partition_values": "{}",
    "stats": "{}",
    "mtime": 0,
    "num_rows": 0,
    "counts": "[]",
}


@dataclass(frozen=True)
class FillPart:
    """One storage partition of the rollup: its buckets to fill, and the source files (paths
    relative to the source table) that may hold their rows."""

    part: str
    paths: tuple[str, ...]
    buckets: tuple[Window, ...]


@dataclass(frozen=True)
class Fill:
    """Buckets of `spec` by storage partition, with the files of `source` (the table at
    `source_uri`) each may draw from: a first fill (`run_fill`), or named cells aggregated the
    same way (`run_partials`). `pointers` are the source rollup's pointers at the snapshot
    whose files `parts` name (None: a raw source); `versions` the source versions read."""

    spec: RollupSpec
    source: ArchiveSpec
    source_uri: str
    storage_options: dict[str, str]
    versions: dict[str, int]
    parts: tuple[FillPart, ...]
    pointers: pa.Table | None = None
    sizes: dict[str, int | None] = field(default_factory=dict)  # source rows per file path

    @property
    def buckets(self) -> int:
        return sum(len(p.buckets) for p in self.parts)


def plan_parts(
    spec: RollupSpec, buckets: Sequence[Window], files_for: Callable[[Window], list[dict]]
) -> tuple[FillPart, ...]:
    """`buckets` grouped by storage partition, each with the source files `files_for` its span
    (from its first bucket's start to its last bucket's end); partitions without a source file
    are left out (they have nothing to fill)."""
    if not buckets:
        return ()
    names = part_values(spec, pa.array([w.start for w in buckets], TS)).to_pylist()
    by_part: dict[str, list[Window]] = {}
    for w, name in zip(buckets, names, strict=True):
        by_part.setdefault(name, []).append(w)
    out = []
    for name in sorted(by_part):
        ws = sorted(by_part[name])
        span = Window(ws[0].start, max(w.end for w in ws))
        paths = sorted({f["path"] for f in files_for(span)})
        if paths:
            out.append(FillPart(name, tuple(paths), tuple(ws)))
    return tuple(out)


def _instant(since_epoch: int) -> datetime:
    return EPOCH + timedelta(microseconds=since_epoch)


def _source_columns(fill: Fill) -> pa.Schema:
    """The source columns a fill reads: keys, time, the aggregated inputs (for a rollup source,
    its partials) and, for a rollup source, the generation its pointers resolve."""
    spec, source = fill.spec, fill.source
    if isinstance(source, RollupSpec):
        # Every partial and companion (a bucket above merges them), what resolves the visible
        # rows, and the difference rows' values (folded into their bases).
        schema = data_schema(source)
        names = [n for n in schema.names if n not in WRITTEN_BY]
    else:
        schema = archive_data_schema(source)
        names = [ENTITY_COLUMN, source.time_column, *(c.column for c in spec.stored_columns)]
    return pa.schema([schema.field(n) for n in dict.fromkeys(names)])


def fill_rows(
    fill: Fill, paths: Sequence[str], buckets: Sequence[Window], cells: Cells | None = None
) -> tuple[pa.Table | None, int]:
    """The partials of `buckets` (every entity; with `cells`, of those named cells of them
    only) from the source files at `paths`, sorted by entity and bucket, with `SOURCE_ROWS`
    (None when they hold no row of them), and how many source rows were decoded (with `cells`,
    only the row groups that may hold them are)."""
    fs, root = filesystem_for(fill.source_uri, fill.storage_options)
    wanted = _source_columns(fill)
    time_column = "bucket_start" if isinstance(fill.source, RollupSpec) else fill.source.time_column
    targets = None if cells is None else TargetIndex(list(cells))
    parts = []
    for path in paths:
        with fs.open_input_file(f"{root}/{urllib.parse.unquote(path)}") as fh:
            pf = pq.ParquetFile(fh)
            present = [n for n in wanted.names if n in pf.schema_arrow.names]
            if targets is None:
                data = pf.read(columns=present)
            else:
                groups = row_groups_for(pf.metadata, time_column, targets)
                data = pf.read_row_groups(groups, columns=present)
        for column in wanted:  # a column the file predates reads as null, as on Spark
            if column.name not in present:
                data = data.append_column(column.name, pa.nulls(data.num_rows, column.type))
        parts.append(data.select(wanted.names).cast(wanted))
    if not parts:
        return None, 0
    rows = pa.concat_tables(parts)
    decoded = rows.num_rows
    if fill.pointers is not None:
        assert isinstance(fill.source, RollupSpec)
        rows = rows.filter(visible_mask(rows, fill.pointers))
        rows, unknown = fold(rows, fill.source)
        if unknown:
            # The engine sends work over corrected cells below to paths that can aggregate a
            # cell again from its source; a task cannot.
            raise RuntimeError(
                f"'{fill.source.name}': {len(unknown)} cell(s) below cannot be folded in a task"
            )
    keys = None if cells is None else cell_keys(cells)
    out = partials_arrow(rows, list(buckets), keys, fill.spec, fill.source)
    if out.num_rows == 0:
        return None, decoded
    return out.sort_by([(ENTITY_COLUMN, "ascending"), ("bucket_start", "ascending")]), decoded


def _fill_task(
    fill: Fill, table_uri: str, options: dict[str, str], stamp: dict[str, str | int]
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A `mapInArrow` function over rows (part, paths, starts, ends): fill each partition,
    write its file, and return one row per file (`FILLED_SCHEMA`), and one row without a file
    (an empty path) for rows decoded for partitions it found nothing to fill in."""
    target = data_schema(fill.spec)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fs, root = filesystem_for(table_uri, options)
        for rb in batches:
            out = []
            read = 0
            columns = (rb.column(n).to_pylist() for n in ("part", "paths", "starts", "ends"))
            for part, paths, starts, ends in zip(*columns, strict=True):
                buckets = [
                    Window(_instant(a), _instant(b)) for a, b in zip(starts, ends, strict=True)
                ]
                rows, decoded = fill_rows(fill, paths, buckets)
                read += decoded
                if rows is None:
                    continue
                counts = rows.group_by("bucket_start").aggregate(
                    [(SOURCE_ROWS, "count"), (SOURCE_ROWS, "sum")]
                )
                tally = [
                    [micros(s), c, r]
                    for s, c, r in zip(
                        counts["bucket_start"].to_pylist(),
                        counts[f"{SOURCE_ROWS}_count"].to_pylist(),
                        counts[f"{SOURCE_ROWS}_sum"].to_pylist(),
                        strict=True,
                    )
                ]
                n = rows.num_rows
                for name, value in stamp.items():
                    rows = rows.append_column(name, pa.array([value] * n, target.field(name).type))
                data = with_row_shape(rows, target).select(target.names).cast(target)
                directory = urllib.parse.unquote(partition_dir(PART_COLUMN, part))
                entry = write_file(fs, root, directory, data, {PART_COLUMN: part})
                out.append({**entry, "counts": json.dumps(tally), "rows_read": read})
                read = 0
            if read:  # rows decoded for partitions with nothing to fill: a row without a file
                out.append({**NO_FILE, "rows_read": read})
            if out:
                yield pa.RecordBatch.from_pylist(out, schema=FILLED_SCHEMA)

    return run


def run_fill(
    spark: SparkSession,
    fill: Fill,
    table_uri: str,
    options: dict[str, str],
    stamp: dict[str, str | int],
) -> Written:
    """Fill every partition of `fill` on the executors (one Spark stage, partitions spread over
    its tasks), writing the rollup's files under `table_uri` with the bookkeeping columns
    `stamp`; the add actions (nothing committed) and, per bucket start, (cells, source rows)."""
    if not fill.parts:
        return Written([], 0)
    parts = pa.table(
        {
            "part": [p.part for p in fill.parts],
            "paths": [list(p.paths) for p in fill.parts],
            "starts": [[micros(w.start) for w in p.buckets] for p in fill.parts],
            "ends": [[micros(w.end) for w in p.buckets] for p in fill.parts],
        }
    )
    slots = int(spark.conf.get("spark.sql.shuffle.partitions") or 8)
    tasks = max(1, min(len(fill.parts), 2 * slots))
    frame = spark.createDataFrame(parts).repartition(tasks)
    # The tasks get their partitions as rows: the function ships without them.
    task = _fill_task(replace(fill, parts=(), sizes={}), table_uri, options, stamp)
    rows = frame.mapInArrow(task, FILLED_DDL).collect()
    files = [r for r in rows if r["path"]]
    counts: dict[datetime, tuple[int, int]] = {}
    for r in files:
        for start, cells, source_rows in json.loads(r["counts"]):
            c, s = counts.get(_instant(start), (0, 0))
            counts[_instant(start)] = (c + cells, s + source_rows)
    return Written(
        [add_action(r.asDict()) for r in files],
        sum(int(r["num_rows"]) for r in files),
        counts,
        sum(int(r["rows_read"]) for r in rows),
    )


def partials_schema(spec: RollupSpec) -> pa.Schema:
    """What `run_partials` returns: the cell keys and bounds, the stored partials and
    `SOURCE_ROWS`."""
    stored = data_schema(spec)
    names = [ENTITY_COLUMN, "bucket_start", "bucket_end", *(sc.name for sc in spec.stored_columns)]
    return pa.schema([stored.field(n) for n in names]).append(pa.field(SOURCE_ROWS, pa.int64()))


def _partials_task(
    fill: Fill,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A `mapInArrow` function over rows (part, paths, starts, ends, entities): the partials
    of each partition's named cells (`partials_schema` and `READ`), and one row without an
    entity carrying how many source rows it decoded."""
    out_schema = partials_schema(fill.spec).append(pa.field(READ, pa.int64()))

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for rb in batches:
            columns = (rb.column(n).to_pylist() for n in ("paths", "starts", "ends", "entities"))
            read, out = 0, []
            for paths, starts, ends, entities in zip(*columns, strict=True):
                buckets = [
                    Window(_instant(a), _instant(b)) for a, b in zip(starts, ends, strict=True)
                ]
                cells = Cells(
                    tuple(
                        (w, frozenset(ids)) for w, ids in zip(buckets, entities, strict=True) if ids
                    )
                )
                rows, decoded = fill_rows(fill, paths, buckets, cells)
                read += decoded
                if rows is not None:
                    rows = rows.append_column(READ, pa.array([0] * rows.num_rows, pa.int64()))
                    out.append(rows.select(out_schema.names).cast(out_schema))
            tally = {n: [None] for n in out_schema.names} | {READ: [read]}
            out.append(pa.table(tally, schema=out_schema))
            yield from pa.concat_tables(out).to_batches()

    return run


READ = "__rows_read"


def run_partials(spark: SparkSession, fill: Fill, cells: Cells) -> tuple[pa.Table, int]:
    """The partials of the named `cells` of `fill`'s buckets, each
    storage partition aggregated in a Spark task as a first fill does, but brought back to the
    driver (they are a job's named cells) rather than written; and how many source rows the
    tasks decoded. Only the row groups that may hold the cells are read."""
    schema = partials_schema(fill.spec)
    if not fill.parts:
        return schema.empty_table(), 0
    by_start = {w.start: sorted(scope or ()) for w, scope in cells}
    parts = pa.table(
        {
            "part": [p.part for p in fill.parts],
            "paths": [list(p.paths) for p in fill.parts],
            "starts": [[micros(w.start) for w in p.buckets] for p in fill.parts],
            "ends": [[micros(w.end) for w in p.buckets] for p in fill.parts],
            "entities": [[by_start.get(w.start, []) for w in p.buckets] for p in fill.parts],
        }
    )
    slots = int(spark.conf.get("spark.sql.shuffle.partitions") or 8)
    tasks = max(1, min(len(fill.parts), 2 * slots))
    frame = spark.createDataFrame(parts).repartition(tasks)
    out_schema = schema.append(pa.field(READ, pa.int64()))
    task = _partials_task(replace(fill, parts=(), sizes={}))
    got = frame.mapInArrow(task, from_arrow_schema(out_schema)).toArrow()
    read = int(pc.sum(got[READ]).as_py() or 0)
    rows = got.filter(pc.is_valid(got[ENTITY_COLUMN])).drop_columns([READ])
    return rows.cast(schema), read
