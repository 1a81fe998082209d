"""Partials aggregated with Arrow, without Spark's shuffle (named cells or every entity of some
buckets: corrections of a few cells and the forward lane on the driver, first fills in Spark
tasks, real-time reads and downsampling), and the logical columns of stored partials
(`logical_arrow`, the twin of `aggregation.logical_columns`).

The same rules as `aggregation.rollup_partials`: over a raw or time-range source, sum, count
(non-null values), min and max of the value columns; over a rollup source, the partials merged
(sum of sums, sum of counts, min of mins, max of maxes). Nulls are ignored, a cell whose inputs
are all null gets null (count 0), and a cell without source rows gets no row. Each source row
belongs to the cell whose bucket holds its time: the buckets are the job's own windows, so no
calendar arithmetic is needed here.

NaN follows Spark's ordering, which puts NaN above every number: a max over a NaN is NaN, and a
min skips NaN unless every value is NaN. Arrow's min already agrees; its max skips NaN, so a
max input holding a NaN is flagged per cell and the cell's max set to NaN.
"""

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollup_assets.compute.aggregation import SOURCE_ROWS
from rollup_assets.compute.arrow_types import ARROW_TYPES, TS, by_start_and_entity
from rollup_assets.compute.key_index import rows_with_keys
from rollup_assets.model.aggregates import BASE_KINDS, AggregateFunction, Companion
from rollup_assets.model.column_types import ColumnType
from rollup_assets.model.partials import EXTREMES, RAW_ROWS, SPARES
from rollup_assets.model.specs import ENTITY_COLUMN, ArchiveSpec, RollupSpec
from rollup_assets.model.windows import Window, micros

# A stored partial over a raw column -> the Arrow aggregation; over a rollup's partial column.
_RAW = {"sum": "sum", "count": "count", "min": "min", "max": "max"}
_MERGE = {"sum": "sum", "count": "sum", "min": "min", "max": "max"}
_BUCKET_INDEX = "__bucket_index"  # a row's bucket, as its position among the ordered windows


