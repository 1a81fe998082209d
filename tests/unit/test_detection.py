"""The change-detection planner's rules, on in-memory commits (no Delta tables).

What real Delta commits yield as changes is tested in test_change_feed.py.
"""

from datetime import UTC, datetime, timedelta

import pytest

from rollup_assets.model.cells import Cells
from rollup_assets.model.jobs import ChangeKind, ChangeSource, Trigger
from rollup_assets.model.placement import buckets_in, cells_of
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.states import ArchiveStatus
from rollup_assets.model.windows import Window
from rollup_assets.sensors.detection import (
    DEFAULT_LIMITS,
    Detection,
    classify,
    detect,
    undetected,
)
from rollup_assets.settings import DetectionLimits
from tests.unit.planning import MemoryFeed, MemoryLedger, activated, update

T0 = datetime(2025, 5, 1, tzinfo=UTC)
WATERMARK = datetime(2025, 5, 2, tzinfo=UTC)
H = timedelta(hours=1)
CATALOG = load_catalog()
HOURLY = CATALOG.rollup("energy_hourly")


class Sources:
    """Archive states, the ledger and the raw table's commits, all in memory."""

    def __init__(self) -> None:
        self.states = activated(CATALOG, WATERMARK)
        self.ledger = MemoryLedger()
        self.feed = MemoryFeed("energy_raw")

    def write(
        self, rows: list[tuple[str, datetime]], source: ChangeSource = ChangeSource.PIPELINE
    ) -> int:
        return self.feed.write("energy_raw", rows, source)

    def detect(self, limits: DetectionLimits = DEFAULT_LIMITS) -> Detection:
        """One detection tick, recorded in the ledger as the sensor records it."""
        d = detect(CATALOG, self.states, self.ledger.snapshot(), self.feed, limits)
        self.ledger.record(d.jobs, d.cursors, tables=d.tables, forget=d.forget)
        return d

    def start_cursor(self) -> None:
        """First detection only places the cursor (history is a backfill's business)."""
        first = self.detect()
        assert first.jobs == [] and "energy_raw" in first.cursors


@pytest.fixture
def sources() -> Sources:
    return Sources()


@pytest.mark.parametrize(
    ("offset", "kind"),
    [
        (timedelta(microseconds=-1), ChangeKind.RETROACTIVE_MODIFY),
        (timedelta(0), ChangeKind.APPEND),  # exactly at the watermark: forward, not dirty
        (timedelta(minutes=15), ChangeKind.APPEND),
    ],
)
def test_classification_boundary(offset: timedelta, kind: ChangeKind) -> None:
    assert classify(WATERMARK + offset, WATERMARK) is kind


def test_nothing_consumed_means_nothing_dirty() -> None:
    assert classify(T0, None) is ChangeKind.APPEND


def test_the_first_detection_places_the_cursor_without_reading_history(
    sources: Sources,
) -> None:
    sources.write([("m1", T0)])
    latest = sources.write([("m2", T0)])
    first = sources.detect()
    assert first.jobs == [] and first.cursors == {"energy_raw": latest}
    assert sources.feed.read == [] and first.versions_read == 0
    assert any("starts at version" in n for n in first.notes), first.notes
    assert sources.ledger.snapshot().cursors == {"energy_raw": latest}


def test_commits_past_the_cursor_are_undetected_until_a_detection_reads_them(
    sources: Sources,
) -> None:
    """What the surface publish sensor asks before it launches: a correction is about to start."""

    def pending() -> list[str]:
        return undetected(CATALOG, sources.states, sources.ledger.snapshot(), sources.feed)

    sources.write([("m1", T0)])
    assert pending() == []  # no cursor yet: the first detection only places it
    sources.start_cursor()
    assert pending() == []
    sources.write([("m1", T0 + H)])
    assert pending() == ["energy_raw"]
    sources.detect()
    assert pending() == []
    # A source nobody consumes has nothing pending, whatever it holds.
    sources.write([("m2", T0)])
    update(sources.states, "energy_hourly", status=ArchiveStatus.CREATED, watermark=None)
    assert pending() == []


def test_a_write_at_the_watermark_is_not_dirty(sources: Sources) -> None:
    sources.start_cursor()
    sources.write([("m1", WATERMARK), ("m1", WATERMARK + timedelta(minutes=15))])
    d = sources.detect()
    assert d.jobs == []
    assert d.versions_read == 1 and d.rows_classified == 2  # read, and found nothing retroactive


