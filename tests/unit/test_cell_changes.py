"""Which cells a recompute changed (exact comparison on the driver), and row-group pruning of the
stored rows it compares with."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollup_assets.compute import key_index
from rollup_assets.compute.aggregation import SOURCE_ROWS
from rollup_assets.compute.arrow_types import TS, arrow_type
from rollup_assets.compute.compare import CHANGED, cell_changes_arrow
from rollup_assets.compute.key_index import KeyIndex, rows_with_keys
from rollup_assets.compute.window_bounds import WindowBounds
from rollup_assets.model.aggregates import BASE_KINDS
from rollup_assets.model.cells import Cells
from rollup_assets.model.partials import RAW_ROWS
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.windows import Window
from rollup_assets.resources.delta_files import TargetIndex, _may_hold, targets_of
from rollup_assets.resources.rollup_reads import _cells_only
from rollup_assets.resources.rollup_table import in_windows
from rollup_assets.services.comparison import rows_in

HOURLY = load_catalog().rollup("energy_hourly")
T0 = datetime(2025, 3, 3, tzinfo=UTC)
H = timedelta(hours=1)


def partials(rows: list[tuple[str, int, float | None]], source_rows: bool = False) -> pa.Table:
    """Hourly partial rows (entity, hour offset, energy sum); the other partials follow."""
    out = {
        "entity_id": pa.array([e for e, _, _ in rows], pa.string()),
        "bucket_start": pa.array([T0 + h * H for _, h, _ in rows], TS),
        "bucket_end": pa.array([T0 + (h + 1) * H for _, h, _ in rows], TS),
    }
    for sc in HOURLY.stored_columns:
        if sc.partial == "count":
            out[sc.name] = pa.array([1] * len(rows), pa.int64())
        else:
            out[sc.name] = pa.array([v for _, _, v in rows], pa.float64())
    out[RAW_ROWS] = pa.array([4] * len(rows), pa.int64())
    for c in HOURLY.companions:  # the companions: compared too, equal on both sides here
        if c.kind in BASE_KINDS:
            out[c.name] = pa.nulls(len(rows), arrow_type(c.type, c.listed))
    if source_rows:
        out[SOURCE_ROWS] = pa.array([4] * len(rows), pa.int64())
    return pa.table(out)


def test_a_cell_is_unchanged_only_when_every_partial_is_equal_on_both_sides() -> None:
    nan = float("nan")
    fresh = partials(
        [("same", 0, 1.5), ("moved", 0, 2.0), ("new", 0, 1.0), ("nan", 0, nan), ("null", 0, None)],
        source_rows=True,
    )
    stored = partials(
        [("same", 0, 1.5), ("moved", 0, 2.5), ("gone", 0, 1.0), ("nan", 0, nan), ("null", 0, None)]
    )
    out = cell_changes_arrow(fresh, stored, HOURLY)
    changed = {r["entity_id"]: r[CHANGED] for r in out.to_pylist()}
    assert changed == {
        "same": False,
        "moved": True,
        "new": True,  # only fresh: a cell that appeared
        "gone": True,  # only stored: a cell that vanished
        "nan": False,
        "null": False,
    }
    # The fresh side's extra columns come along (null for a cell only stored has).
    rows = {r["entity_id"]: r[SOURCE_ROWS] for r in out.to_pylist()}
    assert rows["same"] == 4 and rows["gone"] is None


def test_row_groups_are_pruned_by_bucket_and_entity_statistics(tmp_path: Path) -> None:
    table = partials([(f"m{i:02d}", i % 3, 1.0) for i in range(40)]).sort_by("entity_id")
    pq.write_table(table, tmp_path / "f.parquet", row_group_size=10)
    meta = pq.ParquetFile(tmp_path / "f.parquet").metadata
    groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
    assert len(groups) == 4  # m00-m09, m10-m19, m20-m29, m30-m39
    hour = [Window(T0, T0 + H)]

    def held(spans, entities) -> list[bool]:
        targets = targets_of(spans, entities)
        assert targets is not None
        return [_may_hold(g, "bucket_start", TargetIndex(targets)) for g in groups]

    assert held(hour, frozenset({"m15"})) == [False, True, False, False]
    assert held(hour, None) == [True] * 4
    later = [Window(T0 + 5 * H, T0 + 6 * H)]
    assert held(later, None) == [False] * 4
    assert held(None, frozenset({"m05", "m33"})) == [True, False, False, True]
    # Per cell, not the cross product: (m05, hour 0) keeps its group; (m33, hour 5) keeps none,
    # since m33's group holds hours 0-2 only (the cross product would keep it for m33 at hour 0).
    assert held([Window(T0, T0 + H), later[0]], frozenset({"m05", "m33"})) == [
        True,
        False,
        False,
        True,
    ]
    cells = [(Window(T0, T0 + H), frozenset({"m05"})), (later[0], frozenset({"m33"}))]
    index = TargetIndex(cells)
    assert [_may_hold(g, "bucket_start", index) for g in groups] == [True, False, False, False]
    # Thousands of cells elsewhere in time change nothing; a long window reaching back does.
    far = [(Window(T0 + k * H, T0 + (k + 1) * H), frozenset({"m15"})) for k in range(10, 5000)]
    index = TargetIndex([*cells, *far])
    assert [_may_hold(g, "bucket_start", index) for g in groups] == [True, False, False, False]
    week = (Window(T0 - 7 * 24 * H, T0 + H), frozenset({"m25"}))
    index = TargetIndex([*cells, *far, week])
    assert [_may_hold(g, "bucket_start", index) for g in groups] == [True, False, True, False]


def test_index_of_targets_finds_exactly_the_overlapping_ones() -> None:
    rng = np.random.default_rng(3)
    targets = []
    for _ in range(300):
        start = T0 + int(rng.integers(0, 500)) * H
        targets.append((Window(start, start + int(rng.integers(1, 48)) * H), None))
    targets.append((Window(datetime.min.replace(tzinfo=UTC), T0 - 100 * H), None))
    index = TargetIndex(targets)
    for _ in range(200):
        lo = T0 + int(rng.integers(-200, 600)) * H
        hi = lo + int(rng.integers(0, 30)) * H
        expected = sorted((w.start, w.end) for w, _ in targets if w.start <= hi and lo < w.end)
        got = sorted((w.start, w.end) for w, _ in index.overlapping(lo, hi))
        assert got == expected
    assert len(list(index.overlapping(None, hi))) == len(targets)


def test_in_windows_matches_a_row_by_row_check() -> None:
    rng = np.random.default_rng(5)
    windows = [
        Window(T0 + int(a) * H, T0 + int(a + b) * H)
        for a, b in zip(rng.integers(0, 400, 60), rng.integers(1, 20, 60), strict=True)
    ]
    instants = [
        T0 + int(k) * H + timedelta(minutes=int(m))
        for k, m in zip(rng.integers(-10, 430, 2000), rng.integers(0, 60, 2000), strict=True)
    ]
    starts = pa.chunked_array(
        [pa.array(instants[:1000], TS), pa.array([*instants[1000:], None], TS)]
    )
    mask = in_windows(starts, windows).to_pylist()
    expected = [any(w.start <= t < w.end for w in windows) for t in instants]
    assert mask == [*expected, None]
    assert in_windows(pa.array(instants[:3], TS), []).to_pylist() == [False] * 3
    bounds = WindowBounds.of(windows)
    assert in_windows(starts, bounds).to_pylist() == mask  # made once, used for many masks
    for k in range(-12, 432):
        for length in (timedelta(minutes=1), H, 7 * H):
            a = T0 + k * H + timedelta(minutes=30)
            overlapping = any(w.start < a + length and a < w.end for w in windows)
            assert bounds.overlaps(a, a + length) == overlapping, (a, length)
    assert not WindowBounds.of([]).overlaps(T0, T0 + H)


def test_rows_with_keys_keep_no_buffer_of_the_rows_they_drop() -> None:
    rows = partials([(f"m{i:03d}", i % 24, float(i)) for i in range(20_000)])
    keys = rows.select(["bucket_start", "entity_id"]).slice(100, 3)
    kept = rows_with_keys(rows, keys, ["bucket_start", "entity_id"])
    assert sorted(kept["entity_id"].to_pylist()) == ["m100", "m101", "m102"]
    assert kept.get_total_buffer_size() < rows.get_total_buffer_size() / 100


def test_floating_point_partials_equal_up_to_rounding_are_unchanged() -> None:
    """The same values summed in another order differ in the last bits: not a change."""
    total = sum([0.1] * 10)  # 0.9999999999999999
    fresh = partials([("rounded", 0, total), ("moved", 0, 1.0 + 1e-9)])
    stored = partials([("rounded", 0, 1.0), ("moved", 0, 1.0)])
    out = cell_changes_arrow(fresh, stored, HOURLY)
    changed = {r["entity_id"]: r[CHANGED] for r in out.to_pylist()}
    assert total != 1.0 and changed == {"rounded": False, "moved": True}


def test_a_read_narrowed_to_cells_keeps_their_rows_only() -> None:
    rows = partials([(f"m{i:03d}", i % 24, float(i)) for i in range(2_000)])
    wanted = [(T0 + 5 * H, "m005"), (T0 + 7 * H, "m031"), (T0 + 30 * H, "m999")]
    keys = pa.table(
        {
            "bucket_start": pa.array([t for t, _ in wanted], TS),
            "entity_id": pa.array([e for _, e in wanted], pa.string()),
        }
    )
    kept = _cells_only(rows, KeyIndex(keys))
    assert sorted(kept["entity_id"].to_pylist()) == ["m005", "m031"]
    assert kept.get_total_buffer_size() < rows.get_total_buffer_size() / 100
    # No cell in the rows' time range: nothing kept, and none of their buffers either.
    none = _cells_only(rows, KeyIndex(keys.slice(2)))
    assert none.num_rows == 0 and none.get_total_buffer_size() < 1024


@pytest.mark.parametrize("coded", [True, False])
def test_a_key_index_keeps_the_rows_a_join_keeps_in_their_order(
    coded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Coded keys and the join they fall back to (keys too many to code) agree with a set of
    the keys: nulls match nothing, repeated keys keep a row once, rows stay in their order."""
    if not coded:
        monkeypatch.setattr(key_index, "CODED_KEYS", 1.0)
    rng = np.random.default_rng(7)
    entities = [f"m{i}" if i % 17 else None for i in rng.integers(0, 60, 3_000)]
    hours = [T0 + int(h) * H for h in rng.integers(0, 48, 3_000)]
    rows = pa.table(
        {"bucket_start": pa.array(hours, TS), "entity_id": pa.array(entities, pa.string())}
    ).append_column("at", pa.array(np.arange(3_000)))
    picked = rng.integers(0, 3_000, 400)
    keys = pa.concat_tables([rows.take(picked), rows.take(picked[:50])]).select(
        ["entity_id", "bucket_start"]
    )
    index = key_index.KeyIndex(keys)
    assert index.coded is coded
    pairs = zip(keys["entity_id"].to_pylist(), keys["bucket_start"].to_pylist(), strict=True)
    wanted = set(pairs)
    expected = [
        i
        for i, (e, t) in enumerate(
            zip(rows["entity_id"].to_pylist(), rows["bucket_start"].to_pylist(), strict=True)
        )
        if e is not None and (e, t) in wanted
    ]
    kept = index.rows_of(rows)
    assert kept["at"].to_pylist() == expected and 0 < len(expected) < 3_000
    assert index.rows_of(rows.slice(0, 0)).num_rows == 0


