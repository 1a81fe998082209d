"""What real Delta commits of a raw table yield as changes (delta-rs only, no Spark), and one
detection over them end to end."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.placement import buckets_in
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.windows import Window
from rollup_assets.resources.change_feed import ChangeFeed, Changes, read_changes
from rollup_assets.resources.raw_store import RawStore
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.sensors.detection import Detection, detect
from tests.unit.planning import CHANGED_ROWS, MemoryLedger, activated

T0 = datetime(2025, 5, 1, tzinfo=UTC)
WATERMARK = datetime(2025, 5, 2, tzinfo=UTC)
H = timedelta(hours=1)
CATALOG = load_catalog()
RAW = CATALOG.raw["energy_raw"]
HOURLY = CATALOG.rollup("energy_hourly")


class Source:
    """A raw Delta table, plus the states and ledger a detection over it reads."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.raw = RawStore(Warehouse(str(root / "wh")))
        self.states = activated(CATALOG, WATERMARK)
        self.ledger = MemoryLedger()
        self.batches = 0

    def ingest(
        self, rows: list[tuple[str, datetime, float]], source: ChangeSource = ChangeSource.PIPELINE
    ) -> int:
        self.batches += 1
        path = self.root / f"batch-{self.batches}.parquet"
        pq.write_table(
            pa.Table.from_pylist([{"entity_id": e, "ts": t, "energy_kwh": v} for e, t, v in rows]),
            path,
        )
        return self.raw.ingest(RAW, path, source).version

    def detect(self, max_cdf_rows: int = 1_000) -> Detection:
        d = detect(CATALOG, self.states, self.ledger.snapshot(), ChangeFeed(self.raw, max_cdf_rows))
        self.ledger.record(d.jobs, d.cursors)
        return d

    def start_cursor(self) -> None:
        first = self.detect()
        assert first.jobs == [] and "energy_raw" in first.cursors


@pytest.fixture
def source(tmp_path: Path) -> Source:
    return Source(tmp_path)


def pairs(changes: Changes) -> list[tuple[str, datetime]]:
    assert changes.rows is not None
    return sorted((r["entity_id"], r["ts"]) for r in changes.rows.to_pylist())


def test_a_source_without_a_table_has_no_version_and_provisioning_changes_no_row(
    source: Source,
) -> None:
    feed = ChangeFeed(source.raw, 1_000)
    assert feed.latest_version(RAW) is None
    version = source.raw.ensure_table(RAW)
    assert feed.latest_version(RAW) == version
    assert feed.changes(RAW, version) is None


def test_an_ingest_yields_the_rows_it_changed(source: Source) -> None:
    source.raw.ensure_table(RAW)
    rows = [
        ("m1", T0 + timedelta(hours=3, minutes=15), 1.0),
        ("m2", T0 + timedelta(hours=9, minutes=45), 2.0),
        ("m2", WATERMARK + H, 3.0),
    ]
    v = source.ingest(rows, ChangeSource.MANUAL)
    changes = ChangeFeed(source.raw, 1_000).changes(RAW, v)
    assert changes is not None and changes.rows is not None
    assert (changes.version, changes.change_source, changes.ranges) == (v, ChangeSource.MANUAL, [])
    assert changes.rows.schema == CHANGED_ROWS
    assert pairs(changes) == [(e, t) for e, t, _ in rows]


def test_an_identical_reading_is_no_change(source: Source) -> None:
    source.raw.ensure_table(RAW)
    rows = [("m1", T0 + H, 5.0)]
    first = source.ingest(rows)
    source.start_cursor()
    again = source.ingest(rows)  # byte-for-byte the same reading again: nothing is committed
    assert again == first == source.raw.table(RAW).version()
    assert source.detect().jobs == []
    # A changed value is a change: its pre- and post-image name the reading.
    v = source.ingest([("m1", T0 + H, 6.0)])
    changes = read_changes(source.raw, RAW, v, 1_000)
    assert changes is not None and set(pairs(changes)) == {("m1", T0 + H)}
    jobs = source.detect().jobs
    assert len(jobs) == 1 and jobs[0].entities == frozenset({"m1"})
    assert jobs[0].source_version == v


@pytest.mark.parametrize(("max_cdf_rows", "from_rows"), [(2, True), (1, False)])
def test_a_commit_larger_than_max_cdf_rows_is_read_from_file_statistics(
    source: Source, max_cdf_rows: int, from_rows: bool
) -> None:
    source.raw.ensure_table(RAW)
    v = source.ingest([("m1", T0 + H, 1.0), ("m1", T0 + 4 * H, 1.0)])
    changes = read_changes(source.raw, RAW, v, max_cdf_rows)
    assert changes is not None
    if from_rows:
        assert changes.ranges == [] and pairs(changes) == [("m1", T0 + H), ("m1", T0 + 4 * H)]
        return
    assert changes.rows is None and changes.ranges
    # Every range is a file's or its UTC-day partition's: together they cover the rows.
    assert min(lo for lo, _, _ in changes.ranges) <= T0 + H
    assert max(hi for _, hi, _ in changes.ranges) >= T0 + 4 * H
    assert all(T0 <= lo <= hi < T0 + 24 * H for lo, hi, _ in changes.ranges)


