"""Dagster's SQLite event log, writing a batch of asset events in one transaction per database.

A range run (a backfill of 8,760 hourly partitions) reports one materialization per partition.
Dagster hands those to the event log as one batch when `DAGSTER_EVENT_BATCH_SIZE` is set, but its
SQLite storage then stores them one by one: per event, a new connection and a committed (fsync'd)
transaction in the run's database and another in the index database. This storage writes the
batch in one transaction in each, which is what Dagster's PostgreSQL storage does too.

A correction run rewrites scattered partitions, so its step yields one materialization per
partition rather than one result for a range, and Dagster stores those one by one. With a batch
size configured (`batch_size` in dagster.yaml; `rollups setup` writes `EVENT_BATCH_SIZE`), this
storage holds a run's consecutive materializations of one asset and stores them as one batch as
soon as the run's next event of another kind or asset arrives (every step ends with its success
or failure event) or the batch is full.

Durability is unchanged in kind: a batch is handed over when the step has finished its work and
yields the events, and a process that dies while writing it (or while holding it) loses the
batch's events, as it would have lost the events not yet written one by one. The rollup tables
and their ledger, not the event log, are the record of what was written.

Every run has a database of its own, and Dagster creates each one from scratch: it loads its
migration scripts, creates the tables and stamps the revision, a few hundred milliseconds of a
run's start. This storage does that once per process, in a private directory, and gives each new
run a copy of the empty database, written durably and linked into place whole, so another
process never sees it half made. A run database that already exists (another process's, which
may be half made), and every run's when no copy can be made here, get Dagster's own
initialization.

Dagster's SQLite storage also makes a new SQLAlchemy engine for every connection, and an engine's
cache of compiled statements goes with it, so each of a run's events compiled its statements
again (a tenth of a test run's Python time). This storage keeps the engines of the index and of
the runs it last wrote, with no pool: every use still opens and closes its own SQLite
connection, as Dagster's does; only the compiled statements are kept.
"""

import logging
import os
import sqlite3
import tempfile
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster._check as check
import sqlalchemy.exc
from dagster import DagsterEventType, Field, IntSource, StringSource
from dagster._config import UserConfigSchema
from dagster._core.event_api import EventLogEntry
from dagster._core.storage.event_log import SqliteEventLogStorage
from dagster._core.storage.event_log.schema import SqlEventLogStorageTable
from dagster._core.storage.event_log.sqlite.sqlite_event_log import (
    INDEX_SHARD_NAME,
    SQLITE_BUSY_TIMEOUT_SECONDS,
)
from dagster._serdes import ConfigurableClassData
from sqlalchemy import Connection, Engine, create_engine, func, select
from sqlalchemy.pool import NullPool

from rollup_assets.orchestration.instance import EVENT_BATCH_SIZE

log = logging.getLogger(__name__)
INIT_ATTEMPTS = 5
STATEMENTS_IN_PROGRESS = "SQL statements in progress"
RUN_ENGINES_KEPT = 8  # the runs whose engines (and compiled statements) are kept, latest used
BATCHED = {DagsterEventType.ASSET_MATERIALIZATION, DagsterEventType.ASSET_OBSERVATION}


def batchable(events: Sequence[EventLogEntry]) -> bool:
    """One run's materializations (or observations) of one asset: what one range output yields."""
    kinds, keys, runs = set(), set(), set()
    for e in events:
        if e.dagster_event is None or e.dagster_event.asset_key is None:
            return False
        kinds.add(e.dagster_event.event_type)
        keys.add(e.dagster_event.asset_key)
        runs.add(e.run_id)
    return len(kinds) == len(keys) == len(runs) == 1 and kinds <= BATCHED


