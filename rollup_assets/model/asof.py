"""As-of reads: which version of a Delta table a reader saw at a given time.

A table's history is its commits, each with a version and a commit time. The state at time T is
the newest version committed at or before T. It stays readable while the log still holds that
version and no vacuum deleted its files: a vacuum run at time V with retention R deletes files
removed before V - R, so every state at or after V - R keeps its files.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from rollup_assets.model.durations import format_duration
from rollup_assets.model.errors import AsOfUnavailableError
from rollup_assets.model.windows import as_utc, iso_utc


@dataclass(frozen=True)
class Commit:
    """One commit of a table's log: its version, its time, and for a vacuum the retention it
    kept files for (None: not a vacuum)."""

    version: int
    at: datetime
    vacuum_retention: timedelta | None = None


def oldest_readable(commits: Sequence[Commit]) -> datetime | None:
    """The oldest time whose state the table can still show (None: no commit at all)."""
    if not commits:
        return None
    first = min(commits, key=lambda c: c.version).at
    floors = [c.at - c.vacuum_retention for c in commits if c.vacuum_retention is not None]
    return max([first, *floors])


def version_at(table: str, commits: Sequence[Commit], at: datetime) -> int:
    """The version of `table` a reader saw at `at`: the newest committed at or before it.

    Raises AsOfUnavailableError (naming the table, the time and the oldest readable time) when
    the table did not exist yet at `at` or its state then is no longer kept."""
    version = _version_at(table, commits, at, optional=False)
    assert version is not None
    return version


def version_if_existed(table: str, commits: Sequence[Commit], at: datetime) -> int | None:
    """`version_at`, but None when the table did not exist yet at `at` (its first commit,
    version 0, is later): a table created on first use, such as a pointer table."""
    return _version_at(table, commits, at, optional=True)


def _version_at(
    table: str, commits: Sequence[Commit], at: datetime, *, optional: bool
) -> int | None:
    at = as_utc(at)
    oldest = oldest_readable(commits)
    if oldest is None:
        if optional:
            return None
        raise AsOfUnavailableError(f"'{table}' has no commits: nothing to read as of {iso_utc(at)}")
    ordered = sorted(commits, key=lambda c: c.version)
    created = ordered[0].version == 0
    before = [c for c in ordered if c.at <= at]
    if not before:
        if created and optional:
            return None
        if created:
            raise AsOfUnavailableError(
                f"'{table}' did not exist yet at {iso_utc(at)}; the oldest time still readable "
                f"is {iso_utc(oldest)}"
            )
        raise AsOfUnavailableError(
            f"'{table}' as of {iso_utc(at)} is older than its log keeps; the oldest time still "
            f"readable is {iso_utc(oldest)}"
        )
    if at < oldest:
        vacuums = [c for c in ordered if c.vacuum_retention is not None]
        kept = (
            f" (a vacuum at {iso_utc(vacuums[-1].at)} kept files for "
            f"{format_duration(vacuums[-1].vacuum_retention or timedelta(0))})"
            if vacuums
            else ""
        )
        raise AsOfUnavailableError(
            f"'{table}' as of {iso_utc(at)} is older than what retention still keeps{kept}; "
            f"the oldest time still readable is {iso_utc(oldest)}"
        )
    return before[-1].version
