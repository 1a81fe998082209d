"""A recompute's cells aggregated again from their source and compared exactly with the stored
ones: which cells changed, and the rows to write for them.

Where the work runs follows its size: a few named cells, or buckets whose source files hold few
rows, on the driver; more named cells in Spark tasks with the comparison on the driver;
everything else on Spark (`recompute_cells`). Larger buckets with nothing stored yet are a first
fill, aggregated in Spark tasks as they are written.
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rollup_assets.compute.aggregation import SOURCE_ROWS
from rollup_assets.compute.arrow_types import TS
from rollup_assets.compute.compare import (
    CHANGED,
    all_new,
    cell_changes,
    cell_changes_arrow,
)
from rollup_assets.compute.key_index import rows_with_keys
from rollup_assets.model.cells import CellCounts, Cells, changed_cells, rewrites_whole
from rollup_assets.model.specs import ENTITY_COLUMN, RollupSpec
from rollup_assets.model.windows import Window, merge_windows
from rollup_assets.resources.fill import Fill
from rollup_assets.resources.rollup_reads import Unknown
from rollup_assets.resources.rollup_snapshots import Snapshot
from rollup_assets.resources.rollup_table import cell_keys, in_windows
from rollup_assets.services.engine import Engine
from rollup_assets.services.partials import cell_targets

# A job naming at most this many cells runs on the driver: aggregated from the row groups holding
# its cells, compared and written there, with no Spark job. Scattered cells share few row groups:
# past a few thousand, their source row groups are most of each table, which Spark's tasks read
# side by side (`CHANGE_CELLS`). Recomputes with buckets for every entity run on the driver when
# their source files are small (`Partials.fits_driver`), on Spark otherwise.
DRIVER_CELLS = 2_000
# A recompute of more named cells than `DRIVER_CELLS`, up to this many, aggregates them in Spark
# tasks (one storage partition each) and compares them on the driver, where their fresh partials
# (this many rows at most) and stored ones are. Larger jobs stay on Spark.
CHANGE_CELLS = 50_000
KEYS = ["bucket_start", ENTITY_COLUMN]


@dataclass(frozen=True)
class CellOutcome:
    """What comparing a recompute's fresh partials with the stored ones found."""

    cells: Cells  # what to write and flip
    cells_changed: int  # cells whose partials changed (or appeared, or vanished)
    cells_skipped: int  # cells whose partials did not change
    source_rows: int  # source rows aggregated


@dataclass
class Recomputed:
    """A recompute's rows to write (a Spark frame, or a table on the driver), what the comparison
    found, and the source versions read."""

    rows: DataFrame | pa.Table | Fill  # a first fill is aggregated as it is written
    # None for a first fill (`filled` tells, once it is written) and a fold (every cell of
    # its buckets is rewritten)
    found: CellOutcome | None
    versions: dict[str, int]
    release: Callable[[], object] = lambda: None  # drop what the comparison cached
    reason: str = ""  # how it was computed (a first fill says so)


