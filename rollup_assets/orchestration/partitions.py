"""Bucket alignment + reference zone -> the Dagster partitions definition of a rollup.

A calendar bucket is one partition. A FixedSize bucket is one partition when a cron schedule
can count it (15 minutes, 1 hour, 6 hours from the epoch), else a whole number of partitions of
the coarsest grid that can (`model.grid`: 30 minutes for 90-minute buckets, hours for two days
in Vienna). The partition keys of every rollup valid before that stay what they were.
"""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import dagster as dg

from rollup_assets.model.bucketing import first_bucket_start
from rollup_assets.model.grid import Grid, partition_grid, partition_starts, partitions_per_bucket
from rollup_assets.model.specs import Alignment, RollupSpec
from rollup_assets.model.windows import Window, as_utc

MICROSECOND = timedelta(microseconds=1)


def _fmt(spec: RollupSpec) -> str:
    if spec.alignment is Alignment.FIXED_SIZE:
        return "%Y-%m-%d-%H:%M"
    if spec.alignment is Alignment.CALENDAR_YEAR:
        return "%Y"
    return "%Y-%m-%d"


def cron_for(spec: RollupSpec) -> str:
    """The cron schedule (in the reference zone) the rollup's partitions start by."""
    if spec.alignment is Alignment.FIXED_SIZE:
        grid = partition_grid(spec)
        assert grid is not None, f"{spec.name}: no partition grid (the spec was not validated)"
        return grid_cron(grid)
    return {
        Alignment.CALENDAR_DAY: "0 0 * * *",
        Alignment.ISO8601_WEEK: "0 0 * * 1",
        Alignment.CALENDAR_MONTH: "0 0 1 * *",
        Alignment.CALENDAR_YEAR: "0 0 1 1 *",
    }[spec.alignment]


def grid_cron(grid: Grid) -> str:
    """The cron schedule (in local time) of a partition grid: `*/15 * * * *`, `0 */6 * * *`; a
    grid off the hour or off midnight lists its minutes or hours (`15,45 * * * *`,
    `30 5,17 * * *`)."""
    minutes = int(grid.step.total_seconds() // 60)
    phase = int(grid.local_phase.total_seconds() // 60)
    if minutes < 60:
        if phase:
            return f"{','.join(str(m) for m in range(phase, 60, minutes))} * * * *"
        return f"*/{minutes} * * * *" if minutes > 1 else "* * * * *"
    hours = minutes // 60
    hour, minute = divmod(phase, 60)
    if hour:
        return f"{minute} {','.join(str(h) for h in range(hour, 24, hours))} * * *"
    return f"{minute} * * * *" if hours == 1 else f"{minute} */{hours} * * *"


def partitions_def_for(spec: RollupSpec) -> dg.TimeWindowPartitionsDefinition:
    """Partitions = buckets (or a whole number per bucket) in the reference zone. Every
    partition of the open bucket exists: `end_offset` is the partitions of one bucket, so the
    partitions after the one holding the current time reach the open bucket's end."""
    zone = ZoneInfo(spec.reference_time_zone)
    return dg.TimeWindowPartitionsDefinition(
        # An instant, not a formatted key: a key in the repeated hour of a DST fall-back day
        # would be read as its first occurrence, one bucket too early.
        start=first_bucket_start(spec).astimezone(zone),
        fmt=_fmt(spec),
        cron_schedule=cron_for(spec),
        timezone=spec.reference_time_zone,
        end_offset=partitions_per_bucket(spec),
    )


def window_of_key(pdef: dg.TimeWindowPartitionsDefinition, key: str) -> Window:
    """The UTC window of one partition (a bucket, or a whole-number part of one)."""
    tw = pdef.time_window_for_partition_key(key)
    return Window(tw.start.astimezone(UTC), tw.end.astimezone(UTC))


def key_of_window(pdef: dg.TimeWindowPartitionsDefinition, start: datetime) -> str:
    """The key of the partition holding instant `start` (a bucket's start: its first key)."""
    return pdef.get_partition_key_for_timestamp(as_utc(start).timestamp())


def keys_of_bucket(
    spec: RollupSpec, pdef: dg.TimeWindowPartitionsDefinition, bucket: Window
) -> list[str]:
    """The keys of the partitions that make `bucket`, in order."""
    return [key_of_window(pdef, t) for t in partition_starts(spec, bucket)]


def key_range_for(
    pdef: dg.TimeWindowPartitionsDefinition, windows: list[Window]
) -> dg.PartitionKeyRange:
    """The partition key range spanning the given bucket windows (their hull): from the
    partition holding the first start to the one holding the last instant before the last end,
    so a bucket of several partitions is requested whole."""
    lo = min(w.start for w in windows)
    hi = max(w.end for w in windows) - MICROSECOND
    return dg.PartitionKeyRange(key_of_window(pdef, lo), key_of_window(pdef, hi))
