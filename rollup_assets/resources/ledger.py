"""The ledger table: recompute jobs (pending work and history) and change-detection cursors.

One append-only Delta table holds two kinds of rows:
  * `job`    - a snapshot of a job after each state change (folded by `model.jobs.fold`);
  * `cursor` - how far change detection has read a source table (its Delta version).
Because a detection commit writes its jobs and its cursor together, and a completing run writes
`Completed` together with the jobs it causes for the level above, a crash between steps can
neither lose nor duplicate work.
"""

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc

from rollup_assets import metrics
from rollup_assets.compute.arrow_types import TS
from rollup_assets.model.cells import Cells
from rollup_assets.model.jobs import (
    ChangeKind,
    ChangePart,
    ChangeSource,
    CursorMove,
    Job,
    JobState,
    Lane,
    LedgerSnapshot,
    Trigger,
    cursor_moves,
    fold,
)
from rollup_assets.model.windows import Window, iso_utc, merge_windows
from rollup_assets.resources.control_tables import ControlTable
from rollup_assets.resources.warehouse import Warehouse

LEDGER_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("job_id", pa.string()),
        ("seq", pa.int64()),
        ("rollup", pa.string()),
        ("trigger", pa.string()),
        ("state", pa.string()),
        ("windows", pa.string()),
        ("entities", pa.string()),
        ("generation", pa.int64()),
        ("windows_processed", pa.int64()),
        ("rows_processed", pa.int64()),
        ("source_archive", pa.string()),
        ("source_version", pa.int64()),
        ("change_kind", pa.string()),
        ("change_source", pa.string()),
        ("coalesced_into", pa.string()),
        ("run_id", pa.string()),
        ("error", pa.string()),
        ("created_at", TS),
        ("started_at", TS),
        ("finished_at", TS),
        ("duration_ms", pa.int64()),
        ("recorded_at", TS),
        # Cursor rows: the Delta id of the source table the cursor was read on.
        ("table_id", pa.string()),
        # Job rows: per bucket, the entities covered, when narrower than windows x entities.
        ("cells", pa.string()),
        ("technique", pa.string()),
        ("source_rows", pa.int64()),
        ("cells_changed", pa.int64()),
        ("cells_skipped", pa.int64()),
        ("plan", pa.string()),
        ("change_rows", pa.int64()),
        ("cells_applied", pa.int64()),
        # Rollback job rows: the job whose flip it undid.
        ("undoes", pa.string()),
        # Job rows: which attempt at the work, when a retry may start, and whether the work was
        # given up (its last attempt failed).
        ("attempt", pa.int64()),
        ("not_before", TS),
        ("gave_up", pa.bool_()),
        # Corrections: the parts of their work (source commits, and the first-level cells whose
        # rows they changed); jobs that aggregate from their source: the source version read.
        ("parts", pa.string()),
        ("read_version", pa.int64()),
    ]
)


def job_row(job: Job) -> dict:
    return {
        "kind": "job",
        "job_id": job.job_id,
        "seq": job.seq,
        "rollup": job.rollup,
        "trigger": job.trigger.value,
        "state": job.state.value,
        "windows": _encoded_windows(tuple(job.windows)),
        "entities": None if job.entities is None else json.dumps(sorted(job.entities)),
        "generation": job.generation,
        "windows_processed": job.windows_processed,
        "rows_processed": job.rows_processed,
        "source_archive": job.source_archive,
        "source_version": job.source_version,
        "change_kind": job.change_kind.value if job.change_kind else None,
        "change_source": job.change_source.value if job.change_source else None,
        "coalesced_into": job.coalesced_into,
        "run_id": job.run_id,
        "error": job.error,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "duration_ms": job.duration_ms,
        "recorded_at": datetime.now(UTC),
        "cells": None if job.cells is None else _encoded_cells(job.cells),
        "technique": job.technique,
        "source_rows": job.source_rows,
        "cells_changed": job.cells_changed,
        "cells_skipped": job.cells_skipped,
        "plan": job.plan,
        "change_rows": job.change_rows,
        "cells_applied": job.cells_applied,
        "undoes": job.undoes,
        "attempt": job.attempt,
        "not_before": job.not_before,
        "gave_up": job.gave_up,
        "parts": None if job.parts is None else _encoded_parts(job.parts),
        "read_version": job.read_version,
    }


