"""Rollup retention without Spark: the spec key on a rollup, its rules, and the bucket cut."""

from datetime import UTC, datetime, timedelta

import pytest

from rollup_assets.model.bucketing import Bucketing
from rollup_assets.model.errors import SpecError
from rollup_assets.model.retention import bucket_cut
from rollup_assets.model.spec_loader import parse_catalog
from rollup_assets.model.specs import schema_fingerprint

D = timedelta(days=1)
H = timedelta(hours=1)


def spec_doc(hourly: dict | None = None, daily: dict | None = None) -> dict:
    return {
        "raw_archives": {"meter": {"columns": {"kwh": {"type": "double", "required": True}}}},
        "rollups": {
            "meter_hourly": {
                "source": "meter",
                "alignment": "FixedSize",
                "size": "1h",
                "start": "2024-01-01",
                "aggregations": [{"column": "kwh", "function": "Sum"}],
                **(hourly or {}),
            },
            "meter_daily": {
                "source": "meter_hourly",
                "alignment": "CalendarDay",
                "aggregations": [{"column": "kwh", "function": "Sum"}],
                **(daily or {}),
            },
        },
    }


@pytest.mark.parametrize(("text", "expected"), [("90d", 90 * D), ("P30D", 30 * D), (None, None)])
def test_a_rollup_retention_is_a_duration_and_absent_means_forever(
    text: object, expected: object
) -> None:
    hourly = {} if text is None else {"retention": text}
    catalog = parse_catalog(spec_doc(hourly))
    assert catalog.rollups["meter_hourly"].retention == expected
    assert catalog.rollups["meter_daily"].retention is None


@pytest.mark.parametrize(
    ("hourly", "daily", "archive", "message"),
    [
        ({"retention": "soon"}, None, "meter_hourly", "is not a duration"),
        ({"retention": "0s"}, None, "meter_hourly", "must be positive"),
        ({"retention": "-1d"}, None, "meter_hourly", "retention"),
        # The daily level reads the hourly one: a day must close before its hours may go.
        ({"retention": "20h"}, None, "meter_hourly", "rollup 'meter_daily'"),
        (None, {"retention": "0s"}, "meter_daily", "must be positive"),
    ],
)
def test_a_bad_rollup_retention_fails_at_load_naming_the_rollup_and_the_field(
    hourly: dict | None, daily: dict | None, archive: str, message: str
) -> None:
    with pytest.raises(SpecError, match=message) as err:
        parse_catalog(spec_doc(hourly, daily))
    assert err.value.archive == archive and err.value.rule == "retention"
    assert f"'{archive}'" in str(err.value) and "[retention]" in str(err.value)


def test_a_rollup_retention_is_not_part_of_the_schema_an_activated_rollup_freezes() -> None:
    a = parse_catalog(spec_doc({"retention": "30d"})).rollups["meter_hourly"]
    b = parse_catalog(spec_doc({"retention": "400d"})).rollups["meter_hourly"]
    assert schema_fingerprint(a) == schema_fingerprint(b)


def test_the_bucket_cut_is_the_bucket_holding_the_horizon_held_back_by_every_hold() -> None:
    hourly = parse_catalog(spec_doc()).rollups["meter_hourly"]
    floor = Bucketing.of(hourly).floor
    now, keep = datetime(2025, 7, 10, 12, 30, tzinfo=UTC), 10 * D
    # now - retention = 06-30 12:30: the hour holding it stays, every earlier one goes.
    assert bucket_cut(now, keep, floor, []) == datetime(2025, 6, 30, 12, tzinfo=UTC)
    # Exactly at a boundary: the bucket ending there goes.
    assert bucket_cut(now - 30 * timedelta(minutes=1), keep, floor, []) == datetime(
        2025, 6, 30, 12, tzinfo=UTC
    )
    # A watermark (of the level or one above) and queued work hold it back to their buckets.
    held = [datetime(2025, 6, 29, tzinfo=UTC), datetime(2025, 6, 29, 5, 20, tzinfo=UTC)]
    assert bucket_cut(now, keep, floor, held) == datetime(2025, 6, 29, tzinfo=UTC)
    assert bucket_cut(now, keep, floor, held[1:]) == datetime(2025, 6, 29, 5, tzinfo=UTC)
    assert bucket_cut(now, keep, floor, [now]) == datetime(2025, 6, 30, 12, tzinfo=UTC)
