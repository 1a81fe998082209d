"""Differences of a rollup's cells and their folding, with Arrow (pure transforms, no I/O).

A correction does not read the cells it corrects: from the rows a change of the source replaced
(the change feed's pre-images and deletes) and the rows it wrote (post-images and inserts) it
makes, per cell of a level, one *difference row*: the values leaving the cell and those entering
it, per aggregated column (`difference_rows`). The same rows give the differences of every
level: a source row's value is a value of one cell at each level.

A read *folds* each cell's visible rows: its base row (the cell's state: partials and their
companions) and the difference rows flipped after it, in generation order, into one row of the
base's shape (`fold`), by the rules of `model.partials`. A cell whose kept extremes all left
while values remain (exhausted), or whose finite sum overflowed, cannot be folded exactly: it is
reported, for the caller to aggregate again from its source.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollup_assets.compute.arrow_types import TS
from rollup_assets.model.aggregates import DELTA_KINDS, AggregateFunction, Companion
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
from rollup_assets.model.specs import ENTITY_COLUMN, RollupSpec
from rollup_assets.model.windows import Window

# What a folded row says of the rows it folds: the newest's generation and run.
STAMPS = (GENERATION, *WRITTEN_BY)
# Change-feed change types: what leaves a cell and what enters it.
LEAVING = frozenset({"delete", "update_preimage"})
ENTERING = frozenset({"insert", "update_postimage"})

CellKey = tuple[str, datetime]


def difference_rows(
    changes: pa.Table,
    spec: RollupSpec,
    time_column: str,
    change_type: str,
    bucket_of: Callable[[datetime], Window],
) -> pa.Table:
    """One difference row per cell of `spec` that `changes` (source rows with their change
    type in `change_type`, their time in `time_column`) touch: entity_id, bucket_start,
    bucket_end, `delta` true, and per aggregated column the values entering and leaving the
    cell (its companions of kinds `in` and `out`). `bucket_of` maps a time to its bucket."""
    kinds = changes[change_type].to_pylist()
    times = changes[time_column].to_pylist()
    entities = changes[ENTITY_COLUMN].to_pylist()
    columns = spec.aggregated_columns
    values = {c: changes[c].to_pylist() for c in columns}
    cells: dict[CellKey, tuple[Window, dict[str, tuple[list, list]]]] = {}
    buckets: dict[datetime, Window] = {}
    for i, (kind, t, entity) in enumerate(zip(kinds, times, entities, strict=True)):
        if kind not in LEAVING and kind not in ENTERING:
            continue
        w = buckets.get(t)
        if w is None:
            w = buckets[t] = bucket_of(t)
        key = (entity, w.start)
        if key not in cells:
            cells[key] = (w, {c: ([], []) for c in columns})
        side = 0 if kind in ENTERING else 1
        for c in columns:
            cells[key][1][c][side].append(values[c][i])
    ordered = sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][0]))
    out: dict[str, Any] = {
        ENTITY_COLUMN: pa.array([k[0] for k, _ in ordered], pa.string()),
        "bucket_start": pa.array([w.start for _, (w, _) in ordered], TS),
        "bucket_end": pa.array([w.end for _, (w, _) in ordered], TS),
        DELTA_COLUMN: pa.array([True] * len(ordered), pa.bool_()),
    }
    for fold in FoldPlan.of(spec).columns:
        c = fold.column
        typ = pa.list_(changes.schema.field(c).type)
        out[fold.entering] = pa.array([v[c][0] for _, (_, v) in ordered], typ)
        out[fold.leaving] = pa.array([v[c][1] for _, (_, v) in ordered], typ)
    return pa.table(out)


def fold(rows: pa.Table, spec: RollupSpec) -> tuple[pa.Table, list[CellKey]]:
    """The visible rows of some cells (each cell's base row and the difference rows after it;
    `generation` and `delta` columns present) folded into one base-shaped row per cell, and the
    cells that cannot be folded exactly (left out of the result: aggregate them again)."""
    if rows.num_rows == 0 or DELTA_COLUMN not in rows.column_names:
        return rows, []
    is_delta = pc.fill_null(rows[DELTA_COLUMN], False)
    if not pc.any(is_delta).as_py():
        return rows, []
    keys = _keys(rows)
    touched = {keys[i] for i in np.flatnonzero(is_delta.to_numpy(zero_copy_only=False))}
    in_touched = np.fromiter((k in touched for k in keys), dtype=bool, count=len(keys))
    plain = rows.filter(pa.array(~in_touched))
    deltas = rows.filter(pa.array(in_touched))
    folded, exhausted = _fold_cells(deltas, spec)
    base_shape = plain.schema
    if folded:
        made = pa.Table.from_pylist(folded, schema=base_shape)
        plain = pa.concat_tables([plain, made])
    return plain, exhausted


def _keys(rows: pa.Table) -> list[CellKey]:
    return list(zip(rows[ENTITY_COLUMN].to_pylist(), rows["bucket_start"].to_pylist(), strict=True))


def _fold_cells(rows: pa.Table, spec: RollupSpec) -> tuple[list[dict], list[CellKey]]:
    """Fold the cells whose rows (base and differences) are `rows`, cell by cell."""
    records = rows.to_pylist()
    by_cell: dict[CellKey, list[dict]] = {}
    for r in records:
        by_cell.setdefault((r[ENTITY_COLUMN], r["bucket_start"]), []).append(r)
    plan = FoldPlan.of(spec)
    folded, exhausted = [], []
    for key, group in by_cell.items():
        group.sort(key=lambda r: r[GENERATION])
        bases = [r for r in group if not r.get(DELTA_COLUMN)]
        base = bases[-1] if bases else None
        changes = [r for r in group if r.get(DELTA_COLUMN)]
        try:
            row = fold_cell(base, changes, spec, plan=plan)
        except Unknowable:
            exhausted.append(key)
            continue
        if row is not None:
            # The folded state is the newest row's: its generation, job, run and source versions.
            newest = group[-1]
            for stamp in STAMPS:
                if stamp in newest:
                    row[stamp] = newest[stamp]
            folded.append(row)
    return folded, exhausted


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
            total = total.plus(SumState.of(entering)).plus(SumState.of(leaving), sign=-1)
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
