"""Recompute jobs: what triggered them, their states, and the ledger's view of them.

A job is recorded as a sequence of events (a snapshot of the job after each state change); the
ledger's state is the fold of those events in order, where the first terminal state sticks.
Pending jobs *are* the pending recompute ranges.
"""

import bisect
import dataclasses
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from rollup_assets.model.cells import Cells
from rollup_assets.model.windows import Window, merge_windows


class Lane(StrEnum):
    """The two ways a run writes a rollup."""

    FORWARD = "forward"  # close buckets past the watermark, refresh open buckets (generation 0)
    RECOMPUTE = "recompute"  # recompute closed buckets at a new generation, then flip


class Trigger(StrEnum):
    FORWARD = "Forward"
    OPEN_BUCKET = "OpenBucket"
    MANUAL = "Manual"
    PERIODIC = "Periodic"
    CHAIN = "ChainPropagation"
    MAINTENANCE = "Maintenance"  # buckets rewritten whole to fold their cell pointers
    ROLLBACK = "Rollback"  # an earlier job's cells given back the generation it replaced
    # Cells whose rows a fold cannot know exactly (their kept extremes ran out), aggregated again
    # from their source before a fold of their buckets, or a run of the level above, reads them.
    REFRESH = "Refresh"

    @property
    def lane(self) -> Lane:
        """The lane whose jobs this trigger starts (the recompute jobs are the job history)."""
        if self in (Trigger.FORWARD, Trigger.OPEN_BUCKET):
            return Lane.FORWARD
        return Lane.RECOMPUTE


class JobState(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SWAPPING = "Swapping"
    COMPLETED = "Completed"
    FAILED = "Failed"
    COALESCED = "Coalesced"

    @property
    def terminal(self) -> bool:
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.COALESCED)

    @property
    def active(self) -> bool:
        return self in (JobState.RUNNING, JobState.SWAPPING)


class ChangeKind(StrEnum):
    APPEND = "Append"
    RETROACTIVE_MODIFY = "RetroactiveModify"


class ChangeSource(StrEnum):
    MANUAL = "Manual"
    PIPELINE = "Pipeline"
    IMPORT = "Import"


def new_job_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass(frozen=True)
class RetryPolicy:
    """How often failed work is tried again: at most `attempts` runs in all, the n-th retry
    waiting `backoff * factor**(n-1)` after the failure (wall-clock time: a transient storage
    error needs real time to pass, whatever instant the forward lane's clock is pinned at)."""

    attempts: int = 5
    backoff: timedelta = timedelta(seconds=10)
    factor: int = 3

    def delay(self, attempt: int) -> timedelta:
        """How long the retry after failed attempt number `attempt` (1-based) waits."""
        return self.backoff * self.factor ** max(0, attempt - 1)


@dataclass(frozen=True)
class ChangePart:
    """Part of a correction's work: the changes `commits` of the source made to the rows of
    `cells` (cells of the chain's first level: the rows' own buckets and entities). Up the
    chain, `seen_at` is the version of the level below's pointer table from which it showed
    them (None at the first level, whose changes each count from their own commit)."""

    commits: tuple[int, ...]
    cells: Cells
    seen_at: int | None = None

    def within(self, buckets: Iterable[Window]) -> "ChangePart":
        """This part narrowed to the rows in `buckets` (of this level or one above): its cells'
        spans cut to them (the first level's buckets nest in every level's)."""
        spans = merge_windows(list(buckets))
        starts = [b.start for b in spans]
        if not self.cells or not spans:
            return ChangePart(self.commits, Cells(), self.seen_at)
        # Every cell inside one span (a correction's buckets above cover its days): unchanged.
        first = min(w.start for w, _ in self.cells)
        last = max(w.end for w, _ in self.cells)
        i = max(bisect.bisect_right(starts, first) - 1, 0)
        if spans[i].start <= first and last <= spans[i].end:
            return self
        kept = []
        for w, scope in self.cells:
            i = max(bisect.bisect_right(starts, w.start) - 1, 0)
            inside = i < len(spans) and spans[i].start <= w.start < w.end <= spans[i].end
            if inside:
                kept.append((w, scope))  # inside one span (the common case): kept as it is
                continue
            while i < len(spans) and spans[i].start < w.end:
                lo, hi = max(w.start, spans[i].start), min(w.end, spans[i].end)
                if lo < hi:
                    kept.append((Window(lo, hi), scope))
                i += 1
        return ChangePart(self.commits, Cells(tuple(kept)), self.seen_at)


