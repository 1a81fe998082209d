"""Rollup tables on Delta: generation writes, pointer flips, sweeps and the consistent read path.

A rollup table holds rows of every generation; its `__genmap` says which one is active per bucket
(and entity). Writers follow the optimistic atomic swap: write rows at a new generation, flip the
pointers in one commit, then sweep what the flip superseded. The forward lane (closing and
refreshing the open bucket) instead replaces generation-0 rows in place with one atomic commit.

Readers take the pointer table, then the row-table snapshot, then check that the pointer table
did not move in between (a sweep only ever follows a flip, so an unchanged pointer version proves
that every active row is still in the snapshot); otherwise they retry.
"""

import functools
import json
import logging
import operator
import os
import time
import urllib.parse
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.transaction import AddAction, RemoveAction
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from resources.delta_io import (
    ROW_GROUP_ROWS,
    WRITTEN_FILES_DDL,
    CommitPlan,
    add_actions_from_rows,
    build_file_writer,
    commit,
    committed_after,
    file_actions,
    open_table,
    remove_action,
    stats_from_metadata,
)
from resources.genmap import (
    GENMAP_SCHEMA,
    active_mask,
    flipped_pointers,
    read_pointers,
    split_pointers,
    write_pointer_table,
)
from resources.warehouse import Warehouse, data_file_uri, filesystem_for, spark_uri
from rollup_assets.aggregation import SPARK_TYPES
from rollup_assets.partitions import Window, merge_windows
from rollup_assets.specs import Alignment, ColumnType, RollupSpec

log = logging.getLogger(__name__)
TS = pa.timestamp("us", tz="UTC")
ARROW_TYPES = {
    ColumnType.DOUBLE: pa.float64(),
    ColumnType.LONG: pa.int64(),
    ColumnType.BOOLEAN: pa.bool_(),
    ColumnType.STRING: pa.string(),
}
BOOKKEEPING = [
    ("generation", pa.int64()),
    ("run_id", pa.string()),
    ("job_id", pa.string()),
    ("source_versions", pa.string()),
]
PART_COLUMN = "bucket_part"
# A recompute's sweep leaves superseded rows in files this much larger than what it wrote (and
# larger than SWEEP_MIN_ROWS) to the maintenance sweep; see RollupStore.sweep.
SWEEP_FACTOR = 8
SWEEP_MIN_ROWS = 4_096
# Threads that read a rollup's files side by side (shared, so a query starts none).
_READERS = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="read")


def table_schema(spec: RollupSpec) -> pa.Schema:
    fields = [("entity_id", pa.string()), ("bucket_start", TS), ("bucket_end", TS)]
    fields += [(sc.name, ARROW_TYPES[sc.type]) for sc in spec.stored_columns]
    return pa.schema([*fields, *BOOKKEEPING, (PART_COLUMN, pa.string())])


def data_schema(spec: RollupSpec) -> pa.Schema:
    """The columns stored inside the Parquet files (the partition column lives in the path)."""
    s = table_schema(spec)
    return s.remove(s.get_field_index(PART_COLUMN))


def part_format(spec: RollupSpec) -> str:
    """Physical partitioning: UTC day for sub-daily buckets, month for days, year above."""
    if spec.alignment is Alignment.FIXED_SIZE:
        return "yyyy-MM-dd"
    return "yyyy-MM" if spec.alignment is Alignment.CALENDAR_DAY else "yyyy"


def in_windows(starts: pa.ChunkedArray | pa.Array, windows: Sequence[Window]) -> pa.ChunkedArray:
    """Mask: does each bucket start fall in one of `windows`?"""
    mask = pc.fill_null(pa.nulls(len(starts), pa.bool_()), False)
    for w in merge_windows(list(windows)):
        inside = pc.and_(
            pc.greater_equal(starts, pa.scalar(w.start, TS)), pc.less(starts, pa.scalar(w.end, TS))
        )
        mask = pc.or_(mask, inside)
    return mask


@dataclass(frozen=True)
class Snapshot:
    """A consistent pair: the row table at one version and the pointers valid for it."""

    table: DeltaTable | None
    pointers: pa.Table
    genmap_version: int | None

    @property
    def version(self) -> int | None:
        return None if self.table is None else self.table.version()


