"""Vidur's measured GPU operations turned into kvsim cost profiles and derating factors.

Vidur (microsoft/vidur, MIT licence) times every operation of one decoder layer on real GPUs, fp16,
tensor parallelism 1 to 8: the matrix products, norms, rotary embedding, activation and residual add
by token count (``mlp.csv``) and paged attention by batch, context and prefill chunk at block size 16
(``attention.csv``); each row gives min/max/mean/median/std in milliseconds over 20 runs. The copies
used here are in ``calibrate/vidur_data`` with their provenance (``README.md`` there) and licence:
the ``mlp.csv`` rows at TP 1, byte for byte, and the attention rows transcribed for a grid of
operating points (the upstream files are 9-11 MB each).

What this module builds from them, all at TP 1 and block size 16:

1. **Operating points** (:func:`operating_points`): one decoder layer's time at a decode point
   (``batch`` sequences of ``context`` cached tokens each) or a prefill point (a ``chunk`` of tokens
   after a ``context``-token prefix), summed from the medians of every operation Vidur times in a
   layer, as Vidur's own predictor sums them: the four matrix products, the two norms, rotary
   embedding, activation, one residual add, and attention (its kernel plus input/output reshape).
   Vidur's ``attn_kv_cache_save`` (FlashInfer rows only) is left out: Sarathi's FlashInfer wrapper
   writes the K/V at 7.7 GB/s (1.1 ms per layer for a 2048-token chunk), far slower than vLLM's
   ``reshape_and_cache`` kernel; ``--with-kv-cache-save`` puts it back. One point in four (every
   fourth, sorted by phase, context and tokens) is held out of every fit.
2. **Profiles** (:func:`build_profile`): kvsim's per-layer forms fitted to the points (weighted least
   squares for relative error, as ``kvsim calibrate`` does), with fit quality on the held-out points,
   the samples CSV, the MIT notice and the provenance. What Vidur does not measure is filled with the
   derated model and marked ``measured: false``: the LM head, block copies and swaps, block sizes
   other than 16, and, for H100 (no attention file can be had: the only public copy of Vidur's
   ``h100/.../attention.csv`` is a Git-LFS pointer), attention itself.
3. **Derating factors** (:func:`fit_efficiency`) for :class:`sim.costs.derated.DeratedCostModel`, and the
   **error bands** (:func:`error_bands`) of each cost model against the held-out points.

``python -m calibrate.vidur`` rewrites the profiles and prints the factors and bands;
``--check`` exits with status 1 when the committed profiles or the presets in ``sim/hardware/gpus.py`` differ
from a fresh fit. No torch needed.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from calibrate.fit import fit_relative, quality
from sim.costs.core import (
    ANALYTIC_ERROR_BAND,
    DEFAULT_HOST_BANDWIDTH_BYTES_PER_S,
    REPO_ROOT,
    AnalyticCostModel,
    BlockCoefficients,
    BlockSizePoint,
    CostModel,
    CostProfile,
    LayerDecodeCoefficients,
    LayerPrefillCoefficients,
    ProfileCoefficients,
    ProfileCostModel,
    ProfileDevice,
    ProfileModel,
    StepCoefficients,
    attention_width,
    kv_elements_per_token_per_layer,
    layer_matmul_params,
)
from sim.costs.derated import (
    DECODE_LINEARIZATION_BATCHES,
    DeratedCostModel,
    elementwise_elements_per_token,
    relative_line,
)
from sim.costs.terms import attention_pairs
from sim.hardware.gpus import Efficiency, GpuSpec, resolve_gpu
from sim.hardware.models import ModelSpec, resolve_model

DATA = Path(__file__).resolve().parent / "vidur_data"
PROFILES = REPO_ROOT / "configs" / "profiles"

MATMULS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")

VIDUR_REPO = "microsoft/vidur"
VIDUR_COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"
ATTENTION_REPO = "sw5sh/cs378-assignment3"
ATTENTION_COMMIT = "7ac2fe9fb6cea9d4630659a10c5cccfc9fbdd776"


@dataclass(frozen=True)
class Dataset:
    """One GPU and model Vidur profiled."""

    key: str
    gpu: str
    model: str
    """kvsim preset with the same shapes."""
    vidur_model: str
    mlp_blob: str
    attention_blob: str | None
    """Upstream blob of ``attention.csv`` (None: no attention data could be had)."""
    attention_backend: str
    device_name: str

    @property
    def mlp_csv(self) -> Path:
        return DATA / f"{self.key.split('-', 1)[0]}-{self.vidur_model.split('/')[1]}-mlp-tp1.csv"

    @property
    def attention_csv(self) -> Path | None:
        if self.attention_blob is None:
            return None
        return DATA / f"{self.key.split('-', 1)[0]}-{self.vidur_model.split('/')[1]}-attention-rows.csv"

    def vidur_path(self, kind: str) -> str:
        return f"data/profiling/compute/{self.key.split('-', 1)[0]}/{self.vidur_model}/{kind}.csv"


DATASETS: dict[str, Dataset] = {
    dataset.key: dataset
    for dataset in (
        Dataset(
            key="a100-llama-2-7b",
            gpu="A100-80GB",
            model="Llama-2-7B",
            vidur_model="meta-llama/Llama-2-7b-hf",
            mlp_blob="479ed2f6ed22049ac444bca9fa44578532cbf28a",
            attention_blob="6ce0a3beab1618969d429b4313666b5dff6850dd",
            attention_backend="FlashAttention (Sarathi)",
            device_name="NVIDIA A100-SXM4-80GB (Vidur's profiling)",
        ),
        Dataset(
            key="a100-llama-3-8b",
            gpu="A100-80GB",
            model="Llama-3.1-8B",
            vidur_model="meta-llama/Meta-Llama-3-8B",
            mlp_blob="36db734a6943305b540bec7544002b12cc74639b",
            attention_blob="aa049dead757a81e41cecd4de19d51478fb89497",
            attention_backend="FlashInfer (Sarathi)",
            device_name="NVIDIA A100-SXM4-80GB (Vidur's profiling)",
        ),
        Dataset(
            key="h100-llama-2-7b",
            gpu="H100-80GB",
            model="Llama-2-7B",
            vidur_model="meta-llama/Llama-2-7b-hf",
            mlp_blob="661ea954e9508d67f37d3b24f0e07eb96f83ca46",
            attention_blob=None,
            attention_backend="none measured: attention filled with the derated model (A100 factors)",
            device_name="NVIDIA H100 80GB HBM3 (Vidur's profiling)",
        ),
    )
}
FACTOR_DATASETS = {"A100": "a100-llama-2-7b", "H100": "h100-llama-2-7b"}
"""Which dataset each GPU's derating factors are fitted to. A100: Llama-2-7B, whose attention ran on
FlashAttention, vLLM's default backend (the Llama-3-8B rows ran on Sarathi's FlashInfer wrapper and
serve as a cross-check). H100: its operations; attention factors are the A100's (no H100 rows)."""


