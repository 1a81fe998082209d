"""Kept so the import path `rollup_assets.query` keeps working: the code lives in
`rollup_assets.services.query`."""

from rollup_assets.services.query import query_arrow, query_spark

__all__ = ["query_arrow", "query_spark"]
