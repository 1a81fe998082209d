"""Correcting a rollup's cells: from their source's changes where that is exact and cheaper,
from their source rows otherwise.

The cost model, per job:

- **delta**: a first-level rollup over a raw (or time-range) archive with its change data feed
  on, and a job of named cells (at most `DRIVER_CELLS`). Each cell's stored partials reflect a
  source version (the lineage every row stores); the changes committed after it are read from
  the change feed (only the commits, days and entities of the job's cells) and applied on the
  driver, without reading the cells' source rows and without a Spark job
  (`model.deltas.apply_to_cells`). Cells a change cannot correct exactly (a retracted extreme,
  a delete, no stored partial, ...) are recomputed from their source rows, at the same source
  version, in the same generation.
- **recompute**: everything else (a rollup over a rollup, buckets for every entity, jobs too
  large for the driver, a source without change feed, more than `MAX_APPLY_COMMITS` commits to
  read back, a change feed no longer reaching back): the cells are aggregated again from their
  source rows.

The job records which technique ran and why (`Recomputed.technique`, `Recomputed.reason`).
"""

import bisect
import json
from datetime import datetime

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from resources.raw_store import CHANGE_TYPE, COMMIT_VERSION, ChangeFeedGone
from resources.schemas import data_schema
from rollup_assets.model.cells import Cells
from rollup_assets.model.deltas import Change, ChangeType, StoredCell, apply_to_cells
from rollup_assets.model.specs import ENTITY_COLUMN, RollupSpec
from rollup_assets.model.windows import Window, merge_windows
from rollup_assets.services.engine import (
    DRIVER_CELLS,
    KEYS,
    CellOutcome,
    Engine,
    Recomputed,
    cell_keys,
)

# Reading further back than this many source commits costs more than reading the cells' rows.
MAX_APPLY_COMMITS = 1_000
DELTA = "delta"
CellKey = tuple[str, datetime]  # (entity, bucket start)
RECOMPUTE = "recompute"


def correct(
    engine: Engine,
    spark: SparkSession,
    spec: RollupSpec,
    cells: Cells,
    *,
    fold: bool = False,
) -> Recomputed:
    """The corrected partials of `cells`, compared with the stored ones (see the module). A
    `fold` (maintenance rewriting buckets whole to fold their cell pointers) changes the layout
    only: it is always a recompute, and writes only the buckets whose cells are all unchanged."""
    if fold:
        result = engine.recompute(spark, spec, cells, settled_only=True)
        result.technique, result.reason = RECOMPUTE, "fold: buckets rewritten whole if settled"
        return result
    unfit, table = delta_source(engine, spec, cells)
    if unfit is not None or table is None:
        result = engine.recompute(spark, spec, cells)
        why = unfit or "no source table"
        result.technique = RECOMPUTE
        result.reason = result.reason or why  # a first fill says what it does instead
        return result
    source = engine.catalog.archive(spec.source)
    version = table.version()
    spans = merge_windows(list(cells.windows))
    stored_rows = engine.rollups.read_arrow(spec, spans, cells.entities, cells=cells)
    stored_rows = stored_rows.join(cell_keys(cells), KEYS, join_type="inner")
    stored = _stored_cells(stored_rows, spec, source.name, version)
    by_start = {w.start: w for w in cells.windows}
    keys: list[CellKey] = [(e, w.start) for w, scope in cells for e in sorted(scope or ())]
    oldest = min((c.version for c in stored.values()), default=version)
    if version - oldest > MAX_APPLY_COMMITS:
        result = engine.recompute(spark, spec, cells, raw_table=table)
        result.technique = RECOMPUTE
        result.reason = (
            f"{version - oldest} source commits since the oldest stored partial "
            f"(more than {MAX_APPLY_COMMITS}): reading the cells' rows is cheaper"
        )
        return result
    try:
        changes, read = engine.raw.changes(
            source,  # type: ignore[arg-type]
            oldest,
            version,
            spans,
            cells.entities,
        )
    except ChangeFeedGone as gone:
        result = engine.recompute(spark, spec, cells, raw_table=table)
        result.technique, result.reason = RECOMPUTE, f"change feed unavailable: {gone}"
        return result
    applied = apply_to_cells(
        keys,
        stored,
        _changes(changes, source.time_column, cells.windows, spec),
        spec.stored_columns,
    )
    rows = _rows(applied.changed, by_start, spec)
    changed_pairs = [(by_start[start], entity) for entity, start in applied.changed]
    found = CellOutcome(
        Cells.collect([(w, frozenset([e])) for w, e in changed_pairs], limit=None),
        cells_changed=len(applied.changed),
        cells_skipped=len(applied.unchanged),
        source_rows=0,
    )
    reason = (
        f"{len(keys)} named cell(s): corrected from {applied.change_rows} change row(s) "
        f"({read} read) of {source.name} up to version {version}"
    )
    technique = DELTA
    if applied.recompute:
        leftover = Cells.collect(
            [(by_start[start], frozenset([entity])) for entity, start in applied.recompute],
            limit=None,
        )
        again = engine.recompute(spark, spec, leftover, raw_table=table)
        try:
            # Named cells: compared on the driver (a first fill is of whole buckets).
            assert isinstance(again.rows, pa.Table) and again.found is not None
            rows = pa.concat_tables([rows, again.rows.select(rows.column_names).cast(rows.schema)])
        finally:
            again.release()
        more = again.found
        found = CellOutcome(
            Cells.collect([*found.cells, *more.cells], limit=None),
            cells_changed=found.cells_changed + more.cells_changed,
            cells_skipped=found.cells_skipped + more.cells_skipped,
            source_rows=more.source_rows,
        )
        technique = f"{DELTA}+{RECOMPUTE}"
        reason += f"; recomputed from source rows: {applied.reasons()}"
    return Recomputed(
        rows,
        found,
        {source.name: version},
        technique=technique,
        reason=reason,
        change_rows=applied.change_rows,
        cells_applied=len(applied.changed) + len(applied.unchanged),
    )


