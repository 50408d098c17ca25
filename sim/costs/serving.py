"""What a serving engine adds to its kernels' time, fitted to measured serving runs end to end.

The derated cost model's factors (:class:`sim.hardware.gpus.Efficiency`) come from timing single
operations (Vidur's profiles): they say how fast a matrix product or an attention kernel runs alone.
A server adds what those timings leave out, and replays of measured vLLM runs show how much:

* ``iteration_overhead_s``: CPU time per engine iteration that the GPU waits for (scheduling, input
  preparation, sampling, detokenization not hidden by async scheduling);
* ``request_overhead_s``: time outside the engine in every request's client-side TTFT and E2E (HTTP,
  the API server, tokenization, the first streamed chunk); it relabels latencies, it delays nothing;
* ``decode_attention_per_seq_scale``, ``kv_bandwidth_scale``, ``weight_bandwidth_scale``: how the
  fused, CUDA-graphed kernels of a server differ from the eagerly timed ones (scales of the GPU's
  factors). A bandwidth share never exceeds what the GPU's memory really delivers
  (:class:`sim.hardware.gpus.AchievableBandwidth`): the scales are properties of the server's
  kernels, the ceiling a property of the GPU, so a scale fitted on one GPU moves another only as
  far as that GPU's own memory allows;
* ``all_reduce_latency_s``: one tensor-parallel all-reduce's fixed time at TP 2 over NVLink (x log2(tp)
  beyond), which vLLM's custom all-reduce makes smaller than NCCL's; ``pcie_all_reduce_scale``: how
  much slower NCCL's all-reduce runs over PCIe than its ring model says.

A calibration is a YAML file (:func:`load_calibration`) written by ``kvsim calibrate --from-runs``,
which also records the runs it was fitted to and its leave-one-run-out errors; the derated model
uses :data:`DEFAULT_CALIBRATION_PATH` unless told otherwise (``cost_model: {calibration: ...}``).

The fit record also says which GPU each run was measured on, and the errors of refits that left out
one GPU at a time (``leave_one_gpu_out``): what a GPU without runs of its own should expect
(:meth:`ServingCalibration.evidence`, :meth:`ServingCalibration.error_band`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

if TYPE_CHECKING:
    from sim.costs.terms import AllReduceCost, AllToAllCost
    from sim.hardware.gpus import Efficiency, GpuSpec

Collective = TypeVar("Collective", "AllReduceCost", "AllToAllCost")

DEFAULT_CALIBRATION_PATH = Path(__file__).with_name("serving_calibration.yaml")
CALIBRATION_KIND = "kvsim-serving-calibration"


@dataclass(frozen=True)
class ServingCalibration:
    """The fitted serving terms (see the module docstring); the neutral values leave the kernel-level
    model as it is."""

    iteration_overhead_s: float = 0.0
    request_overhead_s: float = 0.0
    decode_attention_per_seq_scale: float = 1.0
    kv_bandwidth_scale: float = 1.0
    weight_bandwidth_scale: float = 1.0
    all_reduce_latency_s: float | None = None
    """None: the NCCL figure of :data:`sim.costs.terms.ALL_REDUCE_LATENCY_S`."""
    pcie_all_reduce_scale: float = 1.0
    """A scale of the all-reduce time on GPUs without NVLink (NCCL over PCIe, where vLLM's custom
    all-reduce does not apply and the latency stays NCCL's)."""
    source: str = "none (kernel-level factors only)"
    fit: dict[str, Any] = field(default_factory=dict, compare=False)
    """What the fit recorded: runs, in-sample and leave-one-run-out errors (for reports)."""

    def __post_init__(self) -> None:
        for item in fields(self):
            if item.name in ("source", "fit"):
                continue
            value = getattr(self, item.name)
            if value is None and item.name == "all_reduce_latency_s":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"serving calibration: {item.name} must be a number >= 0, got {value!r}")
            if item.name.endswith("_scale") and value == 0:
                raise ValueError(f"serving calibration: {item.name} must be positive, got {value!r}")

    @property
    def is_neutral(self) -> bool:
        return self.parameters() == ServingCalibration().parameters()

    def parameters(self) -> dict[str, float | None]:
        return {name: getattr(self, name) for name in PARAMETERS}

    def derate(self, efficiency: Efficiency, achievable_share: float = 1.0) -> Efficiency:
        """``efficiency`` with this calibration's scales applied, every bandwidth share capped at
        ``achievable_share`` (the GPU's :class:`sim.hardware.gpus.AchievableBandwidth`)."""
        if self.is_neutral:
            return efficiency
        return replace(
            efficiency,
            kv_bandwidth=min(achievable_share, efficiency.kv_bandwidth * self.kv_bandwidth_scale),
            weight_bandwidth=min(achievable_share, efficiency.weight_bandwidth * self.weight_bandwidth_scale),
            decode_attention_per_seq_s=efficiency.decode_attention_per_seq_s
            * self.decode_attention_per_seq_scale,
        )

    def all_reduce(self, cost: Collective, nvlink: bool) -> Collective:
        """The all-reduce terms of a GPU with or without NVLink, with this calibration applied; also
        the all-gathers and reduce-scatters of expert parallelism (:class:`AllToAllCost`), NCCL
        collectives over the same PCIe link."""
        if nvlink or self.pcie_all_reduce_scale == 1.0:
            return cost
        scale = self.pcie_all_reduce_scale
        return replace(
            cost, per_iteration_s=cost.per_iteration_s * scale, per_token_s=cost.per_token_s * scale
        )

    def fitted_gpus(self) -> dict[str, int]:
        """The GPU presets the fit's runs were measured on, with their number of runs."""
        counts: dict[str, int] = {}
        for preset in (self.fit.get("gpus") or {}).values():
            counts[str(preset)] = counts.get(str(preset), 0) + 1
        return counts

    def evidence(self, gpu: GpuSpec) -> str:
        """How much of ``gpu`` was measured: ``measured`` (runs on it are in the fit), ``transferred``
        (no runs, but its kernels or its memory bandwidth were measured: the fit is carried over by
        physics) or ``datasheet-only`` (nothing but its datasheet and its memory technology)."""
        if gpu.preset is not None and gpu.preset in self.fitted_gpus():
            return "measured"
        return "transferred" if gpu.has_own_measurements else "datasheet-only"

    def _held_out(self, gpu: GpuSpec | None) -> tuple[str, dict[str, Any]]:
        """The folds whose errors ``gpu`` should expect: leave-one-run-out for a measured GPU (or
        none named), leave-one-GPU-out for any other (when the fit has them)."""
        by_gpu = self.fit.get("leave_one_gpu_out") or {}
        by_run = self.fit.get("leave_one_out") or {}
        if by_gpu.get("runs") and (
            (gpu is not None and self.evidence(gpu) != "measured") or not by_run.get("runs")
        ):
            return "gpu", by_gpu  # (a fit without run folds: the wider GPU folds for every GPU)
        return "run", by_run

    def error_band(self, gpu: GpuSpec | None = None) -> str:
        """What the fit says a new run on ``gpu`` should expect (its held-out errors), or ""."""
        fold, held_out = self._held_out(gpu)
        summary = held_out.get("summary") or {}
        try:
            ttft, tpot, e2e = (summary[f"{name}_mean_abs"] for name in ("ttft_mean", "tpot", "e2e_mean"))
        except KeyError:
            return ""
        runs = len(held_out.get("runs") or {})
        if fold == "gpu":
            groups = len(held_out.get("groups") or {})
            how = f"leave-one-GPU-out over {groups} GPUs ({runs} measured vLLM runs)"
        else:
            how = f"leave-one-run-out over {runs} measured vLLM runs"
        text = f"end to end, {how}: mean |error| TTFT {ttft:.0%}, TPOT {tpot:.0%}, E2E {e2e:.0%}"
        if gpu is None:
            return text
        evidence = self.evidence(gpu)
        if evidence != "measured":
            text += _assumed_ceilings_text(gpu)
        return f"{gpu.name} is {evidence}: {text}"

    def time_scale_band(self, gpu: GpuSpec | None = None) -> tuple[float, float] | None:
        """The GPU-time scales (``cost_model: {time_scale: ...}``) that would have made kvsim's TPOT
        match the measured runs it was not fitted to, fastest and slowest: with a held-out TPOT
        error ``e`` (simulated / measured - 1), the measured server's step took ``1 / (1 + e)``
        times kvsim's. The folds are those of :meth:`error_band`; a GPU without runs in the fit
        widens by the range of each ceiling not measured on it (:func:`assumed_ceilings_scales`).
        None without held-out errors."""
        _, held_out = self._held_out(gpu)
        runs = held_out.get("runs") or {}
        errors = [float(run["tpot"]) for run in runs.values() if "tpot" in run]
        if not errors:
            return None
        fast, slow = 1.0 / (1.0 + max(errors)), 1.0 / (1.0 + min(errors))
        if gpu is not None and self.evidence(gpu) != "measured":
            widen_fast, widen_slow = assumed_ceilings_scales(gpu)
            fast, slow = fast * widen_fast, slow * widen_slow
        return fast, slow

    def describe(self) -> str:
        """A short phrase for cost-model labels."""
        if self.is_neutral:
            return "no serving calibration"
        return f"serving terms fitted to {self.source}"


