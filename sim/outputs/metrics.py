"""Recording what the engine does: per-request records, a state time series, exact time averages.

The engine hands the recorder the state after every event as one tuple (:data:`STATE_COLUMNS`). A
row is written only when the state changed, into a buffer that goes to the output sink
(``sim/outputs/sinks.py``) one chunk at a time, so memory holds at most one chunk of rows whatever the
run.

Time averages are exact. The state holds its value from one recorded instant to the next; inside an
event-skipping jump the engine also reports the instants at which the policy changed
(:meth:`Recorder.observe`, no row written) and the area of the tokens that grow by one per sequence
and iteration (:meth:`Recorder.add_token_area`), which no row could describe. Each row also carries
the breakdown's exact areas from t=0 (:data:`AREA_COLUMNS`), so that a window's mean needs no rule
between rows (``sim/planning/plans/steady.py``). The areas are summed one chunk of events at a time, in
event order, with numpy (:meth:`Recorder._fold`): the same additions as one per event, bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from itertools import chain
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from policies.base import MemoryBreakdown

if TYPE_CHECKING:
    from sim.outputs.sinks import OutputSink

CHUNK_ROWS = 50_000  # rows buffered before they go to the sink

# What holds the waiting queue's head back, per time-series row (column ``admission_blocker``, an
# index into this tuple; an integer so the series stays numeric): nothing waits, the KV cache, the
# batch's sequence cap, the iteration's token budget.
ADMISSION_BLOCKERS = ("none", "kv_memory", "max_num_seqs", "token_budget")
KV_MEMORY, MAX_NUM_SEQS, TOKEN_BUDGET = 1, 2, 3

BREAKDOWN_COLUMNS = tuple(f"{name}_tokens" for name in MemoryBreakdown.CATEGORIES)
# The exact time integral of each breakdown category from t=0 to the row, in slot-seconds: a window's
# mean is the difference of two of them over its length, whatever rows the series holds.
AREA_COLUMNS = tuple(f"{name}_token_s" for name in MemoryBreakdown.CATEGORIES)

HOST_COLUMNS = (
    "host_cached_tokens",
    "host_free_tokens",
    "host_cache_hits",
    "host_loaded_blocks",
    "host_offloaded_blocks",
    "host_evictions",
)

# State recorded at every sample but not time-averaged in the summary: queue sizes and event counters.
RECORDED_ONLY_COLUMNS = (
    "num_requests_waiting",
    "num_sequences_running",
    "admission_waits",
    "preemptions",
    "oom_failures",
    "cow_copies",
    "prefix_cache_queries",
    "prefix_cache_hits",
    "evictions",
)

STATE_COLUMNS = (
    # Time-averaged in the summary: the breakdown, running requests, physical and logical slots.
    *BREAKDOWN_COLUMNS,
    "num_requests_running",
    "physical_tokens",
    "logical_tokens",
    *RECORDED_ONLY_COLUMNS,
    "admission_blocker",  # index into ADMISSION_BLOCKERS
    # The host-memory tier (offload:), zero without one: its breakdown and cumulative counters.
    *HOST_COLUMNS,
)
AVERAGED = len(BREAKDOWN_COLUMNS) + 3  # the leading state columns that have time averages
_CATEGORIES = len(BREAKDOWN_COLUMNS)
RUNNING = STATE_COLUMNS.index("num_requests_running")

SERIES_COLUMNS = (
    "time_s",
    *BREAKDOWN_COLUMNS,
    "num_requests_running",
    *RECORDED_ONLY_COLUMNS,
    "physical_tokens",
    "logical_tokens",
    "admission_blocker",  # index into ADMISSION_BLOCKERS
    *HOST_COLUMNS,
    *AREA_COLUMNS,
)


def summary_key(category: str) -> str:
    """``mean_used_frac``, ..., ``mean_internal_frag_frac``: the summary's time-averaged share of a category."""
    return f"mean_{category.replace('_fragmentation', '_frag')}_frac"


