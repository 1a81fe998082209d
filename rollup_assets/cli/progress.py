"""Progress of long commands on a terminal: counts and rates on one line of stderr, redrawn at
most a few times a second, and nothing at all when stderr is not a terminal or with `--quiet`
(so scripts and logs get only the result)."""

import sys
import time
from typing import TextIO

import click

REDRAW_SECONDS = 0.2
MIN_RATE_SECONDS = 0.001
QUIET = click.option(
    "--quiet", is_flag=True, help="No progress line (there is none unless on a terminal)."
)


class Meter:
    """`meter(phase, done[, total])` redraws `label: phase 1,234 of 5,000 rows (250 rows/s)`.

    The rate counts from the phase's first report. A phase's last figures are always drawn
    before the next phase starts (and on `close`), even when they came within the redraw
    interval. With `line_per_phase`, each phase keeps its own line (a chain's levels, one
    under the other); otherwise the next phase overwrites it."""

    def __init__(
        self,
        label: str,
        unit: str = "rows",
        total: int | None = None,
        quiet: bool = False,
        stream: TextIO | None = None,
        line_per_phase: bool = False,
    ) -> None:
        self.label = label
        self.unit = unit
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = not quiet and self.stream.isatty()
        self.line_per_phase = line_per_phase
        self.started = time.monotonic()
        self.phase_started = self.started
        self.phase = ""
        self.drawn = 0.0
        self.width = 0
        self.pending: str | None = None  # the phase's latest figures, when not drawn yet

    def __call__(self, phase: str, done: int, total: int | None = None, /) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        new = phase != self.phase
        if new:
            self._flush()
            if self.line_per_phase and self.width:
                self.stream.write("\n")
                self.width = 0
            self.phase, self.phase_started = phase, now
        text = self._text(phase, done, self.total if total is None else total, now)
        if not new and now - self.drawn < REDRAW_SECONDS:
            self.pending = text
            return
        self._draw(text, now)

    def _text(self, phase: str, done: int, total: int | None, now: float) -> str:
        elapsed = now - self.phase_started
        of = f" of {total:,}" if total is not None else ""
        # No rate yet at the phase's first report: no time has passed to divide by.
        rate = ""
        if elapsed >= MIN_RATE_SECONDS:
            per_s = done / elapsed
            rate = f" ({per_s:,.{1 if 0 < per_s < 10 else 0}f} {self.unit}/s)"
        return f"{self.label}: {phase} {done:,}{of} {self.unit}{rate}"

    def _draw(self, text: str, now: float) -> None:
        self.stream.write("\r" + text.ljust(self.width))
        self.stream.flush()
        self.drawn, self.width, self.pending = now, len(text), None

    def _flush(self) -> None:
        if self.pending is not None:
            self._draw(self.pending, self.drawn)

    def close(self) -> None:
        """End the line (when one was drawn), leaving the last figures on screen; later
        reports start a new line (so other output can be written in between)."""
        if not self.enabled:
            return
        self._flush()
        if self.width:
            self.stream.write("\n")
            self.stream.flush()
        self.width, self.phase = 0, ""