class BatchedSqliteEventLogStorage(SqliteEventLogStorage):
    """`SqliteEventLogStorage` with `store_event_batch` in one transaction per database.

    In dagster.yaml (`rollups setup` writes it for SQLite homes):

        event_log_storage:
          module: rollup_assets.orchestration.event_log
          class: BatchedSqliteEventLogStorage
          config:
            base_dir: /abs/path/of/the/home/history/runs
            batch_size: 1000

    `base_dir` is required, as for Dagster's own SQLite storage (where that keeps a home's event
    logs, `<home>/history/runs`, keeps the home's runs' history); `batch_size` is how many held
    events are stored as one batch (default `EVENT_BATCH_SIZE`; 0: every event at once).
    """

    @classmethod
    def config_type(cls) -> UserConfigSchema:
        return {
            "base_dir": Field(StringSource),
            "batch_size": Field(IntSource, is_required=False, default_value=EVENT_BATCH_SIZE),
        }

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value: Mapping[str, Any]
    ) -> "BatchedSqliteEventLogStorage":
        return cls(
            base_dir=config_value["base_dir"],
            inst_data=inst_data,
            batch_size=config_value.get("batch_size", EVENT_BATCH_SIZE),
        )

    def __init__(self, *args: Any, batch_size: int = EVENT_BATCH_SIZE, **kwargs: Any) -> None:
        self._engines: OrderedDict[str, Engine] = OrderedDict()  # per shard, latest used last
        super().__init__(*args, **kwargs)
        self._batch_size = max(0, batch_size)
        self._pending: dict[str, list[EventLogEntry]] = {}  # per run: asset events not yet stored
        self._pending_lock = threading.RLock()

    def _engine(self, shard: str) -> Engine:
        """The shard's engine, kept with its compiled statements (no pool: each connection is
        opened and closed by its use); the index's always, the last runs' while they are among
        the latest used. Called under `_db_lock`."""
        engine = self._engines.get(shard)
        if engine is None:
            engine = create_engine(
                self.conn_string_for_shard(shard),
                poolclass=NullPool,
                connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS},
            )
            self._engines[shard] = engine
        self._engines.move_to_end(shard)
        runs = [s for s in self._engines if s != INDEX_SHARD_NAME]
        for old in runs[: max(0, len(runs) - RUN_ENGINES_KEPT)]:
            self._engines.pop(old).dispose()
        return engine

    @contextmanager
    def _connect(self, shard: str) -> Iterator[Connection]:
        """Dagster's `_connect` (a connection in a transaction, the database initialized at its
        first use here) on the shard's kept engine."""
        with self._db_lock:
            check.str_param(shard, "shard")
            engine = self._engine(shard)
            if shard not in self._initialized_dbs:
                self._initdb(engine)
                self._initialized_dbs.add(shard)
            with engine.connect() as conn, conn.begin():
                yield conn

    def _initdb(self, engine: Engine, for_index_shard: bool = False) -> None:
        """A new run's database is a copy of an empty one (see the module's doc); the index,
        and a run database that exists already, get Dagster's own initialization."""
        path = engine.url.database
        if (
            for_index_shard
            or not path
            or os.path.basename(path) == f"{INDEX_SHARD_NAME}.db"
            or os.path.exists(path)
            or not self._place_empty_run_db(Path(path))
        ):
            self._dagster_initdb(engine, for_index_shard)

    def _dagster_initdb(self, engine: Engine, for_index_shard: bool = False) -> None:
        """Dagster's initialization, tried again when SQLite refuses its commit because one of
        its own statements is still open (a transient state Dagster retries in other forms)."""
        for attempt in range(INIT_ATTEMPTS):
            try:
                super()._initdb(engine, for_index_shard)
                return
            except (sqlite3.OperationalError, sqlalchemy.exc.OperationalError) as exc:
                if STATEMENTS_IN_PROGRESS not in str(exc) or attempt == INIT_ATTEMPTS - 1:
                    raise
                log.info("initializing %s: %s; trying again", engine.url.database, exc)
            time.sleep(0.1 * (attempt + 1))

    def _place_empty_run_db(self, path: Path) -> bool:
        """Link a copy of the empty run database at `path`; False if it was not placed here
        (no empty database in this process, no hard links, or another process's file already
        there, maybe half made), and then Dagster initializes or checks the file."""
        empty = _empty_run_db(self._dagster_initdb)
        if empty is None:
            return False
        # Not `*.db` (Dagster takes those for runs), with the mode SQLite gives a new file.
        tmp = path.parent / f".{path.stem}.{uuid.uuid4().hex}.new"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(empty)
                    f.flush()
                    os.fsync(f.fileno())  # durable before it is a run's database
                os.link(tmp, path)
            finally:
                os.unlink(tmp)
        except OSError as exc:
            log.debug("placing the empty run database at %s: %s", path, exc)
            return False
        return True

    def store_event(self, event: EventLogEntry) -> None:
        """With a batch size, a run's consecutive materializations (or observations) of one
        asset that a step yields one by one (a correction rewriting scattered partitions) are
        held and stored as one batch: when the run's next event of another kind or asset
        arrives (every step ends with its success or failure), or the batch is full. Events
        outside a step (a sensor's observations, reported without a run) are stored at once, as
        is every event with a batch size of 0."""
        size = self._batch_size
        run_id = event.run_id
        holdable = size > 0 and bool(run_id) and event.step_key is not None
        with self._pending_lock:
            held = self._pending.get(run_id, [])
            if holdable and batchable([*held[-1:], event]):
                if len(held) + 1 < size:
                    # Held in place: a copy per event made holding a batch cost its square.
                    self._pending.setdefault(run_id, held).append(event)
                    return
                self._store_held(run_id, [*held, event])
                return
            self._store_held(run_id, held)
            super().store_event(event)

    def _store_held(self, run_id: str, events: list[EventLogEntry]) -> None:
        """Store `events` (the run's held events, maybe one more) and stop holding them; on a
        failure they stay held (the next event of the run tries again) and the error is
        raised."""
        if events:
            self._store(events)
        self._pending.pop(run_id, None)

    def flush(self) -> None:
        """Store every held event (each run's in one batch)."""
        with self._pending_lock:
            for run_id, events in list(self._pending.items()):
                self._store_held(run_id, events)

    def dispose(self) -> None:
        self.flush()
        super().dispose()
        with self._db_lock:
            for engine in self._engines.values():
                engine.dispose()
            self._engines.clear()

    def _store(self, events: list[EventLogEntry]) -> None:
        if len(events) == 1:
            super().store_event(events[0])
        elif events:
            self._store_batch(events)

    def store_event_batch(self, events: Sequence[EventLogEntry]) -> None:
        if events:
            with self._pending_lock:  # the run's held events go first, in order
                run_id = events[0].run_id
                self._store_held(run_id, self._pending.get(run_id, []))
        self._store_batch(events)

    def _store_batch(self, events: Sequence[EventLogEntry]) -> None:
        if len(events) < 2 or not batchable(events):
            super().store_event_batch(events)
            return
        rows = [self._event_to_row(e) for e in events]
        with self.run_connection(events[0].run_id) as conn:
            conn.execute(SqlEventLogStorageTable.insert(), rows)
        with self.index_transaction() as conn:
            # One executemany for the batch. Its first insert takes the database's write lock,
            # held until this transaction commits, and each insert takes the next id: the batch's
            # ids are the last len(rows), in the rows' order, up to the table's largest.
            conn.execute(SqlEventLogStorageTable.insert(), rows)
            last = int(conn.execute(select(func.max(SqlEventLogStorageTable.c.id))).scalar_one())
            ids = list(range(last - len(rows) + 1, last + 1))
            self._store_asset_event_tags(conn, events, ids)
            # As Dagster's PostgreSQL storage does: the asset's latest-event entry from the last.
            self._store_asset_event(conn, events[-1], ids[-1])