@dataclass(frozen=True)
class Job:
    rollup: str
    trigger: Trigger
    windows: tuple[Window, ...]
    entities: frozenset[str] | None = None  # None: every entity (of at least one bucket)
    state: JobState = JobState.PENDING
    job_id: str = field(default_factory=new_job_id)
    seq: int = 0
    generation: int | None = None
    windows_processed: int | None = None
    rows_processed: int | None = None
    source_archive: str | None = None
    source_version: int | None = None
    change_kind: ChangeKind | None = None
    change_source: ChangeSource | None = None
    coalesced_into: str | None = None
    run_id: str | None = None
    error: str | None = None
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    started_at: datetime | None = None
    finished_at: datetime | None = None
    duration_ms: int | None = None
    # Per bucket, the entities the job covers there, when that is narrower than every window
    # for `entities` (None: `windows` x `entities`). See `placement.cells_of`.
    cells: Cells | None = None
    # What the run found: how it computed (`technique`), the source rows it aggregated, and the
    # cells whose partials changed (written and flipped) or did not (left as they are).
    technique: str | None = None
    source_rows: int | None = None
    cells_changed: int | None = None
    cells_skipped: int | None = None
    # Why the technique was chosen (the cost model's reasoning), the source change rows applied
    # as deltas, and the cells corrected from changes (changed or not).
    plan: str | None = None
    change_rows: int | None = None
    cells_applied: int | None = None
    # A rollback: the id of the job whose flip it undid.
    undoes: str | None = None
    # Which run of this work it is (1: the first), and the earliest instant (UTC, wall clock) a
    # retry may start: failed work is queued again with a backoff (`RetryPolicy`).
    attempt: int = 1
    not_before: datetime | None = None
    # Failed with its last attempt spent: its work is queued by nobody (health shows it).
    gave_up: bool = False
    # A correction (`services.correction`): which source rows' changes it applies to its cells
    # as differences, as parts (the commits, and the first level's cells whose rows they are);
    # None: a job that aggregates its cells again from their source. Each source commit's
    # change to a cell is in one part of one job: merging corrections joins their parts.
    parts: "tuple[ChangePart, ...] | None" = None
    # A job that aggregated cells from their source (or a forward run): the version of the
    # source it read (a raw table's version, or the level below's pointer table version). A
    # correction of one of those cells skips the changes that version already holds.
    read_version: int | None = None

    @property
    def corrects(self) -> bool:
        """Does this job apply changes as differences (rather than aggregate again)?"""
        return self.parts is not None

    @property
    def run_order(self) -> int:
        """Which work a run takes first (a run takes one kind, never two): 0 aggregates its
        cells again from their source, 1 applies changes as differences (which a run of the
        first kind may hold already), 2 folds what is visible (and only where it may: merged
        into a fold, other work would be dropped)."""
        if self.trigger is Trigger.MAINTENANCE:
            return 2
        return 1 if self.corrects else 0

    def next(self, **changes: object) -> "Job":
        """This job after a state change (the next event of it)."""
        return dataclasses.replace(self, seq=self.seq + 1, **changes)  # type: ignore[arg-type]

    def again(self, windows: tuple[Window, ...] | None = None) -> "Job":
        """A new pending job for this job's work (or for `windows` of it): same rollup, trigger,
        entities and provenance, a new id."""
        return Job(
            self.rollup,
            self.trigger,
            self.windows if windows is None else windows,
            entities=self.entities,
            source_archive=self.source_archive,
            source_version=self.source_version,
            change_kind=self.change_kind,
            change_source=self.change_source,
            cells=self.cells,
            parts=self.parts if windows is None else self.parts_within(windows),
        )

    def parts_within(self, buckets: Iterable[Window]) -> "tuple[ChangePart, ...] | None":
        """A correction's parts narrowed to the rows in `buckets` (None for other jobs)."""
        if self.parts is None:
            return None
        spans = tuple(buckets)
        narrowed = (p.within(spans) for p in self.parts)
        return tuple(p for p in narrowed if p.cells)

    def narrowed(self, windows: tuple[Window, ...]) -> "Job":
        """This job's next event, covering only `windows` of its work."""
        return self.next(windows=windows, parts=self.parts_within(windows))

    def fail(
        self,
        error: str,
        *,
        policy: RetryPolicy,
        now: datetime | None = None,
        windows: tuple[Window, ...] | None = None,
        permanent: bool = False,
    ) -> list["Job"]:
        """The events that end this job Failed with `error` and queue its work (or `windows` of
        it; none when empty) again as the next attempt, after `policy`'s backoff. Once the
        policy's last attempt is spent, or at once for a `permanent` failure (one no retry can
        mend, such as work over raw rows retention removed), the job ends Failed for good
        (`gave_up`)."""
        now = now or datetime.now(UTC)
        if windows == ():
            return [self.next(state=JobState.FAILED, error=error, finished_at=now)]
        if permanent or self.attempt >= policy.attempts:
            why = "not retried" if permanent else f"gave up after {self.attempt} attempt(s)"
            failed = self.next(
                state=JobState.FAILED, error=f"{why}: {error}", finished_at=now, gave_up=True
            )
            return [failed]
        retry = dataclasses.replace(
            self.again(windows),
            attempt=self.attempt + 1,
            not_before=now + policy.delay(self.attempt),
        )
        failed = self.next(
            state=JobState.FAILED,
            error=f"{error} (attempt {self.attempt} of {policy.attempts}; retried as "
            f"{retry.job_id})",
            finished_at=now,
        )
        return [failed, retry]

    def due(self, now: datetime) -> bool:
        """May this (pending) job run at wall-clock instant `now` (its backoff has passed)?"""
        return self.not_before is None or self.not_before <= now


