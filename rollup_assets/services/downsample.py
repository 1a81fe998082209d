"""Downsampling queries: a rollup's stored buckets merged into coarser steps, or a raw or
time-range archive's rows aggregated into steps, exactly.

Over a rollup, the partials of the buckets in each step are merged as a rollup of a rollup
merges them (sum of sums, sum of counts, min of mins, max of maxes), and only then turned into
logical values (an average is the step's sum over its count, not an average of averages). The
partials of every entity are read from the rollup's surface (it holds each average's sum and
count; while it lags, the cells changed since its publish come from the row table), otherwise
from the row table through the pointers. Steps
are validated by `model.steps`: calendar steps in the rollup's reference zone, fixed ones whole
multiples of a FixedSize rollup's buckets; a step that does not nest the buckets is refused.
`aggs` (`COLUMN:FUNCTION`) picks among the rollup's aggregations (default: all of them).

Over a raw or time-range archive, the rows are aggregated straight into the steps with the
rules a first-level rollup uses (`compute.arrow_partials`, `compute.aggregation`): nulls
ignored, Count counts non-null values, a Sum, Min, Max or Avg of no value is null, NaN ordered
as on Spark (a Sum, Avg or Max over a NaN is NaN; a Min skips NaN unless every value is NaN).
`aggs` says what to compute (required); calendar steps follow `zone` (IANA, default UTC);
time-range rows count in the step holding their `range_start`. `downsample` picks Arrow on the
driver or Spark by the size of the files the range may read (`QUERY_DRIVER_ROWS`); both give
the same rows.

A query returns whole steps only: `start` and `end`, when given, must be step boundaries (in
the step's zone for calendar steps). A step holds the buckets (rows) that are stored for it (or,
with `realtime`, the ones a real-time read of a rollup returns), so the step holding the newest
data may not be complete yet.

Output: `step_start`, `step_end` (UTC), `entity_id` (per entity; absent with `group_by="all"`,
which merges every selected entity into one row per step) and each aggregation's logical
column (`<column>_<function>`), ordered by step (and entity).
"""

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rollup_assets.compute.aggregation import SOURCE_ROWS, logical_columns, rollup_partials
from rollup_assets.compute.arrow_partials import logical_arrow, partials_arrow
from rollup_assets.compute.arrow_types import TS
from rollup_assets.model.bucketing import Bucketing
from rollup_assets.model.errors import InvalidArchiveOperationError
from rollup_assets.model.query_aggregations import (
    Aggregate,
    check_rollup_zone,
    rollup_aggregations,
)
from rollup_assets.model.specs import ENTITY_COLUMN, ArchiveSpec, RollupSpec
from rollup_assets.model.steps import check_step_range, step_spec
from rollup_assets.model.windows import EPOCH, Window, as_utc, span
from rollup_assets.services.engine import Engine
from rollup_assets.services.realtime import partial_schema, realtime_partials, stored_partials
from rollup_assets.services.source_query import (
    SourceQuery,
    rows_arrow,
    rows_at_most,
    rows_spark,
    source_query,
)
from rollup_assets.services.surface_reads import rows_now

GROUP_BY = ("entity", "all")
# A downsampling query over a raw or time-range archive aggregates its rows on the driver with
# Arrow when the files its range may read hold at most this many rows (by their statistics), and
# on Spark above: the same trade as the forward lane's (`settings.DEFAULT_DRIVER_SOURCE_ROWS`),
# for a read that writes nothing.
QUERY_DRIVER_ROWS = 2_000_000


@dataclass(frozen=True)
class Downsampled:
    """The rows of a downsampling query, and what computed them: `computed_with` "arrow" (on
    the driver) or "spark"; `note` says why, for a raw or time-range archive (None for a
    rollup, whose stored buckets are always merged on the driver)."""

    table: pa.Table
    computed_with: Literal["arrow", "spark"]
    note: str | None = None


def downsample(
    engine: Engine,
    archive: str,
    every: str | timedelta,
    start: datetime | None = None,
    end: datetime | None = None,
    entities: Sequence[str] | None = None,
    group_by: str = "entity",
    realtime: bool = False,
    *,
    aggs: Sequence[Aggregate] = (),
    zone: str | None = None,
    spark: Callable[[], SparkSession],
) -> Downsampled:
    """`downsample_arrow`, or for a raw or time-range archive whose files in the range hold
    more than `QUERY_DRIVER_ROWS` rows (or do not say how many), `downsample_spark` on the
    session `spark()` returns (called only then), its rows brought to the driver."""
    spec = engine.catalog.archive(archive)
    if isinstance(spec, RollupSpec) or realtime:
        table = downsample_arrow(
            engine, archive, every, start, end, entities, group_by, realtime, aggs=aggs, zone=zone
        )
        return Downsampled(table, "arrow")
    _check_group_by(archive, group_by)
    query = source_query(engine, spec, every, start, end, entities, aggs, zone)
    bound = rows_at_most(engine, query)
    size = "an unknown number of" if bound is None else f"{bound:,}"
    if bound is not None and bound <= QUERY_DRIVER_ROWS:
        note = (
            f"'{archive}': aggregated with Arrow on the driver: the files of its range hold "
            f"{size} rows (Spark above {QUERY_DRIVER_ROWS:,})"
        )
        return Downsampled(_source_arrow(engine, query, group_by), "arrow", note)
    note = (
        f"'{archive}': aggregated on Spark: the files of its range hold {size} rows (the "
        f"driver takes at most {QUERY_DRIVER_ROWS:,})"
    )
    frame = _source_spark(engine, spark(), query, group_by)
    return Downsampled(frame.toArrow(), "spark", note)


