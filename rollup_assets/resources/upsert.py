"""The upsert an ingest commits, whichever engine runs its MERGE (delta-rs on the driver,
delta-spark on the executors): its match condition, the update of a matched row, when a matched
row counts as changed, and the metadata its commit records.

Keyed by (entity_id, time), and only within the UTC days the batch touches (a literal partition
predicate: the MERGE reads only those days, and conflicts only with commits to them) and, within
each day, the batch's entities there (listed, or their range): raw files are sorted by entity,
so their statistics let the MERGE skip every file of a day that holds none of them, and its
memory and time follow the files it rewrites, not the days it touches. Required
and computed columns take the batch's value; an optional column left null keeps the stored
one (COALESCE), so several producers can fill one reading. A matched row is rewritten only when
a value differs, so re-ingesting identical rows changes nothing.
"""

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.operations import OPERATION_KEY, Operation
from rollup_assets.model.specs import (
    DAY_COLUMN,
    ENTITY_COLUMN,
    RawArchiveSpec,
    TimeRangeArchiveSpec,
    key_columns,
)
from rollup_assets.resources.batches import DayEntities

# Delta-rs skips a file by its statistics for an IN list of at most this many values (longer
# lists are not rewritten into comparisons): longer lists are cut into lists of this size.
PRUNABLE_IN_LIST = 20


@dataclass(frozen=True)
class UpsertClauses:
    predicate: str  # the MERGE condition (target alias `t`, source alias `s`)
    updates: dict[str, str]  # column -> SQL expression of a matched row's new value
    differs: str  # SQL condition: the matched row changes


def upsert_clauses(
    spec: RawArchiveSpec | TimeRangeArchiveSpec,
    days: Sequence[dt.date],
    cells: Sequence[DayEntities] = (),
) -> UpsertClauses:
    """The upsert of a batch whose rows fall on the UTC `days`, in SQL both engines take;
    with the batch's entities per day (`cells`), only the target rows of those entities on
    those days are read."""
    listed = ",".join(f"'{d.isoformat()}'" for d in days)
    keys = key_columns(spec)
    narrowed = [_any_of([_day_cells(c) for c in cells])] if cells else []
    predicate = " AND ".join(
        [f"t.{DAY_COLUMN} IN ({listed})", *narrowed, *[f"t.{k} = s.{k}" for k in keys]]
    )
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


def _day_cells(cells: DayEntities) -> str:
    """The target rows of `cells`'s entities on its day (every row of the day when an entity
    cannot be written as a literal both engines read alike)."""
    day = f"t.{DAY_COLUMN} = '{cells.day.isoformat()}'"
    names = cells.listed if cells.listed is not None else (cells.lowest, cells.highest)
    if any("\\" in n for n in names):
        return day
    if cells.listed is None:
        lo, hi = _literal(cells.lowest), _literal(cells.highest)
        return f"({day} AND t.{ENTITY_COLUMN} BETWEEN {lo} AND {hi})"
    chunks = [
        cells.listed[i : i + PRUNABLE_IN_LIST]
        for i in range(0, len(cells.listed), PRUNABLE_IN_LIST)
    ]
    lists = [f"t.{ENTITY_COLUMN} IN ({', '.join(map(_literal, c))})" for c in chunks]
    return f"({day} AND {_any_of(lists)})"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _any_of(terms: Sequence[str]) -> str:
    """`terms` joined by OR as a balanced tree: its depth grows with the log of their number,
    so thousands of terms parse and plan without deep recursion."""
    if len(terms) == 1:
        return terms[0]
    mid = len(terms) // 2
    return f"({_any_of(terms[:mid])} OR {_any_of(terms[mid:])})"


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
