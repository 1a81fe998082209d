"""The batching SQLite event log: a range run's materializations in one transaction per batch,
recorded exactly as Dagster records them one by one."""

import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy.exc
from dagster._core.event_api import EventLogEntry
from dagster._core.events import StepMaterializationData
from dagster._core.storage.event_log import SqliteEventLogStorage

from rollup_assets.orchestration import event_log
from rollup_assets.orchestration.event_log import BatchedSqliteEventLogStorage
from rollup_assets.orchestration.instance import DAGSTER_YAML, sqlite_storage_yaml

PARTITIONS = dg.HourlyPartitionsDefinition(start_date="2026-10-24-00:00", timezone="Europe/Vienna")
KEYS = PARTITIONS.get_partition_keys()[:50]  # across the fall-back hour of 2026-10-25


@dg.asset(
    partitions_def=PARTITIONS,
    backfill_policy=dg.BackfillPolicy.single_run(),
    output_required=False,
)
def meters(context: dg.AssetExecutionContext) -> Iterator[dg.MaterializeResult]:
    yield dg.MaterializeResult(metadata={"rows": len(context.partition_keys)})


SCATTERED = KEYS[3:50:5]  # partitions a correction rewrote, inside the run's range


@dg.asset(
    partitions_def=PARTITIONS,
    backfill_policy=dg.BackfillPolicy.single_run(),
    output_required=False,
)
def corrected(context: dg.AssetExecutionContext) -> Iterator[dg.AssetMaterialization]:
    for key in SCATTERED:
        yield dg.AssetMaterialization(
            asset_key="corrected",
            partition=key,
            metadata={"partition": key},
            tags={"dagster/data_version": f"v-{key}"},  # an indexed tag: stored by event id
        )
    context.log.info(f"corrected {len(SCATTERED)} partitions")


@pytest.fixture
def batch_size() -> str:
    """The batch size of the home's event log, and of Dagster (DAGSTER_EVENT_BATCH_SIZE)."""
    return "1000"


@pytest.fixture
def instance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch_size: str
) -> Iterator[dg.DagsterInstance]:
    (tmp_path / "dagster.yaml").write_text(
        DAGSTER_YAML + sqlite_storage_yaml(tmp_path, int(batch_size))
    )
    monkeypatch.setenv("DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS", "1")
    if int(batch_size):
        monkeypatch.setenv("DAGSTER_EVENT_BATCH_SIZE", batch_size)
    else:
        monkeypatch.delenv("DAGSTER_EVENT_BATCH_SIZE", raising=False)
    instance = dg.DagsterInstance.from_config(str(tmp_path))
    assert isinstance(instance.event_log_storage, BatchedSqliteEventLogStorage)
    yield instance
    instance.dispose()


def materialize_range(
    instance: dg.DagsterInstance, asset: dg.AssetsDefinition = meters
) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [asset],
        instance=instance,
        tags={
            "dagster/asset_partition_range_start": KEYS[0],
            "dagster/asset_partition_range_end": KEYS[-1],
        },
    )


