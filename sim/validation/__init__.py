"""``kvsim validate``: reproduce published numbers from shipped configs, and say where they hold.

Each file in ``configs/validation/`` is one claim: a published number or statement, its source and
quote, the setup to simulate and one or more targets with a tolerance. The claim's check computes
the simulated values and each target gets a verdict: holds, does not hold (with the explanation) or
not reproducible. The modules, in the order a claim goes through them:

* :mod:`.claims`: the claim-file schema, and loading and validating the files;
* :mod:`.registry`: the check interface and the registry ``CHECKS`` that claims name checks from;
* :mod:`.checks_vllm`, :mod:`.checks_seeds`, :mod:`.checks_costs`, :mod:`.checks_disaggregation`,
  :mod:`.checks_replays`: the checks of the vLLM paper, of the seed articles, of the cost models, of
  published disaggregation results and of measured runs (:func:`.registry.checks` imports them), on
  top of
  :mod:`.runs`, the helpers they share;
* :mod:`.judging`: running one claim's check and judging each target;
* :mod:`.report`: running the claims and writing validation.csv, validation.md and figures;
* :mod:`.cli`: the ``kvsim validate`` subcommand.
"""

from __future__ import annotations

import importlib
from typing import Any

# The names below are imported on first use (PEP 562): every ``kvsim`` command registers
# ``kvsim validate`` at start-up, and the checks' imports would add about half a second to each.
_EXPORTS = {
    "tail_waste": "checks_seeds",
    "Claim": "claims",
    "Target": "claims",
    "Tolerance": "claims",
    "deep_merge": "claims",
    "load_claim": "claims",
    "load_claims": "claims",
    "register": "cli",
    "DOES_NOT_HOLD": "judging",
    "HOLDS": "judging",
    "NOT_REPRODUCIBLE": "judging",
    "VERDICTS": "judging",
    "ClaimResult": "judging",
    "TargetResult": "judging",
    "judge": "judging",
    "run_claim": "judging",
    "CHECKS": "registry",
    "Check": "registry",
    "CheckOutput": "registry",
    "Measured": "registry",
    "RunContext": "registry",
    "register_check": "registry",
    "run_validation": "report",
    "contiguous_internal_split": "runs",
    "interval_frame": "runs",
    "run_config": "runs",
    "saturated_means": "runs",
    "steady_window": "runs",
    "window_means": "runs",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sim.validation' has no attribute {name!r}")
    importlib.import_module("sim.validation.registry").checks()  # CHECKS complete, as before
    value = getattr(importlib.import_module(f"sim.validation.{module}"), name)
    globals()[name] = value
    return value
