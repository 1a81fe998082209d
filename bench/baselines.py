"""What a user would pick instead: a bare PySpark script, DuckDB on one machine, a dbt-style
fixed look-back refresh; and the independent oracle (DuckDB over the raw Parquet files).

The bare scripts are written the way a user writes them: read Parquet, group by entity and
bucket, write Parquet. They share the project's bucket arithmetic (`aggregation.bucket_start`,
a pure expression), so every alternative computes exactly the same buckets.
"""

from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rollup_assets.compute.aggregation import bucket_start
from rollup_assets.compute.arrow_types import TS
from rollup_assets.model.aggregates import AggregateFunction
from rollup_assets.model.specs import Alignment, ArchiveSpec, Catalog, RollupSpec
from rollup_assets.model.windows import EPOCH

_MERGE = {"sum": F.sum, "count": F.sum, "min": F.min, "max": F.max}
_FIRST = {"sum": F.sum, "count": F.count, "min": F.min, "max": F.max}
_SQL = {
    AggregateFunction.SUM: "sum",
    AggregateFunction.COUNT: "count",
    AggregateFunction.AVG: "avg",
    AggregateFunction.MIN: "min",
    AggregateFunction.MAX: "max",
}
_TRUNC = {
    Alignment.CALENDAR_DAY: "day",
    Alignment.ISO8601_WEEK: "week",
    Alignment.CALENDAR_MONTH: "month",
    Alignment.CALENDAR_YEAR: "year",
}
RAW_COLUMNS = ["entity_id", "ts", "energy_kwh", "power_kw", "voltage_v"]


def computed_sql(catalog: Catalog) -> dict[str, str]:
    """The raw archive's computed columns as SQL, for baselines that read the generated files.

    The formulas of the energy spec are plain arithmetic that Spark SQL and DuckDB read alike;
    the generated data holds no operand that would make them fail (no zero voltage).
    """
    raw = catalog.raw["energy_raw"]
    return {c.name: c.formula.text for c in raw.computed_columns if c.formula is not None}


def raw_rows(spark: SparkSession, catalog: Catalog, files: list[str]) -> DataFrame:
    """The generated raw rows with the computed columns ingest would add."""
    rows = spark.read.parquet(*files)
    for name, formula in computed_sql(catalog).items():
        rows = rows.withColumn(name, F.expr(formula))
    return rows


def raw_sql(catalog: Catalog, files: list[str]) -> str:
    """A DuckDB relation of the generated raw rows with their computed columns."""
    extra = "".join(f", ({f}) AS {n}" for n, f in computed_sql(catalog).items())
    return f"(SELECT *{extra} FROM read_parquet({_list(files)}))"


# -- bare PySpark ---------------------------------------------------------------------------


def bare_level(rows: DataFrame, spec: RollupSpec, source: ArchiveSpec) -> DataFrame:
    """The partials of `spec` from its source rows: one groupBy, nothing else."""
    aggs = []
    for sc in spec.stored_columns:
        if isinstance(source, RollupSpec):
            col = F.col(source.partial_column(sc.column, sc.partial) or sc.name)
            aggs.append(_MERGE[sc.partial](col).alias(sc.name))
        else:
            aggs.append(_FIRST[sc.partial](F.col(sc.column)).alias(sc.name))
    bucket = bucket_start(F.col(source.time_column), spec).alias("bucket_start")
    return rows.groupBy("entity_id", bucket).agg(*aggs)


def bare_spark_hourly(spark: SparkSession, catalog: Catalog, files: list[str], out: Path) -> None:
    """The first level from the generated Parquet, written as Parquet."""
    spec = catalog.rollup("energy_hourly")
    rows = raw_rows(spark, catalog, files)
    bare_level(rows, spec, catalog.archive(spec.source)).write.mode("overwrite").parquet(str(out))


def rows_in(path: Path) -> int:
    """Rows of a Parquet file or directory, from the footers."""
    return ds.dataset(str(path), format="parquet").count_rows()


def bare_spark_chain(spark: SparkSession, catalog: Catalog, files: list[str], out: Path) -> None:
    """Every level, each from the one below (as a user's chain of scripts would)."""
    for spec in catalog.rollups.values():
        source = catalog.archive(spec.source)
        src = (
            raw_rows(spark, catalog, files)
            if spec.source in catalog.raw
            else _level(spark, out, source)
        )
        bare_level(src, spec, source).write.mode("overwrite").parquet(str(out / spec.name))


def _level(spark: SparkSession, out: Path, spec: ArchiveSpec) -> DataFrame:
    return spark.read.parquet(str(out / spec.name))


def lookback_refresh(
    spark: SparkSession,
    catalog: Catalog,
    raw_files: list[str],
    chain: Path,
    out: Path,
    horizon: datetime,
) -> None:
    """dbt-style incremental refresh: at every level, recompute the buckets that overlap
    [horizon, now) from the level below, all entities, and overwrite them."""
    for spec in catalog.rollups.values():
        source = catalog.archive(spec.source)
        if spec.source in catalog.raw:
            src = raw_rows(spark, catalog, raw_files).where(F.col("ts") >= F.lit(horizon))
        else:
            first = _first_bucket_start(spark, spec, horizon)
            src = _level(spark, chain, source).where(F.col("bucket_start") >= F.lit(first))
        fresh = bare_level(src, spec, source)
        fresh.write.mode("overwrite").parquet(str(out / spec.name))


