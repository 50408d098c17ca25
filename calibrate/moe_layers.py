"""``python -m calibrate.moe_layers``: the share of peak at which a GPU's fused MoE kernels read the
routed experts (:attr:`sim.hardware.gpus.Efficiency.routed_expert_bandwidth`), fitted to measured MoE
layer times.

The data is LLMServingSim's profile of one Qwen3-30B-A3B MoE layer on an RTX PRO 6000 Server Edition
with vLLM 0.19 (``calibrate/llmservingsim_data``): the layer's time for ``tokens`` tokens (of every
rank) of which a GPU holding ``128 / ep`` experts runs ``activated_experts`` experts. The derated model
times that layer on one GPU as its weight read and FLOPs in quadrature,

    hypot(activated x expert bytes / (BW x share), tokens x k / ep x 2 x expert params / (FLOP/s x gemm_flops))

(:class:`sim.costs.terms.ExpertParallelCost`, one layer), so ``share`` is fitted (least squares of the
relative error) over the shapes a serving batch has: for each ``(ep, tokens)`` the row whose
``activated_experts`` is nearest, in ratio, to the number of distinct experts ``tokens`` tokens are
expected to touch on the GPU (the grid also holds shapes a uniform router never makes, such as 2,048
tokens on 4 experts). The fit uses 1 and 2 expert-parallel GPUs, the servers kvsim replays.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from sim.costs.terms import expected_distinct_experts
from sim.hardware.gpus import GpuSpec, resolve_gpu
from sim.hardware.models import ModelSpec, resolve_model

DATA = (
    Path(__file__).resolve().parent / "llmservingsim_data" / "rtxpro6000-qwen3-30b-a3b-instruct-2507-moe.csv"
)
PROFILED_GPU = {
    "base": "RTX-PRO-6000-96GB",
    "name": "RTX-PRO-6000-Server",
    "hbm_bandwidth_gb_per_s": 1597.6,
    "memory_bytes": 101_976_440_832,
}
"""The profiled machine: the Server Edition, as the measured runs' replay files describe it."""
FITTED_EXPERT_PARALLEL_SIZES = (1, 2)


def serving_shapes(layers: pd.DataFrame, model: ModelSpec) -> pd.DataFrame:
    """Per ``(ep, tokens)``, the row whose ``activated_experts`` is nearest (in ratio) to the expected
    distinct experts of the GPU: ``E / ep x (1 - ((E - k) / E) ** tokens)``."""
    assert model.num_experts is not None and model.experts_per_token is not None
    expected = [
        expected_distinct_experts(tokens, model.num_experts, model.experts_per_token) / ep
        for tokens, ep in zip(layers["tokens"], layers["ep"], strict=True)
    ]
    distance = np.abs(np.log(layers["activated_experts"] / np.asarray(expected)))
    nearest = layers.assign(distance=distance).groupby(["ep", "tokens"])["distance"].idxmin()
    return layers.loc[nearest.to_numpy()].reset_index(drop=True)


def layer_times_s(shapes: pd.DataFrame, share: float, model: ModelSpec, gpu: GpuSpec) -> np.ndarray:
    """The derated model's time of one MoE layer on one GPU for each row of ``shapes``."""
    assert model.experts_per_token is not None
    read_s = shapes["activated_experts"] * model.expert_params * model.expert_bytes_per_param
    read_s = read_s / (gpu.hbm_bandwidth_bytes_per_s * share)
    pairs = shapes["tokens"] * model.experts_per_token / shapes["ep"]
    # (as the derated model: no GEMM faster than the best one measured on the GPU)
    gemm_share = min(gpu.efficiency.gemm_flops, gpu.compute_ceiling.share)
    flops_s = pairs * 2.0 * model.expert_params / (gpu.fp16_flops * gemm_share)
    return np.hypot(read_s.to_numpy(dtype=float), flops_s.to_numpy(dtype=float))


def fit_routed_expert_bandwidth(
    path: Path = DATA, eps: tuple[int, ...] = FITTED_EXPERT_PARALLEL_SIZES
) -> tuple[float, pd.DataFrame]:
    """``(share, shapes)``: the fitted share and the serving shapes it was fitted on, with the
    modelled time and its relative error beside the measured one."""
    from scipy.optimize import minimize_scalar

    model = resolve_model("Qwen3-30B-A3B")
    gpu = resolve_gpu(PROFILED_GPU)
    shapes = serving_shapes(pd.read_csv(path), model)
    shapes = shapes[shapes["ep"].isin(eps)].reset_index(drop=True)
    measured_s = shapes["time_us"].to_numpy(dtype=float) * 1e-6

    def loss(share: float) -> float:
        return float(np.sum((layer_times_s(shapes, share, model, gpu) / measured_s - 1) ** 2))

    share = float(minimize_scalar(loss, bounds=(0.1, 1.5), method="bounded", options={"xatol": 1e-9}).x)
    modelled = layer_times_s(shapes, share, model, gpu)
    return share, shapes.assign(modelled_us=modelled * 1e6, error=modelled / measured_s - 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m calibrate.moe_layers", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--data", type=Path, default=DATA, help="an LLMServingSim moe.csv")
    args = parser.parse_args(argv)
    share, shapes = fit_routed_expert_bandwidth(args.data)
    print(
        shapes[["ep", "tokens", "activated_experts", "time_us", "modelled_us", "error"]].round(3).to_string()
    )
    errors = shapes["error"]
    print(
        f"routed_expert_bandwidth = {share:.3f} of peak, over {len(shapes)} layer shapes at EP "
        f"{', '.join(map(str, FITTED_EXPERT_PARALLEL_SIZES))}: error {errors.min():+.1%}..{errors.max():+.1%}, "
        f"mean |error| {errors.abs().mean():.1%}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
