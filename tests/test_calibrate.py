"""Calibration: the fitting on synthetic data (numpy only), the grids, the paged-attention kernel
against a dense float64 reference, and a real smoke-sized calibration end to end (torch).

Nothing here asserts on absolute times: those depend on the machine and its load."""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from calibrate.fit import fit_relative, quality
from calibrate.grids import GRID_NAMES, make_grid
from calibrate.runner import grid_points, load_samples, refit
from sim.costs.core import REPO_ROOT, ProfileCostModel, load_profile
from sim.hardware.models import resolve_model

# --------------------------------------------------------------------------------------------------
# Fitting (no torch)
# --------------------------------------------------------------------------------------------------


def decode_design() -> np.ndarray:
    rows = [(1.0, b, b * ctx) for b in (1, 2, 4, 8, 16) for ctx in (128, 512, 1024, 2048)]
    return np.array(rows)


def test_fit_recovers_known_coefficients_exactly():
    x = decode_design()
    truth = np.array([3e-4, 2e-5, 4e-8])
    fit = fit_relative(x, x @ truth, ("intercept", "per_seq", "per_context_token"))
    assert np.allclose(fit.coef, truth, rtol=1e-6, atol=0)
    assert fit["per_seq"] == pytest.approx(2e-5, rel=1e-6)
    report = quality(x @ truth, fit.predict(x))
    assert report["r2"] == pytest.approx(1.0) and report["max_rel_err"] < 1e-9


def test_quality_by_hand():
    # y = 1, 2, 4; predicted 1, 2, 3. Relative errors 0, 0, 1/4: mean 1/12, max 1/4.
    # SSE = 1; mean 7/3, SST = (16 + 1 + 25) / 9 = 42/9; R² = 1 - 9/42 = 33/42.
    # Signed relative errors 0, 0, -1/4 (negative: predicted too fast).
    report = quality([1.0, 2.0, 4.0], [1.0, 2.0, 3.0])
    assert report == pytest.approx(
        {
            "n_points": 3,
            "mean_rel_err": 1 / 12,
            "max_rel_err": 0.25,
            "min_signed_rel_err": -0.25,
            "max_signed_rel_err": 0.0,
            "r2": 33 / 42,
        }
    )
    # Fewer than 3 points, or no spread: no R².
    assert "r2" not in quality([1.0, 2.0], [1.0, 2.0])
    assert "r2" not in quality([2.0, 2.0, 2.0], [1.0, 2.0, 3.0])
    assert quality([], []) == {"n_points": 0}


def test_fit_with_noise_within_tolerance():
    rng = np.random.default_rng(7)
    x = decode_design()
    truth = np.array([3e-4, 2e-5, 4e-8])
    noisy = x @ truth * rng.lognormal(0.0, 0.02, size=len(x))  # 2 % multiplicative noise
    fit = fit_relative(x, noisy, ("intercept", "per_seq", "per_context_token"))
    assert np.allclose(fit.coef, truth, rtol=0.1, atol=0)
    report = quality(noisy, fit.predict(x))
    assert report["r2"] > 0.99 and report["mean_rel_err"] < 0.03


def test_fit_minimises_relative_error():
    x = np.array([[1.0, n] for n in (1, 2, 4, 8, 1000)])
    y = x @ np.array([1e-5, 1e-6]) * np.array([1.0, 1.1, 0.95, 1.0, 1.5])

    def relative_sse(coef):
        return float(np.sum(((x @ np.asarray(coef) - y) / y) ** 2))

    fit = fit_relative(x, y, ("a", "b"))
    plain, *_ = np.linalg.lstsq(x, y, rcond=None)  # the absolute-error fit, dominated by the big point
    assert relative_sse(fit.coef) < relative_sse(plain)
    for delta in ((1e-3, 0), (-1e-3, 0), (0, 1e-3), (0, -1e-3)):
        assert relative_sse(fit.coef) <= relative_sse(np.asarray(fit.coef) * (1 + np.asarray(delta)))


def test_fit_keeps_coefficients_non_negative():
    x = np.array([[1.0, n] for n in (1, 2, 3, 4)])
    y = np.array([1.0, 2.1, 3.3, 4.6])
    free = fit_relative(x, y, ("a", "b"), nonnegative=False)
    assert free["a"] < 0
    clamped = fit_relative(x, y, ("a", "b"))
    assert clamped["a"] == 0.0 and clamped["b"] > 0