# --------------------------------------------------------------------------------------------------
# Reading Vidur's rows
# --------------------------------------------------------------------------------------------------


def load_operations(path: Path) -> dict[int, dict[str, float]]:
    """Median seconds per operation, by token count. Vidur's grid lists some token counts twice (the
    boundary of two ranges, e.g. 2048); their medians are averaged."""
    grouped: dict[int, dict[str, list[float]]] = {}
    with path.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row["num_tensor_parallel_workers"] != "1":
                continue
            entry = grouped.setdefault(int(row["num_tokens"]), {})
            for op in (*MATMULS, *ELEMENTWISE):
                entry.setdefault(op, []).append(float(row[f"time_stats.{op}.median"]) * 1e-3)
    return {tokens: {op: float(np.mean(v)) for op, v in ops.items()} for tokens, ops in grouped.items()}


@dataclass(frozen=True)
class Point:
    """One decoder layer at one operating point; times in seconds."""

    phase: str
    """``decode`` or ``prefill``."""
    batch: int
    chunk: int
    context: int
    """Cached tokens of each sequence (decode) or the chunk's prefix (prefill): Vidur's kv_cache_size."""
    matmul_s: float
    elementwise_s: float
    attention_s: float
    holdout: bool = False
    attention_measured: bool = True

    @property
    def tokens(self) -> int:
        return self.batch if self.phase == "decode" else self.chunk

    @property
    def sum_context(self) -> int:
        return self.batch * self.context if self.phase == "decode" else 0

    @property
    def layer_s(self) -> float:
        return self.matmul_s + self.elementwise_s + self.attention_s


def _mark_holdout(points: list[Point]) -> list[Point]:
    ordered = sorted(points, key=lambda p: (p.phase, p.context, p.tokens))
    return [replace(point, holdout=index % 4 == 3) for index, point in enumerate(ordered)]


def attention_rows(path: Path, with_kv_cache_save: bool = False) -> list[dict[str, Any]]:
    rows = []
    with path.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            save = row["kv_cache_save_median_ms"]
            seconds = (
                float(row["attn_median_ms"])
                + float(row["input_reshape_median_ms"])
                + float(row["output_reshape_median_ms"])
                + (float(save) if with_kv_cache_save and save else 0.0)
            ) * 1e-3
            rows.append(
                {
                    "phase": row["phase"],
                    "batch": int(row["batch_size"]),
                    "chunk": int(row["prefill_chunk_size"]),
                    "context": int(row["kv_cache_size"]),
                    "attention_s": seconds,
                }
            )
    return rows


