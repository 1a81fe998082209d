"""What Dagster knows about the runs this project launched (by their `rollups/*` tags), and the
chain's gate on other runs built from it."""

import logging
import socket
from contextlib import AbstractContextManager

import dagster as dg

from rollup_assets.model.jobs import Lane
from rollup_assets.model.specs import RollupSpec
from rollup_assets.orchestration.dagster_internals import fail_dead_run, pool_slot
from rollup_assets.orchestration.instance import pool_name
from rollup_assets.orchestration.tags import (
    TAG_HOST,
    TAG_JOB,
    TAG_LANE,
    TAG_PID,
    TAG_ROLLUP,
    TAG_SURFACES,
    tag,
    worker_pid,
)
from rollup_assets.orchestration.tenancy import NO_TENANT, Scope
from rollup_assets.resources.processes import pid_alive

log = logging.getLogger(__name__)
UNFINISHED = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


def launcher_host(instance: dg.DagsterInstance) -> str | None:
    """The host runs launched from here will run on, when it is known: the DefaultRunLauncher
    starts each run worker on the host of the code server that evaluates the sensors."""
    if isinstance(instance.run_launcher, dg.DefaultRunLauncher):
        return socket.gethostname()
    return None


class DagsterRunLookup:
    """The runs of one scope: a tenant's lookup never sees (nor reaps) another tenant's runs."""

    def __init__(self, instance: dg.DagsterInstance, scope: Scope = NO_TENANT) -> None:
        self.instance = instance
        self.scope = scope

    def _filter(
        self, tags: dict[str, str], statuses: list[dg.DagsterRunStatus] | None = None
    ) -> dg.RunsFilter:
        """Runs with `tags` (and `statuses`) of this lookup's tenant only."""
        return dg.RunsFilter(tags={**tags, **self.scope.tags()}, statuses=statuses)

    def _gone(self, run: dg.DagsterRun) -> bool:
        """Is `run` unfinished although the process running it (on this host) is gone?"""
        if run.status not in UNFINISHED or tag(run.tags, TAG_HOST) != socket.gethostname():
            return False
        pid = tag(run.tags, TAG_PID) or self._handed_to(run) or self._worker_pid(run)
        return pid is not None and not pid_alive(int(pid))

    @staticmethod
    def _handed_to(run: dg.DagsterRun) -> str | None:
        """The pid of the launcher's worker the run was handed to (known before its first event)."""
        pid = worker_pid(run.tags, run.run_id)
        return None if pid is None else str(pid)

    def _worker_pid(self, run: dg.DagsterRun) -> str | None:
        """The pid a launched run worker reports first thing ("Started process for run")."""
        records = self.instance.get_records_for_run(
            run.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT, limit=20
        ).records
        for r in records:
            event = r.event_log_entry.dagster_event
            meta = getattr(event.event_specific_data, "metadata", None) if event else None
            if meta and "pid" in meta:
                return str(meta["pid"].value)
        return None

    def _reap_if_dead(self, run: dg.DagsterRun) -> bool:
        """A run executed in-process (`rollups tick`, CLI) whose process is gone never reports its
        end; mark it failed and release its pool slot so the work can be retried."""
        if not self._gone(run):
            return False
        self.reap(run)
        return True

    def dead_runs(self, lane: Lane) -> list[dg.DagsterRun]:
        """Unfinished runs of `lane` whose process is gone (not reaped yet)."""
        records = self.instance.get_run_records(
            filters=self._filter({TAG_LANE: lane.value}, statuses=UNFINISHED)
        )
        return [r.dagster_run for r in records if self._gone(r.dagster_run)]

    def reap(self, run: dg.DagsterRun) -> None:
        pid = tag(run.tags, TAG_PID) or self._handed_to(run) or self._worker_pid(run)
        fail_dead_run(self.instance, run, f"process {pid} running this run is gone")

    def runs_of_job(self, job_id: str, owner: str | None = None) -> list[tuple[str, bool]]:
        """(run id, finished) of every run launched for the job, and of `owner`, the run that
        recorded it running, when that run took the job over in its chain (not launched for it)."""
        records = list(self.instance.get_run_records(filters=self._filter({TAG_JOB: job_id})))
        if owner and all(r.dagster_run.run_id != owner for r in records):
            records += self.instance.get_run_records(filters=dg.RunsFilter(run_ids=[owner]))
        out = []
        for r in sorted(records, key=lambda r: r.create_timestamp):
            run = r.dagster_run
            out.append((run.run_id, run.is_finished or self._reap_if_dead(run)))
        return out

    def publishing(self, job_name: str) -> set[str]:
        """The rollups whose surfaces an unfinished run of the publish job `job_name` publishes
        (every rollup, `*`, for a run that names none)."""
        records = self.instance.get_run_records(
            filters=dg.RunsFilter(
                job_name=job_name, tags=self.scope.tags() or None, statuses=UNFINISHED
            )
        )
        out: set[str] = set()
        for r in records:
            if self._reap_if_dead(r.dagster_run):
                continue
            named = r.dagster_run.tags.get(TAG_SURFACES, "")
            out |= {n for n in named.split(",") if n} or {"*"}
        return out

    def in_flight(self, lane: Lane) -> set[str]:
        records = self.instance.get_run_records(
            filters=self._filter({TAG_LANE: lane.value}, statuses=UNFINISHED)
        )
        return {
            r.dagster_run.tags.get(TAG_ROLLUP, "")
            for r in records
            if not self._reap_if_dead(r.dagster_run)
        }


class DagsterRunGate:
    """The chain's `RunGate`: a level's slot is its Dagster pool's slot, held for a step named
    after the level; runs are looked up by their tags."""

    def __init__(self, instance: dg.DagsterInstance, run_id: str, scope: Scope = NO_TENANT) -> None:
        self.instance = instance
        self.run_id = run_id
        self.scope = scope
        self.lookup = DagsterRunLookup(instance, scope)

    def hold(self, spec: RollupSpec) -> AbstractContextManager[bool]:
        step = f"{self.scope.name(spec.name)}__chain"
        return pool_slot(self.instance, pool_name(spec, self.scope), self.run_id, step)

    def launched_for(self, job_id: str) -> bool:
        return bool(self.lookup.runs_of_job(job_id))

    def forward_in_flight(self) -> set[str]:
        return self.lookup.in_flight(Lane.FORWARD)
