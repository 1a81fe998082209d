"""The columns of a rollup's rows are declared once (`model.partials.row_columns`): the table
schema, the rows a correction and an aggregation make, and the names a spec may not take all
follow that declaration."""

import dataclasses
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rollup_assets.compute.aggregation import SOURCE_ROWS
from rollup_assets.compute.arrow_partials import partials_arrow
from rollup_assets.compute.arrow_types import arrow_type
from rollup_assets.compute.folding import difference_rows
from rollup_assets.model.aggregates import BASE_KINDS, DELTA_KINDS
from rollup_assets.model.bucketing import Bucketing
from rollup_assets.model.names import RESERVED_COLUMNS
from rollup_assets.model.partials import (
    ADDED_KINDS,
    CELL_COLUMNS,
    DELTA_COLUMN,
    EXTREMES,
    SPECIAL_KINDS,
    SumState,
    row_columns,
    state_columns,
)
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import Window
from rollup_assets.resources.schemas import PART_COLUMN, data_schema, table_schema

CATALOG = load_catalog()
ROLLUPS = list(CATALOG.rollups.values())
T0 = datetime(2025, 3, 3, tzinfo=UTC)
Q = timedelta(minutes=15)


def own_columns(spec: RollupSpec) -> set[str]:
    """The row columns a spec does not name itself: neither partials nor companions."""
    named = {sc.name for sc in spec.stored_columns} | {c.name for c in spec.companions}
    return {c.name for c in row_columns(spec)} - named


@pytest.mark.parametrize("spec", ROLLUPS, ids=lambda s: s.name)
def test_the_table_schema_is_the_declared_row_and_its_partition(spec: RollupSpec) -> None:
    schema = table_schema(spec)
    declared = row_columns(spec)
    assert schema.names == [*(c.name for c in declared), PART_COLUMN]
    assert [f.type for f in schema][:-1] == [arrow_type(c.type, c.listed) for c in declared]
    assert all(f.nullable for f in schema)
    assert data_schema(spec).names == schema.names[:-1]


@pytest.mark.parametrize("spec", ROLLUPS, ids=lambda s: s.name)
def test_no_declared_column_can_shadow_a_column_of_the_row(spec: RollupSpec) -> None:
    assert own_columns(spec) | {PART_COLUMN} <= RESERVED_COLUMNS


@pytest.mark.parametrize("spec", ROLLUPS, ids=lambda s: s.name)
def test_a_cells_state_is_the_declared_row_without_its_differences_and_stamps(
    spec: RollupSpec,
) -> None:
    state = state_columns(spec)
    row = row_columns(spec)
    assert [c for c in row if c in state] == list(state)  # in table order
    kinds = {c.name: c.kind for c in spec.companions}
    assert {kinds[c.name] for c in state if c.name in kinds} == BASE_KINDS & {
        c.kind for c in spec.companions
    }


def test_every_base_companion_merges_by_one_rule() -> None:
    assert ADDED_KINDS | EXTREMES.keys() == BASE_KINDS
    assert not ADDED_KINDS & EXTREMES.keys()
    assert set(SPECIAL_KINDS) <= ADDED_KINDS
    assert set(SPECIAL_KINDS) <= {f.name for f in dataclasses.fields(SumState)}


def test_finite_values_whose_exact_sum_overflows_leave_a_total_that_is_overflowed() -> None:
    # The grouped fold reports such a cell to aggregate again; one folded by itself must too,
    # rather than fail on `math.fsum`'s overflow.
    assert SumState.of([1e308, 1e308]).overflowed
    assert SumState.of([1e308, 1e308]).n == 2
    assert not SumState.of([1e308, -1e308, 2.0]).overflowed
    assert SumState.of([2**62, 2**62]).total == 2**63  # integers stay exact


