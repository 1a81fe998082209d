"""Starting a Spark session reads nothing from the environment: Java is looked for where the
settings say, and the workers' Python the caller chose is written where PySpark reads it."""

import os
import sys
from pathlib import Path

import pytest

from rollup_assets.model.errors import DeltaJarsMissingError
from rollup_assets.resources.spark import JavaMissingError, build_session, require_java


def test_java_is_looked_for_in_the_java_home_given_not_the_environments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jdk = tmp_path / "jdk"
    (jdk / "bin").mkdir(parents=True)
    (jdk / "bin" / "java").write_text("")
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    monkeypatch.setenv("JAVA_HOME", str(jdk))
    with pytest.raises(JavaMissingError, match="JAVA_HOME"):
        require_java()
    require_java(jdk)
    with pytest.raises(JavaMissingError):
        require_java(tmp_path / "no-jdk")


@pytest.mark.parametrize(
    ("conf", "python", "exported"),
    [
        ({}, "/opt/rollups/venv/bin/python", "/opt/rollups/venv/bin/python"),
        ({"spark.pyspark.python": "./env/bin/python"}, "/opt/venv/bin/python", "./env/bin/python"),
        ({}, None, sys.executable),
    ],
)
def test_a_session_exports_the_python_its_workers_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    conf: dict[str, str],
    python: str | None,
    exported: str,
) -> None:
    """A run's conf comes first, then the settings' interpreter, then this one; whatever
    $PYSPARK_PYTHON held before is not read. (The jars are missing: no JVM starts.)"""
    monkeypatch.setenv("PYSPARK_PYTHON", "/left/over/python")
    with pytest.raises(DeltaJarsMissingError):
        build_session(master="local[1]", conf=conf, python=python, delta_jars=tmp_path / "nowhere")
    assert os.environ["PYSPARK_PYTHON"] == exported
