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
from rollup_assets.model.specs import ENTITY_COLUMN, AggregateFunction, ArchiveSpec, RollupSpec
from rollup_assets.model.windows import Window, micros

TS = pa.timestamp("us", tz="UTC")
# A stored partial over a raw column -> the Arrow aggregation; over a rollup's partial column.
_RAW = {"sum": "sum", "count": "count", "min": "min", "max": "max"}
_MERGE = {"sum": "sum", "count": "sum", "min": "min", "max": "max"}


def partials_arrow(
    rows: pa.Table,
    windows: Sequence[Window],
    cells: pa.Table | None,
    spec: RollupSpec,
    source: ArchiveSpec,
) -> pa.Table:
    """Partials of the named `cells` (bucket_start, entity_id; None: every entity) from source
    `rows`, whose buckets are `windows`: entity_id, bucket_start, bucket_end, the partials and
    `SOURCE_ROWS`, NaN ordered as on Spark (see the module)."""
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
    inside = (idx >= 0) & (ts < ends[np.clip(idx, 0, None)]) if len(ordered) else idx >= 0
    placed = rows.filter(pa.array(inside))
    picked = idx[inside]
    placed = placed.append_column(
        "__bucket", pa.array(starts[picked], pa.int64()).cast(TS)
    ).append_column("__end", pa.array(ends[picked], pa.int64()).cast(TS))
    if cells is not None:
        keys = cells.select([ENTITY_COLUMN, "bucket_start"]).rename_columns(
            [ENTITY_COLUMN, "__bucket"]
        )
        placed = placed.join(keys, [ENTITY_COLUMN, "__bucket"], join_type="inner")
    aggregations: list = [
        (column, how, pc.CountOptions(mode="only_valid")) if how == "count" else (column, how)
        for (column, how) in inputs
    ]
    for column in sorted(nan_max):
        placed = placed.append_column(
            f"{column}__nan", pc.fill_null(pc.is_nan(placed[column]), False)
        )
        aggregations.append((f"{column}__nan", "any"))
    grouped = placed.group_by([ENTITY_COLUMN, "__bucket", "__end"]).aggregate(
        [*aggregations, ([], "count_all")]
    )
    out = {
        ENTITY_COLUMN: grouped[ENTITY_COLUMN],
        "bucket_start": grouped["__bucket"],
        "bucket_end": grouped["__end"],
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
    return pa.table(out)


def logical_arrow(rows: pa.Table, spec: RollupSpec) -> pa.Table:
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
    return pa.table(cols).sort_by([("bucket_start", "ascending"), ("entity_id", "ascending")])
