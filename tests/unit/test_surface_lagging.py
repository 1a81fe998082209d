"""Reads of every entity while the surface lags (between a flip and the publish that brings it):
the surface's rows with the cells changed since its publish read from the row table. Expected
rows are computed from the partials written, and checked against a read that resolves every
pointer."""

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import rollup_assets.services.surface_files as surface_files
import rollup_assets.services.surface_layout as surface_layout
import rollup_assets.services.surface_patch as surface_patch
import rollup_assets.services.surface_reads as surface_reads
from rollup_assets.compute.arrow_types import by_start_and_entity
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import Window
from rollup_assets.resources.rollup_snapshots import Reflected
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.engine import Engine
from rollup_assets.services.realtime import stored_partials
from rollup_assets.services.surface import publish
from rollup_assets.services.surface_changes import POINTER_KEY, Changed, changed_cells
from rollup_assets.services.surface_reads import current_rows, rows_now
from tests.unit.test_surface import WINDOWS, correct, expected, surface_rows, wide, write_forward

WINDOW = Window(WINDOWS[0].start, WINDOWS[-1].end)


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    return Engine(load_catalog(), Warehouse(str(tmp_path / "warehouse")))


@pytest.fixture
def spec(engine: Engine) -> RollupSpec:
    return engine.catalog.rollup("energy_daily")


@pytest.fixture(autouse=True)
def cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several files per partition (8 rows each), so a changed cell lies in one of them."""
    monkeypatch.setattr(surface_layout, "SURFACE_FILE_ROWS", 8)


@pytest.fixture
def patched(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The changed cells each patched read took from the row table."""
    taken: list[int] = []
    real = surface_reads.fresh_rows

    def spied(engine, spec, schema, snap, changed, *args):  # type: ignore[no-untyped-def]
        taken.append(changed.pointers.num_rows)
        return real(engine, spec, schema, snap, changed, *args)

    monkeypatch.setattr(surface_reads, "fresh_rows", spied)
    return taken


def resolved(engine: Engine, spec: RollupSpec) -> pa.Table:
    """Every entity's stored partials in the window, from the pointers, in query order."""
    rows = stored_partials(engine, spec, WINDOW, None)
    return by_start_and_entity(rows)


def test_a_lagging_surface_answers_with_its_changed_cells_read_from_the_row_table(
    engine, spec, patched
) -> None:
    cells = wide()
    write_forward(engine, spec, cells)
    publish(engine, spec)
    fix = {("meter-03", WINDOWS[1]): 7.5, ("meter-11", WINDOWS[-1]): 8.5}
    correct(engine, spec, fix)
    snap = engine.rollups.snapshot(spec)
    assert current_rows(engine, spec, snap.reflects, WINDOW) is None  # the surface lags
    got = rows_now(engine, spec, WINDOW)
    assert got is not None and patched == [2]
    assert got.reflects == snap.reflects  # a query records the versions its rows are of
    # Each changed cell takes its old row's place: no sort, the same answer as after a publish.
    assert got.rows.to_pylist() == expected(spec, {**cells, **fix}, partials=False)
    # Partials, in file order (as downsampling reads them): what resolving the pointers gives.
    rows = rows_now(engine, spec, WINDOW, partials=True, ordered=False)
    assert rows is not None
    want = resolved(engine, spec)
    assert by_start_and_entity(rows.rows).select(want.column_names).equals(want)
    publish(engine, spec)
    assert rows_now(engine, spec, WINDOW).rows.equals(got.rows)  # type: ignore[union-attr]
    assert patched == [2, 2]  # the current surface is read as it stands


def test_cells_new_and_gone_since_the_publish_are_put_in_query_order(engine, spec, patched) -> None:
    cells = wide()
    write_forward(engine, spec, cells)
    publish(engine, spec)
    # A cell of a meter no file holds yet, and a bucket recomputed whole whose other meters
    # lost every row (one global pointer: every file of that day is read from the row table).
    new = {("meter-00a", WINDOWS[0]): 3.0}
    correct(engine, spec, new)
    only = {("meter-05", WINDOWS[2]): 6.25}
    correct(engine, spec, only, whole=True)
    got = rows_now(engine, spec, WINDOW)
    assert got is not None and len(patched) == 1
    kept = {cell: v for cell, v in cells.items() if cell[1] != WINDOWS[2]}
    assert got.rows.to_pylist() == expected(spec, {**kept, **new, **only}, partials=False)
    assert by_start_and_entity(got.rows).equals(got.rows)


def test_a_wave_past_the_share_resolves_every_pointer(engine, spec, patched, monkeypatch) -> None:
    cells = wide()
    write_forward(engine, spec, cells)
    publish(engine, spec)
    correct(engine, spec, {("meter-03", WINDOWS[1]): 7.5})
    monkeypatch.setattr(surface_reads, "PATCHED_SHARE", 0.0)
    assert rows_now(engine, spec, WINDOW) is None and patched == []
    monkeypatch.setattr(surface_reads, "PATCHED_SHARE", 0.5)
    assert rows_now(engine, spec, WINDOW) is not None and patched == [1]
    # Only the pointers in the read's range count: none changed in January's first two days.
    monkeypatch.setattr(surface_reads, "PATCHED_SHARE", 0.0)
    before = Window(WINDOWS[0].start, WINDOWS[1].start)
    assert rows_now(engine, spec, before) is not None and patched == [1, 1]
    # Further behind than the row commits a read tells apart: the pointers are resolved.
    monkeypatch.setattr(surface_reads, "PATCHED_SHARE", 0.5)
    monkeypatch.setattr(surface_reads, "MAX_PATCHED_COMMITS", 0)
    assert rows_now(engine, spec, WINDOW) is None and patched == [1, 1]


