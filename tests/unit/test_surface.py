"""The surface table, driven through the rollup store directly (no Spark): what it holds after
forward writes, flips and repairs, what each publish rewrites, and that concurrent publishes
converge. Expected rows are computed here from the partials written, not by the read path."""

import itertools
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

import rollup_assets.services.surface_files as surface_files
import rollup_assets.services.surface_layout as surface_layout
import rollup_assets.services.surface_reads as surface_reads
from rollup_assets.model.aggregates import AggregateFunction
from rollup_assets.model.cells import Cells
from rollup_assets.model.errors import UnsupportedTableFeatureError
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import Window
from rollup_assets.resources.delta_tables import file_actions
from rollup_assets.resources.rollup_table import Written
from rollup_assets.resources.schemas import part_values
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.engine import Engine
from rollup_assets.services.surface import GENMAP_APP, ROWS_APP, Known, publish, reflected
from rollup_assets.services.surface_files import compact as compact_surface
from rollup_assets.services.surface_lag import NEUTRAL_SLACK, SurfaceLag, surface_lag
from rollup_assets.services.surface_layout import fold_state
from rollup_assets.services.surface_reads import current_rows

DAY = timedelta(days=1)
# Local (Vienna) days as UTC windows, across the end of a month.
STARTS = [datetime(2025, 1, 29, 23, tzinfo=UTC) + i * DAY for i in range(4)]
WINDOWS = [Window(s, s + DAY) for s in STARTS]
ENTITIES = ["meter-a", "meter-b"]

Cell = tuple[str, Window]


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    return Engine(load_catalog(), Warehouse(str(tmp_path / "warehouse")))


@pytest.fixture
def spec(engine: Engine) -> RollupSpec:
    return engine.catalog.rollup("energy_daily")


def partials(spec: RollupSpec, cells: dict[Cell, float]) -> pa.Table:
    """Rows of stored partials: every partial of a cell derived from its value `v`."""
    rows = []
    for (entity, w), v in cells.items():
        row: dict = {"entity_id": entity, "bucket_start": w.start, "bucket_end": w.end}
        for c in spec.stored_columns:
            row[c.name] = 4 if c.partial == "count" else v
        rows.append(row)
    return pa.Table.from_pylist(rows)


def expected(spec: RollupSpec, cells: dict[Cell, float], partials: bool = True) -> list[dict]:
    """The surface rows of `cells` (logical columns, then with `partials` each average's sum and
    count), computed from the values written."""
    out = []
    for (entity, w), v in sorted(cells.items(), key=lambda kv: (kv[0][1].start, kv[0][0])):
        row: dict = {"entity_id": entity, "bucket_start": w.start, "bucket_end": w.end}
        for agg in spec.aggregations:
            if agg.function is AggregateFunction.AVG:
                row[agg.output_name] = v / 4
                if partials:  # kept so that buckets merge into coarser steps exactly
                    row[f"{agg.output_name}__sum"] = v
                    row[f"{agg.output_name}__count"] = 4
            elif agg.function is AggregateFunction.COUNT:
                row[agg.output_name] = 4
            else:
                row[agg.output_name] = v
        out.append(row)
    return out


def surface_rows(engine: Engine, spec: RollupSpec) -> list[dict]:
    """The surface's latest snapshot, read plainly (but the fold state)."""
    t = pa.table(DeltaTable(engine.rollups.surface_uri(spec)).to_pyarrow_table())
    t = t.drop_columns(["bucket_part", *fold_state(spec)]).sort_by(
        [("bucket_start", "ascending"), ("entity_id", "ascending")]
    )
    return t.to_pylist()


def write_forward(engine: Engine, spec: RollupSpec, cells: dict[Cell, float]) -> None:
    store = engine.rollups
    written = store.write_rows(
        partials(spec, cells), spec, generation=0, job_id="fwd", run_id="r", source_versions={}
    )
    buckets = sorted({w for _, w in cells})
    store.replace_forward(
        spec, written, buckets, {"rollups.operation": "Forward"}, store.identity(spec)
    )


