"""As-of reads choose, per table, the newest version committed at or before the asked time, and
refuse a time before the table existed or older than its log or a vacuum still keeps."""

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from rollup_assets.model.asof import Commit, oldest_readable, version_at, version_if_existed
from rollup_assets.model.errors import AsOfUnavailableError
from rollup_assets.resources.delta_tables import commit_history

T0 = datetime(2025, 3, 30, 12, 0, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


LOG = [Commit(0, at(0)), Commit(1, at(10)), Commit(2, at(20)), Commit(3, at(30))]


@pytest.mark.parametrize(
    ("minutes", "version"),
    [(0, 0), (5, 0), (10, 1), (19.99, 1), (20, 2), (29, 2), (30, 3), (10_000, 3)],
)
def test_the_newest_version_committed_by_then(minutes: float, version: int) -> None:
    assert version_at("energy_daily", LOG, at(minutes)) == version
    assert version_if_existed("energy_daily", LOG, at(minutes)) == version


def test_the_log_order_decides_not_the_listing_order() -> None:
    assert version_at("t", list(reversed(LOG)), at(25)) == 2


def test_before_the_table_existed_is_refused_naming_the_oldest_readable_time() -> None:
    with pytest.raises(AsOfUnavailableError) as err:
        version_at("energy_daily", LOG, at(-1))
    text = str(err.value)
    assert "'energy_daily' did not exist yet at 2025-03-30T11:59:00Z" in text
    assert "oldest time still readable is 2025-03-30T12:00:00Z" in text
    # A pointer table created by the first flip: before it, there were no pointers.
    assert version_if_existed("energy_daily__genmap", LOG, at(-1)) is None


def test_older_than_the_log_keeps_is_refused() -> None:
    kept = LOG[2:]  # versions 0 and 1 expired from the log
    with pytest.raises(
        AsOfUnavailableError,
        match="older than its log keeps; the oldest time still readable is 2025-03-30T12:20:00Z",
    ):
        version_at("energy_daily", kept, at(15))
    with pytest.raises(AsOfUnavailableError):
        version_if_existed("energy_daily", kept, at(15))
    assert version_at("energy_daily", kept, at(21)) == 2


def test_a_vacuum_keeps_only_states_younger_than_its_retention() -> None:
    log = [*LOG, Commit(4, at(60), vacuum_retention=timedelta(minutes=35))]
    assert oldest_readable(log) == at(25)
    assert version_at("energy_daily", log, at(25)) == 2
    with pytest.raises(AsOfUnavailableError) as err:
        version_at("energy_daily", log, at(24))
    text = str(err.value)
    assert "older than what retention still keeps" in text
    assert "kept files for 35m" in text and "2025-03-30T12:25:00Z" in text


def test_a_table_without_commits_has_nothing_to_read() -> None:
    assert oldest_readable([]) is None
    assert version_if_existed("t", [], at(0)) is None
    with pytest.raises(AsOfUnavailableError, match="'t' has no commits"):
        version_at("t", [], at(0))


def test_commit_history_reads_times_and_vacuum_retention(tmp_path) -> None:
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"a": [1]}))
    write_deltalake(uri, pa.table({"a": [2]}), mode="overwrite")
    DeltaTable(uri).vacuum(
        retention_hours=0, enforce_retention_duration=False, dry_run=False, full=True
    )
    history = commit_history(DeltaTable(uri))
    commits = [c for c, _ in history]
    assert [c.version for c in commits] == list(range(len(commits)))
    assert all(c.at.tzinfo is not None for c in commits)
    vacuums = [c for c in commits if c.vacuum_retention is not None]
    assert vacuums and vacuums[0].vacuum_retention == timedelta(0)
    # Every state before the vacuum lost its files: only the vacuum's own time is readable.
    assert oldest_readable(commits) == vacuums[0].at