def stored_one_by_one(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> list[dg.DagsterEventType]:
    """Records the type of every event Dagster's storage writes on its own (not in a batch)."""
    single: list[dg.DagsterEventType] = []
    original = SqliteEventLogStorage.store_event

    def store_event(storage, event):  # type: ignore[no-untyped-def]
        if event.dagster_event is not None:
            single.append(event.dagster_event.event_type)
        original(storage, event)

    monkeypatch.setattr(SqliteEventLogStorage, "store_event", store_event)
    return single


@pytest.mark.parametrize("batch_size", ["20", "1000"])
def test_range_materializations_are_stored_in_batches(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
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


@pytest.mark.parametrize("batch_size", ["4", "1000"])
def test_scattered_materializations_yielded_one_by_one_are_stored_in_batches(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch, batch_size: str
) -> None:
    single = stored_one_by_one(instance, monkeypatch)
    batches: list[int] = []
    original = BatchedSqliteEventLogStorage._store_batch

    def store_batch(storage, events):  # type: ignore[no-untyped-def]
        batches.append(len(events))
        original(storage, events)

    monkeypatch.setattr(BatchedSqliteEventLogStorage, "_store_batch", store_batch)
    result = materialize_range(instance, corrected)
    assert result.success
    assert dg.DagsterEventType.ASSET_MATERIALIZATION not in single
    size = int(batch_size)
    assert batches == [size] * (len(SCATTERED) // size) + [len(SCATTERED) % size] * bool(
        len(SCATTERED) % size
    )
    key = dg.AssetKey("corrected")
    assert instance.get_materialized_partitions(key) == set(SCATTERED)
    records = instance.fetch_materializations(key, limit=1000).records
    meta = {r.partition_key: r.asset_materialization.metadata for r in records}  # type: ignore[union-attr]
    assert {k: m["partition"].value for k, m in meta.items()} == {k: k for k in SCATTERED}
    # Each event's indexed tags are stored under its own id (the batch's ids, in its order).
    storage = instance.event_log_storage
    for r in records:
        tags = storage.get_event_tags_for_asset(key, filter_event_id=r.storage_id)
        assert [t["dagster/data_version"] for t in tags] == [f"v-{r.partition_key}"]
    latest = instance.get_latest_materialization_event(key)
    assert latest is not None and latest.dagster_event is not None
    assert latest.dagster_event.partition == SCATTERED[-1]
    # The run's log keeps the order in which the step yielded them, the log line after them.
    run_log = instance.get_records_for_run(result.run_id).records
    kinds = [
        (r.event_log_entry.dagster_event.event_type, r.event_log_entry.dagster_event.partition)
        if r.event_log_entry.dagster_event is not None
        else ("log", r.event_log_entry.user_message)
        for r in run_log
    ]
    materialized = [p for k, p in kinds if k == dg.DagsterEventType.ASSET_MATERIALIZATION]
    assert materialized == list(SCATTERED)
    last = max(
        i for i, (k, _) in enumerate(kinds) if k == dg.DagsterEventType.ASSET_MATERIALIZATION
    )
    assert any(k == "log" and "corrected" in str(m) for k, m in kinds[last + 1 :])


@pytest.mark.parametrize("batch_size", ["0"])
def test_without_a_batch_size_events_are_stored_one_by_one(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
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


def test_events_outside_a_step_are_stored_at_once(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sensor's observations are reported without a run or a step: nothing would flush them."""
    key = dg.AssetKey("meters")
    instance.report_runless_asset_event(dg.AssetObservation(asset_key=key, metadata={"n": 1}))
    records = instance.fetch_observations(key, limit=10).records
    assert [r.asset_observation.metadata["n"].value for r in records] == [1]  # type: ignore[union-attr]


def test_held_events_survive_a_failed_write(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = instance.event_log_storage
    assert isinstance(storage, BatchedSqliteEventLogStorage)
    original = BatchedSqliteEventLogStorage._store_batch
    failures = [RuntimeError("database is locked")]

    def flaky(self, events):  # type: ignore[no-untyped-def]
        if failures:
            raise failures.pop()
        original(self, events)

    monkeypatch.setattr(BatchedSqliteEventLogStorage, "_store_batch", flaky)
    # The write that fails is the log line's after the step's materializations (Dagster's log
    # handler reports it and goes on); the held materializations were not dropped with it: the
    # run's next event stored them.
    materialize_range(instance, corrected)
    assert not failures
    key = dg.AssetKey("corrected")
    assert instance.get_materialized_partitions(key) == set(SCATTERED)


@pytest.mark.parametrize("batch_size", ["4"])
def test_the_batch_size_comes_from_the_homes_config_not_the_environment(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Dagster batches nothing here (no DAGSTER_EVENT_BATCH_SIZE), and DAGSTER_HOME names
    another home: the storage still holds a step's scattered materializations in batches of the
    size its dagster.yaml gives, in the directory that names."""
    monkeypatch.delenv("DAGSTER_EVENT_BATCH_SIZE", raising=False)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "elsewhere"))
    batches: list[int] = []
    original = BatchedSqliteEventLogStorage._store_batch

    def store_batch(storage, events):  # type: ignore[no-untyped-def]
        batches.append(len(events))
        original(storage, events)

    monkeypatch.setattr(BatchedSqliteEventLogStorage, "_store_batch", store_batch)
    assert materialize_range(instance, corrected).success
    assert batches == [4, 4, len(SCATTERED) - 8]
    assert instance.get_materialized_partitions(dg.AssetKey("corrected")) == set(SCATTERED)
    assert (tmp_path / "history" / "runs" / "index.db").exists()
    assert not (tmp_path / "elsewhere").exists()


def log_entry(run_id: str, message: str) -> EventLogEntry:
    return EventLogEntry(
        error_info=None,
        level=logging.INFO,
        user_message=message,
        run_id=run_id,
        timestamp=time.time(),
    )


def schema_of(db: Path) -> tuple[set[tuple[str, str, str]], list[tuple], str]:
    """A run database's tables and indexes, its migration stamp and its journal mode."""
    with closing(sqlite3.connect(db)) as conn:
        objects = {tuple(r) for r in conn.execute("SELECT type, name, sql FROM sqlite_master")}
        stamp = conn.execute("SELECT version_num FROM alembic_version").fetchall()
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    return objects, stamp, mode


@pytest.fixture
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """No empty run database made yet, as in a new process."""
    monkeypatch.setattr(event_log, "_EMPTY_RUN_DB", [])


@pytest.mark.usefixtures("fresh_process")
def test_a_new_runs_database_is_the_one_dagster_makes(tmp_path: Path) -> None:
    ours = BatchedSqliteEventLogStorage(base_dir=str(tmp_path / "ours"))
    theirs = SqliteEventLogStorage(str(tmp_path / "theirs"))
    for storage in (ours, theirs):
        storage.store_event(log_entry("run-a", "first"))
        storage.store_event(log_entry("run-a", "second"))
        storage.store_event(log_entry("run-b", "other run"))
    assert schema_of(tmp_path / "ours" / "run-a.db") == schema_of(tmp_path / "theirs" / "run-a.db")
    assert schema_of(tmp_path / "ours" / "run-a.db")[2] == "wal"
    messages = [r.event_log_entry.user_message for r in ours.get_records_for_run("run-a").records]
    assert messages == ["first", "second"]
    assert sorted(ours.get_all_run_ids()) == ["run-a", "run-b"]
    assert not list((tmp_path / "ours").glob(".*"))  # no temporary copy left beside them
    ours.dispose()
    theirs.dispose()


@pytest.mark.usefixtures("fresh_process")
def test_runs_databases_are_made_without_dagsters_migrations_each_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[str | None] = []
    original = SqliteEventLogStorage._initdb

    def counted(self, engine, for_index_shard=False):  # type: ignore[no-untyped-def]
        made.append(engine.url.database)
        original(self, engine, for_index_shard)

    monkeypatch.setattr(SqliteEventLogStorage, "_initdb", counted)
    storage = BatchedSqliteEventLogStorage(base_dir=str(tmp_path))
    for run in range(5):
        storage.store_event(log_entry(f"run-{run}", "started"))
    storage.dispose()
    # Only the empty run database every run's is copied from: not one per run.
    runs = [db for db in made if not str(db).endswith("index.db")]
    assert len(runs) == 1 and str(runs[0]).endswith("empty.db"), made
    assert {f"run-{run}" for run in range(5)} <= set(storage.get_all_run_ids())


@pytest.mark.usefixtures("fresh_process")
def test_two_stores_making_one_runs_database_lose_no_event(tmp_path: Path) -> None:
    """Two processes (here two storages) start writing a run at once: one database is kept,
    and it holds both writers' events."""
    stores = [BatchedSqliteEventLogStorage(base_dir=str(tmp_path)) for _ in range(2)]
    barrier = threading.Barrier(2)

    def write(store: BatchedSqliteEventLogStorage, name: str) -> None:
        barrier.wait()
        for i in range(10):
            store.store_event(log_entry("shared-run", f"{name}-{i}"))

    threads = [
        threading.Thread(target=write, args=(s, n)) for s, n in zip(stores, "ab", strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records = stores[0].get_records_for_run("shared-run", limit=100).records
    assert sorted(r.event_log_entry.user_message for r in records) == sorted(
        f"{n}-{i}" for n in "ab" for i in range(10)
    )
    for store in stores:
        store.dispose()


@pytest.mark.usefixtures("fresh_process")
def test_an_initialization_sqlite_refuses_once_is_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite can refuse the commit of Dagster's initialization while one of its statements is
    still open ("cannot commit transaction - SQL statements in progress"); that is transient,
    and must not fail the run whose database it was making."""
    original = SqliteEventLogStorage._initdb

    def refusal() -> Exception:
        return sqlalchemy.exc.OperationalError(
            "COMMIT",
            {},
            sqlite3.OperationalError("cannot commit transaction - SQL statements in progress"),
        )

    refusals = [refusal()]

    def refusing(self, engine, for_index_shard=False):  # type: ignore[no-untyped-def]
        if refusals:
            raise refusals.pop()
        original(self, engine, for_index_shard)

    monkeypatch.setattr(SqliteEventLogStorage, "_initdb", refusing)
    storage = BatchedSqliteEventLogStorage(base_dir=str(tmp_path))  # makes the index
    assert not refusals
    refusals.append(refusal())  # and now the empty run database the first run's is copied from
    storage.store_event(log_entry("run-a", "started"))
    assert not refusals
    records = storage.get_records_for_run("run-a").records
    assert [r.event_log_entry.user_message for r in records] == ["started"]
    storage.dispose()


def test_other_initialization_errors_are_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self, engine, for_index_shard=False):  # type: ignore[no-untyped-def]
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(SqliteEventLogStorage, "_initdb", broken)
    with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
        BatchedSqliteEventLogStorage(base_dir=str(tmp_path))


@pytest.mark.usefixtures("fresh_process")
def test_a_runs_database_another_process_is_still_making_is_initialized(tmp_path: Path) -> None:
    """Another process (one that could not copy) has created the file and not yet its tables:
    it is initialized, not taken for a whole copy."""
    storage = BatchedSqliteEventLogStorage(base_dir=str(tmp_path))
    (tmp_path / "run-a.db").touch()
    storage.store_event(log_entry("run-a", "started"))
    records = storage.get_records_for_run("run-a").records
    assert [r.event_log_entry.user_message for r in records] == ["started"]
    storage.dispose()


@pytest.mark.usefixtures("fresh_process")
def test_without_an_empty_database_to_copy_each_run_gets_dagsters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(event_log.tempfile, "TemporaryDirectory", no_space)
    storage = BatchedSqliteEventLogStorage(base_dir=str(tmp_path))
    for run in ("run-a", "run-b"):
        storage.store_event(log_entry(run, "started"))
        records = storage.get_records_for_run(run).records
        assert [r.event_log_entry.user_message for r in records] == ["started"]
    assert event_log._EMPTY_RUN_DB == [None]  # tried once, not per run
    storage.dispose()


def test_engines_keep_compiled_statements_and_only_the_latest_runs(
    instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    storage = instance.event_log_storage
    assert isinstance(storage, BatchedSqliteEventLogStorage)
    monkeypatch.setattr(event_log, "RUN_ENGINES_KEPT", 2)
    made: list[str] = []
    original = event_log.create_engine

    def create_engine(url, **kw):  # type: ignore[no-untyped-def]
        if str(tmp_path) in str(url):  # not the empty database made once per process
            made.append(Path(str(url)).stem)
        return original(url, **kw)

    monkeypatch.setattr(event_log, "create_engine", create_engine)
    runs = [materialize_range(instance).run_id for _ in range(3)]
    # One engine per database used, not one per connection: a run's dozens of events (and the
    # index's hundreds) compile each statement once. The index's was made with the instance.
    assert made == runs
    assert set(storage._engines) == {"index", *runs[1:]}
    # The first run's engine was let go, and is made again when its log is read.
    assert len(instance.get_records_for_run(runs[0]).records) > 10
    assert made == [*runs, runs[0]]
    assert set(storage._engines) == {"index", runs[2], runs[0]}
