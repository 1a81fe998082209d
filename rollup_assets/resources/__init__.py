"""Adapters: Delta I/O (files, commits, pruning, change feed, caches), the stores (raw, rollup,
pointers, archive states, ledger), Spark sessions and warehouse paths. No Dagster."""