def operating_points(dataset: Dataset, *, with_kv_cache_save: bool = False) -> list[Point]:
    """The dataset's layer times at its attention rows' operating points (H100: at the A100
    Llama-2-7B points, with attention from the derated model and the A100 attention factors)."""
    operations = load_operations(dataset.mlp_csv)
    if dataset.attention_csv is not None:
        rows, measured = attention_rows(dataset.attention_csv, with_kv_cache_save), True
    else:
        reference = DATASETS[FACTOR_DATASETS["A100"]]
        assert reference.attention_csv is not None
        rows, measured = attention_rows(reference.attention_csv), False
        attention = _attention_model(resolve_model(dataset.model), resolve_gpu(dataset.gpu))
        rows = [{**row, "attention_s": attention(row)} for row in rows]
    points = []
    for row in rows:
        tokens = row["batch"] if row["phase"] == "decode" else row["chunk"]
        ops = operations[tokens]
        points.append(
            Point(
                row["phase"],
                row["batch"],
                row["chunk"],
                row["context"],
                matmul_s=sum(ops[op] for op in MATMULS),
                elementwise_s=sum(ops[op] for op in ELEMENTWISE),
                attention_s=row["attention_s"],
                attention_measured=measured,
            )
        )
    return _mark_holdout(points)


def _attention_model(model: ModelSpec, gpu: GpuSpec) -> Any:
    """One layer's attention time under the derated model with ``gpu.efficiency``."""
    eff = gpu.efficiency
    bandwidth, flops = gpu.hbm_bandwidth_bytes_per_s, gpu.fp16_flops
    kv_bytes = kv_elements_per_token_per_layer(model) * model.weight_dtype_bytes
    per_pair = 4.0 * attention_width(model) / (flops * eff.prefill_attention_flops)

    def attention(row: dict[str, Any]) -> float:
        if row["phase"] == "decode":
            return (
                eff.decode_attention_fixed_s
                + eff.decode_attention_per_seq_s * row["batch"]
                + row["batch"] * row["context"] * kv_bytes / (bandwidth * eff.kv_bandwidth)
            )
        return (
            eff.prefill_attention_fixed_s
            + per_pair * attention_pairs(row["chunk"], row["context"])
            + row["context"] * kv_bytes / (bandwidth * eff.kv_bandwidth)
        )

    return attention


# --------------------------------------------------------------------------------------------------
# Derating factors
# --------------------------------------------------------------------------------------------------


def fit_efficiency(dataset: Dataset, points: Sequence[Point] | None = None) -> dict[str, float]:
    """The derated model's factors from one dataset (attention factors from the training points).

    * ``weight_bandwidth``: weight bytes of one layer's matrices / BW over their time at 1-8 tokens
      (memory bound), averaged;
    * ``gemm_flops``: their FLOPs / FLOP/s over their time at >= 2048 tokens (compute bound), median;
    * ``layer_fixed_s``, ``elementwise_bandwidth``: the elementwise kernels' time over all token
      counts as ``fixed + bytes / (BW x share)``;
    * decode attention ``fixed + per_seq x batch + K/V bytes / (BW x kv_bandwidth)`` and prefill
      attention ``fixed + pair FLOPs / (FLOP/s x share)`` (after the prefix's K/V read) on the training
      points, each a relative-error least-squares fit (:func:`calibrate.fit.fit_relative`).
    Without attention rows (H100) the attention factors are left out."""
    model, gpu = resolve_model(dataset.model), resolve_gpu(dataset.gpu)
    bandwidth, flops = gpu.hbm_bandwidth_bytes_per_s, gpu.fp16_flops
    operations = load_operations(dataset.mlp_csv)
    params = layer_matmul_params(model)
    weight_bytes = params * model.weight_dtype_bytes
    small = [sum(ops[op] for op in MATMULS) for tokens, ops in operations.items() if tokens <= 8]
    large = [
        2.0 * params * tokens / flops / sum(ops[op] for op in MATMULS)
        for tokens, ops in operations.items()
        if tokens >= 2048
    ]
    tokens = np.array(sorted(operations), dtype=float)
    elementwise = np.array([sum(operations[int(t)][op] for op in ELEMENTWISE) for t in tokens])
    bytes_per_token = elementwise_elements_per_token(model) * model.weight_dtype_bytes
    elem = fit_relative(
        np.column_stack([np.ones_like(tokens), tokens * bytes_per_token / bandwidth]),
        elementwise,
        ("fixed", "inverse_share"),
    )
    factors = {
        "weight_bandwidth": float(np.mean([weight_bytes / bandwidth / t for t in small])),
        "gemm_flops": float(np.median(large)),
        "elementwise_bandwidth": 1.0 / elem["inverse_share"],
        "layer_fixed_s": elem["fixed"],
    }
    if dataset.attention_csv is None:
        return factors
    points = list(points) if points is not None else operating_points(dataset)
    kv_bytes = kv_elements_per_token_per_layer(model) * model.weight_dtype_bytes
    decode = [p for p in points if p.phase == "decode" and not p.holdout]
    fit_d = fit_relative(
        np.array([[1.0, p.batch, p.sum_context * kv_bytes / bandwidth] for p in decode]),
        [p.attention_s for p in decode],
        ("fixed", "per_seq", "inverse_share"),
    )
    kv_share = 1.0 / fit_d["inverse_share"]
    prefill = [p for p in points if p.phase == "prefill" and not p.holdout]
    fit_p = fit_relative(
        np.array(
            [
                [1.0, 4.0 * attention_width(model) * attention_pairs(p.chunk, p.context) / flops]
                for p in prefill
            ]
        ),
        [p.attention_s - p.context * kv_bytes / (bandwidth * kv_share) for p in prefill],
        ("fixed", "inverse_share"),
    )
    factors.update(
        kv_bandwidth=kv_share,
        decode_attention_fixed_s=fit_d["fixed"],
        decode_attention_per_seq_s=fit_d["per_seq"],
        prefill_attention_flops=1.0 / fit_p["inverse_share"],
        prefill_attention_fixed_s=fit_p["fixed"],
    )
    return factors


