"""Cells: the unit of a rollup's work, one bucket of one entity.

Work is kept per bucket: the entities of the bucket it covers, or every entity (a change that
cannot name its entities, or one that named more than a bucket's limit). Coalescing takes the
union per bucket, never the cross product of every touched bucket with every touched entity: a
late reading of meter A on Monday and one of meter B on Friday are two cells, not four.
"""

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

from rollup_assets.model.windows import Window
from rollup_assets.settings import DetectionLimits

# The entities of one bucket a piece of work covers; None: every entity.
Scope = frozenset[str] | None

# Floating-point partials this close (relative) are one value rounded two ways (summed in
# another order, or corrected by a delta): a cell whose partials differ only so is unchanged.
ROUNDING = 1e-12

# A storage partition (a UTC day of hourly buckets, a month of days, a year above) whose buckets
# carry at least this many cell pointers in all is folded by maintenance: each of its buckets
# with a cell pointer is recomputed for every entity and rewritten whole under one bucket
# pointer (see `changed_cells`, `buckets_to_fold`). So the cell pointers a read resolves stay
# below this many per partition, however many corrections came before.
FOLD_MIN_POINTERS = 8

# A bucket naming more entities than this is recomputed for every entity (one pointer per bucket
# instead of one per cell); ROLLUPS_ENTITY_SCOPE_LIMIT sets it for detection and coalescing.
DEFAULT_BUCKET_ENTITY_LIMIT = DetectionLimits().entity_scope_limit


@dataclass(frozen=True)
class Cells:
    """A set of cells: per bucket (in order, each once), the entities covered."""

    by_window: tuple[tuple[Window, Scope], ...] = ()

    def __hash__(self) -> int:
        """Hashed once per object: a correction's cells (thousands of buckets) key the caches
        of their encodings and first-level cells, looked up at every level of a chain."""
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(self.by_window)
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self) -> dict:
        # A string's hash differs from process to process: the cached one stays behind.
        return {"by_window": self.by_window}

    @staticmethod
    def of(windows: Iterable[Window], entities: Scope = None) -> "Cells":
        """Every one of `windows` for the same `entities` (None: every entity)."""
        return Cells(tuple((w, entities) for w in sorted(set(windows))))

    @staticmethod
    def from_pairs(
        pairs: Iterable[tuple[Window, str | None]],
        limit: int | None = DEFAULT_BUCKET_ENTITY_LIMIT,
    ) -> "Cells":
        """The cells of (bucket, entity) pairs; an entity of None stands for every entity, and
        so do more than `limit` entities in one bucket (None: no limit)."""
        named: dict[Window, set[str]] = {}
        every: set[Window] = set()
        for w, entity in pairs:
            if entity is None:
                every.add(w)
            else:
                named.setdefault(w, set()).add(entity)
        out: dict[Window, Scope] = {w: None for w in every}
        for w, ids in named.items():
            if w not in every:
                out[w] = None if limit is not None and len(ids) > limit else frozenset(ids)
        return Cells(tuple(sorted(out.items(), key=lambda item: item[0])))

    def __bool__(self) -> bool:
        return bool(self.by_window)

    def __iter__(self) -> Iterator[tuple[Window, Scope]]:
        return iter(self.by_window)

    def __len__(self) -> int:
        return len(self.by_window)

    @property
    def windows(self) -> tuple[Window, ...]:
        return tuple(w for w, _ in self.by_window)

    @property
    def entities(self) -> Scope:
        """Every entity any bucket covers (None: some bucket covers every entity)."""
        out: set[str] = set()
        for _, scope in self.by_window:
            if scope is None:
                return None
            out |= scope
        return frozenset(out)

    @property
    def named(self) -> int | None:
        """How many (bucket, entity) cells are named (None: some bucket covers every entity)."""
        total = 0
        for _, scope in self.by_window:
            if scope is None:
                return None
            total += len(scope)
        return total

    def scope(self, window: Window) -> Scope:
        for w, scope in self.by_window:
            if w == window:
                return scope
        raise KeyError(window)

    @staticmethod
    def collect(
        items: Iterable[tuple[Window, Scope]], limit: int | None = DEFAULT_BUCKET_ENTITY_LIMIT
    ) -> "Cells":
        """The union of (bucket, scope) items: per bucket the union of their scopes (every
        entity past `limit`; None: no limit)."""
        first: dict[Window, Scope] = {}
        grown: dict[Window, set[str] | None] = {}  # a bucket joined more than once, in place
        for w, scope in items:
            if w not in first:
                first[w] = scope
                continue
            if w not in grown:
                have = first[w]
                grown[w] = None if have is None else set(have)
            union = grown[w]
            if union is None:
                continue
            if scope is None:
                grown[w] = None
                continue
            union |= scope
            if limit is not None and len(union) > limit:
                grown[w] = None
        merged = {w: (frozenset(u) if u is not None else None) for w, u in grown.items()}
        out = {**first, **merged}
        return Cells(tuple(sorted(out.items(), key=lambda item: item[0])))

    def union(self, other: "Cells", limit: int = DEFAULT_BUCKET_ENTITY_LIMIT) -> "Cells":
        return Cells.collect([*self.by_window, *other.by_window], limit)

    def restrict(self, windows: Iterable[Window]) -> "Cells":
        """Only the buckets in `windows`."""
        keep = set(windows)
        return Cells(tuple((w, s) for w, s in self.by_window if w in keep))

    def groups(self) -> list[tuple[Scope, list[Window]]]:
        """The buckets grouped by the entities they cover (every-entity buckets first)."""
        by_scope: dict[Scope, list[Window]] = {}
        for w, scope in self.by_window:
            by_scope.setdefault(scope, []).append(w)
        return sorted(
            by_scope.items(), key=lambda item: (item[0] is not None, sorted(item[0] or ()))
        )

    def is_product(self) -> bool:
        """Do all buckets cover the same entities (the cross product of buckets and entities)?"""
        return len({scope for _, scope in self.by_window}) <= 1