def partials_arrow(
    rows: pa.Table,
    windows: Sequence[Window],
    cells: pa.Table | None,
    spec: RollupSpec,
    source: ArchiveSpec,
    *,
    companions: bool = True,
) -> pa.Table:
    """Partials of the named `cells` (bucket_start, entity_id; None: every entity) from source
    `rows`, whose buckets are `windows`: entity_id, bucket_start, bucket_end, the partials and
    `SOURCE_ROWS`, NaN ordered as on Spark (see the module); with `companions`, the count of
    raw rows and the companions a stored row keeps (a read that only shows values needs
    neither)."""
    rows = _entities_for(rows, by_code=cells is None and not companions)
    inputs: dict[tuple[str, str], str] = {}  # (input column, aggregation) -> output name
    plan = []
    nan_max: set[str] = set()  # max inputs holding a NaN
    for sc in spec.stored_columns:
        if isinstance(source, RollupSpec):
            column = source.partial_column(sc.column, sc.partial)
            assert column is not None, f"{spec.name}: '{source.name}' lacks {sc.partial}"
            how = _MERGE[sc.partial]
        else:
            column, how = sc.column, _RAW[sc.partial]
        floating = pa.types.is_floating(rows.schema.field(column).type)
        if how == "max" and floating and pc.any(pc.is_nan(rows[column])).as_py():
            nan_max.add(column)
        inputs.setdefault((column, how), f"__in{len(inputs)}")
        plan.append((sc, inputs[(column, how)]))
    ordered = sorted(windows)
    starts = np.array([micros(w.start) for w in ordered], dtype=np.int64)
    ends = np.array([micros(w.end) for w in ordered], dtype=np.int64)
    ts = rows[source.time_column].cast(TS).cast(pa.int64()).to_numpy(zero_copy_only=False)
    idx = np.searchsorted(starts, ts, side="right") - 1
    inside = _inside(ts, idx, starts, ends)  # None, the usual case: a filter would copy every row
    placed = rows if inside is None else rows.filter(pa.array(inside))
    picked = idx if inside is None else idx[inside]
    # Grouped by the bucket's index; its start is kept only to match cells or keep companions.
    placed = placed.append_column(_BUCKET_INDEX, pa.array(picked.astype(np.int32)))
    if cells is not None or companions:
        placed = placed.append_column("__bucket", pa.array(starts[picked], pa.int64()).cast(TS))
    if cells is not None:
        keys = cells.select([ENTITY_COLUMN, "bucket_start"]).rename_columns(
            [ENTITY_COLUMN, "__bucket"]
        )
        placed = rows_with_keys(placed, keys, [ENTITY_COLUMN, "__bucket"])
    aggregations: list = [
        (column, how, pc.CountOptions(mode="only_valid")) if how == "count" else (column, how)
        for (column, how) in inputs
    ]
    for column in sorted(nan_max):
        placed = placed.append_column(
            f"{column}__nan", pc.fill_null(pc.is_nan(placed[column]), False)
        )
        aggregations.append((f"{column}__nan", "any"))
    grouped = placed.group_by([ENTITY_COLUMN, _BUCKET_INDEX]).aggregate(
        [*aggregations, ([], "count_all")]
    )
    which = grouped[_BUCKET_INDEX].to_numpy()
    out = {
        ENTITY_COLUMN: _decoded(grouped[ENTITY_COLUMN]),
        "bucket_start": pa.array(starts[which], pa.int64()).cast(TS),
        "bucket_end": pa.array(ends[which], pa.int64()).cast(TS),
    }
    for sc, name in plan:
        column, how = next(k for k, v in inputs.items() if v == name)
        values = grouped[f"{column}_{how}"]
        if sc.partial == "count":
            values = pc.fill_null(values, 0)
        if how == "max" and column in nan_max:
            nan = pa.scalar(float("nan"), values.type)
            values = pc.if_else(grouped[f"{column}__nan_any"], nan, values)
        out[sc.name] = values
    out[SOURCE_ROWS] = grouped["count_all"]
    partials = pa.table(out)
    if not companions:
        return partials
    cells = partials.select([ENTITY_COLUMN, "bucket_start"])
    # The rows by the cell they fall in here (a rollup's rows: not their own bucket below).
    placed = placed.drop_columns(
        [c for c in ("bucket_start", "bucket_end", _BUCKET_INDEX) if c in placed.schema.names]
    )
    rows_of = placed.rename_columns(
        ["bucket_start" if n == "__bucket" else n for n in placed.column_names]
    )
    merged = isinstance(source, RollupSpec)
    index = _cell_index(rows_of, cells)
    raw_rows = np.zeros(cells.num_rows, dtype=np.int64)
    unknown = np.zeros(cells.num_rows, dtype=bool)
    below: np.ndarray | int = 1
    if merged:
        # A row below without the count (written before companions were kept) leaves the
        # count of its cell here unknown (null): a fold of that cell aggregates it again.
        counts = rows_of[RAW_ROWS]
        below = pc.fill_null(counts, 0).to_numpy(zero_copy_only=False)
        np.logical_or.at(unknown, index, pc.is_null(counts).to_numpy(zero_copy_only=False))
    np.add.at(raw_rows, index, below)
    partials = partials.append_column(RAW_ROWS, pa.array(raw_rows, pa.int64(), mask=unknown))
    kept = [c for c in spec.companions if c.kind in BASE_KINDS]
    values = companions_arrow(rows_of, cells, kept, merged=merged, index=index)
    for c in kept:
        partials = partials.append_column(c.name, values[c.name])
    return partials


def _entities_for(rows: pa.Table, by_code: bool) -> pa.Table:
    """`rows` with entity ids a grouping can take: dictionary-coded ids (as surface files code
    them, each chunk its own dictionary) with one dictionary for every chunk when grouped by
    `by_code`, and decoded otherwise (matched against named cells)."""
    field = rows.schema.field(ENTITY_COLUMN)
    if not pa.types.is_dictionary(field.type):
        return rows
    if by_code:
        return rows.unify_dictionaries()
    at = rows.schema.get_field_index(ENTITY_COLUMN)
    return rows.set_column(at, ENTITY_COLUMN, _decoded(rows[ENTITY_COLUMN]))


def _decoded(values: pa.ChunkedArray) -> pa.ChunkedArray:
    """Dictionary-coded values as their values' type; others as they are."""
    if pa.types.is_dictionary(values.type):
        return values.cast(values.type.value_type)
    return values