def test_retroactive_rows_map_to_exact_buckets_and_entities(sources: Sources) -> None:
    sources.start_cursor()
    v = sources.write(
        [
            ("m1", T0 + timedelta(hours=3, minutes=15)),
            ("m2", T0 + timedelta(hours=9, minutes=45)),
            ("m2", WATERMARK + timedelta(hours=1)),  # an Append in the same commit: ignored
        ],
        source=ChangeSource.MANUAL,
    )
    d = sources.detect()
    assert len(d.jobs) == 1
    job = d.jobs[0]
    assert job.rollup == "energy_hourly" and job.trigger is Trigger.PERIODIC
    assert buckets_in(HOURLY, list(job.windows)) == [
        Window(T0 + timedelta(hours=3), T0 + timedelta(hours=4)),
        Window(T0 + timedelta(hours=9), T0 + timedelta(hours=10)),
    ]
    assert job.entities == frozenset({"m1", "m2"})
    # Two cells, not the cross product of two hours and two meters.
    expected = Cells(
        (
            (Window(T0 + timedelta(hours=3), T0 + timedelta(hours=4)), frozenset({"m1"})),
            (Window(T0 + timedelta(hours=9), T0 + timedelta(hours=10)), frozenset({"m2"})),
        )
    )
    assert cells_of(HOURLY, job) == expected
    assert (
        job.change_kind is ChangeKind.RETROACTIVE_MODIFY
        and job.change_source is ChangeSource.MANUAL
    )
    assert job.source_archive == "energy_raw" and job.source_version == v
    assert d.cursors == {"energy_raw": v}
    [summary] = d.commits
    assert (summary.version, summary.rows, summary.change_source) == (v, 3, "Manual")
    assert summary.dirty_rollups == ["energy_hourly"]
    assert summary.min_ts == T0 + timedelta(hours=3, minutes=15)
    assert summary.max_ts == WATERMARK + timedelta(hours=1)
    # The job is in the ledger as pending work, with its cells.
    [pending] = sources.ledger.snapshot().pending("energy_hourly")
    assert pending.job_id == job.job_id and cells_of(HOURLY, pending) == expected


def test_many_entities_are_not_scoped(sources: Sources) -> None:
    limits = DetectionLimits(entity_scope_limit=3)
    sources.start_cursor()
    sources.write([(f"m{i}", T0 + timedelta(hours=2)) for i in range(4)])
    assert sources.detect(limits).jobs[0].entities is None
    sources.write([(f"m{i}", T0 + timedelta(hours=2)) for i in range(3)])
    assert sources.detect(limits).jobs[0].entities == frozenset({"m0", "m1", "m2"})


def test_second_detection_after_nothing_changed_finds_nothing(sources: Sources) -> None:
    sources.start_cursor()
    sources.write([("m1", T0)])
    assert len(sources.detect().jobs) == 1
    again = sources.detect()
    assert again.jobs == [] and again.cursors == {} and again.versions_read == 0


def test_versions_per_tick_are_capped_and_resumed(sources: Sources) -> None:
    sources.start_cursor()
    versions = [sources.write([("m1", T0 + h * H)]) for h in range(5)]
    first = sources.detect(DetectionLimits(max_versions_per_tick=2))
    assert first.cursors == {"energy_raw": versions[1]} and len(first.jobs) == 2
    assert any("3 left for next tick" in n for n in first.notes), first.notes
    rest = sources.detect(DetectionLimits(max_versions_per_tick=10))
    assert rest.cursors == {"energy_raw": versions[-1]} and len(rest.jobs) == 3
    # Every version was read exactly once, in order.
    assert sources.feed.read == [("energy_raw", v) for v in versions]
    assert [j.source_version for j in [*first.jobs, *rest.jobs]] == versions


def test_a_forward_claim_makes_racing_writes_retroactive(sources: Sources) -> None:
    update(sources.states, "energy_hourly", claimed_until=WATERMARK + 2 * H)
    sources.start_cursor()
    sources.write([("m1", WATERMARK + timedelta(minutes=30))])
    jobs = sources.detect().jobs
    assert len(jobs) == 1
    assert list(jobs[0].windows) == [Window(WATERMARK, WATERMARK + H)]


def test_file_statistics_ranges_over_approximate(sources: Sources) -> None:
    sources.start_cursor()
    v = sources.feed.write_files("energy_raw", [(T0 + H, T0 + 4 * H, "m1")])
    d = sources.detect()
    job = d.jobs[0]
    hours = buckets_in(HOURLY, list(job.windows))
    # Over-approximated from the file's min/max time: every hour between, never fewer.
    assert hours[0].start <= T0 + H and hours[-1].end >= T0 + 5 * H
    assert hours == [Window(T0 + h * H, T0 + (h + 1) * H) for h in range(1, 5)]
    assert all(w.end <= WATERMARK for w in hours)
    assert job.entities == frozenset({"m1"}) and job.source_version == v
    [summary] = d.commits
    assert (summary.rows, summary.min_ts, summary.max_ts) == (None, T0 + H, T0 + 4 * H)


