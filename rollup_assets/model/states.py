"""Archive state: lifecycle status, watermark, forward claim and freeze (UTC instants).

Lifecycle: Created -> Activated -> Disabled / Failed (-> Activated again), and Deleted.
"""

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class ArchiveStatus(StrEnum):
    CREATED = "Created"
    ACTIVATED = "Activated"
    DISABLED = "Disabled"
    FAILED = "Failed"
    DELETED = "Deleted"


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
    # Retention has dropped everything before this instant: every UTC day before this midnight
    # (raw and time-range archives), every bucket before this bucket boundary (rollups).
    retained_from: datetime | None = None
    # An operator action of several commits under way (`model.intents`), encoded; None: none.
    intent: str | None = None
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