def correct(
    engine: Engine, spec: RollupSpec, cells: dict[Cell, float], whole: bool = False
) -> None:
    """A recompute without its publish: new generation, committed, flipped on `cells` (with
    `whole`: on their buckets for every entity, one global pointer each)."""
    store = engine.rollups
    generation = store.next_generation(spec)
    written = store.write_rows(
        partials(spec, cells),
        spec,
        generation=generation,
        job_id=f"job-{generation}",
        run_id="r",
        source_versions={},
    )
    store.commit_generation(spec, written, {"rollups.operation": "recompute"}, store.identity(spec))
    by_window: dict[Window, set[str]] = {}
    for entity, w in cells:
        by_window.setdefault(w, set()).add(entity)
    scoped = Cells(
        tuple((w, None if whole else frozenset(es)) for w, es in sorted(by_window.items()))
    )
    store.flip(
        spec, scoped, generation, job_id=f"job-{generation}", run_id="r", fence=store.fence(spec)
    )


def base() -> dict[Cell, float]:
    return {
        (e, w): float(10 * i + j) for i, w in enumerate(WINDOWS) for j, e in enumerate(ENTITIES)
    }


def test_first_publish_builds_the_surface_and_records_the_versions(engine, spec) -> None:
    cells = base()
    write_forward(engine, spec, cells)
    done = publish(engine, spec)
    assert done.rebuilt and done.rows_written == len(cells)
    assert surface_rows(engine, spec) == expected(spec, cells)
    table = DeltaTable(engine.rollups.surface_uri(spec))
    snap = engine.rollups.snapshot(spec)
    assert table.transaction_version(ROWS_APP) == snap.version
    assert table.transaction_version(GENMAP_APP) == -1  # no pointer table yet
    assert not publish(engine, spec).changed  # up to date: nothing rewritten


def test_a_flip_lags_until_published_then_only_its_cells_are_replaced(engine, spec) -> None:
    cells = base()
    write_forward(engine, spec, cells)
    publish(engine, spec)
    fix = {("meter-b", WINDOWS[2]): 99.5}
    correct(engine, spec, fix)
    # Between the flip and the publish a plain reader sees the previous state, whole.
    assert surface_rows(engine, spec) == expected(spec, cells)
    done = publish(engine, spec)
    assert not done.rebuilt and done.spans == 1
    assert done.rows_written == 1  # the changed cell's active row (the others carried over)
    assert surface_rows(engine, spec) == expected(spec, {**cells, **fix})
    # The superseded row is still in the main table: a plain read of it would double count.
    rows = pa.table(DeltaTable(engine.rollups.uri(spec)).to_pyarrow_table())
    assert rows.num_rows == len(cells) + 1


def test_forward_writes_after_flips_are_published_by_one_repair(engine, spec) -> None:
    cells = base()
    write_forward(engine, spec, cells)
    publish(engine, spec)
    fix = {("meter-a", WINDOWS[0]): 7.25}
    correct(engine, spec, fix)
    later = Window(WINDOWS[-1].end, WINDOWS[-1].end + DAY)
    refresh = {
        ("meter-a", later): 3.0,
        ("meter-a", WINDOWS[3]): 41.0,
        ("meter-b", WINDOWS[3]): 42.0,
    }
    write_forward(engine, spec, refresh)  # a new bucket, and a forward bucket rewritten whole
    done = publish(engine, spec)
    assert not done.rebuilt
    current = {**cells, **fix, **refresh}
    assert surface_rows(engine, spec) == expected(spec, current)
    assert not publish(engine, spec).changed