def downsample_arrow(
    engine: Engine,
    archive: str,
    every: str | timedelta,
    start: datetime | None = None,
    end: datetime | None = None,
    entities: Sequence[str] | None = None,
    group_by: str = "entity",
    realtime: bool = False,
    *,
    aggs: Sequence[Aggregate] = (),
    zone: str | None = None,
) -> pa.Table:
    """The logical columns of `archive` per `every` step (`day`, `week`, `month`, `year` or a
    duration) for the steps in [start, end); per entity, or over all of them (`group_by="all"`).
    A rollup's stored buckets merged (with `realtime`, from a real-time read:
    `services.realtime`), or a raw or time-range archive's rows aggregated with `aggs` in `zone`,
    on the driver. See the module."""
    source = engine.catalog.archive(archive)
    if not isinstance(source, RollupSpec) and not realtime:
        _check_group_by(archive, group_by)
        query = source_query(engine, source, every, start, end, entities, aggs, zone)
        return _source_arrow(engine, query, group_by)
    spec, step, ents = _prepare(engine, archive, every, start, end, entities, group_by, aggs, zone)
    if realtime:
        rows = realtime_partials(engine, spec, start, end, ents)
    else:
        rows = _stored(engine, spec, span(start, end), ents)
    return _shaped(_steps_arrow(rows, "bucket_start", step, spec, group_by), group_by)


def downsample_spark(
    engine: Engine,
    spark: SparkSession,
    archive: str,
    every: str | timedelta,
    start: datetime | None = None,
    end: datetime | None = None,
    entities: Sequence[str] | None = None,
    group_by: str = "entity",
    *,
    aggs: Sequence[Aggregate] = (),
    zone: str | None = None,
) -> DataFrame:
    """`downsample_arrow` (without `realtime`) as a Spark DataFrame, for large reads."""
    source = engine.catalog.archive(archive)
    if not isinstance(source, RollupSpec):
        _check_group_by(archive, group_by)
        query = source_query(engine, source, every, start, end, entities, aggs, zone)
        return _source_spark(engine, spark, query, group_by)
    spec, step, ents = _prepare(engine, archive, every, start, end, entities, group_by, aggs, zone)
    rows = engine.rollups.read_spark(spark, spec, [span(start, end)], ents)
    return _steps_spark(spark, rows, "bucket_start", start, end, step, spec, group_by)


def _stored(
    engine: Engine, spec: RollupSpec, window: Window, entities: frozenset[str] | None
) -> pa.Table:
    """The active partial rows of `spec` in `window`: every entity's from the surface (it holds
    each average's sum and count; while it lags, with its changed cells from the row table; the
    entity ids perhaps dictionary-coded), otherwise resolved from the pointers."""
    if entities is None:
        current = rows_now(engine, spec, window, partials=True, ordered=False)
        if current is not None:
            rows = current.rows
            # The entity ids stay as the surface's files code them: grouped by their codes.
            schema = partial_schema(spec)
            entity = schema.get_field_index(ENTITY_COLUMN)
            return rows.cast(schema.set(entity, rows.schema.field(ENTITY_COLUMN)))
    return stored_partials(engine, spec, window, entities)


def _source_arrow(engine: Engine, query: SourceQuery, group_by: str) -> pa.Table:
    """A raw or time-range query's steps, aggregated on the driver."""
    rows = rows_arrow(engine, query)
    steps = _steps_arrow(rows, query.source.time_column, query.step, query.source, group_by)
    return _shaped(steps, group_by)


def _source_spark(
    engine: Engine, spark: SparkSession, query: SourceQuery, group_by: str
) -> DataFrame:
    """A raw or time-range query's steps, aggregated by Spark."""
    rows = rows_spark(engine, spark, query)
    return _steps_spark(
        spark,
        rows,
        query.source.time_column,
        query.start,
        query.end,
        query.step,
        query.source,
        group_by,
    )


