"""The operations commits record, and which source commits change what the rollups aggregate."""

import pytest

from rollup_assets.model.operations import (
    OPERATION_KEY,
    Operation,
    is_data_change,
    operation_of,
)


def test_the_recorded_values_never_change() -> None:
    # They are stored in every table's log: a renamed value would misread older commits.
    assert {o.name: o.value for o in Operation} == {
        "PROVISION": "provision",
        "INGEST": "ingest",
        "DELETE": "delete",
        "RETENTION": "retention",
        "COLUMNS": "columns",
        "REFRESH_COMPUTED": "refresh-computed",
        "RECOMPUTE": "recompute",
        "FLIP": "flip",
        "FENCE": "fence",
        "ROLLBACK": "rollback",
        "SWEEP": "sweep",
        "RECLAIM": "reclaim",
        "REWIND": "rewind",
        "PUBLISH": "publish",
        "COMPACT_SURFACE": "compact surface",
    }


@pytest.mark.parametrize(
    ("info", "change_files", "changes"),
    [
        ({"operation": "MERGE", OPERATION_KEY: "ingest"}, False, True),
        ({"operation": "WRITE"}, False, True),  # another writer's commit
        ({"operation": "DELETE", OPERATION_KEY: "delete"}, False, True),
        ({"operation": "DELETE", OPERATION_KEY: "retention"}, False, False),
        ({"operation": "WRITE", OPERATION_KEY: "columns"}, False, True),
        ({"operation": "OPTIMIZE"}, False, False),
        ({"operation": "OPTIMIZE"}, True, True),  # it wrote change files: read them
        ({"operation": "VACUUM END"}, False, False),
        ({"operation": "SET TBLPROPERTIES"}, False, False),
    ],
)
def test_which_commits_change_data(info: dict, change_files: bool, changes: bool) -> None:
    assert is_data_change(info, writes_change_files=change_files) is changes


def test_the_operation_of_a_commit_is_ours_first_then_deltas() -> None:
    assert operation_of({"operation": "MERGE", OPERATION_KEY: "ingest"}) == Operation.INGEST
    assert operation_of({"operation": "OPTIMIZE"}) == "OPTIMIZE"
    assert operation_of({}) is None
