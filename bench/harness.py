"""An isolated installation to benchmark: warehouse, Dagster home, definitions and engine.

It follows the test `World` fixture (tests/conftest.py): activate, backfill the first level with
one range run, let chain propagation and the forward lane bring every level up, and drive the
real sensors in-process with `tick_until_quiet`. The Dagster home is a persistent one written by
the daemon helpers, so the real `dagster-daemon` can take over the same installation.
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
from pyspark.sql import SparkSession

from bench.generate import Dataset
from rollup_assets.assembly import build_definitions
from rollup_assets.model.jobs import ChangeSource, Job, JobState, Lane
from rollup_assets.model.placement import buckets_in
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.specs import Catalog
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.instance import ensure_pools, use_range_event_settings
from rollup_assets.orchestration.partitions import key_range_for, partitions_def_for
from rollup_assets.orchestration.resources import WarehouseResource
from rollup_assets.orchestration.runner import TickReport, execute, tick_until_quiet
from rollup_assets.orchestration.tags import partition_range_tags
from rollup_assets.resources.raw_ingest import IngestResult
from rollup_assets.resources.spark import LOCAL_DEFAULTS, build_session
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.engine import Engine
from rollup_assets.services.operations import Operations
from rollup_assets.settings import Settings
from tests.system.daemon import write_home

FIRST_LEVEL = "energy_hourly"


def bench_session(event_dir: Path, master: str = "local[2]") -> SparkSession:
    """The one Spark session of the benchmark: the project's local defaults (what a run gets)
    plus an event log, whose task metrics are the rows-read figures."""
    event_dir.mkdir(parents=True, exist_ok=True)
    settings = Settings.from_env()
    return build_session(
        master=master,
        app_name="rollups-bench",
        python=settings.pyspark_python,
        java_home=settings.java_home,
        conf={
            **LOCAL_DEFAULTS,
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": event_dir.resolve().as_uri(),
            # One plain JSON-lines file (Spark 4 rolls and compresses event logs by default).
            "spark.eventLog.rolling.enabled": "false",
            "spark.eventLog.compress": "false",
            "spark.ui.showConsoleProgress": "false",
        },
    )


class RunFailedError(RuntimeError):
    pass


@dataclass
class RunSpan:
    """A finished Dagster run: which rollup, which lane, and when (epoch seconds)."""

    rollup: str
    lane: str
    start: float
    end: float
    success: bool


@dataclass
class BenchWorld:
    root: Path
    catalog: Catalog
    engine: Engine
    defs: dg.Definitions
    instance: dg.DagsterInstance

    @classmethod
    @contextmanager
    def create(cls, root: Path) -> Iterator["BenchWorld"]:
        home, wh = root / "dagster_home", root / "warehouse"
        write_home(home)
        saved = {k: os.environ.get(k) for k in ("DAGSTER_HOME", "ROLLUPS_WAREHOUSE")}
        os.environ["DAGSTER_HOME"], os.environ["ROLLUPS_WAREHOUSE"] = str(home), str(wh)
        use_range_event_settings(os.environ)  # as the CLI sets them before its runs
        catalog = load_catalog()
        instance = dg.DagsterInstance.from_config(str(home))
        try:
            ensure_pools(instance, catalog)
            # Every tick that finds a surface lagging publishes it, so each correction wave's
            # publish is measured after it (the daemon scenario keeps the shipped spacing).
            settings = replace(Settings.from_env(), surface_max_lag_seconds=0)
            defs = build_definitions(catalog, WarehouseResource(root=str(wh)), settings=settings)
            yield cls(root, catalog, Engine(catalog, Warehouse(str(wh))), defs, instance)
        finally:
            instance.dispose()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def past_rollback_window(self) -> "BenchWorld":
        """This world as it runs once every flip is older than the rollback window (a week on,
        by default): the same warehouse and instance with no rollback window left, so
        maintenance may fold every closed bucket (the clock the runs read is the real one)."""
        wh = str(self.warehouse)
        settings = replace(
            Settings.from_env(), surface_max_lag_seconds=0, generation_retention_hours=0
        )
        resource = WarehouseResource(root=wh, generation_retention_hours=0)
        defs = build_definitions(self.catalog, resource, settings=settings)
        engine = Engine(self.catalog, Warehouse(wh), generation_retention=timedelta(0))
        return replace(self, engine=engine, defs=defs)

    @property
    def ops(self) -> Operations:
        return Operations(self.engine, actor="bench")

    @property
    def home(self) -> Path:
        return Path(self.instance.root_directory)

    @property
    def warehouse(self) -> Path:
        return Path(self.engine.warehouse.root)

    def ingest(self, path: Path, source: ChangeSource) -> IngestResult:
        return self.engine.raw.ingest(self.catalog.raw["energy_raw"], path, source)

    def commit_time(self, version: int) -> datetime:
        """When raw commit `version` was written (from the Delta log, ms precision)."""
        table = self.engine.raw.table(self.catalog.raw["energy_raw"])
        assert table is not None
        for entry in table.history():
            if entry.get("version") == version:
                return datetime.fromtimestamp(entry["timestamp"] / 1000, tz=UTC)
        raise LookupError(f"raw version {version} not in the history")

    def activate_all(self, now: datetime) -> None:
        for name in self.catalog.names():
            self.ops.activate(name, now=now)

    def materialize_first_level(self, dataset: Dataset) -> None:
        """One range run over every closed partition of the first level the data covers."""
        spec = self.catalog.rollup(FIRST_LEVEL)
        mark = self.engine.states.get(FIRST_LEVEL).watermark
        assert mark is not None
        buckets = [w for w in buckets_in(spec, [Window(dataset.start, mark)]) if w.end <= mark]
        keys = key_range_for(partitions_def_for(spec), buckets)
        run = execute(
            self.defs,
            self.instance,
            f"{FIRST_LEVEL}_job",
            partition_range_tags(keys.start, keys.end),
            # The first level alone, so it compares with the bare first-level Spark job; the
            # levels above are the next, separately measured, step.
            {"ops": {FIRST_LEVEL: {"config": {"propagate_in_run": False}}}},
        )
        if run is None or not run.success:
            raise RunFailedError(f"{FIRST_LEVEL} backfill failed: {run and run.error}")

    def tick(self, now: datetime, sensors: tuple[str, ...] | None = None) -> list[TickReport]:
        kwargs = {"sensors": sensors} if sensors else {}
        reports = tick_until_quiet(self.defs, self.instance, now, max_ticks=50, **kwargs)
        failed = [r for rep in reports for r in rep.runs if not r.success]
        if failed:
            raise RunFailedError("; ".join(f"{r.job_name}: {r.error}" for r in failed))
        return reports

    def runs_since(self, since: float) -> list[RunSpan]:
        records = self.instance.get_run_records(
            filters=dg.RunsFilter(created_after=datetime.fromtimestamp(since, tz=UTC))
        )
        out = []
        for r in records:
            if r.start_time is None or r.end_time is None:
                continue
            tags = r.dagster_run.tags
            out.append(
                RunSpan(
                    rollup=tags.get("rollups/rollup", r.dagster_run.job_name),
                    lane=tags.get("rollups/lane", "recompute"),
                    start=r.start_time,
                    end=r.end_time,
                    success=r.dagster_run.status is dg.DagsterRunStatus.SUCCESS,
                )
            )
        return sorted(out, key=lambda s: s.start)

    def recompute_jobs_since(self, since: datetime) -> list[Job]:
        """Completed recompute jobs (detection, chain or manual) created at/after `since`."""
        return [
            j
            for name in self.catalog.rollups
            for j in self.engine.ledger.history(name, limit=10_000)
            if j.created_at >= since
            and j.trigger.lane is Lane.RECOMPUTE
            and j.state is JobState.COMPLETED
            and j.windows_processed
        ]

    def pending_recomputes(self) -> int:
        snap = self.engine.ledger.snapshot()
        return sum(
            1
            for name in self.catalog.rollups
            for j in snap.for_rollup(name)
            if j.trigger.lane is Lane.RECOMPUTE and not j.state.terminal
        )