def _steps_arrow(
    rows: pa.Table, time_column: str, step: RollupSpec, source: ArchiveSpec, group_by: str
) -> pa.Table:
    """The logical columns of `step` per step (and entity, unless `group_by="all"`) from
    `source`'s rows (a rollup's partial rows, or raw or time-range rows), each placed by its
    `time_column`. The one place a query on the driver turns rows into partials and partials
    into values, so a change of the partial columns meets the queries here."""
    if group_by == "all":
        at = rows.schema.get_field_index(ENTITY_COLUMN)
        rows = rows.set_column(at, ENTITY_COLUMN, pa.nulls(rows.num_rows, pa.string()))
    windows: list[Window] = []
    if rows.num_rows:
        first, last = pc.min_max(rows[time_column]).as_py().values()
        last = as_utc(last) + timedelta(microseconds=1)
        windows = list(Bucketing.of(step).windows(as_utc(first), last))
    schema = partial_schema(step)
    merged = partials_arrow(rows, windows, None, step, source, companions=False)
    return logical_arrow(merged.drop_columns([SOURCE_ROWS]).select(schema.names).cast(schema), step)


def _steps_spark(
    spark: SparkSession,
    rows: DataFrame,
    time_column: str,
    start: datetime | None,
    end: datetime | None,
    step: RollupSpec,
    source: ArchiveSpec,
    group_by: str,
) -> DataFrame:
    """`_steps_arrow` on Spark, shaped as `_shaped` shapes it: the steps of the rows whose
    time is in [start, end) (None: from the first row's step, to the last row's). The one place
    a query on Spark turns rows into partials and partials into values."""
    if group_by == "all":
        rows = rows.withColumn(ENTITY_COLUMN, F.lit(None).cast("string"))
    targets = _step_targets(spark, rows, time_column, start, end, step)
    merged = logical_columns(rollup_partials(rows, targets, step, source), step)
    out = merged.withColumnRenamed("bucket_start", "step_start").withColumnRenamed(
        "bucket_end", "step_end"
    )
    if group_by == "all":
        return out.drop(ENTITY_COLUMN).orderBy("step_start")
    return out.select("step_start", "step_end", ENTITY_COLUMN, *step.output_names).orderBy(
        "step_start", ENTITY_COLUMN
    )


def _step_targets(
    spark: SparkSession,
    rows: DataFrame,
    time_column: str,
    start: datetime | None,
    end: datetime | None,
    step: RollupSpec,
) -> DataFrame:
    """One row (`bucket_start`, `bucket_end`, UTC) per step in [start, end), an open bound
    taken from the rows' first or last time."""
    lo, hi = start, end
    if lo is None or hi is None:
        # As microseconds: Python reads a collected Spark timestamp in its own local zone.
        us = F.unix_micros(F.col(time_column))
        first, last = rows.agg(F.min(us), F.max(us)).first() or (None, None)
        if first is not None and last is not None:
            lo = lo or EPOCH + timedelta(microseconds=first)
            hi = hi or EPOCH + timedelta(microseconds=last + 1)
    windows = (
        list(Bucketing.of(step).windows(as_utc(lo), as_utc(hi)))
        if lo is not None and hi is not None
        else []
    )
    return spark.createDataFrame(
        pa.table(
            {
                "bucket_start": pa.array([w.start for w in windows], TS),
                "bucket_end": pa.array([w.end for w in windows], TS),
            }
        )
    )


def _check_group_by(archive: str, group_by: str) -> None:
    if group_by not in GROUP_BY:
        raise InvalidArchiveOperationError(
            f"cannot downsample '{archive}': group_by {group_by!r} is not one of "
            f"{', '.join(GROUP_BY)}"
        )


def _prepare(
    engine: Engine,
    rollup: str,
    every: str | timedelta,
    start: datetime | None,
    end: datetime | None,
    entities: Sequence[str] | None,
    group_by: str,
    aggs: Sequence[Aggregate],
    zone: str | None,
) -> tuple[RollupSpec, RollupSpec, frozenset[str] | None]:
    """The rollup, its step (with the aggregations `aggs` pick) and the entity filter, once
    every argument is checked."""
    spec = engine.catalog.rollup(rollup)
    _check_group_by(rollup, group_by)
    check_rollup_zone(spec, zone)
    step = step_spec(spec, every)
    step = dataclasses.replace(step, aggregations=rollup_aggregations(spec, aggs))
    check_step_range(
        spec,
        step,
        None if start is None else as_utc(start),
        None if end is None else as_utc(end),
    )
    engine.require_activated(spec)
    return spec, step, frozenset(entities) if entities else None


def _shaped(table: pa.Table, group_by: str) -> pa.Table:
    """Step columns first, named for what they are; no entity column over all entities."""
    table = table.rename_columns(
        [
            "step_start" if n == "bucket_start" else "step_end" if n == "bucket_end" else n
            for n in table.column_names
        ]
    )
    names = [n for n in table.column_names if n not in ("step_start", "step_end", ENTITY_COLUMN)]
    lead = ["step_start", "step_end"] + ([] if group_by == "all" else [ENTITY_COLUMN])
    return table.select([*lead, *names])
