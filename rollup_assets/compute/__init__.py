"""Spark transforms: pure functions from DataFrames to DataFrames (no I/O)."""
