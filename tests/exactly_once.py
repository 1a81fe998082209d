"""Checks shared by the crash and restart tests: old-or-new windows, exactly-once work, no
duplicated rows, and no file on disk that the Delta log does not reference (vacuum-safe).

Each check returns a list of problems (empty: the invariant holds), so a test can print figures
and assert once.
"""

import os
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from rollup_assets.model.jobs import Job, JobState, Trigger
from rollup_assets.model.placement import buckets_in
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import Window
from rollup_assets.resources.delta_tables import open_table
from rollup_assets.resources.genmap import read_pointers
from rollup_assets.resources.visible_rows import visible_mask
from rollup_assets.services.engine import Engine
from rollup_assets.services.maintenance import table_uris
from tests.oracle import oracle

KEYS = ["entity_id", "bucket_start"]


def _matches(actual: pd.DataFrame, expected: pd.DataFrame, spec: RollupSpec) -> pd.Series:
    """Per bucket_start of either frame: do the frames agree on every row of that window?"""
    m = actual.merge(expected, on=KEYS, how="outer", suffixes=("__a", "__e"), indicator=True)
    ok = (m["_merge"] == "both").to_numpy()
    for name in spec.output_names:
        a = pd.to_numeric(m[f"{name}__a"], errors="coerce").astype(float).to_numpy()
        e = pd.to_numeric(m[f"{name}__e"], errors="coerce").astype(float).to_numpy()
        both_null = np.isnan(a) & np.isnan(e)
        ok &= both_null | np.isclose(a, e, rtol=1e-9, atol=1e-9)
    return pd.Series(ok, index=m["bucket_start"]).groupby(level=0).all()


def _frame(table: pa.Table) -> pd.DataFrame:
    df = table.to_pandas()
    df["bucket_start"] = pd.to_datetime(df["bucket_start"], utc=True)
    return df.drop(columns=[c for c in ("bucket_end",) if c in df.columns])


def old_or_new(query, catalog, old_raw: pd.DataFrame, new_raw: pd.DataFrame) -> tuple[list, dict]:
    """Every window of every rollup equals, entirely, the oracle of `old_raw` or of `new_raw`.

    Returns (problems, {rollup: (windows at old values only, at new values only, windows seen)}).
    """
    problems, figures = [], {}
    for spec in catalog.rollups.values():
        actual = _frame(query(spec.name))
        old, new = oracle(old_raw, spec), oracle(new_raw, spec)
        is_old = _matches(actual, old, spec)
        is_new = _matches(actual, new, spec)
        both = pd.concat([is_old.rename("old"), is_new.rename("new")], axis=1).fillna(False)
        bad = both.index[~(both["old"] | both["new"])]
        if len(bad):
            problems.append(
                f"{spec.name}: {len(bad)} window(s) at neither the old nor the new values, "
                f"e.g. {list(bad[:3])}"
            )
        figures[spec.name] = (
            int((both["old"] & ~both["new"]).sum()),
            int((both["new"] & ~both["old"]).sum()),
            len(both),
        )
    return problems, figures


def changed_windows(spec: RollupSpec, old_raw: pd.DataFrame, new_raw: pd.DataFrame) -> set:
    """Bucket starts (UTC pandas Timestamps) whose oracle values differ between old and new."""
    old, new = oracle(old_raw, spec), oracle(new_raw, spec)
    same = _matches(old, new, spec)
    return set(same.index[~same])


def duplicated_rows(engine: Engine) -> list[str]:
    """The resolved (active-generation) read holds at most one row per (entity, bucket)."""
    problems = []
    for spec in engine.catalog.rollups.values():
        rows = engine.rollups.read_arrow(spec)
        keys = Counter(
            zip(rows["entity_id"].to_pylist(), rows["bucket_start"].to_pylist(), strict=True)
        )
        dups = [k for k, n in keys.items() if n > 1]
        if dups:
            problems.append(
                f"{spec.name}: {len(dups)} duplicated (entity, bucket), e.g. {dups[:2]}"
            )
    return problems


def stored_rows(engine: Engine, spec: RollupSpec) -> pa.Table:
    """Every row of the rollup table (all generations), straight from the Delta snapshot."""
    table = open_table(engine.rollups.uri(spec), engine.warehouse.storage_options)
    if table is None:
        return pa.table({"generation": pa.array([], pa.int64())})
    return pa.table(table.to_pyarrow_table())


def inactive_rows(
    engine: Engine, spec: RollupSpec, windows: Iterable[datetime] | None = None
) -> int:
    """Stored rows no reader sees (superseded or orphaned: neither a cell's base nor one of its
    visible difference rows), optionally only in the windows starting at `windows`."""
    rows = stored_rows(engine, spec)
    if rows.num_rows == 0:
        return 0
    if windows is not None:
        starts = pa.array(
            sorted(pd.Timestamp(w).to_pydatetime() for w in windows), rows["bucket_start"].type
        )
        rows = rows.filter(pc.is_in(rows["bucket_start"], value_set=starts))
    pointers, _ = read_pointers(engine.rollups.genmap_uri(spec), engine.warehouse.storage_options)
    return rows.num_rows - pc.sum(visible_mask(rows, pointers)).as_py() if rows.num_rows else 0


