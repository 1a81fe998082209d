"""A table's corrected cells folded at once, with Arrow and NumPy (pure transforms, no I/O).

What `folding.fold_cell` does for one cell (the reference, by the rules of `model.partials`),
`fold` does for every cell of a table in grouped operations, with the same result bit for bit:

  * the count of source rows, a column's count of values and its special values are grouped
    sums of the difference rows' lengths and counts;
  * a sum's finite total takes its cell's difference rows one at a time, in generation order:
    it adds the exact sum (`math.fsum`, as `SumState.of`) of the row's values entering and
    subtracts that of those leaving, so a cell folded in two steps (maintenance folding its
    older differences into a new base, a read folding the rest) has the same total, bit for
    bit, as one folded at once; an integer total that leaves 64 bits is refused, naming the
    column and the cell;
  * kept extremes are folded by `fold_extremes`.

A fold of a few cells (a read bringing a handful of corrected cells to now) takes them one at a
time through `fold_cell` itself: the grouped operations' fixed costs would be most of its time.

A cell whose base was written before companions were kept, whose finite sum overflowed or whose
kept extremes all left is reported, for the caller to aggregate it again from its source.
"""

import math
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollup_assets.compute.arrow_types import instants_of
from rollup_assets.compute.cell_rows import CellRows, cell_ids, flags
from rollup_assets.compute.fold_extremes import Side, fold_extreme
from rollup_assets.compute.folding import (
    STAMPS,
    CellKey,
    ColumnFold,
    FoldPlan,
    Unknowable,
    fold_cell,
)
from rollup_assets.model.aggregates import AggregateFunction
from rollup_assets.model.partials import DELTA_COLUMN, EXTREMES, GENERATION, RAW_ROWS
from rollup_assets.model.specs import ENTITY_COLUMN, RollupSpec

# An integer total whose terms add up (in absolute value) below this fits in 64 bits.
_SAFE = float(2**62)

# Cells folded one at a time (`fold_cell`), at most; more are folded in grouped operations.
# Measured on one corrected cell of a daily rollup: 0.3 ms one at a time, 3.7 ms grouped.
FEW_CELLS = 16


def fold(rows: pa.Table, spec: RollupSpec) -> tuple[pa.Table, list[CellKey]]:
    """The visible rows of some cells (each cell's base row and the difference rows after it;
    `generation` and `delta` columns present) folded into one base-shaped row per cell, and the
    cells that cannot be folded exactly (left out of the result: aggregate them again)."""
    if rows.num_rows == 0 or DELTA_COLUMN not in rows.column_names:
        return rows, []
    is_delta = flags(rows, DELTA_COLUMN)
    if not is_delta.any():
        return rows, []
    ids = cell_ids(rows)
    corrected = np.bincount(ids, weights=is_delta) > 0
    touched = corrected[ids]
    few = int(corrected.sum()) <= FEW_CELLS
    if touched.all() and not few:  # no copy of rows that are all folded
        return _fold(CellRows.of(rows, ids), spec)
    plain = rows.filter(pa.array(~touched))
    mine = rows.filter(pa.array(touched))
    folded, unknowable = _fold_each(mine, spec) if few else _fold(CellRows.of(mine), spec)
    return pa.concat_tables([plain, folded]), unknowable


