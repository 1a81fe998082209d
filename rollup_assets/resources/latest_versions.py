"""Noticing that a Delta table has moved without opening it: whether a commit follows a version
(`committed_after`), its latest version (`LatestVersions`), and values derived from a small
table's latest version, kept while the table does not move and extended by what appends added
(`LatestCache`), or from one version of it (`VersionCache`).
"""

import threading
import urllib.parse
from collections.abc import Callable
from typing import Generic, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable

from rollup_assets.resources.delta_tables import commit_actions, commit_file, open_table
from rollup_assets.resources.warehouse import filesystem_for


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
            if stamp == (None, None):
                # The commit file is gone already (the table dropped while it was read): a later
                # check of a missing file would match this stamp, so nothing is kept.
                self._entries.pop(uri, None)
            else:
                self._entries[uri] = (version, stamp, value)


class VersionCache(Generic[T]):
    """Something derived from one version of a Delta table, kept for the `size` versions read
    last. A hit costs one file stat: the version's commit file is the one it was derived from
    (a Delta version never changes once written; a table re-created at the location since has
    commit files of its own)."""

    def __init__(self, derive: Callable[[DeltaTable], T], size: int = 8) -> None:
        self._derive = derive
        self._size = size
        self._entries: dict[tuple[str, int], tuple[tuple[int | None, int | None], T]] = {}
        self._lock = threading.Lock()

    def get(
        self, uri: str, version: int, storage_options: dict[str, str] | None = None
    ) -> T | None:
        """The value derived from version `version` of the table at `uri` (None: no table)."""
        fs, root = filesystem_for(uri, storage_options)
        stamp = _stamp(fs, commit_file(root, version))
        with self._lock:
            entry = self._entries.get((uri, version))
        if entry is not None and entry[0] == stamp and stamp != (None, None):
            return entry[1]
        table = open_table(uri, storage_options, version)
        if table is None:
            return None
        value = self._derive(table)
        with self._lock:
            self._entries.pop((uri, version), None)
            self._entries[(uri, version)] = (stamp, value)
            while len(self._entries) > self._size:
                self._entries.pop(next(iter(self._entries)))
        return value


class LatestVersions:
    """Each table's latest version, told from its log's commit files. While the version seen
    last is still in place (its commit file unchanged), the commits after it are found by file
    stats alone, one per commit and one more; the table is opened only the first time and after
    it was re-created."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int, tuple[int | None, int | None]]] = {}
        self._lock = threading.Lock()

    def get(self, uri: str, storage_options: dict[str, str] | None = None) -> int | None:
        """The latest version of the table at `uri` (None: no table)."""
        fs, root = filesystem_for(uri, storage_options)
        with self._lock:
            seen = self._seen.get(uri)
        if seen is not None and _stamp(fs, commit_file(root, seen[0])) == seen[1]:
            version = seen[0]
            while _exists(fs, commit_file(root, version + 1)):
                version += 1
        else:
            table = open_table(uri, storage_options)
            if table is None:
                return None
            version = table.version()
        stamp = _stamp(fs, commit_file(root, version))
        with self._lock:
            if stamp == (None, None):  # dropped meanwhile: see `LatestCache._store`
                self._seen.pop(uri, None)
            else:
                self._seen[uri] = (version, stamp)
        return version


# Actions after which a table's rows are not its earlier rows plus the files added.
_NOT_AN_APPEND = frozenset({"remove", "metaData", "protocol", "cdc"})


def _appended_since(fs: pafs.FileSystem, root: str, version: int) -> tuple[int, pa.Table] | None:
    """(newest version, the rows its commits after `version` added) if every one of those
    commits only appended; None otherwise."""
    paths: list[str] = []
    latest = version
    while True:
        try:
            actions = commit_actions(fs, root, latest + 1)
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