def test_fit_rejects_bad_input():
    with pytest.raises(ValueError, match="positive"):
        fit_relative([[1.0, 1.0], [1.0, 2.0]], [1.0, 0.0], ("a", "b"))
    with pytest.raises(ValueError, match="cannot determine"):
        fit_relative([[1.0, 1.0]], [1.0], ("a", "b"))


@pytest.mark.parametrize("name", GRID_NAMES)
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_grids_can_be_fitted(name, device):
    grid = make_grid(name, device)
    points = grid_points(grid, 16, swaps=device == "cuda")

    def count(phase, holdout=False, size=16):
        return sum(1 for p in points if p.phase == phase and p.holdout == holdout and p.block_size == size)

    assert count("decode") >= 4 and count("prefill") >= 4 and count("copy") >= 3 and count("head") >= 2
    assert any(p.ragged for p in points if p.phase == "decode" and p.holdout)
    assert {p.num_blocks for p in points if p.phase == "copy"} >= {1, 64} or name == "smoke"
    for size in set(grid.sweep_block_sizes) | {16}:
        assert len({p.ctx_sum for p in points if p.phase == "sweep_attn" and p.block_size == size}) >= 2
        assert count("sweep_copy", size=size) >= 2
    if device == "cuda":
        assert count("swap_out") >= 3 and count("swap_in") >= 3
    assert all(p.ctx_sum <= grid.max_sum_context for p in points if p.phase == "decode" and not p.holdout)


def test_committed_profile_refits_from_its_samples():
    # Profiles kvsim calibrate measured (the Vidur-derived ones have their own refit: tests/test_vidur.py)
    paths = [
        path
        for path in (REPO_ROOT / "configs" / "profiles").glob("*.yaml")
        if load_profile(path).measured and load_profile(path).source is None
    ]
    assert paths, "no measured profile committed"
    for path in paths:
        profile = load_profile(path)
        assert profile.samples_csv is not None
        coefficients, report = refit(profile, path.parent / profile.samples_csv)
        for phase in ("decode_per_layer", "prefill_per_layer", "decode_per_step", "block_copy"):
            fresh, stored = (
                getattr(coefficients, phase).model_dump(),
                getattr(profile.coefficients, phase).model_dump(),
            )
            for key, value in stored.items():
                if isinstance(value, float):
                    assert fresh[key] == pytest.approx(value, rel=1e-9, abs=1e-18), (path.name, phase, key)
        assert report["decode"]["r2"] == pytest.approx(profile.fit_quality["decode"]["r2"], rel=1e-9)


# --------------------------------------------------------------------------------------------------
# Paged attention against a dense float64 reference (torch)
# --------------------------------------------------------------------------------------------------


def dense_reference(q, k, v, start=None):
    """Explicit-softmax attention in float64. ``q`` [Nq, H, D]; ``k``, ``v`` [T, Hkv, D]. GQA by
    ``repeat_interleave``; with ``start``, query i sees keys 0 .. start + i (causal), else all keys."""
    import torch

    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[-1])
    if start is not None:
        allowed = torch.arange(k.shape[0])[None, :] <= (start + torch.arange(q.shape[0]))[:, None]
        scores = scores.masked_fill(~allowed[None], float("-inf"))
    weights = torch.exp(scores - scores.amax(-1, keepdim=True))
    weights = weights / weights.sum(-1, keepdim=True)
    return torch.einsum("hqk,khd->qhd", weights, v)


def relative_error(actual, expected) -> float:
    return float((actual.double() - expected).norm() / expected.norm())


