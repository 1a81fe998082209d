"""Rollups that stay correct: a Dagster code location on PySpark and Delta Lake.

Layers, bottom up: `model` (the domain, pure Python), `compute` (Spark transforms) and
`resources` (Delta I/O and stores), `services` (the use cases), the planners in `sensors`,
`orchestration` (every Dagster import), then `definitions`, `demo` and `cli`. `resources` and
`sensors` live inside this package so that a project installing it keeps its own top-level
`resources` and `sensors` packages.
"""
