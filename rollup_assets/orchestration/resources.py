"""The Dagster resources of the code location: the Spark session, the warehouse (which
provides the engine), and the clock of the forward lane."""

from datetime import UTC, datetime
from typing import Any

import dagster as dg
from dagster_spark.utils import flatten_dict
from pydantic import Field, PrivateAttr
from pyspark.sql import SparkSession

from resources.spark import active_session, apply_required_conf, build_session
from resources.warehouse import Warehouse
from rollup_assets.model.specs import Catalog
from rollup_assets.model.windows import parse_instant
from rollup_assets.services.engine import Engine


def flatten_conf(conf: dict[str, Any]) -> dict[str, str]:
    """Nested `{"spark": {"sql": {...}}}` dicts become dotted keys, as PySparkResource does."""
    return {
        key: str(value).lower() if isinstance(value, bool) else str(value)
        for key, value in flatten_dict(conf)
    }


class SparkResource(dg.ConfigurableResource):
    """The Spark session a run computes with."""

    master: str | None = Field(
        default=None,
        description="Spark master URL: local[N] (default local[2]; the code location sets "
        "$ROLLUPS_SPARK_MASTER), spark://host:7077, yarn, k8s://https://host:443.",
    )
    remote: str | None = Field(
        default=None,
        description="Spark Connect URL (sc://host:15002); takes precedence over `master` "
        "(the code location sets $ROLLUPS_SPARK_REMOTE).",
    )
    app_name: str = Field(default="rollups", description="Application name shown in the Spark UI.")
    spark_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra Spark confs, flat (`spark.executor.memory`) or nested dicts.",
    )

    _session: SparkSession | None = PrivateAttr(default=None)
    _created: bool = PrivateAttr(default=False)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        remote = self.remote
        existing = active_session(remote)
        if existing is not None:
            self._session, self._created = existing, False
            apply_required_conf(existing)
            return
        self._session = build_session(
            master=self.master,
            remote=remote,
            app_name=self.app_name,
            conf=flatten_conf(self.spark_config),
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
            self._session = active_session(self.remote) or build_session(
                master=self.master,
                remote=self.remote,
                app_name=self.app_name,
                conf=flatten_conf(self.spark_config),
            )
        return self._session


class WarehouseResource(dg.ConfigurableResource):
    """Where the Delta tables live; provides the engine over them."""

    root: str = Field(
        description="Local directory or object-store URI (s3://, gs://, abfss://, file://).",
    )
    storage_options: dict[str, str] = Field(
        default_factory=dict,
        description="delta-rs storage options (credentials, endpoint, region) for an object store.",
    )

    _engines: dict[int, Engine] = PrivateAttr(default_factory=dict)

    def get(self) -> Warehouse:
        return Warehouse(self.root, dict(self.storage_options))

    def engine(self, catalog: Catalog) -> Engine:
        """The engine over this warehouse for `catalog` (one per resource instance)."""
        engine = self._engines.get(id(catalog))
        if engine is None or engine.catalog is not catalog:
            engine = self._engines[id(catalog)] = Engine(catalog, self.get())
        return engine


class ClockResource(dg.ConfigurableResource):
    """The forward lane's clock: the real time, or a pinned instant (tests, `rollups tick
    --now`)."""

    now: str | None = Field(
        default=None, description="ISO-8601 instant to pin the clock at (empty: the real time)."
    )

    def current(self) -> datetime:
        return parse_instant(self.now, "clock") if self.now else datetime.now(UTC)

    @property
    def pinned(self) -> bool:
        return bool(self.now)
