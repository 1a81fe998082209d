"""Human descriptions of archives, generated from their specs (asset descriptions, the CLI)."""

from rollup_assets.model.aggregates import AggregateFunction
from rollup_assets.model.column_types import ColumnType
from rollup_assets.model.durations import format_duration
from rollup_assets.model.grid import partition_grid
from rollup_assets.model.specs import (
    AggregationSpec,
    Alignment,
    ArchiveSpec,
    Catalog,
    RollupSpec,
    TimeRangeArchiveSpec,
)
from rollup_assets.model.windows import EPOCH, iso_utc


def group_name(catalog: Catalog, name: str) -> str:
    base = catalog.base_source(name).name
    return base.removesuffix("_raw") or base


def describe(spec: ArchiveSpec, catalog: Catalog) -> str:
    if not isinstance(spec, RollupSpec):
        cols = ", ".join(
            f"{c.name} ({c.type.value}{', required' if c.required else ''}"
            f"{f', = {c.formula.text}' if c.formula is not None else ''})"
            for c in spec.columns
        )
        kind = "Raw archive" if spec.kind.value == "raw" else "Time-range archive"
        text = (
            f"{spec.description or kind}.\n\n{kind} written by `rollups ingest`; columns: {cols}."
        )
        if isinstance(spec, TimeRangeArchiveSpec):
            period = f"; period {format_duration(spec.period)}" if spec.period else ""
            text += f"\n\nRows cover [range_start, range_end){period}."
        return text
    align = spec.alignment.value
    if spec.alignment is Alignment.FIXED_SIZE and spec.size is not None:
        align += f" {format_duration(spec.size)}"
        if spec.origin != EPOCH:
            align += f" from {iso_utc(spec.origin)}"
        grid = partition_grid(spec)
        if grid is not None and grid.per_bucket > 1:
            align += f" ({grid.per_bucket} partitions of {format_duration(grid.step)} per bucket)"
    aggs = ", ".join(
        f"{a.function.value}({a.column}) -> {a.output_name}" for a in spec.aggregations
    )
    return (
        f"{spec.description or 'Rollup'}.\n\n"
        f"- source: `{spec.source}`\n- alignment: {align} in {spec.reference_time_zone}\n"
        f"- first partition: {spec.start:%Y-%m-%d %H:%M} local\n"
        f"- watermark lag: {format_duration(spec.watermark_lag)}; open bucket refreshed: "
        f"{'yes' if spec.refresh_open_bucket else 'no'}\n- aggregations: {aggs}"
    )


def aggregated_columns(spec: RollupSpec) -> list[dict]:
    """One row per logical column of a rollup: its type, what it aggregates, how it is stored."""
    return [
        {
            "column": a.output_name,
            "type": _logical_type(spec, a),
            "origin": f"{a.function.value}({a.column}) of {spec.source}",
            "stored_as": ", ".join(
                sc.name
                for sc in a.stored_columns(spec.column_types.get(a.column, ColumnType.DOUBLE))
            ),
        }
        for a in spec.aggregations
    ]


def _logical_type(spec: RollupSpec, agg: AggregationSpec) -> str:
    """The type a reader gets: an average is a double, otherwise the stored partial's type."""
    if agg.function is AggregateFunction.AVG:
        return ColumnType.DOUBLE.value
    return agg.stored_columns(spec.column_types.get(agg.column, ColumnType.DOUBLE))[0].type.value
