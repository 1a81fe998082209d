"""Handing the native memory a large step freed back to the operating system.

Arrow's pool and glibc's malloc keep the pages a freed table held, for their next allocation
(the package picks jemalloc for Arrow on Linux x86-64, which hands them back within a second
or two on its own; mimalloc, pyarrow's default elsewhere, only when asked): a process that
lives on after a large step (a code server's sensors, runs executed in-process, a notebook
ingesting file after file) would otherwise keep the high-water mark of its largest step for
good, and the next step would start from it. Each step that moves many rows (an ingest, a
recompute or forward run, a surface publish, maintenance) ends with `release_unused`, which
costs milliseconds.

A correction makes and drops Python objects by the hundred thousand (its cells and windows, its
ledger records, Dagster's events for thousands of partitions) in a process that already holds
millions (the code location's definitions, Dagster's, Spark's gateway): Python's cyclic
collector, run every 700 net allocations, walked them again and again. While a rollup's run or
a sensor's evaluation runs (`collecting_less`) it runs every `STEP_GC_THRESHOLDS[0]`
allocations instead; objects are freed as before, by their counts, and the cycles among them a
little later. Ingests and publishes keep Python's thresholds: measured side by side, they gained
nothing from it.
"""

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import threading
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

import pyarrow as pa

P = ParamSpec("P")
R = TypeVar("R")


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None where the C library has none (macOS, musl)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None


def release_unused() -> None:
    """Return the pages Arrow's pool and the C allocator hold free to the operating system."""
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


# The cyclic collector's thresholds while a run or a sensor's evaluation runs (`gc.set_threshold`:
# Python's are 700, 10, 10). A correction of 10,000 readings ran its sensors and runs in about
# 0.9 of the time.
STEP_GC_THRESHOLDS = (50_000, 20, 20)
_steps_lock = threading.Lock()
_steps_running = 0
_thresholds_before: tuple[int, ...] = ()


@contextlib.contextmanager
def collecting_less() -> Iterator[None]:
    """While the block runs, the cyclic collector runs at `STEP_GC_THRESHOLDS` (or the
    process's own, where higher). Blocks may nest and run on several threads: the first to
    enter sets them, the last to leave puts back what the process had."""
    global _steps_running, _thresholds_before
    with _steps_lock:
        if _steps_running == 0:
            _thresholds_before = gc.get_threshold()
            gc.set_threshold(
                *(max(a, b) for a, b in zip(_thresholds_before, STEP_GC_THRESHOLDS, strict=True))
            )
        _steps_running += 1
    try:
        yield
    finally:
        with _steps_lock:
            _steps_running -= 1
            if _steps_running == 0:
                gc.set_threshold(*_thresholds_before)


def returning_memory(step: Callable[P, R]) -> Callable[P, R]:
    """`step`, followed (whether it returns or raises) by `release_unused`."""

    @functools.wraps(step)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return step(*args, **kwargs)
        finally:
            release_unused()

    return run
