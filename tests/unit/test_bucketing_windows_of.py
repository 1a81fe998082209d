"""`Bucketing.windows_of` is `window_of` for many instants at once."""

import random
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from rollup_assets.model.bucketing import Bucketing
from rollup_assets.model.specs import Alignment

START = datetime(2025, 3, 28, tzinfo=UTC)  # the Vienna DST start, a month end, an ISO week


@pytest.mark.parametrize(
    "bucketing",
    [
        Bucketing(Alignment.FIXED_SIZE, ZoneInfo("UTC"), timedelta(hours=1)),
        Bucketing(Alignment.FIXED_SIZE, ZoneInfo("UTC"), timedelta(minutes=90)),
        *(
            Bucketing(a, ZoneInfo("Europe/Vienna"))
            for a in (
                Alignment.CALENDAR_DAY,
                Alignment.ISO8601_WEEK,
                Alignment.CALENDAR_MONTH,
                Alignment.CALENDAR_YEAR,
            )
        ),
    ],
    ids=lambda b: f"{b.alignment}-{b.size}",
)
def test_windows_of_is_window_of_each(bucketing: Bucketing) -> None:
    rng = random.Random(7)
    times = [START + timedelta(minutes=rng.randrange(0, 60 * 24 * 400)) for _ in range(2000)]
    times += times[:50]  # repeats
    assert bucketing.windows_of(times) == [bucketing.window_of(t) for t in times]
