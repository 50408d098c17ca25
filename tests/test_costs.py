"""Cost models: the analytic roofline by hand, profiles (schema, layer scaling, block sizes, the
rescale guard) and the ``cost_model:`` configuration. None of this needs torch."""

from __future__ import annotations

import dataclasses
import math
import warnings
from pathlib import Path

import pytest
import yaml

from calibrate.analytic_profiles import DEFAULT_GPUS, analytic_profile
from sim.costs.core import (
    REPO_ROOT,
    AnalyticCostModel,
    BlockCoefficients,
    BlockSizePoint,
    CostModelConfig,
    CostModelError,
    CostProfile,
    LayerDecodeCoefficients,
    LayerPrefillCoefficients,
    ProfileCoefficients,
    ProfileCostModel,
    ProfileDevice,
    ProfileModel,
    RescaleRatios,
    StepCoefficients,
    layer_matmul_params,
    load_profile,
)
from sim.costs.derated import DeratedCostModel
from sim.costs.factory import make_cost_model
from sim.hardware.gpus import GpuSpec, resolve_gpu
from sim.hardware.models import ModelSpec, resolve_model

PROFILES = REPO_ROOT / "configs" / "profiles"


def approx(value: float) -> object:
    return pytest.approx(value, rel=1e-12, abs=0.0)


# --------------------------------------------------------------------------------------------------
# Analytic roofline, worked by hand
# --------------------------------------------------------------------------------------------------

LLAMA_8B = resolve_model("Llama-3.1-8B")
# A round-number GPU so that the arithmetic below can be checked on paper.
ROUND_GPU = GpuSpec("round", 80 * 2**30, 2.0e12, 1.0e15)


def test_analytic_llama_8b_by_hand():
    costs = AnalyticCostModel(LLAMA_8B, ROUND_GPU)
    assert costs.label == "analytic roofline (datasheet peaks, no derating)" and costs.measured is False
    assert "too fast" in costs.error_band
    # weights: 8,030,261,248 params x 2 B = 16,060,522,496 B, read once per step at 2 TB/s
    assert costs.decode.intercept_s == approx(16_060_522_496 / 2.0e12) == approx(0.008030261248)
    # compute: 2 x 8,030,261,248 FLOPs per token at 1 PFLOP/s
    assert costs.decode.per_seq_s == approx(1.6060522496e-5)
    # KV: 2 (K,V) x 32 layers x 8 heads x 128 dims x 2 B = 131,072 B per token at 2 TB/s
    assert costs.decode.per_context_token_s == approx(6.5536e-8)
    # 8 sequences of 1000 tokens: 0.008030261248 + 8 x 1.6060522496e-5 + 8000 x 6.5536e-8
    assert costs.decode.step_s(8, 8000) == approx(0.008683033427968)
    # prefill 512 tokens at 1024: 512 x 1.6060522496e-5 = 0.008222987517952 s of matmuls, plus
    # 512 x (1024 + 256) = 655,360 pairs x 4 x 32 layers x 4096 / 1e15 = 5.24288e-10 s each
    assert costs.prefill_s(512, 1024) == approx(0.008222987517952 + 655_360 * 5.24288e-10)
    assert costs.prefill_s(512, 1024) == approx(0.008566584901632)
    assert costs.prefill_s(0, 1024) == 0.0
    # a block: 131,072 B x 16 tokens = 2,097,152 B; copy reads and writes it: 2 x 10 blocks at 2 TB/s
    assert costs.copy_blocks_s(10) == approx(2.097152e-5)
    # swap at the default 25 GB/s host link: 10 x 2,097,152 B / 25e9
    assert costs.swap_blocks_s(10) == approx(8.388608e-4)
    assert costs.copy_blocks_s(0) == costs.swap_blocks_s(0) == 0.0


def test_analytic_kv_dtype_block_size_and_host_bandwidth():
    costs = AnalyticCostModel(
        LLAMA_8B, ROUND_GPU, kv_cache_dtype="fp8", block_size=32, host_bandwidth_bytes_per_s=50e9
    )
    assert costs.decode.per_context_token_s == approx(65_536 / 2.0e12)
    assert costs.copy_blocks_s(1) == approx(2 * 65_536 * 32 / 2.0e12)
    assert costs.swap_blocks_s(1) == approx(65_536 * 32 / 50e9)
    with pytest.raises(CostModelError):
        AnalyticCostModel(LLAMA_8B, ROUND_GPU, block_size=0)


# --------------------------------------------------------------------------------------------------
# Profiles
# --------------------------------------------------------------------------------------------------

