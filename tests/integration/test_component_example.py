"""Another Dagster project adds rollups with the `RollupChain` component
(`examples/existing_project`, which has top-level `resources` and `sensors` packages of its
own): `dg check defs` passes there, and its definitions keep the project's own asset, resource
and sensor, backfill a day, then correct a late write through the sensors, equal to the oracle
at both levels."""

import os
import subprocess
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import dagster as dg
import pandas as pd
import pyarrow.compute as pc
import pytest
import yaml

from rollup_assets.component import RollupChain
from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.windows import Window
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.engine import Engine
from tests.conftest import World, instance_in
from tests.oracle import compare_all

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "existing_project"
NOW = datetime(2025, 11, 15, 12, 0, tzinfo=UTC)
DAY = date(2025, 10, 26)  # the 25-hour day in Vienna


def example_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    env |= {
        "VIRTUAL_ENV": sys.prefix,
        "PYTHONPATH": str(EXAMPLE),  # the project is not installed: importable from its root
        "ROLLUPS_WAREHOUSE": str(tmp_path / "warehouse"),
    }
    return env


def test_dg_checks_the_example_project(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(Path(sys.prefix) / "bin" / "dg"), "check", "defs"],
        cwd=EXAMPLE,
        env=example_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "All definitions loaded successfully" in done.stdout + done.stderr


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark) -> World:
    for key, value in example_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(EXAMPLE))
    home = tmp_path / "dagster_home"
    home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    from existing_project.definitions import defs as load_defs

    defs = load_defs()
    doc = yaml.safe_load((EXAMPLE / "existing_project/defs/meters/defs.yaml").read_text())
    catalog = RollupChain(**doc["attributes"]).catalog()
    with instance_in(home, catalog) as instance:
        engine = Engine(catalog, Warehouse(str(tmp_path / "warehouse")))
        yield World(tmp_path, catalog, engine, defs, instance)


def test_the_example_projects_rollups_stay_correct(world: World) -> None:
    import resources
    import sensors

    # The project's own packages, not anything rollups installs under those names.
    assert Path(resources.__file__).parent == EXAMPLE / "resources"
    assert Path(sensors.__file__).parent == EXAMPLE / "sensors"
    assert world.defs.resolve_assets_def("tariffs") is not None  # the project's own asset
    assert world.defs.resolve_sensor_def("tariff_book_changed") is not None
    assert isinstance(world.defs.resources["tariff_book"], resources.TariffBook)
    assert world.defs.resolve_sensor_def("retroactive_write_sensor") is not None  # the rollups'
    world.ops.activate("meter_raw", now=NOW)
    readings = day_batch(DAY, 3, seed=7)
    world.ingest(readings, archive="meter_raw")
    world.activate_all(NOW)
    start = datetime(2025, 10, 25, 22, tzinfo=UTC)  # local midnight, to the end of the UTC day
    world.backfill([Window(start, start + timedelta(hours=26))], rollup="meter_hourly")
    assert compare_all(world.query, world.raw("meter_raw"), world.catalog) == []

    late = readings.filter(pc.equal(readings["entity_id"], "meter-0001")).slice(0, 8)
    late = late.set_column(2, "energy_kwh", pc.multiply(late["energy_kwh"], 2.0))
    world.ingest(late, archive="meter_raw", source="Manual")
    world.tick(NOW)
    assert compare_all(world.query, world.raw("meter_raw"), world.catalog) == []


def test_an_asset_of_the_project_writes_its_readings_into_the_raw_archive(world: World) -> None:
    from existing_project.defs.readings import collect_readings

    world.activate_all(NOW)
    world.tick(NOW, sensors=("retroactive_write_sensor",))  # change detection starts here
    raw = dg.AssetKey("meter_raw")
    table = world.engine.raw.table(world.catalog.raw["meter_raw"])
    assert table is not None
    before = table.version()

    def collect(day: date) -> dg.ExecuteInProcessResult:
        return dg.materialize(
            [world.defs.resolve_assets_def("meter_readings")],
            instance=world.instance,
            run_config={"ops": {"meter_readings": {"config": {"day": day.isoformat()}}}},
        )

    run = collect(DAY)
    assert run.success
    readings = collect_readings(DAY)
    stored = world.raw("meter_raw").sort_values(["entity_id", "ts"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(
        stored[["entity_id", "ts", "energy_kwh"]],
        readings[["entity_id", "ts", "energy_kwh"]].astype({"ts": stored["ts"].dtype}),
    )
    table.update_incremental()
    version = table.version()
    assert version == before + 1
    seen = world.instance.fetch_observations(raw, limit=1).records[0]
    meta = {k: v.value for k, v in seen.asset_observation.metadata.items()}
    assert seen.run_id == run.run_id
    assert meta["delta_version"] == version and meta["change_source"] == "Pipeline"
    assert (meta["rows"], meta["inserted"], meta["updated"]) == (len(readings), len(readings), 0)
    assert meta["written_by"] == f"run {run.run_id}, asset meter_readings"
    commit = next(c for c in table.history(1))
    assert commit["rollups.written_by"] == meta["written_by"]

    # The same day collected again changes nothing: no commit, and the write says so.
    again = collect(DAY)
    assert again.success
    meta = {
        k: v.value
        for k, v in world.instance.fetch_observations(raw, limit=1)
        .records[0]
        .asset_observation.metadata.items()
    }
    assert (meta["delta_version"], meta["inserted"], meta["unchanged"]) == (version, 0, 192)

    # The retroactive-write sensor records the commit as it records a CLI ingest's, and brings
    # the rollups over the day up to date.
    world.tick(NOW)
    detected = [
        r.asset_observation.metadata
        for r in world.instance.fetch_observations(raw, limit=10).records
        if "dirty_rollups" in r.asset_observation.metadata
    ]
    assert [m["delta_version"].value for m in detected] == [version]
    assert detected[0]["change_source"].value == "Pipeline"
    assert compare_all(world.query, world.raw("meter_raw"), world.catalog) == []
