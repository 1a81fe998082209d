"""Retroactive-write detection on real Delta tables (delta-rs only, no Spark)."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from resources.control import ArchiveStatus
from resources.ledger import ChangeKind, ChangeSource, Trigger
from resources.warehouse import Warehouse
from rollup_assets.engine import Engine
from rollup_assets.partitions import Window
from rollup_assets.specs import load_catalog
from sensors import detection
from sensors.detection import classify, detect

T0 = datetime(2025, 5, 1, tzinfo=UTC)
WATERMARK = datetime(2025, 5, 2, tzinfo=UTC)


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    eng = Engine(load_catalog(), Warehouse(str(tmp_path / "wh")))
    eng.raw.ensure_table(eng.catalog.raw["energy_raw"])
    eng.states.update(
        "energy_raw", lambda s: replace(s, status=ArchiveStatus.ACTIVATED), reason="test"
    )
    for name in eng.catalog.rollups:
        eng.states.update(
            name,
            lambda s: replace(s, status=ArchiveStatus.ACTIVATED, watermark=WATERMARK),
            reason="test",
        )
    return eng


def ingest(
    engine: Engine,
    tmp_path: Path,
    rows: list[tuple[str, datetime, float]],
    source=ChangeSource.PIPELINE,
) -> int:
    path = tmp_path / f"b{datetime.now().timestamp()}.parquet"
    pq.write_table(
        pa.Table.from_pylist([{"entity_id": e, "ts": t, "energy_kwh": v} for e, t, v in rows]), path
    )
    return engine.raw.ingest(engine.catalog.raw["energy_raw"], path, source).version


def start_cursor(engine: Engine) -> None:
    """First detection only places the cursor (history is a backfill's business)."""
    first = detect(engine, engine.states.all(), engine.ledger.snapshot())
    assert first.jobs == [] and "energy_raw" in first.cursors
    engine.ledger.record(first.jobs, first.cursors)


def run_detect(engine: Engine, **kw):
    d = detect(engine, engine.states.all(), engine.ledger.snapshot(), **kw)
    engine.ledger.record(d.jobs, d.cursors)
    return d


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


def test_a_write_at_the_watermark_is_not_dirty(engine: Engine, tmp_path: Path) -> None:
    start_cursor(engine)
    ingest(
        engine, tmp_path, [("m1", WATERMARK, 1.0), ("m1", WATERMARK + timedelta(minutes=15), 2.0)]
    )
    assert run_detect(engine).jobs == []


def test_retroactive_rows_map_to_exact_buckets_and_entities(engine: Engine, tmp_path: Path) -> None:
    start_cursor(engine)
    v = ingest(
        engine,
        tmp_path,
        [
            ("m1", T0 + timedelta(hours=3, minutes=15), 1.0),
            ("m2", T0 + timedelta(hours=9, minutes=45), 2.0),
            ("m2", WATERMARK + timedelta(hours=1), 3.0),  # an Append in the same commit: ignored
        ],
        source=ChangeSource.MANUAL,
    )
    d = run_detect(engine)
    assert len(d.jobs) == 1
    job = d.jobs[0]
    assert job.rollup == "energy_hourly" and job.trigger is Trigger.PERIODIC
    assert engine.buckets_in(engine.catalog.rollup("energy_hourly"), list(job.windows)) == [
        Window(T0 + timedelta(hours=3), T0 + timedelta(hours=4)),
        Window(T0 + timedelta(hours=9), T0 + timedelta(hours=10)),
    ]
    assert job.entities == frozenset({"m1", "m2"})
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


def test_detection_is_value_agnostic(engine: Engine, tmp_path: Path) -> None:
    rows = [("m1", T0 + timedelta(hours=1), 5.0)]
    ingest(engine, tmp_path, rows)
    start_cursor(engine)
    ingest(engine, tmp_path, rows)  # byte-for-byte the same reading again
    jobs = run_detect(engine).jobs
    assert len(jobs) == 1 and jobs[0].entities == frozenset({"m1"})


def test_many_entities_are_not_scoped(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(detection, "ENTITY_SCOPE_LIMIT", 3)
    start_cursor(engine)
    ingest(engine, tmp_path, [(f"m{i}", T0 + timedelta(hours=2), 1.0) for i in range(4)])
    assert run_detect(engine).jobs[0].entities is None


def test_second_detection_after_nothing_changed_finds_nothing(
    engine: Engine, tmp_path: Path
) -> None:
    start_cursor(engine)
    ingest(engine, tmp_path, [("m1", T0, 1.0)])
    assert len(run_detect(engine).jobs) == 1
    again = run_detect(engine)
    assert again.jobs == [] and again.cursors == {} and again.versions_read == 0


def test_versions_per_tick_are_capped_and_resumed(engine: Engine, tmp_path: Path) -> None:
    start_cursor(engine)
    versions = [ingest(engine, tmp_path, [("m1", T0 + timedelta(hours=h), 1.0)]) for h in range(5)]
    first = run_detect(engine, max_versions=2)
    assert first.cursors == {"energy_raw": versions[1]} and len(first.jobs) == 2
    rest = run_detect(engine, max_versions=10)
    assert rest.cursors == {"energy_raw": versions[-1]} and len(rest.jobs) == 3


def test_a_forward_claim_makes_racing_writes_retroactive(engine: Engine, tmp_path: Path) -> None:
    claim = WATERMARK + timedelta(hours=2)
    engine.states.update("energy_hourly", lambda s: replace(s, claimed_until=claim), reason="test")
    start_cursor(engine)
    ingest(engine, tmp_path, [("m1", WATERMARK + timedelta(minutes=30), 1.0)])
    jobs = run_detect(engine).jobs
    assert len(jobs) == 1
    assert list(jobs[0].windows) == [Window(WATERMARK, WATERMARK + timedelta(hours=1))]


def test_large_commits_use_file_statistics(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(detection, "MAX_CDF_ROWS", 0)
    start_cursor(engine)
    ingest(
        engine,
        tmp_path,
        [("m1", T0 + timedelta(hours=1), 1.0), ("m1", T0 + timedelta(hours=4), 1.0)],
    )
    job = run_detect(engine).jobs[0]
    hours = engine.buckets_in(engine.catalog.rollup("energy_hourly"), list(job.windows))
    # Over-approximated from the file's min/max time: every hour between, never fewer.
    assert hours[0].start <= T0 + timedelta(hours=1) and hours[-1].end >= T0 + timedelta(hours=5)
    assert all(w.end <= WATERMARK for w in hours)


def test_rollups_that_consumed_nothing_are_skipped(engine: Engine, tmp_path: Path) -> None:
    engine.states.update(
        "energy_hourly",
        lambda s: replace(s, status=ArchiveStatus.CREATED, watermark=None),
        reason="test",
    )
    ingest(engine, tmp_path, [("m1", T0, 1.0)])
    d = run_detect(engine)
    assert d.jobs == [] and d.cursors == {}


def test_disabled_rollups_still_record_dirty_work(engine: Engine, tmp_path: Path) -> None:
    start_cursor(engine)
    engine.states.update(
        "energy_hourly", lambda s: replace(s, status=ArchiveStatus.DISABLED), reason="test"
    )
    ingest(engine, tmp_path, [("m1", T0, 1.0)])
    assert [j.rollup for j in run_detect(engine).jobs] == ["energy_hourly"]
