"""Plan files: models x GPUs x candidates, SLOs, a target rate, and how to search each candidate's
maximum sustainable rate. Expanded into :class:`Candidate` objects whose probe configs are all
validated before anything runs.

    name: llama31-8b-chat
    models: [Llama-3.1-8B]
    gpus:
      - {gpu: A100-80GB, price_per_hour: 1.8}
      - H100-80GB
    engine: {max_model_len: 8192}
    workload: {...}                     # an experiment's workload; the search sets its rate
    slos: {ttft_p99_s: 2.0, tpot_p50_s: 0.05}
    target_rate_per_s: 50
    candidates:
      policies: [{name: paged, policy: paged}, {name: prefix, policy: prefix}]
      block_sizes: [16, 32]
      engine: {max_num_seqs: [128, 256]}   # optional: more engine knobs to cross
      cluster: {replicas: [1, 2], router: [round_robin, prefix_aware]}   # optional: simulated clusters
    search: {start_rate_per_s: 2, seeds: [1, 2, 3], min_requests: 800}
"""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, ValidationError, model_validator

from sim.config import (
    ClusterConfig,
    ConfigError,
    DisaggregationConfig,
    EngineConfig,
    ExperimentConfig,
    VariantConfig,
    did_you_mean,
    validate_experiment,
)
from sim.costs.core import one_line_problems
from sim.hardware.capacity import KVCapacity, ModelDoesNotFitError
from sim.hardware.gpus import resolve_gpu
from sim.hardware.models import resolve_model
from sim.planning.schema import Strict, read_yaml_mapping, set_key_path, validate_file
from sim.planning.sweeps.early_stop import StopRules
from sim.planning.sweeps.preflight import preflight
from sim.planning.sweeps.spec import point_id, shown
from sim.planning.sweeps.steady import SteadyWindow
from sim.planning.sweeps.tasks import PointTask
from sim.runner import engine_pool
from sim.storage.folders import config_hash

_Section = TypeVar("_Section", EngineConfig, ClusterConfig)


class GpuChoice(Strict):
    gpu: str | dict[str, Any] = Field(description="A GPU preset name or custom values (as an experiment's).")
    name: str | None = Field(None, description="Label in the report (default: the preset name).")
    price_per_hour: PositiveFloat | None = Field(None, description="Price of one GPU-hour, in dollars.")
    cost_model: str | dict[str, Any] | None = Field(
        None, description="Cost model for this GPU (default: the plan's), e.g. a measured profile."
    )

    def label(self) -> str:
        if self.name:
            return self.name
        return self.gpu if isinstance(self.gpu, str) else str(self.gpu.get("name") or self.gpu.get("base"))


KNOB_WORDS = {"engine": "engine knob", "cluster": "cluster key"}


class CandidateGrid(Strict):
    policies: list[VariantConfig] = Field(min_length=1, description="Variants: name, policy, options.")
    block_sizes: list[PositiveInt] = Field(default_factory=list, description="Default: the engine's.")
    engine: dict[str, list[Any]] = Field(
        default_factory=dict, description="More engine knobs to cross, e.g. max_num_seqs: [128, 256]."
    )
    cluster: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="Cluster keys to cross, e.g. replicas: [1, 2, 4], router: [round_robin, prefix_aware]: "
        "each candidate is then the whole cluster, simulated at the full rate.",
    )
    disaggregation: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Disaggregated deployments to compare beside the others, each a `cluster.disaggregation` "
        "section (prefill and decode pools, link, decider), e.g. {prefill: {replicas: 2}, decode: {replicas: 1}}: "
        "one candidate per entry (per GPU, policy, block size and engine knob), simulated whole at the full "
        "rate; its GPUs are prefill replicas x TP + decode replicas x TP. A pool's `gpu` names one of `gpus` "
        "(by its name): that GPU and its price; default: the candidate's GPU.",
    )

    @model_validator(mode="after")
    def _known_knobs(self) -> CandidateGrid:
        for section, known in (
            ("engine", EngineConfig.model_fields),
            ("cluster", ClusterConfig.model_fields),
        ):
            for key, values in getattr(self, section).items():
                if key not in known:
                    raise ValueError(
                        f"candidates.{section}.{key}: unknown {KNOB_WORDS[section]}"
                        f"{did_you_mean(key, list(known))}"
                    )
                if not values:
                    raise ValueError(f"candidates.{section}.{key}: empty list of values")
        if "disaggregation" in self.cluster:
            raise ValueError(
                "candidates.cluster.disaggregation: list disaggregated deployments in candidates.disaggregation"
            )
        for index, entry in enumerate(self.disaggregation):
            try:
                DisaggregationConfig.model_validate(entry)
            except ValidationError as error:
                problems = one_line_problems(error, top_level="", key_prefix="", show_input=True)
                raise ValueError(f"candidates.disaggregation.{index}: {problems}") from None
        return self


