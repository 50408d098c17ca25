"""Progress of a long run: tqdm's bar on a terminal, plain lines at a modest interval elsewhere.

In CI, under ``nohup`` or through a pipe a bar's escape sequences are noise, but three silent
minutes on a million requests look like a hang: there a line every ``interval_s`` seconds (none for
a run shorter than that) says how far the run is and about how long it has left.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, Literal, TextIO

from tqdm.auto import tqdm

ProgressMode = Literal["bar", "log"] | bool | None
"""``"bar"`` (or True): tqdm's bar; ``"log"``: :class:`LoggedProgress`; None or False: nothing."""

LOG_INTERVAL_S = 30.0


class LoggedProgress:
    """Counts requests as they arrive in the simulation; prints ``label: 120,000 of 1,000,000
    requests (12.0 %), 31 s, about 3.8 min left`` at most every ``interval_s`` wall seconds."""

    def __init__(
        self,
        label: str,
        total: int | None,
        interval_s: float | None = None,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.label = label
        self.total = total
        self.interval_s = LOG_INTERVAL_S if interval_s is None else interval_s
        self.stream = stream
        self.clock = clock
        self.done = 0
        self.started_s = clock()
        self.next_line_s = self.started_s + self.interval_s

    def update(self, count: int = 1) -> None:
        self.done += count
        now = self.clock()
        if now >= self.next_line_s:
            self.next_line_s = now + self.interval_s
            self._print(self._line(now - self.started_s))

    def close(self) -> None:
        """Nothing: a finished run says so itself."""

    def _line(self, elapsed_s: float) -> str:
        if not self.total:
            return f"{self.label}: {self.done:,} requests, {duration(elapsed_s)}"
        share = self.done / self.total
        left = f", about {duration(elapsed_s / share * (1 - share))} left" if 0 < share < 1 else ""
        return f"{self.label}: {self.done:,} of {self.total:,} requests ({share:.1%}), {duration(elapsed_s)}{left}"

    def _print(self, line: str) -> None:
        print(line, file=self.stream or sys.stderr, flush=True)


def duration(seconds: float) -> str:
    """``45 s``, ``3.8 min``, ``1.2 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def request_progress(mode: ProgressMode, label: str, total: int | None) -> Any:
    """What counts a run's requests (``update``, ``close``), or None for no progress at all."""
    if mode == "log":
        return LoggedProgress(label, total)
    if mode:
        return tqdm(total=total, desc=label, unit="req", leave=False)
    return None
