"""Settings are read from the environment once, with the documented defaults and clear errors."""

import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rollup_assets.settings import DEFAULT_SPECS, DEFAULT_WAREHOUSE, Settings, SettingsError


def test_defaults_when_nothing_is_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    s = Settings.from_env({})
    assert (s.warehouse, s.specs) == (DEFAULT_WAREHOUSE, DEFAULT_SPECS)
    assert s.dagster_home == (tmp_path / ".dagster_home").resolve()
    assert (s.spark_master, s.spark_remote, s.now, s.run_log_level) == (None, None, None, None)
    assert s.sensor_interval_seconds == 1
    assert (s.limits.entity_scope_limit, s.limits.max_versions_per_tick) == (32, 100)
    assert s.limits.max_cdf_rows == 2_000_000
    assert s.postgres == {}
    assert s.generation_retention_hours == 168
    # Delta's jars: where `make install` puts them, in the environment this process runs in.
    assert s.delta_jars == Path(sys.prefix) / "delta-jars"
    assert (s.java_home, s.pyspark_python) == (None, None)


def test_every_variable_is_read(tmp_path: Path) -> None:
    env = {
        "ROLLUPS_WAREHOUSE": "s3://bucket/wh",
        "ROLLUPS_SPECS": str(tmp_path / "specs.yaml"),
        "DAGSTER_HOME": str(tmp_path / "home"),
        "ROLLUPS_SPARK_MASTER": "spark://host:7077",
        "ROLLUPS_SPARK_REMOTE": "sc://host:15002",
        "ROLLUPS_SENSOR_INTERVAL_SECONDS": "5",
        "ROLLUPS_SPARK_SERVER_DIR": str(tmp_path / "warm"),
        "ROLLUPS_SPARK_SERVER_PORT": "15003",
        "ROLLUPS_NOW": "2025-06-01T12:00:00+02:00",
        "ROLLUPS_RUN_LOG_LEVEL": "WARNING",
        "ROLLUPS_ENTITY_SCOPE_LIMIT": "3",
        "ROLLUPS_MAX_VERSIONS_PER_TICK": "7",
        "ROLLUPS_MAX_CDF_ROWS": "0",
        "ROLLUPS_GENERATION_RETENTION_HOURS": "0",
        "DAGSTER_PG_HOST": "db",
        "ROLLUPS_DELTA_JARS": str(tmp_path / "jars"),
        "JAVA_HOME": str(tmp_path / "jdk"),
        "PYSPARK_PYTHON": "/opt/rollups/venv/bin/python",
        "UNRELATED": "x",
    }
    s = Settings.from_env(env)
    assert s.warehouse == "s3://bucket/wh" and s.specs == tmp_path / "specs.yaml"
    assert s.dagster_home == tmp_path / "home"
    assert (s.spark_master, s.spark_remote) == ("spark://host:7077", "sc://host:15002")
    assert s.sensor_interval_seconds == 5 and s.run_log_level == "WARNING"
    assert (s.spark_server_dir, s.spark_server_port) == ((tmp_path / "warm").resolve(), 15003)
    assert s.now == datetime(2025, 6, 1, 10, tzinfo=UTC)
    assert (s.limits.entity_scope_limit, s.limits.max_versions_per_tick) == (3, 7)
    assert s.limits.max_cdf_rows == 0
    assert s.generation_retention_hours == 0
    assert s.postgres == {"DAGSTER_PG_HOST": "db"}
    assert s.delta_jars == (tmp_path / "jars").resolve()
    assert s.java_home == tmp_path / "jdk"
    assert s.pyspark_python == "/opt/rollups/venv/bin/python"


@pytest.mark.parametrize(
    ("name", "value", "needle"),
    [
        ("ROLLUPS_SENSOR_INTERVAL_SECONDS", "soon", "not a whole number"),
        ("ROLLUPS_SENSOR_INTERVAL_SECONDS", "0", "at least 1"),
        # A tick that may read no version would never move detection forward.
        ("ROLLUPS_MAX_VERSIONS_PER_TICK", "0", "at least 1"),
        ("ROLLUPS_ENTITY_SCOPE_LIMIT", "-1", "at least 0"),
        ("ROLLUPS_NOW", "yesterday", "not an ISO-8601"),
        ("ROLLUPS_GENERATION_RETENTION_HOURS", "-1", "at least 0"),
        ("ROLLUPS_GENERATION_RETENTION_HOURS", "a week", "not a whole number"),
    ],
)
def test_a_bad_value_names_the_variable(name: str, value: str, needle: str) -> None:
    with pytest.raises(SettingsError, match=needle) as info:
        Settings.from_env({name: value})
    assert name in str(info.value)