SMALL = ProfileModel(
    name="small",
    num_layers=4,
    hidden_size=256,
    num_attention_heads=8,
    num_kv_heads=2,
    head_dim=32,
    intermediate_size=512,
    vocab_size=1000,
    num_params=4_000_000,
)


def make_profile(model: ProfileModel = SMALL, *, sweep: bool = True) -> CostProfile:
    analytic_swap = BlockCoefficients(intercept_s=0.0, per_block_s=4e-6, measured=False, note="analytic")
    return CostProfile(
        measured=True,
        label="synthetic",
        created="2026-01-01T00:00:00+00:00",
        kvsim_version="0.1.0",
        device=ProfileDevice(kind="cpu", name="test cpu", torch_version="2.13.0", num_threads=1),
        model=model,
        dtype="float32",
        block_size=16,
        coefficients=ProfileCoefficients(
            decode_per_layer=LayerDecodeCoefficients(
                intercept_s=1e-4, per_seq_s=1e-5, per_context_token_s=1e-8
            ),
            decode_per_step=StepCoefficients(intercept_s=2e-4, per_seq_s=3e-6),
            prefill_per_layer=LayerPrefillCoefficients(
                intercept_s=5e-5, per_token_s=2e-6, per_attention_pair_s=1e-10
            ),
            block_copy=BlockCoefficients(intercept_s=1e-5, per_block_s=2e-6),
            block_swap=analytic_swap,
            block_size_sweep=[
                BlockSizePoint(
                    block_size=8,
                    per_context_token_s=1.2e-8,
                    block_copy=BlockCoefficients(intercept_s=1e-5, per_block_s=1.2e-6),
                    block_swap=analytic_swap.model_copy(update={"per_block_s": 2e-6}),
                ),
                BlockSizePoint(
                    block_size=32,
                    per_context_token_s=0.9e-8,
                    block_copy=BlockCoefficients(intercept_s=2e-5, per_block_s=3.6e-6),
                    block_swap=analytic_swap.model_copy(update={"per_block_s": 8e-6}),
                ),
            ]
            if sweep
            else [],
        ),
        fit_quality={"decode": {"r2": 0.99, "mean_rel_err": 0.02, "max_rel_err": 0.05}},
        grid={"name": "synthetic"},
    )


def test_profile_yaml_round_trip(tmp_path):
    profile = make_profile()
    path = tmp_path / "profile.yaml"
    profile.to_yaml(path)
    assert load_profile(path) == profile
    assert yaml.safe_load(path.read_text())["kvsim_profile"] == 1


def test_profile_layer_scaling_and_head():
    costs = ProfileCostModel(make_profile())
    assert costs.measured and "synthetic" not in costs.label and "test cpu" in costs.label
    # 4 layers x per-layer + the LM head once
    assert costs.decode.intercept_s == approx(4 * 1e-4 + 2e-4)
    assert costs.decode.per_seq_s == approx(4 * 1e-5 + 3e-6)
    assert costs.decode.per_context_token_s == approx(4 * 1e-8)
    # prefill: the chunk's marginal time 4 x (2e-6 n + 1e-10 n (start + n/2)) + the head's last row;
    # the fixed part (4 x 5e-5 + the head's 2e-4) is paid once per iteration
    assert costs.prefill_s(100, 50) == approx(4 * (2e-6 * 100 + 1e-10 * 100 * (50 + 50)) + 3e-6)
    assert costs.prefill_fixed_s == approx(4 * 5e-5 + 2e-4)
    assert costs.prefill_s(0, 50) == 0.0
    # copy across all layers, as measured
    assert costs.copy_blocks_s(3) == approx(1e-5 + 3 * 2e-6)
    assert costs.copy_blocks_s(0) == 0.0
    assert costs.swap_blocks_s(2) == approx(2 * 4e-6)