def delta_source(
    engine: Engine, spec: RollupSpec, cells: Cells
) -> tuple[str | None, DeltaTable | None]:
    """Why `cells` of `spec` are recomputed rather than corrected from changes (None: they are
    corrected from changes), and the source table they are corrected from (opened once)."""
    source = engine.catalog.archive(spec.source)
    if isinstance(source, RollupSpec):
        return f"source {source.name} is a rollup: cells are merged again from its partials", None
    if cells.named is None:
        whole = sum(1 for _, scope in cells if scope is None)
        return f"{whole} bucket(s) for every entity: aggregated again from their source rows", None
    if cells.named > DRIVER_CELLS:
        return f"{cells.named} cells (more than {DRIVER_CELLS}): aggregated again on Spark", None
    table = engine.raw.table(source)
    if table is None:
        return f"source {source.name} has no table", None
    if table.metadata().configuration.get("delta.enableChangeDataFeed") != "true":
        return f"source {source.name} has no change data feed", None
    return None, table


def _stored_cells(
    rows: pa.Table, spec: RollupSpec, source: str, newest: int
) -> dict[CellKey, StoredCell]:
    """The stored cells with the source version their partials reflect. A row without one, or
    with one past the source's `newest` (read on another table), is left out: it is
    recomputed."""
    names = [sc.name for sc in spec.stored_columns]
    out: dict[CellKey, StoredCell] = {}
    for r in rows.select([*KEYS, *names, "source_versions"]).to_pylist():
        version = json.loads(r["source_versions"] or "{}").get(source)
        if version is None or not 0 <= version <= newest:
            continue
        out[(r[ENTITY_COLUMN], r["bucket_start"])] = StoredCell(
            int(version), {n: r[n] for n in names}
        )
    return out


def _changes(
    changes: pa.Table, time_column: str, windows: tuple[Window, ...], spec: RollupSpec
) -> list[tuple[CellKey, int, Change]]:
    """(cell, commit version, change) for every change row (each lies in one of `windows`)."""
    ordered = sorted(windows)
    starts = [w.start for w in ordered]
    columns = sorted({sc.column for sc in spec.stored_columns})
    out: list[tuple[CellKey, int, Change]] = []
    for r in changes.select(
        [ENTITY_COLUMN, time_column, CHANGE_TYPE, COMMIT_VERSION, *columns]
    ).to_pylist():
        i = bisect.bisect_right(starts, r[time_column]) - 1
        if i < 0 or not ordered[i].start <= r[time_column] < ordered[i].end:
            continue
        out.append(
            (
                (r[ENTITY_COLUMN], ordered[i].start),
                int(r[COMMIT_VERSION]),
                Change(ChangeType(r[CHANGE_TYPE]), {c: r[c] for c in columns}),
            )
        )
    return out


def _rows(
    changed: dict[CellKey, dict], by_start: dict[datetime, Window], spec: RollupSpec
) -> pa.Table:
    """The corrected cells as rollup rows (entity_id, bucket_start, bucket_end, partials)."""
    schema = data_schema(spec)
    names = [ENTITY_COLUMN, "bucket_start", "bucket_end", *[sc.name for sc in spec.stored_columns]]
    wanted = pa.schema([schema.field(n) for n in names])
    rows = []
    for (entity, start), partials in sorted(changed.items()):
        rows.append(
            {ENTITY_COLUMN: entity, "bucket_start": start, "bucket_end": by_start[start].end}
            | partials
        )
    return pa.Table.from_pylist(rows, schema=wanted)