def test_changed_cells_are_gathered_per_bucket() -> None:
    """A global pointer's bucket covers every entity; entity pointers name their cells; a
    bucket of a forward-lane commit covers every entity."""
    day = [Window(w.start, w.end) for w in WINDOWS]
    ts = pa.timestamp("us", tz="UTC")
    keys = pa.table(
        {
            "bucket_start": pa.array([day[0].start, day[0].start, day[1].start, day[1].start], ts),
            "bucket_end": pa.array([day[0].end, day[0].end, day[1].end, day[1].end], ts),
            "entity_id": pa.array(["a", None, "b", "c"], pa.string()),
            "generation": pa.array([1, 2, 3, 3], pa.int64()),
        }
    ).select(list(POINTER_KEY))
    changed = Changed(keys, (day[3],))
    assert list(changed.cells) == [
        (day[0], None),
        (day[1], frozenset({"b", "c"})),
        (day[3], None),
    ]
    assert changed.spans == [Window(day[0].start, day[1].end), day[3]]
    assert changed.whole_buckets == [day[0], day[3]]


def test_a_changed_cell_starting_before_the_range_is_not_read(engine, spec, patched) -> None:
    """A range starting inside a changed bucket: its cells start before the range, so neither
    the surface's rows nor the row table's are returned for them."""
    cells = wide()
    write_forward(engine, spec, cells)
    publish(engine, spec)
    fix = {("meter-03", WINDOWS[1]): 7.5, ("meter-04", WINDOWS[2]): 9.5}
    correct(engine, spec, fix)
    window = Window(WINDOWS[1].start + (WINDOWS[1].end - WINDOWS[1].start) / 2, WINDOWS[-1].end)
    got = rows_now(engine, spec, window)
    assert got is not None and len(patched) == 1
    later = {cell: v for cell, v in {**cells, **fix}.items() if cell[1].start >= window.start}
    assert got.rows.to_pylist() == expected(spec, later, partials=False)
    rows = rows_now(engine, spec, window, partials=True, ordered=False)
    assert rows is not None and rows.rows.num_rows == len(later)


def test_a_publish_in_batches_rewrites_a_bucket_across_a_partition_edge_once(
    engine, spec, monkeypatch
) -> None:
    """A local day starting on the last UTC evening of a month lies in that month's partition;
    the next batch (the next month), whose range the bucket overlaps, leaves it alone."""
    monkeypatch.setattr(surface_files, "PARTS_PER_BATCH", 1)
    cells = wide()
    write_forward(engine, spec, cells)
    publish(engine, spec)
    fix = {("meter-03", WINDOWS[2]): 7.5, ("meter-04", WINDOWS[3]): 9.5}
    assert WINDOWS[2].start.month == 1 and WINDOWS[2].end.month == 2
    correct(engine, spec, fix)
    publish(engine, spec)
    assert surface_rows(engine, spec) == expected(spec, {**cells, **fix})


def test_changes_since_pointers_that_are_gone_cannot_be_told(engine, spec) -> None:
    """A pointer table removed (not one without pointers): the changes cannot be told, so a
    publish rebuilds and a read resolves the pointers, rather than miss removed pointers."""
    cells = wide()
    write_forward(engine, spec, cells)
    correct(engine, spec, {("meter-03", WINDOWS[1]): 7.5})
    correct(engine, spec, {("meter-04", WINDOWS[1]): 8.5})
    now = engine.rollups.snapshot(spec).reflects
    done = Reflected(now.genmap - 1, now.rows - 1)
    assert changed_cells(engine, spec, done, now) is not None
    shutil.rmtree(engine.rollups.genmap_uri(spec))
    assert changed_cells(engine, spec, done, now) is None


@pytest.mark.parametrize("changes", [3, 70])
def test_changed_cells_take_their_old_rows_places(changes: int) -> None:
    """Few replaced rows are sliced around, many are masked in column by column (the cells'
    keys kept): either way the same rows as dropping the old ones and sorting again."""
    day = [Window(w.start, w.end) for w in WINDOWS[:3]]
    ts = pa.timestamp("us", tz="UTC")
    cells = [(w, f"meter-{m:02d}") for w in day for m in range(40)]
    rows = pa.table(
        {
            "bucket_start": pa.array([w.start for w, _ in cells], ts),
            "bucket_end": pa.array([w.end for w, _ in cells], ts),
            "entity_id": pa.array([e for _, e in cells], pa.string()),
            "value": pa.array([float(i) for i in range(len(cells))], pa.float64()),
            "spares": pa.array([[float(i)] for i in range(len(cells))], pa.list_(pa.float64())),
        }
    )
    at = sorted(range(0, len(cells), 3))[:changes]
    picked = rows.take(pa.array(at))
    fresh = picked.set_column(3, "value", pc.negate(picked["value"])).set_column(
        4, "spares", pa.array([[-1.0, float(i)] for i in at], pa.list_(pa.float64()))
    )
    pointers = pa.table(
        {
            "bucket_start": picked["bucket_start"],
            "bucket_end": picked["bucket_end"],
            "entity_id": picked["entity_id"],
            "generation": pa.array([1] * len(at), pa.int64()),
        }
    )
    changed = Changed(pointers, ())
    got = surface_patch.patched(rows, changed, fresh, ordered=True)
    kept = rows.filter(pa.array([i not in set(at) for i in range(len(cells))]))
    want = by_start_and_entity(pa.concat_tables([kept, fresh]))
    assert got.equals(want)
    assert got["value"].to_pylist()[at[-1]] == -float(at[-1])
