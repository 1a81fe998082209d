"""The forward planner's rules: what closes, what waits, and when the open bucket is refreshed."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from rollup_assets.model.forward import ForwardWork, forward_work, open_buckets
from rollup_assets.model.jobs import Job, JobState, Lane, LedgerSnapshot, Trigger
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.specs import RawArchiveSpec, RollupSpec, TimeRangeArchiveSpec
from rollup_assets.model.states import ArchiveState, ArchiveStatus
from rollup_assets.model.windows import Window
from rollup_assets.sensors.drain import Launch
from rollup_assets.sensors.forward_plan import plan_forward
from tests.unit.planning import MemoryLedger, update

CATALOG = load_catalog()
H = timedelta(hours=1)
M = timedelta(minutes=1)
# Europe/Vienna is UTC+2 in May: its midnights are at 22:00 UTC.
W = datetime(2025, 5, 2, tzinfo=UTC)
VIENNA_MAY_2 = Window(datetime(2025, 5, 1, 22, tzinfo=UTC), datetime(2025, 5, 2, 22, tzinfo=UTC))
VIENNA_MAY_3 = Window(datetime(2025, 5, 2, 22, tzinfo=UTC), datetime(2025, 5, 3, 22, tzinfo=UTC))


class FakeSourceLog:
    """Source versions as given; `changed_within` answers `changed` and records each question."""

    def __init__(
        self,
        versions: dict[str, int] | None = None,
        changed: bool = False,
    ) -> None:
        self.versions = versions or {}
        self.changed = changed
        self.asked: list[tuple[str, int, Window]] = []

    def version(self, spec: RawArchiveSpec | TimeRangeArchiveSpec | RollupSpec) -> int | None:
        return self.versions.get(spec.name)

    def changed_within(
        self, spec: RawArchiveSpec | TimeRangeArchiveSpec, after: int, window: Window
    ) -> bool:
        self.asked.append((spec.name, after, window))
        return self.changed


def states(**watermarks: datetime) -> dict[str, ArchiveState]:
    """The raw archive and the named rollups activated at these watermarks; the rest Created."""
    out = {"energy_raw": ArchiveState("energy_raw", status=ArchiveStatus.ACTIVATED)}
    for name, mark in watermarks.items():
        out[f"energy_{name}"] = ArchiveState(
            f"energy_{name}", status=ArchiveStatus.ACTIVATED, watermark=mark
        )
    return out


def refreshed(
    rollup: str,
    bucket: Window,
    at: datetime,
    source_version: int | None = None,
    finished: datetime | None = None,
) -> Job:
    """A completed forward job that read `bucket` (then open) starting at `at`."""
    return Job(
        rollup,
        Trigger.OPEN_BUCKET,
        (bucket,),
        state=JobState.COMPLETED,
        windows_processed=1,
        source_version=source_version,
        created_at=at,
        started_at=at,
        finished_at=finished or at + M,
    )


def plan(
    states: dict[str, ArchiveState],
    now: datetime,
    sources: FakeSourceLog,
    ledger: LedgerSnapshot | None = None,
    in_flight: set[str] | None = None,
    deleted: dict[str, datetime] | None = None,
) -> list[Launch]:
    snapshot = ledger or MemoryLedger().snapshot()
    return plan_forward(CATALOG, states, snapshot, in_flight or set(), now, sources, deleted or {})


def test_closed_buckets_are_launched_in_the_forward_lane_with_the_open_bucket() -> None:
    sources = FakeSourceLog()
    launches = plan(states(hourly=W), W + 2 * H + 10 * M, sources)
    assert launches == [
        Launch(
            "energy_hourly",
            Lane.FORWARD,
            Trigger.FORWARD,
            [Window(W, W + H), Window(W + H, W + 2 * H), Window(W + 2 * H, W + 3 * H)],
        )
    ]
    assert sources.asked == []  # a closing run always refreshes the open bucket


def test_a_bucket_closes_only_after_the_watermark_lag() -> None:
    # Inside the lag the ended bucket is still open: refreshed, not closed.
    early = plan(states(hourly=W), W + H + 4 * M, FakeSourceLog())
    assert [(lch.trigger, lch.buckets) for lch in early] == [
        (Trigger.OPEN_BUCKET, [Window(W, W + H), Window(W + H, W + 2 * H)])
    ]
    due = plan(states(hourly=W), W + H + 5 * M, FakeSourceLog())
    assert [(lch.trigger, lch.buckets) for lch in due] == [
        (Trigger.FORWARD, [Window(W, W + H), Window(W + H, W + 2 * H)])
    ]


@pytest.mark.parametrize(
    "status",
    [ArchiveStatus.CREATED, ArchiveStatus.DISABLED, ArchiveStatus.FAILED, ArchiveStatus.DELETED],
)
def test_nothing_is_launched_for_a_rollup_that_is_not_activated(status: ArchiveStatus) -> None:
    s = states(hourly=W)
    assert plan(s, W + 3 * H, FakeSourceLog()) != []  # activated, it would close buckets
    update(s, "energy_hourly", status=status)
    assert plan(s, W + 3 * H, FakeSourceLog()) == []


# The hourly level closes 22:00 and 23:00 UTC; the daily level may close Vienna's May 2.
NOW = datetime(2025, 5, 3, 0, 30, tzinfo=UTC)
HOURLY_MARK = VIENNA_MAY_2.end


def test_a_level_waits_while_the_level_below_is_launched_in_the_same_plan() -> None:
    s = states(hourly=HOURLY_MARK, daily=VIENNA_MAY_2.start)
    launches = plan(s, NOW, FakeSourceLog())
    assert [(lch.rollup, lch.trigger) for lch in launches] == [("energy_hourly", Trigger.FORWARD)]


def test_a_level_waits_while_a_run_below_it_is_in_flight() -> None:
    s = states(hourly=HOURLY_MARK, daily=VIENNA_MAY_2.start)
    assert plan(s, NOW, FakeSourceLog(), in_flight={"energy_hourly"}) == []
    # A run in flight above a level holds nothing back below it.
    launches = plan(s, NOW, FakeSourceLog(), in_flight={"energy_daily"})
    assert [lch.rollup for lch in launches] == ["energy_hourly"]


def test_a_level_is_launched_when_the_level_below_has_nothing_to_do() -> None:
    s = states(hourly=NOW - 30 * M, daily=VIENNA_MAY_2.start)
    hour = Window(NOW - 30 * M, NOW + 30 * M)
    ledger = MemoryLedger()
    ledger.record([refreshed("energy_hourly", hour, NOW - 10 * M, source_version=4)])
    launches = plan(s, NOW, FakeSourceLog({"energy_raw": 4}), ledger.snapshot())
    assert launches == [
        Launch("energy_daily", Lane.FORWARD, Trigger.FORWARD, [VIENNA_MAY_2, VIENNA_MAY_3])
    ]


def test_a_level_waits_while_a_refresh_of_the_level_below_is_pending() -> None:
    """The days' forward run would read hours a refresh aggregates again (`Trigger.REFRESH`):
    the days reading them wait for the refresh, the others do not. A refresh of hours it does
    not read holds nothing back."""
    s = states(hourly=NOW - 30 * M, daily=VIENNA_MAY_2.start)
    hour = Window(NOW - 30 * M, NOW + 30 * M)
    ledger = MemoryLedger()
    ledger.record([refreshed("energy_hourly", hour, NOW - 10 * M, source_version=4)])
    earlier = Job("energy_hourly", Trigger.REFRESH, (Window(NOW - 200 * H, NOW - 199 * H),))
    ledger.record([earlier])
    launches = plan(s, NOW, FakeSourceLog({"energy_raw": 4}), ledger.snapshot())
    assert [lch.rollup for lch in launches] == ["energy_daily"]
    # An hour of May 3 (Vienna): May 2 closes, May 3 (open) waits.
    refresh = Job("energy_hourly", Trigger.REFRESH, (Window(NOW - 2 * H, NOW - H),))
    ledger.record([refresh])
    launches = plan(s, NOW, FakeSourceLog({"energy_raw": 4}), ledger.snapshot())
    assert [(lch.rollup, lch.buckets) for lch in launches] == [("energy_daily", [VIENNA_MAY_2])]
    # An hour of May 2: May 2 waits, and nothing closes after it; the open May 3 is refreshed.
    ledger.record([refresh.next(state=JobState.COMPLETED)])
    ledger.record([Job("energy_hourly", Trigger.REFRESH, (Window(NOW - 20 * H, NOW - 19 * H),))])
    launches = plan(s, NOW, FakeSourceLog({"energy_raw": 4}), ledger.snapshot())
    assert [(lch.trigger, lch.buckets) for lch in launches] == [
        (Trigger.OPEN_BUCKET, [VIENNA_MAY_3])
    ]
    ledger.record([refresh.next(state=JobState.COMPLETED)])
    launches = plan(s, NOW, FakeSourceLog({"energy_raw": 4}), ledger.snapshot())
    assert [lch.rollup for lch in launches] == ["energy_daily"]


OPEN = Window(W, W + H)  # the open hourly bucket at W + 30 min


def test_open_buckets_are_the_ones_the_clock_has_not_closed() -> None:
    hourly = CATALOG.rollup("energy_hourly")
    state = states(hourly=W)["energy_hourly"]
    assert open_buckets(hourly, state, W + 30 * M) == [OPEN]
    # Ended less than the 5-minute lag ago: still open, ahead of the current one.
    assert open_buckets(hourly, state, W + H + 4 * M) == [OPEN, Window(W + H, W + 2 * H)]
    assert open_buckets(hourly, state, W + H + 5 * M) == [Window(W + H, W + 2 * H)]
    # At 04:10 a lag of 150 minutes keeps the buckets ending after 01:40 open (never one before
    # the watermark).
    slow = replace(hourly, watermark_lag=150 * M)
    now = W + 4 * H + 10 * M
    hours = [Window(W + i * H, W + (i + 1) * H) for i in range(5)]
    assert open_buckets(slow, state, now) == hours[1:]
    marked = replace(state, watermark=W + 3 * H)
    assert open_buckets(slow, marked, now) == hours[3:]
    # Frozen buckets and a rollup that does not refresh its open buckets have none.
    assert open_buckets(hourly, replace(state, frozen_until=W + H), W + 30 * M) == []
    assert open_buckets(replace(hourly, refresh_open_bucket=False), state, W + 30 * M) == []


def test_forward_work_closes_what_may_close_and_refreshes_what_the_source_changed_in() -> None:
    """The rule the planner and a run's walk up the chain share: the source's change decides an
    open bucket's refresh only when nothing closes."""
    hourly = CATALOG.rollup("energy_hourly")
    marks = states(hourly=W)
    asked: list[Window] = []

    def changed_in(bucket: Window) -> bool:
        asked.append(bucket)
        return bucket == OPEN

    work = forward_work(CATALOG, hourly, marks["energy_hourly"], W + 30 * M, marks, changed_in)
    assert work == ForwardWork([], [OPEN]) and work.trigger is Trigger.OPEN_BUCKET
    assert asked == [OPEN]
    asked.clear()
    later = W + H + 4 * M  # the first hour closes only past the 5-minute lag: both are open
    work = forward_work(CATALOG, hourly, marks["energy_hourly"], later, marks, changed_in)
    assert work.buckets == [OPEN] and asked == [OPEN, Window(W + H, W + 2 * H)]
    asked.clear()
    closing = W + H + 10 * M
    work = forward_work(CATALOG, hourly, marks["energy_hourly"], closing, marks, changed_in)
    assert work == ForwardWork([OPEN], [Window(W + H, W + 2 * H)])
    assert work.trigger is Trigger.FORWARD and asked == []
    idle = forward_work(CATALOG, hourly, marks["energy_hourly"], W + 30 * M, marks, lambda b: False)
    assert not idle and idle.buckets == []