def test_file_ranges_stop_at_what_was_consumed(sources: Sources) -> None:
    sources.start_cursor()
    sources.feed.write_files(
        "energy_raw",
        [
            (WATERMARK - timedelta(minutes=30), WATERMARK + 3 * H, "m1"),  # straddles it
            (WATERMARK + H, WATERMARK + 2 * H, "m2"),  # entirely an Append
            (T0 + 5 * H, T0 + 5 * H, None),  # a file of several entities
        ],
    )
    [job] = sources.detect().jobs
    assert buckets_in(HOURLY, list(job.windows)) == [
        Window(T0 + 5 * H, T0 + 6 * H),
        Window(WATERMARK - H, WATERMARK),
    ]
    assert job.entities is None
    assert cells_of(HOURLY, job) == Cells(
        (
            (Window(T0 + 5 * H, T0 + 6 * H), None),
            (Window(WATERMARK - H, WATERMARK), frozenset({"m1"})),
        )
    )


def test_commits_that_change_no_row_are_skipped(sources: Sources) -> None:
    sources.start_cursor()
    v = sources.feed.rewrite("energy_raw")
    d = sources.detect()
    assert d.jobs == [] and d.commits == [] and d.versions_read == 1
    assert d.cursors == {"energy_raw": v}  # read past, not read again


def test_rollups_that_consumed_nothing_are_skipped(sources: Sources) -> None:
    update(sources.states, "energy_hourly", status=ArchiveStatus.CREATED, watermark=None)
    sources.write([("m1", T0)])
    d = sources.detect()
    assert d.jobs == [] and d.cursors == {}
    assert sources.feed.read == []


def test_disabled_rollups_still_record_dirty_work(sources: Sources) -> None:
    sources.start_cursor()
    update(sources.states, "energy_hourly", status=ArchiveStatus.DISABLED)
    sources.write([("m1", T0)])
    assert [j.rollup for j in sources.detect().jobs] == ["energy_hourly"]


def test_a_table_created_again_is_read_from_its_start(sources: Sources) -> None:
    """A raw table deleted and created again counts its versions from 0: the cursor of the old
    table must not hide the new table's commits (they would be skipped as already read)."""
    sources.start_cursor()
    for h in range(6):
        sources.write([("m1", T0 + h * H)])
    sources.detect()
    assert sources.ledger.snapshot().cursors["energy_raw"] == 6
    sources.feed.recreate("energy_raw")
    again = sources.detect()  # first sight of the new table: no history, the cursor restarts
    assert again.jobs == [] and again.cursors == {"energy_raw": 0}
    assert any("created again" in n for n in again.notes)
    v = sources.write([("m2", T0 + 2 * H)])
    d = sources.detect()
    assert [(j.rollup, j.entities, j.source_version) for j in d.jobs] == [
        ("energy_hourly", frozenset({"m2"}), v)
    ]
    assert sources.ledger.snapshot().tables["energy_raw"] == "energy_raw-2"


def test_a_table_created_again_past_the_old_cursor_is_told_apart_by_its_id(
    sources: Sources,
) -> None:
    sources.start_cursor()
    sources.write([("m1", T0)])
    sources.detect()
    sources.feed.recreate("energy_raw")
    for h in range(3):  # the new table is already past the old cursor (1) when detection runs
        sources.write([("m3", T0 + h * H)])
    d = sources.detect()
    assert d.jobs == [] and d.cursors == {"energy_raw": 3}
    late = sources.write([("m3", T0 + 5 * H)])
    assert [j.source_version for j in sources.detect().jobs] == [late]


def test_a_source_nobody_consumes_forgets_its_cursor(sources: Sources) -> None:
    """Commits while no rollup consumes the source are nobody's dirty work: a rollup that
    consumes it again starts from first sight, not from the old cursor (no history scan)."""
    sources.start_cursor()
    sources.write([("m1", T0)])
    sources.detect()
    update(sources.states, "energy_hourly", status=ArchiveStatus.DELETED, watermark=None)
    gone = sources.detect()
    assert gone.forget == ["energy_raw"] and "energy_raw" not in sources.ledger.snapshot().cursors
    assert sources.detect().forget == []  # forgotten once
    sources.write([("m1", T0 + H)])  # history written while nothing consumed the source
    update(sources.states, "energy_hourly", status=ArchiveStatus.ACTIVATED, watermark=WATERMARK)
    first = sources.detect()
    assert first.jobs == [] and first.cursors == {"energy_raw": 2}


def test_a_dropped_table_forgets_its_cursor(sources: Sources) -> None:
    sources.start_cursor()
    sources.feed.drop("energy_raw")
    d = sources.detect()
    assert d.forget == ["energy_raw"] and d.jobs == []
