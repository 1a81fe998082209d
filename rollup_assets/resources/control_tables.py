"""Small append-only Delta tables for control state, read whole with delta-rs.

Control rows are tiny and written by the driver (sensor, run, CLI), so they go through
`write_deltalake` directly. Each append is one commit; concurrent appends retry with a fresh
snapshot, and `app_id`/`version` turns an append into a compare-and-set.
"""

import collections
import logging
import threading
from collections.abc import Sequence

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError, DeltaError

from rollup_assets.resources.delta_tables import TABLE_CONFIGURATION, open_table, with_retries
from rollup_assets.resources.latest_versions import LatestCache

log = logging.getLogger(__name__)


class CompareAndSetConflict(Exception):
    """Another writer committed the same app version first; re-read and decide again."""


class ControlTable:
    def __init__(
        self, uri: str, schema: pa.Schema, storage_options: dict[str, str] | None = None
    ) -> None:
        self.uri = uri
        self.schema = schema
        self.storage_options = storage_options or {}
        # Sensors, runs and queries read control tables far more often than anything writes
        # them: a whole read of an unchanged table is served from memory.
        # Appends (most commits: job records, state changes) are read by their new files alone.
        self._latest = LatestCache(self._derive, extend=self._extend)
        # The latest reads that extended an earlier one: (rows, the rows they extend, added).
        self._grown: collections.deque[tuple[pa.Table, pa.Table, pa.Table]] = collections.deque(
            maxlen=32
        )
        self._grown_lock = threading.Lock()

    def read(self) -> pa.Table:
        """The table's rows at its latest version.

        A read of the version this object read last returns the same Table object, so callers
        may memoize what they derive from it.
        """
        latest = self._latest.get(self.uri, self.storage_options)
        return self.schema.empty_table() if latest is None else latest[0]

    def appended_since(self, rows: pa.Table, earlier: pa.Table) -> pa.Table | None:
        """The rows `rows` adds to `earlier`, when this object read `rows` as `earlier` followed
        by what appends added (both as `read` returned them); None when it cannot tell."""
        with self._grown_lock:
            grown = list(self._grown)
        parts: list[pa.Table] = []
        while rows is not earlier:
            step = next((g for g in reversed(grown) if g[0] is rows), None)
            if step is None:
                return None
            rows, added = step[1], step[2]
            parts.append(added)
        return pa.concat_tables(parts[::-1]) if parts else self.schema.empty_table()

    def _derive(self, table: DeltaTable) -> pa.Table:
        with self._grown_lock:
            self._grown.clear()  # nothing read from now on extends what was read before
        return self._conform(table.to_pyarrow_table())

    def _extend(self, rows: pa.Table, added: pa.Table) -> pa.Table:
        if not added.num_rows:
            return rows
        added = self._conform(added)
        extended = pa.concat_tables([rows, added])
        with self._grown_lock:
            self._grown.append((extended, rows, added))
        return extended

    def _conform(self, data: pa.Table) -> pa.Table:
        """`data` in this table's schema; a column added since the rows were written is null."""
        data = pa.table(data)
        for f in self.schema:
            if f.name not in data.column_names:
                data = data.append_column(f.name, pa.nulls(data.num_rows, f.type))
        return data.select(self.schema.names).cast(self.schema)

    def _add_missing_columns(self, table: DeltaTable) -> None:
        """Add the columns of this schema a table written by an earlier release lacks."""
        present = {f.name for f in table.schema().fields}
        missing = [f for f in self.schema if f.name not in present]
        if missing:
            table.alter.add_columns(list(DeltaSchema.from_arrow(pa.schema(missing)).fields))

    def append(
        self,
        rows: Sequence[dict],
        *,
        cas: tuple[str, int] | None = None,
        metadata: dict[str, str] | None = None,
        attempts: int = 10,
    ) -> None:
        """Append rows in one commit. With `cas=(app_id, version)`, fail with
        `CompareAndSetConflict` if that app id already reached `version`."""
        if not rows:
            return
        data = pa.Table.from_pylist(list(rows), schema=self.schema)
        props = CommitProperties(
            custom_metadata=metadata,
            app_transactions=[Transaction(cas[0], cas[1])] if cas else None,
        )

        def attempt() -> None:
            table = open_table(self.uri, self.storage_options)
            if table is not None:
                self._add_missing_columns(table)
            if cas and table is not None:
                done = table.transaction_version(cas[0])
                if done is not None and done >= cas[1]:
                    raise CompareAndSetConflict(f"{cas[0]} already at version {done}")
            try:
                write_deltalake(
                    table if table is not None else self.uri,
                    data,
                    mode="append",
                    configuration=TABLE_CONFIGURATION if table is None else None,
                    commit_properties=props,
                    storage_options=self.storage_options or None,
                )
            except (CommitFailedError, DeltaError) as exc:
                # Another writer carrying the same app id won the race: the caller decides again.
                if cas and "concurrent transaction" in str(exc).lower():
                    raise CompareAndSetConflict(str(exc)) from exc
                raise

        def retryable(exc: Exception) -> bool:
            return isinstance(exc, CommitFailedError) or (
                isinstance(exc, DeltaError) and "already exists" in str(exc).lower()
            )

        with_retries(
            attempt,
            retryable=retryable,
            attempts=attempts,
            what=f"append to {self.uri}",
            delay=0.01,
        )
