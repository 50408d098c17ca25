"""Experiment configuration: one YAML file, validated with clear errors (file, key path, bad value).

An experiment names a model, a GPU, a workload, engine knobs and a list of **variants** (policy +
overrides) that are replayed on the identical request stream. Knob names and defaults follow vLLM's
engine arguments where vLLM has them.
"""

from __future__ import annotations

import difflib
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from policies.base import policy_names
from sim.costs.core import CostModelConfig
from sim.kv.allocators import HYBRID_ALLOCATORS
from sim.offload import OffloadConfig
from sim.storage import RUN_FOLDER_ENTRIES
from sim.yaml_input import RepeatedKey, load_yaml
from workloads.config import FILE_FIELD, WorkloadConfig
from workloads.config_base import ConfigModel


class ConfigError(ValueError):
    """A config that cannot be run; the message names the file, the key path and the value."""


SLUG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
"""Experiment and variant names become folder names: letters, digits, ``-``, ``_`` and ``.``, starting with a
letter or digit, so that ``..``, hidden names, separators and absolute paths cannot occur."""

RESERVED_VARIANT_NAMES = frozenset(name.casefold() for name in RUN_FOLDER_ENTRIES)
"""Variant folders sit beside these entries of a results folder (compared ignoring case, as on macOS)."""

VLLM_BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)
"""The block sizes vLLM's ``CacheConfig`` accepts (``BlockSize`` literal); others are simulated, with a warning."""


def known_policies() -> list[str]:
    """What a variant's ``policy`` may name: a single-group policy (``policies/``) or a hybrid
    allocator (``sim/kv/allocators.py``)."""
    return sorted([*policy_names(), *HYBRID_ALLOCATORS])


