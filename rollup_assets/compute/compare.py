"""Comparing stored partials with freshly computed ones, cell by cell (Spark, or Arrow for a
small job's rows on the driver).

The asset check compares with a tolerance for float sums (`diff_partials`); a recompute decides
what it writes by `cell_changes`: a cell is unchanged when its state (its partials, the count
of its source rows and the companions a later correction applies its differences to:
`model.partials.state_columns`) equals the stored one exactly (NaN equal to NaN), except that
floating-point values may differ by rounding (`ROUNDING`, relative): the same values summed in
another order (Spark's, Arrow's, a difference applied to a stored sum) are not a change to
write and carry up the chain.
"""

import functools
import operator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from rollup_assets.compute.arrow_types import TS
from rollup_assets.model.cells import ROUNDING
from rollup_assets.model.column_types import ColumnType
from rollup_assets.model.partials import state_columns
from rollup_assets.model.specs import RollupSpec
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


def _unchanged(a: Column, b: Column, ctype: ColumnType) -> Column:
    """Equal, both null, both NaN, or (doubles) equal up to rounding."""
    exact = a.eqNullSafe(b)
    if ctype is not ColumnType.DOUBLE:
        return exact
    close = F.abs(a - b) <= F.lit(ROUNDING) * F.greatest(F.abs(a), F.abs(b))
    return exact | F.coalesce(close, F.lit(False))


def cell_changes(fresh: DataFrame, stored: DataFrame, spec: RollupSpec) -> DataFrame:
    """Every cell (entity_id, bucket_start) of `fresh` or `stored`, with `CHANGED`: do the
    partials differ, or does only one side have a row? Other columns of `fresh` (such as the
    count of source rows behind it) are kept, null for a cell only `stored` has."""
    compared = state_columns(spec)
    names = [c.name for c in compared]
    keys = ["entity_id", "bucket_start"]
    extra = [c for c in fresh.columns if c not in (*keys, "bucket_end", *names)]
    s = stored.select(*keys, *[F.col(n).alias(f"s__{n}") for n in names], F.lit(True).alias("__s"))
    f = fresh.select(*keys, *names, *extra, F.lit(True).alias("__f"))
    joined = f.join(s, on=keys, how="full_outer")
    same = functools.reduce(
        operator.and_,
        [
            F.col(c.name).eqNullSafe(F.col(f"s__{c.name}"))
            if c.listed
            else _unchanged(F.col(c.name), F.col(f"s__{c.name}"), c.type)
            for c in compared
        ],
    )
    both = F.col("__f").isNotNull() & F.col("__s").isNotNull()
    return joined.select(*keys, *extra, (~(both & same)).alias(CHANGED))


def all_new(fresh: DataFrame, spec: RollupSpec) -> DataFrame:
    """`cell_changes` when nothing is stored for any cell of `fresh`: every cell is a change
    (it appears), with the same columns, and no join."""
    names = {c.name for c in state_columns(spec)}
    keys = ["entity_id", "bucket_start"]
    extra = [c for c in fresh.columns if c not in (*keys, "bucket_end", *names)]
    return fresh.select(*keys, *extra, F.lit(True).alias(CHANGED))


def cell_changes_arrow(fresh: pa.Table, stored: pa.Table, spec: RollupSpec) -> pa.Table:
    """`cell_changes` for tables on the driver (the same rule: equality up to rounding for
    floating-point partials, NaN equal to NaN,
    a row on one side only is a change)."""
    compared = state_columns(spec)
    names = [c.name for c in compared]
    keys = ["entity_id", "bucket_start"]
    extra = [c for c in fresh.column_names if c not in (*keys, "bucket_end", *names)]

    def keyed(rows: pa.Table, index: str) -> pa.Table:
        # Only the keys and a row index join (a join carries no list column): the values are
        # taken by index afterwards, null on the side a cell is missing from.
        return pa.table(
            {
                "entity_id": rows["entity_id"].cast(pa.string()),
                "bucket_start": rows["bucket_start"].cast(TS),
                index: pa.array(range(rows.num_rows), pa.int64()),
            }
        )

    joined = keyed(fresh, "__f").join(keyed(stored, "__s"), keys, join_type="full outer")
    at_f, at_s = joined["__f"], joined["__s"]
    both = pc.and_(pc.is_valid(at_f), pc.is_valid(at_s))
    same = both
    for c in compared:
        a = pc.take(fresh[c.name], at_f)
        b = pc.take(stored[c.name].cast(fresh.schema.field(c.name).type), at_s)
        same = pc.and_(same, _lists_equal(a, b) if c.listed else _equal_or_both_missing(a, b))
    out = joined.select(keys)
    for c in extra:
        out = out.append_column(fresh.schema.field(c), pc.take(fresh[c], at_f))
    return out.append_column(CHANGED, pc.invert(same))


def _equal_or_both_missing(a: pa.ChunkedArray, b: pa.ChunkedArray) -> pa.ChunkedArray:
    same = pc.fill_null(pc.equal(a, b), False)
    same = pc.or_(same, pc.and_(pc.is_null(a), pc.is_null(b)))
    if pa.types.is_floating(a.type) and pa.types.is_floating(b.type):
        nan = pc.and_(pc.fill_null(pc.is_nan(a), False), pc.fill_null(pc.is_nan(b), False))
        scale = pc.max_element_wise(pc.abs(a), pc.abs(b))
        close = pc.less_equal(pc.abs(pc.subtract(a, b)), pc.multiply(scale, ROUNDING))
        same = pc.or_(pc.or_(same, nan), pc.fill_null(close, False))
    return same


def _lists_equal(a: pa.ChunkedArray, b: pa.ChunkedArray) -> pa.ChunkedArray:
    """Element-wise equality of two list columns (NaN equal to NaN, null lists equal)."""

    def key(v: list | None) -> tuple | None:
        return None if v is None else tuple("nan" if x != x else x for x in v)

    same = [key(x) == key(y) for x, y in zip(a.to_pylist(), b.to_pylist(), strict=True)]
    return pa.chunked_array([pa.array(same, pa.bool_())])


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
