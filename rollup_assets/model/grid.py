"""The partition grid of a rollup: the instants at which its Dagster partitions start.

Dagster's time-window partitions follow a cron schedule read in the reference zone, so every
partition boundary is a local wall-clock time. A calendar bucket (a local day, ISO week, month
or year) is one partition. A FixedSize bucket is an absolute duration counted from its origin,
which a cron schedule cannot always count (90 minutes, two days, a week from a Thursday): its
partitions are then the coarsest grid a cron schedule can cut whose boundaries include every
bucket boundary, in every UTC offset the zone uses, so each bucket is a whole number of
partitions. A bucket that is one grid step (every FixedSize rollup valid before origins and
longer buckets existed) keeps exactly the partitions it had.

In UTC such a grid is regular: the instants a fixed time (modulo the step) after the epoch,
whatever the zone's offset at each (the offsets the zone uses are congruent modulo the step),
so a bucket's partitions are `step` apart from its start.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from rollup_assets.model.specs import Alignment, RollupSpec
from rollup_assets.model.windows import EPOCH, Window

MINUTE = timedelta(minutes=1)
DAY = timedelta(days=1)
# The grid steps one cron schedule can cut in local time, coarsest first: a divisor of an hour
# (`*/15` minutes), or whole hours dividing a day (`0 */6` hours). Any other step (90 minutes,
# say) needs a different minute in different hours, which one cron expression cannot say.
CRON_STEPS = tuple(
    sorted(
        {timedelta(minutes=m) for m in range(1, 61) if 60 % m == 0}
        | {timedelta(hours=h) for h in range(1, 25) if 24 % h == 0},
        reverse=True,
    )
)
# At most this many partitions per bucket (a week of hours): finer partitions would make a
# bucket thousands of partitions, each a materialization event and a row in the UI.
MAX_PARTITIONS_PER_BUCKET = 168


@dataclass(frozen=True)
class Grid:
    """A cron-expressible partition grid.

    `step` is the length of every partition (UTC time); `local_phase` the local wall-clock time
    of day of the boundaries, modulo `step` (the cron schedule's minute and hour); `per_bucket`
    how many partitions make one bucket.
    """

    step: timedelta
    local_phase: timedelta
    per_bucket: int


def zone_offsets(zone: ZoneInfo, start: datetime, years: int = 80) -> set[timedelta]:
    """Every UTC offset `zone` uses from `start` on, sampled densely enough to see each rule."""
    t = datetime(max(start.year, 1900), 1, 1, tzinfo=UTC)
    end = t + timedelta(days=365 * years)
    offsets: set[timedelta] = set()
    while t < end:
        off = t.astimezone(zone).utcoffset()
        if off is not None:
            offsets.add(off)
        t += timedelta(days=5)
    return offsets


def fixed_size_grid(size: timedelta, origin: datetime, offsets: Iterable[timedelta]) -> Grid | None:
    """The coarsest cron-expressible grid whose boundaries include every boundary
    `origin + k * size` under each of `offsets` (UTC offsets), or None if there is none (an
    offset or the origin off whole minutes). `size` is a whole number of minutes."""
    offs = set(offsets)
    since = origin - EPOCH
    for step in CRON_STEPS:
        if size % step:
            continue
        # A boundary at UTC time `since (mod step)` is local time `since + offset (mod step)`:
        # one cron schedule cuts them all only if that is the same local time for every offset.
        local = {(since + off) % step for off in offs} or {since % step}
        if len(local) != 1:
            continue
        local_phase = local.pop()
        if local_phase % MINUTE:
            continue
        return Grid(step, local_phase, size // step)
    return None


@lru_cache(maxsize=256)
def _grid(size: timedelta, origin: datetime, zone: str, start: datetime) -> Grid | None:
    return fixed_size_grid(size, origin, zone_offsets(ZoneInfo(zone), start))


def partition_grid(spec: RollupSpec) -> Grid | None:
    """The partition grid of a FixedSize rollup (None: no cron schedule aligns with its
    buckets; a spec that loads always has one)."""
    assert spec.alignment is Alignment.FIXED_SIZE and spec.size is not None, spec.name
    return _grid(spec.size, spec.origin, spec.reference_time_zone, spec.start)


def partitions_per_bucket(spec: RollupSpec) -> int:
    """How many Dagster partitions make one bucket of `spec` (1 for calendar buckets)."""
    if spec.alignment is not Alignment.FIXED_SIZE:
        return 1
    grid = partition_grid(spec)
    assert grid is not None, f"{spec.name}: no partition grid (the spec was not validated)"
    return grid.per_bucket


def partition_starts(spec: RollupSpec, bucket: Window) -> list[datetime]:
    """UTC starts of the partitions that make `bucket`, in order (just its start for a bucket
    that is one partition)."""
    n = partitions_per_bucket(spec)
    step = (bucket.end - bucket.start) / n
    return [bucket.start + i * step for i in range(n)]