def test_a_key_index_never_casts_keys_to_the_rows_types() -> None:
    """Keys of another type than the rows' are joined as Arrow joins them (refused), never cast
    to match rounded values; dictionary-encoded keys match as a join matches them."""
    narrow = pa.table({"k": pa.array([1.1, 2.2], pa.float32())})
    with pytest.raises(pa.ArrowInvalid):
        KeyIndex(pa.table({"k": pa.array([1.1], pa.float64())})).rows_of(narrow)
    words = pa.table({"k": pa.array(["a", "b", "a"]).dictionary_encode()})
    kept = KeyIndex(pa.table({"k": pa.array(["a"]).dictionary_encode()})).rows_of(words)
    assert kept["k"].to_pylist() == ["a", "a"]


def test_rows_in_keeps_every_row_of_a_whole_bucket_and_the_named_cells_of_the_others() -> None:
    rows = partials([("a", 0, 1.0), ("b", 0, 2.0), ("a", 1, 3.0), ("b", 1, 4.0), ("c", 2, 5.0)])
    hour = lambda h: Window(T0 + h * H, T0 + (h + 1) * H)  # noqa: E731
    cells = Cells(((hour(0), None), (hour(1), frozenset(["b"])), (hour(2), frozenset(["a"]))))
    kept = rows_in(rows, cells)
    pairs = zip(kept["entity_id"].to_pylist(), kept["energy_kwh_sum"].to_pylist(), strict=True)
    assert sorted(pairs) == [
        ("a", 1.0),
        ("b", 2.0),
        ("b", 4.0),
    ]
    # Only whole buckets, only named cells, no cell.
    assert rows_in(rows, Cells.of([hour(1), hour(2)])).num_rows == 3
    assert rows_in(rows, Cells.of([hour(2)], frozenset(["c"]))).num_rows == 1
    assert rows_in(rows, Cells(())).num_rows == 0