def scattered_pool(lengths, block_size, kv_heads, head_dim, generator, spare=5):
    """A pool whose sequences hold random K/V in blocks with shuffled, non-contiguous ids (and spare
    garbage blocks), written through the slot mapping. Returns pool, tables, per-sequence dense K/V."""
    import torch

    from calibrate import kernels

    blocks = [-(-n // block_size) for n in lengths]
    total = sum(blocks) + spare
    ids = torch.randperm(total, generator=generator)
    k_pool = torch.randn(total, block_size, kv_heads, head_dim, generator=generator) * 100  # garbage
    v_pool = torch.randn(total, block_size, kv_heads, head_dim, generator=generator) * 100
    tables = torch.zeros(len(lengths), max(blocks), dtype=torch.int32)
    dense = []
    offset = 0
    for row, (n, count) in enumerate(zip(lengths, blocks, strict=True)):
        tables[row, :count] = ids[offset : offset + count]
        tables[row, count:] = ids[offset]
        offset += count
        k = torch.randn(n, kv_heads, head_dim, generator=generator)
        v = torch.randn(n, kv_heads, head_dim, generator=generator)
        slots = kernels.slot_mapping(tables, torch.full((n,), row), torch.arange(n), block_size)
        kernels.write_kv(k_pool, v_pool, slots, k, v)
        dense.append((k, v))
    return k_pool, v_pool, tables, dense


@pytest.mark.torch
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_paged_decode_matches_dense_reference(block_size):
    torch = pytest.importorskip("torch")
    from calibrate import kernels

    generator = torch.Generator().manual_seed(block_size)
    heads, kv_heads, head_dim = 8, 2, 32
    lengths = [1, 17, 64, 100, 33, 16]  # ragged; 1 and exact block multiples included
    k_pool, v_pool, tables, dense = scattered_pool(lengths, block_size, kv_heads, head_dim, generator)
    descending = [int(a) > int(b) for row in tables for a, b in zip(row, row[1:], strict=False)]
    assert any(descending)  # the block ids are not contiguous
    q = torch.randn(len(lengths), heads, head_dim, generator=generator)
    out = kernels.paged_decode_attention(q, k_pool, v_pool, tables, torch.tensor(lengths))
    for row, (k, v) in enumerate(dense):
        expected = dense_reference(q[row : row + 1], k, v)[0]
        assert relative_error(out[row], expected) < 1e-5


@pytest.mark.torch
@pytest.mark.parametrize(("start", "chunk"), [(0, 50), (37, 50), (64, 1), (200, 100)])
def test_paged_prefill_chunk_matches_causal_reference(start, chunk):
    torch = pytest.importorskip("torch")
    from calibrate import kernels

    generator = torch.Generator().manual_seed(start + chunk)
    heads, kv_heads, head_dim = 8, 2, 32
    k_pool, v_pool, tables, dense = scattered_pool([start + chunk], 16, kv_heads, head_dim, generator)
    q = torch.randn(chunk, heads, head_dim, generator=generator)
    out = kernels.paged_prefill_attention(q, k_pool, v_pool, tables[0], start)
    k, v = dense[0]
    assert relative_error(out, dense_reference(q, k, v, start=start)) < 1e-5


@pytest.mark.torch
def test_decoder_layer_chunking_and_decode_agree():
    """The whole layer: one prefill chunk == two chunks; a decode step == a 1-token chunk."""
    torch = pytest.importorskip("torch")
    from calibrate import kernels
    from sim.costs.core import ProfileModel

    model = ProfileModel(
        name="t",
        num_layers=1,
        hidden_size=64,
        num_attention_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=96,
        vocab_size=100,
        num_params=1,
    )
    layer = kernels.DecoderLayer(model, torch.float32, torch.device("cpu"))
    generator = torch.Generator().manual_seed(3)
    total, block_size = 41, 8
    x = torch.randn(total + 1, 64, generator=generator)
    table = torch.tensor([[5, 0, 3, 7, 1, 6]], dtype=torch.int32)

    def pools():
        return torch.zeros(8, block_size, 2, 16), torch.zeros(8, block_size, 2, 16)

    def slots(begin, end):
        return kernels.slot_mapping(
            table, torch.zeros(end - begin, dtype=torch.long), torch.arange(begin, end), block_size
        )

    k1, v1 = pools()
    whole = layer.prefill(x[:total], k1, v1, table[0], 0, slots(0, total))
    k2, v2 = pools()
    first = layer.prefill(x[:25], k2, v2, table[0], 0, slots(0, 25))
    second = layer.prefill(x[25:total], k2, v2, table[0], 25, slots(25, total))
    assert relative_error(torch.cat([first, second]), whole.double()) < 1e-5
    step = layer.decode(x[total:], k2, v2, table, torch.tensor([total + 1]), slots(total, total + 1))
    chunk = layer.prefill(x[total:], k1, v1, table[0], total, slots(total, total + 1))
    assert relative_error(step, chunk.double()) < 1e-5


# --------------------------------------------------------------------------------------------------
# The command and a real smoke calibration (torch)
# --------------------------------------------------------------------------------------------------


def test_register_adds_the_subcommand():
    from calibrate.cli import register, run

    parser = argparse.ArgumentParser(prog="kvsim")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["calibrate", "--model", "Llama-3.1-8B", "-o", "p.yaml"])
    assert args.func is run and args.device == "cpu" and args.grid == "quick" and args.block_size == 16
    assert args.dtype is None


def test_missing_torch_gives_install_hint(monkeypatch, capsys, tmp_path):
    from calibrate.cli import main

    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    assert main(["--model", "Llama-3.1-8B", "--grid", "smoke", "-o", str(tmp_path / "p.yaml")]) == 2
    assert "pip install 'kvsim[calibrate]'" in capsys.readouterr().err
    assert not (tmp_path / "p.yaml").exists()


TINY_CONFIG = {
    "model_type": "llama",
    "num_hidden_layers": 3,
    "hidden_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 256,
    "vocab_size": 512,
    "torch_dtype": "float32",
}


@pytest.mark.torch
def test_smoke_calibration_end_to_end(tmp_path, capsys):
    pytest.importorskip("torch")
    from calibrate.cli import main

    config = tmp_path / "tiny" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(TINY_CONFIG))
    output = tmp_path / "out" / "tiny.yaml"
    assert main(["--model", str(config), "--device", "cpu", "--grid", "smoke", "-o", str(output)]) == 0
    captured = capsys.readouterr()
    assert "wrote" in captured.out
    total = len(grid_points(make_grid("smoke", "cpu"), 16, swaps=False)) * make_grid("smoke", "cpu").rounds
    assert f"point {total}/{total} (100%)" in captured.err and "ETA" in captured.err
    assert "memory peak about" in captured.err

    profile = load_profile(output)
    model = resolve_model(config)
    assert profile.measured and profile.device.kind == "cpu" and profile.device.num_threads == 1
    assert profile.model.num_layers == 3 and profile.dtype == "float32" and profile.grid["name"] == "smoke"
    assert not profile.coefficients.block_swap.measured  # no host link on CPU
    assert {point.block_size for point in profile.coefficients.block_size_sweep} == {8, 32}
    assert {"holdout_uniform", "holdout_ragged_sum_context", "holdout_ragged_padded_context"} <= set(
        profile.fit_quality["decode"]
    )
    assert "holdout" in profile.fit_quality["prefill"]

    csv_path = output.with_suffix(".csv")
    assert profile.samples_csv == csv_path.name
    with csv_path.open() as handle:
        rows = list(csv.DictReader(handle))
    points = grid_points(make_grid("smoke", "cpu"), 16, swaps=False)
    assert len(rows) == len(points) * profile.grid["rounds"]
    assert {row["phase"] for row in rows} == {"decode", "head", "prefill", "copy", "sweep_attn", "sweep_copy"}
    assert len(load_samples(csv_path)) == len(points)

    coefficients, fresh = refit(profile, csv_path)
    assert coefficients.decode_per_layer.model_dump() == pytest.approx(
        profile.coefficients.decode_per_layer.model_dump(), rel=1e-9, abs=1e-18
    )
    # The fit quality the profile states is the one its own samples give (not a number that only
    # has to look plausible): R², mean and max relative error of every phase, recomputed.
    for phase in ("decode", "prefill", "copy"):
        for key in ("n_points", "r2", "mean_rel_err", "max_rel_err"):
            assert profile.fit_quality[phase][key] == pytest.approx(fresh[phase][key], rel=1e-9), (phase, key)

    costs = ProfileCostModel.from_yaml(output, model)
    assert costs.measured and "cpu" in costs.label
    assert costs.decode.step_s(4, 1000) > 0 and costs.prefill_s(64, 0) > 0 and costs.copy_blocks_s(2) > 0
    for block_size in (8, 16, 24, 64):
        ProfileCostModel.from_yaml(output, model, block_size=block_size)