@dataclass(frozen=True)
class Written:
    adds: list[AddAction]
    rows: int


class RollupStore:
    def __init__(self, warehouse: Warehouse) -> None:
        self.warehouse = warehouse
        self.options = warehouse.storage_options

    def uri(self, spec: RollupSpec) -> str:
        return self.warehouse.rollup_path(spec.name)

    def genmap_uri(self, spec: RollupSpec) -> str:
        return self.warehouse.genmap_path(spec.name)

    # -- snapshots -----------------------------------------------------------------------------

    def snapshot(self, spec: RollupSpec, attempts: int = 20) -> Snapshot:
        for _ in range(attempts):
            pointers, gv = read_pointers(self.genmap_uri(spec), self.options)
            table = open_table(self.uri(spec), self.options)
            if not committed_after(self.genmap_uri(spec), gv, self.options):
                return Snapshot(table, pointers, gv)
            time.sleep(0.005)
        raise RuntimeError(
            f"'{spec.name}': pointers kept moving; could not take a consistent snapshot"
        )

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
        schema = data_schema(spec)
        spark_schema = _spark_schema(spec, schema)
        if snap.table is None:
            return spark.createDataFrame([], spark_schema)
        files = self.overlapping(file_actions(snap.table), spans, entities)
        if not files:
            return spark.createDataFrame([], spark_schema)
        root = self.uri(spec)
        uris = [spark_uri(data_file_uri(root, f["path"])) for f in files]
        df = spark.read.schema(spark_schema).parquet(*uris)
        if spans:
            conds = [
                (F.col("bucket_start") >= F.lit(w.start)) & (F.col("bucket_start") < F.lit(w.end))
                for w in merge_windows(list(spans))
            ]
            df = df.where(functools.reduce(operator.or_, conds))
        if entities is not None:
            df = df.where(F.col("entity_id").isin(sorted(entities)))
        return resolve_active_spark(spark, df, snap.pointers)

    def read_arrow(
        self,
        spec: RollupSpec,
        spans: Sequence[Window] | None = None,
        entities: frozenset[str] | None = None,
        snapshot: Snapshot | None = None,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """Active rows in `spans` (and `entities`): every stored column, or `columns` (to which
        `generation` is added: the active generation is resolved from it)."""
        snap = snapshot or self.snapshot(spec)
        schema = data_schema(spec)
        if columns is not None:
            wanted = [*columns, *(["generation"] if "generation" not in columns else [])]
            schema = pa.schema([schema.field(c) for c in wanted])
        if snap.table is None:
            return schema.empty_table()

        def read(f: dict) -> pa.Table:
            data = self._read_file(spec, f, schema.names).cast(schema)
            mask = in_windows(data["bucket_start"], spans) if spans else None
            if entities is not None:
                em = pc.is_in(data["entity_id"], value_set=pa.array(sorted(entities)))
                mask = em if mask is None else pc.and_(mask, em)
            return data if mask is None else data.filter(mask)

        files = self.overlapping(file_actions(snap.table), spans, entities)
        if not files:
            return schema.empty_table()
        # Reading and decoding Parquet releases the GIL: files are read side by side.
        parts = list(_READERS.map(read, files))
        rows = pa.concat_tables(parts)
        return rows.filter(active_mask(rows, snap.pointers))

    def _read_file(
        self, spec: RollupSpec, f: dict, columns: Sequence[str] | None = None
    ) -> pa.Table:
        fs, root = filesystem_for(self.uri(spec), self.options)
        with fs.open_input_file(f"{root}/{urllib.parse.unquote(f['path'])}") as fh:
            return pq.read_table(fh, columns=list(columns) if columns is not None else None)

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
        frame: DataFrame,
        spec: RollupSpec,
        *,
        generation: int,
        job_id: str,
        run_id: str,
        source_versions: dict[str, int],
    ) -> Written:
        """Executors write `frame` (entity_id, bucket_start, bucket_end, partials) as Parquet files
        stamped with `generation`; returns the Delta add actions (nothing is committed yet)."""
        df = (
            frame.withColumn("generation", F.lit(generation).cast("long"))
            .withColumn("run_id", F.lit(run_id))
            .withColumn("job_id", F.lit(job_id))
            .withColumn("source_versions", F.lit(json.dumps(source_versions, sort_keys=True)))
            .withColumn(PART_COLUMN, F.date_format(F.col("bucket_start"), part_format(spec)))
            .select(*table_schema(spec).names)
        )
        parts = int(frame.sparkSession.conf.get("spark.sql.shuffle.partitions") or 8)
        # Entity-major inside each file: a recompute for a few entities reads their row groups.
        df = df.repartition(parts, PART_COLUMN).sortWithinPartitions(
            PART_COLUMN, "entity_id", "bucket_start"
        )
        writer = build_file_writer(self.uri(spec), PART_COLUMN, self.options)
        rows = [r.asDict() for r in df.mapInArrow(writer, WRITTEN_FILES_DDL).collect()]
        return Written(add_actions_from_rows(rows), sum(int(r["num_rows"]) for r in rows))

    def commit_generation(
        self, spec: RollupSpec, written: Written, metadata: dict[str, str]
    ) -> int:
        """Make the new generation's rows part of the table (still invisible: no pointer yet)."""
        return commit(
            self.uri(spec),
            lambda _snapshot: CommitPlan(adds=written.adds),
            schema=table_schema(spec),
            partition_by=[PART_COLUMN],
            metadata=metadata,
            storage_options=self.options,
        )

    def flip(
        self,
        spec: RollupSpec,
        buckets: list[Window],
        entities: frozenset[str] | None,
        generation: int,
        *,
        job_id: str,
        run_id: str,
    ) -> int:
        """The atomic commit point: `generation` becomes active on `buckets` (for `entities`)."""
        return write_pointer_table(
            self.genmap_uri(spec),
            lambda cur: flipped_pointers(cur, buckets, entities, generation, job_id, run_id),
            metadata={
                "rollups.operation": "flip",
                "rollups.generation": str(generation),
                "rollups.job_id": job_id,
            },
            storage_options=self.options,
        )

    def replace_forward(
        self,
        spec: RollupSpec,
        written: Written,
        buckets: list[Window],
        metadata: dict[str, str],
    ) -> int:
        """Forward lane: swap the generation-0 rows of `buckets` for the new files in one commit."""

        def drop(rows: pa.Table) -> pa.ChunkedArray:
            return pc.and_(
                in_windows(rows["bucket_start"], buckets), pc.equal(rows["generation"], 0)
            )

        def plan(snapshot: DeltaTable | None) -> CommitPlan:
            select = lambda files: self.overlapping(files, buckets, None)  # noqa: E731
            removes, rewritten, _ = self._rewrite(spec, snapshot, select, drop)
            return CommitPlan(adds=[*written.adds, *rewritten], removes=removes)

        return commit(
            self.uri(spec),
            plan,
            schema=table_schema(spec),
            partition_by=[PART_COLUMN],
            metadata=metadata,
            storage_options=self.options,
        )

    # -- sweeping ------------------------------------------------------------------------------

    def sweep(
        self,
        spec: RollupSpec,
        buckets: Sequence[Window],
        entities: frozenset[str] | None,
        *,
        flipped: Written | None = None,
        generation: int | None = None,
    ) -> int:
        """Delete rows in `buckets` (for `entities`) that are not the active generation.

        After a recompute's flip, pass its `generation` and what it wrote (`flipped`): files
        holding only that generation have nothing superseded and are not read, and a file much
        larger than the change (more than `SWEEP_FACTOR` times the rows written and more than
        `SWEEP_MIN_ROWS`) keeps its superseded rows, invisible to readers, until the
        maintenance sweep: rewriting it would make a small correction cost what the archive
        costs. Without them every file holding superseded rows in `buckets` is rewritten.
        """
        pointers, _ = read_pointers(self.genmap_uri(spec), self.options)
        limit = None
        if flipped is not None:
            limit = max(SWEEP_MIN_ROWS, SWEEP_FACTOR * flipped.rows)

        def select(files: list[dict]) -> list[dict]:
            candidates = [
                f
                for f in self.overlapping(files, buckets, entities)
                if not (
                    generation is not None
                    and f.get("min.generation") == generation
                    and f.get("max.generation") == generation
                )
            ]
            chosen = [
                f for f in candidates if limit is None or (f.get("num_records") or 0) <= limit
            ]
            if len(chosen) < len(candidates):
                log.info(
                    "%s: %d file(s) larger than %d rows keep their superseded rows until the "
                    "maintenance sweep",
                    spec.name,
                    len(candidates) - len(chosen),
                    limit,
                )
            return chosen

        def drop(rows: pa.Table) -> pa.ChunkedArray:
            mask = pc.and_(
                in_windows(rows["bucket_start"], buckets), pc.invert(active_mask(rows, pointers))
            )
            if entities is not None:
                mask = pc.and_(
                    mask, pc.is_in(rows["entity_id"], value_set=pa.array(sorted(entities)))
                )
            return mask

        return self._delete_rows(spec, select, drop, {"rollups.operation": "sweep"})

    def reclaim(self, spec: RollupSpec, protected: frozenset[int] = frozenset()) -> int:
        """Delete rows of generations no pointer references (left by runs that died before the
        flip), except `protected` ones that a live job is still about to flip."""
        pointers, _ = read_pointers(self.genmap_uri(spec), self.options)
        live = {0, *protected, *pc.unique(pointers["generation"]).to_pylist()}
        live_arr = pa.array(sorted(live), pa.int64())

        def select(files: list[dict]) -> list[dict]:
            return [
                f
                for f in files
                if f.get("min.generation") is None
                or any(g not in live for g in range(f["min.generation"], f["max.generation"] + 1))
            ]

        def drop(rows: pa.Table) -> pa.ChunkedArray:
            return pc.invert(pc.is_in(rows["generation"], value_set=live_arr))

        return self._delete_rows(spec, select, drop, {"rollups.operation": "reclaim"})

    def rewind(self, spec: RollupSpec, boundary: datetime) -> int:
        """Drop pointers of buckets starting at/after `boundary`, then their generation>0 rows.

        Destructive: until the forward lane re-aggregates, readers see the old generation-0 rows.
        Returns the number of rows deleted.
        """
        b = pa.scalar(boundary, TS)
        if open_table(self.genmap_uri(spec), self.options) is not None:
            write_pointer_table(
                self.genmap_uri(spec),
                lambda cur: cur.filter(pc.less(cur["bucket_start"], b)),
                metadata={"rollups.operation": "rewind"},
                storage_options=self.options,
            )

        def select(files: list[dict]) -> list[dict]:
            return [
                f
                for f in files
                if f.get("max.bucket_start") is None
                or (f["max.bucket_start"] >= boundary and (f.get("max.generation") or 1) > 0)
            ]

        def drop(rows: pa.Table) -> pa.ChunkedArray:
            return pc.and_(
                pc.greater_equal(rows["bucket_start"], b), pc.greater(rows["generation"], 0)
            )

        return self._delete_rows(spec, select, drop, {"rollups.operation": "rewind"})

    def overlapping(
        self, files: list[dict], spans: Sequence[Window] | None, entities: frozenset[str] | None
    ) -> list[dict]:
        """Files whose stats say they may hold rows in `spans` (and `entities`)."""
        merged = merge_windows(list(spans)) if spans else None
        out = []
        for f in files:
            lo, hi = f.get("min.bucket_start"), f.get("max.bucket_start")
            if (
                merged is not None
                and lo is not None
                and hi is not None
                and not any(lo < w.end and hi >= w.start for w in merged)
            ):
                continue
            elo, ehi = f.get("min.entity_id"), f.get("max.entity_id")
            if (
                entities is not None
                and elo is not None
                and ehi is not None
                and not any(elo <= e <= ehi for e in entities)
            ):
                continue
            out.append(f)
        return out

    def _delete_rows(
        self,
        spec: RollupSpec,
        select: Callable[[list[dict]], list[dict]],
        drop: Callable[[pa.Table], pa.ChunkedArray],
        metadata: dict[str, str],
    ) -> int:
        if open_table(self.uri(spec), self.options) is None:
            return 0
        deleted = [0]

        def plan(snapshot: DeltaTable | None) -> CommitPlan:
            removes, adds, n = self._rewrite(spec, snapshot, select, drop)
            deleted[0] = n
            return CommitPlan(adds=adds, removes=removes)

        commit(
            self.uri(spec),
            plan,
            schema=table_schema(spec),
            partition_by=[PART_COLUMN],
            metadata=metadata,
            storage_options=self.options,
        )
        return deleted[0]

    def _rewrite(
        self,
        spec: RollupSpec,
        snapshot: DeltaTable | None,
        select: Callable[[list[dict]], list[dict]],
        drop: Callable[[pa.Table], pa.ChunkedArray],
    ) -> tuple[list[RemoveAction], list[AddAction], int]:
        """Remove the selected files that hold rows matching `drop`; rewrite their other rows."""
        if snapshot is None:
            return [], [], 0
        fs, root = filesystem_for(self.uri(spec), self.options)
        schema = data_schema(spec)
        removes: list[RemoveAction] = []
        adds: list[AddAction] = []
        dropped = 0
        for f in select(file_actions(snapshot)):
            rows = self._read_file(spec, f, schema.names).cast(schema)
            mask = pc.fill_null(drop(rows), False)
            n = pc.sum(mask.cast(pa.int64())).as_py() or 0
            if n == 0:
                continue
            dropped += n
            removes.append(remove_action(f))
            if n == rows.num_rows:
                continue
            keep = rows.filter(pc.invert(mask))
            path = urllib.parse.unquote(f["path"])
            rel = (
                path.rsplit("/", 1)[0] + "/" if "/" in path else ""
            ) + f"part-{uuid.uuid4()}.snappy.parquet"
            with fs.open_output_stream(f"{root}/{rel}") as out:
                pq.write_table(keep, out, compression="snappy", row_group_size=ROW_GROUP_ROWS)
            with fs.open_input_file(f"{root}/{rel}") as fh:
                md = pq.ParquetFile(fh).metadata
                size = fh.size()
            pv = {k.split(".", 1)[1]: v for k, v in f.items() if k.startswith("partition.")}
            adds.append(
                AddAction(
                    path=urllib.parse.quote(rel, safe="/=-_."),
                    size=size,
                    partition_values={k: None if v is None else str(v) for k, v in pv.items()},
                    modification_time=int(time.time() * 1000),
                    data_change=True,
                    stats=json.dumps(stats_from_metadata(md)),
                )
            )
        return removes, adds, dropped


