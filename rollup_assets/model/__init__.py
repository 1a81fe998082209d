"""The domain: specs and their rules, windows and bucketing, jobs and the ledger fold, archive
states, placement, propagation and the forward lane's rules. Plain Python: no Dagster, Spark,
Delta or Arrow."""
