"""Differences of a rollup's cells and their folding, with Arrow (pure transforms, no I/O).

A correction does not read the cells it corrects: from the rows a change of the source replaced
(the change feed's pre-images and deletes) and the rows it wrote (post-images and inserts) it
makes, per cell of a level, one *difference row*: the values leaving the cell and those entering
it, per aggregated column (`difference_rows`). The same rows give the differences of every
level: a source row's value is a value of one cell at each level.

A read *folds* each cell's visible rows: its base row (the cell's state: partials and their
companions) and the difference rows flipped after it, in generation order, into one row of the
base's shape (`fold_cell`, by the rules of `model.partials`; `fold_tables.fold` does it for a
whole table at once). A cell whose kept extremes all left while values remain (exhausted), or
whose finite sum overflowed, cannot be folded exactly: it is reported, for the caller to
aggregate again from its source.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollup_assets.compute.arrow_types import TS, instants
from rollup_assets.model.aggregates import DELTA_KINDS, AggregateFunction, Companion
from rollup_assets.model.bucketing import Bucketing
from rollup_assets.model.partials import (
    DELTA_COLUMN,
    EXTREMES,
    GENERATION,
    RAW_ROWS,
    SPECIAL_KINDS,
    WRITTEN_BY,
    ExtremeState,
    SumState,
)
from rollup_assets.model.specs import ENTITY_COLUMN, Alignment, RollupSpec
from rollup_assets.model.windows import EPOCH, micros

# What a folded row says of the rows it folds: the newest's generation and run.
STAMPS = (GENERATION, *WRITTEN_BY)
# Change-feed change types: what leaves a cell and what enters it.
LEAVING = frozenset({"delete", "update_preimage"})
ENTERING = frozenset({"insert", "update_postimage"})

CellKey = tuple[str, datetime]


def bucket_bounds(
    times: pa.ChunkedArray | pa.Array, bucketing: Bucketing
) -> tuple[np.ndarray, np.ndarray]:
    """Per time of `times` (instants, not null), the start and end of its bucket in
    microseconds: each bucket is worked out once, from the first of its distinct instants in
    order, and holds every instant before its end."""
    at = times.cast(TS).cast(pa.int64()).to_numpy(zero_copy_only=False)
    if bucketing.alignment is Alignment.FIXED_SIZE and bucketing.size is not None:
        # An absolute duration from the origin (`Bucketing.floor`), for every row at once;
        # numpy's remainder floors as Python's does, so times before the origin fall right too.
        step = bucketing.size // timedelta(microseconds=1)
        starts = at - np.remainder(at - micros(bucketing.origin), step)
        return starts, starts + step
    distinct, index = np.unique(at, return_inverse=True)
    starts = np.empty(len(distinct), dtype=np.int64)
    ends = np.empty(len(distinct), dtype=np.int64)
    i = 0
    while i < len(distinct):
        w = bucketing.window_of(EPOCH + timedelta(microseconds=int(distinct[i])))
        j = int(np.searchsorted(distinct, micros(w.end), side="left"))
        starts[i:j], ends[i:j] = micros(w.start), micros(w.end)
        i = j
    return starts[index], ends[index]


@dataclass(frozen=True)
class RowCells:
    """The distinct cells (bucket start, entity) that some rows fall in at one bucketing, and
    each row's cell (an index into `cells`): a question about a row's cell is asked once per
    cell, however many rows it holds."""

    cells: list[tuple[datetime, str]]
    index: np.ndarray

    @classmethod
    def of(cls, rows: pa.Table, time_column: str, bucketing: Bucketing) -> "RowCells":
        """The cells of `rows` (times in `time_column`, not null; entities in ENTITY_COLUMN)."""
        if rows.num_rows == 0:
            return cls([], np.zeros(0, dtype=np.int64))
        starts, _ = bucket_bounds(rows[time_column], bucketing)
        names = pc.dictionary_encode(rows[ENTITY_COLUMN])
        names = names.combine_chunks() if isinstance(names, pa.ChunkedArray) else names
        codes = names.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        dictionary = names.dictionary.to_pylist()
        buckets, bucket = np.unique(starts, return_inverse=True)
        # One key per (bucket, entity), ordered by bucket then entity code.
        distinct, index = np.unique(bucket * len(dictionary) + codes, return_inverse=True)
        made = instants(buckets)
        cells = [
            (made[k // len(dictionary)], dictionary[k % len(dictionary)]) for k in distinct.tolist()
        ]
        return cls(cells, index.reshape(-1))

    def each(self, answer: Callable[[datetime, str], Any], dtype: Any) -> np.ndarray:
        """Per row, `answer(bucket_start, entity)` for its cell."""
        per_cell = np.fromiter((answer(s, e) for s, e in self.cells), dtype, len(self.cells))
        return per_cell[self.index]


def entity_ranks(entities: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Per row, its entity's rank among the distinct entities in their order (an int64 key
    that sorts as the names do)."""
    names = pc.dictionary_encode(entities)
    names = names.combine_chunks() if isinstance(names, pa.ChunkedArray) else names
    rank = np.argsort(np.argsort(names.dictionary.to_numpy(zero_copy_only=False)))
    return rank[names.indices.to_numpy(zero_copy_only=False)].astype(np.int64)