def encode_cells(cells: Cells) -> str:
    """[[entities or null, [[start, end], ...]], ...]: the buckets of each scope as merged spans
    (`placement.cells_of` expands them to buckets again)."""
    return json.dumps(_cell_lists(cells))


def _cell_lists(cells: Cells) -> list:
    return [
        [None if scope is None else sorted(scope), _window_pairs(windows)]
        for scope, windows in cells.groups()
    ]


@functools.lru_cache(maxsize=32)
def decode_cells(text: str | None) -> Cells | None:
    if not text:
        return None
    return _cells_of_lists(json.loads(text))


def _cells_of_lists(lists: list) -> Cells:
    """`decode_cells` of the parsed text."""
    by_window: dict[Window, frozenset[str] | None] = {}
    for scope, spans in lists:
        entities = None if scope is None else frozenset(scope)
        for w in _windows(spans):
            by_window[w] = entities
    return Cells(tuple(sorted(by_window.items(), key=lambda item: item[0])))


# A job is recorded at each of its states with the same windows and cells, and read back once
# per record: the last few encodings and decodings are kept (they are immutable).
@functools.lru_cache(maxsize=32)
def _encoded_cells(cells: Cells) -> str:
    return encode_cells(cells)


@functools.lru_cache(maxsize=32)
def _encoded_windows(windows: tuple[Window, ...]) -> str:
    return encode_windows(windows)


def encode_windows(windows: Iterable[Window]) -> str:
    return json.dumps(_window_pairs(windows))


def _window_pairs(windows: Iterable[Window]) -> list[list[str]]:
    return [[_iso(w.start), _iso(w.end)] for w in merge_windows(list(windows))]


# A correction's cells name the same few thousand bucket bounds in every job it records.
_iso = functools.lru_cache(maxsize=65_536)(iso_utc)


@functools.lru_cache(maxsize=32)
def decode_windows(text: str | None) -> tuple[Window, ...]:
    if not text:
        return ()
    return _windows(json.loads(text))


def _windows(pairs: list[list[str]]) -> tuple[Window, ...]:
    return tuple(Window(_instant(a), _instant(b)) for a, b in pairs)


