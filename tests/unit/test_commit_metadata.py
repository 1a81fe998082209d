"""Commit metadata from either writer: delta-rs commits carry the project's `rollups.*` keys as
keys of the commit info, delta-spark commits as a JSON object in `userMetadata`; readers see
both alike, and any other `userMetadata` (a user's own Spark job) changes nothing."""

import json

import pytest

from rollup_assets.resources.delta_tables import commit_info, with_user_metadata

SPARK_INGEST = {
    "operation": "MERGE",
    "userMetadata": json.dumps(
        {"rollups.operation": "ingest", "rollups.change_source": "Manual", "rollups.rows": 12}
    ),
}


def test_a_spark_ingest_commit_reads_like_a_delta_rs_one() -> None:
    info = with_user_metadata(SPARK_INGEST)
    assert info["rollups.operation"] == "ingest"
    assert info["rollups.change_source"] == "Manual"
    assert info["rollups.rows"] == "12"  # strings, as delta-rs writes them
    assert info["operation"] == "MERGE" and info["userMetadata"] == SPARK_INGEST["userMetadata"]
    actions = [{"commitInfo": SPARK_INGEST}, {"add": {"path": "x.parquet"}}]
    assert commit_info(actions) == info


@pytest.mark.parametrize(
    "user_metadata",
    [
        None,
        "overwritten-for-fixing-incorrect-data",
        "{not json",
        json.dumps(["rollups.operation", "retention"]),
        json.dumps({"owner": "etl", "ticket": 42}),
    ],
)
def test_other_user_metadata_adds_no_key(user_metadata: str | None) -> None:
    info = {"operation": "MERGE", "userMetadata": user_metadata}
    assert with_user_metadata(info) == info


def test_a_commits_own_keys_win_over_user_metadata() -> None:
    info = {
        "operation": "DELETE",
        "rollups.operation": "retention",
        "userMetadata": json.dumps({"rollups.operation": "ingest"}),
    }
    assert with_user_metadata(info)["rollups.operation"] == "retention"
    assert commit_info([{"add": {}}]) == {}
