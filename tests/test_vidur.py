"""Vidur's measured operations: the copies in calibrate/vidur_data, the profiles built from them, the
derating factors in sim/hardware/gpus.py and the error bands printed with every run. No torch needed."""

from __future__ import annotations

import hashlib

import pytest

from calibrate import vidur
from sim.costs.core import ANALYTIC_ERROR_BAND, ProfileCostModel, load_profile
from sim.hardware.gpus import EFFICIENCY_PRESETS
from sim.hardware.models import resolve_model

DATA_README = vidur.DATA / "README.md"


def test_copies_are_the_files_the_readme_names():
    """The data README records each file's sha256; an edit to a copy must update it."""
    readme = DATA_README.read_text()
    files = sorted(path for path in vidur.DATA.iterdir() if path.suffix in (".csv", "") and path.is_file())
    assert {path.name for path in files} >= {
        "LICENSE-MIT-vidur",
        "a100-Llama-2-7b-hf-mlp-tp1.csv",
        "a100-Meta-Llama-3-8B-mlp-tp1.csv",
        "h100-Llama-2-7b-hf-mlp-tp1.csv",
        "a100-Llama-2-7b-hf-attention-rows.csv",
        "a100-Meta-Llama-3-8B-attention-rows.csv",
    }
    for path in files:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert f"`{path.name}`" in readme and digest in readme, path.name
    assert "MIT License" in (vidur.DATA / "LICENSE-MIT-vidur").read_text()
    for dataset in vidur.DATASETS.values():
        assert dataset.mlp_blob in readme
        assert dataset.attention_blob is None or dataset.attention_blob in readme


def test_a_layer_by_hand():
    """A100, Llama-2-7B, decode of one sequence holding 32 tokens: the TP 1 row at 1 token
    (input_layernorm 0.005, attn_pre_proj 0.065, attn_rope 0.005, attn_post_proj 0.025,
    post_attention_layernorm 0.005, mlp_up_proj 0.116, mlp_act 0.007, mlp_down_proj 0.060, add 0.002 ms)
    plus attention (decode 0.009 + input reshape 0.0 + output reshape 0.001 ms) = 0.300 ms."""
    points = vidur.operating_points(vidur.DATASETS["a100-llama-2-7b"])
    point = next(p for p in points if p.phase == "decode" and p.batch == 1 and p.context == 32)
    assert point.matmul_s == pytest.approx((0.065 + 0.025 + 0.116 + 0.060) * 1e-3, rel=1e-12)
    assert point.elementwise_s == pytest.approx((0.005 + 0.005 + 0.005 + 0.007 + 0.002) * 1e-3, rel=1e-12)
    assert point.layer_s == pytest.approx(0.300e-3, rel=1e-12)
    # duplicated token counts (range boundaries of Vidur's grid) are averaged: 2048 has two rows
    ops = vidur.load_operations(vidur.DATASETS["a100-llama-2-7b"].mlp_csv)
    assert ops[2048]["attn_pre_proj"] == pytest.approx((0.9795 + 0.979) / 2 * 1e-3, rel=1e-12)


def test_every_attention_row_has_its_operations_row():
    for dataset in vidur.DATASETS.values():
        points = vidur.operating_points(dataset)
        held = [p for p in points if p.holdout]
        assert len(points) >= 100 and len(held) == len(points) // 4
        assert {p.phase for p in held} == {"decode", "prefill"}
        assert all(p.attention_measured == (dataset.attention_csv is not None) for p in points)


