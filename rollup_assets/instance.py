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
import os
from collections.abc import Mapping
from pathlib import Path

import dagster as dg
import yaml

from rollup_assets.specs import Catalog, RollupSpec

DAGSTER_YAML = """\
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


PG_HOST_ENV = "DAGSTER_PG_HOST"
PG_PASSWORD_ENV = "DAGSTER_PG_PASSWORD"

log = logging.getLogger(__name__)


def postgres_storage_yaml(env: Mapping[str, str] | None = None) -> str:
    """The `storage:` block for PostgreSQL from `DAGSTER_PG_*` ('' if DAGSTER_PG_HOST is unset)."""
    env = os.environ if env is None else env
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


def dagster_yaml(env: Mapping[str, str] | None = None) -> str:
    """The dagster.yaml `rollups` writes: DAGSTER_YAML, plus Postgres storage if configured."""
    return DAGSTER_YAML + postgres_storage_yaml(env)


def default_home() -> Path:
    return Path(os.environ.get("DAGSTER_HOME") or Path.cwd() / ".dagster_home").resolve()


def ensure_home() -> Path:
    """Make sure DAGSTER_HOME exists (default ./.dagster_home) and has a dagster.yaml."""
    home = default_home()
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "dagster.yaml"
    if not cfg.exists():
        cfg.write_text(dagster_yaml())
    elif os.environ.get(PG_HOST_ENV) and "postgres" not in cfg.read_text():
        log.warning(
            "%s is set but %s (written earlier) has no PostgreSQL storage; it is not rewritten: "
            "add the storage block yourself or remove the file to have it regenerated",
            PG_HOST_ENV,
            cfg,
        )
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def pool_name(spec: RollupSpec) -> str:
    """The rollup's Dagster pool: every run that writes the rollup holds its one slot."""
    return f"rollup_{spec.name}"


def ensure_pools(instance: dg.DagsterInstance, catalog: Catalog) -> None:
    """Give every rollup's pool an explicit limit of 1 (idempotent)."""
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return
    for spec in catalog.rollups.values():
        pool = pool_name(spec)
        info = storage.get_concurrency_info(pool)
        if info.slot_count != 1:
            storage.set_concurrency_slots(pool, 1)


def get_instance() -> dg.DagsterInstance:
    ensure_home()
    return dg.DagsterInstance.get()