def test_a_forward_refresh_that_empties_a_bucket_removes_its_rows(engine, spec) -> None:
    cells = base()
    write_forward(engine, spec, cells)
    publish(engine, spec)
    # The open bucket's source rows were all deleted: its refresh writes no file, only removes.
    engine.rollups.replace_forward(
        spec,
        Written([], 0),
        [WINDOWS[3]],
        {"rollups.operation": "OpenBucket"},
        engine.rollups.identity(spec),
    )
    done = publish(engine, spec)
    assert not done.rebuilt and done.spans == 1
    left = {(e, w): v for (e, w), v in cells.items() if w != WINDOWS[3]}
    assert surface_rows(engine, spec) == expected(spec, left)


def test_cell_and_bucket_pointers_replace_exactly_their_cells(engine, spec) -> None:
    cells = base()
    write_forward(engine, spec, cells)
    publish(engine, spec)
    # A cell pointer, then a bucket pointer superseding it, then a cell pointer on top again:
    # each publish replaces the rows of exactly the cells whose active generation changed.
    one = {("meter-a", WINDOWS[1]): 7.0}
    correct(engine, spec, one)
    assert publish(engine, spec).rows_written == 1
    assert surface_rows(engine, spec) == expected(spec, {**cells, **one})
    bucket = {(e, WINDOWS[1]): 20.0 + i for i, e in enumerate(ENTITIES)}
    correct(engine, spec, bucket, whole=True)
    assert publish(engine, spec).rows_written == len(ENTITIES)
    assert surface_rows(engine, spec) == expected(spec, {**cells, **bucket})
    again = {("meter-b", WINDOWS[1]): 30.0, ("meter-a", WINDOWS[2]): 31.0}
    correct(engine, spec, again)
    assert publish(engine, spec).rows_written == 2
    assert surface_rows(engine, spec) == expected(spec, {**cells, **bucket, **again})


def test_a_publish_in_batches_of_one_partition_writes_the_same_rows(
    engine, spec, monkeypatch
) -> None:
    monkeypatch.setattr(surface_files, "PARTS_PER_BATCH", 1)
    cells = base()  # two months' partitions (the daily rollup's surface is by UTC month)
    write_forward(engine, spec, cells)
    done = publish(engine, spec)
    assert done.rebuilt and done.rows_written == len(cells)
    assert surface_rows(engine, spec) == expected(spec, cells)
    assert len(file_actions(DeltaTable(engine.rollups.surface_uri(spec)))) == 2
    fix = {("meter-a", WINDOWS[0]): 1.5, ("meter-b", WINDOWS[3]): 2.5}  # one in each month
    correct(engine, spec, fix)
    done = publish(engine, spec)
    assert not done.rebuilt and done.rows_written == 2  # the two changed cells
    assert surface_rows(engine, spec) == expected(spec, {**cells, **fix})


def test_a_surface_of_dropped_and_recreated_tables_is_rebuilt(engine, spec) -> None:
    cells = base()
    write_forward(engine, spec, cells)
    correct(engine, spec, {("meter-a", WINDOWS[1]): 1.0})
    correct(engine, spec, {("meter-b", WINDOWS[1]): 2.0})
    publish(engine, spec)
    # The row and pointer tables start again (as after a re-creation), the surface is left.
    engine.warehouse.drop_table(engine.rollups.uri(spec))
    engine.warehouse.drop_table(engine.rollups.genmap_uri(spec))
    fresh = {(e, WINDOWS[0]): 5.0 for e in ENTITIES}
    write_forward(engine, spec, fresh)
    done = publish(engine, spec)
    assert done.rebuilt
    assert surface_rows(engine, spec) == expected(spec, fresh)
    engine.rollups.drop(spec)
    assert not Path(engine.rollups.surface_uri(spec)).exists()


def test_concurrent_publishes_converge_on_the_active_rows(engine, spec) -> None:
    cells = base()
    write_forward(engine, spec, cells)
    publish(engine, spec)
    fixes: dict[Cell, float] = {}
    for i, w in enumerate(WINDOWS):
        fix = {(ENTITIES[i % 2], w): 100.0 + i}
        correct(engine, spec, fix)
        fixes.update(fix)
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda _: publish(engine, spec), range(4)))
    assert any(d.changed for d in done)
    assert surface_rows(engine, spec) == expected(spec, {**cells, **fixes})
    table = DeltaTable(engine.rollups.surface_uri(spec))
    assert table.transaction_version(GENMAP_APP) == engine.rollups.snapshot(spec).genmap_version