def name_from_file(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """``data`` with ``name:`` defaulted to its file's stem (letters, digits, '-', '_' and '.' kept,
    anything else a '-'): experiment, sweep and plan files without one worked in earlier versions
    (and replay files need none either)."""
    if "name" not in data:
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", path.stem).lstrip("-_.")[:100]
        data["name"] = stem or "unnamed"
    return data


def check_slug(value: str, what: str) -> str:
    if not SLUG.fullmatch(value):
        raise ValueError(
            f"not a valid {what}: use 1-100 letters, digits, '-', '_' or '.', starting with a letter or "
            "digit (it becomes a folder name)"
        )
    return value


MOST_INSTANCES = 1024
"""The most engines (cluster replicas, a pool's replicas, data-parallel ranks) one variant runs: each
holds its KV pool's books in memory, built before the first simulation (2**63 replicas exhausted
memory)."""


class _Strict(ConfigModel):
    # (Numbers are finite: an infinite one raised deep inside, or ran as NaN.)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


_Section = TypeVar("_Section", bound=_Strict)


SPECULATIVE_METHODS = ("eagle", "eagle3", "mtp", "ngram", "draft_model")


class AcceptanceConfig(_Strict):
    """How many of a step's drafts the target accepts: exactly one of the three forms."""

    rates: list[float] | None = Field(
        None,
        description="Per-position acceptance, one per draft, non-increasing: entry i is the share of "
        "steps whose draft i+1 was accepted (vLLM's per-position acceptance rate, "
        "num_accepted_tokens_per_pos / num_drafts); their sum + 1 is the mean acceptance length.",
    )
    mean_acceptance_length: float | None = Field(
        None,
        description="The mean tokens a step gives a request, the bonus token included (the 'tau' "
        "papers publish); one acceptance rate at every position is derived from it.",
    )
    histogram: dict[int, float] | None = Field(
        None,
        description="Measured steps by accepted drafts: {accepted drafts (0..k): count or share}.",
    )
    histogram_file: str | None = Field(
        None,
        description="The same histogram as a CSV file (columns accepted_drafts,count), relative to the "
        "config file.",
    )

    @model_validator(mode="after")
    def _one_form(self) -> AcceptanceConfig:
        forms = ("rates", "mean_acceptance_length", "histogram", "histogram_file")
        given = [name for name in forms if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of rates, mean_acceptance_length, histogram, histogram_file"
                + (f" (got {', '.join(given)})" if given else "")
            )
        if self.rates is not None:
            bad = [rate for rate in self.rates if not 0 <= rate <= 1]
            if bad:
                raise ValueError(f"rates: acceptance rates must lie in [0, 1], got {bad[0]!r}")
            rising = [
                (i + 2, self.rates[i + 1])
                for i in range(len(self.rates) - 1)
                if self.rates[i + 1] > self.rates[i]
            ]
            if rising:
                position, rate = rising[0]
                raise ValueError(
                    f"rates: position {position}'s rate {rate!r} exceeds the one before it: a draft is "
                    "accepted only after every draft before it (give vLLM's per-position rates)"
                )
        if self.histogram is not None:
            negative = [count for count in self.histogram.values() if count < 0]
            if negative or not any(count > 0 for count in self.histogram.values()):
                raise ValueError("histogram: counts must be >= 0 with at least one above 0")
            below = [length for length in self.histogram if length < 0]
            if below:
                raise ValueError(f"histogram: accepted drafts must be >= 0, got {below[0]}")
        return self


class SpeculativeConfig(_Strict):
    """``engine.speculative``: speculative decoding as vLLM's ``speculative_config`` names it."""

    method: Literal["eagle", "eagle3", "mtp", "ngram", "draft_model"] = Field(
        description="How drafts are proposed: eagle / eagle3 (a one-layer draft head on the target's "
        "hidden states), mtp (the model's multi-token-prediction layers), ngram (prompt lookup, no "
        "draft model), draft_model (a smaller model of the same tokenizer)."
    )
    num_speculative_tokens: int = Field(gt=0, description="Drafts proposed per request and step (k).")
    acceptance: AcceptanceConfig = Field(description="How many drafts a step accepts.")
    draft_model: str | None = Field(
        None,
        description="method draft_model: the draft's model preset (kvsim models) or config.json; its "
        "weights and KV take GPU memory beside the target's.",
    )
    draft_layers: int | None = Field(
        None,
        gt=0,
        description="eagle / eagle3 / mtp: decoder layers of the draft head, each the target's width "
        "(default 1: EAGLE's and EAGLE-3's heads, DeepSeek's and Qwen3-Next's one MTP layer).",
    )
    draft_vocab_size: int | None = Field(
        None,
        gt=0,
        description="eagle3: the draft head's own output vocabulary (EAGLE-3's Llama heads: 32000); "
        "default: eagle3 32000, otherwise the target's LM head is shared.",
    )

    @model_validator(mode="after")
    def _method_keys(self) -> SpeculativeConfig:
        k = self.num_speculative_tokens
        if self.method == "draft_model" and not self.draft_model:
            raise ValueError("method draft_model needs draft_model: the draft's model preset or config.json")
        if self.method != "draft_model" and self.draft_model is not None:
            raise ValueError(
                f"draft_model: {self.draft_model!r} is only for method draft_model, not {self.method}"
            )
        if self.method in ("ngram", "draft_model") and self.draft_layers is not None:
            raise ValueError(f"draft_layers is for eagle, eagle3 and mtp heads, not method {self.method}")
        if self.method != "eagle3" and self.draft_vocab_size is not None:
            raise ValueError(f"draft_vocab_size is EAGLE-3's, not method {self.method}'s")
        acceptance = self.acceptance
        if acceptance.rates is not None and len(acceptance.rates) != k:
            raise ValueError(
                f"acceptance.rates: {len(acceptance.rates)} rates for num_speculative_tokens {k}: give one per draft"
            )
        if (
            acceptance.mean_acceptance_length is not None
            and not 1 <= acceptance.mean_acceptance_length <= k + 1
        ):
            raise ValueError(
                f"acceptance.mean_acceptance_length: {acceptance.mean_acceptance_length!r} is outside "
                f"[1, {k + 1}] (one token per step at least, k + 1 = {k + 1} at most)"
            )
        if acceptance.histogram is not None:
            beyond = sorted(length for length in acceptance.histogram if length > k)
            if beyond:
                raise ValueError(
                    f"acceptance.histogram: {beyond[0]} accepted drafts exceeds num_speculative_tokens {k}"
                )
        return self


class EngineConfig(_Strict):
    """Engine and memory knobs (vLLM names and defaults where vLLM has the knob)."""

    block_size: int = Field(16, gt=0, description="Tokens per KV block (vLLM default 16).")
    max_model_len: int | None = Field(
        None, gt=0, description="Longest request (prompt + output); default: the model's context length."
    )
    max_num_seqs: int = Field(256, gt=0, description="Most sequences in one iteration's batch.")
    max_num_batched_tokens: int = Field(8192, gt=0, description="Token budget of one iteration.")
    enable_chunked_prefill: bool = Field(
        True, description="Split long prefills over iterations within max_num_batched_tokens (vLLM V1: on)."
    )
    enable_prefix_caching: bool | None = Field(
        None,
        description="vLLM's switch; `true` with policy `paged` selects the `prefix` policy, and turns on "
        "`vllm-hybrid`'s, `jenga`'s and `sglang-hybrid`'s (SGLang's SWA radix cache) prefix caches "
        "(unset: off there).",
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="Fraction of GPU memory for the engine."
    )
    activation_reserve_bytes: int | None = Field(
        None, ge=0, description="Memory kept for activations; default: see sim/hardware/capacity.py."
    )
    kv_cache_memory_bytes: int | None = Field(None, gt=0, description="Set the KV pool size directly.")
    num_gpu_blocks_override: int | None = Field(
        None, gt=0, description="Set the number of KV blocks directly."
    )
    kv_cache_dtype: Literal["auto", "fp16", "bf16", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"] = (
        Field(
            "auto",
            description="KV cache element type; auto: the model's dtype. fp8 halves the bytes per token.",
        )
    )
    tensor_parallel_size: int = Field(
        1, gt=0, description="GPUs per instance; each holds its share of the KV heads and weights."
    )
    data_parallel_size: int = Field(
        1,
        gt=0,
        le=MOST_INSTANCES,
        description="Data-parallel ranks of the server (vLLM --data-parallel-size), each with "
        "tensor_parallel_size GPUs, its own scheduler and KV pool, and requests spread over them by "
        "vLLM's balancer (router vllm_dp). A dense model's ranks run independently; a mixture of "
        "experts needs enable_expert_parallel, and its ranks step in lockstep (sim/engine/lockstep.py). "
        "Not with a cluster: section.",
    )
    enable_expert_parallel: bool = Field(
        False,
        description="Mixture of experts: deal the routed experts out whole over the data_parallel_size x "
        "tensor_parallel_size GPUs (vLLM --enable-expert-parallel; the product must divide the experts) "
        "instead of splitting each over the TP group; every MoE layer exchanges tokens between the "
        "ranks (all-gather + reduce-scatter, vLLM's default all2all backend), the ranks step together "
        "one iteration at a time, each step as long as the slowest rank's. Derated cost model only.",
    )
    swap_space: float = Field(4.0, ge=0, description="Host swap space per GPU in GiB (vLLM V0 default 4).")
    preemption_mode: Literal["recompute", "swap"] = Field(
        "recompute",
        description="A preempted request is freed and recomputed later (vLLM V1), or swapped to host memory.",
    )
    watermark: float = Field(0.0, ge=0, lt=1, description="Pool fraction kept free at admission (V0: 0.01).")
    on_oom: Literal["queue", "fail"] = Field(
        "queue",
        description="A request that does not fit at its first admission waits (queue) or fails (fail). A "
        "preempted request always waits to be readmitted: it was admitted once, and its output has begun.",
    )
    beam_reparent_prob: float = Field(
        0.15,
        ge=0,
        le=1,
        description="Beam search, q: at each decode step each beam independently falls out of the top "
        "beam_width with probability q and is replaced by a fork of a surviving beam (1/q: the mean "
        "steps a beam's own line of tokens survives). Several beams can be replaced in one step. Default: "
        "the single q that best fits the vLLM paper's Fig. 15 beam-search savings (kvsim validate vllm-fig15-sharing).",
    )
    step_mode: Literal["skip", "single"] = Field(
        "skip", description="skip: jump over decode iterations between events; single: one at a time."
    )
    client_overhead_s: float | None = Field(
        None,
        ge=0,
        description="Seconds outside the engine in every request's TTFT and E2E (HTTP, the API server, "
        "tokenization, streaming), as a benchmark client measures them; it delays nothing in the "
        "simulation. Default: the cost model's fitted request_overhead_s (derated: from measured "
        "client-side vLLM runs; other cost models: 0). 0: engine-side latencies.",
    )
    async_scheduling: bool = Field(
        True,
        description="scheduler vllm: vLLM's --async-scheduling (on by default since vLLM 0.14, where "
        "the engine core schedules one step ahead of the GPU, step_with_batch_queue): iteration k+1 is "
        "scheduled while iteration k runs, so a request that arrives during iteration k is first "
        "scheduled in iteration k+2, one iteration later than without it, unless nothing was running.",
    )
    scheduler: Literal["vllm", "sglang"] = Field(
        "vllm",
        description="Whose scheduler runs the engine. vllm: FCFS, prompts admitted while the pool holds "
        "them, the newest request preempted when a sequence cannot grow (max_num_batched_tokens, "
        "enable_chunked_prefill, watermark). sglang: SGLang's (sim/engine/schedulers/sglang.py): the "
        "queue ordered by schedule_policy, admission against PrefillAdder's token budget with its "
        "new_token_ratio estimate of future decode tokens, chunked_prefill_size / max_prefill_tokens, "
        "and retract_decode's order when decode runs out of memory; best with policy radix.",
    )
    schedule_policy: Literal["fcfs", "lpm"] = Field(
        "fcfs",
        description="scheduler sglang: the waiting queue's order. fcfs: arrival order; lpm: longest "
        "prefix match first (every waiting prompt matched in the cache each round), a request that "
        "hits at most 32 cached tokens but shares 32 or more with one ahead of it held back to the "
        "end (in-batch prefix caching: in_batch_prefix_check_tokens, "
        "in_batch_prefix_deprioritize_tokens), FCFS while more than 128 wait "
        "(SchedulePolicy._determine_active_policy) or without a prefix cache. SGLang's default is "
        "fcfs (server_args.py schedule_policy).",
    )
    in_batch_prefix_check_tokens: int = Field(
        32,
        ge=0,
        description="scheduler sglang, schedule_policy lpm: in-batch prefix caching checks a waiting "
        "request against the requests ahead of it only when its cache hit is at most this many tokens "
        "(SGLang's IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD environment variable, 32 by default).",
    )
    in_batch_prefix_deprioritize_tokens: int = Field(
        32,
        ge=1,
        description="scheduler sglang, schedule_policy lpm: such a request is held back to the queue's "
        "end for the round when it shares at least this many leading tokens with a request ahead of "
        "it that was not held back (IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD, 32 by default).",
    )
    schedule_conservativeness: float = Field(
        1.0,
        ge=0,
        description="scheduler sglang: scales new_token_ratio, the fraction of their remaining output "
        "tokens admission reserves for running requests: it starts at min(0.7 x this, 1), decays each "
        "decode step to 0.14 x its start over 600 steps, and is reset after a retraction "
        "(SGLANG_INIT_NEW_TOKEN_RATIO, SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR, "
        "SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS in environ.py; Scheduler.init_new_token_ratio). SGLang's "
        "default: 1.0 (server_args.py).",
    )
    chunked_prefill_size: int | None = Field(
        None,
        description="scheduler sglang: most prompt tokens one iteration prefills (decode tokens "
        "included when enable_mixed_chunk mixes them in); -1: no chunking (a prompt goes in whole). "
        "Default: SGLang's by GPU memory (server_args.py, "
        "ServerArgs._handle_gpu_memory_settings): 2048 below 35 GB, 8192 below 160 GB, else 16384.",
    )
    max_prefill_tokens: int = Field(
        16384,
        gt=0,
        description="scheduler sglang: prompt tokens admitted in one iteration; the first admission "
        "may exceed it (PrefillAdder.rem_input_tokens). SGLang's default: 16384 (server_args.py).",
    )
    enable_mixed_chunk: bool = Field(
        False,
        description="scheduler sglang: SGLang's --enable-mixed-chunk. Off (SGLang's default): prefill "
        "batches go first (Scheduler.get_next_batch_to_run): an iteration that prefills anything, a "
        "prompt in progress or an admission, decodes nothing, and the running requests decode only "
        "when nothing can be prefilled. On: they decode in the same iteration, their tokens taken "
        "out of chunked_prefill_size and max_prefill_tokens.",
    )
    speculative: SpeculativeConfig | None = Field(
        None,
        description="Speculative decoding (vLLM's speculative_config): drafts per step, their "
        "acceptance, the draft's weights, KV and time (docs/speculative.md). scheduler vllm only.",
    )
    allow_long_max_model_len: bool = Field(
        False,
        description="Accept a max_model_len beyond the model's context length (vLLM's "
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1); refused otherwise, as vLLM does.",
    )

    @field_validator("chunked_prefill_size")
    @classmethod
    def _chunk_or_off(cls, value: int | None) -> int | None:
        if value is not None and value != -1 and value <= 0:
            raise ValueError(
                f"chunked_prefill_size must be a positive number of tokens, or -1 (no chunking), not {value}"
            )
        return value

    @model_validator(mode="after")
    def _sglang_keys_need_sglang(self) -> EngineConfig:
        # vLLM's scheduler has no use for them: left set, they would change nothing, silently
        changed = [
            f"{name}: {getattr(self, name)!r}"
            for name, default in SGLANG_ONLY_DEFAULTS.items()
            if getattr(self, name) != default
        ]
        if self.scheduler == "vllm" and changed:
            raise ValueError(
                f"{', '.join(changed)}: SGLang's scheduler settings, which engine.scheduler vllm ignores; "
                "set engine.scheduler: sglang, or leave them out"
            )
        return self

    @model_validator(mode="after")
    def _in_batch_keys_need_lpm(self) -> EngineConfig:
        # Only lpm orders the queue by prefix; under fcfs they would change nothing, silently.
        changed = [
            f"{name}: {getattr(self, name)!r}"
            for name in ("in_batch_prefix_check_tokens", "in_batch_prefix_deprioritize_tokens")
            if getattr(self, name) != SGLANG_ONLY_DEFAULTS[name]
        ]
        if self.scheduler == "sglang" and self.schedule_policy != "lpm" and changed:
            raise ValueError(
                f"{', '.join(changed)}: in-batch prefix caching runs under schedule_policy lpm only "
                f"(schedule_policy is {self.schedule_policy!r}); set schedule_policy: lpm, or leave them out"
            )
        return self

    @model_validator(mode="after")
    def _speculation_needs_vllm(self) -> EngineConfig:
        if self.speculative is not None and self.scheduler != "vllm":
            raise ValueError(
                "speculative: modelled with engine.scheduler vllm only (SGLang's EAGLE worker allocates "
                "and frees draft slots per step, not modelled); set engine.scheduler: vllm"
            )
        return self

    @model_validator(mode="after")
    def _sglang_has_no_swap(self) -> EngineConfig:
        if self.scheduler == "sglang" and self.preemption_mode == "swap":
            raise ValueError(
                "scheduler sglang retracts requests and recomputes them (retract_decode); "
                "preemption_mode swap is vLLM V0's: use preemption_mode recompute"
            )
        return self


