"""The workload interface the engine consumes, and the errors workloads raise."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from token_content import TokenContent
from workloads.request import Request

PROJECT_ROOT = Path(__file__).resolve().parents[1]


class WorkloadError(ValueError):
    """A workload cannot be built or replayed as configured."""


@dataclass(frozen=True)
class Remedy:
    """The workload setting that accepts what a :class:`TraceError` refused, e.g. ``on_bad_row: skip``
    ("to skip such rows"). Kept apart from the message so that a command line can name its own flag
    for the same setting instead."""

    setting: str
    value: str
    effect: str

    def __str__(self) -> str:
        return f"set {self.setting}: {self.value} to {self.effect}"


class TraceError(WorkloadError):
    """A trace file is unusable: missing columns, bad values, truncated lines...

    ``path`` and ``line`` (1-based, when the problem has one) say where; ``remedy``, when there is
    one, is the setting that would accept the file (its message ends with it in parentheses)."""

    def __init__(
        self,
        message: str,
        path: str | Path | None = None,
        line: int | None = None,
        remedy: Remedy | None = None,
    ):
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(where + message + (f" ({remedy})" if remedy is not None else ""))
        self.path = None if path is None else str(path)
        self.line = line
        self.reason = message
        self.where = where
        self.remedy = remedy


class TraceWarning(UserWarning):
    """Something in a trace was repaired or skipped as the configuration asked (it is also counted)."""


class SkippedRowsWarning(TraceWarning):
    """``on_bad_row: skip`` skipped a malformed row: the first of its kind (one warning per kind of
    problem; every skipped row is counted in ``describe()``). ``path``, ``line`` and ``problem`` say
    which row and what is wrong with it."""

    def __init__(self, path: str | Path, line: int, problem: str):
        super().__init__(f"{path}:{line}: {problem}; skipping such rows (counted in describe())")
        self.path = str(path)
        self.line = line
        self.problem = problem


class Workload(ABC):
    """A stream of :class:`Request` objects for the engine.

    * :meth:`requests` yields requests lazily, sorted by ``arrival_s``, with unique ``request_id``.
      Each call starts the replay afresh (same seed, same stream) and resets :meth:`follow_up`'s state.
    * :meth:`follow_up` is the closed loop: the engine calls it once for every request that leaves
      the system (finished or rejected) and schedules what it returns. Requests it returns are not
      part of :meth:`requests`' stream; their ids never clash with it.
    * :meth:`describe` is a small JSON-able summary for the results' metadata; counters in it (rows
      skipped, lengths capped...) are complete once :meth:`requests` has been exhausted.
    """

    @abstractmethod
    def requests(self) -> Iterator[Request]: ...

    def follow_up(self, finished: Request, finish_s: float) -> Request | None:
        """The next request of ``finished``'s user or conversation, or None (the default)."""
        return None

    @property
    def arrivals_known_up_front(self) -> bool:
        """Every request is in :meth:`requests`' stream, at the time it says (:meth:`follow_up` never
        adds or delays one), so every arrival is known before the run. A workload that overrides
        :meth:`follow_up` says when this holds."""
        return type(self).follow_up is Workload.follow_up

    @abstractmethod
    def describe(self) -> dict[str, Any]: ...

    def check_input(self) -> None:
        """Read every input the stream will read, so that a malformed one is refused before any
        simulation rather than in the middle of one (a trace's rows). Nothing to read by default."""
        return None

    def shared_prefixes(self) -> list[TokenContent]:
        """Prompt prefixes many requests start with (system prompts): what a server would pin in its
        prefix cache at warm-up. None by default."""
        return []


def resolve_path(path: str | Path, base_dir: Path | None, key: str | None = None) -> Path:
    """A data file named in a config: absolute, or relative to the YAML's folder, then the project root.
    ``key``: the config key that names it, for the error when it is not there."""
    named_by = f" (named by {key})" if key else ""
    candidate = Path(path).expanduser()
    if candidate.is_absolute():
        if candidate.is_file():
            return candidate
        raise TraceError(f"file not found{named_by}", candidate)
    tried = []
    for root in (base_dir, PROJECT_ROOT):
        if root is None:
            continue
        full = Path(root) / candidate
        tried.append(str(full))
        if full.is_file():
            return full
    raise TraceError(f"file not found{named_by} (tried {', '.join(tried)})", path)