def _fold_each(rows: pa.Table, spec: RollupSpec) -> tuple[pa.Table, list[CellKey]]:
    """`_fold` of a few cells, each by `fold_cell`: the same rows, bit for bit, in the same
    order (by cell: entity, then bucket start), and the same cells reported."""
    plan = FoldPlan.of(spec)
    groups: dict[tuple, list[dict]] = {}
    for row in rows.to_pylist():
        groups.setdefault((row[ENTITY_COLUMN], row["bucket_start"]), []).append(row)
    totals = [
        (c.column, c.mine["total"].name)
        for c in plan.columns
        if "total" in c.mine and pa.types.is_integer(rows.schema.field(c.mine["total"].name).type)
    ]
    # An integer total read as a double (an average's sum) rounds, as the grouped fold's does.
    doubles = [f.name for f in rows.schema if pa.types.is_floating(f.type)]
    out, lost = [], []
    for key in sorted(groups):  # str order is Arrow's (code points, as UTF-8 bytes sort)
        group = sorted(groups[key], key=lambda r: r[GENERATION] or 0)  # stable, as `CellRows`
        bases = [r for r in group if not r[DELTA_COLUMN]]
        changes = [r for r in group if r[DELTA_COLUMN]]
        try:
            row = fold_cell(bases[-1] if bases else None, changes, spec, plan=plan)
        except Unknowable:
            lost.append(key)
            continue
        if row is None:
            continue
        for column, name in totals:
            if not -(2**63) <= row[name] < 2**63:
                start = instants_of(pa.array([key[1]], rows.schema.field("bucket_start").type))
                raise _too_long(column, key[0], start[0], row[name])
        for name in doubles:
            if isinstance(row.get(name), int):
                row[name] = float(row[name])
        out.append({**row, **{s: group[-1][s] for s in STAMPS if s in group[-1]}})
    starts = instants_of(pa.array([s for _, s in lost], rows.schema.field("bucket_start").type))
    keys = [(e, s) for (e, _), s in zip(lost, starts, strict=True)]
    return pa.Table.from_pylist(out, schema=rows.schema), keys


class _Cells:
    """The cells being folded: their rows, their base rows, and the base-shaped result."""

    def __init__(self, rows: CellRows) -> None:
        self.rows = rows
        self.base = rows.bases()
        self.has_base = self.base >= 0
        self._base_at = pa.array(np.where(self.has_base, self.base, 0))
        first = np.where(self.has_base, self.base, rows.starts)
        self.out = rows.table.take(pa.array(first))

    def at_base(self, column: str) -> pa.Array:
        """Per cell, `column` of its base row (null without one)."""
        values = self.rows.table[column].take(self._base_at).combine_chunks()
        return pc.if_else(pa.array(self.has_base), values, pa.nulls(len(values), values.type))

    def ints(self, column: str) -> np.ndarray:
        """Per cell, an integer of its base row, 0 when null or without a base."""
        return pc.fill_null(self.at_base(column), 0).to_numpy(zero_copy_only=False).astype(np.int64)

    def side(self, column: str) -> Side:
        """The values (not null) of the difference rows' list `column`, with their cells."""
        values, rows = self._listed(column)
        return Side(values, self.rows.cell[rows])

    def per_row(self, column: str) -> Side:
        """The values (not null) of the difference rows' list `column`, with their rows."""
        return Side(*self._listed(column))

    def _listed(self, column: str) -> tuple[pa.Array, np.ndarray]:
        lists = self.rows.table[column].combine_chunks()
        values = pc.list_flatten(lists)
        parents = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
        keep = self.rows.delta[parents] & values.is_valid().to_numpy(zero_copy_only=False)
        at = np.flatnonzero(keep)
        return values.take(pa.array(at, pa.int64())), parents[at].astype(np.int64)

    def set(
        self, name: str, values: pa.Array | np.ndarray, valid: np.ndarray | None = None
    ) -> None:
        field = self.out.schema.field(name)
        mask = None if valid is None else ~valid
        if isinstance(values, np.ndarray):
            values = pa.array(values, mask=mask)
        elif mask is not None:
            values = pc.if_else(pa.array(valid), values, pa.nulls(len(values), values.type))
        at = self.out.schema.get_field_index(name)
        self.out = self.out.set_column(at, field, values.cast(field.type))


def _fold(rows: CellRows, spec: RollupSpec) -> tuple[pa.Table, list[CellKey]]:
    plan = FoldPlan.of(spec)
    cells = _Cells(rows)
    t = rows.table
    # A base row written before companions were kept tells nothing a difference can apply to.
    raw = cells.at_base(RAW_ROWS)
    blind = cells.has_base & ~raw.is_valid().to_numpy(zero_copy_only=False)
    lead = plan.lead
    moved = rows.per_cell(_lengths(t, lead.entering, rows.delta)) - rows.per_cell(
        _lengths(t, lead.leaving, rows.delta)
    )
    raw_rows = cells.ints(RAW_ROWS) + moved
    live = ~blind & (raw_rows > 0)
    cells.set(RAW_ROWS, raw_rows)
    unknowable = blind.copy()
    for column in plan.columns:
        unknowable |= live & _fold_column(cells, column, live)
    for stamp in STAMPS:
        if stamp in t.column_names:
            cells.set(stamp, t[stamp].take(pa.array(rows.ends - 1)).combine_chunks())
    for name in plan.differences:
        cells.set(name, pa.nulls(rows.cells, cells.out.schema.field(name).type))
    cells.set(DELTA_COLUMN, np.zeros(rows.cells, bool))
    keep = live & ~unknowable
    return cells.out.filter(pa.array(keep)), rows.keys(np.flatnonzero(unknowable))


