"""Delta tables through delta-rs: opening, committing (retried on conflicts), and reading the
log (file lists with their stats, single commits, and small tables cached while unchanged).
"""

import datetime as dt
import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from rollup_assets.model.asof import Commit
from rollup_assets.model.errors import UnsupportedTableFeatureError
from rollup_assets.model.windows import Window, merge_windows
from rollup_assets.resources.warehouse import filesystem_for

log = logging.getLogger(__name__)

# Statistics of every column, not Delta's default first 32: the bookkeeping columns a rollup's
# row table prunes its files by (`generation` above all) come after its companions.
INDEXED_COLUMNS = "delta.dataSkippingNumIndexedCols"
TABLE_CONFIGURATION = {"delta.checkpointInterval": "10", INDEXED_COLUMNS: "-1"}

R = TypeVar("R")


_LAST_INSTANT = dt.datetime.max.replace(tzinfo=dt.UTC)


def with_retries(
    action: Callable[[], R],
    *,
    retryable: Callable[[Exception], bool],
    attempts: int,
    what: str,
    delay: float = 0.02,
    backoff: bool = True,
) -> R:
    """Run `action` until it succeeds; an exception for which `retryable` holds is tried again
    (after `delay` seconds, doubled each time when `backoff`), up to `attempts` in all."""
    for attempt in range(attempts):
        try:
            return action()
        except Exception as exc:
            if not retryable(exc) or attempt == attempts - 1:
                raise
            log.debug("%s conflicted (%s); retrying", what, exc)
            time.sleep(delay * 2**attempt if backoff else delay)
    raise AssertionError("unreachable")


def open_table(
    uri: str, storage_options: dict[str, str] | None = None, version: int | None = None
) -> DeltaTable | None:
    """The table at `uri`, or None if there is none yet."""
    try:
        return DeltaTable(uri, version=version, storage_options=storage_options or None)
    except TableNotFoundError:
        return None


def commit_history(table: DeltaTable) -> list[tuple[Commit, dict]]:
    """Every commit the table's log still holds, oldest first: its version and time (a vacuum's
    with the retention it kept files for), and its commit info (custom metadata included)."""
    out = []
    for info in map(with_user_metadata, table.history()):
        retention = None
        if info.get("operation") == "VACUUM START":
            params = info.get("operationParameters") or {}
            millis = params.get("specifiedRetentionMillis") or params.get("defaultRetentionMillis")
            if millis is not None:
                retention = dt.timedelta(milliseconds=int(millis))
        at = dt.datetime.fromtimestamp(int(info["timestamp"]) / 1000, tz=dt.UTC)
        out.append((Commit(int(info["version"]), at, retention), info))
    return sorted(out, key=lambda c: c[0].version)


def with_user_metadata(info: dict) -> dict:
    """A commit's info with the `rollups.*` keys a delta-spark commit of this project carries
    as a JSON object in `userMetadata` (the one free-form field delta-spark writes) set as keys
    of their own, where delta-rs commits carry them."""
    text = info.get("userMetadata")
    if not isinstance(text, str) or not text.startswith("{"):
        return info
    try:
        extra = json.loads(text)
    except ValueError:
        return info
    if not isinstance(extra, dict):
        return info
    return {**{k: str(v) for k, v in extra.items() if k.startswith("rollups.")}, **info}


def commit_info(actions: Sequence[dict]) -> dict:
    """The commit info of one commit's actions (`read_commit`), with `with_user_metadata`."""
    return with_user_metadata(next((a["commitInfo"] for a in actions if "commitInfo" in a), {}))


def commit_file(root: str, version: int) -> str:
    return f"{root}/_delta_log/{version:020d}.json"


def committed_after(
    uri: str, version: int | None, storage_options: dict[str, str] | None = None
) -> bool:
    """Has the table at `uri` a commit after `version` (None: has it been created)?

    One existence check of the next commit file, instead of opening the table again.
    """
    fs, root = filesystem_for(uri, storage_options)
    return _exists(fs, commit_file(root, 0 if version is None else version + 1))


T = TypeVar("T")


