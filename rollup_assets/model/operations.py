"""What a commit of this project did: the `rollups.operation` it records in its commit info
(the values are stored in tables' logs: never rename one), and which source commits change rows
the rollups aggregate.

The forward lane's commits record their trigger instead (`Trigger.value`: `Forward`,
`OpenBucket`), and commits of other writers record none.
"""

from collections.abc import Mapping
from enum import StrEnum

# The commit-info key every operation below is recorded under.
OPERATION_KEY = "rollups.operation"
# What retention keeps from, in a table's log: the app transaction whose version is that instant
# (microseconds since the epoch; the fence a racing write checks) and the commit-info key of the
# commit that recorded it (ISO 8601).
RETAINED_FROM_KEY = "rollups.retained_from"


class Operation(StrEnum):
    # Raw and time-range tables.
    PROVISION = "provision"
    INGEST = "ingest"
    DELETE = "delete"
    RETENTION = "retention"  # rows dropped on purpose (raw days, a rollup's old buckets)
    COLUMNS = "columns"  # the switch to new formulas, values rewritten
    REFRESH_COMPUTED = "refresh-computed"  # rows ingested during a switch, brought to it
    # Rollup row and pointer tables.
    RECOMPUTE = "recompute"
    FLIP = "flip"
    FENCE = "fence"
    ROLLBACK = "rollback"
    SWEEP = "sweep"
    RECLAIM = "reclaim"
    REWIND = "rewind"
    # Surface tables.
    PUBLISH = "publish"
    COMPACT_SURFACE = "compact surface"


# Delta operations that rewrite or list files without changing any row.
NO_DATA_OPERATIONS = frozenset(
    {"OPTIMIZE", "VACUUM START", "VACUUM END", "CHECKPOINT", "SET TBLPROPERTIES"}
)


def operation_of(info: Mapping[str, object]) -> str | None:
    """The operation a commit records: this project's, else Delta's (`WRITE`, `MERGE`, ...)."""
    value = info.get(OPERATION_KEY) or info.get("operation")
    return None if value is None else str(value)


def is_data_change(info: Mapping[str, object], writes_change_files: bool = False) -> bool:
    """Does a source table's commit (its commit info `info`) change rows the rollups aggregate?
    Not one that only rewrites or lists files (unless it wrote change files), and not a
    retention drop (the rollups keep what they aggregated). A switch to new formulas is one:
    its changed values are those of the re-formulated columns."""
    if info.get("operation") in NO_DATA_OPERATIONS and not writes_change_files:
        return False
    return info.get(OPERATION_KEY) != Operation.RETENTION