SGLANG_ONLY_DEFAULTS: dict[str, Any] = {
    "schedule_policy": "fcfs",
    "in_batch_prefix_check_tokens": 32,
    "in_batch_prefix_deprioritize_tokens": 32,
    "schedule_conservativeness": 1.0,
    "chunked_prefill_size": None,
    "max_prefill_tokens": 16384,
    "enable_mixed_chunk": False,
}
"""The engine keys only SGLang's scheduler reads, with their defaults (anything else is refused under
engine.scheduler vllm)."""

ROUTERS = ("round_robin", "least_requests", "vllm_dp", "least_kv", "session_affinity", "prefix_aware")
DATA_PARALLEL_ROUTER = "vllm_dp"
"""How a data-parallel server spreads requests over its ranks (``engine.data_parallel_size``)."""


def known_router(value: str) -> str:
    if value not in ROUTERS:
        raise ValueError(
            f"unknown router {value!r}{did_you_mean(value, list(ROUTERS))} (valid: {', '.join(ROUTERS)})"
        )
    return value


class PoolConfig(_Strict):
    """One pool of a disaggregated cluster: its replicas, their GPU, engine knobs, policy and router."""

    replicas: int = Field(
        1,
        gt=0,
        le=MOST_INSTANCES,
        description="Replicas in this pool, each with its own GPU(s) (tensor_parallel_size each).",
    )
    gpu: str | dict[str, Any] | None = Field(
        None, description="This pool's GPU (a preset name or custom values). Default: the experiment's `gpu`."
    )
    engine: dict[str, Any] = Field(
        default_factory=dict,
        description="Overrides of the engine section for this pool's replicas (after the variant's), "
        "e.g. tensor_parallel_size, max_num_batched_tokens.",
    )
    policy: str | None = Field(None, description="This pool's policy. Default: the variant's.")
    options: dict[str, Any] | None = Field(
        None, description="This pool's policy options. Default: the variant's."
    )
    router: str = Field(
        "least_requests", description="Which replica of this pool a request goes to (as cluster.router)."
    )

    @field_validator("engine")
    @classmethod
    def _known_engine_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _known_keys(value, EngineConfig, "engine")

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str | None) -> str | None:
        if value is not None and value not in known_policies():
            raise ValueError(f"unknown policy {value!r}{did_you_mean(value, known_policies())}")
        return value

    @field_validator("router")
    @classmethod
    def _known_router(cls, value: str) -> str:
        return known_router(value)


