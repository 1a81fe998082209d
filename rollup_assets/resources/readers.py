"""The threads that read files side by side: a rollup's, a surface's, a raw commit's change
files. Shared, so that a read starts none; reading and decoding Parquet release the GIL."""

import os
from concurrent.futures import ThreadPoolExecutor

READERS = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="read")
