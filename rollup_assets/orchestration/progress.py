"""Progress of the runs this process executes itself (`rollups materialize`, `rollups tick`).

Such a run executes in this process and thread (`runner.execute`), so the command's listener is
handed to the rollup assets of its runs through a context variable set around the execution;
a run the daemon or the UI launches executes in a process of its own and reports to no one
(its figures are in its materialization metadata). Nothing is set while nobody listens.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from rollup_assets.model.progress import Progress

_LISTENER: ContextVar[Progress | None] = ContextVar("rollups_run_progress", default=None)


@contextmanager
def listening(progress: Progress | None) -> Iterator[None]:
    """While the block runs, the runs executed in it report to `progress`."""
    token = _LISTENER.set(progress)
    try:
        yield
    finally:
        _LISTENER.reset(token)


def run_progress() -> Progress | None:
    """Who hears of the levels the current run writes (None: nobody)."""
    return _LISTENER.get()
