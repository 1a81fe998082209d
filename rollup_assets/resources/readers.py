"""The threads that read files side by side: a rollup's, a surface's, a raw commit's change
files. Shared, so that a read starts none; reading and decoding Parquet release the GIL."""

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

WORKERS = min(8, os.cpu_count() or 1)
READERS = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="read")


def read_ahead(read: Callable[[T], R], items: Iterable[T], ahead: int = WORKERS) -> Iterator[R]:
    """`read` of each of `items`, in order, on the reader threads, with at most `ahead` reads
    started beyond the one the caller takes next: a caller that keeps a little of each result
    (a filter) holds a few files at a time, not all of them, as `READERS.map` would. Reads not
    started when the caller stops (or a read fails) are cancelled."""
    pending: deque[Future[R]] = deque()
    todo = iter(items)
    try:
        for item in todo:
            pending.append(READERS.submit(read, item))
            if len(pending) > ahead:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()