LINK_KINDS = ("nvlink", "rdma", "pcie", "custom")


class LinkConfig(_Strict):
    """The link prefill replicas send KV over (``sim/cluster/link.py``)."""

    kind: Literal["nvlink", "rdma", "pcie", "custom"] = Field(
        "rdma",
        description="nvlink: the prefill GPU's NVLink, one direction (half its datasheet figure); pcie: its "
        "PCIe link, one direction; rdma: a 400 Gb/s NIC per GPU (50 GB/s, as a DGX H100's ConnectX-7); "
        "custom: bandwidth_gb_per_s and latency_s given.",
    )
    bandwidth_gb_per_s: float | None = Field(
        None,
        gt=0,
        description="Per GPU, one direction, in 10**9 B/s (replaces the kind's). Required for custom.",
    )
    latency_s: float | None = Field(
        None,
        ge=0,
        description="Fixed time per transfer before its bytes flow (setup, notification). Default: 10 us for "
        "nvlink and pcie, 20 us for rdma (assumed, not measured). Required for custom.",
    )
    shared_by: Literal["pair", "prefill", "decode", "fabric"] = Field(
        "prefill",
        description="Which transfers share one pipe's bandwidth (fairly, processor sharing): pair (each prefill "
        "replica to each decode replica its own), prefill (each prefill replica's NICs: all it sends), decode "
        "(all a decode replica receives), fabric (every transfer of the cluster).",
    )

    @model_validator(mode="after")
    def _custom_has_numbers(self) -> LinkConfig:
        if self.kind == "custom" and (self.bandwidth_gb_per_s is None or self.latency_s is None):
            missing = [name for name in ("bandwidth_gb_per_s", "latency_s") if getattr(self, name) is None]
            raise ValueError(f"a custom link needs {' and '.join(missing)}")
        return self


