"""Commits to Delta tables through delta-rs: one transaction of the files a plan adds and removes,
planned from a fresh snapshot and planned again after a conflict, creating the table with its
first commit and bringing an older table's columns and statistics settings up to date first.
"""

import datetime as dt
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from rollup_assets.model.errors import FenceMovedError
from rollup_assets.resources.delta_tables import (
    INDEXED_COLUMNS,
    TABLE_CONFIGURATION,
    open_table,
    with_retries,
)

log = logging.getLogger(__name__)


def nullable_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_nullable(True) for f in schema])


@dataclass(frozen=True)
class CommitPlan:
    """What one Delta commit adds and removes. Built fresh from the snapshot on each attempt."""

    adds: Sequence[AddAction]
    removes: Sequence[RemoveAction] = ()
    # (app id, version) pairs recorded with the commit; a concurrent commit recording the same
    # app id makes this one conflict and be planned again. Recorded even without any file change.
    app_transactions: Sequence[tuple[str, int]] = ()


def commit(
    uri: str,
    plan: Callable[[DeltaTable | None], CommitPlan],
    *,
    schema: pa.Schema,
    partition_by: Sequence[str] = (),
    metadata: dict[str, str] | None = None,
    storage_options: dict[str, str] | None = None,
    app_txn: tuple[str, int] | None = None,
    attempts: int = 8,
    identity: str | None = None,
) -> int:
    """Commit `plan(snapshot)` in one transaction, creating the table if needed; return its version.

    `plan` is called again with a fresh snapshot after a conflict, so removals always refer to
    files that still exist. With `app_txn=(app_id, version)` the commit is a compare-and-set:
    a concurrent commit carrying the same app id makes this one fail and retry. With `identity`
    (`table_identity` read when the action began), it commits only to that very table: one
    deleted and created again at `uri` since (whose files the action may have written into the
    deleted one) fails the commit with FenceMovedError, committing nothing.
    """
    created = [False]

    def attempt() -> int:
        table = open_table(uri, storage_options)
        created[0] = table is None
        if identity is not None and table_identity(table) != identity:
            raise FenceMovedError(
                f"commit to {uri}: the table was deleted (and perhaps created again) since the "
                "action began; nothing was committed"
            )
        if table is not None:
            table = _with_columns_of(_with_every_column_indexed(table), schema)
        p = plan(table)
        actions: list[AddAction | RemoveAction] = [*p.removes, *p.adds]
        if table is not None and not actions and not p.app_transactions:
            return table.version()  # nothing to change: no empty commit
        txns = [*([app_txn] if app_txn else []), *p.app_transactions]
        props = CommitProperties(
            custom_metadata=metadata,
            app_transactions=[Transaction(a, v) for a, v in txns] or None,
        )
        if table is None:
            create_table_with_add_actions(
                uri,
                DeltaSchema.from_arrow(nullable_schema(schema)),
                list(p.adds),
                mode="error",
                partition_by=list(partition_by) or None,
                configuration=TABLE_CONFIGURATION,
                commit_properties=props,
                storage_options=storage_options or None,
            )
            table = open_table(uri, storage_options)
            assert table is not None
            return table.version()
        table.create_write_transaction(
            actions,
            mode="append",
            schema=table.schema(),
            partition_by=list(partition_by) or None,
            commit_properties=props,
        )
        table.update_incremental()
        return table.version()

    def retryable(exc: Exception) -> bool:
        return isinstance(exc, CommitFailedError) or (
            created[0] and isinstance(exc, DeltaError) and "already exists" in str(exc).lower()
        )

    return with_retries(attempt, retryable=retryable, attempts=attempts, what=f"commit to {uri}")


def table_identity(table: DeltaTable | None) -> str:
    """What tells one table at a location from another created there after it was deleted: its
    Delta metadata id ("" when there is no table)."""
    return "" if table is None else str(table.metadata().id)


def _with_columns_of(table: DeltaTable, schema: pa.Schema) -> DeltaTable:
    """`table`, given the columns of `schema` it lacks (a table written before they existed:
    nullable, so its rows read them as null), in a commit of its own."""
    have = set(pa.schema(table.schema().to_arrow()).names)
    missing = [f for f in nullable_schema(schema) if f.name not in have]
    if missing:
        log.info("%s: adding column(s) %s", table.table_uri, ", ".join(f.name for f in missing))
        table.alter.add_columns(list(DeltaSchema.from_arrow(pa.schema(missing)).fields))
        table.update_incremental()
    return table


def _with_every_column_indexed(table: DeltaTable) -> DeltaTable:
    """`table`, reading the statistics of every column (a table created before
    `TABLE_CONFIGURATION` asked for them: its files' statistics of the columns after the 32nd
    were written but not read, so nothing was pruned by them), in a commit of its own."""
    if table.metadata().configuration.get(INDEXED_COLUMNS) != "-1":
        log.info("%s: reading the statistics of every column", table.table_uri)
        table.alter.set_table_properties({INDEXED_COLUMNS: "-1"})
        table.update_incremental()
    return table


def remove_action(add: dict, now_ms: int | None = None) -> RemoveAction:
    """A RemoveAction for a row of `DeltaTable.get_add_actions(flatten=True)`."""
    pv = {k.split(".", 1)[1]: _pv_string(v) for k, v in add.items() if k.startswith("partition.")}
    return RemoveAction(
        path=add["path"],
        data_change=True,
        deletion_timestamp=now_ms or int(time.time() * 1000),
        size=int(add["size_bytes"]),
        partition_values=pv,
    )


def _pv_string(v: object) -> str | None:
    if v is None:
        return None
    if isinstance(v, dt.datetime):
        return v.strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(v, dt.date):
        return v.isoformat()
    return str(v)