def companions_arrow(
    rows: pa.Table,
    cells: pa.Table,
    companions: Sequence[Companion],
    *,
    merged: bool,
    index: np.ndarray | None = None,
) -> dict[str, pa.ChunkedArray]:
    """The `companions` of each of `cells` (entity_id, bucket_start; in that order) from the
    `rows` placed in them (`index`: each row's cell, when known): over a raw source from their
    values, over a rollup source (`merged`) from the companions of the rows below
    (`model.partials`; the spare extremes of a column merge by its count of values, among
    `companions`)."""
    if index is None:
        index = _cell_index(rows, cells)
    out: dict[str, pa.ChunkedArray] = {}
    n_cells = cells.num_rows
    count_of = {c.column: c.name for c in companions if c.kind == "n"}
    for c in companions:
        if c.kind in EXTREMES:
            largest = EXTREMES[c.kind]
            if merged:
                lists = rows[c.name]
                counts = rows[count_of[c.column]].to_numpy(zero_copy_only=False)
                out[c.name] = _merged_extremes(lists, counts, index, n_cells, largest)
            else:
                values = rows[c.column]
                out[c.name] = _extremes(values, index, n_cells, largest)
            continue
        column = rows[c.name] if merged else _raw_companion(rows[c.column], c.kind)
        sums = np.zeros(n_cells, dtype=np.float64 if c.type is ColumnType.DOUBLE else np.int64)
        values = pc.fill_null(column, 0).to_numpy(zero_copy_only=False)
        np.add.at(sums, index, values)
        out[c.name] = pa.chunked_array([pa.array(sums).cast(ARROW_TYPES[c.type])])
    return out


def _cell_index(rows: pa.Table, cells: pa.Table) -> np.ndarray:
    """For each of `rows`, the position of its cell in `cells`."""
    keyed = cells.select([ENTITY_COLUMN, "bucket_start"]).append_column(
        "__cell", pa.array(np.arange(cells.num_rows), pa.int64())
    )
    at = rows.select([ENTITY_COLUMN, "bucket_start"]).append_column(
        "__row", pa.array(np.arange(rows.num_rows), pa.int64())
    )
    joined = at.join(keyed, [ENTITY_COLUMN, "bucket_start"], join_type="inner")
    index = np.empty(rows.num_rows, dtype=np.int64)
    index[joined["__row"].to_numpy()] = joined["__cell"].to_numpy()
    return index


def _raw_companion(values: pa.ChunkedArray, kind: str) -> pa.ChunkedArray:
    """Per raw value, its contribution to companion `kind` (`n`, `total`, `nan`, ...)."""
    if kind == "n":
        return pc.cast(pc.is_valid(values), pa.int64())
    floating = pa.types.is_floating(values.type)
    if kind == "total":
        if not floating:
            return pc.cast(values, pa.int64())
        finite = pc.and_(pc.invert(pc.is_nan(values)), pc.is_finite(values))
        return pc.if_else(pc.fill_null(finite, False), values, 0.0)
    test = {
        "nan": lambda: pc.is_nan(values),
        "pinf": lambda: pc.equal(values, float("inf")),
        "ninf": lambda: pc.equal(values, float("-inf")),
    }[kind]()
    return pc.cast(pc.fill_null(test, False), pa.int64())


def _extremes(
    values: pa.ChunkedArray, index: np.ndarray, n_cells: int, largest: bool
) -> pa.ChunkedArray:
    """Per cell, its `SPARES` smallest (largest) values, NaN ranked above every number."""
    valid = pc.is_valid(values).to_numpy(zero_copy_only=False)
    kept = values.filter(pa.array(valid))
    kept = kept.combine_chunks() if isinstance(kept, pa.ChunkedArray) else kept
    return _top(kept, _ranks(kept, largest), index[valid], n_cells)


