"""Write analytic cost profiles (no measurement) in the calibration-profile schema.

``python -m calibrate.analytic_profiles`` regenerates ``configs/profiles/analytic-*.yaml`` for
Llama-3.1-8B on the GPU presets A100-80GB, H100-80GB, H200-141GB and L4-24GB. The numbers are those of
:class:`sim.costs.core.AnalyticCostModel` (a roofline), split per layer so that the profile machinery
(layer scaling, rescaling) treats them like a measured profile; loading one back gives exactly the
analytic model's times. No torch needed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sim.costs.core import (
    DEFAULT_HOST_BANDWIDTH_BYTES_PER_S,
    REPO_ROOT,
    AnalyticCostModel,
    BlockCoefficients,
    CostProfile,
    LayerDecodeCoefficients,
    LayerPrefillCoefficients,
    ProfileCoefficients,
    ProfileDevice,
    ProfileModel,
    StepCoefficients,
    kv_elements_per_token_per_layer,
)

if TYPE_CHECKING:
    from sim.hardware.gpus import GpuSpec
    from sim.hardware.models import ModelSpec

DEFAULT_MODEL = "Llama-3.1-8B"
DEFAULT_GPUS = ("A100-80GB", "H100-80GB", "H200-141GB", "L4-24GB")

FORMULA = (
    "roofline at datasheet peaks, per layer = whole model / num_layers: "
    "decode intercept = weight_bytes / HBM_BW; decode per_seq = 2 * active_params / FP16_FLOPS; "
    "decode per_context_token = kv_bytes_per_token / HBM_BW; "
    "prefill per_token = 2 * active_params / FP16_FLOPS; "
    "prefill per_attention_pair = 4 * num_layers * heads * head_dim / FP16_FLOPS, pairs = n * (start + n/2); "
    "copy per_block = 2 * block_bytes / HBM_BW; swap per_block = block_bytes / host_bandwidth; "
    "no intercepts, no LM-head term (it is inside weight_bytes and num_params)"
)

_DTYPE_NAMES = {1: "fp8", 2: "bfloat16", 4: "float32"}


def analytic_profile(
    model: ModelSpec,
    gpu: GpuSpec,
    *,
    block_size: int = 16,
    kv_cache_dtype: str = "auto",
    host_bandwidth_bytes_per_s: float = DEFAULT_HOST_BANDWIDTH_BYTES_PER_S,
) -> CostProfile:
    """The :class:`AnalyticCostModel` of ``model`` on ``gpu`` as a profile (``measured: false``)."""
    if model.is_moe:
        # the profile's decode is a line; the model's would lose the experts a batch leaves unread
        raise ValueError(
            f"{model.name} is a mixture of experts: its analytic decode step depends on the batch beyond "
            "a line, which a profile cannot hold; use `cost_model: analytic` instead"
        )
    analytic = AnalyticCostModel(
        model,
        gpu,
        kv_cache_dtype=kv_cache_dtype,
        block_size=block_size,
        host_bandwidth_bytes_per_s=host_bandwidth_bytes_per_s,
    )
    layers = model.num_layers
    decode = analytic.decode
    copy_per_block = analytic.copy_blocks_s(1)
    swap_per_block = analytic.swap_blocks_s(1)
    kv_dtype_bytes = analytic.kv_bytes_per_token // (layers * kv_elements_per_token_per_layer(model))
    dtype = _DTYPE_NAMES.get(kv_dtype_bytes, "bfloat16")
    return CostProfile(
        measured=False,
        tensor_parallel_size=1,  # the roofline of the whole model on one GPU
        label=f"analytic roofline: {model.name} on {gpu.name}",
        created=dt.date.today().isoformat(),
        kvsim_version=_version(),
        device=ProfileDevice(
            kind="analytic",
            name=gpu.name,
            hbm_bandwidth_bytes_per_s=float(gpu.hbm_bandwidth_bytes_per_s),
            fp16_flops=float(gpu.fp16_flops),
        ),
        model=ProfileModel.from_spec(model),
        dtype=dtype,
        block_size=block_size,
        timed_layers=0,
        coefficients=ProfileCoefficients(
            decode_per_layer=LayerDecodeCoefficients(
                intercept_s=decode.intercept_s / layers,
                per_seq_s=decode.per_seq_s / layers,
                per_context_token_s=decode.per_context_token_s / layers,
            ),
            decode_per_step=StepCoefficients(intercept_s=0.0, per_seq_s=0.0),
            prefill_per_layer=LayerPrefillCoefficients(
                intercept_s=0.0,
                per_token_s=analytic.prefill_per_token_s / layers,
                per_attention_pair_s=analytic.prefill_per_attention_pair_s / layers,
            ),
            block_copy=BlockCoefficients(intercept_s=0.0, per_block_s=copy_per_block, measured=False),
            block_swap=BlockCoefficients(
                intercept_s=0.0,
                per_block_s=swap_per_block,
                measured=False,
                note=f"analytic: block bytes / {host_bandwidth_bytes_per_s / 1e9:g} GB/s host link",
            ),
        ),
        formula=FORMULA,
        grid={"kv_cache_dtype": kv_cache_dtype, "host_bandwidth_bytes_per_s": host_bandwidth_bytes_per_s},
        notes=[
            "analytic, not measured: datasheet peaks without efficiency factors; replace with a "
            "`kvsim calibrate --device cuda` profile from a device run",
            "block size: copy and swap scale with the block's bytes; decode and prefill do not depend on it",
        ],
    )


def _version() -> str:
    from calibrate.runner import kvsim_version

    return kvsim_version()


def profile_filename(model_name: str, gpu_name: str) -> str:
    def slug(text: str) -> str:
        return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")

    return f"analytic-{slug(model_name)}-{slug(gpu_name)}.yaml"


def main(argv: list[str] | None = None) -> int:
    from sim.hardware.gpus import resolve_gpu
    from sim.hardware.models import resolve_model

    parser = argparse.ArgumentParser(prog="python -m calibrate.analytic_profiles", description=__doc__)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--gpus", nargs="+", default=list(DEFAULT_GPUS))
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "configs" / "profiles")
    args = parser.parse_args(argv)
    model = resolve_model(args.model)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.gpus:
        gpu = resolve_gpu(name)
        path = args.out / profile_filename(model.name, gpu.name)
        analytic_profile(model, gpu, block_size=args.block_size).to_yaml(path)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
