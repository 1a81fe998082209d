"""The Arrow type of every instant the warehouse stores and returns: microseconds, UTC."""

import pyarrow as pa

TS = pa.timestamp("us", tz="UTC")