def recompute_cells(
    engine: Engine,
    spark: SparkSession,
    spec: RollupSpec,
    cells: Cells,
    raw_table: DeltaTable | None = None,
    *,
    below: Snapshot | None = None,
) -> Recomputed:
    """The fresh partials of `cells`, compared exactly with the stored ones: the rows of the
    cells to write (`model.cells.changed_cells`) and what the comparison found. A job of a
    few named cells (at most `DRIVER_CELLS`) runs on the driver: their source row groups
    read with delta-rs and aggregated with Arrow (`Partials.on_driver`). A job of more named
    cells (at most `CHANGE_CELLS`) aggregates them on Spark and brings their fresh partials
    to the driver. So does a job with buckets for every entity whose source files hold at most
    `Partials.driver_rows` rows. Each is compared there with the stored rows of its cells.
    Other jobs (larger buckets for every entity, more cells) stay on Spark, where the rows are
    cached until `Recomputed.release`. A rollup source is read at snapshot `below` when given.
    Refuses (`RawRowsRetainedError`) cells whose raw rows retention removed."""
    engine.require_source_rows(spec, list(cells.windows))
    partials = engine.partials
    spans = merge_windows(list(cells.windows))
    if cells.named is not None and cells.named <= CHANGE_CELLS:
        # Named cells: their fresh partials are at most `CHANGE_CELLS` rows, compared with
        # the stored ones on the driver.
        if cells.named <= DRIVER_CELLS or partials.corrected_below(spec, cells, below):
            rows, versions = partials.on_driver(spec, cells, raw_table, below)
        else:
            rows, versions = partials.in_tasks(spark, spec, cells, raw_table, below)
        return _compared_on_driver(engine, spec, cells, rows, versions)
    if cells.named is None:
        bound = partials.source_rows_at_most(spec, cells)
        if partials.fits_driver(bound):
            rows, versions = partials.on_driver(spec, cells, raw_table, below)
            return _compared_on_driver(
                engine,
                spec,
                cells,
                rows,
                versions,
                reason=f"aggregated again on the driver: its source files hold {bound:,} rows",
            )
    held = engine.rollups.may_hold(spec, spans, cells.entities)
    fill = None
    if not held and not partials.corrected_below(spec, cells, below):
        fill = partials.first_fill(spec, cells, raw_table)
    if fill is not None:
        return Recomputed(
            fill,
            None,
            fill.versions,
            reason=(
                f"a first fill: {fill.buckets} bucket(s) aggregated and written one storage "
                f"partition at a time ({len(fill.parts)} partition(s)), without a shuffle"
            ),
        )
    fresh, versions = partials.on_spark(spark, spec, cells, raw_table, below)
    fresh = fresh.persist()
    if held:
        own = engine.rollups.snapshot(spec)
        stored_df = engine.rollups.read_spark(
            spark, spec, spans, cells.entities, own, unknown=Unknown.BLANK
        )
        compared_df = cell_changes(fresh, _within(spark, stored_df, cells), spec).persist()
    else:
        # Nothing stored in these buckets yet (a first backfill): no join, every cell is new.
        compared_df = all_new(fresh, spec)
    try:
        per_bucket = (
            compared_df.groupBy("bucket_start")
            .agg(
                F.count(F.lit(1)).alias("cells"),
                F.sum(F.col(CHANGED).cast("long")).alias("changed"),
                F.sum(F.coalesce(F.col(SOURCE_ROWS), F.lit(0))).alias("rows"),
            )
            .toArrow()
            .to_pylist()
        )

        def changed_rows(starts: list[datetime]) -> list[dict]:
            # The buckets as a broadcast table, not thousands of literals in one predicate.
            wanted = spark.createDataFrame(pa.table({"bucket_start": pa.array(starts, TS)}))
            return (
                compared_df.where(F.col(CHANGED))
                .join(F.broadcast(wanted), "bucket_start")
                .select(ENTITY_COLUMN, "bucket_start", F.lit(True).alias(CHANGED))
                .toArrow()
                .to_pylist()
            )

        found = _found(cells, per_bucket, partial=changed_rows, folded=_folded(engine, spec, cells))
        rows = _within(spark, fresh, found.cells).drop(SOURCE_ROWS)
    finally:
        compared_df.unpersist()
    return Recomputed(rows, found, versions, release=fresh.unpersist)


def _compared_on_driver(
    engine: Engine,
    spec: RollupSpec,
    cells: Cells,
    rows: pa.Table,
    versions: dict[str, int],
    reason: str = "",
) -> Recomputed:
    """The fresh partials `rows` of `cells`, compared on the driver with the stored rows of
    those cells: the rows of the cells to write."""
    # Stored as the rows hold it: a cell they cannot tell (a read would aggregate it again
    # from the source: the fresh value) holds no value, so it counts as changed and is
    # written, or emptied when the source has no row left for it. Only named cells: each
    # file keeps only their rows (`exact`).
    stored = engine.rollups.read_arrow(
        spec,
        merge_windows(list(cells.windows)),
        cells.entities,
        engine.rollups.snapshot(spec),
        cells=cells,
        exact=cells.named is not None,
        unknown=Unknown.BLANK,
    )
    compared = cell_changes_arrow(rows, rows_in(stored, cells), spec)
    wanted = [c for c in (*KEYS, CHANGED, SOURCE_ROWS) if c in compared.column_names]
    found = _found(
        cells,
        compared.select(wanted).to_pylist(),
        partial=None,
        folded=_folded(engine, spec, cells),
    )
    picked = rows_in(rows, found.cells)
    return Recomputed(picked.drop_columns([SOURCE_ROWS]), found, versions, reason=reason)


