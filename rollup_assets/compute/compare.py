"""Comparing stored partials with freshly computed ones, cell by cell (pure Spark).

The asset check compares with a tolerance for float sums (`diff_partials`); a recompute decides
what it writes by exact equality (`cell_changes`): a cell whose fresh partials equal the stored
ones bit for bit (NaN equal to NaN) is unchanged.
"""

import functools
import operator
from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from rollup_assets.model.specs import ColumnType, RollupSpec
from rollup_assets.model.windows import iso_utc

# Sums of floats are compared with a relative tolerance; everything else exactly.
REL_TOLERANCE = 1e-9


@dataclass(frozen=True)
class FrameDiff:
    rows: int
    differing: int
    examples: list[dict] = field(default_factory=list)


def _same(a: Column, b: Column, ctype: ColumnType) -> Column:
    if ctype is ColumnType.DOUBLE:
        close = F.abs(a - b) <= F.lit(REL_TOLERANCE) * F.greatest(F.lit(1.0), F.abs(a), F.abs(b))
        return (a.isNull() & b.isNull()) | close
    return a.eqNullSafe(b)


CHANGED = "__changed"


def cell_changes(fresh: DataFrame, stored: DataFrame, spec: RollupSpec) -> DataFrame:
    """Every cell (entity_id, bucket_start) of `fresh` or `stored`, with `CHANGED`: do the
    partials differ, or does only one side have a row? Other columns of `fresh` (such as the
    count of source rows behind it) are kept, null for a cell only `stored` has."""
    names = [sc.name for sc in spec.stored_columns]
    keys = ["entity_id", "bucket_start"]
    extra = [c for c in fresh.columns if c not in (*keys, "bucket_end", *names)]
    s = stored.select(*keys, *[F.col(n).alias(f"s__{n}") for n in names], F.lit(True).alias("__s"))
    f = fresh.select(*keys, *names, *extra, F.lit(True).alias("__f"))
    joined = f.join(s, on=keys, how="full_outer")
    same = functools.reduce(operator.and_, [F.col(n).eqNullSafe(F.col(f"s__{n}")) for n in names])
    both = F.col("__f").isNotNull() & F.col("__s").isNotNull()
    return joined.select(*keys, *extra, (~(both & same)).alias(CHANGED))


def diff_partials(
    fresh: DataFrame, stored: DataFrame, spec: RollupSpec, max_examples: int = 20
) -> FrameDiff:
    """Cells (entity, bucket) where `stored` and `fresh` partials differ, or only one has a row."""
    names = [sc.name for sc in spec.stored_columns]
    stored = stored.select("entity_id", "bucket_start", *names)
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
            .limit(max_examples)
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
    return FrameDiff(joined.count(), differing, examples)
