"""The ledger: recompute jobs (pending work and history) and change-detection cursors.

One append-only Delta table holds two kinds of rows:
  * `job`    - a snapshot of a job after each state change; the job's state is its newest
               event, except that the first terminal state (Completed, Failed, Coalesced) sticks.
  * `cursor` - how far change detection has read a source table (its Delta version).
Pending jobs *are* the pending recompute ranges. Because a detection commit writes its jobs and
its cursor together, and a completing run writes `Completed` together with the jobs it causes
for the level above, a crash between steps can neither lose nor duplicate work.
"""

import dataclasses
import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

import pyarrow as pa

from resources.control_tables import ControlTable
from resources.warehouse import Warehouse
from rollup_assets.partitions import Window, iso_utc, merge_windows

TS = pa.timestamp("us", tz="UTC")


class Trigger(StrEnum):
    FORWARD = "Forward"
    OPEN_BUCKET = "OpenBucket"
    MANUAL = "Manual"
    PERIODIC = "Periodic"
    CHAIN = "ChainPropagation"


class JobState(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SWAPPING = "Swapping"
    COMPLETED = "Completed"
    FAILED = "Failed"
    COALESCED = "Coalesced"

    @property
    def terminal(self) -> bool:
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.COALESCED)

    @property
    def active(self) -> bool:
        return self in (JobState.RUNNING, JobState.SWAPPING)


class ChangeKind(StrEnum):
    APPEND = "Append"
    RETROACTIVE_MODIFY = "RetroactiveModify"


class ChangeSource(StrEnum):
    MANUAL = "Manual"
    PIPELINE = "Pipeline"
    IMPORT = "Import"


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
    ]
)


def new_job_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass(frozen=True)
class Job:
    rollup: str
    trigger: Trigger
    windows: tuple[Window, ...]
    entities: frozenset[str] | None = None  # None: every entity
    state: JobState = JobState.PENDING
    job_id: str = field(default_factory=new_job_id)
    seq: int = 0
    generation: int | None = None
    windows_processed: int | None = None
    rows_processed: int | None = None
    source_archive: str | None = None
    source_version: int | None = None
    change_kind: ChangeKind | None = None
    change_source: ChangeSource | None = None
    coalesced_into: str | None = None
    run_id: str | None = None
    error: str | None = None
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    started_at: datetime | None = None
    finished_at: datetime | None = None
    duration_ms: int | None = None

    def next(self, **changes: object) -> "Job":
        """This job after a state change (the next event of it)."""
        return dataclasses.replace(self, seq=self.seq + 1, **changes)  # type: ignore[arg-type]

    @property
    def span(self) -> Window | None:
        if not self.windows:
            return None
        return Window(min(w.start for w in self.windows), max(w.end for w in self.windows))

    def as_row(self) -> dict:
        return {
            "kind": "job",
            "job_id": self.job_id,
            "seq": self.seq,
            "rollup": self.rollup,
            "trigger": self.trigger.value,
            "state": self.state.value,
            "windows": encode_windows(self.windows),
            "entities": None if self.entities is None else json.dumps(sorted(self.entities)),
            "generation": self.generation,
            "windows_processed": self.windows_processed,
            "rows_processed": self.rows_processed,
            "source_archive": self.source_archive,
            "source_version": self.source_version,
            "change_kind": self.change_kind.value if self.change_kind else None,
            "change_source": self.change_source.value if self.change_source else None,
            "coalesced_into": self.coalesced_into,
            "run_id": self.run_id,
            "error": self.error,
            "created_at": self.created_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "duration_ms": self.duration_ms,
            "recorded_at": datetime.now(UTC),
        }


def encode_windows(windows: Iterable[Window]) -> str:
    return json.dumps([[iso_utc(w.start), iso_utc(w.end)] for w in merge_windows(list(windows))])


def decode_windows(text: str | None) -> tuple[Window, ...]:
    if not text:
        return ()
    return tuple(
        Window(
            datetime.fromisoformat(a.replace("Z", "+00:00")),
            datetime.fromisoformat(b.replace("Z", "+00:00")),
        )
        for a, b in json.loads(text)
    )


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
    )


@dataclass(frozen=True)
class LedgerSnapshot:
    jobs: dict[str, Job]
    cursors: dict[str, int]

    def for_rollup(self, rollup: str) -> list[Job]:
        return sorted(
            (j for j in self.jobs.values() if j.rollup == rollup), key=lambda j: j.created_at
        )

    def pending(self, rollup: str) -> list[Job]:
        return [j for j in self.for_rollup(rollup) if j.state is JobState.PENDING]

    def active(self, rollup: str) -> list[Job]:
        return [j for j in self.for_rollup(rollup) if j.state.active]


class Ledger:
    def __init__(self, warehouse: Warehouse) -> None:
        self.table = ControlTable(
            warehouse.control_path("ledger"), LEDGER_SCHEMA, warehouse.storage_options
        )
        self._parsed: tuple[pa.Table, LedgerSnapshot] | None = None

    def snapshot(self) -> LedgerSnapshot:
        data = self.table.read()
        parsed = self._parsed
        if parsed is not None and parsed[0] is data:  # the same table version as last time
            return LedgerSnapshot(dict(parsed[1].jobs), dict(parsed[1].cursors))
        jobs: dict[str, Job] = {}
        cursors: dict[str, int] = {}
        rows = data.sort_by([("recorded_at", "ascending"), ("seq", "ascending")]).to_pylist()
        for row in rows:
            if row["kind"] == "cursor":
                src = row["source_archive"]
                cursors[src] = max(cursors.get(src, -1), row["source_version"])
                continue
            prev = jobs.get(row["job_id"])
            if prev is not None and prev.state.terminal:
                continue  # the first terminal state sticks
            jobs[row["job_id"]] = _job_from_row(row)
        self._parsed = (data, LedgerSnapshot(jobs, cursors))
        return LedgerSnapshot(dict(jobs), dict(cursors))

    def record(self, jobs: Sequence[Job] = (), cursors: dict[str, int] | None = None) -> None:
        """Write job events and cursor moves in one commit."""
        now = datetime.now(UTC)
        rows = [j.as_row() for j in jobs]
        for source, version in (cursors or {}).items():
            row: dict[str, object] = {name: None for name in LEDGER_SCHEMA.names}
            row.update(
                kind="cursor", source_archive=source, source_version=version, recorded_at=now
            )
            rows.append(row)
        self.table.append(rows)

    def job(self, job_id: str) -> Job | None:
        return self.snapshot().jobs.get(job_id)

    def history(self, rollup: str, limit: int = 50) -> list[Job]:
        jobs = self.snapshot().for_rollup(rollup)
        return sorted(jobs, key=lambda j: j.created_at, reverse=True)[:limit]