def rounded(factors: dict[str, float], digits: int = 3) -> dict[str, float]:
    """Factors at ``digits`` significant digits, as the presets in ``sim/hardware/gpus.py`` hold them."""
    return {key: float(f"{value:.{digits}g}") for key, value in factors.items()}


def fitted_efficiencies() -> dict[str, dict[str, float]]:
    """The A100 and H100 factors, rounded as in the presets (H100 attention factors: the A100's)."""
    a100 = rounded(fit_efficiency(DATASETS[FACTOR_DATASETS["A100"]]))
    h100 = rounded(fit_efficiency(DATASETS[FACTOR_DATASETS["H100"]]))
    attention = {key: value for key, value in a100.items() if "attention" in key or key == "kv_bandwidth"}
    return {"A100": a100, "H100": {**h100, **attention}}


# --------------------------------------------------------------------------------------------------
# Iteration times and error bands
# --------------------------------------------------------------------------------------------------


def measured_iteration_s(
    point: Point, model: ModelSpec, gpu: GpuSpec, derated: DeratedCostModel | None = None
) -> float:
    """A whole iteration at a Vidur point: the layers as measured, plus what Vidur does not time (the
    LM head and the embedding rows), from the derated model with ``gpu``'s factors."""
    derated = derated or DeratedCostModel(model, gpu)
    rows = point.batch if point.phase == "decode" else 1
    head = math.hypot(derated.head_read_s, derated.head_flops_per_row_s * rows)
    return model.num_layers * point.layer_s + head + derated.embedding_row_s * point.tokens


def predicted_iteration_s(costs: CostModel, point: Point) -> float:
    if point.phase == "decode":
        return costs.iteration_s(point.batch, point.sum_context)
    return costs.iteration_s(0, 0, [(point.chunk, point.context)])


@dataclass(frozen=True)
class Band:
    phase: str
    n_points: int
    low: float
    high: float
    mean_abs: float

    def text(self) -> str:
        low, high = int(round(self.low * 100)), int(round(self.high * 100))
        return f"{self.phase} {low:+d}..{high:+d} %"


def band(costs: CostModel, points: Sequence[Point], model: ModelSpec, gpu: GpuSpec, phase: str) -> Band:
    chosen = [p for p in points if p.phase == phase]
    derated = DeratedCostModel(model, gpu)
    errors = [
        predicted_iteration_s(costs, p) / measured_iteration_s(p, model, gpu, derated) - 1.0 for p in chosen
    ]
    return Band(phase, len(chosen), min(errors), max(errors), float(np.mean(np.abs(errors))))


