"""The upsert an ingest commits, whichever engine runs its MERGE (delta-rs on the driver,
delta-spark on the executors): its match condition, the update of a matched row, when a matched
row counts as changed, and the metadata its commit records.

Keyed by (entity_id, time), and only within the UTC days the batch touches (a literal partition
predicate: the MERGE reads only those days, and conflicts only with commits to them). Required
and computed columns take the batch's value; an optional column left null keeps the stored
one (COALESCE), so several producers can fill one reading. A matched row is rewritten only when
a value differs, so re-ingesting identical rows changes nothing.
"""

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.operations import OPERATION_KEY, Operation
from rollup_assets.model.specs import DAY_COLUMN, RawArchiveSpec, TimeRangeArchiveSpec, key_columns


@dataclass(frozen=True)
class UpsertClauses:
    predicate: str  # the MERGE condition (target alias `t`, source alias `s`)
    updates: dict[str, str]  # column -> SQL expression of a matched row's new value
    differs: str  # SQL condition: the matched row changes


def upsert_clauses(
    spec: RawArchiveSpec | TimeRangeArchiveSpec, days: Sequence[dt.date]
) -> UpsertClauses:
    """The upsert of a batch whose rows fall on the UTC `days`, in SQL both engines take."""
    listed = ",".join(f"'{d.isoformat()}'" for d in days)
    keys = key_columns(spec)
    predicate = " AND ".join([f"t.{DAY_COLUMN} IN ({listed})", *[f"t.{k} = s.{k}" for k in keys]])
    # A computed column always takes the batch's value: it was evaluated over the row the
    # upsert leaves (see `with_stored_operands`), and null is a value it may have.
    takes_batch = {c.name for c in spec.columns if c.required or c.is_computed}
    updates = {
        c.name: f"s.{c.name}" if c.name in takes_batch else f"COALESCE(s.{c.name}, t.{c.name})"
        for c in spec.columns
    }
    differs = " OR ".join(
        f"(s.{c.name} IS DISTINCT FROM t.{c.name})"
        if c.name in takes_batch
        else f"(s.{c.name} IS NOT NULL AND s.{c.name} IS DISTINCT FROM t.{c.name})"
        for c in spec.columns
    )
    return UpsertClauses(predicate, updates, differs)


def ingest_metadata(
    change_source: ChangeSource,
    rows: int,
    min_ts: dt.datetime,
    max_ts: dt.datetime,
    file: str | None,
    *,
    written_by: str | None = None,
) -> dict[str, str]:
    """What an ingest's commit records: change detection classifies its rows by the source, and
    skips reading it for windows outside [min_ts, max_ts]; the file it read, and who wrote it
    (a run and asset), when known."""
    metadata = {
        OPERATION_KEY: Operation.INGEST,
        "rollups.change_source": change_source.value,
        "rollups.rows": str(rows),
        "rollups.min_ts": min_ts.isoformat(),
        "rollups.max_ts": max_ts.isoformat(),
    }
    if file is not None:
        metadata["rollups.file"] = file
    if written_by is not None:
        metadata["rollups.written_by"] = written_by
    return metadata
