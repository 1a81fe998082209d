"""Spark sessions: a local session by default, a cluster master URL, or a Spark Connect server.

A session is built (or the one already active in the process is attached to) with the settings
this project relies on, and with Delta's jars (`delta_jars`: loaded from a local directory that
`make install` fills, sent by the driver to a cluster's executors), so `spark.read.format("delta")`
and `delta.tables.DeltaTable` work in it. A Spark Connect server loads Delta itself, at its
launch. Nothing here touches `sparkContext`, so Spark Connect works.
"""

import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from rollup_assets.resources.delta_jars import delta_conf
from rollup_assets.settings import DEFAULT_DELTA_JARS

log = logging.getLogger(__name__)

# Settings every session needs, whatever the user configures on top.
REQUIRED_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "100000",
    # Batches to Python workers are cut by rows only: with a byte limit Spark measures the batch
    # after every row, and measuring list columns (a cell's spare extremes) walks them whole, so
    # a batch costs the square of its rows (a fold of 100,000 cells ran for many minutes).
    # Int.MaxValue is the value that turns the measuring off.
    "spark.sql.execution.arrow.maxBytesPerBatch": "2147483647",
}
LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.driver.memory": "2g",
    "spark.sql.adaptive.enabled": "true",
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    # Reads name their files one by one (from the Delta log): on local disks the driver looks
    # them up faster than a Spark job with a task per few files (Spark's default past 32 paths).
    "spark.sql.sources.parallelPartitionDiscovery.threshold": "10000",
    # Partitions delta-spark rebuilds a table's state in (its default, 50, is for clusters): on
    # two local cores, 8 made a small table's first read about three times faster.
    "spark.databricks.delta.snapshotPartitions": "8",
}


class JavaMissingError(RuntimeError):
    pass


def require_java(java_home: Path | None = None) -> None:
    """Fail early, in one line, when no Java runtime is reachable for local Spark: the one in
    `java_home` (the settings' JAVA_HOME), else `java` on PATH."""
    if java_home is not None and (java_home / "bin" / "java").exists():
        return
    if shutil.which("java") is None:
        raise JavaMissingError(
            "Java 17 is required for Spark but no `java` was found "
            "(install a JDK 17 or set JAVA_HOME)"
        )


def build_session(
    *,
    master: str | None = None,
    remote: str | None = None,
    app_name: str = "rollups",
    conf: dict[str, str] | None = None,
    delta_jars: Path = DEFAULT_DELTA_JARS,
    python: str | None = None,
    java_home: Path | None = None,
) -> SparkSession:
    """Create (or get) a session: Spark Connect when `remote` (sc://host:port) is given, else
    Spark on `master` (default local[2]) with Delta's jars from `delta_jars`
    (DeltaJarsMissingError when one is missing), its Python workers running `python` (a
    `spark.pyspark.python` in `conf` comes first; default: this interpreter), after checking
    for Java (`require_java(java_home)`). `conf` holds flat Spark settings."""
    settings = dict(conf or {})
    if remote:
        builder = SparkSession.builder.remote(remote).appName(app_name)
        ignored = sorted(k for k in settings if not k.startswith("spark.sql."))
        if ignored:
            # Cluster, executor and Python settings belong to the Connect server's own launch.
            log.warning("Spark Connect: ignoring %s (set them on the server)", ", ".join(ignored))
        for k, v in {**settings, **REQUIRED_CONF}.items():
            if k.startswith("spark.sql."):
                builder = builder.config(k, v)
        return builder.getOrCreate()
    require_java(java_home)
    master = master or "local[2]"
    # Python workers run our mapInArrow writers: they need an interpreter with pyarrow and this
    # package. Executors start the one PySpark reads from $PYSPARK_PYTHON when the session's
    # context starts (a `spark.pyspark.python` conf only reaches spark-submit, not a session
    # built in-process), so the chosen one is written there; it is never read back.
    python = settings.get("spark.pyspark.python") or python or sys.executable
    os.environ["PYSPARK_PYTHON"] = python
    builder = SparkSession.builder.master(master).appName(app_name)
    defaults = {
        **LOCAL_DEFAULTS,
        "spark.pyspark.python": python,
        "spark.pyspark.driver.python": sys.executable,
    }
    delta = delta_conf(delta_jars, settings)
    for k, v in {**defaults, **settings, **delta, **REQUIRED_CONF}.items():
        builder = builder.config(k, v)
    return builder.getOrCreate()


def apply_required_conf(spark: SparkSession) -> None:
    for k, v in REQUIRED_CONF.items():
        spark.conf.set(k, v)


def active_session(remote: str | None = None) -> SparkSession | None:
    """The session this process already has: the Spark Connect one when `remote` is set (the
    one `build_session(remote=...)` would return), else the classic one."""
    if remote:
        from pyspark.errors import PySparkRuntimeError
        from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

        try:
            return RemoteSparkSession.active()  # type: ignore[return-value]
        except PySparkRuntimeError:
            return None
    return SparkSession.getActiveSession()


class LazySession:
    """A Spark session started the first time it is used: work that needs no Spark (a small
    correction applied on the driver) never waits for a JVM or a Connect handshake. Stands in
    for a `SparkSession` (attribute access goes to the session, started on demand)."""

    def __init__(self, start: Callable[[], SparkSession]) -> None:
        self._start = start
        self._session: SparkSession | None = None
        self.start_seconds: float | None = None

    @property
    def started(self) -> bool:
        return self._session is not None

    def get(self) -> SparkSession:
        if self._session is None:
            began = time.monotonic()
            self._session = self._start()
            self.start_seconds = time.monotonic() - began
        return self._session

    def __getattr__(self, name: str) -> Any:
        return getattr(self.get(), name)
