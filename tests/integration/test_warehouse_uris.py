"""The chain on warehouse roots given as a `file://` URI and as a local path with spaces and
non-ASCII characters (issue 9, object storage): every level equals the pandas oracle, and both
query paths (delta-rs/Arrow and Spark) read the tables back.

Object-store roots (s3://, abfss://, gs://) take the same code path as a `file://` URI in
delta-rs and pyarrow; this is the part of it that can run without a cloud account.
"""

import os
import urllib.parse
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from rollup_assets.assembly import build_definitions
from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.resources import WarehouseResource
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.engine import Engine
from rollup_assets.services.query import query_spark
from rollup_assets.settings import Settings
from tests.conftest import World, days, instance_in
from tests.oracle import compare_all

NOW = datetime(2025, 4, 2, 12, 0, tzinfo=UTC)
FIRST = date(2025, 3, 29)  # the 23 h local day 2025-03-30 and the March/April month end
DAYS = 3
METERS = 2
ODD_DIR = "wäre house #1 ünïcødé"


def plain_uri(tmp: Path) -> str:
    return (tmp / "warehouse").as_uri()


def odd_path(tmp: Path) -> str:
    return str(tmp / ODD_DIR / "warehouse")


def odd_uri(tmp: Path) -> str:
    return (tmp / ODD_DIR / "warehouse").as_uri()  # percent-encoded: %20, %C3%A4, %23


ROOTS: dict[str, Callable[[Path], str]] = {
    "file-uri": plain_uri,
    "odd-local-path": odd_path,
    "odd-file-uri": odd_uri,
}


@pytest.fixture(params=sorted(ROOTS))
def root_world(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark
) -> World:
    """`World` of conftest, but on a warehouse root given exactly as a user would write it."""
    root = ROOTS[request.param](tmp_path)
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("ROLLUPS_WAREHOUSE", root)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    catalog = load_catalog()
    defs = build_definitions(catalog, WarehouseResource(root=root), settings=Settings.from_env())
    with instance_in(home, catalog) as instance:
        yield World(tmp_path, catalog, Engine(catalog, Warehouse(root)), defs, instance)


def sample() -> pa.Table:
    return pa.concat_tables(
        [day_batch(d, METERS, seed=5, missing=0.02, null_power=0.1) for d in days(FIRST, DAYS)]
    )


def test_chain_on_root_equals_pandas(root_world: World, spark) -> None:
    world = root_world
    given = os.environ["ROLLUPS_WAREHOUSE"]
    odd = ODD_DIR in given or urllib.parse.quote(ODD_DIR) in given
    expected_dir = world.root / (ODD_DIR if odd else "") / "warehouse"
    # A file URI stays a URI (the object-store code path), in its percent-encoded spelling.
    canonical = expected_dir.as_uri() if given.startswith("file:") else str(expected_dir)
    assert world.engine.warehouse.root == canonical

    world.ops.activate("energy_raw", now=NOW)
    world.ingest(sample(), source="Import")
    world.activate_all(NOW)
    start = datetime(FIRST.year, FIRST.month, FIRST.day, tzinfo=UTC)
    world.backfill([Window(start, start + timedelta(days=DAYS))])
    world.tick(NOW)

    # The tables are where the root says, on disk, under the decoded directory name.
    assert list((expected_dir / "raw" / "energy_raw" / "_delta_log").glob("*.json"))
    assert list((expected_dir / "rollups" / "energy_hourly").rglob("*.parquet"))
    assert not list(world.root.rglob("*%*")), "a percent-encoded name reached the disk"

    assert compare_all(world.query, world.raw(), world.catalog) == []
    daily = world.query("energy_daily")
    starts = {r["bucket_start"] for r in daily.select(["bucket_start"]).to_pylist()}
    assert datetime(2025, 3, 29, 23, tzinfo=UTC) in starts  # the 23 h day
    for name in ("energy_hourly", "energy_monthly"):
        via_spark = query_spark(world.engine, spark, name).toArrow()
        via_arrow = world.query(name)
        assert via_spark.num_rows == via_arrow.num_rows > 0
        assert via_spark.select(via_arrow.column_names).to_pylist() == via_arrow.to_pylist()
