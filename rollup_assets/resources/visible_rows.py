"""Which of a rollup's rows its pointers (`genmap`) make visible.

A rollup's row table holds *base* rows (a cell's state: partials and companions) and
*difference* rows (a change of a cell's values: `compute.folding`), of every generation.

  * A base pointer says which generation's base row a cell shows: the newest base pointer
    covering it, i.e. max(bucket pointer, entity pointer), and 0 when none covers it (the
    forward lane's rows). Only that generation's base row is visible: a cell the flip left
    without a row (its source rows all gone) shows none, whatever older rows hold.
  * A difference pointer (always a cell's own) says up to which generation the cell's
    difference rows are visible: those newer than its base and not newer than the pointer. A
    read folds them into the base (`compute.folding.fold`).

Generations only grow, so "newest" is "largest"; `visible_mask` (Arrow) and
`resolve_visible_spark` (Spark) are the two readings of that rule, and `live_files` applies it
to file statistics before any file is read. `PointerIndex` holds the newest pointers per bucket
and per cell, grouped once for a caller that masks many files against the same pointers.
"""

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rollup_assets.compute.arrow_types import TS
from rollup_assets.model.windows import micros


def is_delta_pointer(pointers: pa.Table) -> pa.ChunkedArray:
    """Mask: is each pointer a difference pointer?"""
    return pc.fill_null(pointers["delta"], False)


def base_pointers(pointers: pa.Table) -> pa.Table:
    return pointers.filter(pc.invert(is_delta_pointer(pointers)))


