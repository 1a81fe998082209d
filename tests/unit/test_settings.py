"""Settings are read from the environment once, with the documented defaults and clear errors,
and only at the edges: no other module of the package reads the environment."""

import ast
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

import rollup_assets
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
    assert s.driver_source_rows == 2_000_000
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
        "ROLLUPS_DRIVER_SOURCE_ROWS": "0",
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
    assert s.driver_source_rows == 0
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
        ("ROLLUPS_DRIVER_SOURCE_ROWS", "-1", "at least 0"),
        ("ROLLUPS_DRIVER_SOURCE_ROWS", "2M", "not a whole number"),
    ],
)
def test_a_bad_value_names_the_variable(name: str, value: str, needle: str) -> None:
    with pytest.raises(SettingsError, match=needle) as info:
        Settings.from_env({name: value})
    assert name in str(info.value)


# -- the environment is read at the edges only --------------------------------------------------

PACKAGE = Path(rollup_assets.__file__).parent
# Where a process reads its configuration and hands it down (the settings module's docstring).
EDGES = ("settings.py", "definitions.py", "component.py", "cli/", "demo/")
# Variables a library reads from the process environment itself: written from a passed-down
# value where that library is started (or given a default the process may already have set,
# `os.environ.setdefault`), never read.
LIBRARY_VARIABLES = {
    "resources/spark.py": {"PYSPARK_PYTHON"},
    # delta-rs' allocator, before deltalake loads; Arrow's pool, before pyarrow loads
    "__init__.py": {"_RJEM_MALLOC_CONF", "ARROW_DEFAULT_MEMORY_POOL"},
}
ENVIRONMENT = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def environment_uses(source: str, writable: frozenset[str] = frozenset()) -> list[int]:
    """The lines of `source` that reach the process environment (`os.environ`, `os.getenv`,
    `from os import environ`, any `.from_env`), but for a plain write `os.environ[NAME] = ...`
    or a default `os.environ.setdefault(NAME, ...)` of a name in `writable`."""
    tree = ast.parse(source)
    written: set[int] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "setdefault"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in writable
        ):
            written.add(id(node.func.value))
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if (
                isinstance(target, ast.Subscript)
                and isinstance(target.slice, ast.Constant)
                and target.slice.value in writable
            ):
                written.add(id(target.value))
    lines = []
    for node in ast.walk(tree):
        if id(node) in written:
            continue
        if isinstance(node, ast.Attribute) and (
            node.attr == "from_env"
            or (
                isinstance(node.value, ast.Name)
                and node.value.id == "os"
                and node.attr in ENVIRONMENT
            )
        ):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(alias.name in ENVIRONMENT for alias in node.names):
                lines.append(node.lineno)
        elif isinstance(node, ast.FunctionDef) and node.name == "from_env":
            lines.append(node.lineno)
    return sorted(lines)


def test_only_the_edges_read_the_environment() -> None:
    for edge in EDGES:
        assert (PACKAGE / edge).exists(), f"{edge} is no longer there: update EDGES"
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        if module.startswith(EDGES):
            continue
        writable = frozenset(LIBRARY_VARIABLES.get(module, ()))
        source = path.read_text(encoding="utf-8")
        lines = environment_uses(source, writable)
        if lines:
            text = source.splitlines()
            found[module] = [f"{n}: {text[n - 1].strip()}" for n in lines]
    # Read the setting in `Settings.from_env()` and pass the value down from the edge.
    assert found == {}


@pytest.mark.parametrize(
    "source",
    [
        "import os\nhome = os.environ.get('DAGSTER_HOME')\n",
        "import os\nhome = os.environ['DAGSTER_HOME']\n",
        "import os\nsize = os.getenv('DAGSTER_EVENT_BATCH_SIZE')\n",
        "import os\nenv = {**os.environ}\n",
        "import os\nos.environ.setdefault('DAGSTER_HOME', '/tmp')\n",
        "import os\nos.environ['PYSPARK_DRIVER_PYTHON'] = 'python3'\n",
        "from os import environ\n",
        "from rollup_assets.settings import Settings\nspecs = Settings.from_env().specs\n",
        "class Warehouse:\n    def from_env(cls):\n        pass\n",
    ],
)
def test_every_way_of_reading_the_environment_is_found(source: str) -> None:
    assert environment_uses(source, frozenset({"PYSPARK_PYTHON"})) != []


def test_a_library_variable_may_be_written_where_it_is_listed() -> None:
    source = "import os\nos.environ['PYSPARK_PYTHON'] = python\n"
    assert environment_uses(source, frozenset({"PYSPARK_PYTHON"})) == []
    assert environment_uses(source) == [2]
    # Given a default that a value the process set itself overrides: still a write.
    source = "import os\nos.environ.setdefault('PYSPARK_PYTHON', python)\n"
    assert environment_uses(source, frozenset({"PYSPARK_PYTHON"})) == []
    assert environment_uses(source) == [2]