@dataclass(frozen=True)
class CursorMove:
    """Change detection has read source table `source` up to `version`, on the table whose Delta
    id is `table_id` (a table deleted and created again under the same name is another table, and
    counts its versions from 0 again). A `version` of None forgets the cursor."""

    source: str
    version: int | None
    table_id: str | None = None


@dataclass(frozen=True)
class LedgerSnapshot:
    jobs: dict[str, Job]
    cursors: dict[str, int]
    # The table each cursor was read on (None: recorded before tables were told apart).
    tables: dict[str, str | None] = field(default_factory=dict)

    def for_rollup(self, rollup: str) -> list[Job]:
        return sorted(
            (j for j in self.jobs.values() if j.rollup == rollup), key=lambda j: j.created_at
        )

    def pending(self, rollup: str) -> list[Job]:
        return [j for j in self.for_rollup(rollup) if j.state is JobState.PENDING]

    def active(self, rollup: str) -> list[Job]:
        return [j for j in self.for_rollup(rollup) if j.state.active]

    def refreshing(self, rollup: str) -> list[Window]:
        """The buckets of `rollup` a refresh pending or in flight aggregates again
        (`Trigger.REFRESH`): the levels above wait for it before they read those buckets."""
        return [
            w
            for j in self.for_rollup(rollup)
            if j.trigger is Trigger.REFRESH and (j.state is JobState.PENDING or j.state.active)
            for w in j.windows
        ]

    def last_rollback(self, rollup: str) -> Job | None:
        """The rollup's newest completed rollback, if any."""
        done = [
            j
            for j in self.for_rollup(rollup)
            if j.trigger is Trigger.ROLLBACK and j.state is JobState.COMPLETED
        ]
        return done[-1] if done else None


def cursor_moves(
    cursors: Mapping[str, int] | None = None,
    tables: Mapping[str, str | None] | None = None,
    forget: Iterable[str] = (),
) -> list[CursorMove]:
    """The moves that forget the cursors of `forget`, then move `cursors` (read on `tables`)."""
    moves = [CursorMove(source, None) for source in forget]
    moves += [
        CursorMove(source, version, (tables or {}).get(source))
        for source, version in (cursors or {}).items()
    ]
    return moves


def refreshed_first(windows: Iterable[Window], refreshing: Iterable[Window]) -> bool:
    """Does work over `windows` read buckets a refresh aggregates again (`refreshing`, as
    `LedgerSnapshot.refreshing` gives them, of the level it reads)? Then it waits for it."""
    spans = list(refreshing)
    return any(w.overlaps(r) for w in windows for r in spans)


def fold(
    events: Iterable[Job], moves: Iterable[CursorMove] = (), onto: LedgerSnapshot | None = None
) -> LedgerSnapshot:
    """The ledger's state after `events` (job snapshots, in recording order) and cursor moves:
    each job is its newest event, except that the first terminal state sticks; a cursor is the
    furthest version recorded for its source since it was last forgotten or moved to another
    table. With `onto`, the state after the events that made `onto` and then these (`onto` is
    left as it was)."""
    jobs: dict[str, Job] = dict(onto.jobs) if onto else {}
    for job in events:
        prev = jobs.get(job.job_id)
        if prev is not None and prev.state.terminal:
            continue
        jobs[job.job_id] = job
    cursors: dict[str, int] = dict(onto.cursors) if onto else {}
    tables: dict[str, str | None] = dict(onto.tables) if onto else {}
    for move in moves:
        if move.version is None:
            cursors.pop(move.source, None)
            tables.pop(move.source, None)
        elif move.source in cursors and move.table_id == tables[move.source]:
            cursors[move.source] = max(cursors[move.source], move.version)
        else:
            cursors[move.source], tables[move.source] = move.version, move.table_id
    return LedgerSnapshot(jobs, cursors, tables)