_EMPTY_RUN_DB: list[bytes | None] = []  # once made: the bytes, or None if it could not be
_EMPTY_RUN_DB_LOCK = threading.Lock()


def _empty_run_db(initdb: Callable[[Engine], None]) -> bytes | None:
    """An empty run database made by `initdb` (Dagster's initialization) once per process, in a
    private directory; None, and not tried again, if it cannot be made there."""
    with _EMPTY_RUN_DB_LOCK:
        if not _EMPTY_RUN_DB:
            _EMPTY_RUN_DB.append(_make_empty_run_db(initdb))
        return _EMPTY_RUN_DB[0]


def _make_empty_run_db(initdb: Callable[[Engine], None]) -> bytes | None:
    try:
        with tempfile.TemporaryDirectory(prefix="rollups-run-db-") as tmp:
            db = Path(tmp, "empty.db")
            engine = create_engine(f"sqlite:///{db}", poolclass=NullPool)
            try:
                initdb(engine)
            finally:
                engine.dispose()
            if Path(f"{db}-wal").exists():  # not checkpointed: the file alone is not whole
                raise OSError(f"{db} kept a write-ahead log")
            return db.read_bytes()
    except (OSError, sqlite3.Error, sqlalchemy.exc.SQLAlchemyError) as exc:
        log.warning("no empty run database to copy (%s): Dagster makes each run's", exc)
        return None