def error_bands() -> dict[str, dict[str, Band]]:
    """Signed error ranges of each cost model against Vidur's iterations: held-out points of the
    dataset a model was fitted to, every point of a dataset it was not fitted to."""
    results: dict[str, dict[str, Band]] = {}
    for key, dataset in DATASETS.items():
        model, gpu = resolve_model(dataset.model), resolve_gpu(dataset.gpu)
        points = operating_points(dataset)
        held = [p for p in points if p.holdout]
        fitted_here = key in FACTOR_DATASETS.values()
        models: dict[str, tuple[CostModel, Sequence[Point]]] = {
            "analytic": (AnalyticCostModel(model, gpu), held),
            "derated": (DeratedCostModel(model, gpu), held if fitted_here else points),
        }
        path = PROFILES / profile_filename(dataset)
        if path.is_file():
            models["vidur-profile"] = (ProfileCostModel.from_yaml(path, model), held)
        results[key] = {
            f"{name}/{phase}": band(costs, chosen, model, gpu, phase)
            for name, (costs, chosen) in models.items()
            for phase in ("decode", "prefill")
        }
    return results


def efficiency_band_text(bands: dict[str, dict[str, Band]], gpu: str) -> str:
    if gpu == "A100":
        own = bands[FACTOR_DATASETS["A100"]]
        cross = bands["a100-llama-3-8b"]
        return (
            f"{own['derated/decode'].text()}, {own['derated/prefill'].text()} vs held-out Vidur A100 "
            f"Llama-2-7B iterations; Llama-3-8B (FlashInfer, not fitted): {cross['derated/decode'].text()}, "
            f"{cross['derated/prefill'].text()}; LM head not measured"
        )
    own = bands[FACTOR_DATASETS["H100"]]
    return (
        f"{own['derated/decode'].text()}, {own['derated/prefill'].text()} vs held-out Vidur H100 "
        "Llama-2-7B iterations whose attention is itself modelled (no H100 attention data): only the "
        "matrix products and elementwise kernels are checked"
    )


# --------------------------------------------------------------------------------------------------
# Profiles
# --------------------------------------------------------------------------------------------------

SAMPLE_COLUMNS = (
    "phase",
    "batch",
    "chunk",
    "context",
    "tokens",
    "matmul_s",
    "elementwise_s",
    "attention_s",
    "layer_s",
    "holdout",
    "attention_measured",
)


def profile_filename(dataset: Dataset) -> str:
    return f"vidur-{dataset.key}.yaml"


def _decode_features(points: Sequence[Point]) -> np.ndarray:
    return np.array([[1.0, p.batch, p.sum_context] for p in points])


def _prefill_features(points: Sequence[Point]) -> np.ndarray:
    return np.array([[1.0, p.chunk, attention_pairs(p.chunk, p.context)] for p in points])


def fit_points(points: Sequence[Point]) -> tuple[dict[str, dict[str, float]], dict[str, Any]]:
    """kvsim's per-layer decode and prefill forms fitted to the training points; quality on both."""
    coefficients: dict[str, dict[str, float]] = {}
    report: dict[str, Any] = {}
    for phase, features, names in (
        ("decode", _decode_features, ("intercept", "per_seq", "per_context_token")),
        ("prefill", _prefill_features, ("intercept", "per_token", "per_attention_pair")),
    ):
        train = [p for p in points if p.phase == phase and not p.holdout]
        held = [p for p in points if p.phase == phase and p.holdout]
        y = np.array([p.layer_s for p in train])
        fit = fit_relative(features(train), y, names)
        report[phase] = {
            "model": " + ".join(names),
            **quality(y, fit.predict(features(train))),
            "holdout": quality(np.array([p.layer_s for p in held]), fit.predict(features(held))),
            "coefficients": fit.as_dict(),
        }
        coefficients[phase] = fit.as_dict()
    return coefficients, report