def _merged_extremes(
    lists: pa.ChunkedArray,
    counts: np.ndarray,
    index: np.ndarray,
    n_cells: int,
    largest: bool,
) -> pa.ChunkedArray:
    """Per cell, its smallest (largest) values known from the lists of its rows below: every
    value up to the first end of an incomplete list (`model.partials.ExtremeState.merge`);
    none when a list below is exhausted."""
    combined = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
    sizes = pc.fill_null(pc.list_value_length(combined), 0).to_numpy(zero_copy_only=False)
    values = pc.list_flatten(combined)
    cell_of = index[np.repeat(np.arange(len(sizes)), sizes)]
    incomplete = sizes < counts
    exhausted = np.zeros(n_cells, dtype=bool)
    np.logical_or.at(exhausted, index[incomplete & (sizes == 0)], True)
    # One ranking of every value, for the bounds and the order alike.
    ranks = _ranks(values, largest)
    keep = np.ones(len(values), dtype=bool)
    ends = incomplete & (sizes > 0)
    if ends.any():
        # A cell knows the values ranking no later than the last value of its first-ending
        # incomplete list.
        last = np.cumsum(sizes) - 1
        bound = np.full(n_cells, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(bound, index[ends], ranks[last[ends]])
        keep = ranks <= bound[cell_of]
    keep &= ~exhausted[cell_of]
    at = np.flatnonzero(keep)
    return _top(values.take(pa.array(at, pa.int64())), ranks[at], cell_of[at], n_cells)


def _ranks(values: pa.Array, largest: bool) -> np.ndarray:
    """Dense ranks of `values` in Spark's order (NaN above every number), ascending, or
    descending when `largest`; equal values share a rank."""
    typ = values.type
    numeric = pa.types.is_floating(typ) or pa.types.is_integer(typ) or pa.types.is_timestamp(typ)
    if numeric and values.null_count == 0:
        # NumPy sorts NaN last, as Spark orders it; a timestamp ranks as its integer.
        arr = values.cast(pa.int64()) if pa.types.is_timestamp(typ) else values
        numbers = arr.to_numpy(zero_copy_only=False)
        order = np.argsort(numbers)
        arr_sorted = numbers[order]
    else:
        # Arrow sorts NaN last in either order: rank ascending (NaN last is Spark's order).
        order = pc.array_sort_indices(values, order="ascending").to_numpy()
        arr_sorted = values.take(pa.array(order)).to_numpy(zero_copy_only=False)
    differs = np.ones(len(arr_sorted), dtype=bool)
    if len(arr_sorted) > 1:
        a, b = arr_sorted[1:], arr_sorted[:-1]
        same = a == b
        if arr_sorted.dtype.kind == "f":
            same |= np.isnan(a) & np.isnan(b)
        differs[1:] = ~same
    ranks = np.empty(len(arr_sorted), dtype=np.int64)
    ranks[order] = np.cumsum(differs) - 1
    # Turned around for the largest.
    return ranks.max(initial=0) - ranks if largest else ranks


def _top(values: pa.Array, ranks: np.ndarray, cell_of: np.ndarray, n_cells: int) -> pa.ChunkedArray:
    """Per cell, the first `SPARES` of its `values` by their `ranks`, as a list column."""
    typ = values.type
    if len(values) == 0:
        empty = pa.ListArray.from_arrays(
            pa.array(np.zeros(n_cells + 1, np.int32)), pa.array([], typ)
        )
        return pa.chunked_array([empty])
    # By cell, then rank: one key (cells and ranks are both below 2**31 here), sorted stably.
    key = cell_of.astype(np.int64) * (int(ranks.max()) + 1) + ranks
    order = np.argsort(key, kind="stable")
    cells_sorted = cell_of[order]
    starts = np.searchsorted(cells_sorted, np.arange(n_cells), side="left")
    position = np.arange(len(order)) - starts[cells_sorted]
    chosen = order[position < SPARES]
    counts = np.bincount(cell_of[chosen], minlength=n_cells)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    picked = values.take(pa.array(chosen))
    return pa.chunked_array([pa.ListArray.from_arrays(pa.array(offsets), picked)])


def _inside(
    ts: np.ndarray, idx: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> np.ndarray | None:
    """Which instants `ts` lie inside the windows (`starts`, `ends`, ordered; `idx`: the last
    starting at or before each): None when all do, told without a look-up per row when the
    windows follow one another with no gap."""
    gapless = len(starts) > 0 and np.array_equal(starts[1:], ends[:-1])
    if gapless and (len(ts) == 0 or (ts.min() >= starts[0] and ts.max() < ends[-1])):
        return None
    inside = (idx >= 0) & (ts < ends[np.clip(idx, 0, None)]) if len(starts) else idx >= 0
    return None if inside.all() else inside


def logical_arrow(rows: pa.Table, spec: RollupSpec, in_order: bool = False) -> pa.Table:
    """The logical columns of `spec`'s partial `rows` (an average as its value), sorted by
    bucket start, then entity; with `in_order`, `rows` are in that order already and stay as
    they are (no second copy)."""
    cols = {
        "entity_id": rows["entity_id"],
        "bucket_start": rows["bucket_start"],
        "bucket_end": rows["bucket_end"],
    }
    for agg in spec.aggregations:
        out = agg.output_name
        if agg.function is AggregateFunction.AVG:
            s, c = rows[f"{out}__sum"], rows[f"{out}__count"]
            cols[out] = pc.if_else(
                pc.greater(c, 0),
                pc.divide(pc.cast(s, pa.float64()), pc.cast(c, pa.float64())),
                None,
            )
        else:
            cols[out] = rows[out]
    table = pa.table(cols)
    return table if in_order else by_start_and_entity(table)
