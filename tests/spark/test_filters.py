"""Row selection by spans: exact for a few spans, a covering superset for thousands of them
(one OR of thousands of range conditions overflows Spark's planner)."""

from datetime import UTC, datetime, timedelta

import pyarrow as pa
from pyspark.sql import SparkSession

from rollup_assets.compute.arrow_types import TS
from rollup_assets.compute.filters import MAX_SPAN_TERMS, _coarse, rows_within
from rollup_assets.model.windows import Window

T0 = datetime(2025, 1, 1, tzinfo=UTC)
H = timedelta(hours=1)


def scattered(n: int) -> list[Window]:
    """`n` hours, every seventh hour of the year (disjoint, never adjacent)."""
    return [Window(T0 + 7 * i * H, T0 + (7 * i + 1) * H) for i in range(n)]


def test_thousands_of_spans_are_covered_by_few_windows() -> None:
    spans = scattered(1200)
    coarse = _coarse(spans)
    assert len(coarse) <= MAX_SPAN_TERMS
    assert all(any(c.start <= w.start and w.end <= c.end for c in coarse) for w in spans)


def test_a_few_spans_are_exact_and_thousands_do_not_overflow(spark: SparkSession) -> None:
    rows = pa.table(
        {
            "entity_id": pa.array(["m"] * 4000, pa.string()),
            "ts": pa.array([T0 + i * H + timedelta(minutes=30) for i in range(4000)], TS),
        }
    )
    frame = spark.createDataFrame(rows)
    few = scattered(3)
    assert rows_within(frame, "ts", few, None).count() == 3  # the gaps stay out
    many = scattered(500)
    kept = rows_within(frame, "ts", many, frozenset({"m"})).toArrow()
    inside = {w.start + timedelta(minutes=30) for w in many}
    assert inside <= set(kept["ts"].to_pylist())  # every span's row is kept