FILL_MARGIN = 1.1


class Goodput(Strict):
    """DistServe's goodput SLO: the share of requests that meet both their own TTFT and TPOT targets
    (SLO attainment) must be at least ``min_attainment``. A request that did not finish in the window
    (rejected, failed, still running) misses."""

    ttft_s: PositiveFloat | None = Field(None, description="Each request's TTFT target.")
    tpot_s: PositiveFloat | None = Field(None, description="Each request's TPOT target.")
    min_attainment: float = Field(0.9, gt=0, le=1, description="Share of requests meeting their targets.")

    @model_validator(mode="after")
    def _a_target(self) -> Goodput:
        if self.ttft_s is None and self.tpot_s is None:
            raise ValueError("goodput: give ttft_s, tpot_s or both")
        return self


class SLOs(Strict):
    """Service-level objectives a rate must meet, on the steady-state window of every seed.
    ``max_queue_growth_frac`` is always checked: without it a plan with only a TPOT SLO would call
    any rate sustainable while the queue grows without end. (Whether a probe reached a steady state
    at all is the search's business, not an SLO: see ``search.min_fill_multiple``.)"""

    ttft_p99_s: PositiveFloat | None = Field(
        None, description="At most this p99 time to first token, in seconds."
    )
    ttft_p50_s: PositiveFloat | None = Field(
        None, description="At most this median time to first token, in seconds."
    )
    ttft_mean_s: PositiveFloat | None = Field(
        None, description="At most this mean time to first token, in seconds."
    )
    tpot_p50_s: PositiveFloat | None = Field(
        None, description="At most this median time per output token, in seconds."
    )
    tpot_p99_s: PositiveFloat | None = Field(
        None, description="At most this p99 time per output token, in seconds."
    )
    tpot_mean_s: PositiveFloat | None = Field(
        None, description="At most this mean time per output token, in seconds."
    )
    e2e_p99_s: PositiveFloat | None = Field(
        None, description="At most this p99 end-to-end latency, in seconds."
    )
    e2e_mean_s: PositiveFloat | None = Field(
        None, description="At most this mean end-to-end latency, in seconds."
    )
    normalized_latency_mean_s: PositiveFloat | None = Field(
        None,
        description="Mean over requests of end-to-end latency / output tokens, in seconds per token "
        "(the vLLM paper's Fig. 12 axis).",
    )
    goodput: Goodput | None = Field(None, description="Per-request TTFT/TPOT targets and the share to meet.")
    max_preemptions_per_request: NonNegativeFloat | None = Field(
        None,
        description="At most this many preemptions per request of the window (their total over the window's "
        "requests).",
    )
    max_rejected_frac: float | None = Field(
        None, ge=0, le=1, description="At most this share of the window's requests rejected."
    )
    max_queue_growth_frac: float = Field(
        0.05,
        gt=0,
        le=1,
        description="Waiting requests at the window's end minus at its start, over the window's arrivals: "
        "above it the queue is still growing (the rate is not sustainable).",
    )

    @model_validator(mode="after")
    def _at_least_one(self) -> SLOs:
        named = [name for name in USER_SLOS if getattr(self, name) is not None]
        if not named:
            raise ValueError(f"give at least one SLO: {', '.join(USER_SLOS)}")
        return self

    def limits(self) -> dict[str, float]:
        """Every SLO that is set (the queue-growth check always is): name -> bound (an upper bound,
        except where :data:`SLO_METRICS` says ``at_least``)."""
        bounds = {
            name: getattr(self, name)
            for name in SLO_METRICS
            if name != "goodput" and getattr(self, name) is not None
        }
        if self.goodput is not None:
            bounds["goodput"] = self.goodput.min_attainment
        return bounds


@dataclass(frozen=True)
class SloMetric:
    metric: str  # the steady-state metric compared
    unit: str  # "s", "s/token", "share", or a word
    label: str
    at_least: bool = False  # a lower bound (goodput's attainment); every other SLO is an upper bound
    late_half: bool = True  # also checked on the window's late half (a queue still building up)


