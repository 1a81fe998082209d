"""Writing a rollup's rows: a new generation's files (by the executors, or on the driver for
rows already there) and the commit that adds them, still invisible until a flip
(`rollup_pointers`); and the forward lane's replacement of generation-0 rows in one commit.
"""

import contextlib
import json
import os
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.transaction import AddAction
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import Window, iso_utc, merge_windows
from rollup_assets.resources.delta_commits import CommitPlan
from rollup_assets.resources.delta_files import (
    ROW_GROUP_ROWS,
    WRITTEN_FILES_DDL,
    add_action,
    build_file_writer,
)
from rollup_assets.resources.fill import Fill, run_fill
from rollup_assets.resources.rollup_snapshots import RollupSnapshots
from rollup_assets.resources.rollup_table import REPLACED_KEY, Written, in_windows
from rollup_assets.resources.schemas import (
    DELTA_COLUMN,
    PART_COLUMN,
    part_format,
    part_values,
    spark_schema,
    table_schema,
    with_row_shape,
)
from rollup_assets.resources.warehouse import filesystem_for

# Partitions of a driver-side write written side by side.
WRITE_WORKERS = max(1, min(4, os.cpu_count() or 1))


def _by_partition(data: pa.Table) -> list[pa.Table]:
    """Slices of `data` (sorted by `PART_COLUMN`, not empty) holding one partition each."""
    values = data[PART_COLUMN].combine_chunks()
    starts = [0, *(np.flatnonzero(pc.not_equal(values[1:], values[:-1])) + 1).tolist()]
    ends = [*starts[1:], data.num_rows]
    return [data.slice(a, b - a) for a, b in zip(starts, ends, strict=True)]


def _written(futures: list[Future]) -> list[dict]:
    """The files of the partition writes that succeeded."""
    return [r for f in futures if f.exception() is None for r in f.result()]


class RollupWrites(RollupSnapshots):
    """New generations of a rollup's rows, and the forward lane's rows."""

    def next_generation(self, spec: RollupSpec) -> int:
        """One more than any generation ever flipped or written (also by crashed runs)."""
        snap = self.snapshot(spec)
        gens = [0]
        if snap.pointers.num_rows:
            gens.append(pc.max(snap.pointers["generation"]).as_py())
        if snap.table is not None:
            gens += [
                f["max.generation"] for f in snap.files() if f.get("max.generation") is not None
            ]
        return max(gens) + 1

    def write_rows(
        self,
        frame: DataFrame | pa.Table | Iterator[pa.Table],
        spec: RollupSpec,
        *,
        generation: int,
        job_id: str,
        run_id: str,
        source_versions: dict[str, int],
    ) -> Written:
        """Executors write `frame` (entity_id, bucket_start, bucket_end, partials) as Parquet files
        stamped with `generation`; returns the Delta add actions (nothing is committed yet). A
        table of a few rows already on the driver is written there, with the same writer; so are
        tables of rows made one after another (each written before the next is made)."""
        if isinstance(frame, pa.Table):
            frame = iter([frame])
        if not isinstance(frame, DataFrame):
            return self._write_tables(
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

    def _write_tables(
        self,
        tables: Iterator[pa.Table],
        spec: RollupSpec,
        *,
        generation: int,
        job_id: str,
        run_id: str,
        source_versions: dict[str, int],
    ) -> Written:
        """`_write_local` of each table in turn, each made once the one before is written. When
        making or writing one fails, the files the earlier ones wrote (committed nowhere) are
        deleted before the error goes on."""
        adds: list[AddAction] = []
        count = 0
        try:
            for table in tables:
                part = self._write_local(
                    table,
                    spec,
                    generation=generation,
                    job_id=job_id,
                    run_id=run_id,
                    source_versions=source_versions,
                )
                del table  # the next table is made once this one is gone
                adds += part.adds
                count += part.rows
        except BaseException:
            self._discard(spec, adds)
            raise
        return Written(adds, count)

    def _discard(self, spec: RollupSpec, adds: list[AddAction]) -> None:
        """Delete files written for a commit that will not happen; the error that ended the
        writes goes on whatever this meets."""
        with contextlib.suppress(Exception):
            fs, root = filesystem_for(self.uri(spec), self.options)
            for add in adds:
                with contextlib.suppress(OSError):
                    fs.delete_file(f"{root}/{urllib.parse.unquote(add.path)}")

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
            # Rows read back from the table (a fold's) carry their old stamp: replaced.
            at = rows.schema.get_field_index(name)
            rows = (
                rows.set_column(at, name, values) if at >= 0 else rows.append_column(name, values)
            )
        schema = table_schema(spec)
        rows = with_row_shape(rows, schema)
        data = rows.select(schema.names).cast(schema)
        data = data.sort_by(
            [(PART_COLUMN, "ascending"), ("entity_id", "ascending"), ("bucket_start", "ascending")]
        )
        table_fs = filesystem_for(self.uri(spec), self.options)
        writer = build_file_writer(self.uri(spec), PART_COLUMN, self.options, filesystem=table_fs)

        def write(part: pa.Table) -> list[dict]:
            return [r for batch in writer(iter(part.to_batches())) for r in batch.to_pylist()]

        # Small partitions are written side by side (encoding and writing Parquet release the
        # GIL): a correction's rows lie in hundreds of partitions, a few rows in each, and a
        # file's own cost dominates. Large ones (a fold's) one at a time, so that the write
        # holds one partition's buffers. A partition that fails deletes its own files
        # (`build_file_writer`); the others' are deleted here, as are those written when this
        # thread is interrupted meanwhile.
        parts = _by_partition(data)
        small = data.num_rows <= len(parts) * ROW_GROUP_ROWS
        pool = ThreadPoolExecutor(max_workers=min(WRITE_WORKERS, len(parts)) if small else 1)
        futures = [pool.submit(write, part) for part in parts]
        try:
            pool.shutdown(wait=True)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            futures = [f for f in futures if not f.cancelled()]
            self._discard(spec, [add_action(r) for r in _written(futures)])
            raise
        failed = next((f.exception() for f in futures if f.exception() is not None), None)
        if failed is not None:
            self._discard(spec, [add_action(r) for r in _written(futures)])
            raise failed
        files = _written(futures)
        return Written([add_action(r) for r in files], sum(int(r["num_rows"]) for r in files))

    def commit_generation(
        self, spec: RollupSpec, written: Written, metadata: dict[str, str], identity: str
    ) -> int:
        """Make the new generation's rows part of the table (still invisible: no pointer yet);
        only to the table of `identity` (read when the job began: see `identity`)."""
        return self.commit(
            spec, lambda _snapshot: CommitPlan(adds=written.adds), metadata, identity
        )

    def replace_forward(
        self,
        spec: RollupSpec,
        written: Written,
        buckets: list[Window],
        metadata: dict[str, str],
        identity: str,
    ) -> int:
        """Forward lane: swap the generation-0 rows of `buckets` for the new files in one commit,
        to the table of `identity` only (read when the run began: see `identity`).

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

        return self.commit(spec, plan, metadata, identity)
