"""Computed columns changed on an activated archive: add, new formula, remove, each in one
commit that readers see whole; ingest running alongside; refusals; failures change nothing.

No Spark: the raw table, its registry of formulas and the ingest path on delta-rs alone.
"""

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import rollup_assets.resources.raw_columns as raw_columns
import rollup_assets.resources.raw_ingest as raw_ingest
from rollup_assets.model.errors import ColumnChangeError, RollupSourceMissingError
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.spec_loader import parse_catalog
from rollup_assets.model.specs import Catalog
from rollup_assets.model.windows import Window
from rollup_assets.resources.change_feed import ChangeFeed, read_changes
from rollup_assets.resources.commit_changes import ChangeFeedGone
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.sensors.detection import detect
from rollup_assets.services.columns import (
    ColumnAction,
    change_column,
    column_states,
)
from rollup_assets.services.engine import Engine
from rollup_assets.services.operations import Operations

NOW = datetime(2025, 6, 10, tzinfo=UTC)
T0 = datetime(2025, 6, 1, tzinfo=UTC)


def catalog(
    computed: dict[str, str], rollup_over: str | None = None, daily: bool = False
) -> Catalog:
    columns: dict = {"p": {"type": "double", "required": True}, "s": "double"}
    columns |= {n: {"type": "double", "formula": f} for n, f in computed.items()}
    doc: dict = {"raw_archives": {"meters": {"columns": columns}}}
    if rollup_over:
        doc["rollups"] = {
            "meters_hourly": {
                "source": "meters",
                **(
                    {"alignment": "CalendarDay", "reference_time_zone": "Europe/Vienna"}
                    if daily
                    else {"alignment": "FixedSize", "size": "1h"}
                ),
                "start": "2025-01-01",
                "aggregations": [{"column": rollup_over, "function": "Max"}],
            }
        }
    return parse_catalog(doc)


def engine_for(root: Path, cat: Catalog) -> Engine:
    return Engine(cat, Warehouse(str(root / "warehouse")))


def ingest(engine: Engine, root: Path, rows: list[tuple[str, datetime, float, float | None]]):
    path = root / f"b{datetime.now().timestamp()}.parquet"
    pq.write_table(
        pa.table(
            {
                "entity_id": [r[0] for r in rows],
                "ts": pa.array([r[1] for r in rows], pa.timestamp("us", tz="UTC")),
                "p": [r[2] for r in rows],
                "s": pa.array([r[3] for r in rows], pa.float64()),
            }
        ),
        path,
    )
    return engine.raw.ingest(engine.catalog.raw["meters"], path, ChangeSource("Pipeline"))


def values(engine: Engine, column: str) -> dict[tuple[str, datetime], float | None]:
    t = engine.raw.read_arrow(engine.catalog.raw["meters"])
    return {(r["entity_id"], r["ts"]): r.get(column, "absent") for r in t.to_pylist()}


@pytest.fixture
def started(tmp_path: Path) -> Engine:
    """An activated archive computing x = p / s, with four readings."""
    engine = engine_for(tmp_path, catalog({"x": "p / s"}))
    Operations(engine, actor="test").activate("meters", now=NOW)
    ingest(
        engine,
        tmp_path,
        [("a", T0, 6.0, 3.0), ("a", T0 + timedelta(minutes=15), 1.0, 0.0),
         ("b", T0, 8.0, 2.0), ("b", T0 + timedelta(days=1), 5.0, None)],
    )  # fmt: skip
    return engine


