"""The Dagster instance APIs this project uses beyond the public surface, in one place.

Pool slots: a run claims its rollup's slot for a step it runs outside Dagster's step machinery
(carrying the chain to a level above), and the one-writer limit of every pool is set explicitly.
Dead runs: a run executed in-process whose process died never reports its end; it is marked
failed and its slots freed so the work can be retried.
"""

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg

log = logging.getLogger(__name__)


@contextmanager
def pool_slot(instance: dg.DagsterInstance, pool: str, run_id: str, step: str) -> Iterator[bool]:
    """Hold `pool`'s slot for (`run_id`, `step`) if it is free right now; yields whether it is."""
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        yield True
        return
    claim = storage.claim_concurrency_slot(pool, run_id, step)
    try:
        yield claim.is_claimed
    finally:
        # Frees the slot, or withdraws the queued claim when it was blocked.
        storage.free_concurrency_slot_for_step(run_id, step)


def set_pool_limits(instance: dg.DagsterInstance, pools: list[str], limit: int = 1) -> None:
    """Give every pool in `pools` an explicit limit (idempotent)."""
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return
    infos = storage.get_concurrency_infos(pools)  # one read for all (each sensor tick asks)
    for pool in pools:
        if infos[pool].slot_count != limit:
            storage.set_concurrency_slots(pool, limit)


def fail_dead_run(instance: dg.DagsterInstance, run: dg.DagsterRun, reason: str) -> None:
    """Mark a run whose process is gone as failed, and free the pool slots it held."""
    instance.report_run_failed(run, reason)
    try:
        instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
    except Exception:
        log.debug("no concurrency slots to free for %s", run.run_id)