def _lengths(t: pa.Table, column: str, delta: np.ndarray) -> np.ndarray:
    lengths = pc.fill_null(pc.list_value_length(t[column]), 0).to_numpy(zero_copy_only=False)
    return np.where(delta, lengths, 0).astype(np.int64)


def _fold_column(cells: _Cells, fold: ColumnFold, live: np.ndarray) -> np.ndarray:
    """Fold one aggregated column's companions and outputs; the cells it cannot know."""
    count = cells.rows.cells
    mine, outputs = fold.mine, fold.outputs
    entering, leaving = cells.side(fold.entering), cells.side(fold.leaving)
    base_n = cells.ints(mine["n"].name)
    n = base_n + entering.count(count) - leaving.count(count)
    cells.set(mine["n"].name, n)
    for name in outputs.get(AggregateFunction.COUNT, ()):
        cells.set(name, n)
    unknowable = np.zeros(count, bool)
    if "total" in mine:
        unknowable |= _fold_sum(cells, fold, n, entering, leaving, live)
    for kind, largest in EXTREMES.items():
        if kind not in mine:
            continue
        name = mine[kind].name
        lists = cells.at_base(name)
        lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False)
        flat = pc.list_flatten(lists)
        parents = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
        prefix = Side(flat.cast(entering.values.type), parents.astype(np.int64))
        done = fold_extreme(prefix, lengths.astype(np.int64), base_n, entering, leaving, n, largest)
        cells.set(name, done.prefix)
        function = AggregateFunction.MAX if largest else AggregateFunction.MIN
        for output in outputs.get(function, ()):
            cells.set(output, done.value)
        unknowable |= done.exhausted
    return unknowable


def _fold_sum(
    cells: _Cells, fold: ColumnFold, n: np.ndarray, entering: Side, leaving: Side, live: np.ndarray
) -> np.ndarray:
    """Fold a sum's total and special values, and the sums and averages read from them; the
    cells whose finite total overflowed."""
    count = cells.rows.cells
    mine, outputs = fold.mine, fold.outputs
    floating = pa.types.is_floating(entering.values.type)
    total_name = mine["total"].name
    if floating:
        base = pc.fill_null(cells.at_base(total_name), 0.0).to_numpy(zero_copy_only=False)
        total = _running_totals(cells, fold, base)
        overflowed = ~np.isfinite(total)
    else:
        total = _long_totals(cells, fold.column, total_name, entering, leaving, live)
        overflowed = np.zeros(count, bool)
    cells.set(total_name, total)
    specials = {}
    for kind in ("nan", "pinf", "ninf"):
        if kind in mine:
            moved = _special(entering, kind, count) - _special(leaving, kind, count)
            specials[kind] = cells.ints(mine[kind].name) + moved
            cells.set(mine[kind].name, specials[kind])
    value = total.astype(np.float64) if floating else total
    if specials:
        nan, pinf, ninf = specials["nan"], specials["pinf"], specials["ninf"]
        value = np.where(ninf > 0, -math.inf, value)
        value = np.where(pinf > 0, math.inf, value)
        value = np.where((nan > 0) | ((pinf > 0) & (ninf > 0)), math.nan, value)
    present = n > 0
    for name in outputs.get(AggregateFunction.SUM, ()):
        cells.set(name, value, present)
    for name in outputs.get(AggregateFunction.AVG, ()):
        cells.set(f"{name}__sum", value.astype(np.float64), present)
        cells.set(f"{name}__count", n)
    return overflowed