SLO_METRICS: dict[str, SloMetric] = {
    "ttft_p99_s": SloMetric("ttft_p99_s", "s", "p99 TTFT"),
    "ttft_p50_s": SloMetric("ttft_p50_s", "s", "p50 TTFT"),
    "ttft_mean_s": SloMetric("ttft_mean_s", "s", "mean TTFT"),
    "tpot_p50_s": SloMetric("tpot_p50_s", "s", "p50 TPOT"),
    "tpot_p99_s": SloMetric("tpot_p99_s", "s", "p99 TPOT"),
    "tpot_mean_s": SloMetric("tpot_mean_s", "s", "mean TPOT"),
    "e2e_p99_s": SloMetric("e2e_p99_s", "s", "p99 end-to-end"),
    "e2e_mean_s": SloMetric("e2e_mean_s", "s", "mean end-to-end"),
    "normalized_latency_mean_s": SloMetric("normalized_latency_mean_s", "s/token", "mean normalized latency"),
    "goodput": SloMetric("attainment_frac", "share", "goodput (SLO attainment)", at_least=True),
    "max_preemptions_per_request": SloMetric(
        "preemptions_per_request", "per request", "preemptions", late_half=False
    ),
    "max_rejected_frac": SloMetric("rejected_frac", "share", "rejected", late_half=False),
    "max_queue_growth_frac": SloMetric("queue_growth_frac", "share", "queue growth", late_half=False),
}
ALWAYS_CHECKED = ("max_queue_growth_frac",)
USER_SLOS = [name for name in SLO_METRICS if name not in ALWAYS_CHECKED]


class ClusterCheck(Strict):
    """Check a single-engine candidate's GPU count with the cluster model: simulate the replicas that
    dividing the target rate asks for, behind ``router``, at the target rate; add replicas until every
    seed meets the SLOs (at most ``max_extra_replicas`` more)."""

    router: str = Field("least_requests", description="The router of the checked clusters.")
    max_extra_replicas: int = Field(4, ge=0, description="Replicas added at most beyond the divided count.")

    @model_validator(mode="after")
    def _known_router(self) -> ClusterCheck:
        ClusterConfig.model_validate({"router": self.router})  # the same check and message
        return self


