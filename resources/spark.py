"""The Spark resource: a local session by default, a cluster master URL, or a Spark Connect server.

It builds a session or attaches to the one already active in the process (tests, the in-process
tick loop), applies the settings this project relies on, and stops only a session it created.
Nothing here touches `sparkContext`, so Spark Connect works.
"""

import logging
import os
import shutil
import sys
from typing import Any

import dagster as dg
from dagster_spark.utils import flatten_dict
from pydantic import Field, PrivateAttr
from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

# Settings every session needs, whatever the user configures on top.
REQUIRED_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "100000",
}
LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.driver.memory": "2g",
    "spark.sql.adaptive.enabled": "true",
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
}


class JavaMissingError(RuntimeError):
    pass


def require_java() -> None:
    """Fail early, in one line, when no Java runtime is reachable for local Spark."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.path.exists(os.path.join(java_home, "bin", "java")):
        return
    if shutil.which("java") is None:
        raise JavaMissingError(
            "Java 17 is required for Spark but no `java` was found (install a JDK 17 or set JAVA_HOME)"
        )


def flatten_conf(conf: dict[str, Any]) -> dict[str, str]:
    """Nested `{"spark": {"sql": {...}}}` dicts become dotted keys, exactly as PySparkResource does."""
    return {
        key: str(value).lower() if isinstance(value, bool) else str(value)
        for key, value in flatten_dict(conf)
    }


def build_session(
    *,
    master: str | None = None,
    remote: str | None = None,
    app_name: str = "rollups",
    conf: dict[str, Any] | None = None,
) -> SparkSession:
    """Create (or get) a session. `remote` (sc://host:port) selects Spark Connect."""
    settings = {**flatten_conf(conf or {})}
    if remote:
        builder = SparkSession.builder.remote(remote).appName(app_name)
        for k, v in {**settings, **REQUIRED_CONF}.items():
            if k.startswith("spark.sql."):
                builder = builder.config(k, v)
        return builder.getOrCreate()
    require_java()
    master = master or os.environ.get("ROLLUPS_SPARK_MASTER") or "local[2]"
    # Python workers run our mapInArrow writers: they need this interpreter and its packages.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    defaults = {
        **LOCAL_DEFAULTS,
        "spark.pyspark.python": os.environ["PYSPARK_PYTHON"],
        "spark.pyspark.driver.python": os.environ["PYSPARK_DRIVER_PYTHON"],
    }
    for k, v in {**defaults, **settings, **REQUIRED_CONF}.items():
        builder = builder.config(k, v)
    return builder.getOrCreate()


def apply_required_conf(spark: SparkSession) -> None:
    for k, v in REQUIRED_CONF.items():
        spark.conf.set(k, v)


def active_session() -> SparkSession | None:
    return SparkSession.getActiveSession()


class SparkResource(dg.ConfigurableResource):
    """The Spark session a run computes with."""

    master: str | None = Field(
        default=None,
        description="Spark master URL: local[N] (default local[2], or $ROLLUPS_SPARK_MASTER), "
        "spark://host:7077, yarn, k8s://https://host:443.",
    )
    remote: str | None = Field(
        default=None,
        description="Spark Connect URL (sc://host:15002); takes precedence over `master`. "
        "Defaults to $ROLLUPS_SPARK_REMOTE.",
    )
    app_name: str = Field(default="rollups", description="Application name shown in the Spark UI.")
    spark_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra Spark confs, flat (`spark.executor.memory`) or nested dicts.",
    )

    _session: SparkSession | None = PrivateAttr(default=None)
    _created: bool = PrivateAttr(default=False)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        remote = self.remote or os.environ.get("ROLLUPS_SPARK_REMOTE")
        existing = None if remote else active_session()
        if existing is not None:
            self._session, self._created = existing, False
            apply_required_conf(existing)
            return
        self._session = build_session(
            master=self.master, remote=remote, app_name=self.app_name, conf=self.spark_config
        )
        self._created = True

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._created and self._session is not None:
            self._session.stop()
        self._session, self._created = None, False

    @property
    def session(self) -> SparkSession:
        if self._session is None:
            # Used outside a Dagster run (CLI, tests): attach or build on demand.
            self._session = active_session() or build_session(
                master=self.master,
                remote=self.remote or os.environ.get("ROLLUPS_SPARK_REMOTE"),
                app_name=self.app_name,
                conf=self.spark_config,
            )
        return self._session
