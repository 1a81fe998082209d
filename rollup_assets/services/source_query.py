"""The source side of a downsampling query over a raw or time-range archive: the query checked,
the snapshot it reads, how many rows that may be, and the rows themselves (Arrow or Spark).

A query reads one snapshot of the archive's table, with the computed columns that table applies
(a spec's pending column change is not readable yet), so its columns are checked against the
same snapshot its rows come from. Raw rows are placed by `ts`, time-range rows by `range_start`:
a range counts whole in the step that holds its start (`services.downsample` aggregates them).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from rollup_assets.model.query_aggregations import Aggregate, query_zone, source_aggregations
from rollup_assets.model.specs import RollupSpec, SourceSpec
from rollup_assets.model.steps import check_step_range, source_step_spec
from rollup_assets.model.windows import Window, as_utc, span
from rollup_assets.resources.schemas import archive_data_schema, spark_schema
from rollup_assets.services.engine import Engine


@dataclass(frozen=True)
class SourceQuery:
    """A checked downsampling query over a raw or time-range archive.

    `source` is the archive's spec with the computed columns `table` applies (`table`: the
    snapshot the query reads; None before its first ingest); `step` is the query's step as a
    rollup of it (its aggregations, zone and geometry); rows are read with their time in
    [start, end) (UTC, step boundaries; None: unbounded) and, when given, their entity in
    `entities`."""

    source: SourceSpec
    step: RollupSpec
    table: DeltaTable | None
    start: datetime | None
    end: datetime | None
    entities: frozenset[str] | None

    @property
    def window(self) -> Window:
        return span(self.start, self.end)


def source_query(
    engine: Engine,
    spec: SourceSpec,
    every: str | timedelta,
    start: datetime | None,
    end: datetime | None,
    entities: Sequence[str] | None,
    aggs: Sequence[Aggregate],
    zone: str | None,
) -> SourceQuery:
    """The query over `spec` once every argument is checked: the zone (IANA, default UTC), the
    aggregations (against the snapshot's columns), the step, whole steps for `start` and `end`,
    and the archive activated. Each refusal names what is wrong."""
    zone = query_zone(spec.name, zone)
    table = engine.raw.table(spec)
    applied = engine.raw.applied(spec, table)
    step = source_step_spec(applied, every, zone, source_aggregations(applied, aggs))
    lo = None if start is None else as_utc(start)
    hi = None if end is None else as_utc(end)
    check_step_range(spec, step, lo, hi)
    engine.require_activated(spec)
    return SourceQuery(applied, step, table, lo, hi, frozenset(entities) if entities else None)


def rows_at_most(engine: Engine, query: SourceQuery) -> int | None:
    """How many rows the files the query may read hold, by their statistics (an upper bound of
    the rows it aggregates); None when a file does not say."""
    if query.table is None:
        return 0
    files = engine.raw.files_for(query.table, query.source, [query.window], query.entities)
    counts = [f.get("num_records") for f in files]
    if not all(isinstance(n, int) for n in counts):
        return None
    return sum(int(n) for n in counts if n is not None)


def rows_arrow(engine: Engine, query: SourceQuery) -> pa.Table:
    """The query's rows, read on the driver (only the files and row groups that may hold
    them)."""
    if query.table is None:
        return archive_data_schema(query.source).empty_table()
    rows, _ = engine.raw.read_rows(query.source, [query.window], query.entities, table=query.table)
    return rows


def rows_spark(engine: Engine, spark: SparkSession, query: SourceQuery) -> DataFrame:
    """The query's rows as a lazy DataFrame (the same files, read by Spark's tasks)."""
    if query.table is None:
        return spark.createDataFrame([], spark_schema(archive_data_schema(query.source)))
    rows, _ = engine.raw.read_spark(
        spark, query.source, [query.window], query.entities, table=query.table
    )
    return rows