def difference_rows(
    changes: pa.Table,
    spec: RollupSpec,
    time_column: str,
    change_type: str,
    bucketing: Bucketing,
) -> pa.Table:
    """One difference row per cell of `spec` that `changes` (source rows with their change
    type in `change_type`, their time in `time_column`) touch, ordered by bucket then entity:
    entity_id, bucket_start, bucket_end, `delta` true, and per aggregated column the values
    entering and leaving the cell (its companions of kinds `in` and `out`), in the order of
    `changes`. `bucketing` is the level's."""
    kinds = changes[change_type]
    entering = pc.fill_null(pc.is_in(kinds, pa.array(sorted(ENTERING))), False)
    leaving = pc.fill_null(pc.is_in(kinds, pa.array(sorted(LEAVING))), False)
    rows = changes.filter(pc.or_(entering, leaving))
    side = pc.is_in(rows[change_type], pa.array(sorted(ENTERING))).to_numpy(zero_copy_only=False)
    starts, ends = (
        bucket_bounds(rows[time_column], bucketing)
        if rows.num_rows
        else (
            np.zeros(0, np.int64),
            np.zeros(0, np.int64),
        )
    )
    entity = entity_ranks(rows[ENTITY_COLUMN])
    order = np.lexsort((entity, starts))  # stable: a cell's values keep their order
    s, e = starts[order], entity[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (s[1:] != s[:-1]) | (e[1:] != e[:-1])
    cell = np.cumsum(new) - 1
    first = order[new]
    count = len(first)
    out: dict[str, Any] = {
        ENTITY_COLUMN: rows[ENTITY_COLUMN].take(pa.array(first, pa.int64())).cast(pa.string()),
        "bucket_start": pa.array(starts[first], pa.int64()).cast(TS),
        "bucket_end": pa.array(ends[first], pa.int64()).cast(TS),
        DELTA_COLUMN: pa.array(np.ones(count, dtype=bool)),
    }
    for fold in FoldPlan.of(spec).columns:
        values = rows[fold.column].combine_chunks()
        for name, mine in ((fold.entering, side[order]), (fold.leaving, ~side[order])):
            offsets = np.zeros(count + 1, dtype=np.int32)
            np.cumsum(np.bincount(cell[mine], minlength=count), out=offsets[1:])
            picked = values.take(pa.array(order[mine], pa.int64()))
            out[name] = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), picked)
    return pa.table(out)


class Unknowable(Exception):
    """A cell whose state its base and differences no longer tell exactly."""


@dataclass(frozen=True)
class ColumnFold:
    """What folding one aggregated column touches: its companions by kind, and the outputs of
    its aggregations by function."""

    column: str
    mine: dict[str, Companion]
    outputs: dict[AggregateFunction, tuple[str, ...]]

    @property
    def entering(self) -> str:
        """A difference row's column of the values entering the cell."""
        return self.mine["in"].name

    @property
    def leaving(self) -> str:
        """A difference row's column of the values leaving the cell."""
        return self.mine["out"].name