def dangling_pointers(engine: Engine, spec: RollupSpec, raw: pd.DataFrame) -> list[str]:
    """Pointers naming a generation that has no row for a cell the raw data gives a value (a cell
    readers cannot see although they should): an entity pointer's own cell, every cell of a
    bucket pointer's bucket. A cell whose source rows are all gone may rightly have none."""
    pointers, _ = read_pointers(engine.rollups.genmap_uri(spec), engine.warehouse.storage_options)
    if not pointers.num_rows:
        return []
    expected = oracle(raw, spec)
    cells = {
        (pd.Timestamp(b).to_pydatetime(), e)
        for b, e in zip(expected["bucket_start"], expected["entity_id"], strict=True)
    }
    rows = stored_rows(engine, spec)
    have = set(
        zip(
            rows["bucket_start"].to_pylist(),
            rows["entity_id"].to_pylist(),
            rows["generation"].to_pylist(),
            strict=True,
        )
    )
    newest: dict[tuple, int] = {}
    for p in pointers.to_pylist():
        key = (p["bucket_start"], p["entity_id"])
        newest[key] = max(newest.get(key, 0), p["generation"])
    problems = []
    for b, e in sorted(cells):
        g = max(newest.get((b, e), 0), newest.get((b, None), 0))
        if g and (b, e, g) not in have:
            problems.append(f"{spec.name}: cell {e} at {b} points at generation {g}: no rows")
    return problems


def generation_rows(engine: Engine, spec: RollupSpec, generation: int) -> int:
    rows = stored_rows(engine, spec)
    return int(pc.sum(pc.equal(rows["generation"], generation).cast(pa.int64())).as_py() or 0)


def unreferenced_files(engine: Engine) -> list[str]:
    """Data files on disk that the current Delta snapshot of their table does not reference.

    Every file below the table root counts (also under `_`/`.` folders, which vacuum skips), except
    the `_delta_log`. Empty list: the warehouse holds exactly what the logs say (vacuum-safe).
    """
    problems = []
    for uri in table_uris(engine.warehouse, engine.catalog):
        root = Path(uri.removeprefix("file://"))
        table = open_table(uri, engine.warehouse.storage_options)
        if table is None:
            continue
        referenced = {os.path.normpath(root / p) for p in _paths(table)}
        on_disk = {
            os.path.normpath(Path(d) / f)
            for d, dirs, files in os.walk(root)
            if "_delta_log" not in Path(d).relative_to(root).parts
            for f in files
        }
        stray = sorted(on_disk - referenced)
        missing = sorted(referenced - on_disk)
        if stray:
            problems.append(f"{root.name}: {len(stray)} unreferenced file(s), e.g. {stray[:2]}")
        if missing:
            problems.append(
                f"{root.name}: {len(missing)} referenced file(s) missing: {missing[:2]}"
            )
    return problems


def _paths(table) -> list[str]:
    from urllib.parse import unquote

    return [unquote(p) for p in pa.table(table.get_add_actions(flatten=True))["path"].to_pylist()]


def completed_work(
    engine: Engine,
    since: datetime,
    triggers: tuple[Trigger, ...] = (Trigger.PERIODIC, Trigger.CHAIN),
) -> dict[str, Counter]:
    """Per rollup: how many Completed jobs (created at/after `since`, with work done) covered
    each bucket, per entity scope; a correction's per source commit it applied (two
    corrections of one bucket, of different commits, each apply their own change once)."""
    out: dict[str, Counter] = {}
    for name, spec in engine.catalog.rollups.items():
        counts: Counter = Counter()
        for job in engine.ledger.history(name, limit=10_000):
            if (
                job.created_at >= since
                and job.trigger in triggers
                and job.state is JobState.COMPLETED
                and job.windows_processed
            ):
                commits = sorted({c for p in job.parts for c in p.commits}) if job.parts else [None]
                for w in buckets_in(spec, list(job.windows)):
                    for commit in commits:
                        counts[(pd.Timestamp(w.start), job.entities, commit)] += 1
        out[name] = counts
    return out


def exactly_once(
    engine: Engine, since: datetime, expected: dict[str, set], watermarks: dict[str, datetime]
) -> tuple[list[str], int]:
    """Every changed closed window was recomputed by exactly one Completed job per entity scope
    (and source commit, for corrections); none was lost. `expected`: rollup -> changed bucket
    starts (open buckets are skipped: the forward lane owns them). Returns (problems, windows
    verified)."""
    problems, verified = [], 0
    work = completed_work(engine, since)
    for name, spec in engine.catalog.rollups.items():
        counts = work[name]
        twice = {k: n for k, n in counts.items() if n > 1}
        if twice:
            problems.append(
                f"{name}: window(s) recomputed more than once: {list(twice.items())[:3]}"
            )
        done = {start for start, _, _ in counts}
        mark = watermarks.get(name)
        closed = {
            s
            for s in expected.get(name, set())
            if mark is not None and _bucket_end(engine, spec, s) <= mark
        }
        lost = closed - done
        if lost:
            problems.append(f"{name}: changed window(s) never recomputed: {sorted(lost)[:3]}")
        verified += len(closed & done)
    return problems, verified


def _bucket_end(engine: Engine, spec: RollupSpec, start: pd.Timestamp) -> datetime:
    s = start.to_pydatetime()
    return buckets_in(spec, [Window(s, s + pd.Timedelta(microseconds=1))])[0].end


def jobs_since(engine: Engine, since: datetime) -> list[Job]:
    return [
        j
        for name in engine.catalog.rollups
        for j in engine.ledger.history(name, limit=10_000)
        if j.created_at >= since
    ]
