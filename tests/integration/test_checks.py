"""The `matches_source` asset check passes on a correct partition and reports differences."""

from datetime import UTC, date, datetime, timedelta

import pyarrow as pa

from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.runner import check_evaluations, execute
from tests.conftest import World, days

NOW = datetime(2025, 6, 20, 12, 0, tzinfo=UTC)


def run_check(world: World, rollup: str, key: str) -> dict:
    run = execute(world.defs, world.instance, f"{rollup}_check_job", {"dagster/partition": key})
    assert run is not None and run.success, run and run.error
    [result] = check_evaluations(world.instance, run.run_id)
    assert result["partition"] == key
    return result


def test_check_passes_then_reports_a_stale_partition(world: World) -> None:
    world.ops.activate("energy_raw", now=NOW)
    world.ingest(pa.concat_tables([day_batch(d, 3, seed=4) for d in days(date(2025, 6, 2), 5)]))
    world.activate_all(NOW)
    world.backfill([Window(datetime(2025, 6, 2, tzinfo=UTC), datetime(2025, 6, 7, tzinfo=UTC))])

    ok = run_check(world, "energy_daily", "2025-06-04")
    assert (
        ok["passed"]
        and ok["metadata"]["differing_rows"] == 0
        and ok["metadata"]["rows_checked"] == 3
    )

    # Change the source under the daily level without letting the sensors recompute it.
    late = [
        {
            "entity_id": "meter-0002",
            "ts": datetime(2025, 6, 4, 8, tzinfo=UTC) + timedelta(minutes=15 * i),
            "energy_kwh": 50.0,
        }
        for i in range(4)
    ]
    world.ingest(pa.Table.from_pylist(late))
    run = world.materialize(
        "energy_hourly",
        "2025-06-04-10:00",
        "2025-06-04-10:00",
        {"ops": {"energy_hourly": {"config": {"propagate_in_run": False}}}},
    )
    assert run.success
    stale = run_check(world, "energy_daily", "2025-06-04")
    assert not stale["passed"] and stale["metadata"]["differing_rows"] == 1
    assert run_check(world, "energy_daily", "2025-06-05")["passed"]
