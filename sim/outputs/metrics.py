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
between rows (``sim/planning/sweeps/steady.py``). The areas are summed one addition per event, in event
order (:meth:`Recorder.observe`).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, fields
from itertools import chain
from operator import attrgetter
from typing import Any, Final, Protocol

import numpy as np
import pandas as pd

from policies.base import MemoryBreakdown


class SeriesSink(Protocol):
    """Where the recorder's time series goes (``sim/outputs/sinks.py``; declared here so that the
    sinks import the metrics and not the other way round)."""

    def write_timeseries(self, frame: pd.DataFrame) -> None: ...

    def timeseries(self) -> pd.DataFrame: ...


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
AVERAGED: Final = len(BREAKDOWN_COLUMNS) + 3  # the leading state columns that have time averages
_CATEGORIES: Final = len(BREAKDOWN_COLUMNS)
RUNNING: Final = STATE_COLUMNS.index("num_requests_running")

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
    # Disaggregated serving (NaN / -1 / 0 otherwise): the prefill replica, when its prompt was done
    # there, when its KV started and ended crossing the link, and what crossed.
    prefill_replica: int
    prefill_done_s: float
    transfer_start_s: float
    transfer_end_s: float
    transfer_bytes: int
    decode_cached_tokens: int
    # Decode iterations it took part in after a first token, and the tokens they gave it (equal
    # without speculative decoding; with it, 1 + accepted drafts per step).
    decode_steps: int
    decode_step_tokens: int

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
        self.prefill_replica = -1
        self.prefill_done_s = self.transfer_start_s = self.transfer_end_s = math.nan
        self.transfer_bytes = self.decode_cached_tokens = 0
        self.decode_steps = self.decode_step_tokens = 0
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

    Each observation (an instant and the state in force from it) adds the state before it times the
    time since to the running areas, one addition per averaged column, in event order; a row keeps
    the areas at its observation. (Compiled, these are native float operations: an earlier design
    logged the observations and summed them with numpy one chunk at a time, the same additions,
    but converting every state value to a numpy element cost several times more.)"""

    def __init__(self, kv_pool_tokens: int, sink: SeriesSink):
        self.kv_pool_tokens = kv_pool_tokens
        self.sink = sink
        self.peak_running = 0
        # Rows not handed to the sink yet, as Python lists: appending a tuple costs a fraction of
        # writing it into a numpy row; the lists become columns in one conversion per chunk.
        self._times: list[float] = []
        self._states: list[tuple] = []
        self._row_areas: list[float] = []  # per row not handed over, its AREA_COLUMNS, flat
        self._last_row: tuple | None = None
        # The areas from t=0 up to ``_since``, when ``_state`` (the state in force now) came into force.
        self._area = [0.0] * AVERAGED
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
        self._row_areas.extend(self._area[:_CATEGORIES])
        if len(self._times) == CHUNK_ROWS:
            self.flush()

    def observe(self, time_s: float, state: tuple) -> None:
        """``state`` holds from ``time_s`` on, without a row (a change inside an event-skipping jump)."""
        previous = self._state
        if previous is not None:
            elapsed = time_s - self._since
            area = self._area
            for index in range(len(area)):
                count: int = previous[index]  # (a slot or request count: exact as a float)
                # (Written out, not +=: compiled, this is then a native float addition. A zero count
                # adds exactly nothing, and skipping it saves a boxed float.)
                if count:
                    area[index] = area[index] + count * elapsed
        self._state = state
        self._since = time_s

    def add_token_area(self, slot_seconds: float) -> None:
        """Decoded tokens that filled reserved slots during a jump, in slot-seconds beyond the
        observed states (they grow every iteration, so no state can hold them)."""
        area = self._area
        area[0] = area[0] + slot_seconds
        area[1] = area[1] - slot_seconds

    def add_unbacked_token_area(self, slot_seconds: float) -> None:
        """Decoded tokens that took free slots during a jump (a pool whose growth is not backed by
        held slots, ``sim/engine/unbacked.py``): each is a slot more used and held, one less free."""
        area = self._area
        area[0] = area[0] + slot_seconds
        area[5] = area[5] - slot_seconds
        area[7] = area[7] + slot_seconds
        area[8] = area[8] + slot_seconds

    def flush(self) -> None:
        if self._times:
            areas = np.array(self._row_areas, dtype=np.float64).reshape(len(self._times), _CATEGORIES)
            self.sink.write_timeseries(self.rows_frame(self._times, self._states, areas))
            self._times = []
            self._states = []
            self._row_areas = []

    def time_averages(self, end_s: float) -> dict[str, float]:
        """Time-weighted means over [0, end_s]: breakdown fractions of the pool and mean running."""
        return averages_from_areas(self.areas(end_s), end_s, self.kv_pool_tokens)

    def areas(self, end_s: float) -> list[float] | None:
        """The time integrals over [0, end_s] of the averaged state columns; None before any state."""
        if end_s <= 0 or self._state is None:
            return None
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


def averages_from_areas(area: list[float] | None, end_s: float, kv_pool_tokens: int) -> dict[str, float]:
    """Time averages from :meth:`Recorder.areas` (a cluster sums its replicas' areas and pools)."""
    if area is None:
        empty = {summary_key(name): 0.0 for name in MemoryBreakdown.CATEGORIES}
        return empty | {"mean_running": 0.0, "memory_saved_by_sharing_frac": 0.0}
    categories = len(MemoryBreakdown.CATEGORIES)
    result = {
        summary_key(name): without_residue(area[index] / end_s / kv_pool_tokens)
        for index, name in enumerate(MemoryBreakdown.CATEGORIES)
    }
    result["mean_running"] = area[categories] / end_s
    physical, logical = area[categories + 1], area[categories + 2]
    # 1 - physical / logical blocks held by live sequences, both time-averaged.
    result["memory_saved_by_sharing_frac"] = 1 - physical / logical if logical > 0 else 0.0
    return result


def without_residue(share: float) -> float:
    """A share of the pool with the float residue of summing areas removed (a category that was
    never held sums to about -1e-17, which a summary would print as -0.0 %)."""
    return 0.0 if abs(share) < 1e-12 else share


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
_TEXT_FIELDS = tuple(name for name in RECORD_FIELDS if _RECORD_DTYPES[name] is None)
_NUMERIC_FIELDS = tuple(name for name in RECORD_FIELDS if _RECORD_DTYPES[name] is not None)
# One record's numbers as packed bytes (standard sizes, no padding) and the same layout as numpy
# reads it: every numeric column of the table is a field of one array of these.
_NUMERIC_ROW = struct.Struct(
    "=" + "".join("q" if _RECORD_DTYPES[name] is np.int64 else "d" for name in _NUMERIC_FIELDS)
)
_NUMERIC_DTYPE = np.dtype([(name, _RECORD_DTYPES[name]) for name in _NUMERIC_FIELDS])
assert _NUMERIC_DTYPE.itemsize == _NUMERIC_ROW.size
assert len(_TEXT_FIELDS) > 1 and len(_NUMERIC_FIELDS) > 1  # (an attrgetter of one name gives no tuple)
_numeric_fields = attrgetter(*_NUMERIC_FIELDS)
_text_fields = attrgetter(*_TEXT_FIELDS)


def requests_frame(records: list[RequestRecord]) -> pd.DataFrame:
    # Numeric fields straight into typed arrays (a dict per record costs more than the engine run
    # itself, and pandas' inference over lists most of the rest), packed one record at a time: a
    # pass over the records per column touched each record once per column, and a long run's
    # records lie scattered over its memory (most of those touches were cache misses; this is 3.5-4x
    # faster on a 20,000-request trace replay). The derived latencies are numpy arithmetic on
    # those arrays, before the frame exists: the same operations in the same order as on its
    # columns, without a pandas operation and column insertion each (a capacity plan builds this
    # table for every probe).
    packed = bytearray(_NUMERIC_ROW.size * len(records))
    pack_into, row_bytes = _NUMERIC_ROW.pack_into, _NUMERIC_ROW.size
    numbers, texts = _numeric_fields, _text_fields
    text_rows: list[tuple[str, ...]] = []
    offset = 0
    for record in records:
        pack_into(packed, offset, *numbers(record))
        offset += row_bytes
        text_rows.append(texts(record))
    table = np.frombuffer(packed, dtype=_NUMERIC_DTYPE)
    columns: dict[str, Any] = {}
    for name in RECORD_FIELDS:
        if name in _TEXT_FIELDS:
            index = _TEXT_FIELDS.index(name)
            columns[name] = [row[index] for row in text_rows]
        else:
            columns[name] = table[name].copy()  # (contiguous, and writable as before)
    arrival, first_token, finish = columns["arrival_s"], columns["first_token_s"], columns["finish_s"]
    admitted, prefill_done = columns["admitted_s"], columns["prefill_done_s"]
    overhead, outputs = columns["client_overhead_s"], columns["output_tokens"]
    decode_tokens = np.where(outputs > 1, outputs - 1, np.nan)
    columns["ttft_s"] = first_token - arrival + overhead
    columns["e2e_s"] = finish - arrival + overhead
    columns["tpot_s"] = (finish - first_token) / decode_tokens
    columns["queue_s"] = admitted - arrival
    # TTFT split of a disaggregated request (NaN otherwise): queue_s, then these, then the decode
    # replica's first step (first_token_s - transfer_end_s).
    columns["prefill_s"] = prefill_done - admitted
    columns["transfer_wait_s"] = columns["transfer_start_s"] - prefill_done
    columns["transfer_s"] = columns["transfer_end_s"] - columns["transfer_start_s"]
    return pd.DataFrame(columns)
