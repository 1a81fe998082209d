"""What a backfill's range run records: one materialization per partition, as a correction's
scattered partitions are recorded, each with the brief entries and the last (the asset's latest)
with every figure of the run."""

from datetime import UTC, date, datetime

import dagster as dg
import pyarrow as pa
import pytest

from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.assets import BRIEF
from tests.conftest import World, days

NOW = datetime(2025, 6, 20, 12, 0, tzinfo=UTC)
SPAN = Window(datetime(2025, 6, 1, tzinfo=UTC), datetime(2025, 6, 4, tzinfo=UTC))


def test_a_range_run_records_each_partition_briefly_and_its_latest_with_every_figure(
    world: World,
) -> None:
    world.ops.activate("energy_raw", now=NOW)
    world.ingest(pa.concat_tables([day_batch(d, 3, seed=3) for d in days(date(2025, 6, 1), 4)]))
    world.activate_all(NOW)
    world.backfill([SPAN])

    records = world.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("energy_hourly")), limit=10_000
    ).records
    range_run = min(records, key=lambda r: r.storage_id).run_id
    ran = sorted((r for r in records if r.run_id == range_run), key=lambda r: r.storage_id)
    assert len(ran) == 3 * 24  # every hour of the span, each once
    assert ran[-1].partition_key == max(r.partition_key for r in ran)

    *earlier, last = [r.asset_materialization.metadata for r in ran]
    assert all(set(m) == set(BRIEF) for m in earlier)
    assert set(BRIEF) < set(last) and {"windows", "duration_ms", "entities"} <= set(last)
    assert last["windows"].value == 3 * 24 and last["rows"].value == 3 * 3 * 24
    for m in [*earlier, last]:
        assert m["job_id"].value == last["job_id"].value
        assert m["generation"].value == last["generation"].value


def test_a_run_executed_here_prints_its_messages_and_not_a_line_per_event(
    world: World, capfd: pytest.CaptureFixture[str]
) -> None:
    """The console of an in-process run shows the run's own messages (INFO), not a line for each
    of its thousands of partition events (DEBUG), which the event log holds."""
    world.ops.activate("energy_raw", now=NOW)
    world.ingest(pa.concat_tables([day_batch(d, 2, seed=5) for d in days(date(2025, 6, 1), 2)]))
    world.activate_all(NOW)
    capfd.readouterr()
    world.materialize("energy_hourly", "2025-06-01-00:00", "2025-06-01-23:00")
    printed = capfd.readouterr().err
    assert "energy_hourly:" in printed and " - INFO - " in printed
    assert "ASSET_MATERIALIZATION" not in printed and " - DEBUG - " not in printed
    events = world.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("energy_hourly")), limit=100
    ).records
    # The event log still holds each partition the run rewrote.
    newest = max(events, key=lambda r: r.storage_id).asset_materialization.metadata
    assert len(events) == newest["windows"].value > 0
