"""Planning surface publishes off the correction's critical path: which lagging surfaces one
publish run brings up to date now, so that a stream of flips coalesces into few publishes and no
surface lags more than its bound after the last flip.

A rollup whose surface lags (`SurfaceLag.needs_publish`) is published when no publish of it is
in flight and its last one was launched at least `spacing(max_lag)` ago (half the bound). While
work is queued or running on the rollups (a correction carried up the chain flips one level
after another), or about to start (a source holds commits change detection has not read yet), a
surface whose oldest unpublished change is younger than the spacing waits for it, so that the
publish run neither competes with that work nor misses the levels it is about to flip. An
isolated correction is so published at the first tick after its chain is done; during a stream
of corrections each rollup is published once per spacing, every publish taking all the flips
since the last. The lag after the last flip is then at most the spacing, plus a sensor interval,
plus the publish run itself, within the bound for publishes shorter than the other half. Every
rollup due at one tick is published by ONE run (a chain's levels flip within seconds of each
other).

The run key names the states the run publishes (each rollup's recorded versions and the oldest
change it lacks) and the attempt: a second tick seeing the same states asks for the same run
(Dagster launches it once); a run that failed is asked for again, as the next attempt, once the
spacing has passed.
"""

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from rollup_assets.model.windows import iso_utc
from rollup_assets.services.surface_lag import SurfaceLag


def spacing(max_lag: timedelta) -> timedelta:
    """The least time between two launched publishes of one rollup: half the lag bound."""
    return max_lag / 2


@dataclass(frozen=True)
class PublishPlan:
    """One publish run (none: `rollups` empty), and the sensor's memory after it."""

    rollups: tuple[str, ...]
    run_key: str | None
    # Epoch seconds of each rollup's last launched publish (the sensor's cursor).
    launched: dict[str, float]
    # Publishes asked for so far per lagging state (`state_of`; states published are dropped).
    attempts: dict[str, int]
    notes: list[str] = field(default_factory=list)


def state_of(lag: SurfaceLag) -> str:
    """What a publish of `lag`'s rollup starts from: recorded versions and the oldest change."""
    recorded = "none" if lag.recorded is None else f"{lag.recorded.genmap}.{lag.recorded.rows}"
    since = "unknown" if lag.since is None else iso_utc(lag.since)
    return f"{lag.rollup}@{recorded}~{since}"


def plan_publish(
    lags: Sequence[SurfaceLag],
    in_flight: set[str],
    launched: Mapping[str, float],
    attempts: Mapping[str, int],
    now: datetime,
    max_lag: timedelta,
    prefix: str = "",
    working: bool = False,
) -> PublishPlan:
    """The rollups of `lags` to publish in one run at `now` (see the module docstring);
    `in_flight` names the rollups unfinished publish runs publish (`*`: every rollup),
    `launched` and `attempts` are what the previous plans recorded, `prefix` keeps run keys of
    different tenants apart, `working` says whether work is queued, running or about to start on
    the rollups."""
    every = spacing(max_lag).total_seconds()
    at = now.timestamp()
    due, notes = [], []
    for lag in lags:
        if not lag.needs_publish:
            continue
        if lag.rollup in in_flight or "*" in in_flight:
            notes.append(f"{lag.rollup}: a publish is in flight")
            continue
        age = lag.seconds(now)
        if working and age is not None and lag.since is not None and age < every:
            notes.append(
                f"{lag.rollup}: waits for the work queued, running or about to start on the "
                f"rollups (lagging {age:.0f} s, spacing {every:.0f} s)"
            )
            continue
        last = launched.get(lag.rollup)
        if last is not None and at - last < every:
            notes.append(f"{lag.rollup}: published {at - last:.0f} s ago (spacing {every:.0f} s)")
            continue
        due.append(lag)
    lagging = {state_of(lag) for lag in lags if lag.needs_publish}
    kept = {k: v for k, v in attempts.items() if k in lagging}
    if not due:
        return PublishPlan((), None, dict(launched), kept, notes)
    states = sorted(state_of(lag) for lag in due)
    digest = hashlib.sha1("|".join(states).encode()).hexdigest()[:16]
    attempt = 1 + max(kept.get(s, 0) for s in states)
    return PublishPlan(
        tuple(sorted(lag.rollup for lag in due)),
        f"{prefix}surface:{digest}:{attempt}",
        {**launched, **{lag.rollup: at for lag in due}},
        {**kept, **dict.fromkeys(states, attempt)},
        notes,
    )