# --------------------------------------------------------------------------------------------------
# Checks before any work, memory, progress
# --------------------------------------------------------------------------------------------------


def test_unknown_model_is_a_one_line_error(capsys, tmp_path):
    from calibrate.cli import main

    assert main(["--model", "Nope-1B", "-o", str(tmp_path / "p.yaml")]) == 2
    error = capsys.readouterr().err
    assert "kvsim calibrate: error: --model: unknown model 'Nope-1B'" in error and "Traceback" not in error


@pytest.mark.parametrize(
    ("name", "content", "why"),
    [
        ("p.yaml", "my: own yaml\n", "p.yaml: exists and is not a kvsim profile"),
        ("p.csv", "a,b\n1,2\n", "p.csv: exists and is not a kvsim samples CSV"),
        ("p", None, "give a name ending in .yaml"),
    ],
)
def test_output_that_kvsim_did_not_write_is_refused(capsys, tmp_path, name, content, why):
    from calibrate.cli import main

    if content is not None:
        (tmp_path / name).write_text(content)
    target = tmp_path / ("p.yaml" if content is not None else name)
    assert main(["--model", "Llama-3.1-8B", "-o", str(target)]) == 2
    assert why in capsys.readouterr().err
    if content is not None:
        assert (tmp_path / name).read_text() == content


