"""Consistent snapshots of a rollup: its row table at one version with the pointers valid for
it, taken now, at a pair of versions recorded earlier, or as of an instant; and that pair of
versions, the state of the rollup a read or a row reflects (`Reflected`).

A snapshot takes the pointer table, then the row-table snapshot, then checks that the pointer
table did not move in between (a sweep only ever follows a flip, so an unchanged pointer version
proves that every visible row is still in the snapshot); otherwise it is taken again.

A read that never writes through the row table takes a `read_snapshot`: the row table's version
opened (and its files listed) once for every read of it, until the rollup moves.
"""

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from rollup_assets.model.asof import version_at, version_if_existed
from rollup_assets.model.errors import AsOfUnavailableError
from rollup_assets.model.operations import OPERATION_KEY, Operation
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import iso_utc
from rollup_assets.resources.delta_tables import (
    commit_history,
    file_actions,
    open_table,
    with_retries,
)
from rollup_assets.resources.genmap import read_pointers, read_pointers_at
from rollup_assets.resources.latest_versions import LatestVersions, VersionCache, committed_after
from rollup_assets.resources.rollup_table import RollupTable

T = TypeVar("T")


class PointersMoved(Exception):
    """The pointer table moved while a snapshot was taken; take it again."""


@dataclass(frozen=True)
class Reflected:
    """Versions of a rollup's pointer and row tables (-1: no table): the state of its active
    rows that something read or reflects."""

    genmap: int
    rows: int

    def at_or_before(self, other: "Reflected") -> bool:
        """Is this state no later than `other` (both tables at or before its versions)?"""
        return self.genmap <= other.genmap and self.rows <= other.rows

    def lineage(self, spec: RollupSpec) -> dict[str, int]:
        """The source versions a row computed from this state of `spec` records."""
        return {spec.name: self.rows, spec.genmap_name: self.genmap}


class _Opened:
    """One version of a row table opened for reads, its files listed at most once."""

    def __init__(self, table: DeltaTable) -> None:
        self.table = table
        self._files: tuple[dict, ...] | None = None
        self._lock = threading.Lock()

    def files(self) -> list[dict]:
        with self._lock:
            if self._files is None:
                self._files = tuple(file_actions(self.table))
            return list(self._files)


@dataclass(frozen=True)
class Snapshot:
    """A consistent pair: the row table at one version and the pointers valid for it."""

    table: DeltaTable | None
    pointers: pa.Table
    genmap_version: int | None
    # The table as reads share it (`read_snapshot`): its files are listed once.
    opened: _Opened | None = field(default=None, compare=False, repr=False)

    def files(self) -> list[dict]:
        """The row table's live files with their statistics (`file_actions`; none without a
        table)."""
        if self.opened is not None:
            return self.opened.files()
        return [] if self.table is None else file_actions(self.table)

    @property
    def version(self) -> int | None:
        return None if self.table is None else self.table.version()

    @property
    def reflects(self) -> Reflected:
        return Reflected(_v(self.genmap_version), _v(self.version))

    def lineage(self, spec: RollupSpec) -> dict[str, int]:
        """The source versions a row computed from this snapshot of `spec` records."""
        return self.reflects.lineage(spec)


def _v(version: int | None) -> int:
    return -1 if version is None else version


# The latest version of each row table, from its commit files' stats, not a log replay.
_ROW_VERSIONS = LatestVersions()
# The row-table versions reads opened last (`read_snapshot`): a read of a version another read
# opened costs a file stat, not a log replay and a listing of its files.
_OPENED: VersionCache[_Opened] = VersionCache(_Opened, size=16)