class LatestCache(Generic[T]):
    """Something derived from a small Delta table's latest version, derived again only when the
    table has moved.

    A hit costs two file stats: the cached version's commit file is unchanged (the same table,
    not one re-created at the location since) and no next commit exists. A Delta version never
    changes once written, so a hit returns exactly what reading the table would.

    With `extend`, a table that has moved only by appends (commits adding unpartitioned files,
    removing none, changing neither schema nor protocol) is not read again: `extend` gets the
    cached value and the rows those commits added. Anything else is derived afresh.
    """

    def __init__(
        self,
        derive: Callable[[DeltaTable], T],
        extend: Callable[[T, pa.Table], T] | None = None,
    ) -> None:
        self._derive = derive
        self._extend = extend
        self._entries: dict[str, tuple[int, tuple[int | None, int | None], T]] = {}
        self._lock = threading.Lock()

    def get(self, uri: str, storage_options: dict[str, str] | None = None) -> tuple[T, int] | None:
        """(derived value, version) of the table's latest version; None if there is no table."""
        fs, root = filesystem_for(uri, storage_options)
        with self._lock:
            entry = self._entries.get(uri)
        if entry is not None:
            version, stamp, value = entry
            if _stamp(fs, commit_file(root, version)) == stamp:
                if not _exists(fs, commit_file(root, version + 1)):
                    return value, version
                appended = _appended_since(fs, root, version) if self._extend else None
                if appended is not None and self._extend is not None:
                    latest, rows = appended
                    value = self._extend(value, rows)
                    self._store(uri, latest, _stamp(fs, commit_file(root, latest)), value)
                    return value, latest
        table = open_table(uri, storage_options)
        if table is None:
            return None
        version = table.version()
        value = self._derive(table)
        self._store(uri, version, _stamp(fs, commit_file(root, version)), value)
        return value, version

    def _store(
        self, uri: str, version: int, stamp: tuple[int | None, int | None], value: T
    ) -> None:
        with self._lock:
            self._entries[uri] = (version, stamp, value)


# Actions after which a table's rows are not its earlier rows plus the files added.
_NOT_AN_APPEND = frozenset({"remove", "metaData", "protocol", "cdc"})


def _appended_since(fs: pafs.FileSystem, root: str, version: int) -> tuple[int, pa.Table] | None:
    """(newest version, the rows its commits after `version` added) if every one of those
    commits only appended; None otherwise."""
    paths: list[str] = []
    latest = version
    while True:
        try:
            actions = _read_commit(fs, root, latest + 1)
        except FileNotFoundError:
            break
        for action in actions:
            if _NOT_AN_APPEND & action.keys():
                return None
            add = action.get("add")
            if add is not None:
                if add.get("partitionValues") or add.get("deletionVector"):
                    return None
                paths.append(add["path"])
        latest += 1
    parts = [pq.read_table(f"{root}/{urllib.parse.unquote(p)}", filesystem=fs) for p in paths]
    return latest, pa.concat_tables(parts, promote_options="default") if parts else pa.table({})


def _stamp(fs: pafs.FileSystem, path: str) -> tuple[int | None, int | None]:
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        return None, None
    return info.mtime_ns, info.size


def _exists(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type != pafs.FileType.NotFound


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
) -> int:
    """Commit `plan(snapshot)` in one transaction, creating the table if needed; return its version.

    `plan` is called again with a fresh snapshot after a conflict, so removals always refer to
    files that still exist. With `app_txn=(app_id, version)` the commit is a compare-and-set:
    a concurrent commit carrying the same app id makes this one fail and retry.
    """
    created = [False]

    def attempt() -> int:
        table = open_table(uri, storage_options)
        created[0] = table is None
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


DELETION_VECTORS = "deletionVectors"
# The key `file_actions(..., deletion_vectors="mark")` sets on each file: does it carry one?
DELETION_VECTOR = "deletion_vector"


def file_actions(
    table: DeltaTable, *, deletion_vectors: Literal["refuse", "mark"] = "refuse"
) -> list[dict]:
    """Every live file of the snapshot with its stats.

    Keys: `min.<col>`, `max.<col>`, `partition.<col>`. Every reader of these files reads them
    whole, so a file with rows deleted by a deletion vector is refused
    (UnsupportedTableFeatureError); with `deletion_vectors="mark"` such files are returned with
    `DELETION_VECTOR` set instead, for a caller that refuses only the files it reads
    (`refuse_deletion_vectors`).
    """
    files = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    carrying = _carrying_deletion_vectors(table)
    if carrying and deletion_vectors == "refuse":
        raise _deletion_vectors_refused(table, len(carrying))
    if carrying:
        for f in files:
            f[DELETION_VECTOR] = urllib.parse.unquote(f["path"]) in carrying
    return files


