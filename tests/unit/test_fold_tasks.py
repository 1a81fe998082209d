"""The executors' fold task (`fold_tasks.fold_task`): given a cell's rows in any batches and
column order, as Spark hands them over, it returns what the table fold returns, and a cell the
fold cannot know as a flagged row of its keys, bucket end and newest generation."""

import pyarrow as pa

from rollup_assets.compute.fold_tables import fold
from rollup_assets.compute.fold_tasks import UNKNOWABLE, fold_task
from rollup_assets.model.partials import GENERATION
from rollup_assets.resources.schemas import data_schema
from tests.unit.test_fold_tables import HOURLY, RAW, bases, feeds_of, identical, raw, visible

ORDER = [("entity_id", "ascending"), ("bucket_start", "ascending")]


def test_the_fold_task_returns_the_table_fold_and_flags_the_cells_it_cannot_know() -> None:
    start = {("a", 5): (1.0, 1), ("b", 5): (2.0, 3), ("b", 70): (4.0, 5), ("c", 9): (1.0, 1)}
    waves = [
        [("upsert", ("a", 6), (1e308, 1)), ("upsert", ("b", 6), (7.5, -2))],
        [("upsert", ("a", 7), (1e308, 1)), ("delete", ("b", 70))],
    ]
    rows = visible(HOURLY, bases(HOURLY, raw(start), RAW), feeds_of(start, waves))
    schema = data_schema(HOURLY)
    # Spark puts the join keys first and cuts the rows into batches anywhere.
    spark_order = ["bucket_start", "entity_id"] + [
        n for n in schema.names if n not in ("bucket_start", "entity_id")
    ]
    handed = rows.select(spark_order)
    batches = [handed.slice(i, 2).to_batches()[0] for i in range(0, handed.num_rows, 2)]

    out = pa.Table.from_batches(list(fold_task(HOURLY, schema)(iter(batches))))

    want, unknown = fold(rows, HOURLY)
    assert [e for e, _ in unknown] == ["a"]
    flags = out[UNKNOWABLE].to_pylist()
    known = out.filter(pa.array([not f for f in flags])).drop_columns([UNKNOWABLE])
    assert known.schema == schema
    got_rows, want_rows = known.sort_by(ORDER).to_pylist(), want.sort_by(ORDER).to_pylist()
    assert len(got_rows) == len(want_rows) == 2  # b at 23:00 lost its last row
    for g, w in zip(got_rows, want_rows, strict=True):
        assert identical(g, w), (g["entity_id"], g["bucket_start"])
    [lost] = out.filter(pa.array(flags)).to_pylist()
    a_rows = rows.filter(pa.compute.equal(rows["entity_id"], "a")).to_pylist()
    assert (lost["entity_id"], lost["bucket_start"]) == unknown[0]
    assert lost["bucket_end"] == a_rows[0]["bucket_end"]
    assert lost[GENERATION] == max(r[GENERATION] for r in a_rows) == 3
    assert all(
        lost[n] is None
        for n in schema.names
        if n not in ("entity_id", "bucket_start", "bucket_end", GENERATION)
    )


def test_a_task_given_no_rows_returns_none() -> None:
    assert list(fold_task(HOURLY, data_schema(HOURLY))(iter([]))) == []
