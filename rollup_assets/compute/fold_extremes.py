"""The kept extremes of many cells folded at once (pure transforms, no I/O): the vectorized
`ExtremeState.apply` of `model.partials`, for `fold_tables`.

Values entering a cell join its prefix in one grouped, stable sort: a complete prefix takes
every value, an incomplete one those ranking at or before its last value (`ends`), exactly as
`ExtremeState.apply` takes them one by one. A value leaving takes out the first known value
equal to it when it ranks inside the prefix, and one of the unknown values when it ranks after
it (`_removed`). Where the order of what left could matter (the prefix lacks a value said to
leave inside it, or more values leave after it than are unknown) the cell is folded by
`ExtremeState.apply` itself, the reference, and its result spliced in.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollup_assets.model.partials import SPARES, ExtremeState


@dataclass(frozen=True)
class Side:
    """Values of one column entering (or leaving) cells: `values` (nulls dropped), in the order
    the difference rows hold them, and the cell each belongs to."""

    values: pa.Array
    cell: np.ndarray

    def count(self, cells: int) -> np.ndarray:
        return np.bincount(self.cell, minlength=cells).astype(np.int64)

    def pick(self, mask: np.ndarray) -> "Side":
        at = np.flatnonzero(mask)
        return Side(self.values.take(pa.array(at, pa.int64())), self.cell[at])

    @staticmethod
    def concat(parts: Sequence["Side"], typ: pa.DataType) -> "Side":
        values = pa.concat_arrays([p.values.cast(typ) for p in parts])
        return Side(values, np.concatenate([p.cell for p in parts]))


@dataclass(frozen=True)
class Folded:
    """Per cell, the kept extremes after the fold, whether the cell is exhausted, and the
    extreme's value (null without values or when exhausted)."""

    prefix: pa.Array
    exhausted: np.ndarray
    value: pa.Array


