"""Row selection by time spans and entities (pure Spark)."""

import functools
import operator
from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from rollup_assets.model.windows import Window, merge_windows


def rows_within(
    frame: DataFrame,
    time_column: str,
    spans: Sequence[Window] | None,
    entities: frozenset[str] | None,
) -> DataFrame:
    """Rows whose `time_column` falls in one of `spans` (half-open; None: any time) and whose
    entity is in `entities` (None: any entity). Rows in gaps between spans stay out."""
    if spans:
        conds = [
            (F.col(time_column) >= F.lit(w.start)) & (F.col(time_column) < F.lit(w.end))
            for w in merge_windows(list(spans))
        ]
        frame = frame.where(functools.reduce(operator.or_, conds))
    if entities is not None:
        frame = frame.where(F.col("entity_id").isin(sorted(entities)))
    return frame