@dataclass(frozen=True)
class FoldPlan:
    """Per rollup spec, worked out once for all the cells one fold folds: per aggregated
    column what folding it touches, and the columns only difference rows hold."""

    columns: tuple[ColumnFold, ...]
    differences: frozenset[str]

    @property
    def lead(self) -> ColumnFold:
        """The first aggregated column: its values entering and leaving a cell (nulls
        included) count the cell's source rows."""
        return self.columns[0]

    @classmethod
    def of(cls, spec: RollupSpec) -> "FoldPlan":
        companions = spec.companions
        columns = []
        for column in spec.aggregated_columns:
            outputs: dict[AggregateFunction, list[str]] = {}
            for agg in spec.aggregations:
                if agg.column == column:
                    outputs.setdefault(agg.function, []).append(agg.output_name)
            columns.append(
                ColumnFold(
                    column,
                    {c.kind: c for c in companions if c.column == column},
                    {f: tuple(names) for f, names in outputs.items()},
                )
            )
        differences = frozenset(c.name for c in companions if c.kind in DELTA_KINDS)
        return cls(tuple(columns), differences)


def fold_cell(
    base: dict | None,
    changes: Sequence[dict],
    spec: RollupSpec,
    *,
    unknown: bool = False,
    plan: FoldPlan | None = None,
) -> dict | None:
    """A cell's base row (None: the cell had no row) with its `changes` (difference rows, in
    generation order) applied: a base-shaped row, None when no source row is left in the cell.
    Raises Unknowable when the result cannot be known exactly (an extreme exhausted, a finite
    sum overflowed, a base row without companions); with `unknown`, an exhausted extreme is
    null instead (a preview: the value is known once the cell is aggregated again). `plan`:
    `FoldPlan.of(spec)`, when the caller folds many cells."""
    plan = plan or FoldPlan.of(spec)
    first = base or changes[0]
    row = {k: v for k, v in first.items() if k not in plan.differences}
    row[DELTA_COLUMN] = False
    if base is not None and base.get(RAW_ROWS) is None:
        raise Unknowable("a row written before companions were kept")
    lead = plan.lead
    moved = sum(len(d.get(lead.entering) or []) - len(d.get(lead.leaving) or []) for d in changes)
    row[RAW_ROWS] = ((base or {}).get(RAW_ROWS) or 0) + moved
    if row[RAW_ROWS] <= 0:
        return None
    for fold in plan.columns:
        column, mine, outputs = fold.column, fold.mine, fold.outputs
        n = (base or {}).get(mine["n"].name) or 0
        entering: list = []
        leaving: list = []
        for d in changes:
            entering += list(d.get(fold.entering) or [])
            leaving += list(d.get(fold.leaving) or [])
        added = sum(v is not None for v in entering) - sum(v is not None for v in leaving)
        row[mine["n"].name] = n + added
        if "total" in mine:
            total = _sum_state(base, mine) if base is not None else SumState()
            for d in changes:  # one difference at a time: a fold in steps ends the same
                total = total.plus(SumState.of(d.get(fold.entering) or ())).plus(
                    SumState.of(d.get(fold.leaving) or ()), sign=-1
                )
            if total.overflowed:
                raise Unknowable(f"the finite sum of {column} overflowed")
            row[mine["total"].name] = total.total
            for k in SPECIAL_KINDS:
                if k in mine:
                    row[mine[k].name] = getattr(total, k)
            for name in outputs.get(AggregateFunction.SUM, ()):
                row[name] = total.value
            for name in outputs.get(AggregateFunction.AVG, ()):
                row[f"{name}__sum"] = total.value
                row[f"{name}__count"] = total.n
        for kind, largest in EXTREMES.items():
            if kind not in mine:
                continue
            prefix = tuple((base or {}).get(mine[kind].name) or ())
            state = ExtremeState(largest, prefix, n).apply(entering, leaving)
            if state.exhausted and not unknown:
                raise Unknowable(f"every kept extreme of {column} left the cell")
            row[mine[kind].name] = list(state.prefix)
            value = None if state.n == 0 or state.exhausted else state.value
            for name in outputs.get(
                AggregateFunction.MAX if largest else AggregateFunction.MIN, ()
            ):
                row[name] = value
        for name in outputs.get(AggregateFunction.COUNT, ()):
            row[name] = n + added
    return row


def _sum_state(base: dict, mine: dict[str, Companion]) -> SumState:
    get = base.get
    return SumState(
        get(mine["total"].name) or 0,
        get(mine["n"].name) or 0,
        get(mine["nan"].name) or 0 if "nan" in mine else 0,
        get(mine["pinf"].name) or 0 if "pinf" in mine else 0,
        get(mine["ninf"].name) or 0 if "ninf" in mine else 0,
    )
