"""The tests' oracle: the pandas aggregation of `rollup_assets.services.verify`, which shares
no code with the Spark aggregation or the bucket arithmetic it checks."""

from rollup_assets.services.verify import bucket_starts, compare, compare_all, oracle, raw_frame

__all__ = ["bucket_starts", "compare", "compare_all", "oracle", "raw_frame"]