class DeciderConfig(_Strict):
    """Which requests are disaggregated (llm-d's and BLIS's prefill deciders)."""

    mode: Literal["always", "prefix_threshold"] = Field(
        "always",
        description="always: every request is prefilled in the prefill pool; prefix_threshold: only when "
        "the prompt tokens its decode replica does not hold cached exceed threshold_tokens (else the "
        "decode replica prefills it itself), as llm-d's pd-profile-handler.",
    )
    threshold_tokens: int = Field(
        0,
        ge=0,
        description="prefix_threshold: uncached prompt tokens above which a request is disaggregated.",
    )


class DisaggregationConfig(_Strict):
    """Prefill and decode on separate replicas, each request's KV sent between them."""

    prefill: PoolConfig = Field(description="The prefill pool: computes prompts and sends their KV.")
    decode: PoolConfig = Field(description="The decode pool: receives the KV and generates the output.")
    link: LinkConfig = Field(default_factory=LinkConfig, description="The KV transfer link.")  # type: ignore[arg-type]
    decider: DeciderConfig = Field(
        default_factory=DeciderConfig,  # type: ignore[arg-type]
        description="Which requests go through the prefill pool.",
    )


class ClusterConfig(_Strict):
    """Replicas of the engine behind a router, all simulated on one clock (``sim/cluster/``)."""

    replicas: int = Field(
        1,
        gt=0,
        le=MOST_INSTANCES,
        description="Engine replicas, each with its own GPU(s), KV pool and policy instance.",
    )
    router: str = Field(
        "round_robin",
        description="Which replica each arriving request goes to: round_robin, least_requests (fewest "
        "running + waiting), vllm_dp (lowest 4 x waiting + running: vLLM's data-parallel balancer), least_kv (most free KV slots), session_affinity (a conversation stays on "
        "the replica its first request went to; new sessions go to least_requests' choice), "
        "prefix_aware (score = prefix_weight x cached fraction of the prompt, host-tier tokens "
        "weighted host_weight, + load_weight x "
        "load score, as llm-d's scorers).",
    )
    prefix_weight: float = Field(
        3.0,
        ge=0,
        description="prefix_aware: weight of the prefix score (the fraction of the prompt the replica's "
        "cache would serve, 0-1); llm-d's default profile weighs its prefix-cache scorer 3.",
    )
    load_weight: float = Field(
        2.0,
        ge=0,
        description="prefix_aware: weight of the load score ((max - load) / (max - min) over replicas "
        "of running + waiting requests; 1 when all are equal); llm-d's default weighs its queue scorer 2.",
    )
    host_weight: float = Field(
        0.8,
        ge=0,
        le=1,
        description="prefix_aware: what a prompt token held in the replica's host-memory tier (offload:) "
        "counts in the prefix score, against 1 for a token in its GPU cache (loading it back costs a "
        "transfer); llm-d's KV-block index weighs its CPU tier 0.8.",
    )

    disaggregation: DisaggregationConfig | None = Field(
        None,
        description="Disaggregated prefill and decode: two pools and a KV link (``sim/cluster/disaggregated.py``); "
        "replicas and router are then each pool's.",
    )

    @model_validator(mode="after")
    def _pools_or_replicas(self) -> ClusterConfig:
        if self.disaggregation is not None:
            given = sorted({"replicas", "router"} & self.model_fields_set)
            if given:
                raise ValueError(
                    f"{' and '.join(given)} do not apply with disaggregation: each pool has its own "
                    "(disaggregation.prefill / disaggregation.decode)"
                )
        return self

    @model_validator(mode="after")
    def _some_weight(self) -> ClusterConfig:
        if self.prefix_weight == 0 and self.load_weight == 0:
            raise ValueError(
                "prefix_weight and load_weight are both 0: every replica would score the same; "
                "give at least one a positive weight"
            )
        return self

    @field_validator("router")
    @classmethod
    def _known_router(cls, value: str) -> str:
        return known_router(value)


class VariantConfig(_Strict):
    """One policy run on the experiment's request stream."""

    name: str = Field(description="The variant's folder and label (letters, digits, -, _, .).")
    policy: str = Field(
        description="A policy name (see `kvsim policies`): contiguous, paged, prefix, radix; or a hybrid "
        "allocator for models with sliding-window, chunked-local or Mamba layers: vllm-hybrid, "
        "sglang-hybrid (sliding-window and full-attention layers; SGLang's SWA radix cache with "
        "enable_prefix_caching: true), jenga (large pages of the LCM of the layer types' pages)."
    )
    options: dict[str, Any] = Field(default_factory=dict, description="Policy options, e.g. reservation.")
    engine: dict[str, Any] = Field(default_factory=dict, description="Overrides of the engine section.")
    pin_shared_prefixes: bool = Field(
        False,
        description="Warm-up: pin the workload's shared system prompts in the prefix cache before the run "
        "(never evicted; prefix policy only).",
    )
    offload: OffloadConfig | Literal[False] | None = Field(
        None,
        description="This variant's host-memory tier: replaces the experiment's `offload:` section; "
        "`false`: none. Default: the experiment's.",
    )
    cluster: dict[str, Any] = Field(
        default_factory=dict, description="Overrides of the cluster section (e.g. another router)."
    )

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        check_slug(value, "variant name")
        if value.casefold() in RESERVED_VARIANT_NAMES:
            raise ValueError(
                f"reserved variant name: a results folder holds {', '.join(RUN_FOLDER_ENTRIES)} beside "
                "the variant folders"
            )
        return value

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        if value not in known_policies():
            raise ValueError(f"unknown policy {value!r}{did_you_mean(value, known_policies())}")
        return value

    @field_validator("engine")
    @classmethod
    def _known_engine_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _known_keys(value, EngineConfig, "engine")

    @field_validator("cluster")
    @classmethod
    def _known_cluster_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _known_keys(value, ClusterConfig, "cluster")


