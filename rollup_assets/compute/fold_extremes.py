"""The kept extremes of many cells folded at once (pure transforms, no I/O): the vectorized
`ExtremeState.apply` of `model.partials`, for `fold_tables`.

Values entering a cell join its prefix in one grouped, stable sort: a complete prefix takes
every value, an incomplete one those ranking at or before its last value (`ends`), exactly as
`ExtremeState.apply` takes them one by one. A cell that a value *left* is folded by
`ExtremeState.apply` itself (the reference): which of its values stay known depends on the
order of what left. Its result is spliced into the same sort.
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
    slow = leaving.count(cells) > 0
    slow_exhausted = np.zeros(cells, bool)
    parts = [prefix.pick(~slow[prefix.cell])]
    last_nan, last_value = ends(prefix, lengths)
    complete = lengths == base_n
    fast_in = entering.pick(~slow[entering.cell])
    nan, value = _keys(fast_in.values)
    c = fast_in.cell
    if largest:
        ranks_inside = (nan > last_nan[c]) | ((nan == last_nan[c]) & (value >= last_value[c]))
    else:
        ranks_inside = (nan < last_nan[c]) | ((nan == last_nan[c]) & (value <= last_value[c]))
    parts.append(fast_in.pick(complete[c] | ((lengths[c] > 0) & ranks_inside)))
    if slow.any():
        spliced, slow_exhausted = _by_reference(prefix, base_n, entering, leaving, slow, largest, k)
        parts.append(spliced)
    joined = Side.concat(parts, typ)
    nan, value = _keys(joined.values)
    if largest:
        nan = -nan
        value = -value if value.dtype.kind == "f" else ~value
    order = np.lexsort((value, nan, joined.cell))  # stable: the prefix first, then in order
    cell = joined.cell[order]
    counts = np.bincount(cell, minlength=cells)
    starts = np.cumsum(counts) - counts
    rank = np.arange(len(cell)) - starts[cell]
    keep = order[rank < k]
    kept = np.minimum(counts, k)
    offsets = np.zeros(cells + 1, np.int32)
    np.cumsum(kept, out=offsets[1:])
    values = joined.values.take(pa.array(keep, pa.int64()))
    listed = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)
    exhausted = np.where(slow, slow_exhausted, (n > 0) & (kept == 0))
    first = np.where(kept > 0, offsets[:-1], 0)
    known = (n > 0) & ~exhausted & (kept > 0)
    head = values.take(pa.array(first, pa.int64())) if len(values) else pa.nulls(cells, typ)
    value_out = pc.if_else(pa.array(known), head, pa.nulls(cells, typ))
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
