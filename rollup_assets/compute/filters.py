"""Row selection by time spans and entities (pure Spark)."""

import functools
import operator
from collections.abc import Sequence
from datetime import timedelta

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from rollup_assets.model.windows import Window, merge_windows

# Past this many disjoint spans one OR of range conditions grows too deep for Spark's planner
# (a stack overflow at a few thousand): the filter is coarsened (see `rows_within`).
MAX_SPAN_TERMS = 64


def _coarse(spans: list[Window]) -> list[Window]:
    """At most `MAX_SPAN_TERMS` windows covering `spans`: their UTC days, merged; if those are
    still too many, the gaps between them closed from the smallest up."""
    days = merge_windows(
        [
            Window(
                w.start.replace(hour=0, minute=0, second=0, microsecond=0),
                w.end
                if w.end == w.end.replace(hour=0, minute=0, second=0, microsecond=0)
                else w.end.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1),
            )
            for w in spans
        ]
    )
    while len(days) > MAX_SPAN_TERMS:
        gaps = sorted(range(len(days) - 1), key=lambda i: days[i + 1].start - days[i].end)
        close = set(gaps[: len(days) - MAX_SPAN_TERMS])
        merged: list[Window] = []
        for i, w in enumerate(days):
            if i - 1 in close:
                merged[-1] = Window(merged[-1].start, w.end)
            else:
                merged.append(w)
        days = merged
    return days


def rows_within(
    frame: DataFrame,
    time_column: str,
    spans: Sequence[Window] | None,
    entities: frozenset[str] | None,
) -> DataFrame:
    """Rows whose `time_column` falls in one of `spans` (half-open; None: any time) and whose
    entity is in `entities` (None: any entity). Rows in gaps between spans stay out, unless the
    spans are more than `MAX_SPAN_TERMS` disjoint windows: then the filter keeps the UTC days
    covering them (merged further if need be), a superset, for callers that join the rows with
    their own targets (a recompute of thousands of scattered cells)."""
    if spans:
        merged = merge_windows(list(spans))
        if len(merged) > MAX_SPAN_TERMS:
            merged = _coarse(merged)
        conds = [
            (F.col(time_column) >= F.lit(w.start)) & (F.col(time_column) < F.lit(w.end))
            for w in merged
        ]
        frame = frame.where(functools.reduce(operator.or_, conds))
    if entities is not None:
        frame = frame.where(F.col("entity_id").isin(sorted(entities)))
    return frame
