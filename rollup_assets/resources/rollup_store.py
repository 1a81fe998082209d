"""Rollup tables on Delta: generation writes, pointer flips and the consistent read path.

A rollup table holds base rows (a cell's state) and difference rows (a change of it) of every
generation; its `__genmap` says which are visible per cell (`genmap`). Writers follow
the optimistic atomic swap: write rows at a new generation, flip the pointers in one commit
(`rollup_pointers`), then sweep what the flip superseded (`rollup_deletions`). The forward lane
(closing and refreshing the open bucket) instead replaces generation-0 rows in place with one
atomic commit.

Readers take the pointer table, then the row-table snapshot, then check that the pointer table
did not move in between (a sweep only ever follows a flip, so an unchanged pointer version proves
that every visible row is still in the snapshot); otherwise they retry. A read returns one row
per cell, in the shape of a base row: each cell's visible difference rows are folded into its
base (`compute.folding`). A cell the fold cannot know exactly (its kept extremes all left) is
aggregated again from its source by the `refill` the engine gives the store.
"""

import json
import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rollup_assets.compute.arrow_partials import rows_with_keys
from rollup_assets.compute.filters import rows_within
from rollup_assets.compute.folding import CellKey, fold
from rollup_assets.model.asof import version_at, version_if_existed
from rollup_assets.model.cells import Cells
from rollup_assets.model.errors import AsOfUnavailableError
from rollup_assets.model.operations import OPERATION_KEY, Operation
from rollup_assets.model.specs import ENTITY_COLUMN, RollupSpec
from rollup_assets.model.windows import Window, iso_utc, merge_windows
from rollup_assets.resources.delta_commits import CommitPlan
from rollup_assets.resources.delta_files import (
    WRITTEN_FILES_DDL,
    TargetIndex,
    add_action,
    build_file_writer,
    targets_of,
)
from rollup_assets.resources.delta_tables import (
    commit_history,
    file_actions,
    open_table,
    with_retries,
)
from rollup_assets.resources.fill import Fill, run_fill
from rollup_assets.resources.genmap import (
    read_pointers,
    read_pointers_at,
)
from rollup_assets.resources.latest_versions import committed_after
from rollup_assets.resources.rollup_deletions import RollupDeletions
from rollup_assets.resources.rollup_pointers import RollupPointers
from rollup_assets.resources.rollup_table import REPLACED_KEY, Written, cell_keys, in_windows
from rollup_assets.resources.schemas import (
    DELTA_COLUMN,
    PART_COLUMN,
    data_schema,
    part_format,
    part_values,
    spark_schema,
    table_schema,
    with_row_shape,
)
from rollup_assets.resources.visible_rows import live_files, resolve_visible_spark, visible_mask
from rollup_assets.resources.warehouse import data_file_uri, spark_uri

log = logging.getLogger(__name__)
# Threads that read a rollup's files side by side (shared, so a query starts none).
READERS = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="read")


class PointersMoved(Exception):
    """The pointer table moved while a snapshot was taken; take it again."""


@dataclass(frozen=True)
class Reflected:
    """Versions of a rollup's pointer and row tables (-1: no table): the state of its active
    rows that something read or reflects."""

    genmap: int
    rows: int

    def at_or_before(self, other: "Reflected") -> bool:
        """Is this state no later than `other` (both tables at or before its versions)?"""
        return self.genmap <= other.genmap and self.rows <= other.rows


@dataclass(frozen=True)
class Snapshot:
    """A consistent pair: the row table at one version and the pointers valid for it."""

    table: DeltaTable | None
    pointers: pa.Table
    genmap_version: int | None

    @property
    def version(self) -> int | None:
        return None if self.table is None else self.table.version()

    @property
    def reflects(self) -> Reflected:
        return Reflected(_v(self.genmap_version), _v(self.version))

    def lineage(self, spec: RollupSpec) -> dict[str, int]:
        """The source versions a row computed from this snapshot of `spec` records."""
        state = self.reflects
        return {spec.name: state.rows, spec.genmap_name: state.genmap}


def _v(version: int | None) -> int:
    return -1 if version is None else version


