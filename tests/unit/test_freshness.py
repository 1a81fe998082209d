"""Each rollup's freshness policy follows from its spec: longest bucket plus watermark lag."""

from datetime import timedelta

import dagster as dg
import pytest

from rollup_assets.assembly import build_definitions
from rollup_assets.model.bucket_rules import freshness_windows
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.orchestration.resources import WarehouseResource
from rollup_assets.settings import Settings

CATALOG = load_catalog()
LAG = timedelta(minutes=5)  # the shipped chain's watermark lag


@pytest.mark.parametrize(
    ("rollup", "longest"),
    [
        ("energy_hourly", timedelta(hours=1)),
        ("energy_daily", timedelta(hours=25)),  # the fall-back day
        ("energy_weekly", timedelta(days=7, hours=1)),
        ("energy_monthly", timedelta(days=31, hours=1)),
        ("energy_yearly", timedelta(days=366, hours=1)),
    ],
)
def test_freshness_windows_cover_the_longest_bucket_and_the_lag(
    rollup: str, longest: timedelta
) -> None:
    warn, fail = freshness_windows(CATALOG.rollup(rollup))
    assert longest + LAG < warn < fail
    assert warn - (longest + LAG) == timedelta(minutes=5)
    assert fail - (longest + LAG) == timedelta(minutes=30)


def test_every_rollup_asset_carries_its_freshness_policy(tmp_path) -> None:
    defs = build_definitions(
        CATALOG, WarehouseResource(root=str(tmp_path)), settings=Settings.from_env()
    )
    for spec in CATALOG.rollups.values():
        key = dg.AssetKey(spec.name)
        policy = defs.resolve_assets_def(key).specs_by_key[key].freshness_policy
        warn, fail = freshness_windows(spec)
        assert policy == dg.FreshnessPolicy.time_window(fail_window=fail, warn_window=warn)