def _known_keys(overrides: dict[str, Any], section: type[BaseModel], name: str) -> dict[str, Any]:
    """A variant's overrides of a section, checked key by key against the section's fields."""
    for key in overrides:
        if key not in section.model_fields:
            raise ValueError(f"unknown {name} key {key!r}{did_you_mean(key, list(section.model_fields))}")
    return overrides


class OutputConfig(_Strict):
    """What a run writes besides the summaries."""

    timeseries_format: Literal["parquet", "csv"] = Field(
        "parquet", description="File format of each variant's timeseries and requests tables."
    )
    figures: bool = Field(True, description="Write the PNG figures into figures/.")


class ExperimentConfig(_Strict):
    name: str = Field(description="Also the default results folder name (letters, digits, -, _, .).")
    description: str = Field("", description="Free text, kept in the results' config.yaml.")
    seed: int = Field(0, ge=0, description="Seed of every random draw (workload, beams).")
    model: str = Field(
        description="A preset name (see `kvsim models`) or a path to a HuggingFace config.json.",
        json_schema_extra={FILE_FIELD: [".json"]},
    )
    gpu: str | dict[str, Any] = Field(description="A GPU preset name or custom values.")
    engine: EngineConfig = Field(
        default_factory=EngineConfig,  # type: ignore[arg-type]
        description="Engine and memory knobs shared by every variant (vLLM engine-argument names).",
    )
    cost_model: CostModelConfig | str = Field(
        "derated",
        description="Iteration times: derated (roofline with GPU efficiency factors), analytic (plain "
        "roofline) or a calibrated profile.",
        json_schema_extra={FILE_FIELD: [".yaml", ".yml"]},  # the shorthand for {profile: PATH}
    )
    workload: WorkloadConfig = Field(description="The request stream: synthetic, or replayed from a trace.")
    variants: list[VariantConfig] = Field(
        min_length=1, description="Policies to compare, each replayed on the identical request stream."
    )
    offload: OffloadConfig | None = Field(
        None,
        description="Host-memory tier for cached blocks the GPU evicts (prefix policy); default: none. "
        "A variant's `offload:` replaces it. In a cluster, every replica has a tier of this size.",
    )
    cluster: ClusterConfig | None = Field(
        None,
        description="Several replicas behind a router (omitted: one engine, the single-GPU run).",
    )
    until_s: float | None = Field(None, gt=0, description="Stop the simulation at this time (seconds).")
    output: OutputConfig = Field(default_factory=OutputConfig, description="Output formats.")  # type: ignore[arg-type]

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        return check_slug(value, "experiment name")

    @field_validator("variants")
    @classmethod
    def _unique_variant_names(cls, variants: list[VariantConfig]) -> list[VariantConfig]:
        # Names become folders, and two names that differ only in case are one folder on macOS/Windows.
        first: dict[str, int] = {}
        for index, variant in enumerate(variants):
            earlier = first.setdefault(variant.name.casefold(), index)
            if earlier != index:
                raise ValueError(
                    f"variants.{index}.name {variant.name!r} repeats variants.{earlier}.name "
                    f"{variants[earlier].name!r}; variant names must be unique (ignoring case)"
                )
        return variants

    def offload_for(self, variant: VariantConfig) -> OffloadConfig | None:
        """The variant's host tier: its own ``offload:``, else the experiment's (``false``: none)."""
        if variant.offload is None:
            return self.offload
        return variant.offload or None

    def engine_for(self, variant: VariantConfig) -> EngineConfig:
        """The experiment's engine section with the variant's overrides (validated when loading)."""
        return self._section_for(variant, EngineConfig, self.engine.model_dump(), "engine")

    def cluster_for(self, variant: VariantConfig) -> ClusterConfig | None:
        """The experiment's cluster section with the variant's overrides; None: a single engine."""
        if self.cluster is None and not variant.cluster:
            return None
        # (Only the keys given: the disaggregation check tells given keys from defaults.)
        base = self.cluster.model_dump(exclude_unset=True) if self.cluster is not None else {}
        return self._section_for(variant, ClusterConfig, base, "cluster")

    def _section_for(
        self, variant: VariantConfig, model: type[_Section], base: dict[str, Any], key: str
    ) -> _Section:
        """A section merged with the variant's overrides of it; errors name the variant's keys."""
        overrides = getattr(variant, key)
        try:
            return model.model_validate(base | overrides)
        except ValidationError as error:
            index = self.variants.index(variant)
            problems = [_prefixed(problem, ("variants", index, key)) for problem in error.errors()]
            data = {"variants": {index: {key: overrides}}}
            raise ConfigError(_format_problems(problems, f"variant {variant.name!r}", data)) from None


# --------------------------------------------------------------------------------------------------
# Loading, overrides and readable errors
# --------------------------------------------------------------------------------------------------


