"""Scenario 'writers': the same ingests through each writer, side by side, into fresh copies of
the backfilled archive's raw table.

- delta-rs: the MERGE in this process, on the driver (`rollups ingest`);
- delta-spark: the MERGE on Spark's executors (`rollups ingest --spark`);
- delta-spark with deletion vectors enabled on the raw table: the same MERGE, which then marks
  replaced rows deleted instead of rewriting their files; the project's readers refuse such
  files, so the time to purge them (`REORG TABLE ... APPLY (PURGE)`) is measured too.

Each ingest reports its wall time and the peak resident memory of this process (the driver)
and of the Spark JVM (in local mode the JVM holds the executors too, and keeps the heap it grew
earlier, so its figure is an upper bound of the step's own). Both tables are compared after
each case: every writer must leave the same rows.
"""

import shutil
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bench.context import Bench
from bench.correction import CLOSED_UNTIL, write_late
from bench.generate import Dataset
from bench.harness import BenchWorld
from bench.metrics import measure, say
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.specs import RawArchiveSpec
from rollup_assets.model.windows import Window
from rollup_assets.resources.raw_ingest import IngestResult
from rollup_assets.resources.raw_store import RawStore
from rollup_assets.resources.spark_batches import read_file
from rollup_assets.resources.spark_ingest import ingest_frame
from rollup_assets.resources.warehouse import Warehouse, spark_uri

WRITERS = ("delta-rs", "delta-spark", "delta-spark, deletion vectors")


def run_writers(bench: Bench, world: BenchWorld, dataset: Dataset) -> dict:
    spec = world.catalog.raw["energy_raw"]
    source = Path(world.engine.raw.uri(spec))
    count = max(bench.late_counts)  # 10,000 at the standard sizes
    _, late = write_late(bench, dataset, count, seed=bench.seed + 77)
    day = whole_day(bench, world, dataset)
    cases = [(f"{count:,} late readings", late), ("whole-day re-ingest", day)]
    out: dict = {"cases": []}
    for label, path in cases:
        rows = pq.ParquetFile(path).metadata.num_rows
        case: dict = {"case": label, "rows": rows, "writers": {}}
        digests = {}
        for writer in WRITERS:
            root = bench.work / "writers" / writer.replace(", ", "-").replace(" ", "-")
            shutil.rmtree(root, ignore_errors=True)
            shutil.copytree(source, root / "raw" / spec.name)
            store = RawStore(Warehouse(str(root)))
            uri = store.uri(spec)
            if "deletion vectors" in writer:
                bench.spark.sql(
                    f"ALTER TABLE delta.`{spark_uri(uri)}` "
                    "SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
                )
            with measure(bench.probe, f"writers: {label} via {writer}", rows=False) as step:
                result = _ingest(bench.spark, store, spec, writer, path)
            figures = {**step.as_dict(), **_outcome(result, uri)}
            if "deletion vectors" in writer:
                with measure(bench.probe, "writers: purge deletion vectors", rows=False) as purge:
                    bench.spark.sql(f"REORG TABLE delta.`{spark_uri(uri)}` APPLY (PURGE)")
                figures["purge"] = purge.as_dict()
            case["writers"][writer] = figures
            digests[writer] = digest(bench.spark, uri)
            shutil.rmtree(root, ignore_errors=True)
        case["same_rows"] = len(set(digests.values())) == 1
        say(f"writers: {label}: every writer left the same rows: {case['same_rows']}")
        out["cases"].append(case)
    return out


def whole_day(bench: Bench, world: BenchWorld, dataset: Dataset) -> Path:
    """One stored UTC day of every meter, delivered again with every energy value corrected."""
    spec = world.catalog.raw["energy_raw"]
    day = max(dataset.start, CLOSED_UNTIL.replace(hour=0) - timedelta(days=3))
    stored = world.engine.raw.read_arrow(spec, [Window(day, day + timedelta(days=1))])
    supplied = [c.name for c in spec.columns if not c.is_computed]
    table = stored.select(["entity_id", "ts", *supplied])
    table = table.set_column(
        table.schema.get_field_index("energy_kwh"),
        "energy_kwh",
        pc.multiply(table["energy_kwh"], pa.scalar(1.01)),
    )
    path = bench.work / "whole-day.parquet"
    pq.write_table(table, path)
    return path


def _ingest(
    spark: SparkSession, store: RawStore, spec: RawArchiveSpec, writer: str, path: Path
) -> IngestResult:
    if writer == "delta-rs":
        return store.ingest(spec, path, ChangeSource.MANUAL)
    frame = read_file(spark, spec, path)
    return ingest_frame(store, spark, spec, frame, ChangeSource.MANUAL, file=path.name)


def _outcome(result: IngestResult, uri: str) -> dict:
    table = DeltaTable(uri)
    history = table.history(1)[0]
    metrics = history.get("operationMetrics") or {}
    removed = metrics.get("num_target_files_removed", metrics.get("numTargetFilesRemoved"))
    added = metrics.get("num_target_files_added", metrics.get("numTargetFilesAdded"))
    vectors = metrics.get("numTargetDeletionVectorsAdded")
    return {
        "inserted": result.inserted,
        "updated": result.updated,
        "files_removed": None if removed is None else int(removed),
        "files_added": None if added is None else int(added),
        "deletion_vectors_added": None if vectors is None else int(vectors),
    }


def digest(spark: SparkSession, uri: str) -> tuple[int, str]:
    """Rows and an order-independent digest of every row (the sum of their hashes)."""
    table = spark.read.format("delta").load(spark_uri(uri))
    row = table.select(
        F.count(F.lit(1)).alias("rows"),
        F.sum(F.xxhash64(*table.columns).cast("decimal(38,0)")).alias("hash"),
    ).first()
    assert row is not None
    return int(row["rows"]), str(row["hash"])