def refuse_deletion_vectors(table: DeltaTable, files: Sequence[dict]) -> None:
    """UnsupportedTableFeatureError if one of `files` (of `file_actions(table,
    deletion_vectors="mark")`) has rows deleted by a deletion vector."""
    carrying = sum(bool(f.get(DELETION_VECTOR)) for f in files)
    if carrying:
        raise _deletion_vectors_refused(table, carrying)


def _carrying_deletion_vectors(table: DeltaTable) -> set[str]:
    """The files of the snapshot (relative paths, decoded) that carry a deletion vector.

    delta-spark writes them on DELETE, UPDATE and MERGE once a table enables the feature; a
    Parquet reader that does not apply them brings the deleted rows back. The feature enabled
    with no file carrying one (or after a purge) reads as any table."""
    if DELETION_VECTORS not in (table.protocol().reader_features or []):
        return set()
    root = urllib.parse.unquote(table.table_uri.rstrip("/")) + "/"
    return {
        urllib.parse.unquote(uri).removeprefix(root)
        for uri in pa.table(table.deletion_vectors())["filepath"].to_pylist()
    }


def _deletion_vectors_refused(table: DeltaTable, files: int) -> UnsupportedTableFeatureError:
    uri = table.table_uri.rstrip("/")
    path = urllib.parse.unquote(uri.removeprefix("file://"))
    return UnsupportedTableFeatureError(
        uri.rsplit("/", 1)[-1],
        DELETION_VECTORS,
        f"{files} file(s) it would read (table {uri}, version {table.version()}) have rows "
        "deleted by deletion vectors, which this project's Parquet readers do not apply, so "
        "nothing is read rather than deleted rows. Rewrite those files without the deleted "
        f"rows with delta-spark: REORG TABLE delta.`{path}` APPLY (PURGE); to keep writers "
        "from making more, set the table property 'delta.enableDeletionVectors' = 'false'",
    )


def read_commit(
    uri: str, version: int, storage_options: dict[str, str] | None = None
) -> list[dict]:
    """The actions of one commit, parsed from `_delta_log/<version>.json`."""
    fs, root = filesystem_for(uri, storage_options)
    return _read_commit(fs, root, version)


def _read_commit(fs: pafs.FileSystem, root: str, version: int) -> list[dict]:
    with fs.open_input_stream(commit_file(root, version)) as f:
        text = f.read().decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def prune_files(
    files: list[dict],
    *,
    time_column: str,
    spans: Sequence[Window] | None,
    entities: frozenset[str] | None,
    day_column: str | None = None,
) -> list[dict]:
    """Files (rows of `file_actions`) whose UTC-day partition and stats say they may hold rows
    with `time_column` in `spans` and `entity_id` in `entities` (None: no limit)."""
    merged = merge_windows(list(spans)) if spans else None
    out = []
    for f in files:
        if merged is not None:
            day = f.get(f"partition.{day_column}") if day_column else None
            if day is not None:
                d0 = dt.datetime.combine(day, dt.time(0), tzinfo=dt.UTC)
                # The day's end (the last representable day has none: up to the last instant).
                d1 = d0 + dt.timedelta(days=1) if day < dt.date.max else _LAST_INSTANT
                if not any(w.start < d1 and d0 < w.end for w in merged):
                    continue
            lo, hi = f.get(f"min.{time_column}"), f.get(f"max.{time_column}")
            if (
                lo is not None
                and hi is not None
                and not any(lo < w.end and hi >= w.start for w in merged)
            ):
                continue
        elo, ehi = f.get("min.entity_id"), f.get("max.entity_id")
        if (
            entities is not None
            and elo is not None
            and ehi is not None
            and not any(elo <= e <= ehi for e in entities)
        ):
            continue
        out.append(f)
    return out
