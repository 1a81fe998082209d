"""The Dagster instance this project runs in: a persistent home with one pool per rollup.

Storage defaults to SQLite files in the home. For PostgreSQL (needed once several processes or
machines launch runs) set `DAGSTER_PG_HOST` before the home's dagster.yaml is first written
(`rollups setup`): the file then gets a `storage: postgres:` block for run, event-log and
schedule storage, with the host, port (`DAGSTER_PG_PORT`, default 5432), user
(`DAGSTER_PG_USERNAME`, default postgres) and database (`DAGSTER_PG_DB`, default dagster) written
in, and the password read by Dagster from `$DAGSTER_PG_PASSWORD` at load time (never written to
the file) when that variable is set. An existing dagster.yaml is never rewritten.
"""

import logging
from collections.abc import Mapping, MutableMapping
from pathlib import Path

import dagster as dg
import yaml

from rollup_assets.model.specs import Catalog, RollupSpec
from rollup_assets.orchestration.dagster_internals import set_pool_limits
from rollup_assets.orchestration.tenancy import NO_TENANT, Scope, scopes_of
from rollup_assets.settings import Settings

# Runs wait in Dagster's queue; it looks for runs to launch every second (Dagster's default is
# 5 s), so a run a sensor requests starts about a second later.
RUN_QUEUE_YAML = """\
run_coordinator:
  module: dagster._core.run_coordinator
  class: QueuedRunCoordinator
  config:
    dequeue_interval_seconds: 1
"""

# Each run starts in a process that has already loaded the code location
# (`orchestration/launcher.py`); Dagster's default launcher starts a new one per run.
RUN_LAUNCHER_YAML = """\
run_launcher:
  module: rollup_assets.orchestration.launcher
  class: WarmRunLauncher
"""

DAGSTER_YAML = (
    """\
# Written by `rollups` on first use; edit freely.
# One pool per rollup with limit 1 (set explicitly by `rollups` and the sensors): at most one
# run writes a rollup at a time. Op granularity also covers in-process runs (CLI, `rollups tick`).
concurrency:
  pools:
    default_limit: 1
    granularity: op
run_monitoring:
  enabled: true
  poll_interval_seconds: 30
telemetry:
  enabled: false
nux:
  enabled: false
"""
    + RUN_QUEUE_YAML
    + RUN_LAUNCHER_YAML
)


# Events a step hands to the event log at once (a range run's per-partition materializations):
# the storage writes each batch in one transaction (PostgreSQL's natively, SQLite's with
# BatchedSqliteEventLogStorage). Dagster reads it from the environment of the process running
# the step (DAGSTER_EVENT_BATCH_SIZE); BatchedSqliteEventLogStorage from its dagster.yaml config.
EVENT_BATCH_SIZE = 1000


def sqlite_storage_config(home: Path, batch_size: int = EVENT_BATCH_SIZE) -> dict:
    """The `run_storage:` and `event_log_storage:` blocks of a SQLite home, in Dagster's usual
    places: its run storage keeping its compiled statements, and its event log writing the asset
    events of a range run (one per partition) in one transaction, and a step's scattered ones in
    batches of up to `batch_size`."""
    history = home.resolve() / "history"
    return {
        "run_storage": {
            "module": "rollup_assets.orchestration.run_storage",
            "class": "KeptEngineSqliteRunStorage",
            "config": {"base_dir": str(history)},
        },
        "event_log_storage": {
            "module": "rollup_assets.orchestration.event_log",
            "class": "BatchedSqliteEventLogStorage",
            "config": {
                "base_dir": str(history / "runs"),
                "batch_size": batch_size,
            },
        },
    }


def sqlite_storage_yaml(home: Path, batch_size: int = EVENT_BATCH_SIZE) -> str:
    """`sqlite_storage_config` as dagster.yaml text."""
    return (
        "# Dagster's SQLite storage, keeping its compiled statements, with the asset events of a\n"
        "# range run stored in one transaction per batch.\n"
    ) + yaml.safe_dump(sqlite_storage_config(home, batch_size), sort_keys=False)


PG_HOST_ENV = "DAGSTER_PG_HOST"
PG_PASSWORD_ENV = "DAGSTER_PG_PASSWORD"

log = logging.getLogger(__name__)


