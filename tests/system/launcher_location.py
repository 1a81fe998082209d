"""A code location for the run launcher's tests: one job whose op writes the pid of the process
it runs in to the file its run's `probe` tag names, then waits while the `hold` tag's file is
absent (a run to terminate)."""

import os
import time
from pathlib import Path

import dagster as dg


@dg.op
def report_pid(context: dg.OpExecutionContext) -> None:
    Path(context.run.tags["probe"]).write_text(str(os.getpid()))
    hold = context.run.tags.get("hold")
    while hold and not Path(hold).exists():
        time.sleep(0.05)


@dg.job(executor_def=dg.in_process_executor)  # the op runs in the run's own process
def probe() -> None:
    report_pid()


defs = dg.Definitions(jobs=[probe])
