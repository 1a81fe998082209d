"""How long work reports how far it has come, without knowing who listens."""

from collections.abc import Callable

# Told after each step of a pass: (the pass, e.g. "validating", and how many units are done).
Progress = Callable[[str, int], None]