def test_the_surface_is_partitioned_like_the_row_table(engine, spec) -> None:
    write_forward(engine, spec, base())
    publish(engine, spec)
    table = DeltaTable(engine.rollups.surface_uri(spec))
    assert table.metadata().partition_columns == ["bucket_part"]
    parts = {a["partition.bucket_part"] for a in file_actions(table)}
    assert parts == {"2025-01", "2025-02"}  # daily buckets: by UTC month of their start


def test_a_rewind_publishes_the_forward_rows_it_brings_back(engine, spec) -> None:
    cells = base()
    write_forward(engine, spec, cells)
    fixes = {("meter-a", WINDOWS[0]): 1.5, ("meter-b", WINDOWS[3]): 2.5}
    correct(engine, spec, fixes)
    publish(engine, spec)
    assert surface_rows(engine, spec) == expected(spec, {**cells, **fixes})
    # A rewind's two effects: the pointers from the third day on go, then their rows.
    engine.rollups.drop_pointers_from(spec, WINDOWS[2].start, job_id="rewind")
    engine.rollups.delete_recomputed_from(spec, WINDOWS[2].start)
    done = publish(engine, spec)
    assert not done.rebuilt and done.spans == 1
    rewound = {**cells, ("meter-a", WINDOWS[0]): 1.5}  # the later fix is gone, generation 0 back
    assert surface_rows(engine, spec) == expected(spec, rewound)


def test_a_publish_takes_the_rows_a_recompute_holds_when_they_are_the_target(
    engine, spec, monkeypatch
) -> None:
    """A recompute publishes the cells it flipped from the rows it wrote, reading nothing back,
    but only while the rollup is in the state right after its flip: after another change the
    rows are read."""
    cells = base()
    write_forward(engine, spec, cells)
    publish(engine, spec)
    fix = {("meter-b", WINDOWS[2]): 99.5}
    correct(engine, spec, fix)
    known = Known(
        partials(spec, fix),
        frozenset({("meter-b", WINDOWS[2].start)}),
        engine.rollups.snapshot(spec).reflects,
    )
    reads: list[object] = []
    real = engine.rollups.read_arrow

    def counted(*args, **kwargs):
        reads.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.rollups, "read_arrow", counted)
    assert publish(engine, spec, known).changed
    assert reads == []
    assert surface_rows(engine, spec) == expected(spec, cells | fix)
    more = {("meter-a", WINDOWS[1]): 7.0}
    correct(engine, spec, more)
    publish(engine, spec, known)  # no longer the state its rows are of
    assert reads
    assert surface_rows(engine, spec) == expected(spec, cells | fix | more)


# -- the file layout: files of whole entities by entity range, within a cap ----------------------

METERS = [f"meter-{i:02d}" for i in range(12)]


def wide() -> dict[Cell, float]:
    return {(e, w): float(i + 100 * j) for i, w in enumerate(WINDOWS) for j, e in enumerate(METERS)}


def snapshot_of(engine: Engine, spec: RollupSpec):
    return engine.rollups.snapshot(spec).reflects


def files_of(engine: Engine, spec: RollupSpec) -> list[dict]:
    return file_actions(DeltaTable(engine.rollups.surface_uri(spec)))


def assert_layout(files: list[dict], cap: int) -> None:
    """Every file within the cap, and the files of each partition of disjoint entity ranges."""
    by_part: dict[str, list[tuple[str, str]]] = {}
    for f in files:
        assert f["num_records"] <= cap, f
        by_part.setdefault(f["partition.bucket_part"], []).append(
            (f["min.entity_id"], f["max.entity_id"])
        )
    for ranges in by_part.values():
        ranges.sort()
        assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges)), ranges