def load_experiment(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read, override (``key.path=value``) and validate an experiment YAML."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    data = name_from_file(yaml_mapping(path), path)
    apply_overrides(data, overrides or [])
    try:
        return validate_experiment(data, path)
    except ConfigError as error:
        raise ConfigError(with_override_notes(str(error), overrides or [])) from None


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> None:
    """Every ``--set KEY.PATH=VALUE`` of the command line, in order (a later one wins): the one
    place ``kvsim run``, ``kvsim sweep`` and ``kvsim plan`` parse and apply them, so that they
    accept the same syntax and fail with the same words."""
    for override in overrides:
        apply_override(data, override)


def with_override_notes(message: str, overrides: list[str]) -> str:
    """``message`` plus, for each key it names that came from the command line, where it came from
    (the file does not hold that value)."""
    named = [line.strip().partition(": ")[0] for line in message.splitlines() if line.startswith("  ")]
    notes = [
        f"  ({override.partition('=')[0]} came from --set {override}, not from the file)"
        for override in overrides
        if any(_same_branch(override.partition("=")[0], key) for key in named)
    ]
    return "\n".join([message, *notes])


def _same_branch(set_key: str, problem_key: str) -> bool:
    """Whether a problem at ``problem_key`` can come from ``--set set_key=...``: the same key, a key
    inside the value it set (``engine={block_size: 0}``), or the section around it (a union's error
    names ``workload.arrival`` for ``workload.arrival.kind=bogus``)."""
    shorter, longer = sorted((set_key, problem_key), key=len)
    return longer == shorter or longer.startswith(shorter + ".")


def yaml_mapping(path: Path) -> dict[str, Any]:
    """A YAML file's top-level mapping; unreadable, non-UTF-8 or malformed files are a ConfigError."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {error.object[error.start]:#04x} at offset {error.start}); "
            "save the file as UTF-8"
        ) from None
    except OSError as error:
        raise ConfigError(f"{path}: cannot read: {error.strerror}") from None
    try:
        data, repeated = load_yaml(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} malformed YAML: {getattr(error, 'problem', error)}") from None
    _warn_of_repeated_keys(path, text, repeated)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, got {type(data).__name__}")
    return data


_WARNED_REPEATS: set[tuple[str, str]] = set()
"""Files (path and text) whose repeated keys were warned of: commands read a file more than once."""


def _warn_of_repeated_keys(path: Path, text: str, repeated: list[RepeatedKey]) -> None:
    """YAML keeps the last of a mapping's repeated keys, and earlier kvsim read such files: a warning,
    not an error, once per file and content in a process."""
    if not repeated or (str(path), text) in _WARNED_REPEATS:
        return
    _WARNED_REPEATS.add((str(path), text))
    for item in repeated:
        warnings.warn(
            f"{path}: line {item.repeated_line}: key {item.key!r} repeats the one at line "
            f"{item.first_line} of the same mapping; only the value at line {item.repeated_line} is used",
            ConfigWarning,
            stacklevel=3,
        )


def validate_experiment(data: dict[str, Any], path: str | Path = "<config>") -> ExperimentConfig:
    """Validate the whole config, each variant's merged engine section included, so that every
    problem is reported at once and before anything runs."""
    try:
        config = ExperimentConfig.model_validate(data)
    except ValidationError as error:
        raise ConfigError(format_validation_error(error, path, data)) from None
    problems = []
    cluster = config.cluster.model_dump(exclude_unset=True) if config.cluster is not None else {}
    for index, variant in enumerate(config.variants):
        for key, model, base in (
            ("engine", EngineConfig, config.engine.model_dump()),
            ("cluster", ClusterConfig, cluster),
        ):
            try:
                model.model_validate(base | getattr(variant, key))
            except ValidationError as error:
                problems += [_prefixed(problem, ("variants", index, key)) for problem in error.errors()]
    if problems:
        raise ConfigError(_format_problems(problems, path, data))
    _warn_of_foreign_policies(config, path)
    return config


class ConfigWarning(UserWarning):
    """A config runs, but not as the user may think."""


SGLANG_FOREIGN_POLICIES = {
    "contiguous": "SGLang has no contiguous preallocation",
    "paged": "SGLang without a prefix cache (--disable-radix-cache) is the nearest",
}


def _warn_of_foreign_policies(config: ExperimentConfig, path: str | Path) -> None:
    """SGLang's scheduler (admission by new_token_ratio, retraction) was built around its radix cache."""
    for variant in config.variants:
        scheduler = variant.engine.get("scheduler", config.engine.scheduler)
        why = SGLANG_FOREIGN_POLICIES.get(variant.policy)
        if scheduler == "sglang" and why is not None:
            warnings.warn(
                f"{path}: variant {variant.name}: engine.scheduler sglang runs policy {variant.policy}, "
                f"which SGLang's scheduler was not built for ({why}); policy radix is SGLang's own",
                ConfigWarning,
                stacklevel=2,
            )


def apply_override(data: dict[str, Any], override: str) -> None:
    """``engine.block_size=32`` or ``variants.0.policy=paged``; the value is parsed as YAML. Errors
    name the ``--set`` item, not the file: the key path may run through an earlier item's value."""
    key_path, sep, raw_value = override.partition("=")
    if not sep or not key_path or "" in key_path.split("."):
        raise ConfigError(f"--set {override!r}: expected KEY.PATH=VALUE (keys joined by '.')")
    keys = key_path.split(".")
    try:
        value = yaml.safe_load(raw_value)
    except yaml.YAMLError as error:
        raise ConfigError(
            f"--set {override!r}: the value {raw_value!r} is not valid YAML "
            f"({getattr(error, 'problem', None) or 'malformed'}); quote it if it is a string"
        ) from None
    node: Any = data
    for depth, key in enumerate(keys):
        where = ".".join(keys[:depth]) or "the top level"
        last = depth == len(keys) - 1
        if isinstance(node, list):
            index = _list_index(key, node, where, override)
            if last:
                node[index] = value
            else:
                node = node[index]
        elif isinstance(node, dict):
            if last:
                node[key] = value
            else:
                node = node.setdefault(key, {})
        else:
            raise ConfigError(
                f"--set {override!r}: {where} is {node!r}, not a mapping or list, so it has no key {key!r}"
            )


def _list_index(key: str, node: list[Any], where: str, override: str) -> int:
    if not key.isdigit():
        raise ConfigError(f"--set {override!r}: {where} is a list; {key!r} must be an index (0, 1, ...)")
    if int(key) >= len(node):
        raise ConfigError(
            f"--set {override!r}: {where} has {len(node)} entries (indexes 0 to {len(node) - 1}), "
            f"so there is no entry {key}"
        )
    return int(key)


def format_validation_error(error: ValidationError, path: str | Path, data: Any) -> str:
    return _format_problems(error.errors(), path, data)


def _prefixed(problem: Any, prefix: tuple[Any, ...]) -> Any:
    return {**problem, "loc": (*prefix, *problem["loc"])}


def _format_problems(problems: list[Any], path: str | Path, data: Any) -> str:
    return format_problems(
        f"{path}: invalid experiment config",
        problems,
        location=lambda problem: data_path(
            problem["loc"], data, keep_last=problem["type"] in ("extra_forbidden", "missing")
        ),
        known_keys_at=lambda location: _known_keys_at(data, location),
        quiet_values=(dict, list),
    )


def format_problems(
    heading: str,
    problems: Sequence[Mapping[str, Any]],
    location: Callable[[Mapping[str, Any]], list[Any]],
    known_keys_at: Callable[[list[Any]], list[str]] | None = None,
    key_prefix: str = "",
    quiet_values: tuple[type, ...] = (dict,),
) -> str:
    """kvsim's report of pydantic problems, one line each: the key path (``location`` turns pydantic's
    location into the user's keys), what is wrong and the value given (not for ``quiet_values``);
    an unknown key gets the nearest of ``known_keys_at(where it stands)``."""
    located = _without_mismatched_union_members([(problem, location(problem)) for problem in problems])
    lines = [f"{heading} ({len(located)} problem(s))"]
    for problem, keys in located:
        key_path = key_prefix + ".".join(str(part) for part in keys) or "(top level)"
        # pydantic prefixes the messages of our own validators with "Value error, ".
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            known = known_keys_at(keys[:-1]) if known_keys_at is not None else []
            message = f"unknown key{did_you_mean(str(keys[-1]), known)}"
        elif problem["type"] == "missing":
            message = "required key is missing"
        value = problem.get("input")
        quiet = problem["type"] == "missing" or isinstance(value, quiet_values)
        shown = "" if quiet else f" (got {value!r})"
        if problem["type"] == "string_type" and isinstance(value, bool):
            shown += "; YAML reads off/on/no/yes/true/false as booleans: quote the value ('off')"
        lines.append(f"  {key_path}: {message}{shown}")
    return "\n".join(lines)


_CONTAINER_TYPES = ("dict_type", "list_type", "model_type", "model_attributes_type", "tuple_type")


def _without_mismatched_union_members(
    located: list[tuple[Mapping[str, Any], list[Any]]],
) -> list[tuple[Mapping[str, Any], list[Any]]]:
    """Drop what a union's scalar members say about a mapping or list (``Input should be a valid
    integer`` beside ``low=500 is above high=100`` for ``prompt_len: {kind: uniform, ...}``): the
    user wrote the mapping for the member whose own problem is also listed at that key or below."""

    def mismatched(problem: Mapping[str, Any]) -> bool:
        kind = str(problem["type"])
        scalar = kind.endswith(("_type", "_parsing")) or kind in ("literal_error", "none_required")
        return scalar and kind not in _CONTAINER_TYPES and isinstance(problem.get("input"), dict | list)

    def explained(index: int, keys: list[Any]) -> bool:
        return any(
            other_keys[: len(keys)] == keys and not mismatched(other)
            for other_index, (other, other_keys) in enumerate(located)
            if other_index != index
        )

    return [
        (problem, keys)
        for index, (problem, keys) in enumerate(located)
        if not (mismatched(problem) and explained(index, keys))
    ]


def data_path(loc: tuple[Any, ...], data: Any, *, keep_last: bool) -> list[Any]:
    """pydantic's error location without the union tags it inserts (``synthetic``, ``poisson``...):
    only the parts that index into the user's YAML are kept (plus the unknown or missing key)."""
    path: list[Any] = []
    node = data
    for position, part in enumerate(loc):
        indexes_node = (isinstance(node, dict) and part in node) or (
            isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        )
        if indexes_node:
            path.append(part)
            node = node[part]
        elif keep_last and position == len(loc) - 1:
            path.append(part)
    return path


def _known_keys_at(data: Any, location: list[Any]) -> list[str]:
    """Field names valid at ``location``, found by walking the models along the key path (for a
    union, the member whose fields best match the user's keys there)."""
    model: Any = ExperimentConfig
    node = data
    for part in location:
        node = node[part] if isinstance(node, dict | list) else None
        if isinstance(part, int):
            continue
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        model = _best_model(models_in(field.annotation), node)
        if model is None:
            return []
    return list(getattr(model, "model_fields", {}))


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models a field's annotation names (itself, or the members of a union or list)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for argument in getattr(annotation, "__args__", ()) for model in models_in(argument)]


def _best_model(models: list[type[BaseModel]], node: Any) -> type[BaseModel] | None:
    if not models:
        return None
    keys = set(node) if isinstance(node, dict) else set()
    kind = node.get("kind") if isinstance(node, dict) else None

    def score(model: type[BaseModel]) -> tuple[int, int]:
        kind_field = model.model_fields.get("kind")
        kind_matches = kind_field is not None and kind in getattr(kind_field.annotation, "__args__", ())
        return int(kind_matches), len(keys & set(model.model_fields))

    return max(models, key=score)


def did_you_mean(name: str, candidates: list[str]) -> str:
    """``; did you mean 'x'?`` for the closest candidate, else the valid ones (nothing when none)."""
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.5)
    return (
        f"; did you mean {close[0]!r}?"
        if close
        else (f"; valid: {', '.join(sorted(candidates))}" if candidates else "")
    )
