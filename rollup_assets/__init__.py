"""Rollups that stay correct: a Dagster code location on PySpark and Delta Lake.

Layers, bottom up: `model` (the domain, pure Python), `compute` (Spark transforms) and the
top-level `resources` package (Delta I/O and stores), `services` (the use cases), the planners in
`sensors`, `orchestration` (every Dagster import), then `definitions`, `demo` and `cli`.
"""