class SearchSpec(Strict):
    start_rate_per_s: PositiveFloat = Field(1.0, description="First rate probed.")
    min_rate_per_s: PositiveFloat = Field(0.05, description="Below this a candidate is infeasible.")
    max_rate_per_s: PositiveFloat = Field(1000.0, description="Search no higher (reported as 'at least').")
    growth: float = Field(2.0, gt=1, description="Bracketing factor: rates grow or shrink by it.")
    rel_tolerance: float = Field(0.05, gt=0, lt=1, description="Stop when failing/passing rate - 1 <= this.")
    max_probes: PositiveInt = Field(16, description="Most rates probed per candidate.")
    seeds: list[int] = Field(
        default_factory=lambda: [1, 2, 3],
        min_length=1,
        description="Every rate runs once per seed; it passes only when every seed meets every SLO.",
    )
    min_requests: PositiveInt = Field(1000, description="Requests per probe (at least).")
    min_duration_s: NonNegativeFloat = Field(0.0, description="Arrival span per probe (at least).")
    warmup_frac: float = Field(0.2, ge=0, lt=0.5, description="Arrivals dropped at the start.")
    drain_frac: float = Field(0.1, ge=0, lt=0.5, description="Arrivals dropped at the end.")
    rate_key: str = Field("workload.arrival.rate_per_s", description="Key path the search sets.")
    count_key: str = Field("workload.num_requests", description="Key path of the request count.")
    min_fill_multiple: float = Field(
        3.0,
        ge=0,
        description="Each probe's arrivals span at least this many times the time they take to fill the KV "
        "pool (pool tokens / (rate x KV tokens per request)): a pool that fills late must fill inside the "
        "probe. Sizes the first probe of a rate (from the workload's tokens per request) and is checked on "
        "every run; a short one is run again longer.",
    )
    max_requests: PositiveInt = Field(
        20000,
        description="The longest probe. A rate whose probe has not reached a steady state at this length "
        "does not pass.",
    )
    trend_segments: int = Field(
        4, ge=2, le=20, description="The steady window is cut in this many; its first and last are compared."
    )
    max_kv_usage_rise: float = Field(
        0.03,
        gt=0,
        le=1,
        description="KV usage (share of the pool) may rise at most this much from the window's first "
        "segment to its last; above it the pool is still filling: the probe runs longer.",
    )
    max_running_rise_frac: float = Field(
        0.1,
        gt=0,
        description="The running batch may grow at most this share (of the first segment's, at least one "
        "request) from the window's first segment to its last; above it the probe runs longer.",
    )
    max_waiting_rise_frac: float = Field(
        0.01,
        gt=0,
        le=1,
        description="The waiting queue may grow at most this share of the window's arrivals (and by at most "
        "2 requests) from the window's first segment to its last; above it the probe runs longer (a queue "
        "still growing at max_requests fails; slo max_queue_growth_frac fails a probe at once).",
    )
    max_fill_deficit_s: float = Field(
        0.0,
        ge=0,
        description="How long the steady window may open before the system has filled (first arrival + "
        "mean end-to-end latency); above it the probe runs longer.",
    )
    confirm_factor: float = Field(
        10.0,
        ge=0,
        description="Confirm each candidate's maximum rate with a run this many times longer than its passing "
        "probe, with as many fresh seeds as `seeds` (the next integers after them), every SLO: a rate that "
        "breaks there fails, and the search bisects again below it. 0: no confirmation (the answer then "
        "rests on the short probes alone).",
    )
    max_confirmations: PositiveInt = Field(
        3,
        description="Confirmation runs per candidate at most; the last rate left unconfirmed is reported so.",
    )
    early_stop: bool = Field(
        True,
        description="Stop a probe's run once an SLO is certainly broken on every window it could have (e.g. "
        "more of the window's requests have waited longer than the p99 TTFT limit than a p99 allows): the "
        "verdict the full run would reach, sooner. Its latencies are then lower bounds. false: every probe "
        "runs to its end.",
    )
    cost_band: Literal["fitted", "none"] | list[PositiveFloat] = Field(
        "fitted",
        description="The cost model's error band, searched again at its edges (each candidate's rate and GPUs "
        "as a range): `fitted` takes GPU-time scales from the serving calibration's leave-one-run-out TPOT "
        "errors (derated cost models only), `[fast, slow]` gives the scales (e.g. [0.9, 1.2]: GPU 10 % "
        "faster, 20 % slower than modelled), `none` skips it.",
    )
    cluster_check: ClusterCheck | None = Field(
        None,
        description="Check single-engine candidates' GPU counts by simulating the cluster at the target "
        "rate (default: off, the count divides the target rate).",
    )

    @model_validator(mode="after")
    def _ordered(self) -> SearchSpec:
        if not self.min_rate_per_s <= self.start_rate_per_s <= self.max_rate_per_s:
            raise ValueError("need min_rate_per_s <= start_rate_per_s <= max_rate_per_s")
        if isinstance(self.cost_band, list) and (
            len(self.cost_band) != 2 or not self.cost_band[0] <= 1.0 <= self.cost_band[1]
        ):
            raise ValueError(
                f"cost_band must be [fast, slow] GPU-time scales around 1, e.g. [0.9, 1.2]; got {self.cost_band}"
            )
        if self.max_requests < self.min_requests:
            raise ValueError(
                f"max_requests ({self.max_requests}) is below min_requests ({self.min_requests})"
            )
        return self

    def window(self, goodput: Goodput | None = None) -> SteadyWindow:
        return SteadyWindow(
            self.warmup_frac,
            self.drain_frac,
            self.trend_segments,
            goodput.ttft_s if goodput else None,
            goodput.tpot_s if goodput else None,
        )

    def seeds_for(self, confirmation: bool) -> list[int]:
        """A search probe's seeds, or a confirmation run's: as many fresh ones, after the search's, so
        that a maximum rate is confirmed out of sample (the same seed's longer run would replay the
        short probe's own requests first)."""
        if not confirmation:
            return list(self.seeds)
        return [max(self.seeds) + 1 + index for index in range(len(self.seeds))]

    def requests_at(self, rate: float, fill_requests: float = 0.0) -> int:
        """Requests of a first probe at ``rate``; ``fill_requests``: how many requests' KV tokens fill
        the pool (pool tokens / tokens per request), so that the arrivals span ``min_fill_multiple``
        fills."""
        wanted = max(
            self.min_requests,
            math.ceil(rate * self.min_duration_s),
            # 10 % over: the fill is estimated from drawn requests, the check uses the realised ones.
            math.ceil(FILL_MARGIN * self.min_fill_multiple * fill_requests),
        )
        return min(wanted, self.max_requests)


