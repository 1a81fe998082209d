"""The Delta tables of raw and time-range archives: where each is, how it is configured, and
the instant retention keeps its rows from.

A raw table is partitioned by the UTC day of its time column and has the change data feed on,
so the retroactive-write sensor can see every changed row.

Retention and ingest are fenced by the table itself: a retention commit records the instant
every earlier day is dropped before as the version of the app transaction `RETAINED_FROM_KEY` (its
microseconds since the epoch), and every attempt of an ingest that may reach such old days
checks its rows against the value in the snapshot it merges into, and commits under the same
app id. A retention commit that lands between an attempt's snapshot and its commit makes the
attempt conflict; the next attempt sees the new instant and refuses the rows, writing nothing.
Without that, the MERGE retried on a snapshot without the dropped day would insert an updated
reading as a new one.
"""

import datetime as dt

from deltalake import DeltaTable

from rollup_assets.model.operations import RETAINED_FROM_KEY
from rollup_assets.model.specs import SourceSpec
from rollup_assets.resources.delta_tables import TABLE_CONFIGURATION, open_table
from rollup_assets.resources.raw_columns import S, applied_spec
from rollup_assets.resources.warehouse import Warehouse

# Raw files are capped (about 15,000 energy readings each), and an ingest's rows are sorted
# by entity and time (`batches.py`): a file holds a narrow range of entities of one
# day, so an upsert rewrites only the capped files holding the rows it changes (the MERGE
# skips the others by their statistics), whatever the number of entities or days.
RAW_FILE_BYTES = 512 * 1024
RAW_CONFIGURATION = {
    **TABLE_CONFIGURATION,
    "delta.enableChangeDataFeed": "true",
    "delta.targetFileSize": str(RAW_FILE_BYTES),
}
# What retention keeps from before any retention ran.
BEGINNING_OF_TIME = dt.datetime(1, 1, 1, tzinfo=dt.UTC)


class RawTables:
    """The tables of the raw and time-range archives in one warehouse."""

    def __init__(self, warehouse: Warehouse) -> None:
        self.warehouse = warehouse
        self.options = warehouse.storage_options

    def uri(self, spec: SourceSpec) -> str:
        return self.warehouse.raw_path(spec.name)

    def table(self, spec: SourceSpec, version: int | None = None) -> DeltaTable | None:
        return open_table(self.uri(spec), self.options, version)

    def applied(self, spec: S, table: DeltaTable | None = None) -> S:
        """`spec` with the computed columns its table applies (`raw_columns.applied_spec`)."""
        return applied_spec(spec, table if table is not None else self.table(spec))


def configured(table: DeltaTable) -> DeltaTable:
    """`table` with the raw tables' configuration (one commit changing no row, the first
    time a table created before it is written)."""
    current = table.metadata().configuration
    missing = {k: v for k, v in RAW_CONFIGURATION.items() if current.get(k) != v}
    if missing:
        table.alter.set_table_properties(missing, raise_if_not_exists=False)
        table.update_incremental()
    return table


def retained_from(table: DeltaTable) -> dt.datetime | None:
    """The instant a raw table's snapshot keeps rows from (None: retention never dropped)."""
    at = table.transaction_version(RETAINED_FROM_KEY)
    if not at:
        return None
    return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=at)
