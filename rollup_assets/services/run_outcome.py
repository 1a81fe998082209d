"""What one rollup run did, as the forward and recompute lanes report it: to the chain that
carries its changes up within the run, and to the Dagster asset that records it."""

from dataclasses import dataclass, field
from typing import Any

from rollup_assets.model.jobs import Job
from rollup_assets.model.windows import Window


@dataclass(frozen=True)
class RunOutcome:
    """What one rollup run did. `buckets` are the buckets it wrote (empty for a no-op)."""

    job: Job
    buckets: list[Window]
    rows: int = 0
    generation: int | None = None
    version: int | None = None
    source_versions: dict[str, int] = field(default_factory=dict)
    duration_ms: int = 0
    note: str = ""
    propagated: list[Job] = field(default_factory=list)  # pending jobs it queued one level up
    # The source rows a correction applied (`services.correction.SourceChange`), for the level
    # above in the same run.
    change: Any = None