def _keys(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Spark's order as two sort keys: NaN above every number, then the value."""
    if pa.types.is_floating(values.type):
        v = values.to_numpy(zero_copy_only=False).astype(np.float64)
        nan = np.isnan(v)
        return nan.astype(np.int8), np.where(nan, 0.0, v)
    return np.zeros(len(values), np.int8), values.to_numpy(zero_copy_only=False).astype(np.int64)


def ends(prefix: Side, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per cell, the sort keys of the last value of its prefix (`lengths` values each, ordered
    by cell), zeros for an empty prefix."""
    nan, value = _keys(prefix.values)
    last = np.cumsum(lengths) - 1
    has = lengths > 0
    out_nan = np.zeros(len(lengths), np.int8)
    out_value = np.zeros(len(lengths), value.dtype)
    out_nan[has], out_value[has] = nan[last[has]], value[last[has]]
    return out_nan, out_value


def _inside(side: Side, last: tuple[np.ndarray, np.ndarray], largest: bool) -> np.ndarray:
    """Which values of `side` rank at or before the last value of their cell's prefix."""
    nan, value = _keys(side.values)
    last_nan, last_value = last[0][side.cell], last[1][side.cell]
    if largest:
        return (nan > last_nan) | ((nan == last_nan) & (value >= last_value))
    return (nan < last_nan) | ((nan == last_nan) & (value <= last_value))


def _ordered(side: Side, largest: bool) -> Side:
    """`side` sorted by cell, then in the extreme's order; stable, as `ExtremeState` sorts."""
    nan, value = _keys(side.values)
    if largest:
        nan = -nan
        value = -value if value.dtype.kind == "f" else ~value
    order = np.lexsort((value, nan, side.cell))
    return Side(side.values.take(pa.array(order, pa.int64())), side.cell[order])


def _joined(prefix: Side, joining: Side, cells: int, typ: pa.DataType, largest: bool) -> Side:
    """The prefixes (in order, by cell) with the `joining` values in their place. A stored
    prefix is kept in the extreme's order, so only the cells some value joins are sorted
    again; a stable sort by cell then interleaves them with the others (two sorted runs)."""
    if not len(joining.cell):
        return prefix
    joined = np.zeros(cells, bool)
    joined[joining.cell] = True
    moved = joined[prefix.cell]
    resorted = _ordered(Side.concat([prefix.pick(moved), joining], typ), largest)
    both = Side.concat([prefix.pick(~moved), resorted], typ)
    order = np.argsort(both.cell, kind="stable")
    return Side(both.values.take(pa.array(order, pa.int64())), both.cell[order])


def _removed_in_cells(known: Side, leaving: Side, cells: int) -> tuple[np.ndarray, np.ndarray]:
    """`_removed` over the known values of the cells some value leaves only."""
    left = np.zeros(cells, bool)
    left[leaving.cell] = True
    mine = left[known.cell]
    drop = np.zeros(len(known.cell), bool)
    drop[mine], short = _removed(known.pick(mine), leaving)
    return drop, short


def _removed(known: Side, leaving: Side) -> tuple[np.ndarray, np.ndarray]:
    """Which values of `known` (ordered) the `leaving` ones take out, each the first value
    equal to it, as `ExtremeState.apply` does; and per leaving value, whether its cell held
    fewer values equal to it than left (the cell is then folded by the reference)."""
    nan, value = _keys(pa.concat_arrays([known.values, leaving.values.cast(known.values.type)]))
    cell = np.concatenate([known.cell, leaving.cell])
    tag = np.concatenate([np.zeros(len(known.cell), np.int8), np.ones(len(leaving.cell), np.int8)])
    order = np.lexsort((tag, value, nan, cell))  # a run of equal values: the known ones first
    c, n, v = cell[order], nan[order], value[order]
    new = np.ones(len(order), bool)
    new[1:] = (c[1:] != c[:-1]) | (n[1:] != n[:-1]) | (v[1:] != v[:-1])
    run = np.cumsum(new) - 1
    held = np.bincount(run, weights=tag[order] == 0).astype(np.int64)
    left = np.bincount(run, weights=tag[order] == 1).astype(np.int64)
    start = np.flatnonzero(new)[run]
    rank = np.arange(len(order)) - start
    drop = np.zeros(len(order), bool)
    drop[order] = (tag[order] == 0) & (rank < left[run])
    short = np.zeros(len(order), bool)
    short[order] = (tag[order] == 1) & (left[run] > held[run])
    return drop[: len(known.cell)], short[len(known.cell) :]


def fold_extreme(
    prefix: Side,
    lengths: np.ndarray,
    base_n: np.ndarray,
    entering: Side,
    leaving: Side,
    n: np.ndarray,
    largest: bool,
    k: int = SPARES,
) -> Folded:
    """Per cell (`lengths` and `base_n`: its prefix's length and how many values it held; `n`:
    how many it holds after), the prefix after `entering` values joined and `leaving` ones
    left."""
    cells = len(lengths)
    typ = prefix.values.type
    # What joins: every value a complete prefix, those ranking inside an incomplete one.
    complete = lengths == base_n
    joins = complete[entering.cell] | (
        (lengths[entering.cell] > 0) & _inside(entering, ends(prefix, lengths), largest)
    )
    known = _joined(prefix, entering.pick(joins), cells, typ, largest)
    counts = np.bincount(known.cell, minlength=cells)
    unknown = base_n + entering.count(cells) - counts
    # What leaves: a value ranking inside the prefix takes out the first value equal to it; one
    # ranking after it leaves the unknown values. Exactly so whatever the order they leave in
    # when the prefix holds every value inside it that leaves and there are at least as many
    # unknown values as values leaving after it; any other cell is folded by the reference.
    inside = _inside(leaving, ends(known, counts), largest)
    drop, short = _removed_in_cells(known, leaving.pick(inside), cells)
    after = np.bincount(leaving.cell[~inside], minlength=cells)
    slow = (after > unknown) | (np.bincount(leaving.cell[inside][short], minlength=cells) > 0)
    keep = known.pick(~drop & ~slow[known.cell])
    slow_exhausted = np.zeros(cells, bool)
    if slow.any():
        spliced, slow_exhausted = _by_reference(prefix, base_n, entering, leaving, slow, largest, k)
        keep = Side.concat([keep, spliced], typ)
    # Per cell, its first k values (each part is in order; a stable sort by cell joins them).
    order = np.argsort(keep.cell, kind="stable")
    cell = keep.cell[order]
    held = np.bincount(cell, minlength=cells)
    starts = np.cumsum(held) - held
    rank = np.arange(len(cell)) - starts[cell]
    kept = np.minimum(held, k)
    offsets = np.zeros(cells + 1, np.int32)
    np.cumsum(kept, out=offsets[1:])
    values = keep.values.take(pa.array(order[rank < k], pa.int64()))
    listed = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)
    exhausted = np.where(slow, slow_exhausted, (n > 0) & (kept == 0))
    first = np.where(kept > 0, offsets[:-1], 0)
    shown = (n > 0) & ~exhausted & (kept > 0)
    head = values.take(pa.array(first, pa.int64())) if len(values) else pa.nulls(cells, typ)
    value_out = pc.if_else(pa.array(shown), head, pa.nulls(cells, typ))
    return Folded(listed, exhausted, value_out)


def _by_reference(
    prefix: Side,
    base_n: np.ndarray,
    entering: Side,
    leaving: Side,
    slow: np.ndarray,
    largest: bool,
    k: int,
) -> tuple[Side, np.ndarray]:
    """The prefixes of the `slow` cells (those a value left) folded cell by cell by
    `ExtremeState.apply`, and which of them are exhausted."""

    def grouped(side: Side) -> dict[int, list]:
        mine = slow[side.cell]
        out: dict[int, list] = {}
        values = side.values.filter(pa.array(mine)).to_pylist()
        for c, v in zip(side.cell[mine].tolist(), values, strict=True):
            out.setdefault(c, []).append(v)
        return out

    known, joining, left = grouped(prefix), grouped(entering), grouped(leaving)
    exhausted = np.zeros(len(slow), bool)
    values: list = []
    cells: list[int] = []
    for c in np.flatnonzero(slow).tolist():
        state = ExtremeState(largest, tuple(known.get(c, ())), int(base_n[c]))
        state = state.apply(joining.get(c, []), left.get(c, []), k)
        exhausted[c] = state.exhausted
        values += state.prefix
        cells += [c] * len(state.prefix)
    typ = prefix.values.type
    return Side(pa.array(values, typ), np.array(cells, np.int64)), exhausted