def test_one_fixed_cost_per_iteration_however_many_prompts():
    """The double-intercept bug: every prefill chunk used to add the profile's prefill intercept on top
    of the decode intercept. Now an iteration pays one fixed cost, the costliest present."""
    costs = ProfileCostModel(make_profile())  # 4 layers; see make_profile
    # 3 decoding sequences (300 cached tokens) + chunks (100 at 50) and (20 at 0):
    #   fixed  max(4 x 1e-4 + 2e-4, 4 x 5e-5 + 2e-4) = 6e-4       (decode intercept > prefill's)
    #   decode 3 x (4 x 1e-5 + 3e-6) + 300 x 4 x 1e-8 = 1.29e-4 + 1.2e-5
    #   chunk  4 x (2e-6 x 100 + 1e-10 x 100 x 100) + 3e-6 = 8.07e-4
    #   chunk  4 x (2e-6 x 20 + 1e-10 x 20 x 10) + 3e-6 = 1.6308e-4
    expected = 6e-4 + 1.29e-4 + 1.2e-5 + 8.07e-4 + 1.6308e-4
    assert costs.iteration_s(3, 300, [(100, 50), (20, 0)]) == approx(expected) == approx(1.71108e-3)
    # the old charge was two prefill intercepts (2 x 4 x 5e-5) more
    old = costs.decode.step_s(3, 300) + sum(
        4 * 5e-5 + costs.prefill_s(n, start) for n, start in [(100, 50), (20, 0)]
    )
    assert old - expected == approx(4e-4)
    # prefill alone pays the prefill fixed cost, not the decode intercept: 4e-4 + 8.07e-4
    assert costs.iteration_s(0, 0, [(100, 50)]) == approx(1.207e-3)
    # without chunks an iteration is exactly a decode step (event skipping relies on it)
    assert costs.iteration_s(3, 300) == costs.decode.step_s(3, 300)


def test_analytic_iteration_is_the_roofline_sum():
    """The analytic model has no prefill intercept: an iteration is the weight read once plus every
    token's FLOPs plus the K/V read, as before the fix."""
    costs = AnalyticCostModel(LLAMA_8B, ROUND_GPU)
    expected = costs.decode.step_s(8, 8000) + costs.prefill_s(512, 1024) + costs.prefill_s(64, 0)
    assert costs.iteration_s(8, 8000, [(512, 1024), (64, 0)]) == approx(expected)
    assert costs.iteration_s(0, 0, [(512, 1024)]) == approx(0.008030261248 + 0.008566584901632)


@pytest.mark.parametrize("kind", ["analytic", "profile"])
def test_compiled_linear_iteration_equals_the_formula_bit_for_bit(kind):
    """The engine times iterations through ``linear_iteration`` (compiled terms): exactly the sum the
    cost model's formula gives, fixed cost first, the chunks summed left to right."""
    costs = AnalyticCostModel(LLAMA_8B, ROUND_GPU) if kind == "analytic" else ProfileCostModel(make_profile())
    linear = costs.linear_iteration
    assert linear is not None
    decode = costs.decode
    for batch, context, chunks in [
        (8, 8000, [(512, 1024), (64, 0)]),
        (0, 0, [(100, 50)]),
        (3, 300, [(100, 50), (20, 0), (7, 3)]),
        (5, 77, []),
        (2, 10, [(0, 5), (9, 0)]),
    ]:
        fixed = max(decode.intercept_s if batch > 0 else 0.0, costs.prefill_fixed_s)
        formula = (
            decode.step_s(batch, context)
            if not chunks
            else fixed
            + decode.per_seq_s * batch
            + decode.per_context_token_s * context
            + sum(costs.prefill_s(n, start) for n, start in chunks)
        )
        assert linear.iteration_s(batch, context, chunks) == formula
        assert costs.iteration_s(batch, context, chunks) == formula


def test_profile_block_size_from_sweep():
    profile = make_profile()
    at8 = ProfileCostModel(profile, block_size=8)
    assert at8.decode.per_context_token_s == approx(4 * 1.2e-8)
    assert at8.copy_blocks_s(5) == approx(1e-5 + 5 * 1.2e-6)
    # between 16 and 32: linear in log2(block size)
    at24 = ProfileCostModel(profile, block_size=24)
    t = math.log2(24) - 4
    assert at24.decode.per_context_token_s == approx(4 * (1e-8 + t * (0.9e-8 - 1e-8)))
    per_slot = 2e-6 / 16 + t * (3.6e-6 / 32 - 2e-6 / 16)
    assert at24.copy_blocks_s(1) == approx(1e-5 + t * 1e-5 + per_slot * 24)
    # beyond the sweep: nearest end, copy and swap per slot (they keep growing with the bytes)
    at64 = ProfileCostModel(profile, block_size=64)
    assert at64.decode.per_context_token_s == approx(4 * 0.9e-8)
    assert at64.copy_blocks_s(1) == approx(2e-5 + 3.6e-6 * 2)
    assert at64.swap_blocks_s(1) == approx(8e-6 * 2)
    # without a sweep: per-context cost unchanged, copy per slot
    flat = ProfileCostModel(make_profile(sweep=False), block_size=64)
    assert flat.decode.per_context_token_s == approx(4 * 1e-8)
    assert flat.copy_blocks_s(1) == approx(1e-5 + 2e-6 * 4)