def test_large_commits_use_file_statistics(source: Source) -> None:
    source.raw.ensure_table(RAW)
    source.start_cursor()
    source.ingest([("m1", T0 + H, 1.0), ("m1", T0 + 4 * H, 1.0)])
    d = source.detect(max_cdf_rows=0)
    job = d.jobs[0]
    hours = buckets_in(HOURLY, list(job.windows))
    # Over-approximated from the file's min/max time: every hour between, never fewer.
    assert hours[0].start <= T0 + H and hours[-1].end >= T0 + 5 * H
    assert all(w.end <= WATERMARK for w in hours)
    assert d.commits[0].rows is None  # classified without reading rows


def test_commits_that_change_no_rows_are_skipped(source: Source) -> None:
    source.raw.ensure_table(RAW)
    source.ingest([("m1", T0 + H, 1.0)])
    source.ingest([("m2", T0 + 2 * H, 1.0)])  # a second file in the same day partition
    source.start_cursor()
    table = source.raw.table(RAW)
    assert table is not None
    metrics = table.optimize.compact()
    assert metrics["numFilesRemoved"] == 2
    v = table.version()
    assert read_changes(source.raw, RAW, v, 1_000) is None
    d = source.detect()
    assert d.jobs == [] and d.commits == [] and d.versions_read == 1
    assert d.cursors == {"energy_raw": v}


def test_detection_over_real_commits_maps_rows_to_buckets(source: Source) -> None:
    source.raw.ensure_table(RAW)
    source.start_cursor()
    v = source.ingest(
        [("m1", T0 + 3 * H, 1.0), ("m2", WATERMARK - H, 2.0), ("m3", WATERMARK, 3.0)],
        ChangeSource.IMPORT,
    )
    d = source.detect()
    [job] = d.jobs
    assert buckets_in(HOURLY, list(job.windows)) == [
        Window(T0 + 3 * H, T0 + 4 * H),
        Window(WATERMARK - H, WATERMARK),
    ]
    assert job.entities == frozenset({"m1", "m2"}) and job.change_source is ChangeSource.IMPORT
    assert d.cursors == {"energy_raw": v} and d.rows_classified == 3


def test_a_delete_is_a_correction_and_retention_is_nobodys_change(source: Source) -> None:
    """A correcting delete makes its cells dirty and is in the change feed as a delete;
    a retention delete commits, but neither detection nor the change feed sees it."""
    source.raw.ensure_table(RAW)
    first = source.ingest([("m1", T0 + H, 1.0), ("m2", T0 + H, 2.0), ("m1", T0 + 5 * H, 3.0)])
    source.start_cursor()
    hour = Window(T0 + H, T0 + 2 * H)
    corrected, n = source.raw.delete_rows(
        RAW, hour, frozenset({"m2"}), ChangeSource.MANUAL, retention=False
    )
    assert corrected is not None and n == 1
    jobs = source.detect().jobs
    assert len(jobs) == 1 and jobs[0].entities == frozenset({"m2"})
    dropped, n = source.raw.delete_rows(
        RAW, Window(T0, T0 + 2 * H), None, ChangeSource.MANUAL, retention=True
    )
    assert dropped == corrected + 1 and n == 1  # m1's reading at 01:00 (m2's is gone)
    assert read_changes(source.raw, RAW, dropped, 1_000) is None
    assert source.detect().jobs == []
    changes, read = source.raw.changes(RAW, first, dropped, [Window(T0, T0 + 24 * H)], None)
    assert read == 1
    assert [(r["entity_id"], r["_change_type"]) for r in changes.to_pylist()] == [("m2", "delete")]
    # Nothing matched: nothing is committed.
    assert source.raw.delete_rows(RAW, hour, None, ChangeSource.MANUAL, retention=False) == (
        None,
        0,
    )
    assert source.raw.table(RAW).version() == dropped


def test_a_merge_rewriting_a_large_file_is_read_from_its_change_files(source: Source) -> None:
    """A correction of one reading rewrites its whole day file, but its change files hold only
    that reading's two images: they, not the rewritten file, decide whether rows are read."""
    source.raw.ensure_table(RAW)
    source.ingest([("m1", T0 + i * timedelta(minutes=15), 1.0) for i in range(40)])
    v = source.ingest([("m1", T0 + H, 9.0)])
    changes = read_changes(source.raw, RAW, v, max_cdf_rows=5)
    assert changes is not None and changes.rows is not None and changes.ranges == []
    assert pairs(changes) == [("m1", T0 + H)] * 2  # the update's pre- and post-image
