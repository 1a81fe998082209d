"""Rollup tables on Delta: generation writes, pointer flips and the consistent read path.

A rollup table holds base rows (a cell's state) and difference rows (a change of it) of every
generation; its `__genmap` says which are visible per cell (`genmap`). Writers follow
the optimistic atomic swap: write rows at a new generation (`rollup_writes`), flip the pointers
in one commit (`rollup_pointers`), then sweep what the flip superseded (`rollup_deletions`). The
forward lane (closing and refreshing the open bucket) instead replaces generation-0 rows in place
with one atomic commit.

Readers take a consistent snapshot of the pointer and row tables (`rollup_snapshots`) and read
one row per cell from it, each cell's difference rows folded into its base (`rollup_reads`).
"""

from rollup_assets.resources.rollup_deletions import RollupDeletions
from rollup_assets.resources.rollup_pointers import RollupPointers
from rollup_assets.resources.rollup_reads import RollupReads
from rollup_assets.resources.rollup_writes import RollupWrites


class RollupStore(RollupReads, RollupWrites, RollupPointers, RollupDeletions):
    """The rollup tables of a warehouse and everything done to them: reads, writes, pointer
    commits and deletions."""
