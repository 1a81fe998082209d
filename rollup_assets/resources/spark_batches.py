"""A batch as a Spark DataFrame: a file read by Spark as a file ingest reads it, and the frame
validated whole in Spark tasks, with nothing of it collected on the driver.

Validation runs in Spark tasks with the same converter as a file ingest (`batch_conversion`):
each task checks its rows in order and reports its first offending row, and one aggregation
finds the first key repeated; the first offence in the frame's order (partitions in order, rows
within each) is reported with its index and reason (`spark_ingest` then writes nothing).
"""

import datetime as dt
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from rollup_assets.model.errors import IngestValidationError
from rollup_assets.model.specs import DAY_COLUMN, ENTITY_COLUMN, SourceSpec, key_columns
from rollup_assets.model.windows import EPOCH
from rollup_assets.resources.batch_conversion import BatchConverter
from rollup_assets.resources.schemas import archive_schema
from rollup_assets.resources.warehouse import spark_uri

ROW = "__row"
# The line of a CSV row that does not have the header's fields (Spark's corrupt record column).
MALFORMED = "__malformed_line"
# What each validation task reports: its partition, its rows, its first offending row (local
# index) and why (`whole`: an offence of the batch as a whole; `MALFORMED`: a CSV line without
# the header's fields), and the time range (µs since the epoch) and UTC days of its rows.
CHECKED_DDL = (
    "part int, rows long, bad_row long, reason string, whole boolean, "
    "min_us long, max_us long, days string"
)


@dataclass(frozen=True)
class FrameSummary:
    rows: int
    min_ts: dt.datetime
    max_ts: dt.datetime
    days: list[dt.date]
    entities: int


def read_file(spark: SparkSession, spec: SourceSpec, path: str | Path) -> DataFrame:
    """A Parquet or CSV file read by Spark as a file ingest reads it: a CSV's columns as text
    (only an empty cell is missing), converted by the ingest's rules. `path` is a local path
    (which a cluster's executors must see at the same place) or a URI they can read."""
    text = str(path)
    suffix = Path(text.rsplit("/", 1)[-1]).suffix.lower()
    if "://" in text:
        uri = spark_uri(text)
    elif not Path(text).exists():
        raise IngestValidationError(spec.name, None, f"file {text} does not exist")
    else:
        uri = spark_uri(str(Path(text).resolve()))
    if suffix in (".parquet", ".pq"):
        return spark.read.parquet(uri)
    if suffix in (".csv", ".txt"):
        first = spark.read.text(uri).first()
        line = "" if first is None else str(first[0]).lstrip("\ufeff")
        header = [c.strip().strip('"') for c in line.strip().split(",")]
        schema = ", ".join(f"`{c}` string" for c in [*header, MALFORMED])
        return (
            spark.read.option("header", True)
            .option("nullValue", "")
            .option("emptyValue", "")
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", MALFORMED)
            .schema(schema)
            .csv(uri)
        )
    raise IngestValidationError(
        spec.name, None, f"unsupported file type '{suffix}' (use .parquet or .csv)"
    )


def validate_frame(
    spec: SourceSpec,
    frame: DataFrame,
    not_before: dt.datetime | None = None,
    file: str | None = None,
) -> FrameSummary:
    """The frame (read from `file`, when named) checked whole, in Spark tasks;
    IngestValidationError naming the first offending row (its index in the frame's order) and
    why."""
    converter = BatchConverter(spec, archive_schema(spec))
    converter.check_columns([c for c in frame.columns if c != MALFORMED])
    checked = frame.mapInArrow(_checking_task(spec), CHECKED_DDL).collect()
    parts = sorted(checked, key=lambda r: r["part"])
    offsets, total = {}, 0
    for p in parts:
        offsets[p["part"]] = total
        total += p["rows"]
    bad = [(offsets[p["part"]] + p["bad_row"], p) for p in parts if p["reason"] is not None]
    first_bad = min(bad, key=lambda b: b[0]) if bad else None
    limit = first_bad[0] if first_bad is not None else None
    keys = key_columns(spec)
    keyed = frame.mapInArrow(_keys_task(spec, offsets, limit), _keys_ddl(spec))
    order = Window.partitionBy(*keys).orderBy(ROW)
    found = (
        keyed.withColumn("__n", F.row_number().over(order))
        .agg(
            F.min(F.when(F.col("__n") == 2, F.col(ROW))).alias("repeated"),
            F.countDistinct(ENTITY_COLUMN).alias("entities"),
        )
        .first()
    )
    repeated, entities = (None, 0) if found is None else (found["repeated"], found["entities"])
    if repeated is not None and (first_bad is None or repeated < first_bad[0]):
        raise IngestValidationError(
            spec.name, repeated, f"duplicate key ({', '.join(keys)}) within the batch"
        )
    if first_bad is not None:
        row, part = first_bad
        reason = part["reason"]
        if reason == MALFORMED:  # a CSV line the header's fields do not fit
            reason = (
                f"{file or 'the file'} is not a readable CSV file (its row {row} does not have "
                "the header's fields)"
            )
        raise IngestValidationError(spec.name, None if part["whole"] else row, reason)
    ranged = [p for p in parts if p["rows"] and p["min_us"] is not None]
    if not ranged:
        raise IngestValidationError(spec.name, None, f"{file or 'the frame'} holds no rows")
    lo = EPOCH + dt.timedelta(microseconds=min(p["min_us"] for p in ranged))
    hi = EPOCH + dt.timedelta(microseconds=max(p["max_us"] for p in ranged))
    if not_before is not None and lo < not_before:
        raise IngestValidationError.before_retention(
            spec.name, None, f"its first reading, at {lo.isoformat()},", not_before
        )
    days = sorted({dt.date.fromisoformat(d) for p in ranged for d in json.loads(p["days"])})
    return FrameSummary(total, lo, hi, days, int(entities))


