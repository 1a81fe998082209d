"""Configuration: the one place the environment is read.

`Settings.from_env()` is called at the edges (the code location's `definitions.py`,
`component.py`, the CLI, the demo, the benchmark, and a script using `rollup_assets.api`) and the
values are passed down; nothing below reads the environment. Where a library reads a variable
from the process environment itself, the value it needs is passed down and written there, never
read back: `resources/spark.py` exports PYSPARK_PYTHON for PySpark when it starts a session, and
the edges give Dagster its DAGSTER_HOME and event settings. One is given a default instead: the
package sets delta-rs' allocator settings (`_RJEM_MALLOC_CONF`) and Arrow's pool
(`ARROW_DEFAULT_MEMORY_POOL`, on Linux x86-64) when it is imported
(`rollup_assets/__init__.py`), before deltalake and pyarrow load, unless the process set them
itself.
`tests/unit/test_settings.py` keeps this true.
"""

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, cast

from rollup_assets.faults import Fault

DEFAULT_WAREHOUSE = "./warehouse"
DEFAULT_SPECS = Path(__file__).with_name("rollups.yaml")
# How long rows of a superseded generation stay before a sweep deletes them (as-of reads and
# rollbacks within it find them), and the least vacuum keeps unreferenced files for.
DEFAULT_GENERATION_RETENTION_HOURS = 168
# Buckets for every entity are aggregated on the driver when the source files they may draw from
# hold at most this many rows (by the files' statistics): a Spark job would cost more than their
# data (the forward lane's open and just-closed buckets, the propagation of a few closed
# buckets, a small recompute). Larger work runs on Spark; 0 sends all such work to Spark.
DEFAULT_DRIVER_SOURCE_ROWS = 2_000_000
# Delta's jars for Spark: `make install` puts them into the environment this process runs in.
DEFAULT_DELTA_JARS = Path(sys.prefix) / "delta-jars"


@dataclass(frozen=True)
class DetectionLimits:
    """How much change detection does per tick, and how it scopes what it finds."""

    # A change touching at most this many entities is recomputed for those entities only.
    entity_scope_limit: int = 32
    # Source commits one detection tick reads (the rest wait for the next tick).
    max_versions_per_tick: int = 100
    # Above this many changed rows a commit is classified from file stats (over-approximating).
    max_cdf_rows: int = 2_000_000


MetricsExporter = Literal["off", "console", "otlp"]
METRICS_EXPORTERS: tuple[MetricsExporter, ...] = ("off", "console", "otlp")


@dataclass(frozen=True)
class MetricsConfig:
    """Where a process sends its metrics (`rollup_assets.metrics`): nowhere (`off`), to stderr
    (`console`), or to an OpenTelemetry collector over OTLP/HTTP (`otlp`)."""

    exporter: MetricsExporter = "off"
    # `otlp`: the collector's metrics URL (None: OpenTelemetry's default,
    # http://localhost:4318/v1/metrics, or OTEL_EXPORTER_OTLP_METRICS_ENDPOINT).
    endpoint: str | None = None
    # Seconds between two exports (and a last one when the process exits).
    interval_seconds: int = 60


