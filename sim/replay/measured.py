"""A measured serving run, whatever file it came from: its requests, what the server was set to, and
how its publisher measured latency.

Readers (``sim/replay/readers.py``) turn each format into a :class:`MeasuredRun`; the replay
(``sim/replay/simulate.py``) and the comparison (``sim/replay/compare.py``) read nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pandas as pd

Anchor = Literal["client", "engine"]
"""Where a run's clock starts and stops: ``client`` (the benchmark client's send and receive: HTTP,
the API server, tokenization and streaming included) or ``engine`` (the engine's own queue time
stamps: an in-process ``AsyncLLM`` client, no HTTP)."""

TpotDefinition = Literal["per_request", "ratio_of_means"]
"""How a run's publisher turned per-request times into its headline TPOT: ``per_request`` is the
mean over requests of ``(E2E - TTFT) / (output - 1)`` (vLLM's benchmark client, LLMServingSim);
``ratio_of_means`` is ``(mean E2E - mean TTFT) / (mean output - 1)`` (the BLIS replay tables)."""

REQUEST_COLUMNS = ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "ttft_s", "e2e_s", "stage")
"""Columns of :attr:`MeasuredRun.requests`: one row per request, in arrival order, ``request_id``
0, 1, ... in that order, arrival 0 at the first request, latencies in seconds (NaN when the request
failed), ``stage`` the index of the load stage it arrived in."""

TIMESERIES_COLUMNS = ("time_s", "running", "waiting", "kv_usage_frac")
"""Columns of :attr:`MeasuredRun.timeseries` (any of the last three may be missing): the server's
own periodic samples, on the replay's clock (0 = the first request's arrival)."""


@dataclass(frozen=True)
class Stage:
    """A stretch of the run at one offered load (``rate_per_s``: None when the source does not say)."""

    start_s: float
    end_s: float
    rate_per_s: float | None = None

    @property
    def label(self) -> str:
        rate = "" if self.rate_per_s is None else f" at {self.rate_per_s:g} req/s"
        return f"{self.start_s:g}-{self.end_s:g} s{rate}"


@dataclass(frozen=True)
class ServerSettings:
    """What the measured server ran with, as far as the source says (None: not recorded). Names are
    vLLM's engine arguments."""

    model: str | None = None
    gpu: str | None = None
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    block_size: int = 16
    num_gpu_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"
    engine_version: str | None = None
    async_scheduling: bool | None = None


@dataclass
class MeasuredRun:
    """One measured run. ``prompt_hashes`` (one list per request, in request order) chain each
    prompt's ``hash_block_len``-token blocks so that equal prefixes have equal leading ids (None:
    the source says nothing of prompt content, and prefix caching cannot be replayed)."""

    name: str
    source_format: str
    path: Path
    requests: pd.DataFrame
    settings: ServerSettings
    anchor: Anchor
    tpot_definition: TpotDefinition
    stages: list[Stage]
    prompt_hashes: list[list[int]] | None = None
    hash_block_len: int = 16
    timeseries: pd.DataFrame | None = None
    max_concurrency: int | None = None
    """The client's closed loop (``vllm bench serve --max-concurrency``): at most this many requests
    in flight, each sent when a slot frees (its arrival is then only the earliest it may go)."""
    notes: list[str] = field(default_factory=list)
    """What a reader of the report must know about the source: how arrivals and prompts were
    reconstructed, what was assumed."""

    def __post_init__(self) -> None:
        missing = [name for name in REQUEST_COLUMNS if name not in self.requests]
        if missing:
            raise ValueError(f"measured requests lack column(s) {', '.join(missing)}")
        if self.prompt_hashes is not None and len(self.prompt_hashes) != len(self.requests):
            raise ValueError(
                f"{len(self.prompt_hashes)} prompt hash chains for {len(self.requests)} requests"
            )
