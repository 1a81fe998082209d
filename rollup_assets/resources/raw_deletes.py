"""Deletes from a raw or time-range archive, each one commit: a correction (rows a user deletes,
a change like any other) or retention (old days dropped on purpose, which the rollups keep),
and the retention fence a pass records when no day is left to drop (`raw_tables`)."""

import datetime as dt
from dataclasses import dataclass

from deltalake import CommitProperties, Transaction
from deltalake.exceptions import CommitFailedError

from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.operations import OPERATION_KEY, RETAINED_FROM_KEY, Operation
from rollup_assets.model.specs import DAY_COLUMN, SourceSpec
from rollup_assets.model.windows import Window, micros
from rollup_assets.resources.delta_tables import MERGE_ATTEMPTS, file_actions, with_retries
from rollup_assets.resources.raw_tables import (
    BEGINNING_OF_TIME,
    RawTables,
    retained_from,
)


@dataclass(frozen=True)
class DroppedDays:
    """What one retention pass dropped from an archive: whole UTC days and their rows."""

    archive: str
    days: tuple[dt.date, ...]
    rows: int
    version: int | None  # the retention commit; None when nothing was dropped


def delete_rows(
    tables: RawTables,
    spec: SourceSpec,
    span: Window,
    entities: frozenset[str] | None,
    change_source: ChangeSource,
    *,
    retention: bool,
) -> tuple[int | None, int]:
    """Delete the rows whose time falls in `span` (and entity in `entities`) in one commit;
    return its version (None when no row matched: nothing is committed) and the rows
    deleted.

    A correction (`retention` False) is a change like any other: the rollups drop what the
    rows contributed. Retention (`retention` True) drops old raw rows on purpose: the commit
    says so, change detection and the change feed skip it, and the rollups keep what they
    aggregated from those rows.
    """
    table = tables.table(spec)
    if table is None:
        return None, 0
    time_col = spec.time_column
    lo, hi = span.start.astimezone(dt.UTC), span.end.astimezone(dt.UTC)
    last_day = (hi - dt.timedelta(microseconds=1)).date()
    parts = [
        f"{DAY_COLUMN} >= '{lo.date().isoformat()}'",
        f"{DAY_COLUMN} <= '{last_day.isoformat()}'",
        f"{time_col} >= '{lo.isoformat()}'",
        f"{time_col} < '{hi.isoformat()}'",
    ]
    if entities is not None:
        quoted = ", ".join("'" + e.replace("'", "''") + "'" for e in sorted(entities))
        parts.append(f"entity_id IN ({quoted})")
    metadata = {
        OPERATION_KEY: Operation.RETENTION if retention else Operation.DELETE,
        "rollups.change_source": change_source.value,
        "rollups.min_ts": lo.isoformat(),
        "rollups.max_ts": (hi - dt.timedelta(microseconds=1)).isoformat(),
    }
    return _delete(tables, spec, " AND ".join(parts), metadata)


def drop_days_before(tables: RawTables, spec: SourceSpec, cut: dt.datetime) -> DroppedDays:
    """Retention: drop every UTC-day partition before midnight `cut` in one commit (whole
    files, nothing rewritten), marked as retention so detection, the forward lane and the
    change feed skip it. Returns the days and rows dropped (no commit when none)."""
    table = tables.table(spec)
    if table is None:
        return DroppedDays(spec.name, (), 0, None)
    first_kept = cut.astimezone(dt.UTC).date()
    days = sorted(
        {
            day
            # Whole days are deleted by delta-rs, which applies deletion vectors itself.
            for f in file_actions(table, deletion_vectors="mark")
            for day in [_partition_day(f)]
            if day is not None and day < first_kept
        }
    )
    if not days:
        return DroppedDays(spec.name, (), 0, None)
    first = dt.datetime.combine(days[0], dt.time(0), tzinfo=dt.UTC)
    metadata = {
        OPERATION_KEY: Operation.RETENTION,
        "rollups.min_ts": first.isoformat(),
        "rollups.max_ts": (cut - dt.timedelta(microseconds=1)).isoformat(),
        RETAINED_FROM_KEY: cut.isoformat(),
    }
    version, rows = _delete(
        tables,
        spec,
        f"{DAY_COLUMN} < '{first_kept.isoformat()}'",
        metadata,
        txn=Transaction(RETAINED_FROM_KEY, micros(cut)),
    )
    return DroppedDays(spec.name, tuple(days), rows, version)


def fence_retention(tables: RawTables, spec: SourceSpec, cut: dt.datetime) -> None:
    """Record in the table that nothing before midnight `cut` is kept, when no day was left
    to drop (an ingest racing this pass then conflicts, and sees it: see `raw_tables`)."""
    table = tables.table(spec)
    if table is None or (retained_from(table) or BEGINNING_OF_TIME) >= cut:
        return

    def attempt() -> None:
        current = tables.table(spec)
        assert current is not None
        if (retained_from(current) or BEGINNING_OF_TIME) >= cut:
            return
        current.create_write_transaction(
            [],
            mode="append",
            schema=current.schema(),
            partition_by=[DAY_COLUMN],
            commit_properties=CommitProperties(
                custom_metadata={
                    OPERATION_KEY: Operation.RETENTION,
                    "rollups.min_ts": BEGINNING_OF_TIME.isoformat(),
                    "rollups.max_ts": (cut - dt.timedelta(microseconds=1)).isoformat(),
                    RETAINED_FROM_KEY: cut.isoformat(),
                },
                app_transactions=[Transaction(RETAINED_FROM_KEY, micros(cut))],
            ),
        )

    with_retries(
        attempt,
        retryable=lambda exc: isinstance(exc, CommitFailedError),
        attempts=MERGE_ATTEMPTS,
        what=f"retention fence of {spec.name}",
    )


def _delete(
    tables: RawTables,
    spec: SourceSpec,
    predicate: str,
    metadata: dict[str, str],
    txn: Transaction | None = None,
) -> tuple[int | None, int]:
    """Delete the rows matching `predicate` in one commit carrying `metadata` (and `txn`):
    (its version, or None when no row matched, and the rows deleted)."""

    def delete() -> tuple[int | None, int]:
        current = tables.table(spec)
        assert current is not None
        metrics = current.delete(
            predicate,
            commit_properties=CommitProperties(
                custom_metadata=metadata, app_transactions=[txn] if txn else None
            ),
        )
        deleted = int(metrics.get("num_deleted_rows", 0) or 0)
        return (current.version() if deleted else None), deleted

    return with_retries(
        delete,
        retryable=lambda exc: isinstance(exc, CommitFailedError),
        attempts=MERGE_ATTEMPTS,
        what=f"delete from {spec.name}",
    )


def _partition_day(f: dict) -> dt.date | None:
    """The UTC day partition of a live file (`file_actions`; None when it has none)."""
    value = f.get(f"partition.{DAY_COLUMN}")
    if value is None:
        return None
    return value if isinstance(value, dt.date) else dt.date.fromisoformat(str(value))