@pytest.mark.parametrize("key", list(vidur.DATASETS))
def test_committed_profiles_are_a_fresh_fit(key):
    dataset = vidur.DATASETS[key]
    path = vidur.PROFILES / vidur.profile_filename(dataset)
    committed = load_profile(path)
    fresh, points = vidur.build_profile(dataset)
    assert vidur.same_fit(committed.coefficients, fresh.coefficients)
    # the samples CSV reproduces the fit
    samples = vidur.load_samples(path.with_suffix(".csv"))
    assert len(samples) == len(points)
    coefficients, report = vidur.fit_points(samples)
    decode = committed.coefficients.decode_per_layer
    assert coefficients["decode"]["per_seq"] == pytest.approx(decode.per_seq_s, rel=1e-6)
    assert report["prefill"]["holdout"]["max_rel_err"] == pytest.approx(
        committed.fit_quality["prefill"]["holdout"]["max_rel_err"], rel=1e-6
    )
    # what Vidur does not measure is marked
    c = committed.coefficients
    assert not c.decode_per_step.measured and not c.block_copy.measured and not c.block_swap.measured
    assert all(not point.measured for point in c.block_size_sweep)
    assert committed.measured and committed.analytic_parts and committed.source["licence"].startswith("MIT")
    assert committed.source["mlp"]["blob"] == dataset.mlp_blob
    if dataset.attention_csv is None:
        assert committed.source["attention"] is None and "attention" in committed.analytic_parts[0]


def test_profiles_fit_within_a_few_percent():
    """The issue's bar: kvsim's linear decode and prefill forms fitted to Vidur's points land within
    a few percent (mean) on points they were not fitted to."""
    for dataset in vidur.DATASETS.values():
        profile = load_profile(vidur.PROFILES / vidur.profile_filename(dataset))
        for phase in ("decode", "prefill"):
            held = profile.fit_quality[phase]["holdout"]
            assert held["mean_rel_err"] < 0.05, (dataset.key, phase)
            assert held["max_rel_err"] < 0.17, (dataset.key, phase)


def test_profiles_run_for_their_models():
    for dataset in vidur.DATASETS.values():
        path = vidur.PROFILES / vidur.profile_filename(dataset)
        costs = ProfileCostModel.from_yaml(path, resolve_model(dataset.model))
        assert costs.label.startswith("partly measured profile: Vidur (microsoft/vidur)")
        assert costs.error_band.startswith("decode ") and "held-out points of Vidur" in costs.error_band


def test_presets_are_the_fitted_factors_and_bands():
    """sim/hardware/gpus.py holds the factors a fresh fit gives (3 significant digits) and the bands it prints
    are the ones recomputed here; the analytic roofline's band too."""
    fitted = vidur.fitted_efficiencies()
    assert vidur.check_presets(fitted, EFFICIENCY_PRESETS) == []
    bands = vidur.error_bands()
    for gpu in ("A100", "H100"):
        assert EFFICIENCY_PRESETS[gpu].error_band == vidur.efficiency_band_text(bands, gpu)
    own = bands["a100-llama-2-7b"]
    assert ANALYTIC_ERROR_BAND.startswith(
        f"{own['analytic/decode'].text()}, {own['analytic/prefill'].text()} "
    )
    # the roofline is too fast on every held-out point; the derated model straddles the measurements
    for key in vidur.DATASETS:
        assert bands[key]["analytic/decode"].high < 0 and bands[key]["analytic/prefill"].high < 0
    assert own["derated/decode"].low < 0 < own["derated/decode"].high


def test_same_fit_ignores_last_digits_only():
    """Another CPU's BLAS moves a refit's last digits (1e-14); a real change (1e-6) is a different fit."""
    dataset = vidur.DATASETS["a100-llama-2-7b"]
    committed = load_profile(vidur.PROFILES / vidur.profile_filename(dataset)).coefficients
    decode = committed.decode_per_layer

    def with_per_seq(factor):
        changed = decode.model_copy(update={"per_seq_s": decode.per_seq_s * factor})
        return committed.model_copy(update={"decode_per_layer": changed})

    assert vidur.same_fit(committed, with_per_seq(1 + 3e-14))
    assert not vidur.same_fit(committed, with_per_seq(1 + 1e-6))
    note_changed = committed.model_copy(
        update={"block_swap": committed.block_swap.model_copy(update={"note": "other"})}
    )
    assert not vidur.same_fit(committed, note_changed)


def test_check_mode_passes_on_the_committed_files(capsys):
    assert vidur.main(["--check"]) == 0


def test_profiles_readme_shows_the_current_comparison():
    """The H200 comparison tables in configs/profiles/README.md are what the code computes now."""
    readme = (vidur.PROFILES / "README.md").read_text()
    for model_name in ("Llama-2-7B", "Llama-3.1-8B"):
        assert vidur.comparison_markdown(model_name) in readme, model_name
