"""The Dagster resources of the code location: the Spark session, the warehouse (which
provides the engine), and the clock of the forward lane."""

import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import dagster as dg
from dagster_spark.utils import flatten_dict
from pydantic import Field, PrivateAttr
from pyspark.sql import SparkSession

from rollup_assets.model.jobs import RetryPolicy
from rollup_assets.model.specs import Catalog
from rollup_assets.model.windows import parse_instant
from rollup_assets.resources.genmap import read_pointers
from rollup_assets.resources.spark import (
    LazySession,
    active_session,
    apply_required_conf,
    build_session,
)
from rollup_assets.resources.spark_server import usable_url
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.engine import Engine
from rollup_assets.settings import (
    DEFAULT_DELTA_JARS,
    DEFAULT_DRIVER_SOURCE_ROWS,
    DEFAULT_GENERATION_RETENTION_HOURS,
    Settings,
)


def flatten_conf(conf: dict[str, Any]) -> dict[str, str]:
    """Nested `{"spark": {"sql": {...}}}` dicts become dotted keys, as PySparkResource does."""
    return {
        key: str(value).lower() if isinstance(value, bool) else str(value)
        for key, value in flatten_dict(conf)
    }


class SparkResource(dg.ConfigurableResource):
    """The Spark session a run computes with: Delta-enabled (Delta's jars, SQL extension and
    catalog), so an asset of yours can read a rollup through delta-spark. Point plain Delta
    readers at a rollup's surface table, `<warehouse>/rollups/<rollup>__active` (its active
    rows; the rollup's own row table keeps superseded generations):

    ```python
    from delta.tables import DeltaTable
    from rollup_assets.resources.warehouse import spark_uri

    @dg.asset(deps=["energy_daily"])
    def daily_peaks(spark: SparkResource, warehouse: WarehouseResource) -> None:
        path = spark_uri(warehouse.get().surface_path("energy_daily"))
        daily = spark.session.read.format("delta").load(path)
        daily.groupBy("entity_id").max("current_a_max").show()
        DeltaTable.forPath(spark.session, path).history(5).show()  # its commits
    ```
    """

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
    warm_server_dir: str | None = Field(
        default=None,
        description="State directory of a warm Spark server (`rollups spark-server`, started by "
        "`rollups dev`): runs attach to it when it is up and current, else start local Spark. "
        "Ignored when `master` or `remote` is set.",
    )
    app_name: str = Field(default="rollups", description="Application name shown in the Spark UI.")
    delta_jars: str = Field(
        default=str(DEFAULT_DELTA_JARS),
        description="Directory of Delta's jars (`make install` puts them in the environment's "
        "delta-jars/; the code location sets $ROLLUPS_DELTA_JARS): every session this resource "
        "starts loads them. A Spark Connect server loads its own.",
    )
    spark_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra Spark confs, flat (`spark.executor.memory`) or nested dicts.",
    )
    python: str | None = Field(
        default=None,
        description="The interpreter Spark's Python workers run (default: the run's own; the "
        "code location sets $PYSPARK_PYTHON); a `spark.pyspark.python` in `spark_config` wins.",
    )
    java_home: str | None = Field(
        default=None,
        description="The Java runtime checked for before local Spark starts (default: `java` on "
        "PATH; the code location sets $JAVA_HOME).",
    )

    _lazy: LazySession | None = PrivateAttr(default=None)
    _created: bool = PrivateAttr(default=False)
    _where: str = PrivateAttr(default="")

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        # Nothing starts here: a run that needs no Spark (a small correction applied on the
        # driver) never starts a JVM or connects to a server.
        self._lazy, self._created = LazySession(self._start), False

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._created and self._lazy is not None and self._lazy.started:
            self._lazy.get().stop()
        self._lazy, self._created = None, False

    def _start(self) -> SparkSession:
        remote = self.remote or self._warm_url()
        self._where = remote or self.master or "local[2]"
        existing = active_session(remote)
        if existing is not None:
            apply_required_conf(existing)
            return existing
        self._created = True
        return build_session(
            master=self.master,
            remote=remote,
            app_name=self.app_name,
            conf=flatten_conf(self.spark_config),
            delta_jars=Path(self.delta_jars),
            python=self.python,
            java_home=Path(self.java_home) if self.java_home else None,
        )

    def _warm_url(self) -> str | None:
        """The warm Spark server's URL if it is up and runs the code on disk."""
        if self.master or not self.warm_server_dir:
            return None
        return usable_url(Path(self.warm_server_dir))

    @property
    def lazy(self) -> LazySession:
        """The run's session, started on first use (outside a run: created on demand)."""
        if self._lazy is None:
            self._lazy = LazySession(self._start)
        return self._lazy

    @property
    def session(self) -> SparkSession:
        """The session, for code typed against SparkSession; started on first use."""
        return cast(SparkSession, self.lazy)

    def ready_ms(self) -> int:
        """Milliseconds the run spent getting its session ready (0 when it never needed one)."""
        lazy = self.lazy
        return round((lazy.start_seconds or 0.0) * 1000) if lazy.started else 0

    def describe_use(self) -> str:
        """What the run used: 'not started', or where it ran and how long it took to be ready
        (starting a JVM, connecting to a server, or attaching to this process's session)."""
        lazy = self.lazy
        if not lazy.started:
            return "not started"
        return f"{self._where} (ready in {lazy.start_seconds or 0:.1f} s)"


