"""Progress of long commands on a terminal: counts and rates on one line of stderr, redrawn at
most a few times a second, and nothing at all when stderr is not a terminal or with `--quiet`
(so scripts and logs get only the result)."""

import sys
import time
from typing import TextIO

import click

REDRAW_SECONDS = 0.2
QUIET = click.option(
    "--quiet", is_flag=True, help="No progress line (there is none unless on a terminal)."
)


class Meter:
    """`meter(phase, done)` redraws `label: phase 1,234,567 rows (250,000 rows/s)`."""

    def __init__(
        self,
        label: str,
        unit: str = "rows",
        total: int | None = None,
        quiet: bool = False,
        stream: TextIO | None = None,
    ) -> None:
        self.label = label
        self.unit = unit
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = not quiet and self.stream.isatty()
        self.started = time.monotonic()
        self.phase_started = self.started
        self.phase = ""
        self.drawn = 0.0
        self.width = 0

    def __call__(self, phase: str, done: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if phase != self.phase:
            self.phase, self.phase_started = phase, now
        elif now - self.drawn < REDRAW_SECONDS:
            return
        self.drawn = now
        elapsed = max(now - self.phase_started, 1e-6)
        of = f" of {self.total:,}" if self.total is not None else ""
        text = (
            f"{self.label}: {phase} {done:,}{of} {self.unit} ({done / elapsed:,.0f} {self.unit}/s)"
        )
        self.stream.write("\r" + text.ljust(self.width))
        self.stream.flush()
        self.width = len(text)

    def close(self) -> None:
        """End the line (when one was drawn), leaving the last figures on screen."""
        if self.enabled and self.width:
            self.stream.write("\n")
            self.stream.flush()
