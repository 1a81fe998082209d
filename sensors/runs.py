"""What Dagster knows about the runs this project launched (by their `rollups/*` tags)."""

import logging
import os
import socket

import dagster as dg

log = logging.getLogger(__name__)
TAG_JOB = "rollups/job_id"
TAG_LANE = "rollups/lane"
TAG_ROLLUP = "rollups/rollup"
TAG_PID = "rollups/pid"
TAG_HOST = "rollups/host"
UNFINISHED = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class DagsterRunLookup:
    def __init__(self, instance: dg.DagsterInstance) -> None:
        self.instance = instance

    def _reap_if_dead(self, run: dg.DagsterRun) -> bool:
        """A run executed in-process (`rollups tick`, CLI) whose process is gone never reports its
        end; mark it failed and release its pool slot so the work can be retried."""
        pid, host = run.tags.get(TAG_PID), run.tags.get(TAG_HOST)
        if run.status not in UNFINISHED or not pid or host != socket.gethostname():
            return False
        if _pid_alive(int(pid)):
            return False
        self.instance.report_run_failed(run, f"process {pid} running this run is gone")
        try:
            self.instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        except Exception:
            log.debug("no concurrency slots to free for %s", run.run_id)
        return True

    def runs_of_job(self, job_id: str) -> list[tuple[str, bool]]:
        records = self.instance.get_run_records(filters=dg.RunsFilter(tags={TAG_JOB: job_id}))
        out = []
        for r in sorted(records, key=lambda r: r.create_timestamp):
            run = r.dagster_run
            out.append((run.run_id, run.is_finished or self._reap_if_dead(run)))
        return out

    def in_flight(self, lane: str) -> set[str]:
        records = self.instance.get_run_records(
            filters=dg.RunsFilter(tags={TAG_LANE: lane}, statuses=UNFINISHED)
        )
        return {
            r.dagster_run.tags.get(TAG_ROLLUP, "")
            for r in records
            if not self._reap_if_dead(r.dagster_run)
        }
