"""A fill's per-partition file pruning, indexed by day, keeps the files `prune_files` keeps."""

import datetime as dt
import random

from rollup_assets.model.windows import Window
from rollup_assets.resources.delta_tables import prune_files, span_pruner

T0 = dt.datetime(2024, 12, 20, tzinfo=dt.UTC)


def _file(rng: random.Random, i: int) -> dict:
    """A file's log entry: statistics over a few hours to a few days (or over years, or none),
    a UTC-day partition or none, an entity range."""
    lo = T0 + dt.timedelta(minutes=rng.randrange(0, 60 * 24 * 40))
    f: dict = {"path": f"f{i}", "min.entity_id": "m1", "max.entity_id": rng.choice(["m1", "m5"])}
    kind = rng.random()
    if kind < 0.15:  # no statistics: only its day partition bounds it
        f["partition.day"] = lo.date()
        return f
    if kind < 0.2:  # nothing bounds it
        return f
    length = dt.timedelta(days=800) if kind < 0.25 else dt.timedelta(hours=rng.randrange(0, 80))
    f["min.ts"], f["max.ts"] = lo, lo + length
    if rng.random() < 0.5:
        f["partition.day"] = lo.date()
    return f


def _span(rng: random.Random) -> Window:
    start = T0 + dt.timedelta(minutes=rng.randrange(-48 * 60, 24 * 42 * 60))
    if rng.random() < 0.05:
        return Window(start, start + dt.timedelta(days=500))
    return Window(start, start + dt.timedelta(hours=rng.choice([0.25, 1, 3, 24, 24 * 7, 24 * 31])))


def test_span_pruner_keeps_the_files_prune_files_keeps() -> None:
    rng = random.Random(20261130)
    for case in range(200):
        files = [_file(rng, i) for i in range(rng.randrange(0, 60))]
        entities = rng.choice([None, frozenset({"m3"}), frozenset({"m0"})])
        day_column = rng.choice([None, "day"])
        pruned = span_pruner(files, time_column="ts", entities=entities, day_column=day_column)
        for _ in range(10):
            span = _span(rng)
            expected = prune_files(
                files, time_column="ts", spans=[span], entities=entities, day_column=day_column
            )
            assert pruned(span) == expected, (case, span)


def _may_hold(f: dict, spans: list[Window], day_column: str | None) -> bool:
    """The rule itself, span by span: a file's day and its statistics each overlap a span."""
    day = f.get(f"partition.{day_column}") if day_column else None
    if day is not None:
        d0 = dt.datetime.combine(day, dt.time(0), tzinfo=dt.UTC)
        d1 = d0 + dt.timedelta(days=1)
        if not any(w.start < d1 and d0 < w.end for w in spans):
            return False
    lo, hi = f.get("min.ts"), f.get("max.ts")
    return lo is None or hi is None or any(lo < w.end and hi >= w.start for w in spans)


def test_prune_files_over_many_spans_keeps_what_some_span_reaches() -> None:
    # Many spans, overlapping and touching, as a fold's or a wave's buckets are: the merged
    # spans are searched, not walked, and keep the same files as the rule span by span.
    rng = random.Random(20261203)
    for case in range(150):
        files = [_file(rng, i) for i in range(rng.randrange(0, 60))]
        spans = [_span(rng) for _ in range(rng.randrange(1, 40))]
        day_column = rng.choice([None, "day"])
        kept = prune_files(
            files, time_column="ts", spans=spans, entities=None, day_column=day_column
        )
        assert kept == [f for f in files if _may_hold(f, spans, day_column)], case
