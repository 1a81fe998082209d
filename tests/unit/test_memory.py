"""Steps that move many rows hand the native memory they freed back to the operating system."""

import gc
import json
import os
import platform
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from rollup_assets.model.errors import IngestValidationError
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.resources import memory
from rollup_assets.resources.batch_sources import TableSource
from rollup_assets.resources.raw_store import RawStore
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.forward import run_forward
from rollup_assets.services.maintenance import maintain
from rollup_assets.services.recompute import run_recompute
from rollup_assets.services.surface import publish
from rollup_assets.settings import DEFAULT_SPECS

ENERGY = load_catalog(DEFAULT_SPECS).raw["energy_raw"]
# Where the package picks jemalloc for Arrow (pyarrow's wheels with it).
JEMALLOC = sys.platform == "linux" and platform.machine() == "x86_64"

# Arrow tables of 400 MiB built on a thread pool (as the readers build them), then dropped: the
# process's resident memory with them, and after `release_unused`, for up to three seconds (the
# package's jemalloc hands freed pages back within a second or two on its own; mimalloc, the
# pool of a process that loaded pyarrow first, when `release_unused` asks).
PROBE = """
import rollup_assets
import gc, json, time, numpy as np, psutil, pyarrow as pa, pyarrow.compute as pc
from concurrent.futures import ThreadPoolExecutor
from rollup_assets.resources.memory import release_unused
rss = lambda: psutil.Process().memory_info().rss / 2**20
before = rss()
with ThreadPoolExecutor(4) as pool:
    tables = list(pool.map(lambda i: pc.multiply(pa.array(np.arange(5_000_000.0)), 2.0), range(10)))
held = rss()
del tables
gc.collect()
release_unused()
released = [rss()]
while released[-1] - before >= 120 and len(released) < 30:
    time.sleep(0.1)
    released.append(rss())
print(json.dumps({"before": before, "held": held, "released": released[-1]}))
"""


@pytest.mark.parametrize("pool", ["jemalloc", "mimalloc"] if JEMALLOC else ["mimalloc"])
def test_release_unused_returns_the_pages_freed_tables_held(pool: str) -> None:
    env = {**os.environ, "ARROW_DEFAULT_MEMORY_POOL": pool}
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env=env,
    )
    rss = json.loads(out.stdout)
    assert rss["held"] - rss["before"] > 300, rss  # the tables were resident
    # Freed, the pages may stay with the allocators for reuse; released, they leave the process.
    assert rss["released"] - rss["before"] < 120, rss


def test_an_ingest_releases_memory_when_it_succeeds_and_when_it_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(memory, "release_unused", lambda: calls.append("released"))
    store = RawStore(Warehouse(str(tmp_path / "warehouse")))
    store.ensure_table(ENERGY)
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    rows = pa.table(
        {
            "entity_id": ["m1", "m2"],
            "ts": pa.array([t0, t0 + timedelta(hours=1)], pa.timestamp("us", tz="UTC")),
            "energy_kwh": [1.0, 2.0],
            "power_kw": [1.0, 1.0],
            "voltage_v": [230.0, 230.0],
        }
    )
    result = store.ingest(ENERGY, TableSource(ENERGY.name, rows), ChangeSource.MANUAL)
    assert result.inserted == 2
    assert calls == ["released"]
    bad = rows.set_column(0, "entity_id", pa.array([None, "m2"], pa.string()))
    with pytest.raises(IngestValidationError):
        store.ingest(ENERGY, TableSource(ENERGY.name, bad), ChangeSource.MANUAL)
    assert calls == ["released", "released"]


def test_every_step_that_moves_many_rows_releases_memory_after_it() -> None:
    for step in (RawStore.ingest, run_recompute, run_forward, publish, maintain):
        assert step.__code__ is memory.returning_memory(len).__code__, step.__qualname__


def test_a_step_runs_with_the_step_thresholds_and_the_process_gets_its_own_back() -> None:
    before = gc.get_threshold()
    seen: list[tuple[int, ...]] = []

    @memory.collecting_less()
    def step() -> None:
        seen.append(gc.get_threshold())
        with memory.collecting_less():  # nested: a run's chain calls steps inside its step
            seen.append(gc.get_threshold())
        seen.append(gc.get_threshold())

    step()
    wanted = tuple(max(a, b) for a, b in zip(before, memory.STEP_GC_THRESHOLDS, strict=True))
    assert seen == [wanted] * 3
    assert gc.get_threshold() == before
    with pytest.raises(ZeroDivisionError), memory.collecting_less():
        raise ZeroDivisionError
    assert gc.get_threshold() == before


def test_steps_on_several_threads_put_the_thresholds_back_when_the_last_one_ends() -> None:
    before = gc.get_threshold()
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    inside: list[tuple[int, ...]] = []

    def first() -> None:
        with memory.collecting_less():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    def second() -> None:
        first_in.wait(5)
        with memory.collecting_less():
            second_in.set()
            first_out.wait(5)
            inside.append(gc.get_threshold())  # the first left: still the step's

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert inside and inside[0][0] >= memory.STEP_GC_THRESHOLDS[0]
    assert gc.get_threshold() == before


def test_a_process_with_higher_thresholds_keeps_them_during_a_step() -> None:
    before = gc.get_threshold()
    gc.set_threshold(10 * memory.STEP_GC_THRESHOLDS[0], 5, 100)
    try:
        with memory.collecting_less():
            assert gc.get_threshold() == (
                10 * memory.STEP_GC_THRESHOLDS[0],
                memory.STEP_GC_THRESHOLDS[1],
                100,
            )
        assert gc.get_threshold() == (10 * memory.STEP_GC_THRESHOLDS[0], 5, 100)
    finally:
        gc.set_threshold(*before)


POOL = "import rollup_assets, pyarrow as pa; print(pa.default_memory_pool().backend_name)"


@pytest.mark.skipif(not JEMALLOC, reason="the package picks jemalloc on Linux x86-64 only")
def test_arrow_allocates_with_jemalloc_unless_the_process_chose_a_pool() -> None:
    def pool(env: dict[str, str]) -> str:
        out = subprocess.run(
            [sys.executable, "-c", POOL], capture_output=True, text=True, check=True, env=env
        )
        return out.stdout.strip()

    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    assert pool(env) == "jemalloc"
    assert pool({**env, "ARROW_DEFAULT_MEMORY_POOL": "system"}) == "system"
    # This process too: tests/__init__.py imports the package before the fixtures load pyarrow.
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL") == "jemalloc":
        assert pa.default_memory_pool().backend_name == "jemalloc"


# The package imported where pyarrow's wheels have no jemalloc (Linux on ARM): it names no pool.
ON_ARM = (
    "import platform, sys; platform.machine = lambda: 'aarch64'; sys.platform = 'linux'; "
    "import os, rollup_assets; print(os.environ.get('ARROW_DEFAULT_MEMORY_POOL'))"
)


def test_the_package_names_no_pool_where_pyarrow_has_no_jemalloc() -> None:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    out = subprocess.run(
        [sys.executable, "-c", ON_ARM], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == "None"
