"""Windows merged into sorted arrays of their bounds, for testing many instants or intervals
against them with one binary search each, however many windows there are."""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import numpy as np

from rollup_assets.model.windows import Window, merge_windows, micros


@dataclass(frozen=True)
class WindowBounds:
    """Windows merged, as sorted arrays of their starts and ends (Unix microseconds): made once
    for many masks (`rollup_table.in_windows`) and overlap tests (file pruning by statistics
    and by day partition)."""

    lo: np.ndarray
    hi: np.ndarray

    @classmethod
    def of(cls, windows: Sequence[Window]) -> "WindowBounds":
        merged = merge_windows(list(windows))
        return cls(
            np.array([micros(w.start) for w in merged], dtype=np.int64),
            np.array([micros(w.end) for w in merged], dtype=np.int64),
        )

    def overlaps(self, start: datetime, end: datetime, *, closed: bool = False) -> bool:
        """Does one of the windows overlap [start, end) (with `closed`, [start, end], as a
        file's min/max statistics bound its rows)? Merged windows are disjoint, so the last one
        starting before `end` (or at it, closed) is the one reaching furthest."""
        side: Literal["left", "right"] = "right" if closed else "left"
        i = int(np.searchsorted(self.lo, micros(end), side=side)) - 1
        return i >= 0 and int(self.hi[i]) > micros(start)
