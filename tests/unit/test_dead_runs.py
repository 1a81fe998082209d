"""A run whose process is gone is found by the run lookup, whatever says which process it was: an
in-process run's own tag, or the pid of the launcher's worker it was handed to, before that
worker reported anything."""

import os
import socket
import subprocess
import sys

import dagster as dg
import pytest

from rollup_assets.model.jobs import Lane
from rollup_assets.orchestration.runs import DagsterRunLookup
from rollup_assets.orchestration.tags import TAG_HOST, TAG_LANE, TAG_PID, TAG_WORKER


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("pid_tag", [TAG_PID, TAG_WORKER])
def test_an_unfinished_run_whose_process_is_gone_is_dead(pid_tag: str) -> None:
    with dg.DagsterInstance.ephemeral() as instance:
        runs = {}
        for name, pid in (("gone", _dead_pid()), ("alive", os.getpid())):
            run = dg.DagsterRun(
                job_name="probe",
                run_id=f"run-{name}-{pid_tag.rsplit('.', 1)[-1]}",
                status=dg.DagsterRunStatus.STARTING,
                tags={
                    TAG_LANE: Lane.RECOMPUTE.value,
                    TAG_HOST: socket.gethostname(),
                    pid_tag: str(pid),
                },
            )
            runs[name] = instance.add_run(run).run_id
        dead = DagsterRunLookup(instance).dead_runs(Lane.RECOMPUTE)
        assert [r.run_id for r in dead] == [runs["gone"]]