@dataclass(slots=True, init=False)
class RequestRecord:
    """One request's outcome: a row of the requests table. (Its constructor is written out: the
    compiled build runs it natively, once per request.)"""

    request_id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    n: int
    beam_width: int
    sample_output_tokens: int  # all its samples/beams together
    admitted_s: float  # NaN until admitted (and for a request never admitted)
    first_token_s: float
    finish_s: float
    preemptions: int
    cached_prompt_tokens: int
    outcome: str  # finished | rejected | failed_oom | unfinished
    reason: str
    replica: int  # the cluster replica that served it (0 for a single engine)
    client_overhead_s: float  # outside the engine, in its client-side TTFT and E2E

    def __init__(
        self,
        request_id: int,
        arrival_s: float,
        prompt_tokens: int,
        output_tokens: int,
        n: int,
        beam_width: int,
        sample_output_tokens: int,
    ) -> None:
        self.request_id = request_id
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.n = n
        self.beam_width = beam_width
        self.sample_output_tokens = sample_output_tokens
        self.admitted_s = self.first_token_s = self.finish_s = math.nan
        self.preemptions = self.cached_prompt_tokens = self.replica = 0
        self.client_overhead_s = 0.0
        self.outcome = "unfinished"
        self.reason = ""


@dataclass
class Counters:
    """Cumulative engine counters. None of them counts retries: both step modes count the same."""

    admission_waits: int = 0  # requests that had to wait for KV memory at admission (at least once)
    preemptions: int = 0  # requests taken off the GPU (all sequences of a request count once)
    oom_failures: int = 0  # requests failed because they did not fit at admission (on_oom: fail)
    swapped_out_blocks: int = 0
    iterations: int = 0
    output_tokens: int = 0
    host_load_s: float = 0.0  # seconds of host -> GPU loads of prefix hits charged to iterations


