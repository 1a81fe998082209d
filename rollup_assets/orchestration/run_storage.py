"""Dagster's SQLite run storage with its engine kept.

Dagster's SQLite run storage makes a new SQLAlchemy engine for every connection, and the engine's
cache of compiled statements goes with it: every run lookup, run creation, run event and cursor
read compiled its statements again. This storage keeps one engine, with no pool: every use
still opens and closes its own SQLite connection, as Dagster's does; only the compiled
statements are kept. Same file, same tables, same rows.
"""

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from dagster._core.storage.runs import SqliteRunStorage
from dagster._serdes import ConfigurableClassData
from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.pool import NullPool


class KeptEngineSqliteRunStorage(SqliteRunStorage):
    """`SqliteRunStorage` with one engine for its life. In dagster.yaml (`rollups setup` writes
    it for SQLite homes):

        run_storage:
          module: rollup_assets.orchestration.run_storage
          class: KeptEngineSqliteRunStorage
          config:
            base_dir: /abs/path/of/the/home/history
    """

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value: Mapping[str, Any]
    ) -> "KeptEngineSqliteRunStorage":
        return cls.from_local(inst_data=inst_data, **config_value)

    def __init__(self, conn_string: str, inst_data: ConfigurableClassData | None = None) -> None:
        self._engine: Engine = create_engine(conn_string, poolclass=NullPool)
        super().__init__(conn_string, inst_data)

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        """Dagster's `connect` (a connection in a transaction) on the kept engine."""
        with self._engine.connect() as conn, conn.begin():
            yield conn

    def dispose(self) -> None:
        super().dispose()
        self._engine.dispose()
