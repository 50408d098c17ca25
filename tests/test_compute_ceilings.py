"""What a GPU's matrix products reach: each preset's best measured GEMM rate (or its architecture's
default) caps every FLOP share the derated model charges there, worked by hand from the cited rows."""

from __future__ import annotations

import pytest

from sim.costs.derated import DeratedCostModel
from sim.costs.serving import NEUTRAL, default_calibration
from sim.hardware.compute_ceilings import (
    ACHIEVABLE_COMPUTE_DEFAULTS,
    MEASURED_ACHIEVABLE_COMPUTE,
    UNKNOWN_ARCHITECTURE_ACHIEVABLE_COMPUTE,
)
from sim.hardware.gpus import GPU_PRESETS, resolve_gpu
from sim.hardware.models import resolve_model

LLAMA_8B = resolve_model("Llama-3.1-8B")


@pytest.mark.parametrize("name", list(GPU_PRESETS))
def test_no_preset_multiplies_faster_than_its_best_measured_gemm(name: str) -> None:
    # Every preset, so that a new one cannot skip it: its ceiling is cited (measured on it) or its
    # architecture's default, and no FLOP share the derated model charges exceeds it.
    gpu = GPU_PRESETS[name]
    ceiling = gpu.compute_ceiling
    assert gpu.architecture != "unknown"
    assert ceiling.source and (ceiling.measured or "median of measured" in ceiling.source)
    if ceiling.measured:
        assert MEASURED_ACHIEVABLE_COMPUTE[name] is ceiling
        assert "TFLOP/s measured" in ceiling.source
    for serving in (NEUTRAL, default_calibration()):
        efficiency = DeratedCostModel(LLAMA_8B, gpu, serving=serving).efficiency
        assert efficiency.gemm_flops <= ceiling.share, name
        assert efficiency.prefill_attention_flops <= ceiling.share, name


def test_measured_shares_by_hand() -> None:
    # [ZZ] rows, the better of FP16 and BF16 per submission, the median over submissions, over the
    # preset's dense FP16 rate
    by_hand = {
        "L4-24GB": 70.89 / 121,  # one submission
        "T4-16GB": 41.93 / 65,  # 41.91, 42.71, 41.93: the middle one
        "RTX-4090-24GB": (167.80 + 170.06) / 2 / 165.2,  # four: the mean of the middle two
        "H100-PCIe-80GB": 495.93 / 756,
        "RTX-PRO-6000-96GB": (417.98 + 409.42) / 2 / 503.8,
        "MI300X-192GB": 668.4 / 1307.4,  # [MAMF]
    }
    for name, share in by_hand.items():
        assert MEASURED_ACHIEVABLE_COMPUTE[name].share == pytest.approx(share, abs=5e-4), name


def test_architecture_defaults_are_medians_of_measured_parts_with_their_range() -> None:
    hopper = ACHIEVABLE_COMPUTE_DEFAULTS["Hopper"]  # H100 0.799, H200 0.799, H100 PCIe 0.656
    assert (hopper.share, hopper.band) == (0.799, (0.656, 0.849))  # at least 5 points above
    assert not hopper.measured
    assert GPU_PRESETS["H100-NVL-94GB"].compute_ceiling is hopper
    for architecture, default in ACHIEVABLE_COMPUTE_DEFAULTS.items():
        low, high = default.band
        assert low <= default.share - 0.05 + 1e-9 and high >= default.share + 0.05 - 1e-9, architecture
    unknown = resolve_gpu({"memory_gib": 32, "hbm_bandwidth_gb_per_s": 1000, "fp16_tflops": 200})
    assert unknown.compute_ceiling is UNKNOWN_ARCHITECTURE_ACHIEVABLE_COMPUTE
    assert unknown.compute_ceiling.band == (0.511, 1.023)  # MI300X .. RTX 4090: every measured GPU


def test_the_cap_binds_only_where_the_gpu_measured_slower_than_the_factor() -> None:
    # The A100's GEMM share (0.694, Vidur's A100-80GB) carried to an L4, whose best matrix product
    # reaches 0.586 of 121 TFLOP/s: capped there; to an L40S (0.743): unchanged.
    l4 = DeratedCostModel(LLAMA_8B, GPU_PRESETS["L4-24GB"], serving=NEUTRAL)
    l40s = DeratedCostModel(LLAMA_8B, GPU_PRESETS["L40S-48GB"], serving=NEUTRAL)
    assert l4.efficiency.gemm_flops == pytest.approx(70.89 / 121, abs=5e-4)
    assert l40s.efficiency.gemm_flops == GPU_PRESETS["L40S-48GB"].efficiency.gemm_flops == 0.694
    # a prompt's matrix-product FLOPs take 0.694 / 0.586 = 1.18x longer than the uncapped factor says
    uncapped = DeratedCostModel(
        LLAMA_8B, resolve_gpu({"base": "L4-24GB", "achievable_compute": 1.0}), serving=NEUTRAL
    )
    assert uncapped.efficiency.gemm_flops == 0.694
    assert l4.body_flops_per_token_s / uncapped.body_flops_per_token_s == pytest.approx(
        0.694 / (70.89 / 121), rel=1e-3
    )
    assert l4.body_read_s == uncapped.body_read_s  # the weight reads are memory's


