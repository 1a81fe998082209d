"""The asset check: a stored rollup equals a fresh aggregation of its source."""

import functools
import operator
from dataclasses import dataclass, field

from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from rollup_assets.engine import Engine
from rollup_assets.partitions import Window, iso_utc
from rollup_assets.specs import ColumnType, RollupSpec

REL_TOLERANCE = 1e-9


@dataclass(frozen=True)
class CheckDiff:
    buckets: int
    rows: int
    differing: int
    examples: list[dict] = field(default_factory=list)


def _same(a: Column, b: Column, ctype: ColumnType) -> Column:
    if ctype is ColumnType.DOUBLE:
        close = F.abs(a - b) <= F.lit(REL_TOLERANCE) * F.greatest(F.lit(1.0), F.abs(a), F.abs(b))
        return (a.isNull() & b.isNull()) | close
    return a.eqNullSafe(b)


def compare_with_source(
    engine: Engine, spark: SparkSession, spec: RollupSpec, spans: list[Window]
) -> CheckDiff:
    """Compare the aggregated (closed) buckets in `spans`; later buckets are skipped."""
    state = engine.states.get(spec.name)
    mark = state.watermark
    buckets = [w for w in engine.buckets_in(spec, spans) if mark is not None and w.end <= mark]
    if not buckets:
        return CheckDiff(0, 0, 0)
    fresh, _ = engine.partials(spark, spec, buckets, None)
    names = [sc.name for sc in spec.stored_columns]
    stored = engine.rollups.read_spark(spark, spec, buckets).select(
        "entity_id", "bucket_start", *names
    )
    f = fresh.select("entity_id", "bucket_start", *[F.col(n).alias(f"f__{n}") for n in names])
    joined = f.join(stored, on=["entity_id", "bucket_start"], how="full_outer")
    same = functools.reduce(
        operator.and_,
        [_same(F.col(f"f__{sc.name}"), F.col(sc.name), sc.type) for sc in spec.stored_columns],
    )
    bad = joined.where(~same)
    differing = bad.count()
    examples = []
    if differing:
        sample = (
            bad.select("entity_id", "bucket_start", *names, *[f"f__{n}" for n in names])
            .limit(20)
            .toArrow()
        )
        for row in sample.to_pylist():
            examples.append(
                {
                    "entity_id": row["entity_id"],
                    "bucket_start": iso_utc(row["bucket_start"]),
                    "stored": {n: row[n] for n in names},
                    "expected": {n: row[f"f__{n}"] for n in names},
                }
            )
    return CheckDiff(len(buckets), joined.count(), differing, examples)
