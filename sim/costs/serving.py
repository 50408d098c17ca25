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
  factors; bandwidths stay at most the datasheet's);
* ``all_reduce_latency_s``: one tensor-parallel all-reduce's fixed time at TP 2 over NVLink (x log2(tp)
  beyond), which vLLM's custom all-reduce makes smaller than NCCL's; ``pcie_all_reduce_scale``: how
  much slower NCCL's all-reduce runs over PCIe than its ring model says.

A calibration is a YAML file (:func:`load_calibration`) written by ``kvsim calibrate --from-runs``,
which also records the runs it was fitted to and its leave-one-run-out errors; the derated model
uses :data:`DEFAULT_CALIBRATION_PATH` unless told otherwise (``cost_model: {calibration: ...}``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

if TYPE_CHECKING:
    from sim.costs.terms import AllReduceCost, AllToAllCost
    from sim.hardware.gpus import Efficiency

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
    transferred_bandwidth_scale: float = 1.0
    """GPUs whose factors were measured on another GPU (``Efficiency.transferred``): a scale of their
    weight and KV bandwidth shares, fitted to the runs on such GPUs."""
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

    def derate(self, efficiency: Efficiency) -> Efficiency:
        """``efficiency`` with this calibration's scales applied (bandwidth shares capped at 1)."""
        if self.is_neutral:
            return efficiency
        transferred = self.transferred_bandwidth_scale if efficiency.transferred else 1.0
        return replace(
            efficiency,
            kv_bandwidth=min(1.0, efficiency.kv_bandwidth * self.kv_bandwidth_scale * transferred),
            weight_bandwidth=min(
                1.0, efficiency.weight_bandwidth * self.weight_bandwidth_scale * transferred
            ),
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

    def error_band(self) -> str:
        """What the fit says a new run should expect (its leave-one-run-out errors), or ""."""
        summary = (self.fit.get("leave_one_out") or {}).get("summary") or {}
        try:
            ttft, tpot, e2e = (summary[f"{name}_mean_abs"] for name in ("ttft_mean", "tpot", "e2e_mean"))
        except KeyError:
            return ""
        runs = len((self.fit.get("leave_one_out") or {}).get("runs") or {})
        return (
            f"end to end, leave-one-run-out over {runs} measured vLLM runs: mean |error| TTFT {ttft:.0%}, "
            f"TPOT {tpot:.0%}, E2E {e2e:.0%}"
        )

    def time_scale_band(self) -> tuple[float, float] | None:
        """The GPU-time scales (``cost_model: {time_scale: ...}``) that would have made kvsim's TPOT
        match the measured runs it was not fitted to, fastest and slowest: with a leave-one-run-out
        TPOT error ``e`` (simulated / measured - 1), the measured server's step took ``1 / (1 + e)``
        times kvsim's. None without leave-one-out errors."""
        runs = (self.fit.get("leave_one_out") or {}).get("runs") or {}
        errors = [float(run["tpot"]) for run in runs.values() if "tpot" in run]
        if not errors:
            return None
        return 1.0 / (1.0 + max(errors)), 1.0 / (1.0 + min(errors))

    def describe(self) -> str:
        """A short phrase for cost-model labels."""
        if self.is_neutral:
            return "no serving calibration"
        return f"serving terms fitted to {self.source}"


PARAMETERS = (
    "iteration_overhead_s",
    "request_overhead_s",
    "decode_attention_per_seq_scale",
    "kv_bandwidth_scale",
    "weight_bandwidth_scale",
    "all_reduce_latency_s",
    "pcie_all_reduce_scale",
    "transferred_bandwidth_scale",
)
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
    path.write_text(yaml.safe_dump(calibration_document(calibration), sort_keys=False))


_DEFAULT: ServingCalibration | None = None


def default_calibration() -> ServingCalibration:
    """The shipped calibration (read once), or the neutral one when it is absent."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = (
            load_calibration(DEFAULT_CALIBRATION_PATH) if DEFAULT_CALIBRATION_PATH.is_file() else NEUTRAL
        )
    return _DEFAULT
