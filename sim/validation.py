"""``kvsim validate``: reproduce published numbers from shipped configs, and say where they hold.

Each file in ``configs/validation/`` is one *claim* (a published number or statement) with:

* ``claim:`` where it comes from (source, the exact quote), the setup, the *check* that computes it
  (a function registered below), check parameters, and one or more *targets*: expected value,
  units, tolerance (stated next to the value), what simulated quantity is compared, and, where the
  simulator cannot decide a target, why;
* ``experiment:`` (optional) an experiment config exactly as ``kvsim run`` reads it
  (:class:`sim.config.ExperimentConfig`), ``cases:`` named overrides of it (deep-merged), and
  ``fast_overrides:`` merged into every experiment under ``--fast``.

Everything is validated with pydantic (``extra="forbid"``) when the file is loaded, the experiments
included, so a typo fails before anything runs.

A verdict is ``holds`` (within tolerance), ``does not hold`` (outside; the table then carries the
explanation: the claim's own assumption that explains the difference, plus the numbers), or
``not reproducible`` (the simulator has no model of what the claim is about; the table says what it
can say instead). Disagreeing with a claim is a valid result: nothing here is tuned to a number.

Outputs (written under a temporary name and renamed, like :mod:`sim.results`)::

    DIR/validation.csv       one row per target
    DIR/validation.md        the table, then one section per claim (quote, setup, notes, figures)
    DIR/figures/*.png        the figures the claims need
    DIR/data/*.csv           sweep tables behind the figures
"""

from __future__ import annotations

import argparse
import copy
import datetime
import math
import shutil
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from policies.base import MemoryBreakdown, PoolSpec, make_policy, token_ids
from policies.contiguous import ContiguousPolicy
from sim.capacity import size_kv_pool
from sim.config import ConfigError, ExperimentConfig, validate_experiment
from sim.costs import make_cost_model
from sim.gpus import resolve_gpu
from sim.models import resolve_model
from sim.runner import VariantResult, run_variant

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG_DIR = REPO_ROOT / "configs" / "validation"
DEFAULT_OUTPUT_DIR = Path("results") / "validation"
GiB = 2**30
GB = 10**9

HOLDS, DOES_NOT_HOLD, NOT_REPRODUCIBLE = "holds", "does not hold", "not reproducible"
VERDICTS = (HOLDS, DOES_NOT_HOLD, NOT_REPRODUCIBLE)


# --------------------------------------------------------------------------------------------------
# Schema of a claim file
# --------------------------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Tolerance(_Strict):
    """How far the simulated value may be from ``expected`` for the claim to hold.

    * ``abs``: ``|simulated - expected| <= value``; ``rel``: ``<= value * |expected|``;
    * ``at_least``: ``simulated >= expected - value`` (a claim such as "60 %+");
    * ``at_most``: ``simulated <= expected + value`` (a claim such as "< 10 %");
    * ``exact``: equal up to float rounding.
    """

    kind: Literal["abs", "rel", "at_least", "at_most", "exact"]
    value: float = Field(0.0, ge=0, description="Size of the tolerance (see kind).")
    text: str | None = Field(None, description="How the claim's wording was read, shown in the table.")

    def accepts(self, expected: float, simulated: float) -> bool:
        slack = 1e-9 * max(1.0, abs(expected))
        if self.kind == "abs":
            return abs(simulated - expected) <= self.value + slack
        if self.kind == "rel":
            return abs(simulated - expected) <= self.value * abs(expected) + slack
        if self.kind == "at_least":
            return simulated >= expected - self.value - slack
        if self.kind == "at_most":
            return simulated <= expected + self.value + slack
        return abs(simulated - expected) <= slack

    def describe(self, expected: float, fmt: str) -> str:
        if self.text:
            return self.text
        percent = "%" in fmt
        if self.kind == "abs":
            return f"± {self.value * 100:.3g} pp" if percent else f"± {fmt.format(self.value)}"
        if self.kind == "rel":
            return f"± {self.value:.0%} (relative)"
        if self.kind == "at_least":
            return f"≥ {fmt.format(expected - self.value)}"
        if self.kind == "at_most":
            return f"≤ {fmt.format(expected + self.value)}"
        return "exact"


class Target(_Strict):
    """One number (or statement) of a claim, compared with one simulated quantity."""

    id: str = Field(pattern=r"^[A-Za-z0-9_./@-]+$", description="Key the check reports the value under.")
    label: str = Field(description="What is compared, in words (table column 'claim').")
    claimed: str = Field(description="The claimed value as the source states it ('20.4 %', '≈ 32GB').")
    expected: float | None = Field(None, description="The claimed value as a number in `units`.")
    units: str = Field(description="Units of expected and simulated values.")
    fmt: str = Field("{:.4g}", description="Python format for expected and simulated values.")
    tolerance: Tolerance | None = None
    compare: str = Field(description="The simulated quantity compared with `expected`.")
    secondary: bool = Field(False, description="A secondary target (the claim's minor columns).")
    not_reproducible: str | None = Field(
        None, description="Why the simulator cannot decide this target (then no expected/tolerance)."
    )
    if_not_holds: str | None = Field(
        None, description="The assumption that explains a difference, shown when it does not hold."
    )

    @field_validator("fmt")
    @classmethod
    def _valid_format(cls, value: str) -> str:
        try:
            value.format(1.5)
        except (ValueError, IndexError, KeyError) as error:
            raise ValueError(f"not a format for one number: {value!r} ({error})") from None
        return value

    @model_validator(mode="after")
    def _decidable(self) -> Target:
        if self.not_reproducible is None and (self.expected is None or self.tolerance is None):
            raise ValueError("give `expected` and `tolerance`, or `not_reproducible` with the reason")
        if self.not_reproducible is not None and self.tolerance is not None:
            raise ValueError("a target that is not reproducible has no tolerance")
        return self


class ClaimSpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="Must equal the file name (no .yaml).")
    number: str = Field(description="The claim's number in issue 6 ('1'..'9', '9a', 'cap').")
    title: str
    source: str = Field(description="Paper / article, section, figure or table.")
    quote: str = Field(description="The claim in the source's own words (original language).")
    setup: str = Field(description="The setup simulated, in one or two sentences (table column).")
    check: str = Field(description="The check function that computes the targets (see CHECKS).")
    fast: bool = Field(False, description="Part of the fast subset (arithmetic or a few small runs).")
    params: dict[str, Any] = Field(default_factory=dict, description="The check's own parameters.")
    targets: list[Target] = Field(min_length=1)
    notes: str = Field("", description="Context shown under the claim in validation.md.")

    @field_validator("check")
    @classmethod
    def _known_check(cls, value: str) -> str:
        if value not in CHECKS:
            raise ValueError(f"unknown check {value!r}; known checks: {', '.join(sorted(CHECKS))}")
        return value

    @model_validator(mode="after")
    def _unique_targets(self) -> ClaimSpec:
        ids = [target.id for target in self.targets]
        repeated = sorted({name for name in ids if ids.count(name) > 1})
        if repeated:
            raise ValueError(f"target ids must be unique; repeated: {', '.join(repeated)}")
        return self


class ClaimFile(_Strict):
    claim: ClaimSpec
    experiment: dict[str, Any] | None = Field(None, description="An experiment config (kvsim run).")
    cases: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Named overrides of `experiment`, deep-merged."
    )
    fast_overrides: dict[str, Any] = Field(
        default_factory=dict, description="Merged into every experiment under --fast."
    )

    @model_validator(mode="after")
    def _cases_need_experiment(self) -> ClaimFile:
        if (self.cases or self.fast_overrides) and self.experiment is None:
            raise ValueError("`cases` and `fast_overrides` modify `experiment`, which is missing")
        return self


# --------------------------------------------------------------------------------------------------
# Loaded claims
# --------------------------------------------------------------------------------------------------


def deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` merged in: mappings merge key by key, anything else replaces.

    A mapping whose ``kind`` differs from the base's (another distribution or arrival process)
    replaces it whole, so ``{kind: batch}`` over ``{kind: poisson, rate_per_s: 2}`` is a batch."""
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        old = merged.get(key)
        same_kind = not (isinstance(old, dict) and isinstance(value, dict) and "kind" in value) or (
            old.get("kind") == value["kind"]
        )
        if isinstance(value, dict) and isinstance(old, dict) and same_kind:
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


@dataclass
class Claim:
    """A claim file, validated: the spec, its check's parameters, and its experiment(s)."""

    path: Path
    spec: ClaimSpec
    params: Any
    experiment: dict[str, Any] | None
    cases: dict[str, dict[str, Any]]
    fast_overrides: dict[str, Any]

    @property
    def name(self) -> str:
        return self.spec.name

    def experiment_data(
        self, case: str | None = None, overrides: dict[str, Any] | None = None, *, fast: bool = False
    ) -> dict[str, Any]:
        if self.experiment is None:
            raise ConfigError(f"{self.path}: check {self.spec.check!r} needs an `experiment` section")
        data = self.experiment
        if case is not None:
            if case not in self.cases:
                raise ConfigError(f"{self.path}: no case {case!r}; cases: {', '.join(self.cases) or 'none'}")
            data = deep_merge(data, self.cases[case])
        if overrides:
            data = deep_merge(data, overrides)
        if fast and self.fast_overrides:
            data = deep_merge(data, self.fast_overrides)
        return data

    def config(
        self, case: str | None = None, overrides: dict[str, Any] | None = None, *, fast: bool = False
    ) -> ExperimentConfig:
        where = f"{self.path} (experiment{f', case {case}' if case else ''}{', fast' if fast else ''})"
        return validate_experiment(self.experiment_data(case, overrides, fast=fast), where)


def _format_claim_error(error: ValidationError, path: Path, what: str, prefix: str = "") -> str:
    lines = [f"{path}: invalid {what} ({error.error_count()} problem(s))"]
    for problem in error.errors():
        key_path = prefix + ".".join(str(part) for part in problem["loc"]) or "(top level)"
        message = "required key is missing" if problem["type"] == "missing" else problem["msg"]
        if problem["type"] == "extra_forbidden":
            message = "unknown key"
        value = problem.get("input")
        shown = "" if problem["type"] == "missing" or isinstance(value, dict) else f" (got {value!r})"
        lines.append(f"  {key_path}: {message}{shown}")
    return "\n".join(lines)


def load_claim(path: str | Path) -> Claim:
    """Read and validate one claim file (spec, check parameters and every experiment it builds)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such claim file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: malformed YAML: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping with a `claim` key")
    try:
        parsed = ClaimFile.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_format_claim_error(error, path, "validation claim")) from None
    spec = parsed.claim
    if spec.name != path.stem:
        raise ConfigError(f"{path}: claim.name {spec.name!r} must equal the file name {path.stem!r}")
    check = CHECKS[spec.check]
    try:
        params = check.params.model_validate(spec.params)
    except ValidationError as error:
        raise ConfigError(
            _format_claim_error(error, path, f"claim.params for check {spec.check!r}", "claim.params.")
        ) from None
    claim = Claim(path, spec, params, parsed.experiment, dict(parsed.cases), dict(parsed.fast_overrides))
    if check.needs_experiment and parsed.experiment is None:
        raise ConfigError(f"{path}: check {spec.check!r} needs an `experiment` section")
    for case in check.required_cases(params):
        if case not in claim.cases:
            raise ConfigError(f"{path}: check {spec.check!r} needs a case named {case!r} under `cases`")
    if parsed.experiment is not None:
        for case_name in [None, *claim.cases]:
            for fast in (False, True):
                claim.config(case_name, fast=fast)
    return claim


def claim_order(claim: Claim) -> tuple[int, str, str]:
    """Claims in issue order: 1, 2, ..., 9, 9a, 9b, ..., then the others (e.g. 'cap')."""
    number = claim.spec.number
    digits = len(number) - len(number.lstrip("0123456789"))
    return (int(number[:digits]) if digits else 10**6, number[digits:], claim.name)


def claim_paths(config_dir: Path = DEFAULT_CONFIG_DIR) -> list[Path]:
    return sorted(config_dir.glob("*.yaml"))


def load_claims(config_dir: Path = DEFAULT_CONFIG_DIR, names: Iterable[str] = ()) -> list[Claim]:
    """Every claim in ``config_dir``, or those named (file name without .yaml, or claim number)."""
    claims = sorted((load_claim(path) for path in claim_paths(config_dir)), key=claim_order)
    names = list(names)
    if not names:
        return claims
    chosen: list[Claim] = []
    for name in names:
        matches = [c for c in claims if name in (c.name, c.path.name, c.spec.number)]
        if not matches:
            known = ", ".join(f"{c.name} ({c.spec.number})" for c in claims)
            raise ConfigError(f"no validation claim named {name!r}; known: {known}")
        chosen.extend(c for c in matches if c not in chosen)
    return sorted(chosen, key=claim_order)


# --------------------------------------------------------------------------------------------------
# Check registry and results
# --------------------------------------------------------------------------------------------------


@dataclass
class Measured:
    """What a check found for one target: a number (or None), how to show it, and the context."""

    value: float | None
    detail: str = ""
    shown: str | None = None


@dataclass
class CheckOutput:
    values: dict[str, Measured] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)  # paths relative to the output folder
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # written to data/<claim>__<key>.csv


@dataclass
class RunContext:
    out_dir: Path  # the staging output folder (figures/ and data/ go under it)
    fast: bool = False
    log: Callable[[str], None] = lambda message: None

    def figure_path(self, name: str) -> tuple[Path, str]:
        relative = f"figures/{name}"
        path = self.out_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        return path, relative


@dataclass(frozen=True)
class Check:
    func: Callable[[Claim, RunContext], CheckOutput]
    params: type[BaseModel]
    needs_experiment: bool = False
    cases: Callable[[Any], list[str]] | None = None

    def required_cases(self, params: Any) -> list[str]:
        return self.cases(params) if self.cases else []


CHECKS: dict[str, Check] = {}


def register_check(
    name: str,
    params: type[BaseModel],
    *,
    needs_experiment: bool = False,
    cases: Callable[[Any], list[str]] | None = None,
) -> Callable[[Callable[[Claim, RunContext], CheckOutput]], Callable[[Claim, RunContext], CheckOutput]]:
    def decorate(
        func: Callable[[Claim, RunContext], CheckOutput],
    ) -> Callable[[Claim, RunContext], CheckOutput]:
        CHECKS[name] = Check(func, params, needs_experiment, cases)
        return func

    return decorate


@dataclass
class TargetResult:
    claim: Claim
    target: Target
    measured: Measured
    verdict: str
    explanation: str

    def row(self) -> dict[str, Any]:
        spec, target = self.claim.spec, self.target
        expected = "" if target.expected is None else target.fmt.format(target.expected)
        return {
            "claim": spec.name,
            "number": spec.number,
            "target": target.id,
            "label": target.label,
            "secondary": target.secondary,
            "source": spec.source,
            "setup": spec.setup,
            "claimed": target.claimed,
            "expected": expected,
            "expected_value": target.expected,
            "simulated": shown_value(target, self.measured),
            "simulated_value": self.measured.value,
            "units": target.units,
            "tolerance": tolerance_text(target),
            "compare": target.compare,
            "verdict": self.verdict,
            "explanation": self.explanation,
            "detail": self.measured.detail,
        }


@dataclass
class ClaimResult:
    claim: Claim
    targets: list[TargetResult]
    output: CheckOutput
    wall_s: float


def shown_value(target: Target, measured: Measured) -> str:
    if measured.shown is not None:
        return measured.shown
    if measured.value is None or (isinstance(measured.value, float) and math.isnan(measured.value)):
        return "n/a"
    return target.fmt.format(measured.value)


def tolerance_text(target: Target) -> str:
    if target.tolerance is None or target.expected is None:
        return "n/a"
    return target.tolerance.describe(target.expected, target.fmt)


def judge(target: Target, measured: Measured) -> tuple[str, str]:
    """Verdict and explanation (the explanation is empty when the claim holds)."""
    if target.not_reproducible is not None:
        return NOT_REPRODUCIBLE, _join(target.not_reproducible, measured.detail)
    value = measured.value
    if value is None or math.isnan(value):
        return NOT_REPRODUCIBLE, _join("the simulation produced no value", measured.detail)
    assert target.tolerance is not None and target.expected is not None
    if target.tolerance.accepts(target.expected, value):
        return HOLDS, ""
    return DOES_NOT_HOLD, _join(target.if_not_holds or "", measured.detail)


def _join(*parts: str) -> str:
    return " ".join(part.strip() for part in parts if part and part.strip())


def run_claim(claim: Claim, context: RunContext) -> ClaimResult:
    started = time.perf_counter()
    output = CHECKS[claim.spec.check].func(claim, context)
    results = []
    for target in claim.spec.targets:
        if target.id not in output.values:
            raise ConfigError(
                f"{claim.path}: check {claim.spec.check!r} reports no value for target {target.id!r} "
                f"(it reports: {', '.join(sorted(output.values))})"
            )
        measured = output.values[target.id]
        verdict, explanation = judge(target, measured)
        results.append(TargetResult(claim, target, measured, verdict, explanation))
    return ClaimResult(claim, results, output, time.perf_counter() - started)


# --------------------------------------------------------------------------------------------------
# Simulation helpers shared by the checks
# --------------------------------------------------------------------------------------------------


def run_config(
    config: ExperimentConfig, base_dir: Path, variants: Iterable[str] | None = None
) -> dict[str, VariantResult]:
    """Run the named variants (default: all) of ``config`` on its request stream."""
    wanted = None if variants is None else list(variants)
    chosen = [v for v in config.variants if wanted is None or v.name in wanted]
    if wanted is not None and len(chosen) != len(wanted):
        known = ", ".join(v.name for v in config.variants)
        raise ConfigError(f"{config.name}: variants {wanted} not all among {known}")
    return {variant.name: run_variant(config, variant, base_dir) for variant in chosen}


def interval_frame(timeseries: pd.DataFrame) -> pd.DataFrame:
    """The time series as intervals between consecutive samples.

    Token counts grow linearly between samples (the recorder's trapezoid rule); counts of requests
    change only at events, so they hold their value over the interval."""
    times = timeseries["time_s"].to_numpy(dtype=float)
    frame = pd.DataFrame({"dt": np.diff(times)})
    for column in timeseries.columns:
        values = timeseries[column].to_numpy(dtype=float)
        if column.endswith("_tokens"):
            frame[column] = (values[:-1] + values[1:]) / 2
        else:
            frame[column] = values[:-1]
    return frame[frame["dt"] > 0].reset_index(drop=True)


def saturated_means(timeseries: pd.DataFrame, pool_tokens: int) -> dict[str, float]:
    """Time averages over the intervals during which a request was waiting (the engine saturated).

    Returns ``saturated_s`` (their total length), ``running``, and the six breakdown categories as
    fractions of the pool (``used``, ``reserved``...)."""
    frame = interval_frame(timeseries)
    frame = frame[frame["num_requests_waiting"] > 0]
    total = float(frame["dt"].sum())
    result = {"saturated_s": total}
    if total <= 0:
        return result | {"running": float("nan")} | {c: float("nan") for c in MemoryBreakdown.CATEGORIES}
    weights = frame["dt"] / total
    result["running"] = float((frame["num_requests_running"] * weights).sum())
    for category in MemoryBreakdown.CATEGORIES:
        result[category] = float((frame[f"{category}_tokens"] * weights).sum()) / pool_tokens
    return result


def request_means(requests: pd.DataFrame) -> dict[str, float]:
    total = requests["prompt_tokens"] + requests["output_tokens"]
    return {
        "requests": float(len(requests)),
        "mean_prompt": float(requests["prompt_tokens"].mean()),
        "mean_output": float(requests["output_tokens"].mean()),
        "max_total": float(total.max()),
    }


def describe_lengths(requests: pd.DataFrame) -> str:
    means = request_means(requests)
    return (
        f"{int(means['requests'])} requests; realised mean prompt {means['mean_prompt']:.1f}, "
        f"mean output {means['mean_output']:.1f} tokens; longest prompt + output "
        f"{int(means['max_total'])} tokens"
    )


def contiguous_internal_split(result: VariantResult, reservation: str, placement: str) -> tuple[float, float]:
    """Time-averaged slots (as fractions of the pool) of a contiguous policy's internal fragmentation,
    split into the reservation rule's overshoot (``reservation_size - final_len``) and the
    placement's rounding (buddy: ``region - reservation_size``).

    Exact from the requests table: a contiguous region lives from admission to finish with a fixed
    size (growth never fails, so the policy never preempts). The averaging window is the whole run,
    as the summary's ``mean_*_frac``."""
    summary = result.summary
    requests = result.requests
    if int(summary["preemptions"]) or (requests[["n", "beam_width"]].max(axis=1) > 1).any():
        raise ValueError("the split needs a run without preemptions or forks")
    pool = PoolSpec(int(summary["kv_pool_tokens"]), int(summary["block_size"]), int(summary["max_model_len"]))
    policy = make_policy("contiguous", pool, reservation=reservation, placement=placement)
    assert isinstance(policy, ContiguousPolicy)
    end_s = float(summary["simulated_s"])
    live = requests[requests["admitted_s"].notna()]
    finish = live["finish_s"].fillna(end_s).to_numpy(dtype=float)
    lifetime = finish - live["admitted_s"].to_numpy(dtype=float)
    rule = np.empty(len(live))
    rounding = np.empty(len(live))
    prompts = live["prompt_tokens"].to_numpy(dtype=int)
    outputs = live["output_tokens"].to_numpy(dtype=int)
    for i, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
        final = int(prompt + output)
        size = policy.reservation_size(int(prompt), final)
        rule[i] = size - final
        rounding[i] = policy.region_size(size) - size
    scale = end_s * pool.kv_pool_tokens
    return float((rule * lifetime).sum() / scale), float((rounding * lifetime).sum() / scale)


# --------------------------------------------------------------------------------------------------
# Plot helpers
# --------------------------------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# --------------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------------

# -- claim 1: vLLM Table 1 --------------------------------------------------------------------------


class Table1Row(_Strict):
    target: str = Field(description="Target id prefix: <target>@GiB and <target>@GB are reported.")
    model: str
    gpu: str
    num_gpus: int = Field(gt=0, description="Tensor-parallel GPUs; the KV memory is split across them.")
    kv_memory: float = Field(gt=0, description="'Memory for KV' of Table 1, in GB or GiB (both read).")


class Table1Params(_Strict):
    block_size: int = Field(16, gt=0)
    bytes_per_token_model: str = Field("OPT-13B", description="Model whose per-token KV bytes are checked.")
    rows: list[Table1Row] = Field(min_length=1)


@register_check("table1_capacity", Table1Params)
def check_table1(claim: Claim, context: RunContext) -> CheckOutput:
    params: Table1Params = claim.params
    output = CheckOutput()
    model = resolve_model(params.bytes_per_token_model)
    per_token = model.kv_bytes_per_token()
    output.values["kv_bytes_per_token"] = Measured(
        per_token,
        f"2 (K,V) x {model.num_layers} layers x {model.num_kv_heads} heads x {model.head_dim} x 2 B = "
        f"{per_token:,} B = {per_token / 1024:g} KiB = {per_token / 1000:g} kB.",
    )
    rows = []
    for row in params.rows:
        spec = resolve_model(row.model)
        for unit_name, unit in (("GiB", GiB), ("GB", GB)):
            per_gpu = int(row.kv_memory * unit) // row.num_gpus
            capacity = size_kv_pool(
                spec,
                row.gpu,
                block_size=params.block_size,
                kv_cache_memory_bytes=per_gpu,
                tensor_parallel_size=row.num_gpus,
            )
            exact = per_gpu / capacity.kv_bytes_per_token
            output.values[f"{row.target}@{unit_name}"] = Measured(
                capacity.kv_pool_tokens,
                f"{row.kv_memory:g} {unit_name} over {row.num_gpus} GPU(s) / "
                f"{spec.kv_bytes_per_token():,} B per token = {exact:,.1f} slots, "
                f"{capacity.num_gpu_blocks:,} blocks of {params.block_size}.",
            )
            rows.append(
                {
                    "model": row.model,
                    "unit": unit_name,
                    "kv_memory": row.kv_memory,
                    "kv_bytes_per_token": spec.kv_bytes_per_token(),
                    "slots_exact": exact,
                    "kv_pool_tokens": capacity.kv_pool_tokens,
                }
            )
    output.tables["slots"] = pd.DataFrame(rows)
    output.notes.append(
        "Slots = KV memory / bytes per token, rounded down to whole blocks of 16 (vLLM's pool is "
        "num_blocks x block_size). Reading the paper's 'GB' as GiB (2^30 B) reproduces Table 1; "
        "reading it as 10^9 B gives 6.9-8.2 % fewer slots than printed."
    )
    return output


# -- capacity line: vLLM start-up log ----------------------------------------------------------------


class CapacityLineParams(_Strict):
    model: str
    gpu: str
    block_size: int = Field(16, gt=0)
    max_model_len: int = Field(gt=0)
    utilizations: dict[str, float] = Field(
        min_length=1, description="Target id prefix -> gpu_memory_utilization."
    )


@register_check("capacity_line", CapacityLineParams)
def check_capacity_line(claim: Claim, context: RunContext) -> CheckOutput:
    params: CapacityLineParams = claim.params
    output = CheckOutput()
    for prefix, utilization in params.utilizations.items():
        capacity = size_kv_pool(
            params.model, params.gpu, block_size=params.block_size, gpu_memory_utilization=utilization
        )
        lines = capacity.capacity_lines(params.max_model_len)
        detail = (
            f"weights {capacity.weight_bytes:,} B, activation reserve {capacity.activation_reserve_bytes:,} B, "
            f"KV {capacity.available_kv_bytes:,} B / {capacity.block_bytes:,} B per block = "
            f"{capacity.num_gpu_blocks:,} blocks. Log: {' | '.join(lines)}"
        )
        output.values[f"{prefix}_tokens"] = Measured(capacity.kv_pool_tokens, detail)
        output.values[f"{prefix}_concurrency"] = Measured(
            capacity.max_concurrency(params.max_model_len), detail
        )
        output.notes.append(f"gpu_memory_utilization {utilization}: `{lines[0]}`, `{lines[1]}`")
    return output


# -- claim 5: 7B KV product --------------------------------------------------------------------------


class KvProductParams(_Strict):
    model: str
    context_len: int = Field(gt=0)
    concurrency: int = Field(gt=0)
    gpu: str = Field(description="A GPU on which a pool of exactly that size can be sized.")
    block_size: int = Field(16, gt=0)


@register_check("kv_product", KvProductParams)
def check_kv_product(claim: Claim, context: RunContext) -> CheckOutput:
    params: KvProductParams = claim.params
    model = resolve_model(params.model)
    per_token = model.kv_bytes_per_token()
    total = per_token * params.context_len * params.concurrency
    weights = model.weight_bytes()
    output = CheckOutput()
    output.values["kv_total_gib"] = Measured(
        total / GiB,
        f"{per_token:,} B/token x {params.context_len} x {params.concurrency} = {total:,} B = "
        f"{total / GiB:g} GiB = {total / GB:.2f} GB (10^9).",
    )
    output.values["weights_gb"] = Measured(
        weights / GB, f"{model.num_params:,} params x 2 B = {weights / GB:.2f} GB = {weights / GiB:.2f} GiB."
    )
    output.values["kv_over_weights"] = Measured(
        total / weights, f"{total / GB:.1f} GB / {weights / GB:.1f} GB."
    )
    capacity = size_kv_pool(
        model,
        params.gpu,
        block_size=params.block_size,
        kv_cache_memory_bytes=total,
        activation_reserve_bytes=0,
    )
    output.values["pool_concurrency"] = Measured(
        capacity.max_concurrency(params.context_len),
        " | ".join(capacity.capacity_lines(params.context_len)),
    )
    return output


# -- claim 7: tail waste -----------------------------------------------------------------------------


class TailWasteParams(_Strict):
    seq_len: int = Field(gt=0)
    block_sizes: dict[str, int] = Field(min_length=1, description="Target id -> block size.")
    plot_max_len: int = Field(320, gt=0)


def tail_waste(seq_len: int, block_size: int) -> tuple[float, MemoryBreakdown]:
    """Unfilled share of the blocks a finished sequence of ``seq_len`` tokens holds, read from the
    paged policy's breakdown."""
    blocks = -(-seq_len // block_size) + 1
    policy = make_policy("paged", PoolSpec(blocks * block_size, block_size, seq_len))
    policy.admit(1, token_ids(range(seq_len)), seq_len, output_content_id=-1)
    breakdown = policy.breakdown()
    allocated = breakdown.used + breakdown.reserved + breakdown.internal_fragmentation
    return (allocated - breakdown.used) / allocated, breakdown


@register_check("tail_waste", TailWasteParams)
def check_tail_waste(claim: Claim, context: RunContext) -> CheckOutput:
    params: TailWasteParams = claim.params
    output = CheckOutput()
    for target, block in params.block_sizes.items():
        waste, breakdown = tail_waste(params.seq_len, block)
        allocated = breakdown.used + breakdown.internal_fragmentation + breakdown.reserved
        output.values[target] = Measured(
            waste,
            f"block {block}: {params.seq_len} tokens -> {allocated // block} blocks = {allocated} slots, "
            f"{allocated - breakdown.used} unfilled: {allocated - breakdown.used}/{allocated} = {waste:.2%}.",
        )
    lengths = np.arange(1, params.plot_max_len + 1)
    sizes = sorted(set(params.block_sizes.values()))
    table = pd.DataFrame({"seq_len": lengths})
    for block in sizes:
        table[f"waste_block_{block}"] = [tail_waste(int(n), block)[0] for n in lengths]
    output.tables["tail_waste"] = table
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for block in sizes:
        ax.plot(lengths, table[f"waste_block_{block}"] * 100, label=f"block {block}", lw=1)
        waste = tail_waste(params.seq_len, block)[0]
        ax.plot([params.seq_len], [waste * 100], "o")
    ax.axvline(params.seq_len, color="grey", ls=":", lw=1)
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("tail waste (% of allocated slots)")
    ax.set_title("Tail waste of one finished sequence (paged policy breakdown)")
    ax.legend()
    fig.tight_layout()
    path, relative = context.figure_path(f"{claim.name}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    output.figures.append(relative)
    means = {block: float(table[f"waste_block_{block}"].mean()) for block in sizes}
    output.notes.append(
        "Mean tail waste over lengths 1-"
        f"{params.plot_max_len}: "
        + ", ".join(f"block {block}: {value:.1%}" for block, value in means.items())
        + ". Larger blocks waste more on average ((B-1)/2 unfilled slots per sequence); a given length "
        "can waste the same at two block sizes."
    )
    return output


# -- claim 2: Fig. 13 Orca(Max) cap ------------------------------------------------------------------


class Fig13Params(_Strict):
    cap_variant: str = Field(description="The contiguous max-reservation variant.")
    cap_cases: list[str] = Field(min_length=1, description="Cases at loads above saturation.")
    batch_case: str = Field(description="Case whose variants give the Fig. 13 mean batch sizes.")


@register_check(
    "fig13_max_cap",
    Fig13Params,
    needs_experiment=True,
    cases=lambda p: sorted({*p.cap_cases, p.batch_case}),
)
def check_fig13(claim: Claim, context: RunContext) -> CheckOutput:
    params: Fig13Params = claim.params
    output = CheckOutput()
    base_dir = claim.path.parent
    peaks = []
    rows = []
    for case in params.cap_cases:
        config = claim.config(case, fast=context.fast)
        variants = None if case == params.batch_case else [params.cap_variant]
        results = run_config(config, base_dir, variants)
        for name, result in results.items():
            saturated = saturated_means(result.timeseries, int(result.summary["kv_pool_tokens"]))
            rows.append(
                {
                    "case": case,
                    "variant": name,
                    "mean_running": result.summary["mean_running"],
                    "saturated_running": saturated["running"],
                    "saturated_s": saturated["saturated_s"],
                    "simulated_s": result.summary["simulated_s"],
                    "peak_running": result.summary["peak_running"],
                    "kv_pool_tokens": result.summary["kv_pool_tokens"],
                    "preemptions": result.summary["preemptions"],
                }
            )
            if name == params.cap_variant:
                peaks.append(int(result.summary["peak_running"]))
                pool = int(result.summary["kv_pool_tokens"])
                output.values[f"saturated_mean_batch@{case}"] = Measured(
                    saturated["running"],
                    f"{case}: mean running over the {saturated['saturated_s']:.0f} s (of "
                    f"{result.summary['simulated_s']:.0f} s) with a request waiting; whole-run mean "
                    f"{result.summary['mean_running']:.2f}; pool {pool:,} slots, floor({pool:,}/2048) = "
                    f"{pool // 2048}. {describe_lengths(result.requests)}.",
                )
            elif case == params.batch_case:
                output.values[f"mean_batch@{name}"] = Measured(
                    result.summary["mean_running"],
                    f"{name}: whole-run mean running {result.summary['mean_running']:.2f} "
                    f"(peak {result.summary['peak_running']}), decode at the analytic roofline's speed.",
                )
    output.values["peak_batch"] = Measured(max(peaks), f"peak running per case: {peaks}.")
    output.tables["batch_sizes"] = pd.DataFrame(rows)
    return output


# -- claim 3: Fig. 2 memory shares -------------------------------------------------------------------


class Fig2Params(_Strict):
    rates: list[float] = Field(min_length=1, description="Request rates swept (req/s).")
    fast_rates: list[float] = Field(min_length=1)
    reference_rate: float = Field(gt=0, description="The rate the verdicts are read at.")
    variants: dict[str, str] = Field(min_length=1, description="Variant name -> label in figures.")

    @model_validator(mode="after")
    def _reference_swept(self) -> Fig2Params:
        if self.reference_rate not in self.rates or self.reference_rate not in self.fast_rates:
            raise ValueError("reference_rate must be in rates and in fast_rates")
        return self


FIG2_METRICS = ("token_states", "reservation", "internal", "others", "token_states_busy")


def fig2_shares(result: VariantResult) -> dict[str, float]:
    """The paper's Fig. 2 columns from one run (whole-run time averages, fractions of the pool).

    * token states = used; reservation = reserved (slots that will be filled later);
    * internal = the reservation rule's overshoot beyond the final length (the paper's definition;
      a buddy allocator's rounding to a power of two is not in it: the paper shows no internal
      fragmentation for Oracle although it runs on a buddy allocator);
    * others = everything else: external fragmentation, buddy rounding and idle free memory
      ("idle free memory counts as others");
    * token_states_busy = token states / (pool - idle free memory): the alternative reading in which
      free memory that the next request could use is left out.
    """
    summary = result.summary
    used = summary["mean_used_frac"]
    reserved = summary["mean_reserved_frac"]
    internal_total = summary["mean_internal_frag_frac"]
    free = summary["mean_free_frac"] + summary["mean_cached_frac"]
    options = summary["policy_options"]
    if summary["policy"] == "contiguous":
        rule, rounding = contiguous_internal_split(result, options["reservation"], options["placement"])
        if abs(rule + rounding - internal_total) > 2e-3:
            raise AssertionError(
                f"{summary['variant']}: internal split {rule:.4f} + {rounding:.4f} != {internal_total:.4f}"
            )
    else:
        rule, rounding = internal_total, 0.0
    busy = 1.0 - free
    return {
        "token_states": used,
        "reservation": reserved,
        "internal": rule,
        "buddy_rounding": rounding,
        "external": summary["mean_external_frag_frac"],
        "idle_free": free,
        "others": 1.0 - used - reserved - rule,
        "token_states_busy": used / busy if busy > 0 else float("nan"),
        "mean_running": summary["mean_running"],
        "live_tokens_per_running_request": (
            used * summary["kv_pool_tokens"] / summary["mean_running"]
            if summary["mean_running"]
            else float("nan")
        ),
        "preemptions": summary["preemptions"],
    }


@register_check("fig2_shares", Fig2Params, needs_experiment=True)
def check_fig2(claim: Claim, context: RunContext) -> CheckOutput:
    params: Fig2Params = claim.params
    output = CheckOutput()
    rates = params.fast_rates if context.fast else params.rates
    rows = []
    lengths = ""
    for rate in rates:
        config = claim.config(overrides={"workload": {"arrival": {"rate_per_s": rate}}}, fast=context.fast)
        results = run_config(config, claim.path.parent, list(params.variants))
        context.log(f"  rate {rate:g} req/s done")
        for name, result in results.items():
            rows.append({"rate_per_s": rate, "variant": name} | fig2_shares(result))
            lengths = lengths or describe_lengths(result.requests)
    table = pd.DataFrame(rows)
    output.tables["shares_vs_rate"] = table
    targets = {t.id: t for t in claim.spec.targets}

    def holds_at(target_id: str, rate: float) -> bool:
        target = targets[target_id]
        metric, variant = target_id.split("/", 1)
        value = float(table[(table.rate_per_s == rate) & (table.variant == variant)][metric].iloc[0])
        assert target.tolerance is not None and target.expected is not None
        return target.tolerance.accepts(target.expected, value)

    def rate_list(selected: list[float]) -> str:
        return ", ".join(f"{r:g}" for r in selected) + " req/s" if selected else "none of the swept rates"

    reference = table[table.rate_per_s == params.reference_rate]
    for target_id in targets:
        metric, variant = target_id.split("/", 1)
        if metric not in FIG2_METRICS or variant not in params.variants:
            raise ConfigError(
                f"{claim.path}: target {target_id!r} is not <metric>/<variant> of {FIG2_METRICS}"
            )
        row = reference[reference.variant == variant].iloc[0]
        matching = [rate for rate in rates if holds_at(target_id, rate)]
        by_rate = ", ".join(
            f"{r:g}: {table[(table.rate_per_s == r) & (table.variant == variant)][metric].iloc[0]:.1%}"
            for r in rates
        )
        output.values[target_id] = Measured(
            float(row[metric]),
            f"At {params.reference_rate:g} req/s {variant} has token states {row.token_states:.1%}, "
            f"reservation {row.reservation:.1%}, internal {row.internal:.1%}, buddy rounding "
            f"{row.buddy_rounding:.1%}, external {row.external:.1%}, idle free {row.idle_free:.1%}; "
            f"mean batch {row.mean_running:.1f}, {row.live_tokens_per_running_request:.0f} live tokens per running "
            f"request. By rate (req/s: value): {by_rate}. Within tolerance at: "
            f"{rate_list(matching)}.",
        )
    primary = [t.id for t in claim.spec.targets if not t.secondary and t.id.startswith("token_states/")]
    busy = [t.id for t in claim.spec.targets if t.id.startswith("token_states_busy/")]
    all_primary = [r for r in rates if all(holds_at(t, r) for t in primary)]
    all_busy = [r for r in rates if all(holds_at(t, r) for t in busy)]
    output.notes.append(f"Workload as generated: {lengths}.")
    output.notes.append(
        "Rates at which all four token-state shares hold, idle free memory counted as 'others': "
        f"{rate_list(all_primary)}; with idle free memory left out: {rate_list(all_busy)}."
    )
    never = [t for t in primary if not any(holds_at(t, r) for r in rates)]
    if never and len(never) < len(primary):
        rest = [t for t in primary if t not in never]
        together = [r for r in rates if all(holds_at(t, r) for t in rest)]
        output.notes.append(
            f"Leaving out {', '.join(targets[t].label for t in never)} (within tolerance at no swept rate), "
            f"the other token-state shares hold together at {rate_list(together)}."
        )
    for target_id in primary:
        label = targets[target_id].label
        output.notes.append(
            f"{label}: within tolerance at {rate_list([r for r in rates if holds_at(target_id, r)])} "
            f"(idle free counted as others); at {rate_list([r for r in rates if holds_at(target_id.replace('token_states/', 'token_states_busy/'), r)])} "
            "with idle free memory left out."
            if target_id.replace("token_states/", "token_states_busy/") in targets
            else f"{label}: within tolerance at {rate_list([r for r in rates if holds_at(target_id, r)])}."
        )
    output.figures.extend(_fig2_figures(claim, context, table, params, targets))
    return output


def _fig2_figures(
    claim: Claim, context: RunContext, table: pd.DataFrame, params: Fig2Params, targets: dict[str, Target]
) -> list[str]:
    plt = _pyplot()
    figures = []
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (variant, label) in enumerate(params.variants.items()):
        rows = table[table.variant == variant]
        colour = colours[i % len(colours)]
        ax.plot(rows.rate_per_s, rows.token_states * 100, "o-", color=colour, label=f"{label}")
        ax.plot(rows.rate_per_s, rows.token_states_busy * 100, "x:", color=colour, lw=1)
        target = targets.get(f"token_states/{variant}")
        if target is not None and target.expected is not None:
            ax.axhline(target.expected * 100, color=colour, ls="--", lw=0.8)
    ax.set_xlabel("request rate (req/s, Poisson)")
    ax.set_ylabel("token states (% of KV pool)")
    ax.set_title("Fig. 2 token-state share vs rate (dashed: paper; dotted x: idle free left out)")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path, relative = context.figure_path(f"{claim.name}_vs_rate.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    figures.append(relative)

    columns = ("token_states", "reservation", "internal", "others")
    colours_by_column = ("#2b8a3e", "#74b816", "#f08c00", "#adb5bd")
    panels = sorted({params.reference_rate, max(table.rate_per_s)})
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.4), squeeze=False)
    for ax, rate in zip(axes[0], panels, strict=True):
        at_rate = table[table.rate_per_s == rate]
        labels, stacks = [], []
        for variant, label in params.variants.items():
            short = textwrap.fill(label, 9)
            paper = [targets.get(f"{c}/{variant}") for c in columns]
            expected = [t.expected if t is not None else None for t in paper]
            if all(value is not None for value in expected):
                labels.append(f"{short}\npaper")
                stacks.append([float(value) for value in expected if value is not None])
            elif expected[0] is not None:
                labels.append(f"{short}\npaper")
                stacks.append([expected[0], 0.0, 0.0, 1 - expected[0]])
            row = at_rate[at_rate.variant == variant].iloc[0]
            labels.append(f"{short}\nsim")
            stacks.append([float(row[c]) for c in columns])
        bottoms = np.zeros(len(stacks))
        for j, column in enumerate(columns):
            heights = np.array([stack[j] for stack in stacks]) * 100
            ax.bar(range(len(stacks)), heights, bottom=bottoms, color=colours_by_column[j], label=column)
            bottoms += heights
        ax.set_xticks(range(len(stacks)), labels, fontsize=7)
        ax.set_ylabel("% of KV pool")
        ax.set_title(f"paper vs simulated at {rate:g} req/s", fontsize=10)
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    fig.suptitle("Fig. 2 breakdown ('others' includes idle free memory)")
    fig.tight_layout()
    path, relative = context.figure_path(f"{claim.name}_breakdown.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    figures.append(relative)
    return figures


# -- claim 4: block size sweep -----------------------------------------------------------------------


class BlockSizeParams(_Strict):
    block_sizes: list[int] = Field(min_length=2)
    fast_block_sizes: list[int] = Field(min_length=2)
    base_block: int = 16
    alike_blocks: list[int] = Field(description="Blocks whose batch must be alike (ShareGPT claim).")
    large_block: int = 128
    workloads: dict[str, str] = Field(min_length=1, description="Case -> label.")

    @model_validator(mode="after")
    def _blocks(self) -> BlockSizeParams:
        for sizes in (self.block_sizes, self.fast_block_sizes):
            missing = {self.base_block, self.large_block} - set(sizes)
            if missing:
                raise ValueError(f"block sizes {sizes} must include {sorted(missing)}")
        if not set(self.alike_blocks) <= set(self.block_sizes):
            raise ValueError("alike_blocks must be among block_sizes")
        return self


def block_waste(means: dict[str, float]) -> float:
    """Share of allocated slots holding no token state (tail blocks: reserved + internal)."""
    allocated = means["used"] + means["reserved"] + means["internal_fragmentation"]
    return (means["reserved"] + means["internal_fragmentation"]) / allocated if allocated else float("nan")


@register_check("block_size_sweep", BlockSizeParams, needs_experiment=True, cases=lambda p: list(p.workloads))
def check_block_size(claim: Claim, context: RunContext) -> CheckOutput:
    params: BlockSizeParams = claim.params
    output = CheckOutput()
    sizes = params.fast_block_sizes if context.fast else params.block_sizes
    rows = []
    for case in params.workloads:
        for block in sizes:
            config = claim.config(case, {"engine": {"block_size": block}}, fast=context.fast)
            (result,) = run_config(config, claim.path.parent).values()
            pool = int(result.summary["kv_pool_tokens"])
            saturated = saturated_means(result.timeseries, pool)
            rows.append(
                {
                    "case": case,
                    "block_size": block,
                    "kv_pool_tokens": pool,
                    "saturated_running": saturated["running"],
                    "saturated_waste": block_waste(saturated),
                    "saturated_used": saturated["used"],
                    "saturated_s": saturated["saturated_s"],
                    "preemptions": result.summary["preemptions"],
                    "lengths": describe_lengths(result.requests),
                }
            )
        context.log(f"  {case} done")
    table = pd.DataFrame(rows)
    output.tables["block_sweep"] = table.drop(columns=["lengths"])

    def value(case: str, block: int, column: str) -> float:
        return float(table[(table.case == case) & (table.block_size == block)][column].iloc[0])

    for case in params.workloads:
        base = value(case, params.base_block, "saturated_running")
        ratios = {b: value(case, b, "saturated_running") / base for b in sizes}
        summary = "; ".join(
            f"block {b}: batch {value(case, b, 'saturated_running'):.1f} ({ratios[b]:.2f}x), "
            f"waste {value(case, b, 'saturated_waste'):.1%}"
            for b in sizes
        )
        lengths = table[table.case == case].lengths.iloc[0]
        output.values[f"{case}/batch_ratio_{params.large_block}"] = Measured(
            ratios[params.large_block], f"{case}: {summary}. {lengths}."
        )
        alike = [b for b in params.alike_blocks if b in sizes]
        worst = min(alike, key=lambda b: ratios[b])
        output.values[f"{case}/min_batch_ratio"] = Measured(
            ratios[worst], f"{case}: lowest at block {worst}. {summary}."
        )
        waste_ratio = value(case, params.large_block, "saturated_waste") / value(
            case, params.base_block, "saturated_waste"
        )
        output.values[f"{case}/waste_{params.large_block}"] = Measured(
            value(case, params.large_block, "saturated_waste"), f"{case}: {summary}."
        )
        output.values[f"{case}/waste_ratio_{params.large_block}"] = Measured(
            waste_ratio, f"{case}: {summary}."
        )
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8))
    for case, label in params.workloads.items():
        rows_case = table[table.case == case]
        base = value(case, params.base_block, "saturated_running")
        left.plot(rows_case.block_size, rows_case.saturated_running / base, "o-", label=label)
        right.plot(rows_case.block_size, rows_case.saturated_waste * 100, "o-", label=label)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.set_xlabel("block size (tokens)")
        ax.legend(fontsize=8)
    left.set_ylabel(f"saturated batch / batch at block {params.base_block}")
    right.set_ylabel("unfilled share of allocated slots (%)")
    fig.suptitle("Block-size sweep (paged, saturated: offline batch)")
    fig.tight_layout()
    path, relative = context.figure_path(f"{claim.name}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    output.figures.append(relative)
    return output


# -- claim 6: preallocation vs paged ------------------------------------------------------------------


class PreallocParams(_Strict):
    prealloc_variant: str
    paged_variant: str


@register_check("prealloc_vs_paged", PreallocParams, needs_experiment=True)
def check_prealloc(claim: Claim, context: RunContext) -> CheckOutput:
    params: PreallocParams = claim.params
    output = CheckOutput()
    config = claim.config(fast=context.fast)
    results = run_config(config, claim.path.parent, [params.prealloc_variant, params.paged_variant])
    means = {
        name: saturated_means(result.timeseries, int(result.summary["kv_pool_tokens"]))
        for name, result in results.items()
    }
    pre, paged = means[params.prealloc_variant], means[params.paged_variant]
    prealloc_result = results[params.prealloc_variant]
    pool = int(prealloc_result.summary["kv_pool_tokens"])
    lengths = describe_lengths(prealloc_result.requests)

    def describe(name: str) -> str:
        m = means[name]
        return (
            f"{name}: token states {m['used']:.1%} of the pool, reserved {m['reserved']:.1%}, internal "
            f"{m['internal_fragmentation']:.1%}, external {m['external_fragmentation']:.1%}, free "
            f"{m['free']:.1%}; batch {m['running']:.1f} (saturated intervals)"
        )

    both = f"{describe(params.prealloc_variant)}. {describe(params.paged_variant)}. Pool {pool:,} slots; {lengths}."
    output.values["prealloc_token_share"] = Measured(pre["used"], both)
    output.values["paged_token_share"] = Measured(paged["used"], both)
    output.values["concurrency_ratio"] = Measured(
        paged["running"] / pre["running"],
        f"batch {paged['running']:.1f} paged vs {pre['running']:.1f} preallocated "
        f"(floor({pool:,}/2048) = {pool // 2048}). {lengths}.",
    )
    return output


# -- claim 8: LLaMA-13B static allocation OOM ---------------------------------------------------------


class StaticOomParams(_Strict):
    gpu_gb: float = Field(gt=0)
    weights_gb: float = Field(gt=0)
    kv_per_request_gb: float = Field(gt=0)
    max_len: int = Field(gt=0)
    model: str = Field(description="A preset with the claim's model shapes.")
    concurrencies: list[int] = Field(min_length=1)
    fast_concurrencies: list[int] = Field(min_length=1)


@register_check("static_oom", StaticOomParams, needs_experiment=True)
def check_static_oom(claim: Claim, context: RunContext) -> CheckOutput:
    params: StaticOomParams = claim.params
    output = CheckOutput()
    model = resolve_model(params.model)
    per_request = model.kv_bytes_per_token() * params.max_len
    output.values["kv_per_request_gb"] = Measured(
        per_request / GB,
        f"{params.model} shapes: {model.kv_bytes_per_token():,} B/token x {params.max_len} = {per_request:,} B "
        f"= {per_request / GB:.2f} GB = {per_request / GiB:.3g} GiB in fp16; "
        f"{params.kv_per_request_gb} GB would need {params.kv_per_request_gb * GB / params.max_len:,.0f} B/token "
        f"({params.kv_per_request_gb * GB / per_request:.2f}x the fp16 size; fp32 would be 2x).",
    )
    left_gb = params.gpu_gb - params.weights_gb
    fit = math.floor(left_gb / params.kv_per_request_gb)
    output.values["article_arithmetic_oom_at"] = Measured(
        fit + 1,
        f"The article's own numbers: ({params.gpu_gb:g} - {params.weights_gb:g}) GB / "
        f"{params.kv_per_request_gb:g} GB = {left_gb / params.kv_per_request_gb:.2f} -> {fit} fit, the "
        f"{fit + 1}th OOMs. Its '2 concurrent' is {params.gpu_gb:g} / ({params.weights_gb:g} + "
        f"{params.kv_per_request_gb:g}) = {params.gpu_gb / (params.weights_gb + params.kv_per_request_gb):g}: it "
        "charges the weights once per request.",
        shown=f"{fit + 1} ({fit} fit)",
    )
    rows = []
    first_oom = None
    for concurrency in params.fast_concurrencies if context.fast else params.concurrencies:
        overrides = {"workload": {"num_requests": concurrency, "arrival": {"num_users": concurrency}}}
        config = claim.config(overrides=overrides, fast=context.fast)
        (result,) = run_config(config, claim.path.parent).values()
        failed = int(result.summary["requests_failed_oom"])
        rows.append(
            {
                "concurrency": concurrency,
                "failed_oom": failed,
                "peak_running": result.summary["peak_running"],
                "kv_pool_tokens": result.summary["kv_pool_tokens"],
            }
        )
        if failed and first_oom is None:
            first_oom = concurrency
    table = pd.DataFrame(rows)
    output.tables["oom_vs_concurrency"] = table
    pool = int(table.kv_pool_tokens.iloc[0])
    gib_fit = math.floor((params.gpu_gb * GiB - params.weights_gb * GB) / per_request)
    output.values["simulated_oom_at"] = Measured(
        first_oom,
        f"Engine, static max-length reservation, on_oom fail: pool {pool:,} slots = floor({pool:,}/"
        f"{params.max_len}) = {pool // params.max_len} requests; failures by concurrency: "
        + ", ".join(f"{r.concurrency}: {r.failed_oom}" for r in table.itertuples())
        + f". Reading 16 GB as GiB: {gib_fit} fit, OOM at {gib_fit + 1}.",
        shown="none" if first_oom is None else f"{first_oom} ({first_oom - 1} fit)",
    )
    return output


# -- claim 9a: 64-token block overhead ---------------------------------------------------------------


class BlockOverheadParams(_Strict):
    variant: str
    reference_variant: str | None = None


@register_check("block_overhead", BlockOverheadParams, needs_experiment=True)
def check_block_overhead(claim: Claim, context: RunContext) -> CheckOutput:
    params: BlockOverheadParams = claim.params
    output = CheckOutput()
    config = claim.config(fast=context.fast)
    names = [params.variant] + ([params.reference_variant] if params.reference_variant else [])
    results = run_config(config, claim.path.parent, names)
    details = []
    for name in names:
        result = results[name]
        means = saturated_means(result.timeseries, int(result.summary["kv_pool_tokens"]))
        waste = block_waste(means)
        fragmentation = means["reserved"] + means["internal_fragmentation"] + means["external_fragmentation"]
        details.append(
            f"{name} (block {result.summary['block_size']}): unfilled share of allocated slots {waste:.1%}, "
            f"non-token share of the pool {fragmentation:.1%}, free {means['free']:.1%}, batch "
            f"{means['running']:.1f}"
        )
        if name == params.variant:
            output.values["overhead"] = Measured(waste)
            output.values["fragmentation"] = Measured(fragmentation)
    detail = (
        "; ".join(details) + f". {describe_lengths(results[params.variant].requests)} (saturated intervals)."
    )
    for measured in output.values.values():
        measured.detail = detail
    return output


# -- claim 9b: shared system prompt saving ------------------------------------------------------------


class SystemPromptParams(_Strict):
    variant: str
    prefix_lens: list[int] = Field(min_length=1, description="System prompt lengths swept.")
    fast_prefix_lens: list[int] = Field(min_length=1)
    base_prefix_len: int = Field(gt=0, description="The length the verdict is read at.")

    @model_validator(mode="after")
    def _base_swept(self) -> SystemPromptParams:
        if self.base_prefix_len not in self.prefix_lens or self.base_prefix_len not in self.fast_prefix_lens:
            raise ValueError("base_prefix_len must be in prefix_lens and fast_prefix_lens")
        return self


@register_check("system_prompt_saving", SystemPromptParams, needs_experiment=True)
def check_system_prompt(claim: Claim, context: RunContext) -> CheckOutput:
    params: SystemPromptParams = claim.params
    output = CheckOutput()
    rows = []
    for prefix_len in params.fast_prefix_lens if context.fast else params.prefix_lens:
        overrides = {"workload": {"shared_prefix": {"prefix_len": prefix_len}}}
        config = claim.config(overrides=overrides, fast=context.fast)
        (result,) = run_config(config, claim.path.parent, [params.variant]).values()
        summary = result.summary
        rows.append(
            {
                "prefix_len": prefix_len,
                "memory_saved_by_sharing_frac": summary["memory_saved_by_sharing_frac"],
                "prefix_cache_hit_rate": summary["prefix_cache_hit_rate"],
                "mean_running": summary["mean_running"],
                "mean_used_frac": summary["mean_used_frac"],
                "requests": summary["requests_total"],
                "mean_prompt": float(result.requests["prompt_tokens"].mean()),
            }
        )
    table = pd.DataFrame(rows)
    output.tables["saving_vs_prefix"] = table
    base = table[table.prefix_len == params.base_prefix_len].iloc[0]
    sweep = ", ".join(
        f"{int(r.prefix_len)}: {r.memory_saved_by_sharing_frac:.1%}" for r in table.itertuples()
    )
    output.values["saving"] = Measured(
        float(base.memory_saved_by_sharing_frac),
        f"System prompt {params.base_prefix_len} tokens: memory saved by sharing "
        f"{base.memory_saved_by_sharing_frac:.1%} (time-averaged 1 - physical/logical blocks), prefix "
        f"cache hit rate {base.prefix_cache_hit_rate:.1%}, mean batch {base.mean_running:.1f}, mean prompt "
        f"{base.mean_prompt:.0f} tokens. By system prompt length: {sweep}.",
    )
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    ax.plot(table.prefix_len, table.memory_saved_by_sharing_frac * 100, "o-", label="memory saved by sharing")
    ax.axhspan(30, 50, color="#74b816", alpha=0.15, label="claim: 30-50 %")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(table.prefix_len), [str(int(x)) for x in table.prefix_len])
    ax.set_xlabel("shared system prompt (tokens)")
    ax.set_ylabel("% of logical KV saved")
    ax.set_title("Multi-turn chat with one shared system prompt (prefix + COW policy)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path, relative = context.figure_path(f"{claim.name}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    output.figures.append(relative)
    return output


# -- claim 9c: prefix reuse with one template ---------------------------------------------------------


class TemplateReuseParams(_Strict):
    variant: str
    other_cases: list[str] = Field(default_factory=list, description="Cases reported for context.")


@register_check("template_reuse", TemplateReuseParams, needs_experiment=True, cases=lambda p: p.other_cases)
def check_template_reuse(claim: Claim, context: RunContext) -> CheckOutput:
    params: TemplateReuseParams = claim.params
    output = CheckOutput()
    details = []
    for case in [None, *params.other_cases]:
        config = claim.config(case, fast=context.fast)
        (result,) = run_config(config, claim.path.parent, [params.variant]).values()
        summary = result.summary
        workload = config.workload
        few_shot = getattr(workload, "few_shot", None)
        template = (
            0 if few_shot is None else few_shot.instruction_len + few_shot.num_shots * int(few_shot.shot_len)
        )
        mean_prompt = float(result.requests["prompt_tokens"].mean())
        block = config.engine.block_size
        ideal = (template // block) * block / mean_prompt if mean_prompt else float("nan")
        text = (
            f"{case or 'main'}: template {template} tokens, mean prompt {mean_prompt:.0f}: hit rate "
            f"{summary['prefix_cache_hit_rate']:.1%} (block-aligned template share {ideal:.1%})"
        )
        details.append(text)
        if case is None:
            output.values["reuse"] = Measured(summary["prefix_cache_hit_rate"])
    output.values["reuse"].detail = "; ".join(details) + "."
    return output


# -- claim 9d: recompute vs reuse ---------------------------------------------------------------------


class RecomputeParams(_Strict):
    model: str
    gpu: str
    block_size: int = Field(gt=0)
    unique_len: int = Field(gt=0, description="Tokens after the prefix (the request's own part).")
    prefix_lens: list[int] = Field(min_length=1)
    report_prefix_len: int = Field(gt=0)


@register_check("recompute_vs_reuse", RecomputeParams)
def check_recompute(claim: Claim, context: RunContext) -> CheckOutput:
    params: RecomputeParams = claim.params
    model, gpu = resolve_model(params.model), resolve_gpu(params.gpu)
    costs = make_cost_model("analytic", model, gpu, block_size=params.block_size)
    rows = []
    for prefix in sorted(set(params.prefix_lens) | {params.report_prefix_len}):
        recompute = costs.prefill_s(prefix + params.unique_len, 0)
        reuse = costs.prefill_s(params.unique_len, prefix)
        rows.append(
            {
                "prefix_len": prefix,
                "prefill_recompute_ms": recompute * 1e3,
                "prefill_with_reuse_ms": reuse * 1e3,
                "saved_ms": (recompute - reuse) * 1e3,
                "cow_copy_one_block_us": costs.copy_blocks_s(1) * 1e6,
            }
        )
    table = pd.DataFrame(rows)
    output = CheckOutput(tables={"recompute_vs_reuse": table})
    row = table[table.prefix_len == params.report_prefix_len].iloc[0]
    output.values["short_prefix_recompute_faster"] = Measured(
        float(row.saved_ms),
        f"In the model ({params.model}, {params.gpu}, analytic roofline), reusing a {params.report_prefix_len}-token "
        f"prefix saves {row.saved_ms:.2f} ms of prefill for a {params.unique_len}-token suffix; the only "
        f"copy the simulator charges is a copy-on-write of a partly filled shared block "
        f"({row.cow_copy_one_block_us:.0f} us for one {params.block_size}-token block), which a prefix hit never "
        "causes (hits cover full blocks only). By prefix length (saved ms): "
        + ", ".join(f"{int(r.prefix_len)}: {r.saved_ms:.2f}" for r in table.itertuples())
        + ".",
        shown=f"reuse saves {row.saved_ms:.1f} ms at {params.report_prefix_len} tokens",
    )
    return output


# --------------------------------------------------------------------------------------------------
# Writing the results
# --------------------------------------------------------------------------------------------------


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def results_frame(results: list[ClaimResult]) -> pd.DataFrame:
    return pd.DataFrame([target.row() for result in results for target in result.targets])


def verdict_counts(results: list[ClaimResult]) -> dict[str, int]:
    counts = dict.fromkeys(VERDICTS, 0)
    for result in results:
        for target in result.targets:
            counts[target.verdict] += 1
    return counts


def markdown_table(results: list[ClaimResult], *, explanations: bool = True) -> str:
    header = ["#", "claim", "source", "setup", "expected", "simulated", "tolerance", "verdict"]
    if explanations:
        header.append("explanation")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for result in results:
        spec = result.claim.spec
        for i, target in enumerate(result.targets):
            label = target.target.label + (" (secondary)" if target.target.secondary else "")
            cells = [
                spec.number if i == 0 else "",
                label,
                spec.source if i == 0 else "〃",
                spec.setup if i == 0 else "〃",
                target.target.claimed,
                shown_value(target.target, target.measured),
                tolerance_text(target.target),
                f"**{target.verdict}**",
            ]
            if explanations:
                cells.append(target.explanation)
            lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(lines)


def markdown_report(results: list[ClaimResult], *, fast: bool, wall_s: float) -> str:
    counts = verdict_counts(results)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "# kvsim validation",
        "",
        f"Run {now}; mode: {'fast (reduced request counts and sweeps: indicative only)' if fast else 'full'}; "
        f"{len(results)} claim(s); {wall_s:.1f} s.",
        "",
        "Verdicts: " + ", ".join(f"{counts[v]} {v}" for v in VERDICTS) + ".",
        "",
        markdown_table(results),
        "",
        "## Claims",
    ]
    for result in results:
        spec = result.claim.spec
        parts += [
            "",
            f"### {spec.number}. {spec.title}",
            "",
            f"- Source: {spec.source}",
            f"- Quote: {spec.quote.strip()}",
            f"- Setup: {spec.setup}",
            f"- Config: `{result.claim.path.relative_to(REPO_ROOT) if result.claim.path.is_relative_to(REPO_ROOT) else result.claim.path}` "
            f"(check `{spec.check}`, {result.wall_s:.1f} s)",
        ]
        if spec.notes.strip():
            parts += ["", spec.notes.strip()]
        parts += [""]
        for target in result.targets:
            t = target.target
            parts.append(
                f"- **{t.label}**: claimed {t.claimed}; simulated {shown_value(t, target.measured)} "
                f"({t.compare}); tolerance {tolerance_text(t)}: **{target.verdict}**."
                + (f" {target.measured.detail}" if target.measured.detail else "")
                + (f" *Why:* {t.if_not_holds}" if target.verdict == DOES_NOT_HOLD and t.if_not_holds else "")
                + (f" *Why:* {t.not_reproducible}" if t.not_reproducible else "")
            )
        for note in result.output.notes:
            parts.append(f"- {note}")
        for figure in result.output.figures:
            parts += ["", f"![{spec.name}]({figure})"]
        for key in result.output.tables:
            parts.append(f"- Data: `data/{spec.name}__{key}.csv`")
    return "\n".join(parts) + "\n"


def run_validation(
    claims: list[Claim], out_dir: Path, *, fast: bool = False, log: Callable[[str], None] = lambda m: None
) -> tuple[Path, list[ClaimResult]]:
    """Run ``claims`` and write validation.csv, validation.md, figures/ and data/ to ``out_dir``
    (atomically: a temporary folder renamed at the end)."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    started = time.perf_counter()
    try:
        context = RunContext(staging, fast=fast, log=log)
        results = []
        for claim in claims:
            log(f"[{claim.spec.number}] {claim.name} ...")
            result = run_claim(claim, context)
            log(f"[{claim.spec.number}] {claim.name}: {result.wall_s:.1f} s")
            results.append(result)
            for key, table in result.output.tables.items():
                (staging / "data").mkdir(exist_ok=True)
                table.to_csv(staging / "data" / f"{claim.name}__{key}.csv", index=False)
        results_frame(results).to_csv(staging / "validation.csv", index=False)
        report = markdown_report(results, fast=fast, wall_s=time.perf_counter() - started)
        (staging / "validation.md").write_text(report)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir, results


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def cmd_validate(args: argparse.Namespace) -> int:
    config_dir = Path(args.configs) if args.configs else DEFAULT_CONFIG_DIR
    claims = load_claims(config_dir, args.names)
    if args.list:
        for claim in claims:
            print(
                f"{claim.spec.number:>4}  {claim.name:<40} {'fast' if claim.spec.fast else '    '}  {claim.spec.title}"
            )
        return 0
    out_dir = Path(args.output) if args.output else DEFAULT_OUTPUT_DIR
    log = (lambda message: None) if args.quiet else (lambda message: print(message, file=sys.stderr))
    started = time.perf_counter()
    out_dir, results = run_validation(claims, out_dir, fast=args.fast, log=log)
    wall = time.perf_counter() - started
    for result in results:
        for target in result.targets:
            spec, t = result.claim.spec, target.target
            print(
                f"{spec.number:>4}  {t.label[:58]:<58}  claimed {t.claimed[:18]:<18}  simulated "
                f"{shown_value(t, target.measured)[:30]:<30}  {target.verdict}"
            )
    counts = verdict_counts(results)
    print(
        f"kvsim validate: {len(results)} claim(s) in {wall:.1f} s: "
        + ", ".join(f"{counts[v]} {v}" for v in VERDICTS)
        + f"; written to {out_dir}/ (validation.md, validation.csv, figures/, data/)"
    )
    return 0


def register(subparsers: Any) -> None:
    """Add ``kvsim validate`` to the CLI's subcommands."""
    parser = subparsers.add_parser(
        "validate",
        help="reproduce published KV-cache numbers and say where they hold",
        description="Run the claims in configs/validation/ and write validation.md, validation.csv "
        "and figures. Verdicts: holds / does not hold / not reproducible.",
    )
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="claims to run: file names without .yaml, or claim numbers (default: all)",
    )
    parser.add_argument("-o", "--output", help=f"results folder (default: {DEFAULT_OUTPUT_DIR}/)")
    parser.add_argument("--fast", action="store_true", help="smaller request counts and sweeps (smoke run)")
    parser.add_argument("--configs", help=f"folder of claim YAMLs (default: {DEFAULT_CONFIG_DIR})")
    parser.add_argument("--list", action="store_true", help="list the claims and exit")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    parser.set_defaults(func=cmd_validate)
