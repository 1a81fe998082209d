"""Which rows of superseded generations a rollup keeps: the one rule every action obeys.

A recompute flips a cell to a new generation; the rows it superseded stay readable (invisible
to plain reads) for the generation retention, because as-of reads of the time before the flip
and a rollback of the flip need them. The rule, stated once:

  * a superseded row stays while a pointer covering its cell was flipped less than the retention
    ago (the flip that superseded it, or a later one: a rollback's restored pointers count as
    flipped when it committed). The sweep deletes the rest;
  * rows of a generation that was never flipped (a run that died before its flip) are nobody's:
    a reclaim deletes them, and never a generation that was flipped, however long ago (that is
    the sweep's, under the rule above);
  * a rollback restores what a flip superseded only while that flip is younger than the
    retention less a margin, checked again at its commit, so no sweep can have reached those
    rows (clocks of two machines may differ by less than the margin);
  * vacuum keeps unreferenced files at least as long, so as-of reads within the retention find
    the files of the versions they read.

Pure Python: instants are aware UTC `datetime`s.
"""

import math
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

# The most a rollback keeps away from the retention's edge (at most a tenth of the retention).
ROLLBACK_MARGIN = timedelta(hours=1)


@dataclass(frozen=True)
class Keeping:
    """The rule for one warehouse: `retention` is the generation retention (0: superseded rows
    go at the next sweep, and no rollback is possible)."""

    retention: timedelta

    @property
    def keeps(self) -> bool:
        return self.retention > timedelta(0)

    def cutoff(self, now: datetime) -> datetime:
        """A pointer flipped after this instant keeps the superseded rows of its cell."""
        return now - self.retention

    def sweepable(self, flipped_at: datetime, now: datetime) -> bool:
        """May the superseded rows of a cell whose newest pointer was flipped at `flipped_at`
        go at `now`?"""
        return flipped_at <= self.cutoff(now)

    @property
    def rollback_window(self) -> timedelta:
        """How long after a flip a rollback of it may still commit."""
        return self.retention - min(ROLLBACK_MARGIN, self.retention / 10)

    def may_roll_back(self, flipped_at: datetime, now: datetime) -> bool:
        return self.keeps and now - flipped_at <= self.rollback_window

    @staticmethod
    def reclaimable(generation: int, flipped: Collection[int]) -> bool:
        """Are the rows of `generation` nobody's (never flipped, and not the forward lane's 0)?"""
        return generation != 0 and generation not in flipped

    def vacuum_hours(self, requested: int) -> int:
        """Hours vacuum keeps unreferenced files: what was asked, never less than the
        retention."""
        return max(requested, math.ceil(self.retention.total_seconds() / 3600))
