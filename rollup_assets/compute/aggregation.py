"""Pure Spark transforms: DataFrame in, DataFrame out, no I/O.

A rollup stores *partials* (sum, count, min, max); Avg is stored as sum + count. Over a raw or
time-range source the partials are computed from the value columns; over a rollup source they
are merged: sum of sums, sum of counts, min of mins, max of maxes. Nulls are ignored as in SQL,
a bucket whose inputs are all null gets null (count 0), and an entity without rows in a bucket
gets no row.

Next to the partials each row keeps the *companions* of its aggregated columns
(`model.aggregates.Companion`, `model.partials`): the values that are not null, the sum of the
finite ones and the NaN and infinite ones, and the `SPARES` smallest and largest values. Over a
rollup source they merge as `model.partials` says: counts and sums add up, and the smallest
values kept are those known up to the first end of an incomplete list below.
"""

from datetime import timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from rollup_assets.model.aggregates import BASE_KINDS, Companion, StoredColumn
from rollup_assets.model.column_types import ColumnType
from rollup_assets.model.partials import ADDED_KINDS, EXTREMES, RAW_ROWS, SPARES, SPECIAL_KINDS
from rollup_assets.model.specs import ENTITY_COLUMN, Alignment, ArchiveSpec, RollupSpec
from rollup_assets.model.windows import EPOCH

SPARK_TYPES: dict[ColumnType, T.DataType] = {
    ColumnType.DOUBLE: T.DoubleType(),
    ColumnType.LONG: T.LongType(),
    ColumnType.BOOLEAN: T.BooleanType(),
    ColumnType.STRING: T.StringType(),
    ColumnType.INT: T.IntegerType(),
    ColumnType.TIMESTAMP: T.TimestampType(),
}
# The count of source rows behind each partial row (dropped before rows are written).
SOURCE_ROWS = "__source_rows"
_TRUNC_UNIT = {
    Alignment.CALENDAR_DAY: "DAY",
    Alignment.ISO8601_WEEK: "WEEK",  # Spark's WEEK truncates to Monday, as ISO 8601 does
    Alignment.CALENDAR_MONTH: "MONTH",
    Alignment.CALENDAR_YEAR: "YEAR",
}


def bucket_start(ts: Column, spec: RollupSpec) -> Column:
    """The UTC start of the bucket containing instant `ts` (session time zone must be UTC)."""
    if spec.alignment is Alignment.FIXED_SIZE:
        assert spec.size is not None
        step = spec.size // timedelta(microseconds=1)
        origin = (spec.origin - EPOCH) // timedelta(microseconds=1) % step
        micros = F.unix_micros(ts)
        # An absolute duration from the origin, whatever the zone; `pmod` floors before the
        # origin too, as `Bucketing.floor` does.
        return F.timestamp_micros(micros - F.pmod(micros - F.lit(origin), F.lit(step)))
    zone = spec.reference_time_zone
    local = F.from_utc_timestamp(ts, zone)
    return F.to_utc_timestamp(F.date_trunc(_TRUNC_UNIT[spec.alignment], local), zone)


def _partial_expr(sc: StoredColumn, spec: RollupSpec, source: ArchiveSpec) -> Column:
    if isinstance(source, RollupSpec):
        src = source.partial_column(sc.column, sc.partial)
        assert src is not None, (
            f"{spec.name}: source '{source.name}' lacks {sc.partial}({sc.column})"
        )
        col = F.col(src)
        expr = {"sum": F.sum(col), "count": F.sum(col), "min": F.min(col), "max": F.max(col)}[
            sc.partial
        ]
    else:
        col = F.col(sc.column)
        expr = {"sum": F.sum(col), "count": F.count(col), "min": F.min(col), "max": F.max(col)}[
            sc.partial
        ]
    if sc.partial == "count":
        # A count is never null: no rows means 0, as COUNT(column) in SQL.
        expr = F.coalesce(expr, F.lit(0))
    return expr.cast(SPARK_TYPES[sc.type]).alias(sc.name)


def rollup_partials(
    source_rows: DataFrame,
    targets: DataFrame | None,
    spec: RollupSpec,
    source: ArchiveSpec,
    cell_targets: DataFrame | None = None,
) -> DataFrame:
    """Aggregate source rows into `spec`'s partial columns for the target cells only.

    `targets` has one row per bucket to produce for every entity (`bucket_start`, `bucket_end`,
    UTC); `cell_targets` one row per cell to produce (those and `entity_id`). A bucket is in one
    of them at most. Rows that fall in other cells are dropped. Output: entity_id,
    bucket_start, bucket_end, the partials, and `SOURCE_ROWS` (the source rows behind each).
    """
    placed = source_rows.withColumn("__bucket", bucket_start(F.col(source.time_column), spec))
    if isinstance(source, RollupSpec):
        placed = placed.drop("bucket_start", "bucket_end")
    parts = []
    if targets is not None:
        parts.append(
            placed.join(
                F.broadcast(targets.withColumnRenamed("bucket_start", "__bucket")),
                on="__bucket",
                how="inner",
            )
        )
    if cell_targets is not None:
        parts.append(
            placed.join(
                F.broadcast(cell_targets.withColumnRenamed("bucket_start", "__bucket")),
                on=["__bucket", ENTITY_COLUMN],
                how="inner",
            )
        )
    assert parts, "rollup_partials needs targets, cell targets or both"
    joined = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
    aggs = [_partial_expr(sc, spec, source) for sc in spec.stored_columns]
    kept = [c for c in spec.companions if c.kind in BASE_KINDS]
    helpers: list[Column] = []
    finals: dict[str, Column] = {}
    for c in kept:
        agg, extra, final = _companion_expr(c, source)
        aggs.append(agg)
        helpers += extra
        finals[c.name] = final
    # A row below without the count (written before companions were kept) leaves the count
    # of its cell above unknown (null): a fold of that cell aggregates it again instead.
    raw_rows = (
        F.when(F.count(F.lit(1)) == F.count(RAW_ROWS), F.sum(RAW_ROWS))
        if isinstance(source, RollupSpec)
        else F.count(F.lit(1))
    )
    grouped = (
        joined.groupBy(ENTITY_COLUMN, "__bucket", "bucket_end")
        .agg(
            *aggs,
            raw_rows.cast("long").alias(RAW_ROWS),
            *helpers,
            F.count(F.lit(1)).alias(SOURCE_ROWS),
        )
        .withColumnRenamed("__bucket", "bucket_start")
    )
    return grouped.select(
        ENTITY_COLUMN,
        "bucket_start",
        "bucket_end",
        *[sc.name for sc in spec.stored_columns],
        RAW_ROWS,
        *[finals[c.name].alias(c.name) for c in kept],
        SOURCE_ROWS,
    )