class PlanSpec(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="Also the default output folder name.")
    description: str = Field("", description="Free text, kept in plan.json and shown in the report.")
    models: list[str] = Field(
        min_length=1,
        description="Model preset names (see `kvsim models`) or paths to a Hugging Face config.json (relative "
        "to the plan file); each is crossed with every GPU and candidate.",
    )
    gpus: list[str | GpuChoice] = Field(
        min_length=1,
        description="GPU preset names (see `kvsim gpus`), or mappings with a custom GPU, a label, a price per "
        "GPU-hour and a cost model (`gpus[]`).",
    )
    cost_model: str | dict[str, Any] = Field(
        "derated",
        description="As an experiment's cost_model, with the same default as `kvsim run` (derated, "
        "with the serving terms fitted to measured runs).",
    )
    engine: EngineConfig = Field(
        default_factory=EngineConfig,  # type: ignore[arg-type]
        description="The engine section every candidate starts from (an experiment's); the candidates' block "
        "sizes and engine knobs override it.",
    )
    workload: dict[str, Any] = Field(description="An experiment's workload; the search sets its rate.")
    slos: SLOs = Field(description="What a rate must meet on the steady-state window of every seed.")
    target_rate_per_s: PositiveFloat | None = Field(
        None,
        description="The request rate (requests per second) the GPUs are counted for. Without it the plan "
        "is a max-rate study: each candidate's maximum rate, per GPU and (with prices) per output token, "
        "no GPU counts.",
    )
    candidates: CandidateGrid = Field(
        description="What is compared, crossed with every model and GPU: policies x block sizes x engine knobs "
        "x cluster keys."
    )
    search: SearchSpec = Field(
        default_factory=SearchSpec,  # type: ignore[arg-type]
        description="How each candidate's maximum sustainable rate is searched and each probe run.",
    )

    @model_validator(mode="after")
    def _target_for_cluster_check(self) -> PlanSpec:
        if self.search.cluster_check is not None and self.target_rate_per_s is None:
            raise ValueError("search.cluster_check simulates the cluster at target_rate_per_s: give one")
        return self

    def gpu_choices(self) -> list[GpuChoice]:
        return [
            GpuChoice.model_validate({"gpu": choice}) if isinstance(choice, str) else choice
            for choice in self.gpus
        ]


@dataclass(frozen=True)
class Candidate:
    """One configuration whose maximum sustainable rate is searched."""

    key: str  # "A100-80GB / paged / block 16" (unique in the plan)
    group: str  # what the report draws in one panel: the GPU (and the model, when several)
    model: str
    gpu: str
    policy: str  # the variant's name
    block_size: int
    knobs: dict[str, Any]
    price_per_hour: float | None
    tensor_parallel_size: int
    replicas: int  # engine replicas the candidate deploys (1 without a cluster)
    router: str | None  # None: no cluster simulated (a single engine; GPUs for the target by division)
    template: dict[str, Any]  # an experiment config with one variant; rate, count and seed unset
    base_dir: Path
    infeasible: str = ""  # why it cannot run at all (the model does not fit)
    memory: dict[str, int] = field(default_factory=dict)  # GPU memory split, bytes
    kv_pool_tokens: int = 0  # every replica's pool together
    uses_blocks: bool = True  # False: block_size changes nothing (contiguous), the key names no block
    fill_requests: float = 0.0  # requests whose KV tokens fill the pool (pool / tokens per request)
    gpus_per_deployment: int = 1  # GPUs of what was simulated: TP x replicas, or both pools' together
    deployment_price_per_hour: float | None = None  # those GPUs' price (None: a GPU without a price)


@dataclass(frozen=True)
class Plan:
    spec: PlanSpec
    path: Path
    candidates: list[Candidate]

    def digest(self) -> str:
        return config_hash(self.spec.model_dump(mode="json", by_alias=True))

    def first_requests(self, candidate: Candidate, rate: float) -> int:
        """Requests of the first probe at ``rate`` (a probe short of a steady state runs again longer)."""
        return self.spec.search.requests_at(rate, candidate.fill_requests)

    def probe_config(
        self, candidate: Candidate, rate: float, seed: int, requests: int | None = None
    ) -> ExperimentConfig:
        data = copy.deepcopy(candidate.template)
        search = self.spec.search
        where = f"{self.path}: candidate {candidate.key}, rate {rate:g}/s, seed {seed}"
        count = requests if requests is not None else self.first_requests(candidate, rate)
        for key, value in ((search.rate_key, rate), (search.count_key, count)):
            try:
                set_key_path(data, key, value)
            except KeyError as error:  # (the path runs through a value that is not a mapping)
                raise ConfigError(f"{where}: search sets {key}: {error.args[0]}") from None
        data["seed"] = seed
        return validate_experiment(data, where)

    def probe_task(
        self, candidate: Candidate, rate: float, seed: int, requests: int | None = None
    ) -> PointTask:
        config = self.probe_config(candidate, rate, seed, requests)
        window = self.spec.search.window(self.spec.slos.goodput)
        stop = self.stop_rules(window)
        return PointTask(
            point_id(config, candidate.base_dir),
            config.model_dump(mode="json", exclude_unset=True),
            str(candidate.base_dir),
            window,
            stop,
        )

    def stop_rules(self, window: SteadyWindow) -> StopRules | None:
        """What may stop a probe early (None: every probe runs to its end)."""
        if not self.spec.search.early_stop:
            return None
        limits = self.spec.slos.limits()
        late_half = {name: SLO_METRICS[name].late_half for name in limits}
        return StopRules.of(limits, late_half, window)


