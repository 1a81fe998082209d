"""The batching SQLite event log: a range run's materializations in one transaction per batch,
recorded exactly as Dagster records them one by one."""

from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.events import StepMaterializationData

from rollup_assets.orchestration.event_log import BatchedSqliteEventLogStorage
from rollup_assets.orchestration.instance import dagster_yaml

PARTITIONS = dg.HourlyPartitionsDefinition(start_date="2026-10-24-00:00", timezone="Europe/Vienna")
KEYS = PARTITIONS.get_partition_keys()[:50]  # across the fall-back hour of 2026-10-25


@dg.asset(
    partitions_def=PARTITIONS,
    backfill_policy=dg.BackfillPolicy.single_run(),
    output_required=False,
)
def meters(context: dg.AssetExecutionContext) -> Iterator[dg.MaterializeResult]:
    yield dg.MaterializeResult(metadata={"rows": len(context.partition_keys)})


@pytest.fixture
def instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dg.DagsterInstance]:
    (tmp_path / "dagster.yaml").write_text(dagster_yaml({}, tmp_path))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.setenv("DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS", "1")
    instance = dg.DagsterInstance.from_config(str(tmp_path))
    assert isinstance(instance.event_log_storage, BatchedSqliteEventLogStorage)
    yield instance
    instance.dispose()


def materialize_range(instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [meters],
        instance=instance,
        tags={
            "dagster/asset_partition_range_start": KEYS[0],
            "dagster/asset_partition_range_end": KEYS[-1],
        },
    )


def stored_one_by_one(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> list[dg.DagsterEventType]:
    """Records the type of every event the storage writes on its own (not in a batch)."""
    storage = instance.event_log_storage
    single: list[dg.DagsterEventType] = []
    original = storage.store_event

    def store_event(event):  # type: ignore[no-untyped-def]
        if event.dagster_event is not None:
            single.append(event.dagster_event.event_type)
        original(event)

    monkeypatch.setattr(storage, "store_event", store_event)
    return single


@pytest.mark.parametrize("batch_size", ["20", "1000"])
def test_range_materializations_are_stored_in_batches(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch, batch_size: str
) -> None:
    monkeypatch.setenv("DAGSTER_EVENT_BATCH_SIZE", batch_size)
    single = stored_one_by_one(instance, monkeypatch)
    result = materialize_range(instance)
    assert result.success
    assert dg.DagsterEventType.ASSET_MATERIALIZATION not in single

    key = dg.AssetKey("meters")
    assert instance.get_materialized_partitions(key) == set(KEYS)
    records = instance.fetch_materializations(key, limit=1000).records
    assert sorted(r.partition_key for r in records) == sorted(KEYS)
    assert {r.run_id for r in records} == {result.run_id}
    assert all(r.asset_materialization.metadata["rows"].value == 50 for r in records)  # type: ignore[union-attr]
    # The asset's latest-event entry is the last partition's, as with one-by-one writes.
    latest = instance.get_latest_materialization_event(key)
    assert latest is not None and latest.dagster_event is not None
    assert latest.dagster_event.partition == KEYS[-1]
    # The run's own log holds them too (the UI's run view reads it).
    run_log = instance.get_records_for_run(
        result.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
    ).records
    assert len(run_log) == len(KEYS)


def test_without_a_batch_size_events_are_stored_one_by_one(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DAGSTER_EVENT_BATCH_SIZE", raising=False)
    single = stored_one_by_one(instance, monkeypatch)
    assert materialize_range(instance).success
    assert single.count(dg.DagsterEventType.ASSET_MATERIALIZATION) == len(KEYS)
    assert instance.get_materialized_partitions(dg.AssetKey("meters")) == set(KEYS)


def test_a_mixed_batch_is_stored_one_by_one(instance: dg.DagsterInstance) -> None:
    """Events of two assets (never one output's batch) take Dagster's one-by-one path."""
    run = instance.create_run_for_job(
        dg.Definitions(assets=[meters]).resolve_implicit_global_asset_job_def()
    )
    events = [
        dg.EventLogEntry(
            error_info=None,
            level="INFO",
            user_message="",
            run_id=run.run_id,
            timestamp=1.0 + i,
            dagster_event=dg.DagsterEvent(
                dg.DagsterEventType.ASSET_MATERIALIZATION.value,
                "job",
                event_specific_data=StepMaterializationData(
                    dg.AssetMaterialization(asset_key=name, partition=KEYS[0])
                ),
            ),
        )
        for i, name in enumerate(["meters", "other"])
    ]
    instance.event_log_storage.store_event_batch(events)
    for name in ("meters", "other"):
        assert instance.get_materialized_partitions(dg.AssetKey(name)) == {KEYS[0]}