def split_pointers(pointers: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Of the base pointers: (bucket pointers: bucket_start, g_all), (cell pointers:
    bucket_start, entity_id, g_entity), the newest of each."""
    pointers = base_pointers(pointers)
    is_global = pc.is_null(pointers["entity_id"])
    g = pointers.filter(is_global).group_by("bucket_start").aggregate([("generation", "max")])
    g = g.rename_columns(["bucket_start", "g_all"])
    s = (
        pointers.filter(pc.invert(is_global))
        .group_by(["bucket_start", "entity_id"])
        .aggregate([("generation", "max")])
    )
    s = s.rename_columns(["bucket_start", "entity_id", "g_entity"])
    return g, s


def delta_pointers(pointers: pa.Table) -> pa.Table:
    """The difference pointers: bucket_start, entity_id, g_delta (the newest per cell)."""
    d = pointers.filter(is_delta_pointer(pointers))
    d = d.group_by(["bucket_start", "entity_id"]).aggregate([("generation", "max")])
    return d.rename_columns(["bucket_start", "entity_id", "g_delta"])


@dataclass(frozen=True)
class PointerIndex:
    """A rollup's pointers grouped for masks: the newest base pointer of each bucket (`g`:
    bucket_start, g_all) and of each cell (`s`: bucket_start, entity_id, g_entity), and the
    newest difference pointer of each cell (`d`: bucket_start, entity_id, g_delta)."""

    g: pa.Table
    s: pa.Table
    d: pa.Table

    @classmethod
    def of(cls, pointers: "pa.Table | PointerIndex") -> "PointerIndex":
        if isinstance(pointers, PointerIndex):
            return pointers
        g, s = split_pointers(pointers)
        return cls(g, s, delta_pointers(pointers))


def live_files(files: list[dict], pointers: pa.Table) -> list[dict]:
    """`files` (rows of `file_actions` of a rollup's row table) less those whose every row is
    superseded, told from statistics alone: a file whose newest generation is older than the
    bucket base pointer of every bucket from its first to its last (contiguous bucket pointers,
    so no bucket between them lacks one). A visible row's generation is at least its bucket's
    base pointer, so none of that file's rows can be visible. A file without statistics is
    kept."""
    pointers = base_pointers(pointers)
    is_global = pc.is_null(pointers["entity_id"])
    if not pointers.num_rows or not pc.any(is_global).as_py():
        return files
    g = (
        pointers.filter(is_global)
        .group_by(["bucket_start", "bucket_end"])
        .aggregate([("generation", "max")])
        .sort_by("bucket_start")
    )
    starts = g["bucket_start"].cast(TS).cast(pa.int64()).to_numpy()
    ends = g["bucket_end"].cast(TS).cast(pa.int64()).to_numpy()
    gens = g["generation_max"].to_numpy()
    # gaps[k]: how many neighbouring pointers before pointer k do not meet (a bucket between
    # them has no global pointer).
    gaps = np.concatenate([[0], np.cumsum(ends[:-1] != starts[1:])])
    out = []
    for f in files:
        lo, hi, newest = (
            f.get("min.bucket_start"),
            f.get("max.bucket_start"),
            f.get("max.generation"),
        )
        if lo is None or hi is None or newest is None:
            out.append(f)
            continue
        i = int(np.searchsorted(starts, micros(lo), side="left"))
        j = int(np.searchsorted(starts, micros(hi), side="right")) - 1
        covered = (
            i <= j
            and starts[i] == micros(lo)
            and starts[j] == micros(hi)
            and gaps[j] == gaps[i]
            and gens[i : j + 1].min() > newest
        )
        if not covered:
            out.append(f)
    return out


def visible_mask(rows: pa.Table, pointers: "pa.Table | PointerIndex") -> pa.ChunkedArray:
    """For rows with (bucket_start, entity_id, generation, and `delta` when difference rows may
    be among them): is each row visible (see the module)? A base row when its generation is its
    cell's base pointer, a difference row when newer than that and not newer than its cell's
    difference pointer. `pointers`: the rollup's pointers, or their `PointerIndex`."""
    n = rows.num_rows
    if n == 0:
        return pa.chunked_array([pa.array([], pa.bool_())])
    index = PointerIndex.of(pointers)
    base = base_generation(rows, index)
    generation = rows["generation"].to_numpy(zero_copy_only=False)
    if "delta" not in rows.column_names:
        return pa.chunked_array([pa.array(generation == base, pa.bool_())])
    is_delta = pc.fill_null(rows["delta"], False).to_numpy(zero_copy_only=False)
    visible = ~is_delta & (generation == base)
    if is_delta.any():
        upto = _delta_generation(rows, index)
        visible |= is_delta & (generation > base) & (generation <= upto)
    return pa.chunked_array([pa.array(visible, pa.bool_())])


def base_generation(rows: pa.Table, pointers: "pa.Table | PointerIndex") -> np.ndarray:
    """Per row (bucket_start, entity_id), its cell's base pointer (0 without one)."""
    index = PointerIndex.of(pointers)
    if not index.g.num_rows and not index.s.num_rows:
        return np.zeros(rows.num_rows, dtype=np.int64)
    g, s = index.g, index.s
    starts = rows["bucket_start"].cast(TS)
    # Bucket pointers: a lookup by bucket start, in row order (no join, no re-sort).
    at = pc.index_in(starts, value_set=g["bucket_start"])
    base = pc.fill_null(pc.take(g["g_all"], at), 0).to_numpy().copy()
    if s.num_rows:
        _raise_at(base, rows, starts, s, "g_entity")
    return base


def _delta_generation(rows: pa.Table, index: PointerIndex) -> np.ndarray:
    """Per row, its cell's difference pointer (0 without one)."""
    upto = np.zeros(rows.num_rows, dtype=np.int64)
    if index.d.num_rows:
        _raise_at(upto, rows, rows["bucket_start"].cast(TS), index.d, "g_delta")
    return upto


def _raise_at(
    values: np.ndarray, rows: pa.Table, starts: pa.ChunkedArray, cells: pa.Table, column: str
) -> None:
    """values[i] = max(values[i], cells' `column` of row i's cell), for the rows of those cells
    (few: the corrected entities), joined on (bucket_start, entity_id)."""
    candidates = pc.is_in(rows["entity_id"], value_set=pc.unique(cells["entity_id"]))
    picked = pc.indices_nonzero(candidates)
    if not len(picked):
        return
    keyed = pa.table(
        {
            "__i": picked,
            "bucket_start": pc.take(starts, picked),
            "entity_id": pc.take(rows["entity_id"], picked),
        }
    ).join(cells, ["bucket_start", "entity_id"], join_type="inner")
    if keyed.num_rows:
        i = keyed["__i"].to_numpy()
        values[i] = np.maximum(values[i], keyed[column].to_numpy())


def covered_mask(rows: pa.Table, pointers: pa.Table) -> pa.ChunkedArray:
    """For rows with (bucket_start, entity_id): does one of `pointers` cover each row's cell (a
    global pointer of its bucket, or an entity pointer of its bucket and entity)?"""
    n = rows.num_rows
    if n == 0 or pointers.num_rows == 0:
        return pa.chunked_array([pa.array(np.zeros(n, dtype=bool), pa.bool_())])
    is_global = pc.is_null(pointers["entity_id"])
    g = pointers.filter(is_global)
    s = pointers.filter(pc.invert(is_global)).group_by(["bucket_start", "entity_id"]).aggregate([])
    starts = rows["bucket_start"].cast(TS)
    covered = pc.fill_null(pc.is_in(starts, value_set=g["bucket_start"]), False)
    mask = covered.to_numpy(zero_copy_only=False).copy()
    if s.num_rows:
        keyed = pa.table(
            {
                "__i": pa.array(np.arange(n), pa.int64()),
                "bucket_start": starts,
                "entity_id": rows["entity_id"],
            }
        ).join(
            s.select(["bucket_start", "entity_id"]),
            ["bucket_start", "entity_id"],
            join_type="inner",
        )
        mask[keyed["__i"].to_numpy()] = True
    return pa.chunked_array([pa.array(mask, pa.bool_())])


def resolve_visible_spark(spark: SparkSession, rows: DataFrame, pointers: pa.Table) -> DataFrame:
    """Keep the visible rows (`visible_mask`): a base row of its cell's base pointer's
    generation, a difference row newer than that and not newer than its difference pointer."""
    if pointers.num_rows == 0:
        return rows.where((F.col("generation") == 0) & ~F.coalesce(F.col("delta"), F.lit(False)))
    g, s = split_pointers(pointers)
    d = delta_pointers(pointers)
    out = rows
    base = F.lit(0)
    if g.num_rows:
        out = out.join(F.broadcast(spark.createDataFrame(g)), on="bucket_start", how="left")
        base = F.greatest(base, F.coalesce(F.col("g_all"), F.lit(0)))
    if s.num_rows:
        out = out.join(
            F.broadcast(spark.createDataFrame(s)), on=["bucket_start", "entity_id"], how="left"
        )
        base = F.greatest(base, F.coalesce(F.col("g_entity"), F.lit(0)))
    is_delta = F.coalesce(F.col("delta"), F.lit(False))
    visible = ~is_delta & (F.col("generation") == base)
    if d.num_rows:
        out = out.join(
            F.broadcast(spark.createDataFrame(d)), on=["bucket_start", "entity_id"], how="left"
        )
        upto = F.coalesce(F.col("g_delta"), F.lit(0))
        visible = visible | (
            is_delta & (F.col("generation") > base) & (F.col("generation") <= upto)
        )
    cols = rows.columns
    return out.where(visible).select(*cols)