def assumed_ceilings_scales(gpu: GpuSpec) -> tuple[float, float]:
    """How much faster and slower ``gpu``'s steps could run than kvsim prices them, from the ceilings
    that were assumed for it rather than measured on it: a step read at the memory default ``share``
    could read at any share in its technology's ``low..high`` (times ``share / high .. share /
    low``); a matrix product capped at an architecture default could be capped anywhere in its
    range (its GEMM share ``min(gemm, share)`` over ``min(gemm, high)`` .. ``min(gemm, low)``).
    Each bounds a step bound by that resource; the wider of the two is taken."""
    fast = slow = 1.0
    memory = gpu.memory_ceiling
    if not memory.measured:
        low, high = memory.band
        fast, slow = memory.share / high, memory.share / low
    compute = gpu.compute_ceiling
    if not compute.measured:
        gemm = gpu.efficiency.gemm_flops
        low, high = compute.band
        priced = min(gemm, compute.share)
        fast, slow = min(fast, priced / min(gemm, high)), max(slow, priced / min(gemm, low))
    return fast, slow


def _assumed_ceilings_text(gpu: GpuSpec) -> str:
    """What was assumed rather than measured for ``gpu``, for its error band's text."""
    assumed = []
    memory, compute = gpu.memory_ceiling, gpu.compute_ceiling
    if not memory.measured:
        low, high = memory.band
        assumed.append(
            f"achievable bandwidth {memory.share:.0%} of the datasheet assumed ({low:.0%}..{high:.0%} "
            "measured on parts of its memory type)"
        )
    if not compute.measured:
        low, high = compute.band
        assumed.append(
            f"achievable matrix-product rate {compute.share:.0%} of the datasheet assumed "
            f"({low:.0%}..{high:.0%} measured on parts of its architecture)"
        )
    if not assumed:
        return ""
    own = "has no measurements of its own" if not gpu.has_own_measurements else "is partly measured"
    return f"; {gpu.name} {own}: {' and '.join(assumed)}, which widens its band"


