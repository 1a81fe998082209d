"""An ingesting process for the concurrent-writers test: upsert batches into the raw table on cue.

Run as `python -m tests.integration.ingest_loop DIR` with ROLLUPS_WAREHOUSE set. For each wave k
the test writes `DIR/go-<k>` holding a JSON list of batch files; this process ingests them at
once, one thread per file (so the MERGE commits race each other, and whatever commit the test
process is making at that moment), then writes `DIR/done-<k>`: the committed versions and the
errors a user would have seen. It exits when `DIR/stop` appears.
"""

import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.engine import Engine
from rollup_assets.settings import Settings


def ingest_wave(engine: Engine, files: list[str]) -> dict:
    spec = engine.catalog.archive("energy_raw")
    versions: list[int] = []
    errors: list[str] = []
    start = threading.Barrier(len(files))

    def one(path: str) -> None:
        start.wait()
        try:
            versions.append(engine.raw.ingest(spec, path, ChangeSource.MANUAL).version)
        except Exception as exc:
            errors.append(f"{Path(path).name}: {type(exc).__name__}: {exc}".splitlines()[0])
            traceback.print_exc()

    threads = [threading.Thread(target=one, args=(f,)) for f in files]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"versions": sorted(versions), "errors": errors}


def main(directory: str) -> None:
    d = Path(directory)
    settings = Settings.from_env()  # this process's edge
    engine = Engine(load_catalog(settings.specs), Warehouse(settings.warehouse))
    (d / "ready").touch()
    wave = 0
    while not (d / "stop").exists():
        go = d / f"go-{wave}"
        if not go.exists():
            time.sleep(0.005)
            continue
        result = ingest_wave(engine, json.loads(go.read_text()))
        tmp = d / f"done-{wave}.tmp"
        tmp.write_text(json.dumps(result))
        os.replace(tmp, d / f"done-{wave}")
        wave += 1


if __name__ == "__main__":
    main(sys.argv[1])