def test_rescale_guard_and_warning():
    profile = make_profile()
    deeper = SMALL.model_copy(update={"name": "deeper", "num_layers": 8, "num_kv_heads": 4})
    with pytest.raises(CostModelError, match="measured on 'small'.*'deeper'.*num_layers 4 vs 8"):
        ProfileCostModel(profile, deeper)
    with pytest.warns(UserWarning, match="rescaled to 'deeper'"):
        costs = ProfileCostModel(profile, deeper, rescale=True)
    assert costs.rescaled
    ratios = RescaleRatios.between(SMALL, deeper)
    assert ratios.kv == 2.0 and ratios.attention == 1.0 and ratios.head == 1.0 and ratios.block == 4.0
    assert ratios.weights == layer_matmul_params(deeper) / layer_matmul_params(SMALL)
    assert costs.decode.intercept_s == approx(8 * 1e-4 * ratios.weights + 2e-4)
    assert costs.decode.per_context_token_s == approx(8 * 1e-8 * 2)
    assert costs.copy_blocks_s(1) == approx(1e-5 + 2e-6 * 4)
    assert "rescaled to deeper" in costs.label


def test_same_shapes_under_another_name_need_no_rescale():
    profile = make_profile()
    renamed = SMALL.model_copy(update={"name": "small-instruct", "num_params": 4_100_000})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        costs = ProfileCostModel(profile, renamed)
    assert not costs.rescaled


def test_host_bandwidth_replaces_unmeasured_swap_only():
    profile = make_profile()
    costs = ProfileCostModel(profile, host_bandwidth_bytes_per_s=10e9)
    block_bytes = 4 * 2 * 2 * 32 * 4 * 16  # layers x (K,V) x kv heads x head_dim x fp32 x block size
    assert costs.swap_blocks_s(1) == approx(block_bytes / 10e9)
    measured = profile.model_copy(deep=True)
    measured.coefficients.block_swap = BlockCoefficients(intercept_s=1e-5, per_block_s=1e-6, measured=True)
    measured.coefficients.block_size_sweep = []
    with pytest.raises(CostModelError, match="measured swap"):
        ProfileCostModel(measured, host_bandwidth_bytes_per_s=10e9)


# --------------------------------------------------------------------------------------------------
# Loading errors
# --------------------------------------------------------------------------------------------------


