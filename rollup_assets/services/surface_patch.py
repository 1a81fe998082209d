"""A lagging surface's rows patched with the cells that changed since its publish: their active
rows read from the row table (`fresh_rows`) take their old rows' places (`patched`), so a read
while the surface lags costs its changed cells, not a resolution of every pointer.
"""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollup_assets.compute.arrow_types import by_start_and_entity
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import Window
from rollup_assets.resources.rollup_snapshots import Snapshot
from rollup_assets.services.engine import Engine
from rollup_assets.services.surface_changes import Changed
from rollup_assets.services.surface_files import active_rows


def fresh_rows(
    engine: Engine,
    spec: RollupSpec,
    schema: pa.Schema,
    snap: Snapshot,
    changed: Changed,
    window: Window,
) -> pa.Table:
    """The active rows in `snap` of the `changed` cells starting in `window`, in the surface's
    columns (`schema`) and in query order, read from the row table (only the row groups that
    may hold them)."""
    inside = [
        Window(max(s.start, window.start), min(s.end, window.end))
        for s in changed.spans
        if s.start < window.end and window.start < s.end
    ]
    return active_rows(engine, spec, snap, inside, changed, schema)


def patched(rows: pa.Table, changed: Changed, fresh: pa.Table, ordered: bool) -> pa.Table:
    """The surface's `rows` with the `changed` cells' rows replaced by `fresh` ones (their
    `fresh_rows`). In query order when `rows` are (`ordered`): a changed cell that is still
    there takes its old row's place; new or removed cells make it sort again."""
    fresh = fresh.select(rows.column_names).cast(rows.schema)
    if not ordered:
        drop = pc.fill_null(changed.mask(rows), False)
        return pa.concat_tables([rows.filter(pc.invert(drop)), fresh])
    at = _changed_at(rows, changed)
    if _same_cells(rows, at, fresh):
        return _replaced(rows, at, fresh)
    keep = np.ones(rows.num_rows, dtype=bool)
    keep[at] = False
    return by_start_and_entity(pa.concat_tables([rows.filter(pa.array(keep)), fresh]))


def _changed_at(rows: pa.Table, changed: Changed) -> np.ndarray:
    """The positions of `changed` cells' rows among `rows` (in query order): only the rows of
    the changed buckets, contiguous runs found by bucket start, are matched against them."""
    starts = rows["bucket_start"].cast(pa.int64()).to_numpy()
    buckets = np.unique(changed.pointers["bucket_start"].cast(pa.int64()).to_numpy())
    lows = np.searchsorted(starts, buckets, "left")
    highs = np.searchsorted(starts, buckets, "right")
    runs = [np.arange(a, b) for a, b in zip(lows.tolist(), highs.tolist(), strict=True)]
    for w in changed.whole_buckets:
        bounds = pa.array([w.start, w.end], rows.schema.field("bucket_start").type)
        lo, hi = np.searchsorted(starts, bounds.cast(pa.int64()).to_numpy(), "left")
        runs.append(np.arange(lo, hi))
    # Distinct buckets' runs are disjoint; a whole bucket's may repeat one of them.
    near = np.concatenate([np.zeros(0, dtype=np.int64), *runs])
    if changed.whole_buckets:
        near = np.unique(near)
    if len(near) == 0:
        return near
    keys = rows.select(["bucket_start", "entity_id"]).take(pa.array(near))
    hit = pc.fill_null(changed.mask(keys), False)
    return near[hit.to_numpy(zero_copy_only=False)]


# Rows replaced in place, at most, by slicing around them (more are gathered in one `take`,
# which copies every row but leaves one chunk, not two per row replaced).
SLICED_REPLACEMENTS = 64


# The columns `_same_cells` found equal: kept as they are when rows are replaced.
_CELL_KEYS = ("bucket_start", "entity_id")


def _replaced(rows: pa.Table, at: np.ndarray, fresh: pa.Table) -> pa.Table:
    """`rows` with the rows at positions `at` (ascending) replaced by `fresh`, one for one:
    the cells' keys stay, each other column takes `fresh` values at the masked positions."""
    if len(at) > SLICED_REPLACEMENTS:
        mask = np.zeros(rows.num_rows, dtype=bool)
        mask[at] = True
        marks = pa.array(mask)
        columns = [
            rows[name] if name in _CELL_KEYS else _masked(rows[name], marks, fresh[name])
            for name in rows.column_names
        ]
        return pa.Table.from_arrays(columns, schema=rows.schema)
    pieces, done = [], 0
    for j, i in enumerate(at.tolist()):
        pieces += [rows.slice(done, i - done), fresh.slice(j, 1)]
        done = i + 1
    return pa.concat_tables([*pieces, rows.slice(done)])


def _masked(column: pa.ChunkedArray, marks: pa.Array, values: pa.ChunkedArray) -> pa.Array:
    """`column` with its `marks`ed positions given `values`, in order. Arrow's
    `replace_with_mask` takes no nested type: a list column (the spare extremes) is gathered."""
    base, put = column.combine_chunks(), values.combine_chunks()
    if not pa.types.is_nested(base.type):
        return pc.replace_with_mask(base, marks, put)
    order = np.arange(len(base))
    order[marks.to_numpy(zero_copy_only=False)] = len(base) + np.arange(len(put))
    return pa.concat_arrays([base, put]).take(pa.array(order))


def _same_cells(rows: pa.Table, at: np.ndarray, fresh: pa.Table) -> bool:
    """Are `fresh` rows (in query order) the cells of `rows` at positions `at`, one for one?"""
    if len(at) != fresh.num_rows:
        return False
    old = rows.select(["bucket_start", "entity_id"]).take(pa.array(at))
    return old.equals(fresh.select(["bucket_start", "entity_id"]))
