"""Checks of how kvsim's default costs transfer to GPUs no fitted run measured (configs
``transfer-*.yaml``): a published closed-loop benchmark's median TPOT and TTFT at several
concurrencies, replayed as a workload of the same shape (issue 37, docs/gpu-transfer.md)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from pydantic import Field

from sim.validation.claims import Claim, _Strict
from sim.validation.registry import CheckOutput, Measured, RunContext, register_check


class MeasuredPoint(_Strict):
    concurrency: int = Field(gt=0)
    tpot_p50_s: float = Field(gt=0)
    ttft_p50_s: float = Field(gt=0)


class ClosedLoopParams(_Strict):
    model: str
    gpu: str
    engine: dict = Field(
        default_factory=dict, description="The server's settings, as an experiment's engine:."
    )
    prompt_len: dict | int = Field(description="The prompts' lengths in tokens (a number or a distribution).")
    output_len: int = Field(gt=0)
    num_requests: int = Field(gt=0, description="Requests each measured point sent.")
    points: list[MeasuredPoint] = Field(min_length=1)


@register_check("closed_loop_points", ClosedLoopParams)
def check_closed_loop_points(claim: Claim, context: RunContext) -> CheckOutput:
    """Targets ``c<N>/tpot_p50`` and ``c<N>/ttft_p50``: kvsim's medians of a closed loop of ``N`` users
    sending the benchmark's requests, with its default cost model."""
    import yaml

    from sim.config import load_experiment
    from sim.runner import run_experiment

    params: ClosedLoopParams = claim.params
    output = CheckOutput()
    with tempfile.TemporaryDirectory() as folder:
        for point in params.points:
            experiment = {
                "name": f"closed-loop-c{point.concurrency}",
                "model": params.model,
                "gpu": params.gpu,
                "seed": 1,
                "engine": params.engine,
                "workload": {
                    "num_requests": params.num_requests,
                    "arrival": {"kind": "closed_loop", "num_users": point.concurrency},
                    "prompt_len": params.prompt_len,
                    "output_len": params.output_len,
                },
                "variants": [{"name": "server", "policy": "prefix"}],
                "output": {"figures": False},
            }
            path = Path(folder) / f"c{point.concurrency}.yaml"
            path.write_text(yaml.safe_dump(experiment))
            (result,) = run_experiment(load_experiment(path), Path(folder) / f"out-c{point.concurrency}")
            summary = result.summary
            for metric, measured in (("tpot_p50", point.tpot_p50_s), ("ttft_p50", point.ttft_p50_s)):
                simulated = float(summary[f"{metric}_s"])
                detail = (
                    f"{point.concurrency} users, {params.num_requests} requests: kvsim {simulated * 1e3:.1f} ms, "
                    f"measured {measured * 1e3:.1f} ms ({simulated / measured - 1:+.1%})"
                )
                output.values[f"c{point.concurrency}/{metric}"] = Measured(simulated, detail)
            cost_label = summary["cost_model"]
    output.notes.append(f"cost model: {cost_label}")
    return output
