"""The storage half of the product on an S3 API (issue 9, object storage): a local S3 server
(moto), a root with a space and a non-ASCII character, delta-rs storage options, and Spark
executors writing rollup files through the pyarrow filesystem those options configure.

What this cannot cover: Spark reading the files back through Hadoop's S3A connector, whose jars
pyspark does not ship (see docs/deployment.md). So the source rows are handed to Spark as Arrow
instead of read by it; every write, commit, pointer flip, sweep and read goes to S3, and each
level is compared with the pandas oracle.
"""

import socket
import uuid
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import boto3
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from moto.server import ThreadedMotoServer
from pyspark.sql import SparkSession

from rollup_assets.compute.aggregation import rollup_partials
from rollup_assets.compute.arrow_partials import logical_arrow
from rollup_assets.compute.arrow_types import TS
from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.cells import Cells
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.placement import buckets_in
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.specs import ArchiveSpec, Catalog, RollupSpec
from rollup_assets.model.windows import Window
from rollup_assets.resources.delta_tables import open_table
from rollup_assets.resources.raw_store import RawStore
from rollup_assets.resources.schemas import archive_data_schema
from rollup_assets.resources.warehouse import Warehouse, filesystem_for
from rollup_assets.services.engine import Engine
from tests.conftest import days
from tests.oracle import compare, oracle, raw_frame

BUCKET = "rollups-test"
FIRST = date(2025, 3, 29)  # the 23 h local day 2025-03-30
DAYS = 3
SPAN = Window(datetime(2025, 3, 29, tzinfo=UTC), datetime(2025, 4, 1, tzinfo=UTC))


@pytest.fixture(scope="module")
def s3_options() -> dict[str, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    options = {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",
        "aws_conditional_put": "etag",  # safe concurrent commits without a lock service
    }
    try:
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="test",
            aws_secret_access_key="test",
            region_name="us-east-1",
        ).create_bucket(Bucket=BUCKET)
        yield options
    finally:
        server.stop()


def _recompute(
    spark: SparkSession,
    engine: Engine,
    spec: RollupSpec,
    source: ArchiveSpec,
    source_rows: pa.Table,
    span: Window,
    generation: int,
) -> tuple[list[Window], int]:
    """What a recompute run does, with the source rows given as Arrow instead of read by Spark:
    executors write the generation to S3, the driver commits it, flips the pointers and sweeps.
    Returns the buckets recomputed and the number of superseded rows the sweep deleted."""
    buckets = buckets_in(spec, [span])
    targets = pa.table(
        {
            "bucket_start": pa.array([w.start for w in buckets], TS),
            "bucket_end": pa.array([w.end for w in buckets], TS),
        }
    )
    partials = rollup_partials(
        spark.createDataFrame(source_rows), spark.createDataFrame(targets), spec, source
    )
    store = engine.rollups
    written = store.write_rows(
        partials,
        spec,
        generation=generation,
        job_id=uuid.uuid4().hex,
        run_id=uuid.uuid4().hex,
        source_versions={source.name: generation},
    )
    assert written.adds and written.rows > 0
    store.commit_generation(spec, written, {"rollups.operation": "test"}, store.identity(spec))
    store.flip(
        spec, Cells.of(buckets), generation, job_id="test", run_id="test", fence=store.fence(spec)
    )
    return buckets, store.sweep(spec, buckets, None)


def _levels(
    spark: SparkSession, engine: Engine, catalog: Catalog, span: Window, generation: int
) -> dict[str, tuple[list[Window], int]]:
    """Hourly from raw, then daily from hourly as read back from S3."""
    raw_spec = catalog.raw["energy_raw"]
    hourly, daily = catalog.rollup("energy_hourly"), catalog.rollup("energy_daily")
    raw_rows = engine.raw.read_arrow(raw_spec).select(archive_data_schema(raw_spec).names)
    done = {
        "energy_hourly": _recompute(spark, engine, hourly, raw_spec, raw_rows, span, generation)
    }
    hourly_rows = engine.rollups.read_arrow(hourly)
    daily_span = Window(min(w.start for w in done["energy_hourly"][0]), span.end)
    done["energy_daily"] = _recompute(
        spark, engine, daily, hourly, hourly_rows, daily_span, generation
    )
    return done


