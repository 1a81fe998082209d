"""A lagging surface's changed cells brought to now from the surface's own rows: the differences
flipped since its publish, folded onto the fold state each row keeps (`surface_layout`), so a
read while the surface lags reads those differences, not the cells' base rows.

A cell is brought this way when all that changed for it since the publish is its difference
pointer, moving forward (a correction): it then shows its base of the publish and its
differences up to the new pointer, and the surface row is that base folded with those up to the
old one. Every other change (a base flip, a rewind or rollback, a bucket changed for every
entity, a forward-lane write), a cell without a surface row or whose row holds no fold state,
and a cell the fold cannot know from the kept extremes the row holds (they all left it) is read
from the row table instead (`surface_patch.fresh_rows`). A fold takes the differences one at a
time (`compute.fold_tables`): a cell folded from the surface row shows the same bits as one
folded from its base.
"""

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollup_assets.compute.fold_tables import fold
from rollup_assets.compute.key_index import KeyIndex
from rollup_assets.model.partials import GENERATION
from rollup_assets.model.specs import ENTITY_COLUMN, RollupSpec
from rollup_assets.model.windows import Window
from rollup_assets.resources.rollup_differences import AFTER, UPTO, differences_of
from rollup_assets.resources.rollup_snapshots import Snapshot
from rollup_assets.resources.rollup_table import in_windows
from rollup_assets.resources.schemas import data_schema, with_row_shape
from rollup_assets.resources.visible_rows import base_generation
from rollup_assets.services.engine import Engine
from rollup_assets.services.surface_changes import NEWER, Changed
from rollup_assets.services.surface_layout import as_surface_rows, fold_state

_CELL = ["bucket_start", ENTITY_COLUMN]


def folded_on_surface(
    engine: Engine,
    spec: RollupSpec,
    schema: pa.Schema,
    snap: Snapshot,
    changed: Changed,
    surface: pa.Table,
    window: Window,
) -> tuple[pa.Table, Changed]:
    """The rows now (in the surface's columns, `schema`) of the `changed` cells starting in
    `window` that their `surface` rows (read with their fold state) and the differences flipped
    since bring to `snap`, and the changes left for the row table (`Changed`)."""
    cells = _forward_cells(changed, window)
    if cells is None or cells.num_rows == 0:
        return schema.empty_table(), changed
    keys = KeyIndex(cells, _CELL)
    mine = surface.filter(pa.array(keys.mask(surface)))
    if mine.num_rows == 0:
        return schema.empty_table(), changed
    # The cells a surface row holds, with the range of differences that came since.
    held = cells.filter(pa.array(KeyIndex(mine, _CELL).mask(cells)))
    base = base_generation(held, snap.pointers)
    old = pc.fill_null(held["old"], 0).to_numpy(zero_copy_only=False)
    held = held.append_column(AFTER, pa.array(np.maximum(base, old), pa.int64()))
    held = held.append_column(UPTO, held["new"])
    differences = differences_of(engine.rollups, spec, snap, held)
    rows = pa.concat_tables([as_base_rows(mine, spec, held), differences])
    folded, unknowable = fold(rows, spec)
    lost = pa.table(
        {
            "bucket_start": pa.array(
                [s for _, s in unknowable], held.schema.field("bucket_start").type
            ),
            ENTITY_COLUMN: pa.array([e for e, _ in unknowable], pa.string()),
        }
    )
    known = held.filter(pa.array(~KeyIndex(lost, _CELL).mask(held)))
    rest = changed.pointers.filter(pa.array(~_named_mask(changed.pointers, known)))
    return as_surface_rows(folded, spec, schema), replace(changed, pointers=rest)


def _forward_cells(changed: Changed, window: Window) -> pa.Table | None:
    """The cells (bucket_start, bucket_end, entity_id, `old`, `new`) starting in `window` whose
    only change is a difference pointer moving forward, from `old` (null: none) to `new`; None
    when the changes do not say which pointers are whose."""
    p = changed.pointers
    if "delta" not in p.column_names or NEWER not in p.column_names:
        return None
    named = p.filter(pc.is_valid(p["entity_id"]))
    inside = pc.fill_null(in_windows(named["bucket_start"], [window]), False)
    whole = changed.whole_buckets
    if whole:
        inside = pc.and_(
            inside, pc.invert(pc.fill_null(in_windows(named["bucket_start"], whole), False))
        )
    named = named.filter(inside)
    newer = pc.fill_null(named[NEWER], False)
    null = pa.scalar(None, pa.int64())
    named = pa.table(
        {
            "bucket_start": named["bucket_start"],
            "bucket_end": named["bucket_end"],
            ENTITY_COLUMN: named["entity_id"],
            "delta": pc.fill_null(named["delta"], False),
            "came": pc.cast(newer, pa.int64()),
            "new": pc.if_else(newer, named["generation"], null),
            "old": pc.if_else(newer, null, named["generation"]),
        }
    )
    grouped = named.group_by(["bucket_start", "bucket_end", ENTITY_COLUMN]).aggregate(
        [("delta", "all"), ("came", "sum"), ("came", "count"), ("new", "max"), ("old", "max")]
    )
    ok = pc.and_(
        pc.and_(grouped["delta_all"], pc.equal(grouped["came_sum"], 1)),
        pc.less_equal(grouped["came_count"], 2),
    )
    ok = pc.and_(
        ok,
        pc.greater(grouped["new_max"], pc.fill_null(grouped["old_max"], -1)),
    )
    ok = pc.fill_null(ok, False)
    picked = grouped.filter(ok)
    return pa.table(
        {
            "bucket_start": picked["bucket_start"],
            "bucket_end": picked["bucket_end"],
            ENTITY_COLUMN: picked[ENTITY_COLUMN],
            "old": picked["old_max"],
            "new": picked["new_max"],
        }
    )


def _named_mask(pointers: pa.Table, cells: pa.Table) -> np.ndarray:
    """Which `pointers` are entity pointers of one of `cells`."""
    if cells.num_rows == 0:
        return np.zeros(pointers.num_rows, dtype=bool)
    return KeyIndex(cells, _CELL).mask(pointers) & pc.is_valid(pointers["entity_id"]).to_numpy(
        zero_copy_only=False
    )


def as_base_rows(surface: pa.Table, spec: RollupSpec, held: pa.Table) -> pa.Table:
    """Surface rows (with their fold state) as the base rows they were folded into, each at the
    generation its cell's differences since the publish come after (`held`'s `AFTER`)."""
    partials = [c.name for c in spec.stored_columns]
    names = ["entity_id", "bucket_start", "bucket_end", *partials, *fold_state(spec)]
    stored = data_schema(spec)
    rows = surface.select(names)
    ranks = rows.select(_CELL).append_column(
        "__row", pa.array(np.arange(rows.num_rows), pa.int64())
    )
    joined = ranks.join(held.select([*_CELL, AFTER]), _CELL, join_type="inner")
    generation = np.zeros(rows.num_rows, dtype=np.int64)
    generation[joined["__row"].to_numpy()] = joined[AFTER].to_numpy()
    rows = rows.append_column(GENERATION, pa.array(generation, pa.int64()))
    rows = with_row_shape(rows, stored)
    return rows.select(stored.names).cast(stored)
