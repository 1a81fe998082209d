"""The Dagster instance this project runs in: a persistent home with one pool per rollup."""

import os
from pathlib import Path

import dagster as dg

from rollup_assets.specs import Catalog

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


def default_home() -> Path:
    return Path(os.environ.get("DAGSTER_HOME") or Path.cwd() / ".dagster_home").resolve()


def ensure_home() -> Path:
    """Make sure DAGSTER_HOME exists (default ./.dagster_home) and has a dagster.yaml."""
    home = default_home()
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "dagster.yaml"
    if not cfg.exists():
        cfg.write_text(DAGSTER_YAML)
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def ensure_pools(instance: dg.DagsterInstance, catalog: Catalog) -> None:
    """Give every rollup's pool an explicit limit of 1 (idempotent)."""
    from rollup_assets.factory import pool_name

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