def test_each_open_bucket_is_refreshed_until_a_forward_run_has_read_it() -> None:
    # The run that read the bucket now inside the lag did not read the current one yet.
    ledger = MemoryLedger()
    ledger.record([refreshed("energy_hourly", OPEN, W + 10 * M, source_version=4)])
    sources = FakeSourceLog({"energy_raw": 4})
    launches = plan(states(hourly=W), W + H + 2 * M, sources, ledger.snapshot())
    assert launches == [
        Launch("energy_hourly", Lane.FORWARD, Trigger.OPEN_BUCKET, [Window(W + H, W + 2 * H)])
    ]


def test_the_open_bucket_is_refreshed_until_a_forward_run_has_read_it() -> None:
    launches = plan(states(hourly=W), W + 30 * M, FakeSourceLog({"energy_raw": 4}))
    assert launches == [Launch("energy_hourly", Lane.FORWARD, Trigger.OPEN_BUCKET, [OPEN])]


def test_the_open_bucket_is_not_refreshed_when_the_source_has_no_new_commit() -> None:
    ledger = MemoryLedger()
    ledger.record([refreshed("energy_hourly", OPEN, W + 10 * M, source_version=4)])
    sources = FakeSourceLog({"energy_raw": 4}, changed=True)
    assert plan(states(hourly=W), W + 30 * M, sources, ledger.snapshot()) == []
    assert sources.asked == []


