"""An upgrade from the release before companions (673e3ed): its warehouse, opened by this code.

The fixture (tests/fixtures/old_warehouse.tar.gz, written by make_old_warehouse.py under that
release) holds ten days of three meters over the Vienna DST end, an ISO week boundary and a month
end, every level backfilled and one correction wave applied (cells of two generations), with no
companion columns anywhere. This code opens it with a fresh Dagster instance and must read every
level as the pandas oracle aggregates the raw rows, then correct it: late, corrected and deleted
readings (retracting a daily minimum and two daily maxima, one of them a cell the old release
had already corrected), the sensors ticked until quiet, and maintenance after. A row written
before companions cannot take a difference: folded as if its companions were empty, the cells
corrected here would lose their old values and differ from the oracle.
"""

import tarfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.partials import RAW_ROWS
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.windows import Window
from rollup_assets.services.maintenance import maintain
from tests.conftest import World, world_of
from tests.fixtures.make_old_warehouse import (
    DAYS,
    NOW,
    START,
    base_rows,
    correction_rows,
    readings,
)
from tests.oracle import compare_all, oracle

FIXTURE = Path(__file__).parents[1] / "fixtures" / "old_warehouse.tar.gz"
ROLLUPS = ("energy_hourly", "energy_daily", "energy_weekly", "energy_monthly", "energy_yearly")

Rows = list[tuple[str, datetime, float]]

# Late readings: one in the repeated hour of the DST end (01:07Z is 02:07 CET), one in the last
# local hour of October (22:52Z is 23:52 CET), one in the open hour before `NOW`.
LATE: Rows = [
    ("m2", datetime(2025, 10, 26, 1, 7, tzinfo=UTC), 6.0),
    ("m0", datetime(2025, 10, 31, 22, 52, tzinfo=UTC), 2.0),
    ("m1", NOW - timedelta(minutes=20), 5.0),
]
# Corrected readings: m1's first reading of the local day 2025-10-29 (its minimum) raised above
# the others; m0's last of 2025-10-30 (its maximum) lowered below them.
CORRECTED: Rows = [
    ("m1", datetime(2025, 10, 29, 0, tzinfo=UTC), 30.0),
    ("m0", datetime(2025, 10, 30, 21, tzinfo=UTC), 0.5),
]
# Deleted readings: m0's of the DST day the old release corrected to 40.0 (that day's maximum,
# in a cell of two generations), and one plain reading of m1.
DELETED: list[tuple[str, datetime]] = [
    ("m0", datetime(2025, 10, 26, 3, tzinfo=UTC)),
    ("m1", datetime(2025, 10, 31, 12, tzinfo=UTC)),
]
# The local days whose minimum or maximum those changes retract: (meter, day start, output).
RETRACTED = [
    ("m1", datetime(2025, 10, 28, 23, tzinfo=UTC), "voltage_v_min"),
    ("m0", datetime(2025, 10, 29, 23, tzinfo=UTC), "voltage_v_max"),
    ("m0", datetime(2025, 10, 25, 22, tzinfo=UTC), "voltage_v_max"),
]


def model_of(rows: Rows) -> pd.DataFrame:
    """The raw rows as the oracle takes them: the last value of each (meter, instant), power and
    voltage following from it, the computed current by the spec's formula."""
    df = pd.DataFrame(rows, columns=["entity_id", "ts", "energy_kwh"])
    df["ts"] = pd.to_datetime(df["ts"], utc=True)
    df = df.drop_duplicates(["entity_id", "ts"], keep="last").reset_index(drop=True)
    df["power_kw"] = 4 * df["energy_kwh"]
    df["voltage_v"] = 220 + df["energy_kwh"]
    df["current_a"] = df["power_kw"] * 1000 / df["voltage_v"]
    return df


def without(df: pd.DataFrame, deleted: list[tuple[str, datetime]]) -> pd.DataFrame:
    gone = pd.MultiIndex.from_tuples([(e, pd.Timestamp(t)) for e, t in deleted])
    keep = ~pd.MultiIndex.from_frame(df[["entity_id", "ts"]]).isin(gone)
    return df[keep].reset_index(drop=True)


def assert_levels_equal(world: World, model: pd.DataFrame) -> None:
    raw = world.raw().sort_values(["entity_id", "ts"]).reset_index(drop=True)
    expected = model.sort_values(["entity_id", "ts"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(raw[expected.columns], expected, check_dtype=False)
    assert compare_all(world.query, model, world.catalog) == []


@pytest.fixture
def old_world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark):
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    yield from world_of(tmp_path, monkeypatch, load_catalog())


def test_a_warehouse_from_before_companions_reads_and_corrects_exactly(old_world: World):
    world = old_world
    wh = world.root / "warehouse" / "rollups"
    # The fixture is what the old release wrote: no level stores a companion.
    for name in ROLLUPS:
        assert RAW_ROWS not in DeltaTable(str(wh / name)).schema().to_arrow().names, name
    model = model_of(base_rows() + correction_rows())

    # As read, then once the sensors of a fresh Dagster instance are quiet.
    assert_levels_equal(world, model)
    world.tick(NOW)
    assert_levels_equal(world, model)

    daily = world.catalog.rollup("energy_daily")
    before = oracle(model, daily)
    world.ingest(readings(LATE), source="Manual")
    world.ingest(readings(CORRECTED), source="Manual")
    raw = world.catalog.raw["energy_raw"]
    for entity, at in DELETED:
        span = Window(at, at + timedelta(microseconds=1))
        world.engine.raw.delete_rows(
            raw, span, frozenset({entity}), ChangeSource.MANUAL, retention=False
        )
    model = without(model_of(base_rows() + correction_rows() + LATE + CORRECTED), DELETED)
    after = oracle(model, daily)
    for entity, day, column in RETRACTED:
        old, new = (
            f.set_index(["entity_id", "bucket_start"]).loc[(entity, pd.Timestamp(day)), column]
            for f in (before, after)
        )
        assert (new > old) if column.endswith("_min") else (new < old), (entity, day, column)

    world.tick(NOW)
    assert_levels_equal(world, model)

    report = maintain(world.engine, now=NOW)
    assert report.failures == []
    assert_levels_equal(world, model)
    world.tick(NOW)
    assert_levels_equal(world, model)


def test_a_recompute_rewrites_rows_from_before_companions_with_them(old_world: World):
    """The documented upgrade step: a recompute of the first level over the old range leaves
    every level's active rows with their companions, and the values as they were."""
    world = old_world
    model = model_of(base_rows() + correction_rows())
    world.ops.request_recompute("energy_hourly", START, START + timedelta(days=DAYS))
    world.tick(NOW)
    assert_levels_equal(world, model)
    for name in ROLLUPS:
        spec = world.catalog.rollup(name)
        rows = world.engine.rollups.read_arrow(spec)
        assert rows.num_rows > 0, name
        unknown = rows.filter(pc.is_null(rows[RAW_ROWS]))
        assert unknown.num_rows == 0, (
            name,
            unknown.select(["entity_id", "bucket_start"]).to_pylist(),
        )