def _differences(engine: Engine, catalog: Catalog) -> list[str]:
    energy = catalog.raw["energy_raw"]
    raw = raw_frame(engine.raw.read_arrow(energy), energy)
    problems = []
    for name in ("energy_hourly", "energy_daily"):
        spec = catalog.rollup(name)
        actual = logical_arrow(engine.rollups.read_arrow(spec), spec)
        problems += compare(actual, oracle(raw, spec), spec)
    return problems


def _ingest(engine: Engine, catalog: Catalog, table: pa.Table, path: Path) -> int:
    pq.write_table(table, path)
    spec = catalog.raw["energy_raw"]
    return engine.raw.ingest(spec, path, ChangeSource("Import")).version


def _physical_rows(engine: Engine, spec: RollupSpec) -> pa.Table:
    """Every row stored in the table, of any generation (not just the active ones)."""
    table = open_table(engine.rollups.uri(spec), engine.warehouse.storage_options)
    assert table is not None
    return pa.table(table.to_pyarrow_table())


def test_generations_on_s3_equal_pandas(
    spark: SparkSession, s3_options: dict[str, str], tmp_path: Path
) -> None:
    catalog = load_catalog()
    warehouse = Warehouse(f"s3://{BUCKET}/wäre house/{uuid.uuid4().hex}", s3_options)
    # Superseded rows are swept at once: the test checks the sweep's rewrites on S3.
    engine = Engine(catalog, warehouse, generation_retention=timedelta(0))
    sample = pa.concat_tables(
        [day_batch(d, 2, seed=3, missing=0.02, null_power=0.1) for d in days(FIRST, DAYS)]
    )
    RawStore(warehouse).ensure_table(catalog.raw["energy_raw"])
    _ingest(engine, catalog, sample, tmp_path / "first.parquet")
    assert engine.raw.read_arrow(catalog.raw["energy_raw"]).num_rows == sample.num_rows

    first = _levels(spark, engine, catalog, SPAN, generation=1)
    assert [swept for _, swept in first.values()] == [0, 0]
    assert _differences(engine, catalog) == []

    # A late correction of one UTC day, recomputed as generation 2 on the buckets it touches:
    # the flip switches readers, the sweep drops superseded rows, rewriting the month file of
    # the daily rollup that keeps other days' rows (driver-side pyarrow on S3).
    late_day = Window(SPAN.start, SPAN.start + timedelta(days=1))
    in_day = pc.less(sample["ts"], pa.scalar(late_day.end, TS))
    day = sample.filter(in_day)
    late = day.set_column(
        day.schema.get_field_index("energy_kwh"), "energy_kwh", pc.add(day["energy_kwh"], 1.5)
    )
    _ingest(engine, catalog, late, tmp_path / "late.parquet")
    second = _levels(spark, engine, catalog, late_day, generation=2)
    assert all(swept > 0 for _, swept in second.values()), second
    assert _differences(engine, catalog) == []

    for name, (buckets, _) in second.items():
        rows = _physical_rows(engine, catalog.rollup(name))
        recomputed = pc.is_in(rows["bucket_start"], pa.array([w.start for w in buckets], TS))
        assert set(pc.unique(rows.filter(recomputed)["generation"]).to_pylist()) == {2}
        kept = rows.filter(pc.invert(recomputed))
        assert kept.num_rows and set(pc.unique(kept["generation"]).to_pylist()) == {1}

    # The objects live under the decoded root, as delta-rs and Hadoop would name them.
    fs, inside = filesystem_for(warehouse.rollup_path("energy_daily"), s3_options)
    assert isinstance(fs, pafs.S3FileSystem)
    assert inside.startswith(f"{BUCKET}/wäre house/")
    listed = fs.get_file_info(pafs.FileSelector(inside, recursive=True))
    assert any(i.path.endswith(".parquet") for i in listed)