def readings(n: int) -> pa.Table:
    return pa.table(
        {
            "entity_id": pa.array(["m1", "m2"] * n, pa.string()),
            "ts": pa.array([T0 + (i // 2) * Q for i in range(2 * n)], pa.timestamp("us", "UTC")),
            "energy_kwh": pa.array([0.5 * i for i in range(2 * n)], pa.float64()),
            "power_kw": pa.array([1.0 + i % 3 for i in range(2 * n)], pa.float64()),
            "voltage_v": pa.array([228.0 + i % 5 for i in range(2 * n)], pa.float64()),
            "current_a": pa.array([4.0 + i % 2 for i in range(2 * n)], pa.float64()),
        }
    )


def test_an_aggregated_row_holds_the_cell_and_its_declared_state() -> None:
    hourly = CATALOG.rollup("energy_hourly")
    raw = CATALOG.archive(hourly.source)
    windows = [Window(T0, T0 + timedelta(hours=1)), Window(T0 + timedelta(hours=1), T0 + 8 * Q)]
    rows = partials_arrow(readings(8), windows, None, hourly, raw)
    state = [c.name for c in state_columns(hourly)]
    assert set(rows.column_names) == {*CELL_COLUMNS, *state, SOURCE_ROWS}
    stored = data_schema(hourly)
    for name in state:
        assert rows.schema.field(name).type == stored.field(name).type, name


@pytest.mark.parametrize(
    "hours",
    [[(0, 1), (1, 2)], [(0, 1), (2, 3)], [(1, 2)], [(0, 1)]],
    ids=["following", "a gap", "rows before", "rows after"],
)
def test_only_rows_inside_a_window_are_aggregated_into_it(hours: list[tuple[int, int]]) -> None:
    """Readings over three hours into some of them: each bucket holds its own rows, and rows in
    no window (before, between or after them) are in none."""
    hourly = CATALOG.rollup("energy_hourly")
    rows = readings(12)
    windows = [Window(T0 + timedelta(hours=a), T0 + timedelta(hours=b)) for a, b in hours]
    got = partials_arrow(rows, windows, None, hourly, CATALOG.archive(hourly.source))
    want: dict[tuple[str, datetime], int] = {}
    for e, t in zip(rows["entity_id"].to_pylist(), rows["ts"].to_pylist(), strict=True):
        for w in windows:
            if w.start <= t < w.end:
                want[(e, w.start)] = want.get((e, w.start), 0) + 1
    starts = got["bucket_start"].to_pylist()
    ends = got["bucket_end"].to_pylist()
    cells = zip(got["entity_id"].to_pylist(), starts, strict=True)
    assert dict(zip(cells, got[SOURCE_ROWS].to_pylist(), strict=True)) == want
    assert all(e - s == timedelta(hours=1) for s, e in zip(starts, ends, strict=True))


def test_a_difference_row_holds_the_cell_and_the_values_entering_and_leaving_it() -> None:
    hourly = CATALOG.rollup("energy_hourly")
    changes = readings(2).append_column(
        "kind", pa.array(["insert", "insert", "update_preimage", "update_postimage"])
    )
    diff = difference_rows(changes, hourly, "ts", "kind", Bucketing.of(hourly))
    entering_leaving = [c.name for c in hourly.companions if c.kind in DELTA_KINDS]
    assert diff.column_names == [*CELL_COLUMNS, DELTA_COLUMN, *entering_leaving]
    stored = data_schema(hourly)
    for name in diff.column_names:
        assert diff.schema.field(name).type == stored.field(name).type, name


@pytest.mark.parametrize("companions", [False, True])
def test_entity_ids_coded_file_by_file_aggregate_as_the_ids_themselves(companions: bool) -> None:
    """Rows read with their entity ids dictionary-coded, each file (chunk) with a dictionary of
    its own in its own order, aggregate into the same cells as the ids as strings."""
    hourly = CATALOG.rollup("energy_hourly")
    raw = CATALOG.archive(hourly.source)
    plain = readings(12)
    dictionaries = [["m1", "m2"], ["m2", "m1"], ["m2", "m1", "m3"]]
    coded_chunks = []
    for i, part in enumerate(plain.to_batches(max_chunksize=8)):
        names = pa.array(dictionaries[i], pa.string())
        codes = pc.index_in(part["entity_id"], value_set=names).cast(pa.int32())
        coded_chunks.append(pa.DictionaryArray.from_arrays(codes, names))
    assert len(coded_chunks) == 3
    coded = plain.set_column(0, "entity_id", pa.chunked_array(coded_chunks))
    windows = [Window(T0 + timedelta(hours=h), T0 + timedelta(hours=h + 1)) for h in range(3)]

    def cells(rows: pa.Table) -> pa.Table:
        got = partials_arrow(rows, windows, None, hourly, raw, companions=companions)
        return got.sort_by([("entity_id", "ascending"), ("bucket_start", "ascending")])

    want, got = cells(plain), cells(coded)
    assert got.schema.field("entity_id").type == pa.string()
    assert got.to_pylist() == want.to_pylist()
    assert got.num_rows == 6