def test_add_makes_the_column_visible_in_one_commit(started: Engine, tmp_path: Path) -> None:
    engine = engine_for(tmp_path, catalog({"x": "p / s", "y": "p + s"}))
    spec = engine.catalog.raw["meters"]
    states = {s.column: s.status for s in column_states(engine, "meters")}
    assert states == {"p": "ingested", "s": "ingested", "x": "active", "y": "pending add"}
    assert "y" not in engine.raw.read_arrow(spec).column_names  # pending: not visible
    before = engine.raw.table(spec).version()

    result = change_column(engine, "meters", "y", ColumnAction.ADD)
    assert result.version == before + 1 and result.rows == 4
    assert "y" not in [f.name for f in engine.raw.table(spec, before).schema().fields]
    got = values(engine, "y")
    assert got[("a", T0)] == 9.0 and got[("b", T0 + timedelta(days=1))] is None
    assert {s.column: s.status for s in column_states(engine, "meters")}["y"] == "active"
    # Later ingests compute it; the add itself is not a change the sensors recompute.
    ingest(engine, tmp_path, [("c", T0, 2.0, 2.0)])
    assert values(engine, "y")[("c", T0)] == 4.0
    assert read_changes(engine.raw, spec, result.version, 10_000) is None


def test_a_new_formula_serves_old_values_until_it_is_applied(
    started: Engine, tmp_path: Path
) -> None:
    engine = engine_for(tmp_path, catalog({"x": "p * s"}))
    assert {s.column: s.status for s in column_states(engine, "meters")}["x"] == ("pending formula")
    # Until applied, ingest keeps computing the formula the table applies.
    ingest(engine, tmp_path, [("c", T0, 9.0, 3.0)])
    assert values(engine, "x")[("c", T0)] == 3.0
    change_column(engine, "meters", "x", ColumnAction.SET_FORMULA)
    got = values(engine, "x")
    assert got[("a", T0)] == 18.0 and got[("c", T0)] == 27.0
    assert got[("a", T0 + timedelta(minutes=15))] == 0.0  # was null (1 / 0)
    # An engine still loaded with the old spec ingests with the applied formula, not its own.
    ingest(started, tmp_path, [("d", T0, 2.0, 5.0)])
    assert values(engine, "x")[("d", T0)] == 10.0


def test_remove_hides_the_column(started: Engine, tmp_path: Path) -> None:
    engine = engine_for(tmp_path, catalog({}))
    assert {s.column: s.status for s in column_states(engine, "meters")}["x"] == ("pending removal")
    change_column(engine, "meters", "x", ColumnAction.REMOVE)
    assert "x" not in engine.raw.read_arrow(engine.catalog.raw["meters"]).column_names
    assert [s.column for s in column_states(engine, "meters")] == ["p", "s"]


def test_changes_that_do_not_apply_are_refused(started: Engine, tmp_path: Path) -> None:
    same = engine_for(tmp_path, catalog({"x": "p / s"}))
    with pytest.raises(ColumnChangeError, match="already computes"):
        change_column(same, "meters", "x", ColumnAction.SET_FORMULA)
    with pytest.raises(ColumnChangeError, match="applied already"):
        change_column(same, "meters", "x", ColumnAction.ADD)
    with pytest.raises(ColumnChangeError, match="still declares"):
        change_column(same, "meters", "x", ColumnAction.REMOVE)
    with pytest.raises(ColumnChangeError, match="does not declare"):
        change_column(same, "meters", "z", ColumnAction.ADD)
    # A column another computed column reads keeps its formula (and stays).
    reading = engine_for(tmp_path, catalog({"x": "p / s", "y": "x + 1"}))
    change_column(reading, "meters", "y", ColumnAction.ADD)
    changed = engine_for(tmp_path, catalog({"x": "p * s", "y": "x + 1"}))
    version = changed.raw.table(changed.catalog.raw["meters"]).version()
    with pytest.raises(ColumnChangeError, match=r"computed column\(s\) \['y'\] of 'meters' read"):
        change_column(changed, "meters", "x", ColumnAction.SET_FORMULA)
    assert changed.raw.table(changed.catalog.raw["meters"]).version() == version