def build_profile(dataset: Dataset, *, with_kv_cache_save: bool = False) -> tuple[CostProfile, list[Point]]:
    """The kvsim profile of one dataset and the points it was fitted to."""
    model, gpu = resolve_model(dataset.model), resolve_gpu(dataset.gpu)
    points = operating_points(dataset, with_kv_cache_save=with_kv_cache_save)
    coefficients, report = fit_points(points)
    derated = DeratedCostModel(model, gpu)
    batches = DECODE_LINEARIZATION_BATCHES
    head_intercept, head_per_row = relative_line(
        batches, [math.hypot(derated.head_read_s, derated.head_flops_per_row_s * b) for b in batches]
    )
    block_bytes = model.kv_bytes_per_token() * 16
    analytic_note = f"not measured by Vidur: derated model with the {gpu.name} factors"

    def copy(size: int) -> BlockCoefficients:
        return BlockCoefficients(
            intercept_s=0.0,
            per_block_s=derated.copy_blocks_s(1) * size / 16,
            measured=False,
            note=f"{analytic_note}: read and write the block at BW x kv_bandwidth",
        )

    def swap(size: int) -> BlockCoefficients:
        return BlockCoefficients(
            intercept_s=0.0,
            per_block_s=block_bytes * size / 16 / DEFAULT_HOST_BANDWIDTH_BYTES_PER_S,
            measured=False,
            note=f"not measured: block bytes / {DEFAULT_HOST_BANDWIDTH_BYTES_PER_S / 1e9:g} GB/s host link",
        )

    decode, prefill = coefficients["decode"], coefficients["prefill"]
    analytic_parts = [
        "decode_per_step (LM head): Vidur does not time it",
        "block_copy, block_swap: not in Vidur's compute profiles",
        "block_size_sweep: Vidur profiles block 16 only; the K/V read per token is kept, copies and "
        "swaps scale with the block's bytes",
    ]
    if dataset.attention_csv is None:
        analytic_parts.insert(
            0,
            "attention (decode and prefill): no H100 attention.csv could be had; the derated model with "
            "the A100 attention factors on the H100 datasheet",
        )
    attention_source: dict[str, Any] | None = None
    if dataset.attention_csv is not None:
        attention_source = {
            "repository": ATTENTION_REPO,
            "commit": ATTENTION_COMMIT,
            "path": dataset.vidur_path("attention"),
            "upstream_repository": VIDUR_REPO,
            "upstream_blob": dataset.attention_blob,
            "rows": f"calibrate/vidur_data/{dataset.attention_csv.name}: medians transcribed from the "
            "copy, TP 1, block 16 (not checked byte for byte against the upstream blob)",
        }
    profile = CostProfile(
        measured=True,
        tensor_parallel_size=1,  # only Vidur's num_tensor_parallel_workers == 1 rows are read
        label=f"Vidur's measured operations: {dataset.device_name}, {dataset.vidur_model}, fp16, TP 1",
        created="2026-11-30",
        kvsim_version=_version(),
        device=ProfileDevice(
            kind="cuda",
            name=dataset.device_name,
            hbm_bandwidth_bytes_per_s=float(gpu.hbm_bandwidth_bytes_per_s),
            fp16_flops=float(gpu.fp16_flops),
        ),
        model=ProfileModel.from_spec(model).model_copy(update={"name": dataset.vidur_model.split("/")[1]}),
        dtype="float16",
        block_size=16,
        timed_layers=1,
        coefficients=ProfileCoefficients(
            decode_per_layer=LayerDecodeCoefficients(
                intercept_s=decode["intercept"],
                per_seq_s=decode["per_seq"],
                per_context_token_s=decode["per_context_token"],
            ),
            decode_per_step=StepCoefficients(
                intercept_s=head_intercept,
                per_seq_s=head_per_row,
                measured=False,
                note=f"{analytic_note}: weight read and row FLOPs, quadrature sum, linearised over batches 1-256",
            ),
            prefill_per_layer=LayerPrefillCoefficients(
                intercept_s=prefill["intercept"],
                per_token_s=prefill["per_token"],
                per_attention_pair_s=prefill["per_attention_pair"],
            ),
            block_copy=copy(16),
            block_swap=swap(16),
            block_size_sweep=[
                BlockSizePoint(
                    block_size=size,
                    per_context_token_s=decode["per_context_token"],
                    block_copy=copy(size),
                    block_swap=swap(size),
                    measured=False,
                )
                for size in (8, 32, 64, 128)
            ],
        ),
        fit_quality={
            **report,
            "note": "held out: every fourth operating point sorted by phase, context and tokens; the "
            "operations' rows are shared between points with the same token count",
        },
        grid={
            "decode_points": sum(p.phase == "decode" for p in points),
            "prefill_points": sum(p.phase == "prefill" for p in points),
            "holdout_rule": "index % 4 == 3, points sorted by (phase, context, tokens)",
            "attention_backend": dataset.attention_backend,
            "kv_cache_save_included": with_kv_cache_save,
            "layer_sum": "matrix products + norms + rope + activation + one residual add (Vidur's ops) + "
            "attention kernel + input/output reshape",
        },
        samples_csv=profile_filename(dataset).replace(".yaml", ".csv"),
        notes=[
            "per-layer times summed from Vidur's per-operation medians (fp16, TP 1, CUDA events around each "
            "operation on a real GPU, 20 runs after warm-up); multiplied by the layer count, as Vidur does",
            "Vidur's A100 rows come from an SXM 80 GB part (decode attention reaches 1.97 TB/s)",
            "MIT licence: calibrate/vidur_data/LICENSE-MIT-vidur (Copyright (c) Microsoft Corporation)",
        ],
        source={
            "name": "Vidur (microsoft/vidur)",
            "licence": "MIT, Copyright (c) Microsoft Corporation; calibrate/vidur_data/LICENSE-MIT-vidur",
            "mlp": {
                "repository": VIDUR_REPO,
                "commit": VIDUR_COMMIT,
                "path": dataset.vidur_path("mlp"),
                "blob": dataset.mlp_blob,
                "rows": f"calibrate/vidur_data/{dataset.mlp_csv.name}: the TP 1 rows, byte for byte",
            },
            "attention": attention_source,
        },
        analytic_parts=analytic_parts,
    )
    return profile, points


