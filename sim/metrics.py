"""Recording what the engine does: per-request records, a breakdown time series, summaries.

Rows are appended to plain lists during the run (cheap) and handed to an output sink
(``sim/outputs.py``) in chunks, so memory holds only the rows not yet handed over.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from policies.base import MemoryBreakdown

if TYPE_CHECKING:
    from sim.outputs import OutputSink

CHUNK_ROWS = 50_000  # rows buffered before they go to the sink

# What holds the waiting queue's head back, per time-series row (column ``admission_blocker``, an
# index into this tuple; an integer so the series stays numeric): nothing waits, the KV cache, the
# batch's sequence cap, the iteration's token budget.
ADMISSION_BLOCKERS = ("none", "kv_memory", "max_num_seqs", "token_budget")
KV_MEMORY, MAX_NUM_SEQS, TOKEN_BUDGET = 1, 2, 3

BREAKDOWN_COLUMNS = tuple(f"{name}_tokens" for name in MemoryBreakdown.CATEGORIES)


def summary_key(category: str) -> str:
    """``mean_used_frac``, ..., ``mean_internal_frag_frac``: the summary's time-averaged share of a category."""
    return f"mean_{category.replace('_fragmentation', '_frag')}_frac"


@dataclass(slots=True)
class RequestRecord:
    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    n: int
    beam_width: int
    admitted_s: float = float("nan")
    first_token_s: float = float("nan")
    finish_s: float = float("nan")
    preemptions: int = 0
    cached_prompt_tokens: int = 0
    outcome: str = "unfinished"  # finished | rejected | failed_oom | unfinished
    reason: str = ""


@dataclass
class Counters:
    oom_events: int = 0  # allocations that failed (admission or growth)
    admissions_failed: int = 0
    preemptions: int = 0
    swapped_out_blocks: int = 0
    iterations: int = 0
    output_tokens: int = 0


@dataclass
class Recorder:
    """Time series sampled after every engine event, and time-weighted averages of the breakdown."""

    kv_pool_tokens: int
    sink: OutputSink
    rows: list[tuple] = field(default_factory=list)
    peak_running: int = 0
    _last_row: tuple | None = None
    # Areas under: the six breakdown categories, running requests, physical and logical slots.
    _area: np.ndarray = field(default_factory=lambda: np.zeros(len(BREAKDOWN_COLUMNS) + 3))
    _last_time: float = 0.0
    _last_values: np.ndarray | None = None

    COLUMNS = (
        "time_s",
        *BREAKDOWN_COLUMNS,
        "num_requests_running",
        "num_requests_waiting",
        "num_sequences_running",
        "oom_events",
        "num_preemptions",
        "admissions_failed",
        "cow_copies",
        "prefix_cache_queries",
        "prefix_cache_hits",
        "evictions",
        "physical_tokens",
        "logical_tokens",
        "admission_blocker",  # index into ADMISSION_BLOCKERS
    )

    def sample(
        self,
        time_s: float,
        breakdown: MemoryBreakdown,
        running: int,
        waiting: int,
        running_sequences: int,
        counters: Counters,
        policy_stats: dict[str, int],
        sharing: tuple[int, int],
        admission_blocker: int = 0,
    ) -> None:
        values = np.array([*breakdown.as_dict().values(), running, *sharing], dtype=float)
        if self._last_values is not None and time_s > self._last_time:
            # Trapezoid between samples: growth between events is close to linear in time.
            self._area += (values + self._last_values) * 0.5 * (time_s - self._last_time)
        self._last_time, self._last_values = time_s, values
        row = (
            time_s,
            *breakdown.as_dict().values(),
            running,
            waiting,
            running_sequences,
            counters.oom_events,
            counters.preemptions,
            counters.admissions_failed,
            policy_stats["cow_copies"],
            policy_stats["prefix_cache_queries"],
            policy_stats["prefix_cache_hits"],
            policy_stats["evictions"],
            *sharing,
            admission_blocker,
        )
        if self._last_row is not None and self._last_row[1:] == row[1:]:
            return  # nothing changed: the previous row already describes this interval
        self._last_row = row
        self.peak_running = max(self.peak_running, running)
        self.rows.append(row)
        if len(self.rows) >= CHUNK_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.sink.write_timeseries(self.rows_frame(self.rows))
            self.rows = []

    def time_averages(self, end_s: float) -> dict[str, float]:
        """Time-weighted means over [0, end_s]: breakdown fractions of the pool and mean running."""
        if end_s <= 0 or self._last_values is None:
            empty = {summary_key(name): 0.0 for name in MemoryBreakdown.CATEGORIES}
            return empty | {"mean_running": 0.0, "memory_saved_by_sharing_frac": 0.0}
        area = self._area.copy()
        area += self._last_values * max(0.0, end_s - self._last_time)
        means = area / end_s
        result = {
            summary_key(name): float(means[i] / self.kv_pool_tokens)
            for i, name in enumerate(MemoryBreakdown.CATEGORIES)
        }
        categories = len(MemoryBreakdown.CATEGORIES)
        result["mean_running"] = float(means[categories])
        physical, logical = area[categories + 1], area[categories + 2]
        # 1 - physical / logical blocks held by live sequences, both time-averaged.
        result["memory_saved_by_sharing_frac"] = float(1 - physical / logical) if logical > 0 else 0.0
        return result

    def rows_frame(self, rows: list[tuple]) -> pd.DataFrame:
        frame = pd.DataFrame(rows, columns=list(self.COLUMNS))
        idle = frame["free_tokens"] + frame["cached_tokens"]
        frame["kv_cache_usage_perc"] = (
            1.0 - idle / self.kv_pool_tokens
        )  # vLLM: evictable cache counts as free
        return frame

    def frame(self) -> pd.DataFrame:
        """The whole series: what the sink holds plus the rows not handed over yet."""
        self.flush()
        return self.sink.timeseries()


def requests_frame(records: list[RequestRecord]) -> pd.DataFrame:
    frame = pd.DataFrame([asdict(record) for record in records])
    if frame.empty:
        frame = pd.DataFrame(columns=list(RequestRecord.__dataclass_fields__))
    frame["ttft_s"] = frame["first_token_s"] - frame["arrival_s"]
    frame["e2e_s"] = frame["finish_s"] - frame["arrival_s"]
    decode_tokens = (frame["output_tokens"] - 1).where(frame["output_tokens"] > 1)
    frame["tpot_s"] = (frame["finish_s"] - frame["first_token_s"]) / decode_tokens
    frame["queue_s"] = frame["admitted_s"] - frame["arrival_s"]
    return frame
