"""Downsampling queries: a rollup's stored buckets merged into coarser steps, exactly.

The partials of the buckets in each step are merged as a rollup of a rollup merges them (sum of
sums, sum of counts, min of mins, max of maxes), and only then turned into logical values (an
average is the step's sum over its count, not an average of averages). Steps are validated by
`model.steps`: calendar steps in the rollup's reference zone, fixed ones whole multiples of a
FixedSize rollup's buckets; a step that does not nest the buckets is refused.

A query returns whole steps only: `start` and `end`, when given, must be step boundaries (in
the reference zone for calendar steps). A step holds the buckets that are stored for it (or,
with `realtime`, the ones a real-time read returns), so the step holding the newest data may
not be complete yet, as its open bucket is not.

Output: `step_start`, `step_end` (UTC), `entity_id` (per entity; absent with `group_by="all"`,
which merges every selected entity into one row per step) and each aggregation's logical
column, ordered by step (and entity).
"""

from collections.abc import Sequence
from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rollup_assets.compute.aggregation import logical_columns, rollup_partials
from rollup_assets.compute.arrow_partials import logical_arrow, partials_arrow
from rollup_assets.model.bucketing import Bucketing
from rollup_assets.model.errors import InvalidArchiveOperationError
from rollup_assets.model.specs import ENTITY_COLUMN, RollupSpec
from rollup_assets.model.steps import check_step_range, step_spec
from rollup_assets.model.windows import Window, as_utc, span
from rollup_assets.services.engine import Engine
from rollup_assets.services.realtime import realtime_partials, stored_partials

GROUP_BY = ("entity", "all")
TS = pa.timestamp("us", tz="UTC")


def downsample_arrow(
    engine: Engine,
    rollup: str,
    every: str | timedelta,
    start: datetime | None = None,
    end: datetime | None = None,
    entities: Sequence[str] | None = None,
    group_by: str = "entity",
    realtime: bool = False,
) -> pa.Table:
    """The logical columns of `rollup` per `every` step (`day`, `week`, `month`, `year` or a
    duration) for the steps in [start, end); per entity, or over all of them (`group_by="all"`).
    With `realtime`, from a real-time read (`services.realtime`). See the module."""
    spec, step, ents = _prepare(engine, rollup, every, start, end, entities, group_by)
    if realtime:
        rows = realtime_partials(engine, spec, start, end, ents)
    else:
        rows = stored_partials(engine, spec, span(start, end), ents)
    if group_by == "all":
        at = rows.schema.get_field_index(ENTITY_COLUMN)
        rows = rows.set_column(at, ENTITY_COLUMN, pa.nulls(rows.num_rows, pa.string()))
    windows: list[Window] = []
    if rows.num_rows:
        first, last = pc.min_max(rows["bucket_start"]).as_py().values()
        last = as_utc(last) + timedelta(microseconds=1)
        windows = list(Bucketing.of(step).windows(as_utc(first), last))
    merged = partials_arrow(rows, windows, None, step, spec, companions=False)
    return _shaped(logical_arrow(merged, step), group_by)


def downsample_spark(
    engine: Engine,
    spark: SparkSession,
    rollup: str,
    every: str | timedelta,
    start: datetime | None = None,
    end: datetime | None = None,
    entities: Sequence[str] | None = None,
    group_by: str = "entity",
) -> DataFrame:
    """`downsample_arrow` (without `realtime`) as a Spark DataFrame, for large reads."""
    spec, step, ents = _prepare(engine, rollup, every, start, end, entities, group_by)
    rows = engine.rollups.read_spark(spark, spec, [span(start, end)], ents)
    if group_by == "all":
        rows = rows.withColumn(ENTITY_COLUMN, F.lit(None).cast("string"))
    lo, hi = start, end
    if lo is None or hi is None:
        bounds = rows.agg(F.min("bucket_start"), F.max("bucket_start")).first()
        assert bounds is not None
        lo = lo or bounds[0]
        hi = hi or (bounds[1] + timedelta(microseconds=1) if bounds[1] is not None else None)
    windows = (
        list(Bucketing.of(step).windows(as_utc(lo), as_utc(hi)))
        if lo is not None and hi is not None
        else []
    )
    targets = spark.createDataFrame(
        pa.table(
            {
                "bucket_start": pa.array([w.start for w in windows], TS),
                "bucket_end": pa.array([w.end for w in windows], TS),
            }
        )
    )
    merged = logical_columns(rollup_partials(rows, targets, step, spec), step)
    out = merged.withColumnRenamed("bucket_start", "step_start").withColumnRenamed(
        "bucket_end", "step_end"
    )
    if group_by == "all":
        return out.drop(ENTITY_COLUMN).orderBy("step_start")
    return out.select("step_start", "step_end", ENTITY_COLUMN, *spec.output_names).orderBy(
        "step_start", ENTITY_COLUMN
    )


def _prepare(
    engine: Engine,
    rollup: str,
    every: str | timedelta,
    start: datetime | None,
    end: datetime | None,
    entities: Sequence[str] | None,
    group_by: str,
) -> tuple[RollupSpec, RollupSpec, frozenset[str] | None]:
    """The rollup, its step and the entity filter, once every argument is checked."""
    spec = engine.catalog.rollup(rollup)
    if group_by not in GROUP_BY:
        raise InvalidArchiveOperationError(
            f"cannot downsample '{rollup}': group_by {group_by!r} is not one of "
            f"{', '.join(GROUP_BY)}"
        )
    step = step_spec(spec, every)
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