def write_samples(path: Path, points: Sequence[Point]) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(SAMPLE_COLUMNS)
        for p in points:
            writer.writerow(
                [
                    p.phase,
                    p.batch,
                    p.chunk,
                    p.context,
                    p.tokens,
                    f"{p.matmul_s:.9g}",
                    f"{p.elementwise_s:.9g}",
                    f"{p.attention_s:.9g}",
                    f"{p.layer_s:.9g}",
                    int(p.holdout),
                    int(p.attention_measured),
                ]
            )


def load_samples(path: Path) -> list[Point]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [
            Point(
                row["phase"],
                int(row["batch"]),
                int(row["chunk"]),
                int(row["context"]),
                matmul_s=float(row["matmul_s"]),
                elementwise_s=float(row["elementwise_s"]),
                attention_s=float(row["attention_s"]),
                holdout=bool(int(row["holdout"])),
                attention_measured=bool(int(row["attention_measured"])),
            )
            for row in csv.DictReader(handle)
        ]


def _version() -> str:
    from calibrate.runner import kvsim_version

    return kvsim_version()


# --------------------------------------------------------------------------------------------------
# Comparison with the measured H200 torch profiles
# --------------------------------------------------------------------------------------------------

COMPARISON_POINTS: tuple[tuple[str, int, int], ...] = (
    ("decode", 1, 1024),
    ("decode", 32, 1024),
    ("decode", 128, 1024),
    ("decode", 256, 2048),
    ("prefill", 128, 0),
    ("prefill", 512, 0),
    ("prefill", 2048, 0),
    ("prefill", 512, 4096),
)
"""``(phase, batch or chunk tokens, context per sequence or prefix)`` for the comparison table."""


def comparison_rows(model_name: str) -> list[dict[str, Any]]:
    """Iteration times (ms) at :data:`COMPARISON_POINTS` under each cost model that exists for
    ``model_name`` near an H200: the measured H200 torch profiles (eager, CUDA graphs), the
    Vidur-derived H100 profile, the derated model on H100 and on H200, and the roofline on H200."""
    model = resolve_model(model_name)
    slug = "llama-2-7b" if model_name == "Llama-2-7B" else "llama-3.1-8b"
    columns: dict[str, CostModel] = {
        "H200 torch eager (measured)": ProfileCostModel.from_yaml(PROFILES / f"h200-{slug}-full.yaml", model),
    }
    graphs = PROFILES / f"h200-{slug}-full-graphs.yaml"
    if graphs.is_file():
        columns["H200 torch CUDA graphs (measured)"] = ProfileCostModel.from_yaml(graphs, model)
    vidur_h100 = PROFILES / f"vidur-h100-{slug}.yaml"
    if vidur_h100.is_file():
        columns["H100 Vidur (measured ops)"] = ProfileCostModel.from_yaml(vidur_h100, model)
    columns["H100 derated"] = DeratedCostModel(model, resolve_gpu("H100-80GB"))
    columns["H200 derated"] = DeratedCostModel(model, resolve_gpu("H200-141GB"))
    columns["H200 roofline"] = AnalyticCostModel(model, resolve_gpu("H200-141GB"))
    rows = []
    for phase, tokens, context in COMPARISON_POINTS:
        row: dict[str, Any] = {"phase": phase, "tokens": tokens, "context": context}
        for name, costs in columns.items():
            if phase == "decode":
                seconds = costs.iteration_s(tokens, tokens * context)
            else:
                seconds = costs.iteration_s(0, 0, [(tokens, context)])
            row[name] = seconds * 1e3
        rows.append(row)
    return rows