_INF = float("inf")


def _finite(col: Column) -> Column:
    return ~F.isnan(col) & (col != F.lit(_INF)) & (col != F.lit(-_INF))


def _companion_expr(c: Companion, source: ArchiveSpec) -> tuple[Column, list[Column], Column]:
    """(the aggregation of companion `c`, helper aggregations it needs, its final value from
    the aggregated columns): over a raw source from the values, over a rollup from the
    companions below."""
    name = c.name
    if isinstance(source, RollupSpec):
        below = F.col(name)
        if c.kind in ADDED_KINDS:
            zero = F.lit(0.0) if c.type is ColumnType.DOUBLE else F.lit(0)
            agg = F.coalesce(F.sum(below), zero).cast(SPARK_TYPES[c.type]).alias(name)
            return agg, [], F.col(name)
        count = source.companion(c.column, "n")
        assert count is not None, f"'{source.name}' keeps no count of {c.column}"
        return _merged_extreme(c, count)
    col = F.col(c.column)
    kind = c.kind
    if kind == "n":
        return F.count(col).cast("long").alias(name), [], F.col(name)
    if kind == "total":
        if c.type is ColumnType.DOUBLE:
            agg = F.coalesce(F.sum(F.when(_finite(col), col)), F.lit(0.0))
        else:
            agg = F.coalesce(F.sum(col), F.lit(0))
        return agg.cast(SPARK_TYPES[c.type]).alias(name), [], F.col(name)
    if kind in SPECIAL_KINDS:
        test = {
            "nan": F.isnan(col),
            "pinf": col == F.lit(_INF),
            "ninf": col == F.lit(-_INF),
        }[kind]
        return F.count(F.when(test, 1)).cast("long").alias(name), [], F.col(name)
    values = F.collect_list(col)
    ordered = F.sort_array(values, asc=False) if EXTREMES[kind] else F.array_sort(values)
    return F.slice(ordered, 1, SPARES).alias(name), [], F.col(name)


def _merged_extreme(c: Companion, count: str) -> tuple[Column, list[Column], Column]:
    """The smallest (`lo`) or largest (`hi`) values of a bucket above from the lists below
    (and their cells' counts of values, in `count`): every value up to the first end of an
    incomplete list below (values past it are not known), none when a list below is exhausted
    (`model.partials.ExtremeState.merge`)."""
    name = c.name
    largest = EXTREMES[c.kind]
    lists, counts = F.col(name), F.col(count)
    incomplete = F.size(lists) < counts
    end = F.when(incomplete & (F.size(lists) > 0), F.element_at(lists, -1))
    bound = f"{name}__bound"
    exhausted = f"{name}__exhausted"
    helpers = [
        (F.max(end) if largest else F.min(end)).alias(bound),
        F.max(F.when(incomplete & (F.size(lists) == 0), F.lit(1)).otherwise(F.lit(0))).alias(
            exhausted
        ),
    ]
    agg = F.flatten(F.collect_list(lists)).alias(name)
    known = F.filter(
        F.col(name),
        lambda x: F.col(bound).isNull() | ((x >= F.col(bound)) if largest else (x <= F.col(bound))),
    )
    ordered = F.sort_array(known, asc=False) if largest else F.array_sort(known)
    final = F.when(F.col(exhausted) == 1, F.slice(ordered, 1, 0)).otherwise(
        F.slice(ordered, 1, SPARES)
    )
    return agg, helpers, final


def logical_columns(frame: DataFrame, spec: RollupSpec) -> DataFrame:
    """Stored partials -> the logical columns users query (Avg = sum / count, null when count 0)."""
    cols = [F.col(ENTITY_COLUMN), F.col("bucket_start"), F.col("bucket_end")]
    for agg in spec.aggregations:
        out = agg.output_name
        if agg.function.value == "Avg":
            s, c = F.col(f"{out}__sum"), F.col(f"{out}__count")
            cols.append(F.when(c > 0, s / c).cast(T.DoubleType()).alias(out))
        else:
            cols.append(F.col(out))
    return frame.select(*cols)
