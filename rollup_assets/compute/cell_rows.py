"""Rows grouped by the cell they are of, with NumPy (pure transforms, no I/O): the grouping
every vectorized fold of a rollup's rows starts from.

A cell is an (entity, bucket_start) pair. `CellRows` holds some rows sorted by cell and, within
a cell, by generation (rows of one generation in their order in the table), and the bounds of
each cell's run of rows, so that a per-cell reduction is one NumPy call over the whole table.
"""

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollup_assets.compute.arrow_types import instants_of
from rollup_assets.compute.folding import CellKey, entity_ranks
from rollup_assets.model.partials import DELTA_COLUMN, GENERATION
from rollup_assets.model.specs import ENTITY_COLUMN


def cell_ids(rows: pa.Table) -> np.ndarray:
    """Per row of `rows`, a dense number of its cell (0 .. cells - 1, in (entity, bucket)
    order)."""
    if rows.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    entity = entity_ranks(rows[ENTITY_COLUMN])
    start = rows["bucket_start"].cast(pa.int64()).to_numpy(zero_copy_only=False)
    order = np.lexsort((start, entity))
    e, s = entity[order], start[order]
    new = np.empty(len(order), dtype=bool)
    new[0] = True
    new[1:] = (e[1:] != e[:-1]) | (s[1:] != s[:-1])
    ids = np.empty(len(order), dtype=np.int64)
    ids[order] = np.cumsum(new) - 1
    return ids


def flags(rows: pa.Table, column: str) -> np.ndarray:
    """A boolean column as a NumPy array, null read as false."""
    return pc.fill_null(rows[column], False).to_numpy(zero_copy_only=False).astype(bool)


@dataclass(frozen=True)
class CellRows:
    """`table`: some rows sorted by cell, then generation; `cell`: each row's cell number;
    `starts`, `ends`: each cell's run of rows; `delta`: which rows are difference rows."""

    table: pa.Table
    cell: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    delta: np.ndarray

    @classmethod
    def of(cls, rows: pa.Table, ids: np.ndarray | None = None) -> "CellRows":
        """`rows` grouped by cell (`ids`: their `cell_ids`, when known)."""
        ids = cell_ids(rows) if ids is None else ids
        generation = pc.fill_null(rows[GENERATION], 0).to_numpy(zero_copy_only=False)
        order = np.lexsort((generation, ids))  # stable: a generation's rows keep their order
        table = rows.take(pa.array(order))
        cell = ids[order]
        count = np.bincount(cell, minlength=int(cell[-1]) + 1 if len(cell) else 0)
        ends = np.cumsum(count)
        return cls(table, cell, ends - count, ends, flags(table, DELTA_COLUMN))

    @property
    def cells(self) -> int:
        return len(self.starts)

    def per_cell(self, values: np.ndarray) -> np.ndarray:
        """The int64 sum per cell of `values`, one per row."""
        out = np.zeros(self.cells, dtype=np.int64)
        np.add.at(out, self.cell, values)
        return out

    def bases(self) -> np.ndarray:
        """Per cell, the row of its newest base (a row that is not a difference), or -1."""
        out = np.full(self.cells, -1, dtype=np.int64)
        at = np.flatnonzero(~self.delta)
        np.maximum.at(out, self.cell[at], at)
        return out

    def keys(self, cells: np.ndarray) -> list[CellKey]:
        """The (entity, bucket_start) of some cells."""
        picked = self.table.take(pa.array(self.starts[cells], pa.int64()))
        return list(
            zip(picked[ENTITY_COLUMN].to_pylist(), instants_of(picked["bucket_start"]), strict=True)
        )