def _special(side: Side, kind: str, cells: int) -> np.ndarray:
    if not pa.types.is_floating(side.values.type):
        return np.zeros(cells, np.int64)
    v = side.values.to_numpy(zero_copy_only=False)
    hit = {"nan": np.isnan(v), "pinf": v == math.inf, "ninf": v == -math.inf}[kind]
    return np.bincount(side.cell[hit], minlength=cells).astype(np.int64)


def _running_totals(cells: _Cells, fold: ColumnFold, base: np.ndarray) -> np.ndarray:
    """Per cell, a floating total: its base's, then for each of its difference rows in
    generation order, plus the exact sum of the row's finite values entering, minus that of
    those leaving (`SumState.plus`, one difference at a time)."""
    rows = cells.rows
    count = len(rows.cell)
    entering = _exact_sums(cells.per_row(fold.entering), count)
    leaving = _exact_sums(cells.per_row(fold.leaving), count)
    total = base.astype(np.float64, copy=True)
    deltas = np.flatnonzero(rows.delta)
    if not len(deltas):
        return total
    # Rows are by cell, then generation: a difference row's rank among its cell's is its
    # position less that of the cell's first difference row.
    cell = rows.cell[deltas]
    first = np.flatnonzero(np.concatenate([[True], cell[1:] != cell[:-1]]))
    rank = np.arange(len(deltas)) - np.repeat(first, np.diff(np.append(first, len(deltas))))
    with np.errstate(invalid="ignore", over="ignore"):
        for k in range(int(rank.max()) + 1):
            at = deltas[rank == k]  # one row per cell at most
            c = rows.cell[at]
            total[c] = (total[c] + entering[at]) - leaving[at]
    return total


def _exact_sums(side: Side, cells: int) -> np.ndarray:
    """Per cell, `math.fsum` of its finite values in `side` (0.0 without any; inf when the
    sum overflows)."""
    v = side.values.to_numpy(zero_copy_only=False).astype(np.float64)
    finite = np.isfinite(v)
    v, cell = v[finite], side.cell[finite]
    counts = np.bincount(cell, minlength=cells)
    out = np.zeros(cells, np.float64)
    single = counts == 1
    np.add.at(out, cell[single[cell]], v[single[cell]] + 0.0)  # fsum([-0.0]) is 0.0
    many = np.flatnonzero(counts > 1)
    if len(many):
        order = np.argsort(cell, kind="stable")
        starts = np.cumsum(counts) - counts
        ordered = v[order].tolist()
        for c in many.tolist():
            s = int(starts[c])
            try:
                out[c] = math.fsum(ordered[s : s + int(counts[c])])
            except OverflowError:
                out[c] = math.inf
    return out


def _long_totals(
    cells: _Cells, column: str, total_name: str, entering: Side, leaving: Side, live: np.ndarray
) -> np.ndarray:
    """Per cell, an integer column's total: its base's plus what entered minus what left,
    exact; OverflowError naming the column and the cell when it leaves 64 bits."""
    fold_total = cells.ints(total_name)
    ins = entering.values.to_numpy(zero_copy_only=False).astype(np.int64)
    outs = leaving.values.to_numpy(zero_copy_only=False).astype(np.int64)
    with np.errstate(over="ignore"):
        total = fold_total.copy()
        np.add.at(total, entering.cell, ins)
        np.subtract.at(total, leaving.cell, outs)
    size = np.abs(fold_total.astype(np.float64))
    np.add.at(size, entering.cell, np.abs(ins.astype(np.float64)))
    np.add.at(size, leaving.cell, np.abs(outs.astype(np.float64)))
    for c in np.flatnonzero(live & (size >= _SAFE)).tolist():
        exact = int(fold_total[c]) + int(ins[entering.cell == c].astype(object).sum())
        exact -= int(outs[leaving.cell == c].astype(object).sum())
        if not -(2**63) <= exact < 2**63:
            entity, start = cells.rows.keys(np.array([c]))[0]
            raise _too_long(column, entity, start, exact)
    return total


def _too_long(column: str, entity: str, start: datetime, exact: int) -> OverflowError:
    return OverflowError(
        f"the sum of '{column}' in cell ({entity}, {start.isoformat()}) is {exact}, "
        "which does not fit in 64 bits"
    )