@pytest.fixture
def cap(monkeypatch: pytest.MonkeyPatch) -> int:
    """A cap of 8 rows per surface file, so a few meters make several files per partition."""
    monkeypatch.setattr(surface_layout, "SURFACE_FILE_ROWS", 8)
    return 8


def test_a_partition_is_written_as_capped_files_of_entity_ranges(engine, spec, cap) -> None:
    cells = wide()
    write_forward(engine, spec, cells)
    publish(engine, spec)
    files = files_of(engine, spec)
    # January: 12 meters x 3 days (36 rows) in files of two meters; February: 12 rows.
    assert sorted(f["num_records"] for f in files) == [6] * 8
    assert_layout(files, cap)
    assert surface_rows(engine, spec) == expected(spec, cells)


def test_a_one_cell_publish_rewrites_only_the_file_of_its_entity(engine, spec, cap) -> None:
    cells = wide()
    write_forward(engine, spec, cells)
    publish(engine, spec)
    before = {f["path"] for f in files_of(engine, spec)}
    fix = {("meter-05", WINDOWS[1]): 0.5}
    correct(engine, spec, fix)
    done = publish(engine, spec)
    assert (done.files_removed, done.files_added) == (1, 1)
    assert done.surface_rows_read == 6 and done.file_rows_written == 6  # one file, two meters
    after = {f["path"] for f in files_of(engine, spec)}
    assert len(before - after) == 1 and len(after - before) == 1
    assert surface_rows(engine, spec) == expected(spec, {**cells, **fix})


def test_cells_of_new_entities_join_a_file_that_splits_past_the_cap(engine, spec, cap) -> None:
    cells = wide()
    write_forward(engine, spec, cells)
    publish(engine, spec)
    # Two meters sorting after every other, and one before: cell pointers of entities no file
    # holds yet, in January's three days.
    new = {(e, w): 7.0 for e in ("meter-99", "meter-98", "meter-00a") for w in WINDOWS[:3]}
    correct(engine, spec, new)
    done = publish(engine, spec)
    assert done.files_removed == 2  # the first and the last file of January take them
    files = files_of(engine, spec)
    assert_layout(files, cap)
    assert surface_rows(engine, spec) == expected(spec, {**cells, **new})


def test_a_query_merges_the_files_back_into_query_order(engine, spec, cap) -> None:
    cells = wide()
    write_forward(engine, spec, cells)
    publish(engine, spec)
    now = engine.rollups.reflects_now(spec)
    assert now == engine.rollups.snapshot(spec).reflects
    rows = current_rows(engine, spec, now, Window(WINDOWS[0].start, WINDOWS[-1].end))
    assert rows is not None
    # By bucket start, then entity; a query's logical columns only.
    assert rows.to_pylist() == expected(spec, cells, partials=False)
    # A plain reader taking `query_columns` gets those columns: no partials, no fold state.
    assert rows.column_names == surface_layout.query_columns(spec)
    assert not set(rows.column_names) & {*fold_state(spec), *surface_layout.averaged_partials(spec)}


def test_reads_of_the_surface_follow_every_commit_and_publish(engine, spec, cap) -> None:
    """Reads between publishes take the surface's state and the rollup's versions from caches
    checked against the logs: a flip makes the next read resolve the pointers, and the publish
    after it is read at once."""
    cells = wide()
    write_forward(engine, spec, cells)
    publish(engine, spec)
    window = Window(WINDOWS[0].start, WINDOWS[-1].end)
    before = engine.rollups.reflects_now(spec)
    assert current_rows(engine, spec, before, window) is not None
    new = {("meter-03", WINDOWS[1]): 7.5, ("meter-11", WINDOWS[-1]): 8.5}
    correct(engine, spec, new)
    now = engine.rollups.reflects_now(spec)
    assert now == engine.rollups.snapshot(spec).reflects
    assert now.genmap > before.genmap and now.rows > before.rows
    assert current_rows(engine, spec, now, window) is None  # the surface lags the flip
    # Read at `before`, the surface still holds exactly its rows.
    held = current_rows(engine, spec, before, window)
    assert held is not None and held.to_pylist() == expected(spec, cells, partials=False)
    publish(engine, spec)
    rows = current_rows(engine, spec, engine.rollups.reflects_now(spec), window)
    assert rows is not None
    assert rows.to_pylist() == expected(spec, {**cells, **new}, partials=False)


