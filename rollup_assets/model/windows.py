"""Half-open UTC time windows and the instants that bound them.

All instants passed in and out are aware `datetime`s in UTC; windows are half-open `[start, end)`.
"""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from rollup_assets.model.errors import InvalidTimeRangeError

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def micros(t: datetime) -> int:
    """Microseconds since the Unix epoch: an instant as Arrow stores a `timestamp[us]`."""
    return (t - EPOCH) // timedelta(microseconds=1)


@dataclass(frozen=True, order=True)
class Window:
    """A half-open UTC interval `[start, end)`."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        if self.start.tzinfo is None or self.end.tzinfo is None:
            raise ValueError("Window bounds must be timezone-aware")

    def overlaps(self, other: "Window") -> bool:
        return self.start < other.end and other.start < self.end

    def __str__(self) -> str:
        return f"[{iso_utc(self.start)}, {iso_utc(self.end)})"


def iso_utc(t: datetime) -> str:
    """ISO-8601 in UTC with a `Z` suffix, seconds precision unless there are fractions."""
    t = t.astimezone(UTC)
    text = t.isoformat(timespec="microseconds" if t.microsecond else "seconds")
    return text.replace("+00:00", "Z")


def as_utc(t: datetime) -> datetime:
    """Normalize: naive means UTC, aware is converted."""
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def merge_windows(windows: "list[Window] | set[Window]") -> list[Window]:
    """Union of windows as sorted, disjoint, non-adjacent intervals."""
    out: list[Window] = []
    for w in sorted(windows):
        if out and w.start <= out[-1].end:
            if w.end > out[-1].end:
                out[-1] = Window(out[-1].start, w.end)
        else:
            out.append(w)
    return out


def parse_instant(text: str, what: str = "time") -> datetime:
    """ISO-8601 date or date-time; naive means UTC. Raises InvalidTimeRangeError with the value."""
    try:
        t = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InvalidTimeRangeError(
            f"{what} {text!r} is not an ISO-8601 date or date-time"
        ) from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


FAR_PAST = datetime(1, 1, 2)
FAR_FUTURE = datetime(9999, 12, 30)


def span(start: datetime | None, end: datetime | None) -> "Window":
    """[start, end) as a window, an open bound reaching as far as any instant goes."""
    return Window(as_utc(start or FAR_PAST), as_utc(end or FAR_FUTURE))
