"""Rollups that stay correct: a Dagster code location on PySpark and Delta Lake."""

import os

# A range run (a backfill of N partitions) then records one "planned" event per asset instead of
# N; with SQLite event storage that saves ~6 ms per partition. Set it for the daemon and the
# webserver too (the Makefile does), since they create the runs the sensors and the UI request.
os.environ.setdefault("DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS", "1")
