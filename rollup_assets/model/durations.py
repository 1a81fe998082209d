"""Parsing of durations written in specs and on the command line ("15m", "1h", "PT1H", "0s")."""

import re
from datetime import timedelta

# Matched whole (`fullmatch`), never with `$`, which also matches before a trailing newline.
_SHORT = re.compile(r"\s*(\d+)\s*(ms|s|sec|m|min|h|d|w)\s*", re.IGNORECASE)
_ISO = re.compile(
    r"P(?:(?P<w>\d+)W)?(?:(?P<d>\d+)D)?(?:T(?:(?P<h>\d+)H)?(?:(?P<m>\d+)M)?(?:(?P<s>\d+)S)?)?",
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
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"duration {value!r} is negative")
        return timedelta(seconds=value)
    text = str(value).strip()
    m = _SHORT.fullmatch(text)
    if m:
        return int(m.group(1)) * _UNITS[m.group(2).lower()]
    m = _ISO.fullmatch(text)
    if m and any(m.groupdict().values()):
        g = {k: int(v or 0) for k, v in m.groupdict().items()}
        return timedelta(weeks=g["w"], days=g["d"], hours=g["h"], minutes=g["m"], seconds=g["s"])
    raise ValueError(f"{value!r} is not a duration (use e.g. 15m, 1h, 1d or ISO-8601 PT1H)")


def format_duration(d: timedelta) -> str:
    secs = int(d.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs and secs % size == 0:
            return f"{secs // size}{unit}"
    return f"{secs}s"
