"""The dagster.yaml `rollups` writes is valid instance config, on SQLite and on PostgreSQL.

No server is needed: Dagster validates the file against its instance schema, builds the storage
reference, and the Postgres storage's own config schema resolves it (`env:` indirections
included) exactly as `ConfigurableClassData.rehydrate` does, just before it would connect.
"""

import logging
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._config import process_config, resolve_to_config_type
from dagster._core.instance.config import dagster_instance_config
from dagster._core.instance.ref import InstanceRef
from dagster_postgres import DagsterPostgresStorage
from dagster_postgres.utils import pg_url_from_config

from rollup_assets.orchestration.event_log import BatchedSqliteEventLogStorage
from rollup_assets.orchestration.instance import dagster_yaml, ensure_home, postgres_storage_yaml
from rollup_assets.orchestration.run_storage import KeptEngineSqliteRunStorage
from rollup_assets.settings import Settings

PG_ENV = {
    "DAGSTER_PG_HOST": "db.internal",
    "DAGSTER_PG_PORT": "6543",
    "DAGSTER_PG_USERNAME": "rollups",
    "DAGSTER_PG_DB": "dagster_prod",
    "DAGSTER_PG_PASSWORD": "s3cr:t@x",
}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in PG_ENV:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def load(home: Path, text: str) -> dict:
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text(text)
    config, _ = dagster_instance_config(str(home))
    return dict(config)


def resolved_postgres_config(home: Path) -> dict:
    """The storage config as DagsterPostgresStorage would receive it (env vars resolved)."""
    ref = InstanceRef.from_dir(str(home))
    assert ref.storage_data is not None
    assert (ref.storage_data.module_name, ref.storage_data.class_name) == (
        "dagster_postgres",
        "DagsterPostgresStorage",
    )
    result = process_config(
        resolve_to_config_type(DagsterPostgresStorage.config_type()),
        yaml.safe_load(ref.storage_data.config_yaml),
    )
    if not result.success:
        raise ValueError([e.message for e in result.errors or []])
    return dict(result.value or {})


def test_default_is_sqlite_and_valid(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    assert postgres_storage_yaml({}) == ""
    config = load(tmp_path, dagster_yaml({}, tmp_path))
    assert "storage" not in config
    instance = dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(tmp_path)))
    try:
        events = instance.event_log_storage
        # Dagster's SQLite storages where its default puts them; the event log batches, and
        # the run storage keeps one engine (with its compiled statements).
        assert type(events) is BatchedSqliteEventLogStorage
        assert Path(events._base_dir) == (tmp_path / "history" / "runs").resolve()
        runs = instance.run_storage
        assert type(runs) is KeptEngineSqliteRunStorage
        assert (tmp_path / "history" / "runs.db").exists()
        assert runs._engine.url.database == str((tmp_path / "history" / "runs.db").resolve())
        with runs.connect() as a, runs.connect() as b:
            assert a.engine is b.engine is runs._engine and a is not b
        # A run a sensor requests leaves the queue within about a second.
        assert instance.run_coordinator.dequeue_interval_seconds == 1  # type: ignore[attr-defined]
    finally:
        instance.dispose()


def test_postgres_block_validates_and_keeps_the_password_out(
    tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    text = dagster_yaml(PG_ENV, tmp_path)
    assert "event_log_storage" not in text
    assert PG_ENV["DAGSTER_PG_PASSWORD"] not in text
    assert yaml.safe_load(text)["storage"]["postgres"]["postgres_db"]["password"] == {
        "env": "DAGSTER_PG_PASSWORD"
    }

    for var, value in PG_ENV.items():
        clean_env.setenv(var, value)
    assert "postgres" in load(tmp_path, text)["storage"]
    # One storage for runs, event logs and schedules; the `env:` indirection is resolved when
    # the storage is built, and the password is URL-quoted into the connection string.
    pg = resolved_postgres_config(tmp_path)
    assert pg["postgres_db"]["password"] == PG_ENV["DAGSTER_PG_PASSWORD"]
    assert pg["postgres_db"]["port"] == 6543
    assert pg_url_from_config(pg) == (
        "postgresql+psycopg2://rollups:s3cr%3At%40x@db.internal:6543/dagster_prod"
    )


def test_postgres_without_password_uses_defaults(
    tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    load(tmp_path, dagster_yaml({"DAGSTER_PG_HOST": "localhost"}, tmp_path))
    db = resolved_postgres_config(tmp_path)["postgres_db"]
    assert (db["hostname"], db["port"], db["username"], db["db_name"]) == (
        "localhost",
        5432,
        "postgres",
        "dagster",
    )
    assert db["password"] == ""


def test_unset_password_variable_is_a_config_error(
    tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    """A file that refers to $DAGSTER_PG_PASSWORD fails loudly where the variable is missing."""
    load(tmp_path, dagster_yaml(PG_ENV, tmp_path))
    with pytest.raises(ValueError, match="DAGSTER_PG_PASSWORD"):
        resolved_postgres_config(tmp_path)


def test_ensure_home_writes_postgres_storage_from_env(
    tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    clean_env.setenv("DAGSTER_HOME", str(home))
    for var, value in PG_ENV.items():
        clean_env.setenv(var, value)
    assert ensure_home(Settings.from_env()) == home
    text = (home / "dagster.yaml").read_text()
    assert text == dagster_yaml(PG_ENV, home)
    assert resolved_postgres_config(home)["postgres_db"]["hostname"] == "db.internal"


def test_ensure_home_never_rewrites_but_warns(
    tmp_path: Path, clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    home = tmp_path / "home"
    clean_env.setenv("DAGSTER_HOME", str(home))
    ensure_home(Settings.from_env())
    first = (home / "dagster.yaml").read_text()
    assert "storage" not in yaml.safe_load(first)

    clean_env.setenv("DAGSTER_PG_HOST", "db.internal")
    with caplog.at_level(logging.WARNING, logger="rollup_assets.orchestration.instance"):
        ensure_home(Settings.from_env())
    assert (home / "dagster.yaml").read_text() == first
    assert "DAGSTER_PG_HOST is set" in caplog.text


def test_an_old_sqlite_home_is_kept_but_told_how_to_batch(
    tmp_path: Path, clean_env: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    clean_env.setenv("DAGSTER_HOME", str(home))
    with caplog.at_level(logging.WARNING, logger="rollup_assets.orchestration.instance"):
        ensure_home(Settings.from_env())
    assert (home / "dagster.yaml").read_text() == "telemetry:\n  enabled: false\n"
    assert "BatchedSqliteEventLogStorage" in caplog.text
