"""Bucket alignment + reference zone -> the Dagster partitions definition of a rollup."""

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import dagster as dg

from rollup_assets.model.bucketing import first_bucket_start
from rollup_assets.model.specs import Alignment, RollupSpec
from rollup_assets.model.windows import Window, as_utc


def _fmt(spec: RollupSpec) -> str:
    if spec.alignment is Alignment.FIXED_SIZE:
        return "%Y-%m-%d-%H:%M"
    if spec.alignment is Alignment.CALENDAR_YEAR:
        return "%Y"
    return "%Y-%m-%d"


def _cron(spec: RollupSpec) -> str:
    if spec.alignment is Alignment.FIXED_SIZE:
        assert spec.size is not None
        minutes = int(spec.size.total_seconds() // 60)
        if minutes < 60:
            return f"*/{minutes} * * * *" if minutes > 1 else "* * * * *"
        hours = minutes // 60
        return "0 * * * *" if hours == 1 else f"0 */{hours} * * *"
    return {
        Alignment.CALENDAR_DAY: "0 0 * * *",
        Alignment.ISO8601_WEEK: "0 0 * * 1",
        Alignment.CALENDAR_MONTH: "0 0 1 * *",
        Alignment.CALENDAR_YEAR: "0 0 1 1 *",
    }[spec.alignment]


def partitions_def_for(spec: RollupSpec) -> dg.TimeWindowPartitionsDefinition:
    """Partitions = buckets in the reference zone; `end_offset=1` makes the open bucket a key."""
    zone = ZoneInfo(spec.reference_time_zone)
    return dg.TimeWindowPartitionsDefinition(
        # An instant, not a formatted key: a key in the repeated hour of a DST fall-back day
        # would be read as its first occurrence, one bucket too early.
        start=first_bucket_start(spec).astimezone(zone),
        fmt=_fmt(spec),
        cron_schedule=_cron(spec),
        timezone=spec.reference_time_zone,
        end_offset=1,
    )


def window_of_key(pdef: dg.TimeWindowPartitionsDefinition, key: str) -> Window:
    tw = pdef.time_window_for_partition_key(key)
    return Window(tw.start.astimezone(UTC), tw.end.astimezone(UTC))


def key_of_window(pdef: dg.TimeWindowPartitionsDefinition, start: datetime) -> str:
    return pdef.get_partition_key_for_timestamp(as_utc(start).timestamp())


def key_range_for(
    pdef: dg.TimeWindowPartitionsDefinition, windows: list[Window]
) -> dg.PartitionKeyRange:
    """The partition key range spanning the given bucket windows (their hull)."""
    lo = min(w.start for w in windows)
    hi = max(w.start for w in windows)
    return dg.PartitionKeyRange(key_of_window(pdef, lo), key_of_window(pdef, hi))
