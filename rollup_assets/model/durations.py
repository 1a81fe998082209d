"""Parsing of durations written in specs and on the command line ("15m", "1h", "PT1H", "0s").

Counts are ASCII digits (`numbers.WHOLE`), and a duration too long for a `timedelta` (about
2.7 million years), or a non-finite number of seconds, is refused like any other bad text.
"""

import math
import re
from datetime import timedelta

from rollup_assets.model.numbers import WHOLE, whole_number

# Matched whole (`fullmatch`), never with `$`, which also matches before a trailing newline.
_SHORT = re.compile(rf"\s*({WHOLE})\s*(ms|s|sec|m|min|h|d|w)\s*", re.IGNORECASE)
_ISO = re.compile(
    rf"P(?:(?P<w>{WHOLE})W)?(?:(?P<d>{WHOLE})D)?"
    rf"(?:T(?:(?P<h>{WHOLE})H)?(?:(?P<m>{WHOLE})M)?(?:(?P<s>{WHOLE})S)?)?",
    re.IGNORECASE,
)
_UNITS = {
    "ms": timedelta(milliseconds=1),
    "s": timedelta(seconds=1),
    "sec": timedelta(seconds=1),
    "m": timedelta(minutes=1),
    "min": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "d": timedelta(days=1),
    "w": timedelta(weeks=1),
}


def parse_duration(value: object) -> timedelta:
    """Parse `15m`, `1h`, `2d`, `PT15M`, or a number of seconds. Raises ValueError."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    try:
        return _duration(value)
    except OverflowError:
        raise ValueError(f"duration {value!r} is too long") from None


def _duration(value: object) -> timedelta:
    if isinstance(value, int | float):
        if not math.isfinite(value):  # YAML's .inf and .nan
            raise ValueError(f"duration {value!r} is not a finite number of seconds")
        if value < 0:
            raise ValueError(f"duration {value!r} is negative")
        return timedelta(seconds=value)
    text = str(value).strip()
    m = _SHORT.fullmatch(text)
    if m:
        return whole_number(m.group(1)) * _UNITS[m.group(2).lower()]
    m = _ISO.fullmatch(text)
    if m and any(m.groupdict().values()):
        g = {k: whole_number(v or "0") for k, v in m.groupdict().items()}
        return timedelta(weeks=g["w"], days=g["d"], hours=g["h"], minutes=g["m"], seconds=g["s"])
    raise ValueError(f"{value!r} is not a duration (use e.g. 15m, 1h, 1d or ISO-8601 PT1H)")


def format_duration(d: timedelta) -> str:
    secs = int(d.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs and secs % size == 0:
            return f"{secs // size}{unit}"
    return f"{secs}s"
