"""Folding corrected cells where their rows are (a Spark `mapInArrow` task), and the rows that
stand for cells a fold cannot know (pure Arrow, no I/O).

A task is given every visible row of its cells (the frame is partitioned by cell) and returns
one base-shaped row per cell (`fold_tables.fold`), flagged as known. A cell the fold cannot know
exactly (its kept extremes all left) comes back as a row of its keys, its bucket's end and its
newest visible generation, flagged as unknowable: the driver decides what to do with those few
(aggregate them again, leave them blank, or refuse).
"""

from collections.abc import Callable, Iterator

import pyarrow as pa

from rollup_assets.compute.arrow_types import instants_of
from rollup_assets.compute.fold_tables import fold
from rollup_assets.compute.folding import CellKey
from rollup_assets.model.partials import DELTA_COLUMN
from rollup_assets.model.specs import ENTITY_COLUMN, RollupSpec

UNKNOWABLE = "__unknowable"
KEYS = [ENTITY_COLUMN, "bucket_start"]


def fold_task(
    spec: RollupSpec, schema: pa.Schema
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The task folding rows of `schema` (a rollup's stored columns) of whole cells; its output
    has `schema`'s columns and the `UNKNOWABLE` flag (`with_flag`)."""
    out = with_flag(schema)

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        parts = [pa.Table.from_batches([b]).select(schema.names).cast(schema) for b in batches]
        if not parts:
            return
        rows = pa.concat_tables(parts)
        folded, unknowable = fold(rows, spec)
        known = folded.select(schema.names).append_column(
            UNKNOWABLE, pa.array([False] * folded.num_rows, pa.bool_())
        )
        yield from known.cast(out).to_batches()
        if unknowable:
            yield from unknowable_rows(rows, unknowable, out).to_batches()

    return task


def with_flag(schema: pa.Schema) -> pa.Schema:
    return schema.append(pa.field(UNKNOWABLE, pa.bool_()))


def unknowable_rows(rows: pa.Table, cells: list[CellKey], out: pa.Schema) -> pa.Table:
    """For each of `cells`, a row of its keys, bucket end and newest visible generation in
    `rows`, flagged unknowable; every other column null."""
    grouped = _newest(rows, cells)
    n = grouped.num_rows
    columns = {}
    for f in out:
        if f.name in KEYS:
            columns[f.name] = grouped[f.name].cast(f.type)
        elif f.name in ("bucket_end", "generation"):
            columns[f.name] = grouped[f"{f.name}_max"].cast(f.type)
        elif f.name == UNKNOWABLE:
            columns[f.name] = pa.array([True] * n, pa.bool_())
        else:
            columns[f.name] = pa.nulls(n, f.type)
    return pa.table(columns, schema=out)


def _newest(rows: pa.Table, cells: list[CellKey]) -> pa.Table:
    """Per cell of `cells` present in `rows`: its keys, bucket end and newest generation
    (`bucket_end_max`, `generation_max`)."""
    ts = rows.schema.field("bucket_start").type
    wanted = pa.table(
        {
            ENTITY_COLUMN: pa.array([e for e, _ in cells], pa.string()),
            "bucket_start": pa.array([s for _, s in cells], ts),
        }
    )
    mine = rows.select([*KEYS, "bucket_end", "generation"]).join(wanted, KEYS, join_type="inner")
    return mine.group_by(KEYS).aggregate([("bucket_end", "max"), ("generation", "max")])


def newest_generations(rows: pa.Table, cells: list[CellKey]) -> dict[CellKey, int]:
    """The newest generation among each of `cells`' rows in `rows`."""
    grouped = _newest(rows, cells)
    keys = zip(
        grouped[ENTITY_COLUMN].to_pylist(), instants_of(grouped["bucket_start"]), strict=True
    )
    return dict(zip(keys, grouped["generation_max"].to_pylist(), strict=True))


def as_stored_rows(again: pa.Table, schema: pa.Schema, generation: dict[CellKey, int]) -> pa.Table:
    """Partials aggregated again (`refill`), in the shape of stored rows at each cell's newest
    visible generation."""
    n = again.num_rows
    keys = list(
        zip(again[ENTITY_COLUMN].to_pylist(), instants_of(again["bucket_start"]), strict=True)
    )
    columns = {}
    for f in schema:
        if f.name in again.column_names:
            columns[f.name] = again[f.name].cast(f.type)
        elif f.name == "generation":
            columns[f.name] = pa.array([generation.get(k, 0) for k in keys], pa.int64())
        elif f.name == DELTA_COLUMN:
            columns[f.name] = pa.array([False] * n, pa.bool_())
        else:
            columns[f.name] = pa.nulls(n, f.type)
    return pa.table(columns, schema=schema)