def load_plan_spec(path: str | Path, overrides: list[str] | None = None) -> Plan:
    """Read a plan file, apply ``overrides`` (``--set KEY.PATH=VALUE``, as ``kvsim run``'s, to the
    plan file's keys) and expand its candidates; every candidate's probe config is validated (and
    preflighted) for every seed before anything runs. A model that does not fit a GPU makes that
    candidate infeasible, not the plan invalid. The spec, so the plan's digest, holds the overrides."""
    from sim.config import apply_overrides, name_from_file, with_override_notes

    path = Path(path)
    data = name_from_file(read_yaml_mapping(path, "plan"), path)
    apply_overrides(data, overrides or [])
    try:
        spec: PlanSpec = validate_file(PlanSpec, data, path, "plan file")
        candidates = [_candidate(spec, path, *combo) for combo in _grid(spec)]
        _check_unique(candidates, path)
        candidates = _with_fill_sizes(candidates, spec, path)
        plan = Plan(spec, path, candidates)
        for candidate in candidates:
            if candidate.infeasible:
                continue
            for seed in spec.search.seeds:
                config = plan.probe_config(candidate, spec.search.start_rate_per_s, seed)
                preflight(config, candidate.base_dir, f"{path}: candidate {candidate.key}")
    except ConfigError as error:
        raise ConfigError(with_override_notes(str(error), overrides or [])) from None
    return plan


def _with_fill_sizes(candidates: list[Candidate], spec: PlanSpec, path: Path) -> list[Candidate]:
    """Each candidate with the requests whose KV tokens fill its pool: the first probes' length."""
    tokens = _tokens_per_request(spec, path)
    return [
        replace(candidate, fill_requests=candidate.kv_pool_tokens / tokens if tokens else 0.0)
        for candidate in candidates
    ]


def _tokens_per_request(spec: PlanSpec, path: Path, sample: int = 2000) -> float:
    """Mean KV tokens per request (prompt plus every sample's output) over the workload's first
    requests at the start rate: the workload is drawn, not simulated (milliseconds)."""
    from workloads.factory import build_workload

    data = copy.deepcopy(spec.workload)
    search = spec.search
    holder = {"workload": data}
    try:
        set_key_path(holder, search.rate_key, search.start_rate_per_s)
        set_key_path(holder, search.count_key, sample)
        workload = build_workload(holder["workload"], seed=search.seeds[0], base_dir=path.parent)
    except Exception:  # the probes' own validation names the problem; sizing falls back on min_requests
        return 0.0
    total = count = 0
    for request in itertools.islice(workload.requests(), sample):
        outputs = (
            sum(request.sample_output_lens)
            if request.sample_output_lens
            else request.output_len * request.width
        )
        total += request.prompt_len + outputs
        count += 1
    return total / count if count else 0.0


def _grid(
    spec: PlanSpec,
) -> list[tuple[str, GpuChoice, VariantConfig, int | None, dict[str, Any], dict[str, Any]]]:
    blocks: list[int | None] = list(spec.candidates.block_sizes) or [None]
    clusters = _crossed(spec.candidates.cluster)
    clusters += [{"disaggregation": entry} for entry in spec.candidates.disaggregation]
    return [
        (model, gpu, variant, block, knobs, cluster)
        for model in spec.models
        for gpu in spec.gpu_choices()
        for variant in spec.candidates.policies
        for block in (blocks if _uses_blocks(variant) else blocks[:1])
        for knobs in _crossed(spec.candidates.engine)
        for cluster in clusters
    ]