class RollupStore(RollupPointers, RollupDeletions):
    # -- snapshots -----------------------------------------------------------------------------

    def snapshot(self, spec: RollupSpec, attempts: int = 20) -> Snapshot:
        def attempt() -> Snapshot:
            pointers, gv = read_pointers(self.genmap_uri(spec), self.options)
            table = open_table(self.uri(spec), self.options)
            if committed_after(self.genmap_uri(spec), gv, self.options):
                raise PointersMoved(f"'{spec.name}': pointers kept moving")
            return Snapshot(table, pointers, gv)

        try:
            return with_retries(
                attempt,
                retryable=lambda exc: isinstance(exc, PointersMoved),
                attempts=attempts,
                what=f"snapshot of '{spec.name}'",
                delay=0.005,
                backoff=False,
            )
        except PointersMoved:
            raise RuntimeError(
                f"'{spec.name}': pointers kept moving; could not take a consistent snapshot"
            ) from None

    def snapshot_of(self, spec: RollupSpec, version: int, genmap_version: int | None) -> Snapshot:
        """The row table at `version` with the pointers of `genmap_version`: the snapshot a
        reader (or a run of the level above) took then. Raises FileNotFoundError when that
        version is no longer in the log."""
        try:
            table = open_table(self.uri(spec), self.options, version=version)
            pointers = read_pointers_at(self.genmap_uri(spec), genmap_version, self.options)
        except DeltaError as exc:
            raise FileNotFoundError(
                f"'{spec.name}' at version {version} (pointers {genmap_version}) is no longer "
                f"readable: {exc}"
            ) from exc
        return Snapshot(table, pointers, genmap_version)

    def snapshot_at(self, spec: RollupSpec, at: datetime) -> Snapshot:
        """The snapshot a reader took at `at`: the row table and the pointer table each at the
        newest version committed by then (from their logs' commit times).

        The pair is consistent: a recompute commits its rows before it flips, and sweeps only
        after, so the rows the pointers of `at` name are in the row table of `at`. Raises
        AsOfUnavailableError when `at` is before the rollup existed or older than what retention
        keeps (vacuumed files, an expired log)."""
        rows = open_table(self.uri(spec), self.options)
        if rows is None:
            raise AsOfUnavailableError(
                f"'{spec.name}' has no rows table yet: nothing to read as of {iso_utc(at)}"
            )
        version = version_at(spec.name, [c for c, _ in commit_history(rows)], at)
        genmap = open_table(self.genmap_uri(spec), self.options)
        gv = None
        if genmap is not None:
            history = [c for c, _ in commit_history(genmap)]
            gv = version_if_existed(spec.genmap_name, history, at)
        pointers = read_pointers_at(self.genmap_uri(spec), gv, self.options)
        return Snapshot(open_table(self.uri(spec), self.options, version), pointers, gv)

    def committed_by(self, spec: RollupSpec, job_id: str, operation: Operation) -> int | None:
        """The version of the commit of `job_id` with `operation` (a recompute's rows: the row
        table; a flip: the pointer table), if the table's log still holds it."""
        uri = self.uri(spec) if operation == Operation.RECOMPUTE else self.genmap_uri(spec)
        table = open_table(uri, self.options)
        if table is None:
            return None
        for commit_, info in reversed(commit_history(table)):
            if info.get("rollups.job_id") == job_id and info.get(OPERATION_KEY) == operation:
                return commit_.version
        return None

    def pointers_at(self, spec: RollupSpec, version: int | None) -> pa.Table:
        """The pointer table as of `version` (None or -1: before its first commit)."""
        return read_pointers_at(self.genmap_uri(spec), version, self.options)

    def table_at(self, spec: RollupSpec, version: int) -> DeltaTable | None:
        return open_table(self.uri(spec), self.options, version)

    # -- reads ---------------------------------------------------------------------------------

    def read_spark(
        self,
        spark: SparkSession,
        spec: RollupSpec,
        spans: Sequence[Window] | None = None,
        entities: frozenset[str] | None = None,
        snapshot: Snapshot | None = None,
    ) -> DataFrame:
        """Active rows (stored partials + bookkeeping) of buckets starting in `spans`."""
        snap = snapshot or self.snapshot(spec)
        read_schema = spark_schema(data_schema(spec))
        if snap.table is None:
            return spark.createDataFrame([], read_schema)
        files = live_files(
            self.overlapping(file_actions(snap.table), spans, entities), snap.pointers
        )
        if not files:
            return spark.createDataFrame([], read_schema)
        root = self.uri(spec)
        uris = [spark_uri(data_file_uri(root, f["path"])) for f in files]
        df = spark.read.schema(read_schema).parquet(*uris)
        df = rows_within(df, "bucket_start", spans, entities)
        visible = resolve_visible_spark(spark, df, snap.pointers)
        return self._folded_spark(spark, spec, visible, snap)

    def _folded_spark(
        self, spark: SparkSession, spec: RollupSpec, visible: DataFrame, snap: Snapshot
    ) -> DataFrame:
        """`visible` rows with each corrected cell's difference rows folded into its base. The
        cells with difference rows are few (maintenance folds them into new bases): their rows
        are folded on the driver and put back."""
        changed = visible.where(F.col(DELTA_COLUMN)).select(ENTITY_COLUMN, "bucket_start")
        keys = changed.distinct().toArrow()
        if keys.num_rows == 0:
            return visible
        marked = spark.createDataFrame(
            keys.append_column("__folded", pa.array([True] * keys.num_rows, pa.bool_()))
        )
        plain = (
            visible.join(F.broadcast(marked), on=[ENTITY_COLUMN, "bucket_start"], how="left")
            .where(F.col("__folded").isNull())
            .drop("__folded")
        )
        rows = visible.join(F.broadcast(marked), on=[ENTITY_COLUMN, "bucket_start"], how="inner")
        folded = self._folded_arrow(spec, rows.drop("__folded").toArrow(), snap)
        schema = spark_schema(data_schema(spec))
        return plain.unionByName(spark.createDataFrame(folded.select(schema.names), schema))

    def may_hold(
        self,
        spec: RollupSpec,
        spans: Sequence[Window] | None = None,
        entities: frozenset[str] | None = None,
    ) -> bool:
        """Could the table hold rows of buckets starting in `spans` (and `entities`)? False only
        when no live file's statistics overlap them (a first backfill of the range)."""
        snap = self.snapshot(spec)
        if snap.table is None:
            return False
        return bool(self.overlapping(file_actions(snap.table), spans, entities))

    # Aggregates cells of a rollup again from its source (set by the engine): a read folding a
    # cell it cannot know exactly (`compute.folding.Unknowable`) asks it for that cell's row.
    refill: "Callable[[RollupSpec, list[CellKey]], pa.Table] | None" = None

    def read_arrow(
        self,
        spec: RollupSpec,
        spans: Sequence[Window] | None = None,
        entities: frozenset[str] | None = None,
        snapshot: Snapshot | None = None,
        columns: Sequence[str] | None = None,
        cells: Cells | None = None,
        exact: bool = False,
    ) -> pa.Table:
        """Active rows in `spans` (and `entities`): every stored column, or `columns` (to which
        `generation` is added: the active generation is resolved from it). With `cells`, only
        the row groups that may hold those cells are read (a few cells cost a row group each,
        not the cross product of their buckets and entities); rows of other cells may remain,
        unless `exact` (`cells` are named cells of this rollup): then each file keeps only the
        rows of those cells, so the driver never holds more than their rows."""
        snap = snapshot or self.snapshot(spec)
        schema = data_schema(spec)
        if columns is not None:
            # The generation and the row kind resolve what is visible, a cell's bucket end names
            # it for folding (dropped again after, but the generation).
            extra = ("generation", DELTA_COLUMN, "bucket_end")
            wanted = [*columns, *(c for c in extra if c not in columns)]
            schema = pa.schema([schema.field(c) for c in wanted])
        if snap.table is None:
            return schema.empty_table()

        def read(f: dict) -> pa.Table:
            data = self._read_file(spec, f, schema.names, targets).cast(schema)
            if keys is not None and targets is not None:
                return _cells_only(data, keys, targets)
            mask = in_windows(data["bucket_start"], spans) if spans else None
            if entities is not None:
                em = pc.is_in(data["entity_id"], value_set=pa.array(sorted(entities)))
                mask = em if mask is None else pc.and_(mask, em)
            return data if mask is None else data.filter(mask)

        listed = list(cells) if cells is not None else targets_of(spans, entities)
        targets = None if listed is None else TargetIndex(listed)
        keys = cell_keys(cells) if exact and cells is not None else None
        files = live_files(
            self.overlapping(file_actions(snap.table), spans, entities), snap.pointers
        )
        if not files:
            return schema.empty_table()
        # Reading and decoding Parquet releases the GIL: files are read side by side.
        parts = list(READERS.map(read, files))
        rows = pa.concat_tables(parts)
        rows = rows.filter(visible_mask(rows, snap.pointers))
        if (
            DELTA_COLUMN not in rows.column_names
            or not pc.any(pc.fill_null(rows[DELTA_COLUMN], False)).as_py()
        ):
            return _requested(rows, columns)
        # Corrected cells: every column of their rows, folded into one row each.
        changed = rows.filter(pc.fill_null(rows[DELTA_COLUMN], False))
        named = Cells.collect(
            (
                (Window(b, e), frozenset([x]))
                for x, b, e in zip(
                    changed[ENTITY_COLUMN].to_pylist(),
                    changed["bucket_start"].to_pylist(),
                    changed["bucket_end"].to_pylist(),
                    strict=True,
                )
            ),
            limit=None,
        )
        mine = _not_in(rows, cell_keys(named))
        whole = self._cells_rows(spec, snap, named)
        folded = self._folded_arrow(spec, whole, snap).select(schema.names).cast(schema)
        out = pa.concat_tables([mine.select(schema.names), folded])
        return _requested(out, columns)

    def _cells_rows(self, spec: RollupSpec, snap: Snapshot, cells: Cells) -> pa.Table:
        """Every column of the visible rows of named `cells` at `snap`."""
        schema = data_schema(spec)
        if snap.table is None:
            return schema.empty_table()
        spans = merge_windows(list(cells.windows))
        targets = TargetIndex(list(cells))
        keys = cell_keys(cells)
        files = live_files(
            self.overlapping(file_actions(snap.table), spans, cells.entities), snap.pointers
        )

        def read(f: dict) -> pa.Table:
            data = self._read_file(spec, f, schema.names, targets).cast(schema)
            return _cells_only(data, keys, targets)

        parts = list(READERS.map(read, files)) or [schema.empty_table()]
        rows = pa.concat_tables(parts)
        return rows.filter(visible_mask(rows, snap.pointers))

    def _folded_arrow(self, spec: RollupSpec, rows: pa.Table, snap: Snapshot) -> pa.Table:
        """The visible rows of some cells folded into one base-shaped row each; the cells the
        fold cannot know are aggregated again from their source (`refill`)."""
        folded, unknown = fold(rows.cast(data_schema(spec)), spec)
        if not unknown:
            return folded
        if self.refill is None:
            raise RuntimeError(f"'{spec.name}': {len(unknown)} cell(s) need a refill, none given")
        again = self.refill(spec, unknown)
        return pa.concat_tables(
            [folded, _as_rows_of(again, folded.schema, generation=_newest(rows, unknown))]
        )

    # -- generation writes -------------------------------------------------------------------

    def next_generation(self, spec: RollupSpec) -> int:
        """One more than any generation ever flipped or written (also by crashed runs)."""
        snap = self.snapshot(spec)
        gens = [0]
        if snap.pointers.num_rows:
            gens.append(pc.max(snap.pointers["generation"]).as_py())
        if snap.table is not None:
            gens += [
                f["max.generation"]
                for f in file_actions(snap.table)
                if f.get("max.generation") is not None
            ]
        return max(gens) + 1

    def write_rows(
        self,
        frame: DataFrame | pa.Table,
        spec: RollupSpec,
        *,
        generation: int,
        job_id: str,
        run_id: str,
        source_versions: dict[str, int],
    ) -> Written:
        """Executors write `frame` (entity_id, bucket_start, bucket_end, partials) as Parquet files
        stamped with `generation`; returns the Delta add actions (nothing is committed yet). A
        table of a few rows already on the driver is written there, with the same writer."""
        if isinstance(frame, pa.Table):
            return self._write_local(
                frame,
                spec,
                generation=generation,
                job_id=job_id,
                run_id=run_id,
                source_versions=source_versions,
            )
        df = (
            frame.withColumn("generation", F.lit(generation).cast("long"))
            .withColumn("run_id", F.lit(run_id))
            .withColumn("job_id", F.lit(job_id))
            .withColumn("source_versions", F.lit(json.dumps(source_versions, sort_keys=True)))
            .withColumn(PART_COLUMN, F.date_format(F.col("bucket_start"), part_format(spec)))
        )
        target = spark_schema(table_schema(spec))
        for f in target.fields:
            if f.name not in df.columns:  # a base row's values entering and leaving: none
                value = F.lit(False) if f.name == DELTA_COLUMN else F.lit(None)
                df = df.withColumn(f.name, value.cast(f.dataType))
        df = df.select(*target.names)
        parts = int(frame.sparkSession.conf.get("spark.sql.shuffle.partitions") or 8)
        # Entity-major inside each file: a recompute for a few entities reads their row groups.
        df = df.repartition(parts, PART_COLUMN).sortWithinPartitions(
            PART_COLUMN, "entity_id", "bucket_start"
        )
        writer = build_file_writer(self.uri(spec), PART_COLUMN, self.options)
        rows = [r.asDict() for r in df.mapInArrow(writer, WRITTEN_FILES_DDL).collect()]
        return Written([add_action(r) for r in rows], sum(int(r["num_rows"]) for r in rows))

    def write_fill(
        self,
        spark: SparkSession,
        fill: Fill,
        *,
        generation: int,
        job_id: str,
        run_id: str,
        source_versions: dict[str, int],
    ) -> Written:
        """Executors aggregate and write a first fill (`fill`), one file per storage
        partition, stamped like `write_rows`; the add actions (nothing is committed yet), the
        cells and source rows written per bucket, and the source rows decoded."""
        stamp: dict[str, str | int] = {
            "generation": generation,
            "run_id": run_id,
            "job_id": job_id,
            "source_versions": json.dumps(source_versions, sort_keys=True),
        }
        return run_fill(spark, fill, self.uri(fill.spec), self.options, stamp)

    def _write_local(
        self,
        rows: pa.Table,
        spec: RollupSpec,
        *,
        generation: int,
        job_id: str,
        run_id: str,
        source_versions: dict[str, int],
    ) -> Written:
        """`write_rows` for rows already on the driver: the same files, written here with the
        executors' writer, without a Spark job."""
        n = rows.num_rows
        if n == 0:
            return Written([], 0)
        stamp = {
            "generation": pa.array([generation] * n, pa.int64()),
            "run_id": pa.array([run_id] * n, pa.string()),
            "job_id": pa.array([job_id] * n, pa.string()),
            "source_versions": pa.array(
                [json.dumps(source_versions, sort_keys=True)] * n, pa.string()
            ),
        }
        stamp[PART_COLUMN] = part_values(spec, rows["bucket_start"])
        for name, values in stamp.items():
            rows = rows.append_column(name, values)
        schema = table_schema(spec)
        rows = with_row_shape(rows, schema)
        data = rows.select(schema.names).cast(schema)
        data = data.sort_by(
            [(PART_COLUMN, "ascending"), ("entity_id", "ascending"), ("bucket_start", "ascending")]
        )
        writer = build_file_writer(self.uri(spec), PART_COLUMN, self.options)
        files = [r for batch in writer(iter(data.to_batches())) for r in batch.to_pylist()]
        return Written([add_action(r) for r in files], sum(int(r["num_rows"]) for r in files))

    def commit_generation(
        self, spec: RollupSpec, written: Written, metadata: dict[str, str]
    ) -> int:
        """Make the new generation's rows part of the table (still invisible: no pointer yet)."""
        return self.commit(spec, lambda _snapshot: CommitPlan(adds=written.adds), metadata)

    def replace_forward(
        self,
        spec: RollupSpec,
        written: Written,
        buckets: list[Window],
        metadata: dict[str, str],
    ) -> int:
        """Forward lane: swap the generation-0 rows of `buckets` for the new files in one commit.

        The commit records the buckets it replaced (`REPLACED_KEY`): a bucket whose new
        aggregation is empty gets no file, and readers of the commit (the surface's publish)
        still learn that its rows changed."""
        spans = [[iso_utc(w.start), iso_utc(w.end)] for w in merge_windows(buckets)]
        metadata = {**metadata, REPLACED_KEY: json.dumps(spans)}

        def drop(rows: pa.Table) -> pa.ChunkedArray:
            return pc.and_(
                in_windows(rows["bucket_start"], buckets), pc.equal(rows["generation"], 0)
            )

        def select(files: list[dict]) -> list[dict]:
            # A file whose statistics say every row is of a later generation (a recompute's) holds
            # no generation-0 row: it is not read.
            return [
                f
                for f in self.overlapping(files, buckets, None)
                if (f.get("min.generation") or 0) == 0
            ]

        def plan(snapshot: DeltaTable | None) -> CommitPlan:
            removes, rewritten, _ = self._rewrite(spec, snapshot, select, drop)
            return CommitPlan(adds=[*written.adds, *rewritten], removes=removes)

        return self.commit(spec, plan, metadata)


