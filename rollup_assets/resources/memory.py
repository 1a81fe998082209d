"""Handing the native memory a large step freed back to the operating system.

Arrow's pool and glibc's malloc keep the pages a freed table held, for their next allocation
(the package picks jemalloc for Arrow on Linux x86-64, which hands them back within a second
or two on its own; mimalloc, pyarrow's default elsewhere, only when asked): a process that
lives on after a large step (a code server's sensors, runs executed in-process, a notebook
ingesting file after file) would otherwise keep the high-water mark of its largest step for
good, and the next step would start from it. Each step that moves many rows (an ingest, a
recompute or forward run, a surface publish, maintenance) ends with `release_unused`, which
costs milliseconds.
"""

import ctypes
import ctypes.util
import functools
from collections.abc import Callable
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


def returning_memory(step: Callable[P, R]) -> Callable[P, R]:
    """`step`, followed (whether it returns or raises) by `release_unused`."""

    @functools.wraps(step)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return step(*args, **kwargs)
        finally:
            release_unused()

    return run
