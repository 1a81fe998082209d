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
            "Java 17 is required for Spark but no `java` was found "
            "(install a JDK 17 or set JAVA_HOME)"
        )


def flatten_conf(conf: dict[str, Any]) -> dict[str, str]:
    """Nested `{"spark": {"sql": {...}}}` dicts become dotted keys, as PySparkResource does."""
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
    """Create (or get) a session. `remote` (sc://host:port) selects Spark Connect; with neither
    `master` nor `remote` given, $ROLLUPS_SPARK_REMOTE, then $ROLLUPS_SPARK_MASTER, decide."""
    settings = {**flatten_conf(conf or {})}
    if not master and not remote:
        remote = os.environ.get("ROLLUPS_SPARK_REMOTE")
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
    require_java()
    master = master or os.environ.get("ROLLUPS_SPARK_MASTER") or "local[2]"
    # Python workers run our mapInArrow writers: they need an interpreter with pyarrow and this
    # package. Executors start the driver's $PYSPARK_PYTHON (a `spark.pyspark.python` conf only
    # reaches spark-submit, not a session built in-process), so a configured one is exported.
    python = settings.get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = python or sys.executable
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
        "Defaults to $ROLLUPS_SPARK_REMOTE when `master` is not set either.",
    )
    app_name: str = Field(default="rollups", description="Application name shown in the Spark UI.")
    spark_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra Spark confs, flat (`spark.executor.memory`) or nested dicts.",
    )

    _session: SparkSession | None = PrivateAttr(default=None)
    _created: bool = PrivateAttr(default=False)

    def _remote(self) -> str | None:
        if self.remote:
            return self.remote
        return None if self.master else os.environ.get("ROLLUPS_SPARK_REMOTE")

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        remote = self._remote()
        existing = active_session(remote)
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
            remote = self._remote()
            self._session = active_session(remote) or build_session(
                master=self.master, remote=remote, app_name=self.app_name, conf=self.spark_config
            )
        return self._session