def comparison_markdown(model_name: str) -> str:
    rows = comparison_rows(model_name)
    names = [key for key in rows[0] if key not in ("phase", "tokens", "context")]
    lines = [
        "| operating point | " + " | ".join(f"{name} (ms)" for name in names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for row in rows:
        if row["phase"] == "decode":
            point = f"decode, batch {row['tokens']}, {row['context']:,} tokens each"
        else:
            point = f"prefill {row['tokens']:,} tokens" + (
                f" after {row['context']:,}" if row["context"] else ""
            )
        lines.append(f"| {point} | " + " | ".join(f"{row[name]:.2f}" for name in names) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def _efficiency_snippet(name: str, factors: dict[str, float]) -> str:
    lines = [f"_{name} = Efficiency("]
    lines += [f"    {key}={value!r}," for key, value in factors.items()]
    lines.append("    ...")
    lines.append(")")
    return "\n".join(lines)


# A least-squares fit repeated on another CPU (another BLAS kernel) moves the last digits: a committed
# profile is the fresh fit when every number agrees to this relative tolerance and the rest exactly.
FIT_RELATIVE_TOLERANCE = 1e-9


def same_fit(committed: Any, fresh: Any) -> bool:
    """Whether two fitted coefficient sets are the same fit (floats to FIT_RELATIVE_TOLERANCE)."""
    return _same_values(committed.model_dump(), fresh.model_dump())


def _same_values(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=FIT_RELATIVE_TOLERANCE, abs_tol=1e-300)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_values(a[key], b[key]) for key in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_values(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def check_presets(fitted: dict[str, dict[str, float]], presets: dict[str, Efficiency]) -> list[str]:
    problems = []
    for name, factors in fitted.items():
        for key, value in factors.items():
            stored = getattr(presets[name], key)
            if not math.isclose(stored, value, rel_tol=1e-9):
                problems.append(
                    f"{name}.{key}: sim/hardware/gpus.py has {stored!r}, a fresh fit gives {value!r}"
                )
    return problems


def main(argv: list[str] | None = None) -> int:
    from sim.hardware.gpus import EFFICIENCY_PRESETS

    parser = argparse.ArgumentParser(prog="python -m calibrate.vidur", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=PROFILES, help="folder for the profiles")
    parser.add_argument(
        "--check", action="store_true", help="compare with the committed files; write nothing"
    )
    parser.add_argument(
        "--compare-h200", action="store_true", help="print the H200 comparison tables (markdown) and exit"
    )
    parser.add_argument(
        "--with-kv-cache-save",
        action="store_true",
        help="include Vidur's attn_kv_cache_save in the layer time (FlashInfer rows only)",
    )
    args = parser.parse_args(argv)
    if args.compare_h200:
        for model_name in ("Llama-2-7B", "Llama-3.1-8B"):
            print(f"{model_name}:\n\n{comparison_markdown(model_name)}\n")
        return 0
    problems = []
    for dataset in DATASETS.values():
        profile, points = build_profile(dataset, with_kv_cache_save=args.with_kv_cache_save)
        path = args.out / profile_filename(dataset)
        if args.check:
            committed = ProfileCostModel.from_yaml(path).profile if path.is_file() else None
            if committed is None or not same_fit(committed.coefficients, profile.coefficients):
                problems.append(f"{path}: differs from a fresh fit")
        else:
            args.out.mkdir(parents=True, exist_ok=True)
            profile.to_yaml(path)
            write_samples(path.with_suffix(".csv"), points)
            print(f"wrote {path} and {path.with_suffix('.csv').name}")
        for phase in ("decode", "prefill"):
            q = profile.fit_quality[phase]
            h = q["holdout"]
            print(
                f"  {dataset.key} {phase:7s} fit: R2 {q['r2']:.4f}, mean {q['mean_rel_err']:.1%}, max "
                f"{q['max_rel_err']:.1%}; held out ({h['n_points']}): mean {h['mean_rel_err']:.1%}, "
                f"{h['min_signed_rel_err']:+.1%}..{h['max_signed_rel_err']:+.1%}"
            )
    fitted = fitted_efficiencies()
    for name, factors in fitted.items():
        print(_efficiency_snippet(name, factors))
    problems += check_presets(fitted, EFFICIENCY_PRESETS)
    bands = error_bands()
    for key, by_model in bands.items():
        for name, value in by_model.items():
            print(
                f"  band {key:16s} {name:22s} n={value.n_points:3d} {value.low:+.3f}..{value.high:+.3f} "
                f"mean |e| {value.mean_abs:.3f}"
            )
    own = bands[FACTOR_DATASETS["A100"]]
    analytic = (
        f"{own['analytic/decode'].text()}, {own['analytic/prefill'].text()} vs held-out Vidur A100 "
        "Llama-2-7B iterations (datasheet peaks, no derating: too fast everywhere)"
    )
    print(f"  analytic error_band: {analytic}")
    if analytic != ANALYTIC_ERROR_BAND:
        problems.append(f"ANALYTIC_ERROR_BAND in sim/costs/core.py differs from: {analytic}")
    for gpu in ("A100", "H100"):
        text = efficiency_band_text(bands, gpu)
        print(f"  {gpu} error_band: {text}")
        if EFFICIENCY_PRESETS[gpu].error_band != text:
            problems.append(f"{gpu} error_band in sim/hardware/gpus.py differs from: {text}")
    if args.check and problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