@functools.lru_cache(maxsize=65_536)
def _instant(text: str) -> datetime:
    """An encoded bucket boundary (the same few thousand recur across every job's cells)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _job_from_row(row: dict) -> Job:
    return Job(
        rollup=row["rollup"],
        trigger=Trigger(row["trigger"]),
        windows=decode_windows(row["windows"]),
        entities=None if row["entities"] is None else frozenset(json.loads(row["entities"])),
        state=JobState(row["state"]),
        job_id=row["job_id"],
        seq=row["seq"],
        generation=row["generation"],
        windows_processed=row["windows_processed"],
        rows_processed=row["rows_processed"],
        source_archive=row["source_archive"],
        source_version=row["source_version"],
        change_kind=ChangeKind(row["change_kind"]) if row["change_kind"] else None,
        change_source=ChangeSource(row["change_source"]) if row["change_source"] else None,
        coalesced_into=row["coalesced_into"],
        run_id=row["run_id"],
        error=row["error"],
        created_at=row["created_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        duration_ms=row["duration_ms"],
        cells=decode_cells(row.get("cells")),
        technique=row.get("technique"),
        source_rows=row.get("source_rows"),
        cells_changed=row.get("cells_changed"),
        cells_skipped=row.get("cells_skipped"),
        plan=row.get("plan"),
        change_rows=row.get("change_rows"),
        cells_applied=row.get("cells_applied"),
        undoes=row.get("undoes"),
        attempt=row.get("attempt") or 1,
        not_before=row.get("not_before"),
        gave_up=bool(row.get("gave_up")),
        parts=_decoded_parts(row.get("parts")),
        read_version=row.get("read_version"),
    )


@functools.lru_cache(maxsize=32)
def _encoded_parts(parts: tuple[ChangePart, ...]) -> str:
    return json.dumps([[list(p.commits), _cell_lists(p.cells), p.seen_at] for p in parts])


@functools.lru_cache(maxsize=1024)
def _decoded_parts(text: str | None) -> tuple[ChangePart, ...] | None:
    if text is None:
        return None
    out = []
    for commits, cells, seen_at in json.loads(text):
        part = ChangePart(tuple(commits), _cells_of_lists(cells) if cells else Cells(), seen_at)
        out.append(part)
    return tuple(out)


def _in_order(rows: pa.Table) -> list[dict]:
    """Ledger rows in recording order."""
    return rows.sort_by([("recorded_at", "ascending"), ("seq", "ascending")]).to_pylist()


def _newest(rows: pa.Table) -> datetime | None:
    return pc.max(rows["recorded_at"]).as_py() if rows.num_rows else None


def _copy(snapshot: LedgerSnapshot) -> LedgerSnapshot:
    return LedgerSnapshot(dict(snapshot.jobs), dict(snapshot.cursors), dict(snapshot.tables))


class Ledger:
    def __init__(self, warehouse: Warehouse) -> None:
        self.table = ControlTable(
            warehouse.control_path("ledger"), LEDGER_SCHEMA, warehouse.storage_options
        )
        # The rows last folded, their snapshot and the newest `recorded_at` among them.
        self._parsed: tuple[pa.Table, LedgerSnapshot, datetime | None] | None = None
        self._decoded: dict[tuple, Job] = {}

    def snapshot(self) -> LedgerSnapshot:
        data = self.table.read()
        parsed = self._parsed
        if parsed is not None and parsed[0] is data:  # the same table version as last time
            return _copy(parsed[1])
        if parsed is not None:
            # Rows appended since the last fold, all recorded after every row folded then, fold
            # onto that snapshot: the fold is the same as over every row in recording order.
            added = self.table.appended_since(data, parsed[0])
            newest = parsed[2]
            if added is not None and (
                newest is None
                or not added.num_rows
                or pc.min(added["recorded_at"]).as_py() > newest
            ):
                snapshot = self._fold(_in_order(added), onto=parsed[1])
                self._parsed = (data, snapshot, _newest(added) or newest)
                return _copy(snapshot)
        # A job event is decoded once (its cells can name thousands of windows): a row already
        # seen, field for field, maps to the same immutable Job.
        self._decoded, known = {}, self._decoded
        snapshot = self._fold(_in_order(data), known=known)
        self._parsed = (data, snapshot, _newest(data))
        return _copy(snapshot)

    def _fold(
        self,
        rows: list[dict],
        onto: LedgerSnapshot | None = None,
        known: dict[tuple, Job] | None = None,
    ) -> LedgerSnapshot:
        known = self._decoded if known is None else known
        events = []
        for r in rows:
            if r["kind"] == "cursor":
                continue
            key = tuple(r.values())
            job = known.get(key) or _job_from_row(r)
            self._decoded[key] = job
            events.append(job)
        moves = (
            CursorMove(r["source_archive"], r["source_version"], r["table_id"])
            for r in rows
            if r["kind"] == "cursor"
        )
        return fold(events, moves, onto=onto)

    def record(
        self,
        jobs: Sequence[Job] = (),
        cursors: Mapping[str, int] | None = None,
        *,
        tables: Mapping[str, str | None] | None = None,
        forget: Iterable[str] = (),
    ) -> None:
        """Write job events and cursor moves in one commit: `cursors` (read on the tables
        `tables` names), and the cursors of the sources in `forget` dropped."""
        now = datetime.now(UTC)
        rows = [job_row(j) for j in jobs]
        for move in cursor_moves(cursors, tables, forget):
            row: dict[str, object] = {name: None for name in LEDGER_SCHEMA.names}
            row.update(
                kind="cursor",
                source_archive=move.source,
                source_version=move.version,
                table_id=move.table_id,
                recorded_at=now,
            )
            rows.append(row)
        self.table.append(rows)
        metrics.jobs_recorded(jobs)

    def job(self, job_id: str) -> Job | None:
        return self.snapshot().jobs.get(job_id)

    def history(self, rollup: str, limit: int = 50, lane: Lane | None = None) -> list[Job]:
        """The rollup's newest `limit` jobs, newest first (of `lane` only, if given)."""
        jobs = [
            j for j in self.snapshot().for_rollup(rollup) if lane is None or j.trigger.lane is lane
        ]
        return sorted(jobs, key=lambda j: j.created_at, reverse=True)[:limit]