@dataclass(frozen=True)
class CellCounts:
    """What a recompute found in one bucket: cells compared (fresh or stored), cells changed."""

    cells: int
    changed: int


def rewrites_whole(scope: Scope, counts: CellCounts) -> bool:
    """Is a changed bucket rewritten whole (every entity, one pointer) rather than cell by cell?
    Only for every-entity work, and only when at least half its cells changed: fewer changes
    are cheaper as per-cell pointers, and per-entity work never touches other entities."""
    return scope is None and counts.changed > 0 and 2 * counts.changed >= counts.cells


def changed_cells(
    cells: Cells,
    counts: dict[Window, CellCounts],
    changed_entities: dict[Window, frozenset[str]],
    folded: frozenset[Window] = frozenset(),
    settled_only: bool = False,
) -> Cells:
    """The part of `cells` a recompute writes and flips: buckets rewritten whole (every
    entity), and otherwise exactly the changed entities of each bucket. Unchanged cells are left
    as they are (their stored partial equals the fresh one), except in the every-entity buckets
    of `folded`, which are rewritten whole even unchanged: one bucket pointer then replaces the
    cell pointers corrections left there.

    With `settled_only` (a fold: a change of layout, never of values), only folded buckets
    whose every cell is unchanged are written: a bucket whose stored partials differ from its
    source's (a rollback gave cells back an earlier generation) is left as it is."""
    out: list[tuple[Window, Scope]] = []
    for w, scope in cells:
        c = counts.get(w)
        if settled_only:
            if scope is None and w in folded and c is not None and c.cells and not c.changed:
                out.append((w, None))
            continue
        if scope is None and w in folded and c is not None and c.cells:
            out.append((w, None))
            continue
        if c is None or c.changed == 0:
            continue
        if rewrites_whole(scope, c):
            out.append((w, None))
        elif changed_entities.get(w):
            out.append((w, changed_entities[w]))
    return Cells(tuple(out))


def buckets_to_fold(
    cell_pointers: dict[Window, int], partition_of: Callable[[datetime], Window]
) -> frozenset[Window]:
    """The buckets whose cell pointers folding replaces with one bucket pointer each: every
    bucket carrying a cell pointer (`cell_pointers`: bucket -> cell pointers) in a storage
    partition (`partition_of` a bucket start) whose buckets carry at least
    `FOLD_MIN_POINTERS` in all."""
    per_partition: dict[Window, int] = {}
    for w, n in cell_pointers.items():
        part = partition_of(w.start)
        per_partition[part] = per_partition.get(part, 0) + n
    return frozenset(
        w
        for w, n in cell_pointers.items()
        if n > 0 and per_partition[partition_of(w.start)] >= FOLD_MIN_POINTERS
    )