def test_a_surface_whose_files_cannot_be_read_is_refused_only_when_it_would_be_read(
    engine, spec, monkeypatch
) -> None:
    """Files with deletion vectors (another writer's) make a read of a current surface fail with
    the reason; a lagging surface is not read, so the query resolves the pointers as before."""

    def refused(table, deletion_vectors="refuse"):
        raise UnsupportedTableFeatureError("surface", "deletionVectors", "files carry vectors")

    cells = base()
    write_forward(engine, spec, cells)
    monkeypatch.setattr(surface_reads, "file_actions", refused)
    publish(engine, spec)
    new = {(cells_entity(cells), WINDOWS[0]): 4.25}
    correct(engine, spec, new)
    window = Window(WINDOWS[0].start, WINDOWS[-1].end)
    assert current_rows(engine, spec, engine.rollups.reflects_now(spec), window) is None
    publish(engine, spec)
    raised = []
    for _ in range(2):  # the reason is kept with the surface's version, and raised each time
        with pytest.raises(UnsupportedTableFeatureError, match="files carry vectors") as error:
            current_rows(engine, spec, engine.rollups.reflects_now(spec), window)
        raised.append(error.value)
    assert raised[0] is not raised[1]  # an error of each read's own (concurrent reads share none)


def cells_entity(cells: dict[Cell, float]) -> str:
    return next(iter(cells))[0]


def test_maintenance_merges_small_neighbouring_files_and_keeps_what_the_surface_reflects(
    engine, spec, monkeypatch
) -> None:
    cells = wide()
    write_forward(engine, spec, cells)
    monkeypatch.setattr(surface_layout, "SURFACE_FILE_ROWS", 4)
    publish(engine, spec)
    # January: one file per meter (3 rows); February: three files of four meters.
    assert sorted(f["num_records"] for f in files_of(engine, spec)) == [3] * 12 + [4] * 3
    monkeypatch.setattr(surface_layout, "SURFACE_FILE_ROWS", 24)  # merged up to 12 rows
    recorded = reflected(DeltaTable(engine.rollups.surface_uri(spec)))
    assert compact_surface(engine, spec) == 15
    files = files_of(engine, spec)
    assert sorted(f["num_records"] for f in files) == [12] * 4
    assert_layout(files, 12)
    assert reflected(DeltaTable(engine.rollups.surface_uri(spec))) == recorded
    assert surface_rows(engine, spec) == expected(spec, cells)
    assert compact_surface(engine, spec) == 0


# -- the lag: from the logs alone -------------------------------------------------------------


def test_the_lag_runs_from_the_oldest_flip_the_surface_does_not_show(engine, spec) -> None:
    cells = base()
    write_forward(engine, spec, cells)
    assert surface_lag(engine, spec).needs_publish  # never published: no surface yet
    publish(engine, spec)
    assert surface_lag(engine, spec) == SurfaceLag(spec.name, snapshot_of(engine, spec), None)
    before = datetime.now(UTC)
    correct(engine, spec, {("meter-a", WINDOWS[0]): 1.0})
    flipped = datetime.now(UTC)
    correct(engine, spec, {("meter-b", WINDOWS[1]): 2.0})
    lag = surface_lag(engine, spec)
    assert lag.needs_publish and lag.since is not None
    # The first flip's commit time (Delta keeps milliseconds), not the second's.
    assert before - timedelta(milliseconds=1) <= lag.since <= flipped
    assert lag.seconds(lag.since + timedelta(seconds=5)) == 5.0
    publish(engine, spec)
    assert not surface_lag(engine, spec).needs_publish


