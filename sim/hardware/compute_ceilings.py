"""What a GPU's tensor cores really deliver: the share of the datasheet's dense FP16/BF16 rate that a
large matrix product reaches, measured per GPU, with its source.

The derated cost model's compute factors (``gemm_flops``, ``prefill_attention_flops``) were fitted to
kernels timed on one GPU (Vidur's A100-80GB and H100). On another GPU the same kernels do not reach the
same share of *its* datasheet: clocks under load, power limits and the tensor-core generation differ
(an L4 at 72 W sustains 59 % of its 121 TFLOPS, an H100 PCIe at 350 W 66 % of its 756, where the
A100-80GB reaches 85 % of its 312). So a compute factor measured on one GPU keeps its fraction of
what that GPU's tensor cores delivered, as the bandwidth shares keep theirs of what memory delivers
(:func:`sim.hardware.gpus.effective_efficiency`).

Measured: one method throughout, ``torch.matmul`` on square FP16 and BF16 matrices of 1,024 to 10,240,
the best size's TFLOP/s ([ZZ] zzc0721/torch-performance-test-data @ 9d82827, ``database.md``:
community submissions, each row naming its machine and PyTorch), the better of the two dtypes per
submission and the median over a GPU's submissions, over the dense FP16 figure the preset uses. The
MI300X is not in that table: [MAMF] Stas Bekman's "Maximum Achievable Matmul FLOPS" table
(stas00/ml-engineering @ 744d01e, ``compute/accelerator/README.md``, BF16, shapes found by search,
``PYTORCH_TUNABLEOP_ENABLED=1``), whose A100 SXM (0.869) and H100 SXM (0.803) rows bracket [ZZ]'s
(0.848, 0.799) within 2.5 points. Only the figures are used; nothing of either repository's code.

A GPU without a measurement of its own takes the median of the measured parts of its architecture,
with those parts' range (at least +-5 points) as its band; a custom GPU of unknown architecture, the
median of every measured part and their whole range.
"""

from __future__ import annotations

from sim.hardware.ceilings import MeasuredShare, median_of_measured

ARCHITECTURES = ("Turing", "Ampere", "Ada", "Hopper", "Blackwell", "CDNA3")

MAX_COMPUTE_SHARE = 1.2
"""A GeForce card's boost clock under load runs above the one its datasheet rate is quoted at (an RTX
4090 measures 1.02 of 165.2 TFLOPS): a share may pass 1, never this."""


class AchievableCompute(MeasuredShare):
    """The share of a GPU's datasheet dense FP16/BF16 FLOP/s that a large GEMM reaches: the ceiling
    of every FLOP share the derated model charges there. ``measured``: on this GPU (``source`` cites
    it); else its architecture's default, and ``low`` .. ``high`` the range of that architecture's
    measured parts, which the GPU's cost band widens by."""

    WHAT = "achievable compute"
    MAX_SHARE = MAX_COMPUTE_SHARE


def _measured(tflops: tuple[float, ...], datasheet_tflops: float, how: str) -> AchievableCompute:
    """The median of a GPU's submissions (TFLOP/s, the better dtype of each) over its datasheet rate."""
    ordered = sorted(tflops)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    runs = ", ".join(f"{value:g}" for value in tflops)
    return AchievableCompute(
        round(median / datasheet_tflops, 3),
        f"{how}: {runs} TFLOP/s measured, median {median:g} of {datasheet_tflops:g} dense",
    )


_ZZ = "torch.matmul, square FP16/BF16, best size [ZZ database.md]"

MEASURED_ACHIEVABLE_COMPUTE: dict[str, AchievableCompute] = {
    "T4-16GB": _measured((41.91, 42.71, 41.93), 65, _ZZ),
    "L4-24GB": _measured((70.89,), 121, _ZZ),
    # GeForce RTX 4090 24GB submissions (the 48 GB boards and the 4090D are other parts)
    "RTX-4090-24GB": _measured((170.06, 173.31, 162.39, 167.80), 165.2, _ZZ),
    "A100-40GB": _measured((247.63,), 312, _ZZ),
    "A100-80GB": _measured((264.53,), 312, f"{_ZZ}; MAMF's A100 SXM 271.2 (0.869)"),
    "H100-80GB": _measured((797.51, 783.66), 989.4, f"{_ZZ}; MAMF's H100 SXM 794.5 (0.803)"),
    "H200-141GB": _measured((790.29,), 989.4, _ZZ),
    "H100-PCIe-80GB": _measured((495.93,), 756, _ZZ),
    "B200-180GB": _measured((1696.03,), 2250, f"{_ZZ}; MAMF's B200 SXM 1745.0 (0.776)"),
    "L40S-48GB": _measured((269.15,), 362.05, _ZZ),
    # the Workstation (417.98) and the Server Edition (409.42) share the GB202 chip and its rate
    "RTX-PRO-6000-96GB": _measured((417.98, 409.42), 503.8, _ZZ),
    "MI300X-192GB": _measured(
        (668.4,),
        1307.4,
        "BF16 GEMM, shapes found by search, TunableOp on [MAMF compute/accelerator/README.md]",
    ),
}
"""The GPUs whose matrix products were measured, by preset name (sources in the module docstring)."""

PRESET_ARCHITECTURES = {
    "T4-16GB": "Turing",
    "A10G-24GB": "Ampere",
    "L4-24GB": "Ada",
    "RTX-4090-24GB": "Ada",
    "A100-40GB": "Ampere",
    "A100-80GB": "Ampere",
    "H100-80GB": "Hopper",
    "H200-141GB": "Hopper",
    "H100-PCIe-80GB": "Hopper",
    "H100-NVL-94GB": "Hopper",
    "B200-180GB": "Blackwell",
    "L40S-48GB": "Ada",
    "RTX-PRO-6000-96GB": "Blackwell",
    "MI300X-192GB": "CDNA3",
}


def _architecture_defaults() -> dict[str, AchievableCompute]:
    by_architecture: dict[str, dict[str, float]] = {}
    for name, measured in MEASURED_ACHIEVABLE_COMPUTE.items():
        by_architecture.setdefault(PRESET_ARCHITECTURES[name], {})[name] = measured.share
    return {
        architecture: median_of_measured(AchievableCompute, by_architecture[architecture], architecture)
        for architecture in ARCHITECTURES
        if architecture in by_architecture
    }


ACHIEVABLE_COMPUTE_DEFAULTS: dict[str, AchievableCompute] = _architecture_defaults()
"""By architecture: the median share of its measured parts, with their range (at least +-5 points)."""

UNKNOWN_ARCHITECTURE_ACHIEVABLE_COMPUTE = median_of_measured(
    AchievableCompute, {name: measured.share for name, measured in MEASURED_ACHIEVABLE_COMPUTE.items()}, "GPU"
)
"""A GPU of unknown architecture: the median of every measured GPU, their whole range as its band."""