class _Engines:
    """The engines of this process, one per catalog and warehouse configuration.

    Dagster makes a resource anew for every sensor tick and every run, so an engine held by the
    resource lived one tick: each tick read every control table whole and decoded the ledger
    again. An engine's caches are checked against each table's latest commit (a table created
    again under its name included), so one engine serves every tick and run of the process."""

    def __init__(self, keep: int = 16) -> None:
        self._keep = keep
        self._by_key: OrderedDict[tuple, Engine] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple, catalog: Catalog, make: Callable[[], Engine]) -> Engine:
        with self._lock:
            engine = self._by_key.get(key)
            if engine is not None and engine.catalog is catalog:
                self._by_key.move_to_end(key)
                return engine
        engine = make()
        with self._lock:
            self._by_key[key] = engine
            self._by_key.move_to_end(key)
            while len(self._by_key) > self._keep:
                self._by_key.popitem(last=False)
        return engine


_ENGINES = _Engines()
# The code locations built in this process (`build_definitions` registers each): the catalog and
# its warehouse resources, whose engines a run worker makes before it is handed a run.
_BUILT: deque[tuple[Catalog, tuple["WarehouseResource", ...]]] = deque(maxlen=8)
_BUILT_LOCK = threading.Lock()


def register_built(catalog: Catalog, warehouses: list["WarehouseResource"]) -> None:
    """`catalog`'s code location, over `warehouses`, was built in this process (once: building
    it again registers nothing more)."""
    built = (catalog, tuple(warehouses))
    with _BUILT_LOCK:
        if not any(c is catalog and w == built[1] for c, w in _BUILT):
            _BUILT.append(built)


def prepare_engines() -> None:
    """Make the engines of every code location built in this process and read what each run
    reads first (the ledger, the archives' states, each rollup's pointers): a run worker made
    ready beforehand (`orchestration/launcher.py`) then starts its run with them in memory, and
    reads only what changed since. A table that cannot be read now is read by the run."""
    with _BUILT_LOCK:
        built = list(_BUILT)
    for catalog, warehouses in built:
        for warehouse in warehouses:
            engine = warehouse.engine(catalog)
            engine.ledger.snapshot()
            engine.states.all()
            for spec in catalog.rollups.values():
                read_pointers(engine.rollups.genmap_uri(spec), engine.rollups.options)


class WarehouseResource(dg.ConfigurableResource):
    """Where the Delta tables live; provides the engine over them."""

    root: str = Field(
        description="Local directory or object-store URI (s3://, gs://, abfss://, file://).",
    )
    storage_options: dict[str, str] = Field(
        default_factory=dict,
        description="delta-rs storage options (credentials, endpoint, region) for an object store.",
    )
    generation_retention_hours: int = Field(
        default=DEFAULT_GENERATION_RETENTION_HOURS,
        description="Hours a superseded generation's rows stay before a sweep deletes them "
        "(as-of reads and rollbacks work within it); 0 deletes them at once.",
    )

    retry_attempts: int = Field(
        default=5,
        description="Runs failed work gets in all before it ends Failed for good.",
    )
    retry_backoff_seconds: int = Field(
        default=10,
        description="Seconds a retry of failed work waits (each next retry three times longer).",
    )
    driver_source_rows: int = Field(
        default=DEFAULT_DRIVER_SOURCE_ROWS,
        ge=0,
        description="Work on buckets for every entity whose source files hold at most this "
        "many rows runs on the driver, with no Spark job; 0 sends it all to Spark.",
    )

    @classmethod
    def from_settings(cls, settings: Settings, root: str | None = None) -> "WarehouseResource":
        """The warehouse resource of a process configured by `settings` (at `root`, when the
        root comes from elsewhere: a component's attributes, a tenant's warehouse)."""
        return cls(
            root=root or settings.warehouse,
            generation_retention_hours=settings.generation_retention_hours,
            retry_attempts=settings.retry_attempts,
            retry_backoff_seconds=settings.retry_backoff_seconds,
            driver_source_rows=settings.driver_source_rows,
        )

    def get(self) -> Warehouse:
        return Warehouse(self.root, dict(self.storage_options))

    def engine(self, catalog: Catalog) -> Engine:
        """The engine over this warehouse for `catalog`: one per process and configuration
        (see `_Engines`), so its caches outlive the resource, which Dagster makes anew for
        every tick and run."""
        key = (
            id(catalog),
            self.root,
            tuple(sorted(self.storage_options.items())),
            self.generation_retention_hours,
            self.retry_attempts,
            self.retry_backoff_seconds,
            self.driver_source_rows,
        )
        return _ENGINES.get(
            key,
            catalog,
            lambda: Engine(
                catalog,
                self.get(),
                generation_retention=timedelta(hours=self.generation_retention_hours),
                retry=RetryPolicy(
                    attempts=self.retry_attempts,
                    backoff=timedelta(seconds=self.retry_backoff_seconds),
                ),
                driver_source_rows=self.driver_source_rows,
            ),
        )


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