def test_commits_that_leave_the_active_rows_lag_nothing_until_there_are_many(engine, spec) -> None:
    write_forward(engine, spec, base())
    publish(engine, spec)
    store = engine.rollups

    def invisible() -> None:  # a recompute's rows, committed and never flipped
        rows = partials(spec, {("meter-a", WINDOWS[0]): 3.0})
        g = store.next_generation(spec)
        written = store.write_rows(
            rows, spec, generation=g, job_id=f"j{g}", run_id="r", source_versions={}
        )
        store.commit_generation(
            spec, written, {"rollups.operation": "recompute"}, store.identity(spec)
        )

    for _ in range(NEUTRAL_SLACK):
        invisible()
    lag = surface_lag(engine, spec)
    assert lag.since is None and lag.behind == NEUTRAL_SLACK and not lag.needs_publish
    invisible()
    lag = surface_lag(engine, spec)
    assert lag.since is None and lag.seconds(datetime.now(UTC)) == 0.0 and lag.needs_publish
    publish(engine, spec)
    assert not surface_lag(engine, spec).needs_publish


def test_a_surface_of_re_created_tables_cannot_tell_its_lag(engine, spec) -> None:
    write_forward(engine, spec, base())
    for i in range(3):
        correct(engine, spec, {("meter-a", WINDOWS[1]): float(i)})
    publish(engine, spec)
    engine.warehouse.drop_table(engine.rollups.uri(spec))
    engine.warehouse.drop_table(engine.rollups.genmap_uri(spec))
    write_forward(engine, spec, {(e, WINDOWS[0]): 5.0 for e in ENTITIES})
    lag = surface_lag(engine, spec)
    assert lag.unknown and lag.needs_publish and lag.seconds(datetime.now(UTC)) is None


def test_a_surface_of_the_older_format_is_not_read_and_its_next_publish_rebuilds_it(
    engine, spec
) -> None:
    """A surface published before it kept the averages' partials (logical columns only, no
    format recorded, but the versions it reflects current): queries do not read it, it lags,
    maintenance's file merge leaves it alone, and the next publish rebuilds it whole."""
    cells = base()
    write_forward(engine, spec, cells)
    snap = engine.rollups.snapshot(spec)
    old = pa.Table.from_pylist(expected(spec, cells, partials=False))
    old = old.append_column("bucket_part", part_values(spec, old["bucket_start"]))
    write_deltalake(
        engine.rollups.surface_uri(spec),
        old,
        partition_by=["bucket_part"],
        commit_properties=CommitProperties(
            app_transactions=[
                Transaction(GENMAP_APP, snap.reflects.genmap),
                Transaction(ROWS_APP, snap.reflects.rows),
            ]
        ),
    )
    window = Window(WINDOWS[0].start, WINDOWS[-1].end)
    assert reflected(DeltaTable(engine.rollups.surface_uri(spec))) is None
    assert current_rows(engine, spec, snap.reflects, window) is None
    assert surface_lag(engine, spec).needs_publish
    assert compact_surface(engine, spec) == 0
    done = publish(engine, spec)
    assert done.rebuilt and done.rows_written == len(cells)
    assert surface_rows(engine, spec) == expected(spec, cells)
    assert reflected(DeltaTable(engine.rollups.surface_uri(spec))) == snap.reflects
    partials = current_rows(engine, spec, engine.rollups.reflects_now(spec), window, partials=True)
    assert partials is not None
    assert partials.column_names == [
        "entity_id",
        "bucket_start",
        "bucket_end",
        *(c.name for c in spec.stored_columns),
    ]
    assert partials.to_pylist() == [  # expected() is in query order already
        {k: v for k, v in r.items() if k in partials.column_names} for r in expected(spec, cells)
    ]