@pytest.mark.parametrize("changed", [False, True])
def test_the_open_bucket_is_refreshed_only_when_the_source_changed_inside_it(
    changed: bool,
) -> None:
    ledger = MemoryLedger()
    ledger.record([refreshed("energy_hourly", OPEN, W + 10 * M, source_version=4)])
    sources = FakeSourceLog({"energy_raw": 6}, changed=changed)
    launches = plan(states(hourly=W), W + 30 * M, sources, ledger.snapshot())
    assert sources.asked == [("energy_raw", 4, OPEN)]
    expected = [Launch("energy_hourly", Lane.FORWARD, Trigger.OPEN_BUCKET, [OPEN])]
    assert launches == (expected if changed else [])


@pytest.mark.parametrize("deleted", ["energy_raw", "energy_hourly"])
def test_a_run_that_read_a_table_deleted_since_does_not_count_as_having_read_it(
    deleted: str,
) -> None:
    """The source (or the rollup) was deleted and created again after the last forward run read
    the open bucket, and the new table has reached the very version number that run read: the
    open bucket is refreshed all the same."""
    ledger = MemoryLedger()
    ledger.record([refreshed("energy_hourly", OPEN, W + 10 * M, source_version=4)])
    sources = FakeSourceLog({"energy_raw": 4})
    later = {deleted: W + 20 * M}
    launches = plan(states(hourly=W), W + 30 * M, sources, ledger.snapshot(), deleted=later)
    assert launches == [Launch("energy_hourly", Lane.FORWARD, Trigger.OPEN_BUCKET, [OPEN])]
    # Deleted before that run read it: the run counts, and nothing changed since.
    earlier = {deleted: W + 5 * M}
    assert plan(states(hourly=W), W + 30 * M, sources, ledger.snapshot(), deleted=earlier) == []


