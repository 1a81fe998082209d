"""Warehouse roots and data-file paths: one spelling per root, and every Delta add action found on
disk by the path Spark/Hadoop is given (no Spark: Hadoop takes path strings literally, so the
file-system path after `file://` is what it opens)."""

import urllib.parse
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable, write_deltalake

from rollup_assets.resources.warehouse import Warehouse, data_file_uri, filesystem_for, spark_uri

ODD = "wäre house #1"


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("s3://bucket/wäre house", "s3://bucket/w%C3%A4re%20house"),
        ("s3://bucket/w%C3%A4re%20house/", "s3://bucket/w%C3%A4re%20house"),
        ("s3a://bucket/100%25 done", "s3a://bucket/100%25%20done"),
        (
            "abfss://box@acct.dfs.core.windows.net/a b",
            "abfss://box@acct.dfs.core.windows.net/a%20b",
        ),
        ("gs://bucket/plain/path", "gs://bucket/plain/path"),
    ],
)
def test_object_store_roots_have_one_encoded_spelling(given: str, canonical: str) -> None:
    assert Warehouse(given).root == canonical
    assert not Warehouse(given).is_local


@pytest.mark.parametrize("form", ["file://{}", "file:{}", "file://{q}", "file://localhost{q}"])
def test_file_uris_stay_uris_of_the_resolved_directory(tmp_path: Path, form: str) -> None:
    directory = tmp_path / ODD / "wh"
    given = form.format(str(directory), q=urllib.parse.quote(str(directory)))
    wh = Warehouse(given)
    assert wh.root == directory.as_uri()
    assert wh.is_local
    fs, inside = wh.filesystem()
    assert isinstance(fs, pafs.LocalFileSystem) and inside == str(directory)


def test_local_paths_resolve_and_keep_their_characters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert Warehouse(f"{ODD}/wh/").root == str(tmp_path / ODD / "wh")
    assert spark_uri(str(tmp_path / ODD)) == f"file://{tmp_path}/{ODD}"


def test_spark_uri_decodes_a_uri_exactly_once() -> None:
    assert spark_uri("s3a://b/w%C3%A4re%20house/p=a%2520b/f.parquet") == (
        "s3a://b/wäre house/p=a%20b/f.parquet"
    )


def _file_on_disk(uri_or_path: str) -> Path:
    """The file a Hadoop `file:` path string names (taken literally, as Hadoop does)."""
    assert uri_or_path.startswith("file://")
    return Path(uri_or_path.removeprefix("file://").removeprefix("localhost"))


@pytest.mark.parametrize("as_uri", [False, True], ids=["local-path", "file-uri"])
def test_add_actions_resolve_to_the_files_delta_rs_wrote(tmp_path: Path, as_uri: bool) -> None:
    """delta-rs escapes a partition value on disk (`a b%c` -> `p=a%20b%25c`) and URI-encodes that
    again in the log; the path given to Spark and to pyarrow must name the real file."""
    directory = tmp_path / ODD / "t"
    root = Warehouse(directory.as_uri() if as_uri else str(directory)).root
    data = pa.table({"v": [1, 2, 3], "p": ["a b%c", "ä/ö", "plain"]})
    write_deltalake(root, data, partition_by=["p"])
    adds = pa.table(DeltaTable(root).get_add_actions(flatten=True)).to_pylist()
    assert len(adds) == 3
    fs, inside = filesystem_for(root)
    for add in adds:
        on_disk = _file_on_disk(spark_uri(data_file_uri(root, add["path"])))
        assert on_disk.is_file(), (add["path"], on_disk)
        assert on_disk.is_relative_to(directory)
        relative = urllib.parse.unquote(add["path"])
        assert fs.get_file_info(f"{inside}/{relative}").size == on_disk.stat().st_size


def test_s3_storage_options_reach_the_executor_filesystem() -> None:
    fs, inside = filesystem_for(
        "s3a://bucket/w%C3%A4re%20house/t",
        {"AWS_REGION": "eu-central-1", "aws_access_key_id": "k", "AWS_SECRET_ACCESS_KEY": "s"},
    )
    assert isinstance(fs, pafs.S3FileSystem)
    assert fs.region == "eu-central-1"
    assert inside == "bucket/wäre house/t"


def test_azure_storage_options_reach_the_executor_filesystem() -> None:
    fs, inside = filesystem_for(
        "abfss://box@acct.dfs.core.windows.net/a%20b",
        {"azure_storage_account_key": "a2V5"},
    )
    assert isinstance(fs, pafs.AzureFileSystem)
    assert inside == "box/a b"
