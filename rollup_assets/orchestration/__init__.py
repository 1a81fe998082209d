"""Every Dagster import of the code location: partitions, assets, checks, jobs, run tags,
resources, instance, run lookup, the in-process runner and the Dagster internals."""