def _cells_only(rows: pa.Table, keys: pa.Table, cells: TargetIndex) -> pa.Table:
    """The rows of the cells `keys` (bucket_start, entity_id; also indexed as `cells`). A file
    holds few of the cells' entities in its time range: rows are narrowed to those first, so
    the exact match runs on about the cells' own rows."""
    if rows.num_rows == 0:
        return rows
    lo, hi = pc.min_max(rows["bucket_start"]).values()
    near = {e for _, scope in cells.overlapping(lo.as_py(), hi.as_py()) for e in scope or ()}
    if not near:
        return rows.schema.empty_table()  # not a slice: it would keep the file's buffers
    rows = rows.filter(pc.is_in(rows["entity_id"], value_set=pa.array(sorted(near), pa.string())))
    return rows_with_keys(rows, keys, keys.column_names)


def _not_in(rows: pa.Table, keys: pa.Table) -> pa.Table:
    """`rows` of cells other than `keys` (bucket_start, entity_id)."""
    names = ["bucket_start", "entity_id"]
    # Only the keys and a row index join (a join carries no list column).
    index = pa.table({n: rows[n] for n in names}).append_column(
        "__i", pa.array(np.arange(rows.num_rows, dtype=np.int64))
    )
    hit = index.join(keys.select(names), names, join_type="left semi")["__i"].to_numpy()
    keep = np.ones(rows.num_rows, dtype=bool)
    keep[hit] = False
    return rows.filter(pa.array(keep))


def _newest(rows: pa.Table, cells: list[CellKey]) -> dict[CellKey, int]:
    wanted = set(cells)
    out: dict[CellKey, int] = {}
    for e, b, g in zip(
        rows[ENTITY_COLUMN].to_pylist(),
        rows["bucket_start"].to_pylist(),
        rows["generation"].to_pylist(),
        strict=True,
    ):
        if (e, b) in wanted:
            out[(e, b)] = max(out.get((e, b), 0), g)
    return out


def _as_rows_of(again: pa.Table, schema: pa.Schema, generation: dict[CellKey, int]) -> pa.Table:
    """Partials aggregated again (`refill`), in the shape of stored rows at each cell's newest
    visible generation."""
    n = again.num_rows
    keys = list(
        zip(again[ENTITY_COLUMN].to_pylist(), again["bucket_start"].to_pylist(), strict=True)
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


def _requested(rows: pa.Table, columns: Sequence[str] | None) -> pa.Table:
    """`rows` in the `columns` asked for and their generation (every column: None)."""
    if columns is None:
        return rows
    return rows.select([*columns, *(["generation"] if "generation" not in columns else [])])