@dataclass(frozen=True)
class Settings:
    """Every setting of a process, with the defaults documented in docs/deployment.md."""

    warehouse: str = DEFAULT_WAREHOUSE
    specs: Path = DEFAULT_SPECS
    dagster_home: Path = field(default_factory=lambda: Path.cwd() / ".dagster_home")
    spark_master: str | None = None
    spark_remote: str | None = None
    # The sensors' minimum interval. Dagster's sensor daemon looks at its sensors every 5 s, so
    # any value up to 5 means "at every look": a late write waits about 2.5 s on average.
    sensor_interval_seconds: int = 1
    # The warm Spark server's state directory (default: $DAGSTER_HOME/spark-connect) and port.
    spark_server_dir: Path | None = None
    spark_server_port: int = 15002
    # Pins the forward lane's clock (tests, `rollups tick --now`); None: the real clock.
    now: datetime | None = None
    # Console log level of runs executed in-process by the CLI (None: Dagster's default).
    run_log_level: str | None = None
    limits: DetectionLimits = DetectionLimits()
    # DAGSTER_PG_* for PostgreSQL storage, as given (read when DAGSTER_HOME is first written).
    postgres: Mapping[str, str] = field(default_factory=dict)
    # The tenant the CLI acts for when its `--tenant` is not given (specs that declare tenants).
    tenant: str | None = None
    # Hours a superseded generation is kept before the sweep deletes its rows (0: at once).
    generation_retention_hours: int = DEFAULT_GENERATION_RETENTION_HOURS
    # Failed work: how many attempts in all, and the wait before the first retry (each next
    # wait three times longer).
    retry_attempts: int = 5
    retry_backoff_seconds: int = 10
    # Work on buckets for every entity whose source files hold at most this many rows runs on
    # the driver (0: on Spark).
    driver_source_rows: int = DEFAULT_DRIVER_SOURCE_ROWS
    # A fault point this process is armed with (`rollup_assets.faults`; tests and drills).
    fault: Fault | None = None
    # Where this process's metrics go (off unless ROLLUPS_METRICS says otherwise).
    metrics: MetricsConfig = MetricsConfig()
    # The directory of Delta's jars that every Spark session this process starts loads.
    delta_jars: Path = DEFAULT_DELTA_JARS
    # Seconds a surface may lag behind its rollup's last flip: the surface publish sensor
    # publishes a lagging rollup at most every half of it (0: at every tick).
    surface_max_lag_seconds: int = 60
    # The Java runtime local Spark is checked for before it starts (None: `java` on PATH).
    java_home: Path | None = None
    # The interpreter Spark's Python workers run (None: this process's), for local and cluster
    # sessions and the warm Spark server.
    pyspark_python: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        defaults = DetectionLimits()
        return cls(
            warehouse=env.get("ROLLUPS_WAREHOUSE") or DEFAULT_WAREHOUSE,
            specs=Path(env.get("ROLLUPS_SPECS") or DEFAULT_SPECS),
            dagster_home=Path(env.get("DAGSTER_HOME") or Path.cwd() / ".dagster_home").resolve(),
            spark_master=env.get("ROLLUPS_SPARK_MASTER") or None,
            spark_remote=env.get("ROLLUPS_SPARK_REMOTE") or None,
            sensor_interval_seconds=_int(env, "ROLLUPS_SENSOR_INTERVAL_SECONDS", 1, minimum=1),
            spark_server_dir=Path(env["ROLLUPS_SPARK_SERVER_DIR"]).resolve()
            if env.get("ROLLUPS_SPARK_SERVER_DIR")
            else None,
            spark_server_port=_int(env, "ROLLUPS_SPARK_SERVER_PORT", 15002, minimum=1),
            now=_instant(env.get("ROLLUPS_NOW")),
            run_log_level=env.get("ROLLUPS_RUN_LOG_LEVEL") or None,
            limits=DetectionLimits(
                entity_scope_limit=_int(
                    env, "ROLLUPS_ENTITY_SCOPE_LIMIT", defaults.entity_scope_limit
                ),
                max_versions_per_tick=_int(
                    env, "ROLLUPS_MAX_VERSIONS_PER_TICK", defaults.max_versions_per_tick, minimum=1
                ),
                max_cdf_rows=_int(env, "ROLLUPS_MAX_CDF_ROWS", defaults.max_cdf_rows),
            ),
            postgres={k: v for k, v in env.items() if k.startswith("DAGSTER_PG_")},
            tenant=(env.get("ROLLUPS_TENANT") or "").strip() or None,
            generation_retention_hours=_int(
                env, "ROLLUPS_GENERATION_RETENTION_HOURS", DEFAULT_GENERATION_RETENTION_HOURS
            ),
            retry_attempts=_int(env, "ROLLUPS_RETRY_ATTEMPTS", 5, minimum=1),
            retry_backoff_seconds=_int(env, "ROLLUPS_RETRY_BACKOFF_SECONDS", 10),
            driver_source_rows=_int(env, "ROLLUPS_DRIVER_SOURCE_ROWS", DEFAULT_DRIVER_SOURCE_ROWS),
            fault=_fault(env),
            metrics=_metrics(env),
            delta_jars=Path(env["ROLLUPS_DELTA_JARS"]).resolve()
            if env.get("ROLLUPS_DELTA_JARS")
            else DEFAULT_DELTA_JARS,
            surface_max_lag_seconds=_int(env, "ROLLUPS_SURFACE_MAX_LAG_SECONDS", 60),
            java_home=Path(env["JAVA_HOME"]) if env.get("JAVA_HOME") else None,
            pyspark_python=env.get("PYSPARK_PYTHON") or None,
        )

    @property
    def warm_spark_dir(self) -> Path:
        """Where the warm Spark server keeps its state."""
        return self.spark_server_dir or self.dagster_home / "spark-connect"

    @property
    def uses_warm_spark(self) -> bool:
        """Runs look for the warm Spark server unless a master or remote was configured."""
        return not (self.spark_master or self.spark_remote)


class SettingsError(ValueError):
    """An environment variable holds a value that cannot be used."""


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    text = env.get(name)
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise SettingsError(f"{name}={text!r} is not a whole number") from None
    if value < minimum:
        raise SettingsError(f"{name}={text!r} must be at least {minimum}")
    return value


def _fault(env: Mapping[str, str]) -> Fault | None:
    point = (env.get("ROLLUPS_FAULT") or "").strip()
    if not point:
        return None
    release = env.get("ROLLUPS_FAULT_RELEASE")
    try:
        return Fault(
            point,
            (env.get("ROLLUPS_FAULT_ACTION") or "kill").strip(),
            (env.get("ROLLUPS_FAULT_ROLLUP") or "").strip() or None,
            Path(release) if release else None,
        )
    except ValueError as exc:
        raise SettingsError(f"ROLLUPS_FAULT: {exc}") from None


def _metrics(env: Mapping[str, str]) -> MetricsConfig:
    exporter = (env.get("ROLLUPS_METRICS") or "off").strip().lower()
    if exporter not in METRICS_EXPORTERS:
        known = ", ".join(METRICS_EXPORTERS)
        raise SettingsError(f"ROLLUPS_METRICS={env['ROLLUPS_METRICS']!r} is not one of {known}")
    endpoint = (env.get("ROLLUPS_METRICS_ENDPOINT") or "").strip() or None
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        raise SettingsError(
            f"ROLLUPS_METRICS_ENDPOINT={endpoint!r} is not an http:// or https:// URL "
            "(the OTLP/HTTP metrics endpoint, e.g. http://collector:4318/v1/metrics)"
        )
    return MetricsConfig(
        cast(MetricsExporter, exporter),
        endpoint,
        _int(env, "ROLLUPS_METRICS_INTERVAL_SECONDS", 60, minimum=1),
    )


def _instant(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        t = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise SettingsError(f"ROLLUPS_NOW={text!r} is not an ISO-8601 date-time") from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
