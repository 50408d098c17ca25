"""Sim-to-real claims (configs ``sim-to-real-*.yaml``): measured vLLM runs replayed with kvsim's
default cost model, their mean TTFT, TPOT and mean E2E against the measured ones.
"""

from __future__ import annotations

import math
import re
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import Field

from sim.validation.claims import Claim, _Strict
from sim.validation.registry import CheckOutput, Measured, RunContext, register_check

REPO_ROOT = Path(__file__).resolve().parents[2]
FAST_MAX_REQUESTS = 1000
"""Under ``--fast`` only runs of at most this many requests are replayed (the longer ones take
seconds each)."""
FIGURES = {"ttft": "ttft_mean", "tpot": "tpot", "e2e": "e2e_mean"}


class SimToRealParams(_Strict):
    replays: list[str] = Field(min_length=1, description="Replay files (relative to the project root).")


def published_errors(run_path: Path) -> dict[str, float] | None:
    """LLMServingSim's own in-sample errors of its prediction, from the run's ``validation/summary.txt``
    (its ``Diff%`` column of the TTFT, TPOT and latency means), or None when the run has none."""
    summary = run_path / "validation" / "summary.txt"
    if not summary.is_file():
        return None
    found: dict[str, float] = {}
    for line in summary.read_text(encoding="utf-8").splitlines():
        match = re.match(r"(TTFT|TPOT|Latency) Mean\s+\S+\s+\S+\s+([+-]?[\d.]+)%", line.strip())
        if match:
            found[{"TTFT": "ttft", "TPOT": "tpot", "Latency": "e2e"}[match.group(1)]] = (
                float(match.group(2)) / 100
            )
    return found or None


def _replay(path: Path, fast: bool) -> tuple[str, dict[str, float] | None, str, Path | None]:
    """(name, signed errors or None, why not, the run's path) for one replay file."""
    from sim.config import ConfigError
    from sim.replay.pipeline import replay_run
    from sim.replay.spec import load_replay_spec, read_run

    spec = load_replay_spec(path)
    try:
        run = read_run(spec, path.parent)
    except ConfigError as error:
        return spec.name, None, f"the measured run is not here ({error}); see reference_runs/README.md", None
    if fast and len(run.requests) > FAST_MAX_REQUESTS:
        return spec.name, None, f"not replayed under --fast ({len(run.requests):,} requests)", run.path
    with tempfile.TemporaryDirectory(prefix="kvsim-sim-to-real-") as work:
        outcome = replay_run(spec, path.parent, Path(work) / "replay")
    headline = outcome.document["headline"]
    return spec.name, {key: headline[field] for key, field in FIGURES.items()}, "", run.path


@register_check("sim_to_real", SimToRealParams)
def check_sim_to_real(claim: Claim, context: RunContext) -> CheckOutput:
    """Targets ``<replay name>/{ttft,tpot,e2e}``: the absolute signed error of that figure (mean
    TTFT, the publisher's TPOT, mean E2E); ``mean/{ttft,tpot,e2e}``: the mean of those over the runs
    replayed."""
    params = SimToRealParams.model_validate(claim.spec.params)
    output = CheckOutput()
    rows = []
    errors: dict[str, list[float]] = {key: [] for key in FIGURES}
    for relative in params.replays:
        name, run_errors, why, run_path = _replay(REPO_ROOT / relative, context.fast)
        published = published_errors(run_path) if run_path is not None else None
        for key in FIGURES:
            if run_errors is None:
                output.values[f"{name}/{key}"] = Measured(None, why)
                continue
            error = run_errors[key]
            errors[key].append(abs(error))
            theirs = (
                ""
                if published is None
                else f"; LLMServingSim's own in-sample prediction: {published[key]:+.1%}"
            )
            output.values[f"{name}/{key}"] = Measured(
                abs(error), f"signed {error:+.1%}{theirs}", f"{error:+.1%}"
            )
        rows.append(
            {
                "run": name,
                **{f"{key}_error": (run_errors or {}).get(key, math.nan) for key in FIGURES},
                **{f"llmservingsim_{key}_error": (published or {}).get(key, math.nan) for key in FIGURES},
                "note": why,
            }
        )
    replayed = len(errors["ttft"])
    for key in FIGURES:
        values = errors[key]
        detail = f"mean of |error| over the {replayed} run(s) replayed"
        output.values[f"mean/{key}"] = Measured(float(np.mean(values)) if values else None, detail)
    output.tables["runs"] = pd.DataFrame(rows)
    output.notes.append(
        "Each run replayed by `kvsim replay-run` with its recorded server settings and kvsim's default "
        "cost model (derated, with the shipped serving calibration); errors are simulated / measured - 1. "
        "Runs whose files are not in the project (BLIS's H100 runs carry no licence) count only where "
        "they have been fetched (reference_runs/blis-h100-vllm-0.15/README.md)."
    )
    return output
