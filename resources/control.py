"""Archive state: lifecycle status, watermark, forward claim and freeze, kept in the warehouse.

Each change appends a full snapshot row for the archive with the next sequence number, committed
as a compare-and-set on `archive:<name>`; the newest row is the state, older rows are the audit
trail. Times are aware UTC datetimes.
"""

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

import pyarrow as pa

from resources.control_tables import CompareAndSetConflict, ControlTable
from resources.warehouse import Warehouse

log = logging.getLogger(__name__)
TS = pa.timestamp("us", tz="UTC")


class ArchiveStatus(StrEnum):
    CREATED = "Created"
    ACTIVATED = "Activated"
    DISABLED = "Disabled"
    FAILED = "Failed"
    DELETED = "Deleted"


STATE_SCHEMA = pa.schema(
    [
        ("archive", pa.string()),
        ("seq", pa.int64()),
        ("status", pa.string()),
        ("watermark", TS),
        ("claimed_until", TS),
        ("frozen_until", TS),
        ("accept_gaps", pa.bool_()),
        ("fingerprint", pa.string()),
        ("activated_at", TS),
        ("reason", pa.string()),
        ("changed_by", pa.string()),
        ("changed_at", TS),
    ]
)


@dataclass(frozen=True)
class ArchiveState:
    archive: str
    seq: int = 0
    status: ArchiveStatus = ArchiveStatus.CREATED
    watermark: datetime | None = None  # last_aggregated_bucket_end (rollups)
    claimed_until: datetime | None = None  # end of the range a forward run is aggregating
    frozen_until: datetime | None = None
    accept_gaps: bool | None = None
    fingerprint: str | None = None
    activated_at: datetime | None = None
    reason: str = "declared"
    changed_by: str = ""
    changed_at: datetime | None = None

    @property
    def consumed_until(self) -> datetime | None:
        """The invalidation threshold: a source write before it is retroactive for this rollup.

        It includes a forward claim, so a write racing an in-flight forward run is never lost.
        """
        marks = [t for t in (self.watermark, self.claimed_until) if t is not None]
        return max(marks) if marks else None

    def is_frozen(self, bucket_end: datetime) -> bool:
        return self.frozen_until is not None and bucket_end <= self.frozen_until

    def as_row(self) -> dict:
        d = dataclasses.asdict(self)
        d["status"] = self.status.value
        return d


def _state_from_row(row: dict) -> ArchiveState:
    return ArchiveState(**{**row, "status": ArchiveStatus(row["status"])})


class ArchiveStateStore:
    """Read and change archive states with optimistic concurrency."""

    def __init__(self, warehouse: Warehouse) -> None:
        self.table = ControlTable(
            warehouse.control_path("archives"), STATE_SCHEMA, warehouse.storage_options
        )
        self._parsed: tuple[pa.Table, dict[str, ArchiveState]] | None = None

    def all(self) -> dict[str, ArchiveState]:
        data = self.table.read()
        parsed = self._parsed
        if parsed is not None and parsed[0] is data:  # the same table version as last time
            return dict(parsed[1])
        latest: dict[str, dict] = {}
        for row in data.sort_by([("archive", "ascending"), ("seq", "ascending")]).to_pylist():
            latest[row["archive"]] = row
        states = {name: _state_from_row(r) for name, r in latest.items()}
        self._parsed = (data, states)
        return dict(states)

    def get(self, archive: str) -> ArchiveState:
        return self.all().get(archive) or ArchiveState(archive)

    def history(self, archive: str) -> list[ArchiveState]:
        data = self.table.read(filter=[("archive", "=", archive)])  # type: ignore[arg-type]
        rows = data.sort_by([("seq", "ascending")]).to_pylist()
        return [_state_from_row(r) for r in rows]

    def update(
        self,
        archive: str,
        change: Callable[[ArchiveState], ArchiveState | None],
        *,
        reason: str,
        actor: str = "",
        attempts: int = 20,
    ) -> ArchiveState:
        """Apply `change` to the current state and commit it as the next sequence number.

        `change` may raise to refuse the transition, or return None for "nothing to do". On a
        concurrent change it is called again with the fresh state.
        """
        for _ in range(attempts):
            current = self.get(archive)
            new = change(current)
            if new is None or new == current:
                return current
            new = dataclasses.replace(
                new,
                archive=archive,
                seq=current.seq + 1,
                reason=reason,
                changed_by=actor,
                changed_at=datetime.now(UTC),
            )
            try:
                self.table.append([new.as_row()], cas=(f"archive:{archive}", new.seq))
                return new
            except CompareAndSetConflict:
                log.debug("state of %s changed concurrently; re-reading", archive)
                time.sleep(0.01)
        raise RuntimeError(f"could not update the state of '{archive}': too much contention")
