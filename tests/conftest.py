"""Shared fixtures: one Spark session per test session, and an isolated warehouse + Dagster home."""

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import dagster as dg
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollup_assets import faults
from rollup_assets.assembly import build_definitions
from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.bucketing import first_bucket_start
from rollup_assets.model.jobs import ChangeSource, RetryPolicy
from rollup_assets.model.placement import buckets_in
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.specs import Catalog, RollupSpec
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.instance import (
    ensure_pools,
    sqlite_storage_config,
    use_range_event_settings,
)
from rollup_assets.orchestration.partitions import key_range_for, partitions_def_for
from rollup_assets.orchestration.resources import WarehouseResource
from rollup_assets.orchestration.runner import execute, tick_until_quiet
from rollup_assets.orchestration.tags import partition_range_tags
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.engine import Engine
from rollup_assets.services.operations import Operations
from rollup_assets.services.query import query_arrow
from rollup_assets.settings import DEFAULT_DRIVER_SOURCE_ROWS, Settings
from tests.oracle import raw_frame

TESTS = Path(__file__).parent
REPO_ARTIFACTS = TESTS.parent / "test-artifacts"
os.environ.setdefault("ROLLUPS_SENSOR_INTERVAL_SECONDS", "30")
# Surfaces are published at every tick that finds them lagging (the spacing between publishes
# has tests of its own), so a test reads them current once its ticks are quiet.
os.environ.setdefault("ROLLUPS_SURFACE_MAX_LAG_SECONDS", "0")
# Dagster's settings for range runs, as the CLI, the demo and the benchmark set them before the
# runs they execute in their own process.
use_range_event_settings(os.environ)
# Every JVM the tests start (the session's driver, and those of the CLI, daemon, server and
# cluster processes the system tests start) compiles with C1 only: a test's JVM lives minutes and
# runs many small, different queries, where C2's compiling costs more CPU than its code saves
# (about a third of the JVM's CPU on the integration tests). They also collect garbage with the
# throughput collector: G1's concurrent cycles, started by Spark's large Arrow and Parquet buffers
# (humongous allocations), took a seventh of the JVM's CPU, about what the parallel collector
# saves (operator-control tests: 66 s of the driver JVM's CPU against 77 s). The product's JVMs
# keep the defaults.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseParallelGC")
# Where tests keep their warehouses and Dagster homes when no --basetemp is given: a memory-backed
# file system when one has room, since SQLite and Delta commits wait on fsync, which there costs
# nothing (a quarter of an integration test's time on a virtual disk). Only failed tests keep
# their directories (`tmp_path_retention_policy`), so the space held stays that of running tests.
SHM = Path("/dev/shm")
SHM_MIN_FREE = 8 << 30
_SHM_BASE = pytest.StashKey[Path]()


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # Before pytest builds its temporary-path factory, on the controller only: xdist's workers
    # are given a directory under the controller's.
    if config.option.basetemp is not None or hasattr(config, "workerinput"):
        return
    if not (SHM.is_dir() and os.access(SHM, os.W_OK)) or shutil.disk_usage(SHM).free < SHM_MIN_FREE:
        return
    base = Path(tempfile.mkdtemp(prefix="rollups-tests-", dir=SHM))
    config.option.basetemp = str(base)
    config.stash[_SHM_BASE] = base


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The memory-backed directory goes when every test passed; after a failure it stays (it
    then holds only the failed tests' directories), and is named."""
    base = session.config.stash.get(_SHM_BASE, None)
    if base is None:
        return
    if exitstatus == 0:
        shutil.rmtree(base, ignore_errors=True)
    else:
        print(f"\nthe failed tests' directories are under {base}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).relative_to(TESTS).parts
        tier = parts[0] if len(parts) > 1 else ""
        if tier in ("spark", "integration", "system"):
            item.add_marker(getattr(pytest.mark, tier))
        if tier in ("integration", "system"):
            item.add_marker(pytest.mark.spark)
        if "soak" in item.keywords and "soak" not in config.getoption("-m", default=""):
            item.add_marker(pytest.mark.skip(reason="soak variant: run with `make soak`"))


@pytest.fixture(scope="session")
def spark():
    """The one session of a test process; Delta-enabled like every session the project starts
    (Delta's jars from where `make install` put them, or $ROLLUPS_DELTA_JARS)."""
    from rollup_assets.resources.spark import build_session
    from rollup_assets.settings import Settings

    settings = Settings.from_env()
    session = build_session(
        master="local[2]",
        conf={
            "spark.sql.shuffle.partitions": "4",
            "spark.default.parallelism": "2",
            "spark.ui.enabled": "false",
        },
        delta_jars=settings.delta_jars,
        python=settings.pyspark_python,
        java_home=settings.java_home,
    )
    yield session
    session.stop()


@dataclass
class World:
    """An isolated installation: warehouse, Dagster instance, definitions and engine."""

    root: Path
    catalog: Catalog
    engine: Engine
    defs: dg.Definitions
    instance: dg.DagsterInstance

    @property
    def ops(self) -> Operations:
        return Operations(self.engine, actor="test")

    def ingest(self, table: pa.Table, archive: str = "energy_raw", source: str = "Pipeline") -> int:
        path = self.root / f"batch-{datetime.now().timestamp()}.parquet"
        pq.write_table(table, path)
        return self.engine.raw.ingest(
            self.catalog.archive(archive), path, ChangeSource(source)
        ).version

    def activate_all(self, now: datetime) -> None:
        for name in self.catalog.names():
            self.ops.activate(name, now=now)

    def materialize(self, rollup: str, start_key: str, end_key: str, config: dict | None = None):
        run = execute(
            self.defs,
            self.instance,
            f"{rollup}_job",
            partition_range_tags(start_key, end_key),
            config,
        )
        assert run is not None
        return run

    def backfill(self, spans: list[Window] | None = None, rollup: str = "energy_hourly") -> list:
        """Materialize the closed partitions of `rollup` (within `spans`, default: all), then let
        chain propagation bring every level above up to date, and their surfaces."""
        spec = self.catalog.rollup(rollup)
        mark = self.engine.states.get(rollup).watermark
        for span in spans or [Window(first_bucket_start(spec), mark)]:
            buckets = [w for w in buckets_in(spec, [span]) if w.end <= mark]
            keys = key_range_for(partitions_def_for(spec), buckets)
            run = self.materialize(rollup, keys.start, keys.end)
            assert run.success, run.error
        return self.tick(sensors=("retroactive_write_sensor", "surface_publish_sensor"))

    def tick(self, now: datetime | None = None, sensors: tuple[str, ...] | None = None) -> list:
        kwargs = {"sensors": sensors} if sensors else {}
        reports = tick_until_quiet(self.defs, self.instance, now, **kwargs)
        failed = [r for rep in reports for r in rep.runs if not r.success]
        assert not failed, [f"{r.job_name}: {r.error}" for r in failed]
        return reports

    def query(self, archive: str, **kw) -> pa.Table:
        return query_arrow(self.engine, archive, **kw)

    def raw(self, archive: str = "energy_raw") -> pd.DataFrame:
        """The rows of a raw or time-range archive, for the oracle."""
        spec = self.catalog.archive(archive)
        assert not isinstance(spec, RollupSpec), archive
        return raw_frame(self.engine.raw.read_arrow(spec), spec)


_EMPTY_INSTANCE: list[Path] = []  # this process's empty instance home, once made


def _empty_instance_dbs() -> list[Path]:
    """The SQLite databases of an empty test instance (no run, no pool), made once per process
    and removed when it exits."""
    if not _EMPTY_INSTANCE:
        root = Path(tempfile.mkdtemp(prefix="rollups-empty-instance-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        config = sqlite_storage_config(root)
        with dg.instance_for_test(temp_dir=str(root), overrides=config):
            pass  # opening the instance is what creates its databases
        # Closed: every write-ahead log is checkpointed into its database, so a copy is whole.
        assert not list(root.rglob("*-wal")), sorted(root.rglob("*"))
        _EMPTY_INSTANCE.append(root)
    return sorted(_EMPTY_INSTANCE[0].rglob("*.db"))


@contextmanager
def instance_in(home: Path, catalog: Catalog) -> Iterator[dg.DagsterInstance]:
    """A test's Dagster instance in `home`: the event log a home `rollups setup` writes (a range
    run's materializations stored in one transaction), and every rollup's pool.

    Its databases start as copies of an empty instance's, made once per process: Dagster's
    creation of them (schema, migration stamps, indexes) is most of a new instance's cost."""
    for db in _empty_instance_dbs():
        target = home / db.relative_to(_EMPTY_INSTANCE[0])
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(db, target)
    overrides = sqlite_storage_config(home)
    with dg.instance_for_test(temp_dir=str(home), overrides=overrides) as instance:
        ensure_pools(instance, catalog)
        yield instance


def world_of(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    catalog: Catalog,
    retention_hours: int = 0,
    retry_attempts: int = 5,
    driver_source_rows: int = DEFAULT_DRIVER_SOURCE_ROWS,
) -> Iterator[World]:
    """An isolated installation of `catalog` (the `world` fixture's, for other spec files).
    `driver_source_rows=0` sends all work on buckets for every entity to Spark, however small
    (a test world's would run on the driver)."""
    wh = tmp_path / "warehouse"
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("ROLLUPS_WAREHOUSE", str(wh))
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    # Superseded generations are swept at once here (what most tests check); the tests of the
    # generation retention build their own world with one (`world_of(..., retention_hours=...)`).
    # Failed work is retried at once (the backoff has tests of its own).
    resource = WarehouseResource(
        root=str(wh),
        generation_retention_hours=retention_hours,
        retry_attempts=retry_attempts,
        retry_backoff_seconds=0,
        driver_source_rows=driver_source_rows,
    )
    defs = build_definitions(catalog, resource, settings=Settings.from_env())
    retention = timedelta(hours=retention_hours)
    with instance_in(home, catalog) as instance:
        engine = Engine(
            catalog,
            Warehouse(str(wh)),
            generation_retention=retention,
            retry=RetryPolicy(attempts=retry_attempts, backoff=timedelta(0)),
            driver_source_rows=driver_source_rows,
        )
        yield World(tmp_path, catalog, engine, defs, instance)


ON_SPARK = "Spark"  # `world`'s parameter (indirect) for work on Spark however small


@pytest.fixture
def world(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark
) -> Iterator[World]:
    """An installation of the default specs. Parametrized (indirectly) with `ON_SPARK`, its
    work on buckets for every entity runs on Spark however small."""
    on_spark = getattr(request, "param", None) == ON_SPARK
    rows = 0 if on_spark else DEFAULT_DRIVER_SOURCE_ROWS
    yield from world_of(tmp_path, monkeypatch, load_catalog(), driver_source_rows=rows)


def days(first: date, n: int) -> list[date]:
    return [date.fromordinal(first.toordinal() + i) for i in range(n)]


def day_spans(spans: list[tuple[date, int]]) -> list[Window]:
    """UTC windows of (first day, number of days) spans."""
    out = []
    for first, n in spans:
        start = datetime(first.year, first.month, first.day, tzinfo=UTC)
        out.append(Window(start, start + timedelta(days=n)))
    return out


def meter_readings(spans: list[tuple[date, int]], meters: int, seed: int) -> pa.Table:
    """Sample readings of `meters` over every day of `spans`: 2 % missing, optional columns
    10 % null."""
    return pa.concat_tables(
        [
            day_batch(d, meters, seed=seed, missing=0.02, null_power=0.1, null_voltage=0.1)
            for first, n in spans
            for d in days(first, n)
        ]
    )


@contextmanager
def fault_at(point: str, action: str = "raise", archive: str | None = None) -> Iterator[None]:
    """This process armed with a fault at `point` (`rollup_assets.faults`) while the context is
    open: it fires the first time the point is reached (for `archive`, when given)."""
    faults.arm(faults.Fault(point, action, archive))
    try:
        yield
    finally:
        faults.arm(None)