def test_missing_profile_names_the_path(tmp_path):
    with pytest.raises(CostModelError, match="not found.*nope.yaml"):
        ProfileCostModel.from_yaml(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda data: data["coefficients"].pop("decode_per_layer"),
            r"coefficients\.decode_per_layer: Field required",
        ),
        (
            lambda data: data["coefficients"]["decode_per_layer"].update(intercept_z=1),
            r"decode_per_layer\.intercept_z: Extra inputs",
        ),
        (
            lambda data: data["coefficients"]["block_copy"].update(per_block_s="fast"),
            r"block_copy\.per_block_s: Input should be a valid number",
        ),
        (
            lambda data: data["coefficients"]["decode_per_step"].update(per_seq_s=-1),
            r"per_seq_s: Input should be greater",
        ),
        (lambda data: data.update(kvsim_profile=99), "kvsim_profile is 99"),
    ],
)
def test_invalid_profile_names_path_and_key(tmp_path, mutate, message):
    data = make_profile().model_dump(mode="json")
    mutate(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(CostModelError, match=message) as error:
        load_profile(path)
    assert str(path) in str(error.value)


@pytest.mark.parametrize("text", ["{: nope", "- a list\n- of things\n", ""])
def test_corrupt_profile(tmp_path, text):
    path = tmp_path / "corrupt.yaml"
    path.write_text(text)
    with pytest.raises(CostModelError, match=str(path)):
        load_profile(path)


# --------------------------------------------------------------------------------------------------
# cost_model: configuration
# --------------------------------------------------------------------------------------------------


def test_config_forms():
    assert CostModelConfig.model_validate("analytic").kind == "analytic"
    assert CostModelConfig.model_validate("derated").kind == "derated"
    assert CostModelConfig.model_validate(None).kind == "derated"
    config = CostModelConfig.model_validate({"kind": "analytic", "host_bandwidth_gb_per_s": 50})
    assert config.host_bandwidth_gb_per_s == 50
    config = CostModelConfig.model_validate({"profile": "p.yaml", "rescale": True})
    assert (config.kind, config.profile, config.rescale) == ("profile", "p.yaml", True)
    assert CostModelConfig.model_validate("configs/profiles/x.yml").profile == "configs/profiles/x.yml"
    for bad in (
        {"kind": "analytic", "profile": "p.yaml"},
        {"kind": "derated", "rescale": True},
        {"kind": "profile"},
        {"profiel": "p.yaml"},
        "roofline",
    ):
        with pytest.raises(ValueError):
            CostModelConfig.model_validate(bad)


def test_make_cost_model_analytic():
    gpu = resolve_gpu("H100-80GB")
    costs = make_cost_model("analytic", LLAMA_8B, gpu, block_size=16)
    assert isinstance(costs, AnalyticCostModel)
    costs = make_cost_model(
        {"host_bandwidth_gb_per_s": 50}, LLAMA_8B, gpu, block_size=16, kv_cache_dtype="fp8"
    )
    assert isinstance(costs, DeratedCostModel)  # the default kind
    assert costs.swap_blocks_s(1) == approx(65_536 * 16 / 50e9)
    with pytest.raises(CostModelError, match="invalid cost_model"):
        make_cost_model("analytc", LLAMA_8B, gpu, block_size=16)


def test_make_cost_model_profile_paths(tmp_path):
    gpu = resolve_gpu("H100-80GB")
    # relative to the repository root
    costs = make_cost_model(
        {"profile": "configs/profiles/analytic-llama-3.1-8b-h100-80gb.yaml"}, LLAMA_8B, gpu, block_size=16
    )
    assert isinstance(costs, ProfileCostModel) and not costs.measured
    # relative to base_dir first
    make_profile().to_yaml(tmp_path / "mine.yaml")
    spec = ModelSpec(**SMALL.model_dump())
    costs = make_cost_model({"profile": "mine.yaml"}, spec, gpu, block_size=16, base_dir=tmp_path)
    assert costs.decode.intercept_s == approx(6e-4)
    with pytest.raises(CostModelError, match=r"not found; tried: .*missing\.yaml"):
        make_cost_model({"profile": "missing.yaml"}, spec, gpu, block_size=16, base_dir=tmp_path)
    # a profile of another model is refused unless rescale is asked for
    with pytest.raises(CostModelError, match="rescale: true"):
        make_cost_model({"profile": "mine.yaml"}, LLAMA_8B, gpu, block_size=16, base_dir=tmp_path)
    with pytest.warns(UserWarning, match="rescaled"):
        make_cost_model(
            {"profile": "mine.yaml", "rescale": True}, LLAMA_8B, gpu, block_size=16, base_dir=tmp_path
        )


# --------------------------------------------------------------------------------------------------
# Shipped profiles
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gpu_name", DEFAULT_GPUS)
@pytest.mark.parametrize("block_size", [16, 32])
def test_analytic_profiles_reproduce_the_analytic_model(gpu_name, block_size):
    gpu = resolve_gpu(gpu_name)
    analytic = AnalyticCostModel(LLAMA_8B, gpu, block_size=block_size)
    path = PROFILES / f"analytic-llama-3.1-8b-{gpu_name.lower()}.yaml"
    shipped = ProfileCostModel.from_yaml(path, LLAMA_8B, block_size=block_size)
    fresh = ProfileCostModel(analytic_profile(LLAMA_8B, gpu), LLAMA_8B, block_size=block_size)
    for costs in (shipped, fresh):
        assert not costs.measured
        assert dataclasses.astuple(costs.decode) == pytest.approx(
            dataclasses.astuple(analytic.decode), rel=1e-12
        )
        for n, start in ((1, 0), (512, 0), (300, 4000)):
            assert costs.prefill_s(n, start) == pytest.approx(analytic.prefill_s(n, start), rel=1e-12)
        assert costs.copy_blocks_s(7) == pytest.approx(analytic.copy_blocks_s(7), rel=1e-12)
        assert costs.swap_blocks_s(7) == pytest.approx(analytic.swap_blocks_s(7), rel=1e-12)


def test_shipped_profiles_load():
    paths = sorted(PROFILES.glob("*.yaml"))
    assert len(paths) >= 5
    measured = 0
    for path in paths:
        profile = load_profile(path)
        costs = ProfileCostModel.from_yaml(path)
        assert costs.decode.step_s(4, 4000) > 0 and costs.prefill_s(128, 0) > 0
        if profile.measured:
            measured += 1
            assert profile.samples_csv and (path.parent / profile.samples_csv).is_file()
            assert profile.fit_quality["decode"]["n_points"] >= 3
        else:
            assert profile.formula
    assert measured >= 1


def test_readme_lists_every_profile():
    readme = (PROFILES / "README.md").read_text()
    for path in PROFILES.glob("*.yaml"):
        assert path.name in readme, path.name


def test_no_torch_import():
    import subprocess
    import sys

    code = (
        "import sys, sim.costs.core, calibrate, calibrate.cli, calibrate.fit, calibrate.grids, calibrate.runner, "
        "calibrate.analytic_profiles; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(REPO_ROOT))
