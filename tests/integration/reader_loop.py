"""A reader process for the reader-consistency test: query rollups in a loop, classify each window.

Run as `python -m tests.integration.reader_loop DIR` with ROLLUPS_WAREHOUSE set. `DIR/expect.json`
names, per rollup, a query range and for every window in it the rows of the two admissible value
sets A and B (entity -> logical values). Each iteration queries every rollup once through
`query_arrow` (the Spark-free read path) and records, per window, which set it matched: `A`, `B`,
`=` (A and B are equal and it matched), or `X` (neither: a mixed, partial, missing or extra
window; a violation). Output, in DIR:
  progress        iterations completed (rewritten atomically after each one)
  reads.jsonl     one line per query: iteration, rollup, start/end time (epoch s), window codes
  result.json     totals and the first violations, written when DIR/stop appears
"""

import json
import math
import os
import sys
import time
import traceback
from datetime import datetime
from pathlib import Path

import pyarrow as pa

from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.engine import Engine
from rollup_assets.services.query import query_arrow
from rollup_assets.settings import Settings

Rows = dict[str, list]  # entity -> logical values
PAUSE_S = 0.01


def same_value(a: object, b: object) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        x, y = float(a), float(b)  # type: ignore[arg-type]
        if math.isnan(x) or math.isnan(y):
            return math.isnan(x) and math.isnan(y)
        return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9)
    return a == b


def same_rows(actual: Rows, expected: Rows) -> bool:
    if actual.keys() != expected.keys():
        return False
    return all(
        len(actual[e]) == len(expected[e])
        and all(same_value(a, b) for a, b in zip(actual[e], expected[e], strict=True))
        for e in expected
    )


DUPLICATED = "__duplicated__"  # marks a window where one entity came back more than once


def windows_of(table: pa.Table, columns: list[str]) -> dict[str, Rows]:
    """bucket_start (ISO, UTC) -> entity -> values of `columns`. A window in which an entity has
    two rows (e.g. an unflipped generation leaking into the read) gets the DUPLICATED entry, so it
    can match neither value set."""
    out: dict[str, Rows] = {}
    for row in table.to_pylist():
        window = out.setdefault(row["bucket_start"].isoformat(), {})
        if row["entity_id"] in window:
            window.setdefault(DUPLICATED, []).append(row["entity_id"])
        window[row["entity_id"]] = [row[c] for c in columns]
    return out


def classify(actual: dict[str, Rows], spec: dict) -> tuple[str, list[dict]]:
    """One code per expected window (in sorted order), plus details of the violations."""
    codes = []
    problems = []
    for w in sorted(spec["windows"]):
        sets = spec["windows"][w]
        got = actual.get(w, {})
        a, b = same_rows(got, sets["A"]), same_rows(got, sets["B"])
        if a and b:
            codes.append("=")
        elif a or b:
            codes.append("A" if a else "B")
        else:
            codes.append("X")
            problems.append({"window": w, "got": got, "A": sets["A"], "B": sets["B"]})
    for w in sorted(set(actual) - set(spec["windows"])):
        codes.append("X")
        problems.append({"window": w, "got": actual[w], "unexpected": True})
    return "".join(codes), problems


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(directory: str) -> None:
    d = Path(directory)
    expect = json.loads((d / "expect.json").read_text())
    settings = Settings.from_env()  # this process's edge
    engine = Engine(load_catalog(settings.specs), Warehouse(settings.warehouse))
    iterations = queries = 0
    violations: list[dict] = []
    violating_reads = 0
    errors: list[str] = []
    with open(d / "reads.jsonl", "w") as log:
        write_atomic(d / "progress", "0")
        while not (d / "stop").exists():
            for rollup, spec in expect.items():
                t0 = time.time()
                try:
                    table = query_arrow(
                        engine,
                        rollup,
                        datetime.fromisoformat(spec["start"]),
                        datetime.fromisoformat(spec["end"]),
                    )
                    codes, problems = classify(windows_of(table, spec["columns"]), spec)
                except Exception:
                    codes, problems = "E", [{"error": traceback.format_exc(limit=3)}]
                    errors.append(problems[0]["error"])
                t1 = time.time()
                queries += 1
                if problems:
                    violating_reads += 1
                    violations += [
                        {"iteration": iterations + 1, "rollup": rollup, **p} for p in problems
                    ][: max(0, 20 - len(violations))]
                log.write(
                    json.dumps({"i": iterations + 1, "r": rollup, "t0": t0, "t1": t1, "c": codes})
                    + "\n"
                )
            log.flush()
            iterations += 1
            write_atomic(d / "progress", str(iterations))
            time.sleep(PAUSE_S)  # leave the writer's Spark some CPU on a 2-core machine
    result = {
        "iterations": iterations,
        "reads": queries,
        "violating_reads": violating_reads,
        "violations": violations,
        "errors": errors[:5],
    }
    write_atomic(d / "result.json", json.dumps(result, default=str))


if __name__ == "__main__":
    main(sys.argv[1])
