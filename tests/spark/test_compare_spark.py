"""Spark's cell comparison follows the same rule as the driver's (tests/unit/test_cell_changes)."""

from pyspark.sql import SparkSession

from rollup_assets.compute.compare import CHANGED, all_new, cell_changes, cell_changes_arrow
from tests.unit.test_cell_changes import HOURLY, partials


def test_spark_and_arrow_agree_on_what_changed(spark: SparkSession) -> None:
    nan = float("nan")
    total = sum([0.1] * 10)  # 1.0 summed in another order
    fresh = partials(
        [
            ("same", 0, 1.5),
            ("rounded", 0, total),
            ("moved", 0, 2.0),
            ("new", 0, 1.0),
            ("nan", 0, nan),
            ("null", 0, None),
        ]
    )
    stored = partials(
        [
            ("same", 0, 1.5),
            ("rounded", 0, 1.0),
            ("moved", 0, 2.5),
            ("gone", 0, 1.0),
            ("nan", 0, nan),
            ("null", 0, None),
        ]
    )
    on_spark = cell_changes(spark.createDataFrame(fresh), spark.createDataFrame(stored), HOURLY)
    spark_changed = {r["entity_id"]: r[CHANGED] for r in on_spark.toArrow().to_pylist()}
    arrow = cell_changes_arrow(fresh, stored, HOURLY).to_pylist()
    assert spark_changed == {r["entity_id"]: r[CHANGED] for r in arrow}
    assert spark_changed == {
        "same": False,
        "rounded": False,
        "moved": True,
        "new": True,
        "gone": True,
        "nan": False,
        "null": False,
    }


def test_with_nothing_stored_every_cell_is_new_without_a_join(spark: SparkSession) -> None:
    fresh = spark.createDataFrame(partials([("a", 0, 1.5), ("b", 1, None), ("c", 2, 3.0)]))
    empty = spark.createDataFrame(partials([]), schema=fresh.schema)
    joined = cell_changes(fresh, empty, HOURLY)
    shortcut = all_new(fresh, HOURLY)
    assert shortcut.columns == joined.columns
    key = ["entity_id", "bucket_start"]
    assert sorted(shortcut.toArrow().to_pylist(), key=lambda r: [r[k] for k in key]) == sorted(
        joined.toArrow().to_pylist(), key=lambda r: [r[k] for k in key]
    )