def test_custom_gpus_name_their_architecture_or_their_own_measurement() -> None:
    hopper_like = resolve_gpu(
        {"memory_gib": 96, "hbm_bandwidth_tb_per_s": 4.0, "fp16_tflops": 900, "architecture": "Hopper"}
    )
    assert hopper_like.compute_ceiling is ACHIEVABLE_COMPUTE_DEFAULTS["Hopper"]
    own = resolve_gpu({"base": "L4-24GB", "achievable_compute": 0.7})
    assert own.compute_ceiling.share == 0.7 and own.compute_ceiling.measured
    # another datasheet rate on a preset: its measured share is evidence, no longer a measurement
    faster = resolve_gpu({"base": "L4-24GB", "fp16_tflops": 150})
    assert faster.compute_ceiling.share == GPU_PRESETS["L4-24GB"].compute_ceiling.share
    assert not faster.compute_ceiling.measured and "changed datasheet FLOP/s" in faster.compute_ceiling.source
    assert resolve_gpu({"base": "L4-24GB", "memory_gib": 20}).compute_ceiling.measured
    with pytest.raises(ValueError, match=r"achievable_compute .* in \(0, 1.2\]; got 1.5"):
        resolve_gpu({"base": "L4-24GB", "achievable_compute": 1.5})
    with pytest.raises(ValueError, match="architecture must be one of Turing, Ampere, Ada"):
        resolve_gpu({"base": "L4-24GB", "architecture": "Volta"})


def test_a_gpu_measured_only_in_its_gemms_is_transferred_and_its_memory_still_widens_its_band() -> None:
    from sim.costs.serving import assumed_ceilings_scales

    l4 = GPU_PRESETS["L4-24GB"]  # GEMMs measured, memory (GDDR6) assumed at 0.977 (0.790..1.0)
    assert default_calibration().evidence(l4) == "transferred"
    memory = l4.memory_ceiling
    low, high = memory.band
    assert assumed_ceilings_scales(l4) == pytest.approx((memory.share / high, memory.share / low))
    assert assumed_ceilings_scales(GPU_PRESETS["H100-PCIe-80GB"]) == (1.0, 1.0)  # both measured
    # the A10G's Ampere default (0.821, 0.771..0.871) stays above its GEMM share 0.694: no GEMM widening
    a10g = GPU_PRESETS["A10G-24GB"]
    a10g_memory = a10g.memory_ceiling
    assert assumed_ceilings_scales(a10g) == pytest.approx(
        (a10g_memory.share / a10g_memory.band[1], a10g_memory.share / a10g_memory.band[0])
    )


def test_the_band_text_names_what_was_assumed_for_a_gpu_and_from_what() -> None:
    """The plan report's band text for a GPU without runs in the fit says which of its ceilings were
    assumed, at what share of the datasheet, and the range measured on its memory type or
    architecture: nothing for a GPU measured in both (H100 PCIe); the memory alone for one whose
    GEMMs were measured (L4: GDDR6's median 0.977 of 0.791..1.0); both, joined, for one with no
    measurement of its own (A10G: Ampere's 0.821 of 0.771..0.871)."""
    from sim.costs.serving import _assumed_ceilings_text

    assert _assumed_ceilings_text(GPU_PRESETS["H100-PCIe-80GB"]) == ""
    assert _assumed_ceilings_text(GPU_PRESETS["L4-24GB"]) == (
        "; L4-24GB is partly measured: achievable bandwidth 98% of the datasheet assumed (79%..100% "
        "measured on parts of its memory type), which widens its band"
    )
    assert _assumed_ceilings_text(GPU_PRESETS["A10G-24GB"]) == (
        "; A10G-24GB has no measurements of its own: achievable bandwidth 98% of the datasheet assumed "
        "(79%..100% measured on parts of its memory type) and achievable matrix-product rate 82% of the "
        "datasheet assumed (77%..87% measured on parts of its architecture), which widens its band"
    )