# -- Spark tasks (run on the executors) ----------------------------------------------------------


def _first_in_chunk(
    converter: BatchConverter, chunk: pa.Table, offset: int, err: IngestValidationError
) -> IngestValidationError:
    """The first offence of `chunk`, given `err` from it: checks run column by column, so a
    later check can flag an earlier row; the rows before it are checked again until they pass."""
    while err.row is not None and err.row > offset:
        try:
            converter.convert(chunk.slice(0, err.row - offset), offset)
        except IngestValidationError as earlier:
            err = earlier
            continue
        break
    return err


def without_malformed(batch: pa.RecordBatch) -> pa.Table:
    """`batch` as a table, without the column of CSV lines that lack the header's fields."""
    chunk = pa.Table.from_batches([batch])
    return chunk.drop_columns([MALFORMED]) if MALFORMED in chunk.column_names else chunk


def _checking_task(
    spec: SourceSpec,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        part = context.partitionId() if context is not None else 0
        converter = BatchConverter(spec, archive_schema(spec))
        time_col = key_columns(spec)[1]
        rows = 0
        offence: tuple[int, str, bool] | None = None  # local row, reason, of the batch whole
        lo = hi = None
        days: set[dt.date] = set()
        for batch in batches:
            chunk = without_malformed(batch)
            if offence is None:
                if MALFORMED in batch.schema.names:
                    # A line without the header's fields makes the file unreadable, as when the
                    # driver parses it; the rows before it are checked first.
                    broken = pc.is_valid(batch.column(MALFORMED))
                    if pc.any(broken).as_py():
                        at = pc.index(broken, True).as_py()
                        chunk = chunk.slice(0, at)
                        offence = (rows + at, MALFORMED, True)
                try:
                    t = converter.convert(chunk, rows)
                except IngestValidationError as err:
                    first = _first_in_chunk(converter, chunk, rows, err)
                    whole = first.row is None
                    offence = (rows if first.row is None else first.row, first.reason, whole)
                else:
                    if t.num_rows:
                        a, b = pc.min_max(pc.cast(t[time_col], pa.int64())).values()
                        lo = a.as_py() if lo is None else min(lo, a.as_py())
                        hi = b.as_py() if hi is None else max(hi, b.as_py())
                        days.update(pc.unique(t[DAY_COLUMN]).to_pylist())
            rows += batch.num_rows
        bad, reason, whole = offence if offence is not None else (None, None, False)
        yield pa.RecordBatch.from_pydict(
            {
                "part": pa.array([part], pa.int32()),
                "rows": pa.array([rows], pa.int64()),
                "bad_row": pa.array([bad], pa.int64()),
                "reason": pa.array([reason], pa.string()),
                "whole": pa.array([whole], pa.bool_()),
                "min_us": pa.array([lo], pa.int64()),
                "max_us": pa.array([hi], pa.int64()),
                "days": pa.array([json.dumps(sorted(d.isoformat() for d in days))]),
            }
        )

    return run


def _keys_ddl(spec: SourceSpec) -> str:
    keys = key_columns(spec)
    return ", ".join([f"{keys[0]} string", *(f"{k} timestamp" for k in keys[1:]), f"{ROW} long"])


def _keys_task(
    spec: SourceSpec, offsets: dict[int, int], limit: int | None
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """Each row's key and index in the frame, for the rows before `limit` (the first invalid
    row: a key repeated after it is not the first offence)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        start = offsets.get(context.partitionId() if context is not None else 0, 0)
        converter = BatchConverter(spec, archive_schema(spec))
        keys = key_columns(spec)
        for batch in batches:
            n = batch.num_rows
            if limit is not None:
                n = max(0, min(n, limit - start))
            if n:
                t = converter.convert(without_malformed(batch).slice(0, n), start)
                rows = pa.array(range(start, start + n), pa.int64())
                t = t.select(keys).append_column(ROW, rows).combine_chunks()
                yield from t.to_batches()
            start += batch.num_rows

    return run
