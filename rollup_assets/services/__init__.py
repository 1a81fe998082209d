"""The use cases (ingest, forward, recompute, chain, operations, health, query, check, verify,
maintenance), over the stores of one `Engine`. No Dagster."""