def test_a_failed_rewrite_leaves_the_previous_columns(
    started: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = engine_for(tmp_path, catalog({"x": "p * s"}))
    spec = engine.catalog.raw["meters"]
    version = engine.raw.table(spec).version()
    before = values(engine, "x")

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(raw_columns, "write_deltalake", broken)
    with pytest.raises(OSError, match="disk full"):
        change_column(engine, "meters", "x", ColumnAction.SET_FORMULA)
    assert engine.raw.table(spec).version() == version
    assert values(engine, "x") == before


def test_rows_inserted_during_the_rewrite_get_the_new_values(
    started: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = engine_for(tmp_path, catalog({"x": "p * s"}))
    real = raw_columns.write_deltalake
    late = T0 + timedelta(days=5)  # a new day: the insert conflicts with nothing

    def with_concurrent_insert(*args, **kwargs):
        ingest(started, tmp_path, [("e", late, 4.0, 4.0)])  # under the old formula: 1.0
        return real(*args, **kwargs)

    monkeypatch.setattr(raw_columns, "write_deltalake", with_concurrent_insert)
    result = change_column(engine, "meters", "x", ColumnAction.SET_FORMULA)
    assert result.reingested == 1
    assert values(engine, "x")[("e", late)] == 16.0


def test_an_ingest_that_missed_a_switch_upserts_again(
    started: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = engine_for(tmp_path, catalog({"x": "p * s"}))
    real = raw_ingest._upsert
    calls = []

    def switch_first(tables, spec, path, source, **kw):
        calls.append(spec.column("x").formula.text)
        if len(calls) == 1:  # the formulas change after this ingest read them
            change_column(engine, "meters", "x", ColumnAction.SET_FORMULA)
        return real(tables, spec, path, source, **kw)

    monkeypatch.setattr(raw_ingest, "_upsert", switch_first)
    late = T0 + timedelta(days=6)
    ingest(started, tmp_path, [("f", late, 3.0, 2.0)])
    assert calls == ["p / s", "p * s"]
    assert values(engine, "x")[("f", late)] == 6.0


def test_a_rollup_over_a_column_not_applied_cannot_be_activated(
    started: Engine, tmp_path: Path
) -> None:
    engine = engine_for(tmp_path, catalog({"x": "p / s", "y": "p + s"}, rollup_over="y"))
    with pytest.raises(RollupSourceMissingError, match="rollups add-column meters y"):
        Operations(engine, actor="test").activate("meters_hourly", now=NOW)
    change_column(engine, "meters", "y", ColumnAction.ADD)
    Operations(engine, actor="test").activate("meters_hourly", now=NOW)


def test_two_changes_at_once_both_land(
    started: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    both = engine_for(tmp_path, catalog({"x": "p / s", "y": "p + s", "z": "p - s"}))
    real = raw_columns.write_deltalake
    calls = []

    def other_change_first(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:  # z is added while y's rewrite runs: y's commit conflicts
            monkeypatch.setattr(raw_columns, "write_deltalake", real)
            change_column(both, "meters", "z", ColumnAction.ADD)
            monkeypatch.setattr(raw_columns, "write_deltalake", other_change_first)
        return real(*args, **kwargs)

    monkeypatch.setattr(raw_columns, "write_deltalake", other_change_first)
    change_column(both, "meters", "y", ColumnAction.ADD)
    assert {s.column: s.status for s in column_states(both, "meters")} == {
        "p": "ingested", "s": "ingested", "x": "active", "y": "active", "z": "active"
    }  # fmt: skip
    assert values(both, "z")[("a", T0)] == 3.0 and values(both, "y")[("a", T0)] == 9.0


def test_a_refresh_does_not_undo_a_newer_ingest(
    started: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = engine_for(tmp_path, catalog({"x": "p * s"}))
    real_write, real_fill = raw_columns.write_deltalake, raw_columns.fill_computed
    late = T0 + timedelta(days=5)
    corrected = []

    def with_concurrent_insert(*args, **kwargs):
        ingest(started, tmp_path, [("e", late, 4.0, 4.0)])  # inserted under the old formula
        return real_write(*args, **kwargs)

    def producer_corrects_first(spec, columns, rows):
        if not corrected and "e" in columns["entity_id"].to_pylist():
            corrected.append(1)  # the refresh read e; a producer corrects it before it lands
            ingest(engine, tmp_path, [("e", late, 5.0, 5.0)])
        return real_fill(spec, columns, rows)

    monkeypatch.setattr(raw_columns, "write_deltalake", with_concurrent_insert)
    monkeypatch.setattr(raw_columns, "fill_computed", producer_corrects_first)
    change_column(engine, "meters", "x", ColumnAction.SET_FORMULA)
    assert corrected
    row = [r for r in engine.raw.read_arrow(engine.catalog.raw["meters"]).to_pylist()
           if r["entity_id"] == "e"]  # fmt: skip
    assert [(r["p"], r["s"], r["x"]) for r in row] == [(5.0, 5.0, 25.0)]


def test_a_new_formula_recomputes_every_bucket_whose_raw_rows_are_there(
    started: Engine, tmp_path: Path
) -> None:
    old = engine_for(tmp_path, catalog({"x": "p / s"}, rollup_over="x", daily=True))
    Operations(old, actor="test").activate("meters_hourly", now=NOW)
    gone = Window(datetime(2025, 3, 10, tzinfo=UTC), datetime(2025, 3, 12, tzinfo=UTC))
    spec = old.catalog.raw["meters"]
    ingest(old, tmp_path, [("a", datetime(2025, 3, 11, tzinfo=UTC), 1.0, 1.0)])
    old.raw.delete_rows(spec, gone, None, ChangeSource("Manual"), retention=True)

    engine = engine_for(tmp_path, catalog({"x": "p * s"}, rollup_over="x", daily=True))
    feed = ChangeFeed(engine.raw, 1_000_000, engine.removed_spans)
    seen = detect(engine.catalog, engine.states.all(), engine.ledger.snapshot(), feed)
    engine.ledger.record(seen.jobs, seen.cursors, tables=seen.tables)
    result = change_column(engine, "meters", "x", ColumnAction.SET_FORMULA)
    assert result.recomputed == ["meters_hourly"]
    # Change detection reads the switch commit once and queues the recompute (not the command:
    # a process dying right after the switch would otherwise leave the rollup behind).
    found = detect(engine.catalog, engine.states.all(), engine.ledger.snapshot(), feed)
    assert [j.rollup for j in found.jobs] == ["meters_hourly"]
    windows = sorted(w for job in found.jobs for w in job.windows)
    watermark = engine.states.get("meters_hourly").watermark
    assert windows[0].start == datetime(2024, 12, 31, 23, tzinfo=UTC)  # local midnight
    assert windows[-1].end == watermark
    assert not any(w.overlaps(gone) for w in windows)
    # Every day from the start to the watermark is covered, except those reaching into `gone`.
    covered = sum((w.end - w.start for w in windows), timedelta())
    skipped = timedelta(days=3)  # Vienna days 03-10, 03-11 and 03-12 each touch `gone`
    assert covered == watermark - windows[0].start - skipped


def test_the_change_feed_does_not_reach_across_a_formula_switch(
    started: Engine, tmp_path: Path
) -> None:
    engine = engine_for(tmp_path, catalog({"x": "p * s"}))
    spec = engine.catalog.raw["meters"]
    before = engine.raw.table(spec).version()
    change_column(engine, "meters", "x", ColumnAction.SET_FORMULA)
    ingest(engine, tmp_path, [("g", T0, 1.0, 1.0)])
    upto = engine.raw.table(spec).version()
    span = [Window(T0, T0 + timedelta(days=1))]
    with pytest.raises(ChangeFeedGone, match="computed columns changed"):
        engine.raw.changes(spec, before, upto, span, None)
    rows, _ = engine.raw.changes(spec, before + 1, upto, span, None)  # after it: fine
    assert "g" in rows["entity_id"].to_pylist()