class Recorder:
    """The state time series (rows written on change) and its exact time-weighted areas.

    Observations are logged (an instant and the state in force from it) and folded into cumulative
    areas one chunk at a time, in one vectorised pass: the running sums are added in the order
    the states came, exactly as one addition per observation would (``np.cumsum`` accumulates
    sequentially), at a fraction of the cost per event."""

    def __init__(self, kv_pool_tokens: int, sink: OutputSink):
        self.kv_pool_tokens = kv_pool_tokens
        self.sink = sink
        self.peak_running = 0
        # Rows not handed to the sink yet, as Python lists: appending a tuple costs a fraction of
        # writing it into a numpy row; the lists become columns in one conversion per chunk.
        self._times: list[float] = []
        self._states: list[tuple] = []
        self._row_area_blocks: list[np.ndarray] = []  # the folded rows' areas, chunk by chunk
        self._row_entries: list[int] = []  # per row not folded yet, its observation in the log
        self._last_row: tuple | None = None
        # The observation log since the last fold, and the token areas added in between
        # (``(observations before it, slot-seconds)``).
        self._log_times: list[float] = []
        self._log_states: list[tuple] = []
        self._log_tokens: list[tuple[int, float]] = []
        # Folded: the areas up to ``_folded_since``, when ``_folded_state`` came into force.
        self._area = [0.0] * AVERAGED
        self._folded_state: tuple | None = None
        self._folded_since = 0.0
        # The state in force now, and since when (the last observation, folded or not).
        self._state: tuple | None = None
        self._since = 0.0

    def record(self, time_s: float, state: tuple) -> None:
        """``state`` (:data:`STATE_COLUMNS`) holds from ``time_s`` on; a row is written if it changed."""
        if state == self._state:
            return
        self.observe(time_s, state)
        if state == self._last_row:
            return
        self._last_row = state
        running = state[RUNNING]
        if running > self.peak_running:
            self.peak_running = running
        self._times.append(time_s)
        self._states.append(state)
        self._row_entries.append(len(self._log_times) - 1)
        if len(self._times) == CHUNK_ROWS:
            self.flush()

    def observe(self, time_s: float, state: tuple) -> None:
        """``state`` holds from ``time_s`` on, without a row (a change inside an event-skipping jump)."""
        if len(self._log_times) == CHUNK_ROWS:
            self._fold()  # (before the append: a row refers to its observation until the next one)
        self._log_times.append(time_s)
        self._log_states.append(state)
        self._state = state
        self._since = time_s

    def add_token_area(self, slot_seconds: float) -> None:
        """Decoded tokens that filled reserved slots during a jump, in slot-seconds beyond the
        observed states (they grow every iteration, so no state can hold them)."""
        self._log_tokens.append((len(self._log_times), slot_seconds))

    def _fold(self) -> None:
        """The logged observations into the cumulative areas (and the logged rows' areas)."""
        times, states, tokens = self._log_times, self._log_states, self._log_tokens
        if not times and not tokens:
            return
        count = len(times)
        # Observation k adds the state before it times the time since: the state folded last for
        # the first (none before the very first observation: it adds nothing).
        previous = [self._folded_state or _NO_STATE, *states[:-1]]
        # The states are slot and request counts (exact in float64): read as integers, then
        # converted in one pass (read as floats, every value would make a float object).
        values = (
            np.fromiter(
                chain.from_iterable(map(_AVERAGED_PART, previous)), dtype=np.int64, count=count * AVERAGED
            )
            .reshape(count, AVERAGED)
            .astype(np.float64)
        )
        elapsed = np.diff(np.array([self._folded_since, *times], dtype=np.float64))
        steps = values * elapsed[:, None]
        token_at = np.array([position for position, _ in tokens], dtype=np.int64)
        if tokens:
            token_steps = np.zeros((len(tokens), AVERAGED))
            token_steps[:, 0] = [area for _, area in tokens]
            token_steps[:, 1] = -token_steps[:, 0]
            steps = np.insert(steps, token_at, token_steps, axis=0)
        cumulative = np.cumsum(np.vstack([np.array([self._area]), steps]), axis=0)
        if self._row_entries:
            entries = np.array(self._row_entries, dtype=np.int64)
            # An observation's step comes after the token areas logged before it.
            rows = entries + np.searchsorted(token_at, entries, side="right") + 1
            self._row_area_blocks.append(cumulative[rows, :_CATEGORIES])
            self._row_entries = []
        self._area = cumulative[-1].tolist()
        if count:
            self._folded_state, self._folded_since = states[-1], times[-1]
        self._log_times, self._log_states, self._log_tokens = [], [], []

    def flush(self) -> None:
        if self._times:
            self._fold()
            areas = np.concatenate(self._row_area_blocks)
            self.sink.write_timeseries(self.rows_frame(self._times, self._states, areas))
            self._times = []
            self._states = []
            self._row_area_blocks = []

    def time_averages(self, end_s: float) -> dict[str, float]:
        """Time-weighted means over [0, end_s]: breakdown fractions of the pool and mean running."""
        return averages_from_areas(self.areas(end_s), end_s, self.kv_pool_tokens)

    def areas(self, end_s: float) -> list[float] | None:
        """The time integrals over [0, end_s] of the averaged state columns; None before any state."""
        if end_s <= 0 or self._state is None:
            return None
        self._fold()
        tail = max(0.0, end_s - self._since)
        return [value + self._state[index] * tail for index, value in enumerate(self._area)]

    def rows_frame(self, times: list[float], states: list[tuple], areas: np.ndarray) -> pd.DataFrame:
        """Rows as a frame: ``areas`` holds each row's :data:`AREA_COLUMNS`."""
        # fromiter over the flattened rows: half the time of np.array's nested-sequence discovery.
        block = np.fromiter(
            chain.from_iterable(states), dtype=np.int64, count=len(states) * len(STATE_COLUMNS)
        ).reshape(len(states), len(STATE_COLUMNS))
        columns: dict[str, np.ndarray] = {name: block[:, index] for index, name in enumerate(STATE_COLUMNS)}
        columns |= {name: areas[:, index] for index, name in enumerate(AREA_COLUMNS)}
        columns["time_s"] = np.array(times, dtype=np.float64)
        frame = pd.DataFrame({name: columns[name] for name in SERIES_COLUMNS})
        idle = frame["free_tokens"] + frame["cached_tokens"]
        # vLLM's metric: evictable cache counts as free.
        frame["kv_cache_usage_perc"] = 1.0 - idle / self.kv_pool_tokens
        return frame

    def frame(self) -> pd.DataFrame:
        """The whole series: what the sink holds plus the rows not handed over yet."""
        self.flush()
        return self.sink.timeseries()


