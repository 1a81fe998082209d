"""Named points in every action that changes a rollup or a raw table, where a process can be
made to die, fail or wait: crash and race tests are deterministic, never timed.

A process is armed once, at its edge (`Settings.fault`: `ROLLUPS_FAULT=<point>`, optionally
`ROLLUPS_FAULT_ACTION=kill|raise|pause` and `ROLLUPS_FAULT_ROLLUP=<archive>`); an armed point
fires the first time the process reaches it (for that archive, when one is named):

  kill   SIGKILL the process (the default): a crash at exactly that point;
  raise  raise `FaultInjected` (a transient failure: the work is retried);
  pause  block until the file `ROLLUPS_FAULT_RELEASE` exists, so another process can act while
         this one stands at the point (an operator action between two steps of a job).

In one process, tests register hooks instead (`hooked`): each hook hears every point reached,
with the archive it concerns, and may act there (run an operator action, raise, wait).

The points, in the order an action reaches them:
"""

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

POINTS = {
    # A recompute (and a fold, which is one).
    "before_correct": "the job is Running and has read the fence; nothing written",
    "after_write": "its new generation's files are written, nothing committed",
    "after_commit": "its rows are committed, the pointers not flipped",
    "before_flip": "the job is Swapping and checked it is still its rollup's; the flip is next",
    "after_flip": "the pointers are flipped, the job not recorded completed",
    "during_sweep": "the job is recorded completed; nothing swept",
    # The forward lane.
    "after_claim": "a forward run claimed its buckets; nothing written",
    "after_forward": "a forward run is committed and recorded; the watermark moved",
    # A surface publish.
    "publish_written": "a publish wrote its surface files; nothing committed",
    # The sensor.
    "sensor_planned": "the sensor computed its requests but has not recorded them",
    # Operator actions of several commits: each records its intent first.
    "rewind_intent": "a rewind recorded its intent and moved the watermark; pointers still there",
    "rewind_pointers": "a rewind dropped the pointers (fence moved); the rows still there",
    "rewind_rows": "a rewind deleted the rows; its intent not yet cleared",
    "rollback_intent": "a rollback recorded its intent (Swapping); the pointers not restored",
    "rollback_commit": "a rollback restored the pointers; its completion not recorded",
    "column_intent": "a column change recorded its intent; the table not switched",
    "column_switch": "a column change switched the table; rows ingested meanwhile not refreshed",
    "retention_state": "retention recorded the new retained-from instant; nothing dropped",
    "rollup_retention_state": "rollup retention recorded its retained-from; pointers still there",
    "rollup_retention_pointers": "rollup retention dropped the pointers (fence moved); rows there",
    # Ingest.
    "merge_attempt": "an ingest checked its rows against retention; its MERGE not committed",
}
ACTIONS = ("kill", "raise", "pause")


class FaultInjected(RuntimeError):
    """Raised at an armed point whose action is `raise`."""


@dataclass(frozen=True)
class Fault:
    """What a process was armed with at its edge."""

    point: str
    action: str = "kill"
    archive: str | None = None  # only the point reached for this archive
    release: Path | None = None  # `pause`: the file whose existence releases the process

    def __post_init__(self) -> None:
        if self.point not in POINTS:
            raise ValueError(f"unknown fault point {self.point!r}; known: {', '.join(POINTS)}")
        if self.action not in ACTIONS:
            raise ValueError(f"unknown fault action {self.action!r}; known: {', '.join(ACTIONS)}")
        if self.action == "pause" and self.release is None:
            raise ValueError("a pause needs the file that releases it (ROLLUPS_FAULT_RELEASE)")


Hook = Callable[[str, str | None], None]
_armed: list[Fault] = []
_fired: set[Fault] = set()
_hooks: list[Hook] = []


def arm(fault: Fault | None) -> None:
    """Arm this process with `fault` (None disarms it); called at the edge, once."""
    _armed.clear()
    _fired.clear()
    if fault is not None:
        _armed.append(fault)


@contextmanager
def hooked(hook: Hook) -> Iterator[None]:
    """Let `hook(point, archive)` hear every point this process reaches while the context is
    open (tests act there: raise, run another action, wait for another thread)."""
    _hooks.append(hook)
    try:
        yield
    finally:
        _hooks.remove(hook)


def checkpoint(point: str, archive: str | None = None) -> None:
    """The action reached `point` (for `archive`): run the hooks, then an armed fault."""
    assert point in POINTS, point
    for hook in tuple(_hooks):
        hook(point, archive)
    for fault in _armed:
        if fault.point != point or fault in _fired:
            continue
        if fault.archive is not None and fault.archive != archive:
            continue
        _fired.add(fault)
        if fault.action == "raise":
            raise FaultInjected(f"fault injected at {point}")
        if fault.action == "pause":
            assert fault.release is not None
            while not fault.release.exists():
                time.sleep(0.05)
            continue
        os.kill(os.getpid(), signal.SIGKILL)
