"""``cost_model: {time_scale: s}``: every GPU-side time multiplied by s, nothing else (the plan's
error-band edges stand on it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.config import validate_experiment
from sim.costs.factory import make_cost_model
from sim.costs.scaled import scaled_times
from sim.costs.serving import default_calibration
from sim.costs.terms import PrefillCost, RoutedDecodeCost
from sim.hardware.gpus import resolve_gpu
from sim.hardware.models import resolve_model
from sim.runner import run_experiment


@pytest.mark.parametrize("kind", ["derated", "analytic"])
@pytest.mark.parametrize("model", ["Llama-3.1-8B", "Qwen3-30B-A3B"])
def test_every_gpu_time_scales_and_host_swaps_do_not(kind, model):
    spec, gpu = resolve_model(model), resolve_gpu("H100-80GB")
    base = make_cost_model(kind, spec, gpu, block_size=16)
    slow = make_cost_model({"kind": kind, "time_scale": 1.25}, spec, gpu, block_size=16)
    for batch, context, chunks in [(0, 0, [(512, 0)]), (7, 9000, []), (64, 70_000, [(100, 300), (30, 0)])]:
        assert slow.iteration_s(batch, context, chunks) == pytest.approx(
            1.25 * base.iteration_s(batch, context, chunks), rel=1e-12
        )
    for batch in (1, 3, 40):  # the event-skipping decode line (and a mixture of experts' table)
        assert slow.decode.step_s(batch, 1000 * batch) == pytest.approx(
            1.25 * base.decode.step_s(batch, 1000 * batch), rel=1e-12
        )
    assert slow.prefill_fixed_s == pytest.approx(1.25 * base.prefill_fixed_s, rel=1e-12)
    assert slow.copy_blocks_s(10) == pytest.approx(1.25 * base.copy_blocks_s(10), rel=1e-12)
    assert slow.swap_blocks_s(10) == base.swap_blocks_s(10)  # the host link is not the GPU
    assert slow.request_overhead_s == base.request_overhead_s  # nor is the client
    assert slow.label == f"{base.label}; GPU times x1.25" and slow.error_band == base.error_band


def test_scaled_times_reaches_every_time_term():
    routed = RoutedDecodeCost(1.0, 2.0, 3.0, batch_s=(-0.5, -0.25))
    assert scaled_times(routed, 2.0) == RoutedDecodeCost(2.0, 4.0, 6.0, batch_s=(-1.0, -0.5))
    assert scaled_times(PrefillCost(1.0, 2.0, 3.0, 4.0), 0.5) == PrefillCost(0.5, 1.0, 1.5, 2.0)


def test_a_lone_request_takes_twice_as_long_at_time_scale_two(tmp_path):
    """One request alone: every iteration is GPU time, so its engine-side latency doubles exactly."""

    def latency(cost_model: object) -> float:
        config = validate_experiment(
            {
                "name": "lone",
                "model": "Llama-3.1-8B",
                "gpu": "H100-80GB",
                "cost_model": cost_model,
                "engine": {"client_overhead_s": 0},
                "workload": {
                    "num_requests": 1,
                    "arrival": {"kind": "poisson", "rate_per_s": 1},
                    "prompt_len": {"kind": "constant", "value": 700},
                    "output_len": {"kind": "constant", "value": 50},
                },
                "variants": [{"name": "paged", "policy": "paged"}],
            },
            "test",
        )
        (result,) = run_experiment(config, Path(tmp_path) / "x.yaml")
        return float(result.requests["e2e_s"].iloc[0])

    assert latency({"kind": "derated", "time_scale": 2.0}) == pytest.approx(2 * latency("derated"), rel=1e-9)


def test_the_fitted_band_comes_from_the_held_out_tpot_errors():
    """A GPU with runs in the fit (the H100) takes the leave-one-run-out TPOT errors, -3.9 %..+11.8 %:
    the measured steps took 1 / (1 + e) of kvsim's, x0.895..x1.041. A GPU whose kernels were measured
    but has no runs (the A100, its memory and GEMMs measured too: nothing widens it) takes the
    leave-one-GPU-out ones, -11.2 %..+11.8 %: x0.895..x1.126."""
    calibration = default_calibration()
    for fold, gpu, band in (
        ("leave_one_out", "H100-80GB", (0.895, 1.041)),
        ("leave_one_gpu_out", "A100-80GB", (0.895, 1.126)),
    ):
        errors = [run["tpot"] for run in calibration.fit[fold]["runs"].values()]
        fast, slow = calibration.time_scale_band(resolve_gpu(gpu))
        assert (fast, slow) == (1 / (1 + max(errors)), 1 / (1 + min(errors)))
        assert (fast, slow) == pytest.approx(band, abs=1e-3)
    assert calibration.time_scale_band() == calibration.time_scale_band(resolve_gpu("H100-80GB"))


def test_the_analytic_band_is_the_gpus_own():
    """The analytic roofline was checked on the A100-80GB only: an H100 run says it is not validated
    there instead of quoting the A100's band as its own (issue 27)."""
    from sim.costs.core import ANALYTIC_ERROR_BAND

    model = resolve_model("Llama-3.1-8B")
    a100 = make_cost_model("analytic", model, resolve_gpu("A100-80GB"), block_size=16)
    h100 = make_cost_model("analytic", model, resolve_gpu("H100-80GB"), block_size=16)
    assert a100.error_band == ANALYTIC_ERROR_BAND
    assert h100.error_band.startswith(
        "not validated on H100-80GB (no held-out iterations of it); on the A100-80GB:"
    )


def test_a_band_edge_scales_on_top_of_the_plans_own_time_scale():
    # A plan asking "10 % slower than modelled" (time_scale 1.1) searches its band's fast edge
    # (x0.9) at 1.1 x 0.9 = 0.99 of the modelled GPU times, not at 0.9 (which would drop the ask).
    from sim.planning.plans.band import with_time_scale

    slower = with_time_scale({"kind": "derated", "time_scale": 1.1, "calibration": "none"}, 0.9)
    assert slower["time_scale"] == pytest.approx(0.99)
    assert slower["calibration"] == "none"  # the rest of the cost model is kept
    assert with_time_scale(None, 0.9)["time_scale"] == pytest.approx(0.9)
    assert with_time_scale("analytic", 1.2) == {"kind": "analytic", "time_scale": pytest.approx(1.2)}