class RollupSnapshots(RollupTable):
    """Snapshots of a rollup's tables, and the versions its commits made."""

    def snapshot(self, spec: RollupSpec, attempts: int = 20) -> Snapshot:
        def attempt() -> Snapshot:
            pointers, gv = read_pointers(self.genmap_uri(spec), self.options)
            table = open_table(self.uri(spec), self.options)
            if committed_after(self.genmap_uri(spec), gv, self.options):
                raise PointersMoved(f"'{spec.name}': pointers kept moving")
            return Snapshot(table, pointers, gv)

        return self._consistent(spec, attempt, attempts)

    def read_snapshot(self, spec: RollupSpec, attempts: int = 20) -> Snapshot:
        """A `snapshot` taken now for a read that never writes through its table: the row
        table's version, opened once, is shared by every read of it."""

        def attempt() -> Snapshot:
            pointers, gv = read_pointers(self.genmap_uri(spec), self.options)
            version = _ROW_VERSIONS.get(self.uri(spec), self.options)
            opened = None if version is None else _OPENED.get(self.uri(spec), version, self.options)
            if committed_after(self.genmap_uri(spec), gv, self.options):
                raise PointersMoved(f"'{spec.name}': pointers kept moving")
            table = None if opened is None else opened.table
            return Snapshot(table, pointers, gv, opened)

        return self._consistent(spec, attempt, attempts)

    def reflects_now(self, spec: RollupSpec, attempts: int = 20) -> Reflected:
        """What a `snapshot` taken now reflects, taken the same way (the pointers' version, then
        the row table's, again if the pointers moved in between) without opening the row table:
        for a read that the surface answers while it holds exactly those versions' rows."""

        def attempt() -> Reflected:
            _, gv = read_pointers(self.genmap_uri(spec), self.options)
            rows = _ROW_VERSIONS.get(self.uri(spec), self.options)
            if committed_after(self.genmap_uri(spec), gv, self.options):
                raise PointersMoved(f"'{spec.name}': pointers kept moving")
            return Reflected(_v(gv), _v(rows))

        return self._consistent(spec, attempt, attempts)

    def _consistent(self, spec: RollupSpec, attempt: Callable[[], T], attempts: int) -> T:
        try:
            return with_retries(
                attempt,
                retryable=lambda exc: isinstance(exc, PointersMoved),
                attempts=attempts,
                what=f"snapshot of '{spec.name}'",
                delay=0.005,
                backoff=False,
            )
        except PointersMoved:
            raise RuntimeError(
                f"'{spec.name}': pointers kept moving; could not take a consistent snapshot"
            ) from None

    def snapshot_of(self, spec: RollupSpec, version: int, genmap_version: int | None) -> Snapshot:
        """The row table at `version` with the pointers of `genmap_version`: the snapshot a
        reader (or a run of the level above) took then. Raises FileNotFoundError when that
        version is no longer in the log."""
        try:
            table = open_table(self.uri(spec), self.options, version=version)
            pointers = read_pointers_at(self.genmap_uri(spec), genmap_version, self.options)
        except DeltaError as exc:
            raise FileNotFoundError(
                f"'{spec.name}' at version {version} (pointers {genmap_version}) is no longer "
                f"readable: {exc}"
            ) from exc
        return Snapshot(table, pointers, genmap_version)

    def snapshot_at(self, spec: RollupSpec, at: datetime) -> Snapshot:
        """The snapshot a reader took at `at`: the row table and the pointer table each at the
        newest version committed by then (from their logs' commit times).

        The pair is consistent: a recompute commits its rows before it flips, and sweeps only
        after, so the rows the pointers of `at` name are in the row table of `at`. Raises
        AsOfUnavailableError when `at` is before the rollup existed or older than what retention
        keeps (vacuumed files, an expired log)."""
        rows = open_table(self.uri(spec), self.options)
        if rows is None:
            raise AsOfUnavailableError(
                f"'{spec.name}' has no rows table yet: nothing to read as of {iso_utc(at)}"
            )
        version = version_at(spec.name, [c for c, _ in commit_history(rows)], at)
        genmap = open_table(self.genmap_uri(spec), self.options)
        gv = None
        if genmap is not None:
            history = [c for c, _ in commit_history(genmap)]
            gv = version_if_existed(spec.genmap_name, history, at)
        pointers = read_pointers_at(self.genmap_uri(spec), gv, self.options)
        return Snapshot(open_table(self.uri(spec), self.options, version), pointers, gv)

    def committed_by(self, spec: RollupSpec, job_id: str, operation: Operation) -> int | None:
        """The version of the commit of `job_id` with `operation` (a recompute's rows: the row
        table; a flip: the pointer table), if the table's log still holds it."""
        uri = self.uri(spec) if operation == Operation.RECOMPUTE else self.genmap_uri(spec)
        table = open_table(uri, self.options)
        if table is None:
            return None
        for commit_, info in reversed(commit_history(table)):
            if info.get("rollups.job_id") == job_id and info.get(OPERATION_KEY) == operation:
                return commit_.version
        return None

    def pointers_at(self, spec: RollupSpec, version: int | None) -> pa.Table:
        """The pointer table as of `version` (None or -1: before its first commit)."""
        return read_pointers_at(self.genmap_uri(spec), version, self.options)

    def table_at(self, spec: RollupSpec, version: int) -> DeltaTable | None:
        return open_table(self.uri(spec), self.options, version)