PARAMETERS = (
    "iteration_overhead_s",
    "request_overhead_s",
    "decode_attention_per_seq_scale",
    "kv_bandwidth_scale",
    "weight_bandwidth_scale",
    "all_reduce_latency_s",
    "pcie_all_reduce_scale",
)
RETIRED_PARAMETERS = {
    "transferred_bandwidth_scale": (
        "kvsim 0.2 no longer uses it: a GPU whose kernel factors were measured on another GPU now reads "
        "at its own achievable bandwidth (sim/hardware/gpus.py, AchievableBandwidth), and "
        "weight_bandwidth_scale is fitted for every GPU; refit with `kvsim calibrate --from-runs`"
    )
}
"""Parameters earlier calibration files carry that are read with a warning and ignored."""


class CalibrationWarning(UserWarning):
    """A calibration file loads, but something in it is no longer used."""


NEUTRAL = ServingCalibration()


class CalibrationError(ValueError):
    """A calibration file cannot be used; the message names the file and the key."""


def load_calibration(path: str | Path) -> ServingCalibration:
    """Read a calibration written by ``kvsim calibrate --from-runs`` (or by hand)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise CalibrationError(f"{path}: cannot read: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise CalibrationError(f"{path}: malformed YAML: {error}") from None
    if not isinstance(data, dict) or data.get("kind") != CALIBRATION_KIND:
        raise CalibrationError(f"{path}: not a kvsim serving calibration (needs `kind: {CALIBRATION_KIND}`)")
    parameters = data.get("parameters")
    if not isinstance(parameters, dict):
        raise CalibrationError(f"{path}: `parameters` must be a mapping of {', '.join(PARAMETERS)}")
    for name in sorted(set(parameters) & set(RETIRED_PARAMETERS)):
        warnings.warn(
            f"{path}: parameters.{name} is ignored: {RETIRED_PARAMETERS[name]}",
            CalibrationWarning,
            stacklevel=2,
        )
        parameters = {key: value for key, value in parameters.items() if key != name}
    unknown = sorted(set(parameters) - set(PARAMETERS))
    if unknown:
        raise CalibrationError(
            f"{path}: unknown parameter(s) {', '.join(unknown)}; known: {', '.join(PARAMETERS)}"
        )
    try:
        return ServingCalibration(
            **parameters, source=str(data.get("source", path.name)), fit=dict(data.get("fit") or {})
        )
    except (TypeError, ValueError) as error:
        raise CalibrationError(f"{path}: {error}") from None


def calibration_document(calibration: ServingCalibration) -> dict[str, Any]:
    """The YAML data of a calibration file."""
    return {
        "kind": CALIBRATION_KIND,
        "source": calibration.source,
        "parameters": calibration.parameters(),
        "fit": calibration.fit,
    }


def write_calibration(calibration: ServingCalibration, path: Path) -> None:
    """Write the file whole or not at all (a fit rewrites it as it goes, and may be stopped)."""
    staging = path.with_name(f".{path.name}.partial")
    staging.write_text(yaml.safe_dump(calibration_document(calibration), sort_keys=False))
    staging.replace(path)


_DEFAULT: ServingCalibration | None = None


def default_calibration() -> ServingCalibration:
    """The shipped calibration (read once), or the neutral one when it is absent."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = (
            load_calibration(DEFAULT_CALIBRATION_PATH) if DEFAULT_CALIBRATION_PATH.is_file() else NEUTRAL
        )
    return _DEFAULT
