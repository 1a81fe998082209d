"""Named fault-injection points, so crash tests are deterministic rather than timed.

Set `ROLLUPS_FAULT=<point>` (and optionally `ROLLUPS_FAULT_ACTION=raise`) in a process to make it
die (SIGKILL, the default) or raise `FaultInjected` when it reaches that point. Points:
  after_write      Spark wrote the new generation's files, nothing committed yet
  after_commit     the rows are committed, the pointer is not flipped yet
  after_flip       the pointer is flipped, the job not recorded completed yet
  during_sweep     the job is recorded completed; its surface is not published, nothing swept
  after_forward    a forward run is committed and recorded, its surface not published yet
  sensor_planned   the sensor computed its requests but has not recorded them
"""

import os
import signal

POINTS = (
    "after_write",
    "after_commit",
    "after_flip",
    "during_sweep",
    "after_forward",
    "sensor_planned",
)


class FaultInjected(RuntimeError):
    pass


def checkpoint(point: str) -> None:
    if os.environ.get("ROLLUPS_FAULT") != point:
        return
    if os.environ.get("ROLLUPS_FAULT_ACTION", "kill") == "raise":
        raise FaultInjected(f"fault injected at {point}")
    os.kill(os.getpid(), signal.SIGKILL)
