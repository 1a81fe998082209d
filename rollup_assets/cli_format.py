"""Printing rows for people (aligned tables) and programs (CSV, JSON)."""

import csv
import io
import json
import math
from collections.abc import Sequence
from datetime import datetime

import pyarrow as pa

from rollup_assets.partitions import iso_utc


def _cell(v: object) -> object:
    if isinstance(v, datetime):
        return iso_utc(v)
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def rows_of(table: pa.Table) -> list[dict]:
    return [{k: _cell(v) for k, v in row.items()} for row in table.to_pylist()]


def _text(v: object) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}" if abs(v) < 1e6 else f"{v:.1f}"
    return str(v)


def render_table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
    if not rows:
        return "(no rows)"
    cols = list(columns or _all_keys(rows))
    cells = [[_text(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    numeric = [
        all(isinstance(r.get(c), int | float) or r.get(c) is None for r in rows) for c in cols
    ]
    line = "  ".join(
        c.rjust(w) if n else c.ljust(w) for c, w, n in zip(cols, widths, numeric, strict=True)
    )
    out = [line, "  ".join("-" * w for w in widths)]
    for row in cells:
        out.append(
            "  ".join(
                v.rjust(w) if n else v.ljust(w)
                for v, w, n in zip(row, widths, numeric, strict=True)
            )
        )
    return "\n".join(out)


def _all_keys(rows: Sequence[dict]) -> list[str]:
    keys: dict[str, None] = {}
    for r in rows:
        keys.update(dict.fromkeys(r))
    return list(keys)


def render(rows: Sequence[dict], fmt: str, columns: Sequence[str] | None = None) -> str:
    if fmt == "json":
        return json.dumps(list(rows), indent=2, default=str)
    if fmt == "csv":
        buf = io.StringIO()
        cols = list(columns or _all_keys(rows))
        writer = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n", extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
        return buf.getvalue().rstrip("\n")
    return render_table(rows, columns)