_AVERAGED_PART = itemgetter(slice(0, AVERAGED))
_NO_STATE = (0,) * AVERAGED


def averages_from_areas(area: list[float] | None, end_s: float, kv_pool_tokens: int) -> dict[str, float]:
    """Time averages from :meth:`Recorder.areas` (a cluster sums its replicas' areas and pools)."""
    if area is None:
        empty = {summary_key(name): 0.0 for name in MemoryBreakdown.CATEGORIES}
        return empty | {"mean_running": 0.0, "memory_saved_by_sharing_frac": 0.0}
    categories = len(MemoryBreakdown.CATEGORIES)
    result = {
        summary_key(name): area[index] / end_s / kv_pool_tokens
        for index, name in enumerate(MemoryBreakdown.CATEGORIES)
    }
    result["mean_running"] = area[categories] / end_s
    physical, logical = area[categories + 1], area[categories + 2]
    # 1 - physical / logical blocks held by live sequences, both time-averaged.
    result["memory_saved_by_sharing_frac"] = 1 - physical / logical if logical > 0 else 0.0
    return result


def cumulative_area_at(series: pd.DataFrame, area: str, value: str, at: np.ndarray) -> np.ndarray:
    """A series' cumulative ``area`` column at the instants ``at``: exact at its rows, linear in
    between (exact when the state holds between two rows; inside an event-skipping jump the decoded
    tokens grow by steps, so off by at most one segment's growth), and after its last row the last
    state held on."""
    times = series["time_s"].to_numpy(dtype=float)
    areas = series[area].to_numpy(dtype=float)
    inside = np.interp(at, times, areas)
    after = areas[-1] + series[value].to_numpy(dtype=float)[-1] * (at - times[-1])
    return np.where(at > times[-1], after, inside)


RECORD_FIELDS = tuple(field.name for field in fields(RequestRecord))
# Numeric fields' dtypes: their columns are built without inference. (An annotation is a string
# under postponed evaluation, a class without it: either names the type.)
_RECORD_DTYPES = {
    field.name: {"int": np.int64, "float": np.float64}.get(getattr(field.type, "__name__", str(field.type)))
    for field in fields(RequestRecord)
}


def requests_frame(records: list[RequestRecord]) -> pd.DataFrame:
    # Column by column (a dict per record costs more than the engine run itself), and numeric
    # columns straight into typed arrays: pandas' inference over lists is most of the rest.
    columns: dict[str, object] = {}
    for name in RECORD_FIELDS:
        dtype = _RECORD_DTYPES[name]
        values = map(attrgetter(name), records)
        columns[name] = (
            list(values) if dtype is None else np.fromiter(values, dtype=dtype, count=len(records))
        )
    frame = pd.DataFrame(columns)
    frame["ttft_s"] = frame["first_token_s"] - frame["arrival_s"] + frame["client_overhead_s"]
    frame["e2e_s"] = frame["finish_s"] - frame["arrival_s"] + frame["client_overhead_s"]
    decode_tokens = (frame["output_tokens"] - 1).where(frame["output_tokens"] > 1)
    frame["tpot_s"] = (frame["finish_s"] - frame["first_token_s"]) / decode_tokens
    frame["queue_s"] = frame["admitted_s"] - frame["arrival_s"]
    return frame
