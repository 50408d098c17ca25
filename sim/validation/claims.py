"""Claim files: the schema of ``configs/validation/*.yaml`` and their loading.

Each file is one *claim* (a published number or statement) with:

* ``claim:`` where it comes from (source, the exact quote), the setup, the *check* that computes it
  (a function registered in :data:`sim.validation.registry.CHECKS`), check parameters, and one or
  more *targets*: expected value, units, tolerance (stated next to the value), what simulated
  quantity is compared, and, where the simulator cannot decide a target, why;
* ``experiment:`` (optional) an experiment config exactly as ``kvsim run`` reads it
  (:class:`sim.config.ExperimentConfig`), ``cases:`` named overrides of it (deep-merged), and
  ``fast_overrides:`` merged into every experiment under ``--fast``.

Everything is validated with pydantic (``extra="forbid"``) when the file is loaded, the experiments
included, so a typo fails before anything runs.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from sim.config import ConfigError, ExperimentConfig, format_problems, validate_experiment, yaml_mapping
from sim.validation.registry import checks
from workloads.config_base import ConfigModel

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG_DIR = REPO_ROOT / "configs" / "validation"


# --------------------------------------------------------------------------------------------------
# Schema of a claim file
# --------------------------------------------------------------------------------------------------


class _Strict(ConfigModel):
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
        if value not in checks():
            raise ValueError(f"unknown check {value!r}; known checks: {', '.join(sorted(checks()))}")
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
    return format_problems(
        f"{path}: invalid {what}",
        error.errors(),
        location=lambda problem: list(problem["loc"]),
        key_prefix=prefix,
    )


def load_claim(path: str | Path) -> Claim:
    """Read and validate one claim file (spec, check parameters and every experiment it builds)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such claim file")
    data = yaml_mapping(path)
    try:
        parsed = ClaimFile.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_format_claim_error(error, path, "validation claim")) from None
    spec = parsed.claim
    if spec.name != path.stem:
        raise ConfigError(f"{path}: claim.name {spec.name!r} must equal the file name {path.stem!r}")
    check = checks()[spec.check]
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