def test_a_forward_run_that_wrote_nothing_did_not_read_the_open_bucket() -> None:
    """The days' forward run met a cell of the hours it cannot know and ended behind its
    refresh, writing nothing: the open day is still to be read, though no hourly job wrote into
    it since."""
    now = datetime(2025, 5, 3, 10, 30, tzinfo=UTC)
    hour = Window(now - 30 * M, now + 30 * M)
    ledger = MemoryLedger()
    ledger.record(
        [
            refreshed("energy_hourly", hour, now - 40 * M, source_version=4),
            refreshed("energy_daily", VIENNA_MAY_3, now - 50 * M),
            replace(refreshed("energy_daily", VIENNA_MAY_3, now - 20 * M), windows_processed=0),
        ]
    )
    s = states(hourly=hour.start, daily=VIENNA_MAY_3.start)
    launches = plan(s, now, FakeSourceLog({"energy_raw": 4}), ledger.snapshot())
    assert [(lch.rollup, lch.buckets) for lch in launches] == [("energy_daily", [VIENNA_MAY_3])]


def test_a_new_open_bucket_is_refreshed_even_without_new_commits() -> None:
    ledger = MemoryLedger()
    ledger.record([refreshed("energy_hourly", OPEN, W + 10 * M, source_version=4)])
    sources = FakeSourceLog({"energy_raw": 4})
    # An hour later the open bucket has moved on (and the watermark with it).
    launches = plan(states(hourly=W + H), W + H + 30 * M, sources, ledger.snapshot())
    assert [lch.buckets for lch in launches] == [[Window(W + H, W + 2 * H)]]


@pytest.mark.parametrize(("finished", "expected"), [(-5 * M, False), (5 * M, True)])
def test_a_rollup_source_changed_the_open_bucket_through_its_own_jobs(
    finished: timedelta, expected: bool
) -> None:
    # Daily read its open bucket (Vienna's May 3) at `read`; an hourly recompute writing into
    # it counts if it finished after that read started.
    now = datetime(2025, 5, 3, 10, 30, tzinfo=UTC)
    read = now - 20 * M
    hour = Window(now - 30 * M, now + 30 * M)
    ledger = MemoryLedger()
    ledger.record(
        [
            # The hourly level itself is idle: its open bucket was read at the raw table's
            # version, before daily read its own.
            refreshed("energy_hourly", hour, read - 5 * M, source_version=4),
            refreshed("energy_daily", VIENNA_MAY_3, read),
            Job(
                "energy_hourly",
                Trigger.PERIODIC,
                (Window(hour.start - 2 * H, hour.start - H),),
                state=JobState.COMPLETED,
                windows_processed=1,
                created_at=read - H,
                started_at=read - H,
                finished_at=read + finished,
            ),
        ]
    )
    s = states(hourly=hour.start, daily=VIENNA_MAY_3.start)
    launches = plan(s, now, FakeSourceLog({"energy_raw": 4}), ledger.snapshot())
    assert launches == (
        [Launch("energy_daily", Lane.FORWARD, Trigger.OPEN_BUCKET, [VIENNA_MAY_3])]
        if expected
        else []
    )
