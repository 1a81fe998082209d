"""Printing rows for people (aligned tables) and programs (CSV, JSON)."""

import csv
import io
import json
import math
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

import pyarrow as pa

from rollup_assets.model.cells import Cells
from rollup_assets.model.jobs import Job
from rollup_assets.model.placement import cells_of
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.states import ArchiveState
from rollup_assets.model.windows import iso_utc

if TYPE_CHECKING:
    from rollup_assets.services.held import HeldWrite
    from rollup_assets.services.lineage import RowLineage


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


def state_row(state: ArchiveState) -> dict:
    return {
        "archive": state.archive,
        "status": state.status.value,
        "watermark": iso_utc(state.watermark) if state.watermark else None,
        "frozen_until": iso_utc(state.frozen_until) if state.frozen_until else None,
        "reason": state.reason,
    }


def _cells_text(cells: Cells) -> str:
    whole = sum(1 for _, scope in cells if scope is None)
    named = sum(len(scope) for _, scope in cells if scope is not None)
    text = f"{named} in {len(cells) - whole} bucket(s)"
    return text + (f" + {whole} bucket(s) for every entity" if whole else "")


def job_row(job: Job, spec: RollupSpec | None = None) -> dict:
    """One job for display; with its rollup's `spec`, a job narrower than its windows x
    entities shows how many cells it covers."""
    spans = [str(w) for w in job.windows]
    return {
        "job_id": job.job_id,
        "trigger": job.trigger.value,
        "state": job.state.value,
        "windows": job.windows_processed if job.windows_processed is not None else len(job.windows),
        "rows": job.rows_processed,
        "range": spans[0]
        if len(spans) == 1
        else (f"{len(spans)} spans from {spans[0]}" if spans else ""),
        "entities": "all" if job.entities is None else ",".join(sorted(job.entities)),
        # The cells it covers when narrower than every window for those entities.
        "cells": None if job.cells is None or spec is None else _cells_text(cells_of(spec, job)),
        "technique": job.technique,
        "source_rows": job.source_rows,
        "cells_changed": job.cells_changed,
        "cells_skipped": job.cells_skipped,
        "cells_applied": job.cells_applied,
        "change_rows": job.change_rows,
        "generation": job.generation,
        "started_at": iso_utc(job.started_at) if job.started_at else None,
        "finished_at": iso_utc(job.finished_at) if job.finished_at else None,
        "duration_ms": job.duration_ms,
        "coalesced_into": job.coalesced_into,
        "error": job.error,
        # Last: the cost model's reasoning is a sentence.
        "plan": job.plan,
    }


def held_row(held: "HeldWrite") -> dict:
    """One held write for display: the source commit, its rows in the held cells, the range."""
    return {
        "source_archive": held.source_archive,
        "source_version": held.source_version,
        "change_source": held.job.change_source.value if held.job.change_source else None,
        "rows": held.rows,
        "from": iso_utc(held.start),
        "to": iso_utc(held.end),
        "buckets": len(held.cells),
        "cells": _cells_text(held.cells),
        "job_id": held.job.job_id,
        "trigger": held.job.trigger.value,
        "detected_at": iso_utc(held.job.created_at),
    }


LINEAGE_COLUMNS = [
    "level",
    "archive",
    "bucket",
    "generation",
    "job_id",
    "trigger",
    "run_id",
    "source_versions",
    "version",
    "committed_at",
    "operation",
    "change_source",
    "rows",
    "file",
    "note",
]


def lineage_rows(root: "RowLineage") -> list[dict]:
    """A row's lineage, depth first: each rollup row (level 0 is the one asked about), and under
    a first-level row the raw commits behind it (JSON adds each commit's recorded metadata)."""
    out: list[dict] = []
    for depth, row in root.walk():
        out.append(
            {
                "level": depth,
                "archive": row.rollup,
                "bucket": str(row.bucket),
                "entity": row.entity,
                "generation": row.generation,
                "job_id": row.job_id,
                "trigger": row.job.trigger.value if row.job else None,
                "run_id": row.run_id,
                "source_versions": ", ".join(f"{k}@{v}" for k, v in row.source_versions.items()),
                "note": row.note,
            }
        )
        for c in row.commits:
            out.append(
                {
                    "level": depth + 1,
                    "archive": c.archive,
                    "version": c.version,
                    "committed_at": iso_utc(c.committed_at) if c.committed_at else None,
                    "operation": c.operation,
                    "change_source": c.metadata.get("rollups.change_source"),
                    "rows": c.rows,
                    "file": c.metadata.get("rollups.file"),
                    "metadata": c.metadata,
                }
            )
    return out