def test_kvsim_profiles_and_samples_are_recognised():
    from calibrate.runner import is_profile_yaml, is_samples_csv

    profiles = Path(__file__).resolve().parents[1] / "configs" / "profiles"
    assert is_profile_yaml(profiles / "cpu-llama-3.2-1b.yaml")
    assert is_samples_csv(profiles / "cpu-llama-3.2-1b.csv")
    assert not is_profile_yaml(profiles / "cpu-llama-3.2-1b.csv")
    assert not is_samples_csv(profiles / "llama-3.2-1b.config.json")


@pytest.mark.torch
def test_cuda_without_a_gpu_is_refused_before_any_work(capsys, tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    from calibrate.cli import main

    assert main(["--model", "Llama-3.1-8B", "--device", "cuda", "-o", str(tmp_path / "p.yaml")]) == 2
    assert "--device cuda, but torch sees no CUDA device" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_memory_estimate_by_hand():
    from calibrate.memory import point_bytes, weight_bytes
    from calibrate.runner import Point

    model = SimpleNamespace(
        num_layers=3,
        hidden_size=128,
        num_attention_heads=4,
        num_kv_heads=2,
        head_dim=32,
        intermediate_size=256,
        vocab_size=512,
        gated_mlp=True,
    )  # TINY_CONFIG's shapes
    # layer: qkv (128 + 2 x 64) x 128 + o 128 x 128 + gate/up 512 x 128 + down 128 x 256 = 147,456
    # head: 512 x 128 = 65,536; float32
    assert weight_bytes(model, 4) == (147_456 + 65_536) * 4
    # one token's K (or V) in one layer: 2 heads x 32 x 4 B = 256 B
    # copy of 4 blocks of 16: a cache of 2 x 4 + 1 blocks and the 4 gathered twice, 3 layers x (K, V)
    block = 3 * 2 * 16 * 256
    assert point_bytes(Point("copy", 16, num_blocks=4), model, 4) == 9 * block + 2 * 4 * block
    # decode of 2 x 64 tokens: pools 8 blocks x 16 x 256 x (K, V); gathered 128 tokens x 256 x 2;
    # scores 2 sequences x 4 heads x 64 keys x 4 B, twice (scores and softmax)
    decode = Point("decode", 16, contexts=(64, 64))
    assert point_bytes(decode, model, 4) == 2 * 8 * 16 * 256 + 2 * 128 * 256 + 2 * (2 * 4 * 64 * 4)


def test_point_progress_in_a_log_is_throttled_and_ends_with_the_last_point():
    import io

    from calibrate.cli import PointReporter
    from calibrate.runner import Point

    stream = io.StringIO()
    report = PointReporter(interval_s=10.0, stream=stream)
    point = Point("head", 16, num_tokens=4)
    for done, elapsed in ((1, 2.0), (2, 5.0), (3, 12.5), (4, 20.0)):
        report(done, 4, point, elapsed)
    lines = stream.getvalue().splitlines()
    # 2 s: printed (first); 5 s: within 10 s of it; 12.5 s: printed; 20 s: the last point, always
    assert lines == [
        "point 1/4 (25%), 2 s elapsed, ETA 6 s: LM head, batch 4",
        "point 3/4 (75%), 12 s elapsed, ETA 4 s: LM head, batch 4",
        "point 4/4 (100%), 20 s elapsed, ETA 0 s: LM head, batch 4",
    ]
