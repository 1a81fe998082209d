"""How long work reports how far it has come, without knowing who listens."""

from typing import Protocol


class Progress(Protocol):
    """Told after each step of a pass: the pass (e.g. "validating", or the rollup a level of a
    chain writes), how many units are done, and how many there are in all when that is known."""

    def __call__(self, phase: str, done: int, total: int | None = None, /) -> None: ...
