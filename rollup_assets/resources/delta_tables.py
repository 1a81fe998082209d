"""Delta tables through delta-rs: opening them, the settings they are created with, retrying an
action that conflicts, and reading the log (commit history, single commits, and the live files
of a snapshot with their statistics, pruned by them).
"""

import datetime as dt
import json
import logging
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Literal, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from rollup_assets.compute.window_bounds import WindowBounds
from rollup_assets.model.asof import Commit
from rollup_assets.model.errors import UnsupportedTableFeatureError
from rollup_assets.model.windows import Window
from rollup_assets.resources.warehouse import filesystem_for

log = logging.getLogger(__name__)

# Statistics of every column, not Delta's default first 32: the bookkeeping columns a rollup's
# row table prunes its files by (`generation` above all) come after its companions.
INDEXED_COLUMNS = "delta.dataSkippingNumIndexedCols"
TABLE_CONFIGURATION = {"delta.checkpointInterval": "10", INDEXED_COLUMNS: "-1"}

R = TypeVar("R")
# How often a commit of a raw table that lost a race with a concurrent one (an ingest, a delete,
# a refresh of computed columns) is tried.
MERGE_ATTEMPTS = 8


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
        raise _deletion_vectors_refused(table.table_uri, table.version(), len(carrying))
    if carrying:
        for f in files:
            f[DELETION_VECTOR] = urllib.parse.unquote(f["path"]) in carrying
    return files


def refuse_deletion_vectors(table: DeltaTable | str, version: int, files: Sequence[dict]) -> None:
    """UnsupportedTableFeatureError if one of `files` (of `file_actions(table,
    deletion_vectors="mark")` at `version`; `table` or its uri) has rows deleted by a deletion
    vector."""
    carrying = sum(bool(f.get(DELETION_VECTOR)) for f in files)
    if carrying:
        uri = table if isinstance(table, str) else table.table_uri
        raise _deletion_vectors_refused(uri, version, carrying)


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


def _deletion_vectors_refused(uri: str, version: int, files: int) -> UnsupportedTableFeatureError:
    uri = uri.rstrip("/")
    path = urllib.parse.unquote(uri.removeprefix("file://"))
    return UnsupportedTableFeatureError(
        uri.rsplit("/", 1)[-1],
        DELETION_VECTORS,
        f"{files} file(s) it would read (table {uri}, version {version}) have rows "
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
    return commit_actions(fs, root, version)


def commit_actions(fs: pafs.FileSystem, root: str, version: int) -> list[dict]:
    """`read_commit` of the table at `root` on `fs` (a filesystem the caller already holds)."""
    with fs.open_input_stream(commit_file(root, version)) as f:
        text = f.read().decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


_LAST_INSTANT = dt.datetime.max.replace(tzinfo=dt.UTC)


def prune_files(
    files: list[dict],
    *,
    time_column: str,
    spans: Sequence[Window] | WindowBounds | None,
    entities: frozenset[str] | None,
    day_column: str | None = None,
) -> list[dict]:
    """Files (rows of `file_actions`) whose UTC-day partition and stats say they may hold rows
    with `time_column` in `spans` (windows, or their `WindowBounds` when the caller has them)
    and `entity_id` in `entities` (None, or no spans: no limit)."""
    given = spans if isinstance(spans, WindowBounds) else WindowBounds.of(spans or [])
    bounds = given if len(given.lo) else None
    out = []
    for f in files:
        if bounds is not None:
            day = f.get(f"partition.{day_column}") if day_column else None
            if day is not None:
                d0 = dt.datetime.combine(day, dt.time(0), tzinfo=dt.UTC)
                # The day's end (the last representable day has none: up to the last instant).
                d1 = d0 + dt.timedelta(days=1) if day < dt.date.max else _LAST_INSTANT
                if not bounds.overlaps(d0, d1):
                    continue
            lo, hi = f.get(f"min.{time_column}"), f.get(f"max.{time_column}")
            if lo is not None and hi is not None and not bounds.overlaps(lo, hi, closed=True):
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


# A file whose rows span more days than this is looked at for every span (`span_pruner`).
_INDEXED_DAYS = 400


def span_pruner(
    files: list[dict],
    *,
    time_column: str,
    entities: frozenset[str] | None,
    day_column: str | None = None,
) -> Callable[[Window], list[dict]]:
    """`prune_files` of `files` for one span at a time, for many spans (a fill plans one per
    storage partition): each file is indexed once under the UTC days its statistics (or its day
    partition) bound it to, so a span prunes only the files of its own days."""
    day = dt.timedelta(days=1)
    by_day: dict[dt.date, list[int]] = {}
    anywhere: list[int] = []
    for i, f in enumerate(files):
        lo, hi = f.get(f"min.{time_column}"), f.get(f"max.{time_column}")
        if lo is None or hi is None:
            part = f.get(f"partition.{day_column}") if day_column else None
            lo = hi = None if part is None else dt.datetime.combine(part, dt.time(0), dt.UTC)
        if lo is None or hi is None or (hi - lo).days > _INDEXED_DAYS:
            anywhere.append(i)
            continue
        d, last = lo.astimezone(dt.UTC).date(), hi.astimezone(dt.UTC).date()
        while d <= last:
            by_day.setdefault(d, []).append(i)
            d += day

    def files_for(span: Window) -> list[dict]:
        first = span.start.astimezone(dt.UTC).date()
        last = (span.end - dt.timedelta(microseconds=1)).astimezone(dt.UTC).date()
        if (last - first).days > _INDEXED_DAYS:
            picked: set[int] = set(range(len(files)))
        else:
            picked = set(anywhere)
            d = first
            while d <= last:
                picked.update(by_day.get(d, ()))
                d += day
        return prune_files(
            [files[i] for i in sorted(picked)],
            time_column=time_column,
            spans=[span],
            entities=entities,
            day_column=day_column,
        )

    return files_for
