"""Rollups that stay correct: a Dagster code location on PySpark and Delta Lake.

Layers, bottom up: `model` (the domain, pure Python), `compute` (Spark transforms) and
`resources` (Delta I/O and stores), `services` (the use cases), the planners in `sensors`,
`orchestration` (every Dagster import), then `definitions`, `demo` and `cli`. `resources` and
`sensors` live inside this package so that a project installing it keeps its own top-level
`resources` and `sensors` packages.
"""

import os
import platform
import sys

# delta-rs allocates with a jemalloc of its own, which by default keeps the pages a merge or a
# read freed until later allocations happen to purge them: a long-lived process (a code server,
# runs executed in-process, a notebook) would carry a large ingest's memory into every later
# step. Its settings are read once, when deltalake loads, so they are given here, before
# anything imports it; a process that sets `_RJEM_MALLOC_CONF` itself keeps its own.
os.environ.setdefault(
    "_RJEM_MALLOC_CONF", "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0"
)

# Arrow's pool is chosen once, when pyarrow loads. Its wheels default to mimalloc, which kept
# pages freed even after `release_unused` (`resources/memory.py`): replaying the benchmark's
# waves of corrections and its fold in one process, what the process held between steps grew
# by up to 270 MiB more than with jemalloc, and the largest steps' peaks were 340 MiB to
# 470 MiB higher, at the same speed (docs/performance.md, "Memory between steps"). Only where
# pyarrow's wheels are built with jemalloc (Linux on x86-64; its ARM wheels are not, and Arrow
# would warn in every process and keep mimalloc). A process that imported pyarrow first, or
# sets `ARROW_DEFAULT_MEMORY_POOL` itself, keeps its own.
if sys.platform == "linux" and platform.machine() == "x86_64":
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