def _uses_blocks(variant: VariantConfig) -> bool:
    """Whether block_size changes what the variant's policy does (contiguous has no blocks)."""
    from policies.base import PolicyInputError, policy_class
    from sim.kv.allocators import is_hybrid_allocator

    if is_hybrid_allocator(variant.policy):
        return True
    try:
        return policy_class(variant.policy).uses_blocks
    except PolicyInputError:  # an unknown policy: the probe configs' validation names it
        return True


def _crossed(lists: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the listed values: ``{a: [1, 2]}`` -> ``[{a: 1}, {a: 2}]``."""
    return [dict(zip(lists, values, strict=True)) for values in itertools.product(*lists.values())]


def _candidate(
    spec: PlanSpec,
    path: Path,
    model: str,
    gpu: GpuChoice,
    variant: VariantConfig,
    block: int | None,
    knobs: dict[str, Any],
    cluster_keys: dict[str, Any],
) -> Candidate:
    engine = spec.engine.model_dump(mode="json", exclude_unset=True) | knobs
    engine |= {"block_size": block} if block is not None else {}
    template = {
        "name": spec.name,
        "model": model,
        "gpu": gpu.gpu,
        "engine": engine,
        "cost_model": gpu.cost_model if gpu.cost_model is not None else spec.cost_model,
        "workload": copy.deepcopy(spec.workload),
        "variants": [variant.model_dump(mode="json", exclude_defaults=True) | {"name": variant.name}],
        "output": {"figures": False},
    }
    group = " / ".join(([model] if len(spec.models) > 1 else []) + [gpu.label()])
    parts = [group, variant.name]
    where = " / ".join(parts)
    engine_config = _section_or_fail(EngineConfig, engine, "engine", path, where)
    if engine_config.data_parallel_size > 1:
        # (a plan counts a candidate's GPUs as replicas x tensor_parallel_size)
        raise ConfigError(
            f"{path}: candidate {where}: engine.data_parallel_size {engine_config.data_parallel_size}: "
            "plans do not size data-parallel servers yet; cross cluster replicas instead"
        )
    if _uses_blocks(variant):
        parts.append(f"block {engine_config.block_size}")
    parts += [f"{name}={shown(value)}" for name, value in knobs.items()]
    if "disaggregation" in cluster_keys:
        return _disaggregated_candidate(
            spec,
            path,
            model,
            gpu,
            variant,
            template,
            engine,
            cluster_keys["disaggregation"],
            group,
            parts,
            knobs,
        )
    if cluster_keys:
        template["cluster"] = cluster_keys
    cluster = _section_or_fail(ClusterConfig, cluster_keys, "cluster", path, where) if cluster_keys else None
    parts += [f"{name}={shown(value)}" for name, value in cluster_keys.items()]
    key = " / ".join(parts)
    infeasible, memory = _fit(template, engine_config, path, key)
    replicas = cluster.replicas if cluster is not None else 1
    gpus = replicas * engine_config.tensor_parallel_size
    return Candidate(
        key,
        group,
        model,
        gpu.label(),
        variant.name,
        engine_config.block_size,
        knobs,
        gpu.price_per_hour,
        engine_config.tensor_parallel_size,
        cluster.replicas if cluster is not None else 1,
        cluster.router if cluster is not None else None,
        template,
        path.parent,
        infeasible,
        memory,
        memory.get("kv_pool_tokens", 0) * replicas,
        _uses_blocks(variant),
        gpus_per_deployment=gpus,
        deployment_price_per_hour=gpus * gpu.price_per_hour if gpu.price_per_hour is not None else None,
    )


def _disaggregated_candidate(
    spec: PlanSpec,
    path: Path,
    model: str,
    gpu: GpuChoice,
    variant: VariantConfig,
    template: dict[str, Any],
    engine: dict[str, Any],
    entry: dict[str, Any],
    group: str,
    parts: list[str],
    knobs: dict[str, Any],
) -> Candidate:
    """A disaggregated deployment: each pool on its GPU (a plan GPU by name, else the candidate's), its
    engine the candidate's with the pool's overrides; GPUs and price are both pools' together."""
    choices = {choice.label(): choice for choice in spec.gpu_choices()}
    resolved = copy.deepcopy(entry)
    pools: dict[str, tuple[GpuChoice, EngineConfig, int]] = {}
    for role in ("prefill", "decode"):
        pool = resolved[role]
        choice = gpu
        if pool.get("gpu") is not None:
            if pool["gpu"] not in choices:
                raise ConfigError(
                    f"{path}: candidates.disaggregation: {role}.gpu {pool['gpu']!r} is not one of the plan's gpus "
                    f"({', '.join(choices)}): a pool's GPU needs the plan's name for it, for its price"
                )
            choice = choices[pool["gpu"]]
            pool["gpu"] = choice.gpu
        pool_engine = _section_or_fail(
            EngineConfig, engine | pool.get("engine", {}), "engine", path, " / ".join(parts)
        )
        pools[role] = (choice, pool_engine, int(pool.get("replicas", 1)))
    template["cluster"] = {"disaggregation": resolved}
    label = " + ".join(
        f"{count}{role[0].upper()}"
        + (f" {choice.label()}" if choice is not gpu else "")
        + (f" TP{pool_engine.tensor_parallel_size}" if pool_engine.tensor_parallel_size > 1 else "")
        for role, (choice, pool_engine, count) in pools.items()
    )
    link = resolved.get("link", {}).get("kind", "rdma")
    key = " / ".join([*parts, f"disaggregated {label} over {link}"])
    infeasible, memory, kv_tokens = "", {}, 0
    for role, (choice, pool_engine, count) in pools.items():
        pool_template = template | {"gpu": choice.gpu}
        why, pool_memory = _fit(pool_template, pool_engine, path, key)
        infeasible = infeasible or (f"{role} pool: {why}" if why else "")
        kv_tokens += pool_memory.get("kv_pool_tokens", 0) * count
        if role == "decode":
            memory = pool_memory
    gpus = sum(count * pool_engine.tensor_parallel_size for _, pool_engine, count in pools.values())
    price: float | None = 0.0
    for choice, pool_engine, count in pools.values():
        if choice.price_per_hour is None or price is None:
            price = None
        else:
            price += count * pool_engine.tensor_parallel_size * choice.price_per_hour
    decode_engine = pools["decode"][1]
    spec_entry = DisaggregationConfig.model_validate(entry)  # (its defaults: the schema's, not repeated here)
    routers = f"prefill {spec_entry.prefill.router}, decode {spec_entry.decode.router}"
    return Candidate(
        key,
        group,
        model,
        gpu.label(),
        variant.name,
        decode_engine.block_size,
        knobs,
        gpu.price_per_hour,
        decode_engine.tensor_parallel_size,
        pools["prefill"][2] + pools["decode"][2],
        routers,
        template,
        path.parent,
        infeasible,
        memory,
        kv_tokens,
        _uses_blocks(variant),
        gpus_per_deployment=gpus,
        deployment_price_per_hour=price,
    )


def _section_or_fail(
    model: type[_Section], data: dict[str, Any], section: str, path: Path, where: str
) -> _Section:
    from pydantic import ValidationError

    try:
        return model.model_validate(data)
    except ValidationError as error:
        problems = one_line_problems(error, top_level="", key_prefix=f"{section}.", show_input=True)
        raise ConfigError(f"{path}: candidate {where}: {problems}") from None


def _fit(template: dict[str, Any], engine: EngineConfig, path: Path, key: str) -> tuple[str, dict[str, int]]:
    """Why the model cannot run on the GPU at all (empty if it can), and the GPU memory split."""
    try:
        model, gpu = resolve_model(_model_ref(template["model"], path.parent)), resolve_gpu(template["gpu"])
    except (ValueError, KeyError) as error:
        raise ConfigError(f"{path}: candidate {key}: {error}") from None
    try:
        capacity: KVCapacity = engine_pool(model, gpu, engine)
    except ModelDoesNotFitError as error:
        return str(error), {}
    except ValueError as error:
        raise ConfigError(f"{path}: candidate {key}: {error}") from None
    memory = {
        "kv_pool_tokens": capacity.kv_pool_tokens,
        "gpu_memory_bytes": gpu.memory_bytes,
        "weight_bytes": capacity.weight_bytes,
        "activation_reserve_bytes": capacity.activation_reserve_bytes,
        "kv_pool_bytes": capacity.kv_pool_bytes,
    }
    return "", memory


def _model_ref(model: str, base_dir: Path) -> str:
    """A preset name, or a config.json path relative to the plan file (as an experiment's)."""
    candidate = base_dir / model
    return str(candidate) if model.endswith(".json") and candidate.is_file() else model


def _check_unique(candidates: list[Candidate], path: Path) -> None:
    keys = [candidate.key for candidate in candidates]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise ConfigError(f"{path}: candidates repeat: {', '.join(repeated)} (give GPUs distinct `name`s)")