def _spark_schema(spec: RollupSpec, schema: pa.Schema):
    from pyspark.sql import types as T

    types = {
        pa.string(): T.StringType(),
        TS: T.TimestampType(),
        pa.int64(): T.LongType(),
        pa.float64(): T.DoubleType(),
        pa.bool_(): T.BooleanType(),
    }
    return T.StructType([T.StructField(f.name, types[f.type], True) for f in schema])


def resolve_active_spark(spark: SparkSession, rows: DataFrame, pointers: pa.Table) -> DataFrame:
    """Keep rows whose generation is the active one for their (bucket, entity)."""
    if pointers.num_rows == 0:
        return rows.where(F.col("generation") == 0)
    g, s = split_pointers(pointers)
    out = rows
    active = F.lit(0)
    if g.num_rows:
        out = out.join(F.broadcast(spark.createDataFrame(g)), on="bucket_start", how="left")
        active = F.greatest(active, F.coalesce(F.col("g_all"), F.lit(0)))
    if s.num_rows:
        out = out.join(
            F.broadcast(spark.createDataFrame(s)), on=["bucket_start", "entity_id"], how="left"
        )
        active = F.greatest(active, F.coalesce(F.col("g_entity"), F.lit(0)))
    cols = rows.columns
    return out.where(F.col("generation") == active).select(*cols)


__all__ = ["GENMAP_SCHEMA", "SPARK_TYPES", "RollupStore", "Snapshot", "Written", "table_schema"]
