"""The clock of the forward lane.

`ROLLUPS_NOW` (ISO-8601) pins it, for tests and `rollups tick --now`.
"""

import os
from datetime import UTC, datetime

from rollup_assets.errors import InvalidTimeRangeError


def parse_instant(text: str, what: str = "time") -> datetime:
    """ISO-8601 date or date-time; naive means UTC. Raises InvalidTimeRangeError with the value."""
    try:
        t = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InvalidTimeRangeError(
            f"{what} {text!r} is not an ISO-8601 date or date-time"
        ) from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def now() -> datetime:
    pinned = os.environ.get("ROLLUPS_NOW")
    return parse_instant(pinned, "ROLLUPS_NOW") if pinned else datetime.now(UTC)
