"""The archive-state table: every archive's state, kept in the warehouse.

Each change appends a full snapshot row for the archive with the next sequence number, committed
as a compare-and-set on `archive:<name>`; the newest row is the state, older rows are the audit
trail.
"""

import dataclasses
import logging
from collections.abc import Callable
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc

from rollup_assets.compute.arrow_types import TS
from rollup_assets.model.states import ArchiveState, ArchiveStatus
from rollup_assets.resources.control_tables import CompareAndSetConflict, ControlTable
from rollup_assets.resources.delta_tables import with_retries
from rollup_assets.resources.warehouse import Warehouse

log = logging.getLogger(__name__)

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
        ("retained_from", TS),
        ("intent", pa.string()),
        ("reason", pa.string()),
        ("changed_by", pa.string()),
        ("changed_at", TS),
    ]
)


def state_row(state: ArchiveState) -> dict:
    d = dataclasses.asdict(state)
    d["status"] = state.status.value
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

    def deleted_at(self) -> dict[str, datetime]:
        """When each archive ever deleted was last deleted: its tables now were made after, and
        what read the tables it had before read other tables."""
        data = self.table.read()
        rows = data.filter(pc.equal(data["status"], ArchiveStatus.DELETED.value))
        out: dict[str, datetime] = {}
        for name, at in zip(
            rows["archive"].to_pylist(), rows["changed_at"].to_pylist(), strict=True
        ):
            if at is not None and (name not in out or at > out[name]):
                out[name] = at
        return out

    def history(self, archive: str) -> list[ArchiveState]:
        """Every state the archive has had, oldest first (who changed it, when and why)."""
        data = self.table.read()
        rows = data.filter(pc.equal(data["archive"], archive)).sort_by([("seq", "ascending")])
        return [_state_from_row(r) for r in rows.to_pylist()]

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

        def attempt() -> ArchiveState:
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
            self.table.append([state_row(new)], cas=(f"archive:{archive}", new.seq))
            return new

        try:
            return with_retries(
                attempt,
                retryable=lambda exc: isinstance(exc, CompareAndSetConflict),
                attempts=attempts,
                what=f"the state of '{archive}'",
                delay=0.01,
                backoff=False,
            )
        except CompareAndSetConflict:
            raise RuntimeError(
                f"could not update the state of '{archive}': too much contention"
            ) from None
