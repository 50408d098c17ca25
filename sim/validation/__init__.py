"""``kvsim validate``: reproduce published numbers from shipped configs, and say where they hold.

Each file in ``configs/validation/`` is one claim: a published number or statement, its source and
quote, the setup to simulate and one or more targets with a tolerance. The claim's check computes
the simulated values and each target gets a verdict: holds, does not hold (with the explanation) or
not reproducible. The modules, in the order a claim goes through them:

* :mod:`.claims`: the claim-file schema, and loading and validating the files;
* :mod:`.registry`: the check interface and the registry ``CHECKS`` that claims name checks from;
* :mod:`.checks_vllm`, :mod:`.checks_seeds`, :mod:`.checks_costs`, :mod:`.checks_disaggregation`: the
  checks of the vLLM paper, of the seed articles, of the cost models and of published disaggregation
  results (importing this package registers them), on top of
  :mod:`.runs`, the helpers they share;
* :mod:`.judging`: running one claim's check and judging each target;
* :mod:`.report`: running the claims and writing validation.csv, validation.md and figures;
* :mod:`.cli`: the ``kvsim validate`` subcommand.
"""

from __future__ import annotations

# Imported for their side effect: they register their checks in CHECKS.
from sim.validation import (  # noqa: F401
    checks_costs,
    checks_disaggregation,
    checks_replays,
    checks_seeds,
    checks_vllm,
)
from sim.validation.checks_seeds import tail_waste
from sim.validation.claims import Claim, Target, Tolerance, deep_merge, load_claim, load_claims
from sim.validation.cli import register
from sim.validation.judging import (
    DOES_NOT_HOLD,
    HOLDS,
    NOT_REPRODUCIBLE,
    VERDICTS,
    ClaimResult,
    TargetResult,
    judge,
    run_claim,
)
from sim.validation.registry import CHECKS, Check, CheckOutput, Measured, RunContext, register_check
from sim.validation.report import run_validation
from sim.validation.runs import (
    contiguous_internal_split,
    interval_frame,
    run_config,
    saturated_means,
    steady_window,
    window_means,
)

__all__ = [
    "CHECKS",
    "DOES_NOT_HOLD",
    "HOLDS",
    "NOT_REPRODUCIBLE",
    "VERDICTS",
    "Check",
    "CheckOutput",
    "Claim",
    "ClaimResult",
    "Measured",
    "RunContext",
    "Target",
    "TargetResult",
    "Tolerance",
    "contiguous_internal_split",
    "deep_merge",
    "interval_frame",
    "judge",
    "load_claim",
    "load_claims",
    "register",
    "register_check",
    "run_claim",
    "run_config",
    "run_validation",
    "saturated_means",
    "steady_window",
    "tail_waste",
    "window_means",
]