def _first_bucket_start(spark: SparkSession, spec: RollupSpec, instant: datetime) -> datetime:
    frame = spark.createDataFrame(pa.table({"t": pa.array([instant], TS)}))
    value = frame.select(bucket_start(F.col("t"), spec).alias("b")).toArrow()["b"][0].as_py()
    return value


# -- DuckDB ---------------------------------------------------------------------------------


def duck(threads: int = 2) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(f"SET threads = {threads}")
    # It runs inside the benchmark process: keep it from crowding the driver being measured.
    con.execute("SET memory_limit = '1GB'")
    con.execute("SET TimeZone = 'UTC'")
    return con


def bucket_sql(spec: RollupSpec, column: str = "ts") -> str:
    """DuckDB expression for the UTC bucket start of `column` (session zone: the spec's)."""
    if spec.alignment is Alignment.FIXED_SIZE:
        assert spec.size is not None
        step = int(spec.size / timedelta(seconds=1))
        origin = int((spec.origin - EPOCH) / timedelta(seconds=1)) % step  # buckets' phase
        if origin:
            return f"to_timestamp(floor((epoch({column}) - {origin}) / {step}) * {step} + {origin})"
        return f"to_timestamp(floor(epoch({column}) / {step}) * {step})"
    return f"date_trunc('{_TRUNC[spec.alignment]}', {column})"


def _list(files: list[str]) -> str:
    return "[" + ", ".join(f"'{f}'" for f in files) + "]"


def duckdb_hourly(catalog: Catalog, files: list[str], out: Path) -> None:
    """The first level's partials on one machine (DuckDB, all cores), written as Parquet."""
    spec = catalog.rollup("energy_hourly")
    aggs = ", ".join(
        f"{'count' if sc.partial == 'count' else sc.partial}({sc.column}) AS {sc.name}"
        for sc in spec.stored_columns
    )
    con = duck()
    con.execute(
        f"COPY (SELECT entity_id, {bucket_sql(spec)} AS bucket_start, {aggs} "
        f"FROM {raw_sql(catalog, files)} GROUP BY ALL) TO '{out}' (FORMAT parquet)"
    )


def oracle_windows(
    spec: RollupSpec,
    raw_files: list[str],
    changes: pa.Table,
    con: duckdb.DuckDBPyConnection,
    computed: dict[str, str],
) -> pa.Table:
    """Logical values, straight from raw, of the (entity, bucket) windows containing `changes`
    (entity_id, ts), with each window's earliest change (`first_change`)."""
    con.execute(f"SET TimeZone = '{spec.reference_time_zone}'")
    con.register("changes", changes)
    bucket = bucket_sql(spec)
    extra = "".join(f", ({f}) AS {n}" for n, f in computed.items())  # from the formulas
    logical = ", ".join(
        f"{_SQL[a.function]}(r.{a.column}) AS {a.output_name}" for a in spec.aggregations
    )
    sql = f"""
        WITH c AS (
            SELECT entity_id, {bucket} AS bucket_start, min(ts) AS first_change
            FROM changes GROUP BY ALL
        ), r AS (
            SELECT entity_id, ts, energy_kwh, power_kw, voltage_v{extra}, {bucket} AS bucket_start
            FROM read_parquet({_list(raw_files)})
            WHERE entity_id IN (SELECT DISTINCT entity_id FROM c)
        )
        SELECT c.entity_id, c.bucket_start, c.first_change, {logical}
        FROM c LEFT JOIN r ON r.entity_id = c.entity_id AND r.bucket_start = c.bucket_start
        GROUP BY ALL
    """
    table = con.execute(sql).to_arrow_table()
    con.unregister("changes")
    con.execute("SET TimeZone = 'UTC'")
    return table


def differing(
    spec: RollupSpec, left: pa.Table, right: pa.Table, con: duckdb.DuckDBPyConnection
) -> pa.Table:
    """Windows of `left` missing from `right` or whose logical values differ (rel. 1e-9)."""
    con.register("l", left)
    con.register("r", right)
    diff = " OR ".join(
        f"((l.{n} IS NULL) <> (r.{n} IS NULL)) "
        f"OR abs(l.{n} - r.{n}) > 1e-9 * greatest(1, abs(l.{n}))"
        for n in spec.output_names
    )
    sql = f"""
        SELECT l.entity_id, l.bucket_start, l.first_change
        FROM l LEFT JOIN r ON l.entity_id = r.entity_id AND l.bucket_start = r.bucket_start
        WHERE r.entity_id IS NULL OR {diff}
    """
    out = con.execute(sql).to_arrow_table()
    con.unregister("l")
    con.unregister("r")
    return out
