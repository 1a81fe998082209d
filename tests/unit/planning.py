"""In-memory stand-ins for what the planners read, so their rules are tested without Delta tables:
the ledger (folded like the Delta one), archive states as a plain dict, and the source tables'
change feed as a list of commits per source."""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime

import pyarrow as pa

from rollup_assets.model.jobs import (
    ChangeSource,
    CursorMove,
    Job,
    LedgerSnapshot,
    cursor_moves,
    fold,
)
from rollup_assets.model.specs import Catalog, RawArchiveSpec, TimeRangeArchiveSpec
from rollup_assets.model.states import ArchiveState, ArchiveStatus
from rollup_assets.model.windows import Window, merge_windows
from rollup_assets.resources.change_feed import Changes
from rollup_assets.resources.ledger import decode_cells, encode_cells

CHANGED_ROWS = pa.schema([("entity_id", pa.string()), ("ts", pa.timestamp("us", tz="UTC"))])


class MemoryLedger:
    """Job events and cursor moves in recording order, folded by `model.jobs.fold` as the Delta
    ledger folds its rows. A job's windows (and the spans of its cells) come back merged, as they
    do from the Delta ledger (which stores the union of a job's windows)."""

    def __init__(self) -> None:
        self.events: list[Job] = []
        self.moves: list[CursorMove] = []

    def record(
        self,
        jobs: Sequence[Job] = (),
        cursors: Mapping[str, int] | None = None,
        *,
        tables: Mapping[str, str | None] | None = None,
        forget: Iterable[str] = (),
    ) -> None:
        self.events.extend(
            replace(
                j,
                windows=tuple(merge_windows(list(j.windows))),
                cells=decode_cells(encode_cells(j.cells)) if j.cells is not None else None,
            )
            for j in jobs
        )
        self.moves.extend(cursor_moves(cursors, tables, forget))

    def snapshot(self) -> LedgerSnapshot:
        return fold(self.events, self.moves)

    def job(self, job_id: str | None) -> Job:
        """The job's state now (it must have been recorded)."""
        job = self.snapshot().jobs.get(job_id) if job_id is not None else None
        assert job is not None, f"job {job_id} is not in the ledger"
        return job


def activated(catalog: Catalog, watermark: datetime | None) -> dict[str, ArchiveState]:
    """Every archive of `catalog` activated; every rollup's watermark at `watermark`."""
    states = {
        name: ArchiveState(name, status=ArchiveStatus.ACTIVATED)
        for name in [*catalog.raw, *catalog.time_range]
    }
    states.update(
        {
            name: ArchiveState(name, status=ArchiveStatus.ACTIVATED, watermark=watermark)
            for name in catalog.rollups
        }
    )
    return states


def update(states: dict[str, ArchiveState], name: str, **changes: object) -> None:
    """Replace `name`'s state by the next one (as the state table records a change)."""
    state = states.get(name) or ArchiveState(name)
    states[name] = replace(state, seq=state.seq + 1, **changes)  # type: ignore[arg-type]


def changed_rows(rows: Iterable[tuple[str | None, datetime]]) -> pa.Table:
    """A change feed's rows: (entity_id, ts) pairs."""
    pairs = list(rows)
    return pa.table(
        {"entity_id": [e for e, _ in pairs], "ts": [t for _, t in pairs]}, schema=CHANGED_ROWS
    )


class MemoryFeed:
    """A `ChangeReader` over commits held in memory. Each named source table is provisioned at
    version 0 (a commit that changes no row); every write adds the next version."""

    def __init__(self, *sources: str) -> None:
        self.commits: dict[str, list[Changes | None]] = {name: [None] for name in sources}
        self.ids: dict[str, str] = {name: f"{name}-1" for name in sources}
        self.read: list[tuple[str, int]] = []  # (source, version) of every `changes` call
        self.removed: dict[str, list[Window]] = {}  # what retention removed, per source

    def removed_spans(self, spec: RawArchiveSpec | TimeRangeArchiveSpec) -> list[Window]:
        return self.removed.get(spec.name, [])

    def table_id(self, spec: RawArchiveSpec | TimeRangeArchiveSpec) -> str | None:
        return self.ids.get(spec.name) if spec.name in self.commits else None

    def recreate(self, source: str) -> None:
        """The source's table deleted and created again: another table, from version 0."""
        self.commits[source] = [None]
        self.ids[source] = f"{source}-{int(self.ids[source].rsplit('-', 1)[1]) + 1}"

    def drop(self, source: str) -> None:
        """The source's table deleted."""
        del self.commits[source]

    def latest_version(self, spec: RawArchiveSpec | TimeRangeArchiveSpec) -> int | None:
        commits = self.commits.get(spec.name)
        return None if commits is None else len(commits) - 1

    def changes(self, spec: RawArchiveSpec | TimeRangeArchiveSpec, version: int) -> Changes | None:
        self.read.append((spec.name, version))
        return self.commits[spec.name][version]

    def write(
        self,
        source: str,
        rows: Iterable[tuple[str | None, datetime]],
        change_source: ChangeSource | None = ChangeSource.PIPELINE,
    ) -> int:
        """A commit whose change feed holds `rows`; its version."""
        version = len(self.commits[source])
        self.commits[source].append(Changes(version, change_source, rows=changed_rows(rows)))
        return version

    def write_files(
        self,
        source: str,
        ranges: list[tuple[datetime, datetime, str | None]],
        change_source: ChangeSource | None = ChangeSource.PIPELINE,
    ) -> int:
        """A commit known only from its files' statistics: (min, max, entity) per file."""
        version = len(self.commits[source])
        self.commits[source].append(Changes(version, change_source, ranges=list(ranges)))
        return version

    def rewrite(self, source: str) -> int:
        """A commit that changes no row (a compaction, say)."""
        self.commits[source].append(None)
        return len(self.commits[source]) - 1