def postgres_storage_yaml(env: Mapping[str, str]) -> str:
    """The `storage:` block for PostgreSQL from `DAGSTER_PG_*` ('' if DAGSTER_PG_HOST is unset)."""
    host = env.get(PG_HOST_ENV)
    if not host:
        return ""
    db: dict[str, object] = {
        "hostname": host,
        "port": int(env.get("DAGSTER_PG_PORT") or 5432),
        "username": env.get("DAGSTER_PG_USERNAME") or "postgres",
        "db_name": env.get("DAGSTER_PG_DB") or "dagster",
        # dagster-postgres installs psycopg2, but SQLAlchemy >= 2.1 maps a bare `postgresql://`
        # to psycopg 3: name the driver.
        "scheme": "postgresql+psycopg2",
    }
    if env.get(PG_PASSWORD_ENV):
        # Dagster resolves {env: ...} when it loads the file: the secret stays in the environment.
        db["password"] = {"env": PG_PASSWORD_ENV}
    block = {"storage": {"postgres": {"postgres_db": db}}}
    return "# Run, event-log and schedule storage in PostgreSQL (from $DAGSTER_PG_*).\n" + (
        yaml.safe_dump(block, sort_keys=False)
    )


def dagster_yaml(env: Mapping[str, str], home: Path) -> str:
    """The dagster.yaml `rollups` writes in `home`: DAGSTER_YAML, plus Postgres storage if
    configured, else the SQLite storages of `sqlite_storage_config`."""
    return DAGSTER_YAML + (postgres_storage_yaml(env) or sqlite_storage_yaml(home))


def ensure_home(settings: Settings) -> Path:
    """Make sure the Dagster home (`settings.dagster_home`) exists and has a dagster.yaml."""
    home = settings.dagster_home
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "dagster.yaml"
    text = cfg.read_text() if cfg.exists() else None
    if text is None:
        cfg.write_text(dagster_yaml(settings.postgres, home))
    elif settings.postgres.get(PG_HOST_ENV) and "postgres" not in text:
        log.warning(
            "%s is set but %s (written earlier) has no PostgreSQL storage; it is not rewritten: "
            "add the storage block yourself or remove the file to have it regenerated",
            PG_HOST_ENV,
            cfg,
        )
    elif "storage" not in text:
        log.warning(
            "%s (written earlier) keeps Dagster's default SQLite event log, which stores a range "
            "run's materializations one transaction each; it is not rewritten: add this block or "
            "remove the file to have it regenerated:\n%s",
            cfg,
            sqlite_storage_yaml(home),
        )
    return home


def pool_name(spec: RollupSpec, scope: Scope = NO_TENANT) -> str:
    """The rollup's Dagster pool (one per tenant and rollup): every run that writes the rollup
    holds its one slot."""
    return f"rollup_{scope.name(spec.name)}"


def pool_names(catalog: Catalog, scope: Scope | None = None) -> list[str]:
    """The pools of `scope`'s rollups (None: of every tenant's)."""
    scopes = [scope] if scope is not None else scopes_of(catalog)
    return [pool_name(spec, s) for s in scopes for spec in catalog.rollups.values()]


def ensure_pools(
    instance: dg.DagsterInstance, catalog: Catalog, scope: Scope | None = None
) -> None:
    """Give every rollup's pool an explicit limit of 1 (idempotent), of `scope` (None: of every
    tenant)."""
    set_pool_limits(instance, pool_names(catalog, scope), limit=1)


def get_instance(settings: Settings) -> dg.DagsterInstance:
    """The Dagster instance of `settings.dagster_home` (made ready by `ensure_home`). A process
    it starts that opens the instance itself (`dagster dev`) is given the home as DAGSTER_HOME
    by the edge that starts it."""
    return dg.DagsterInstance.from_config(str(ensure_home(settings)))


# Dagster's settings for a range run (a backfill of N partitions), read by Dagster from the
# environment of the process that creates and executes the run: one "planned" event per asset
# instead of N, and the N materializations handed to the event log in batches of
# EVENT_BATCH_SIZE. The Makefile exports both for the daemon and the webserver, which create and
# launch the runs the sensors and the UI request.
RANGE_EVENT_SETTINGS = {
    "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS": "1",
    "DAGSTER_EVENT_BATCH_SIZE": str(EVENT_BATCH_SIZE),
}


def use_range_event_settings(environ: MutableMapping[str, str]) -> None:
    """Put `RANGE_EVENT_SETTINGS` into `environ`, keeping a value already there: the edges that
    execute runs in their own process (the CLI, the demo, the benchmark) pass `os.environ`."""
    for name, value in RANGE_EVENT_SETTINGS.items():
        environ.setdefault(name, value)
