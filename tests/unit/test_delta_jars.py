"""Delta's jars: pinned to the Python package's release, installed and checked by `make install`,
and loaded by every session from a local directory; a missing one is a clear error, and starting
a session downloads nothing."""

import hashlib
import importlib.metadata
from pathlib import Path

import pytest

from rollup_assets.model.errors import DeltaJarsMissingError
from rollup_assets.resources import delta_jars
from rollup_assets.resources.delta_jars import (
    DELTA_CATALOG,
    DELTA_EXTENSION,
    DELTA_JARS,
    Jar,
    delta_conf,
    fetch,
    jar_paths,
)
from rollup_assets.resources.spark import build_session
from rollup_assets.settings import Settings


def test_the_jars_match_the_python_package_release() -> None:
    release = importlib.metadata.version("delta-spark")
    assert {j.version for j in DELTA_JARS} == {release}
    pyspark = importlib.metadata.version("pyspark")
    spark_minor = ".".join(pyspark.split(".")[:2])
    assert any(j.artifact == f"delta-spark_{spark_minor}_2.13" for j in DELTA_JARS)


def test_make_install_put_the_pinned_jars_where_sessions_look() -> None:
    directory = Settings.from_env().delta_jars
    for path, jar in zip(jar_paths(directory), DELTA_JARS, strict=True):
        assert hashlib.sha256(path.read_bytes()).hexdigest() == jar.sha256, path


def test_a_missing_or_truncated_jar_names_itself_and_the_install_command(tmp_path: Path) -> None:
    first = DELTA_JARS[0]
    with pytest.raises(DeltaJarsMissingError) as missing:
        jar_paths(tmp_path)
    assert first.file_name in str(missing.value) and "make install" in str(missing.value)
    assert str(tmp_path) in str(missing.value)
    (tmp_path / first.file_name).write_bytes(b"PK\x03\x04 not the whole jar")
    with pytest.raises(DeltaJarsMissingError, match=f"{first.file_name} is incomplete"):
        jar_paths(tmp_path)


def test_a_session_without_the_jars_fails_before_starting(tmp_path: Path) -> None:
    with pytest.raises(DeltaJarsMissingError, match="make install"):
        build_session(master="local[1]", delta_jars=tmp_path / "nowhere")


def test_session_settings_keep_the_users_jars_and_extensions() -> None:
    directory = Settings.from_env().delta_jars
    conf = delta_conf(directory)
    assert conf["spark.jars"].split(",") == [str(directory / j.file_name) for j in DELTA_JARS]
    assert conf["spark.sql.extensions"] == DELTA_EXTENSION
    assert conf["spark.sql.catalog.spark_catalog"] == DELTA_CATALOG
    mine = delta_conf(
        directory,
        {"spark.jars": "/opt/jars/hadoop-aws.jar", "spark.sql.extensions": "com.acme.Ext"},
    )
    assert mine["spark.jars"].split(",")[0] == "/opt/jars/hadoop-aws.jar"
    assert len(mine["spark.jars"].split(",")) == 1 + len(DELTA_JARS)
    assert mine["spark.sql.extensions"] == f"com.acme.Ext,{DELTA_EXTENSION}"


def _repository(tmp_path: Path, content: bytes, sha1: bytes) -> tuple[Jar, Path]:
    """A Maven-like repository on disk holding one jar and its `.sha1`."""
    jar = Jar("org.example", "thing", "1.0", len(content), hashlib.sha256(content).hexdigest())
    folder = tmp_path / "repo" / "org" / "example" / "thing" / "1.0"
    folder.mkdir(parents=True)
    (folder / jar.file_name).write_bytes(content)
    (folder / f"{jar.file_name}.sha1").write_bytes(sha1 + b"  " + jar.file_name.encode())
    return jar, tmp_path / "repo"


def test_fetch_installs_each_pinned_jar_once_and_checks_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    content = b"jar bytes"
    jar, repo = _repository(tmp_path, content, hashlib.sha1(content).hexdigest().encode())
    monkeypatch.setattr(delta_jars, "MAVEN_CENTRAL", repo.as_uri())
    monkeypatch.setattr(delta_jars, "DELTA_JARS", (jar,))
    target = tmp_path / "jars"
    assert fetch(target) == [f"{jar.file_name}: fetched from {jar.url}"]
    assert (target / jar.file_name).read_bytes() == content
    assert fetch(target) == [f"{jar.file_name}: present"]


def test_fetch_installs_nothing_that_does_not_match_its_pins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    content = b"jar bytes"
    jar, repo = _repository(tmp_path, content, b"0" * 40)  # Maven's checksum disagrees
    monkeypatch.setattr(delta_jars, "MAVEN_CENTRAL", repo.as_uri())
    monkeypatch.setattr(delta_jars, "DELTA_JARS", (jar,))
    with pytest.raises(DeltaJarsMissingError, match="does not match"):
        fetch(tmp_path / "jars")
    assert list((tmp_path / "jars").iterdir()) == []
    other = Jar(jar.group, jar.artifact, jar.version, jar.size, "f" * 64)  # another pin
    monkeypatch.setattr(delta_jars, "DELTA_JARS", (other,))
    with pytest.raises(DeltaJarsMissingError, match="does not match"):
        fetch(tmp_path / "jars")
    assert list((tmp_path / "jars").iterdir()) == []