def rows_in(rows: pa.Table, cells: Cells) -> pa.Table:
    """The rows of `rows` in `cells`: every row of a bucket for every entity, the named ones
    of the others."""
    whole = [w for w, scope in cells if scope is None]
    parts = []
    if whole:
        parts.append(rows.filter(in_windows(rows["bucket_start"], whole)))
    if any(scope is not None for _, scope in cells):
        parts.append(rows_with_keys(rows, cell_keys(cells), KEYS))
    return pa.concat_tables(parts) if parts else rows.slice(0, 0)


def filled(cells: Cells, counts: dict[datetime, tuple[int, int]]) -> CellOutcome:
    """The outcome of a first fill of `cells` from what it wrote per bucket start: (cells,
    source rows). Every cell written is new."""
    compared = [
        {"bucket_start": start, "cells": n, "changed": n, "rows": rows}
        for start, (n, rows) in counts.items()
    ]
    return _found(cells, compared, partial=lambda _starts: [])


def _folded(engine: Engine, spec: RollupSpec, cells: Cells) -> frozenset[Window]:
    """The every-entity buckets of `cells` that folding rewrites whole, even unchanged
    (`model.cells.buckets_to_fold`): they then leave one bucket pointer each."""
    whole = {w for w, scope in cells if scope is None}
    if not whole:
        return frozenset()
    return engine.buckets_to_fold(spec) & whole


def _found(
    cells: Cells,
    compared: list[dict],
    partial: Callable[[list[datetime]], list[dict]] | None,
    folded: frozenset[Window] = frozenset(),
) -> CellOutcome:
    """The outcome from compared cells: rows of (bucket_start, entity_id, CHANGED, SOURCE_ROWS)
    when `partial` is None; otherwise per-bucket counts (bucket_start, cells, changed, rows),
    with `partial(starts)` naming the changed cells of the given buckets when needed."""
    by_start = {w.start: w for w in cells.windows}
    counts: dict[Window, CellCounts] = {}
    changed_entities: dict[Window, set[str]] = {}
    if partial is None:
        tally: dict[Window, list[int]] = {}
        rows = 0
        for r in compared:
            w = by_start[r["bucket_start"]]
            t = tally.setdefault(w, [0, 0])
            t[0] += 1
            rows += int(r.get(SOURCE_ROWS) or 0)
            if r[CHANGED]:
                t[1] += 1
                changed_entities.setdefault(w, set()).add(r[ENTITY_COLUMN])
        counts = {w: CellCounts(c, ch) for w, (c, ch) in tally.items()}
    else:
        counts = {
            by_start[r["bucket_start"]]: CellCounts(r["cells"], r["changed"] or 0) for r in compared
        }
        rows = sum(int(r["rows"] or 0) for r in compared)
        to_name = [
            w
            for w, scope in cells
            if w in counts and counts[w].changed and not rewrites_whole(scope, counts[w])
        ]
        if to_name:
            for r in partial([w.start for w in to_name]):
                changed_entities.setdefault(by_start[r["bucket_start"]], set()).add(
                    r[ENTITY_COLUMN]
                )
    written = changed_cells(
        cells, counts, {w: frozenset(ids) for w, ids in changed_entities.items()}, folded
    )
    total = sum(c.cells for c in counts.values())
    changed = sum(c.changed for c in counts.values())
    return CellOutcome(
        written, cells_changed=changed, cells_skipped=total - changed, source_rows=rows
    )


def _within(spark: SparkSession, frame: DataFrame, cells: Cells) -> DataFrame:
    """The rows of `frame` in `cells`."""
    whole, named = cell_targets(spark, cells)
    parts = []
    if whole is not None:
        parts.append(frame.join(F.broadcast(whole.select("bucket_start")), "bucket_start"))
    if named is not None:
        parts.append(frame.join(F.broadcast(named.select(*KEYS)), KEYS))
    if not parts:
        return frame.limit(0)
    return parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
