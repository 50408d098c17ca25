"""GPU presets: memory capacity, memory bandwidth and dense fp16/bf16 tensor throughput.

Units
-----
``memory_bytes`` is the capacity on the datasheet, in bytes. NVIDIA's "GB" for memory *capacity*
is binary (GiB): nvidia-smi shows an A100-80GB as 81920 MiB = 80 x 2**30 bytes, and the H200's
"141 GB" must be GiB, since its visible 143,771 MiB would not fit in 141 x 10**9 bytes. So
``A100-80GB`` is 80 x 2**30 = 85,899,345,920 bytes and ``H200-141GB`` 141 x 2**30 bytes.

Bandwidth and FLOP/s are decimal, as on the datasheets (1 TB/s = 10**12 bytes/s).

Links
-----
``nvlink_bandwidth_bytes_per_s`` and ``pcie_bandwidth_bytes_per_s`` are the datasheet figures, which
NVIDIA quotes for both directions together (A100 SXM "NVLink: 600 GB/s" = 12 links x 25 GB/s each
way x 2; "PCIe Gen4: 64 GB/s" = 32 GB/s each way x 2). A transfer moves data one way, so kvsim
uses half of each: :attr:`GpuSpec.tensor_parallel_link_bytes_per_s` (NVLink, or PCIe on cards
without it) for tensor-parallel all-reduces and :attr:`GpuSpec.host_link_bytes_per_s` (PCIe) for
swaps and host-memory transfers. Cards without NVLink (T4, A10G, L4, L40S, RTX 4090, RTX PRO 6000)
have ``nvlink_bandwidth_bytes_per_s = None``; the H100 PCIe and NVL cards have their two-card
bridge's 600 GB/s. The MI300X's Infinity Fabric stands in the NVLink field
(:attr:`GpuSpec.peer_link_name` names it).
``fp16_flops`` is the *dense* FP16/BF16 tensor-core rate with FP32 accumulation, the rate that
PyTorch/vLLM GEMMs see; NVIDIA's headline numbers "with sparsity" are twice this.

What software sees
------------------
Less than the datasheet. vLLM multiplies ``torch.cuda.mem_get_info()[1]`` (the CUDA total) by
``gpu_memory_utilization``, and that total is below the datasheet capacity:

============  ==========  =====================  ==========================================
preset        datasheet   nvidia-smi "Total"     CUDA total (torch ``total_memory``) seen
============  ==========  =====================  ==========================================
T4-16GB       16 GiB      15,360 MiB (ECC on)    14,930-15,109 MiB (varies with driver)
A10G-24GB     24 GiB      23,028 MiB (ECC on)    22,587 MiB
L4-24GB       24 GiB      23,034 MiB (ECC on)    (not found)
RTX-4090-24GB 24 GiB      24,564 MiB             24,563 MiB; vLLM logs 23.55-23.58 GiB
A100-40GB     40 GiB      40,960 MiB             40,536 MiB
A100-80GB     80 GiB      81,920 MiB             vLLM logs show 79.15 GiB on 80 GB parts
H100-80GB     80 GiB      81,559 MiB             81,082-81,090 MiB; vLLM logs 79.22 GiB
H200-141GB    141 GiB     143,771 MiB            143,156 MiB; vLLM logs 139.81 GiB
L40S-48GB     48 GiB      46,068 MiB (ECC on)    45,589 MiB (47,803,596,800 B)
H100-PCIe     80 GiB      81,559 MiB             (not found)
H100-NVL      94 GiB      95,830 MiB             (not found)
B200-180GB    180 GiB     183,359 MiB            182,631-182,642 MiB
RTX-PRO-6000  96 GiB      97,887 MiB             97,252 MiB (101,976,440,832 B)
MI300X-192GB  192 GiB     196,288 MiB (rocm-smi) 196,288 MiB (205,822,885,888 B)
============  ==========  =====================  ==========================================

The GDDR6 data-centre parts (T4, A10G, L4) lose 1/16 of their memory to ECC, which is on by
default; HBM parts keep ECC out of band. The presets keep the datasheet number so that names and
bytes agree; to reproduce one machine's vLLM log exactly, override the memory with the CUDA total,
e.g. ``resolve_gpu({"base": "H100-80GB", "memory_gib": 79.19})``.
(torch prints ``total_memory`` in MiB although it labels it "MB".)
Sources for the table: torch ``_CudaDeviceProperties`` printouts and vLLM start-up logs in public
repositories and vLLM issues (#7553: RTX 4090 24564 MiB; #55169: H100 81559 MiB; PR #10511); the
nvidia-smi totals of T4, A10G, L4, A100 and H200 are the values those cards commonly print, not
re-checked against a stored log. L40S: nvidia-smi listings and a deviceQuery printout; H100 PCIe
and NVL, B200: nvidia-smi listings in public repositories, torch ``total_memory`` printouts for the
B200; RTX PRO 6000 Blackwell (Workstation and Server Edition alike): nvidia-smi listings and the
``device_total_memory_bytes`` of casys-kaist/LLMServingSim's vLLM runs on the Server Edition;
MI300X: ``rocm-smi`` "VRAM Total Memory (B)", which ``torch.cuda.mem_get_info`` reports too. Each of
these is below its binary capacity and above its decimal one, so "GB" is GiB for them as well.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from sim.hardware.ceilings import MeasuredShare, median_of_measured
from sim.hardware.compute_ceilings import (
    ACHIEVABLE_COMPUTE_DEFAULTS,
    MEASURED_ACHIEVABLE_COMPUTE,
    PRESET_ARCHITECTURES,
    UNKNOWN_ARCHITECTURE_ACHIEVABLE_COMPUTE,
    AchievableCompute,
)

__all__ = [
    "ACHIEVABLE_BANDWIDTH_DEFAULTS",
    "ACHIEVABLE_COMPUTE_DEFAULTS",
    "AchievableCompute",
    "DEFAULT_PCIE_BANDWIDTH_BYTES_PER_S",
    "AchievableBandwidth",
    "EFFICIENCY_PRESETS",
    "GENERIC_EFFICIENCY",
    "GPU_PRESETS",
    "Efficiency",
    "GpuSpec",
    "effective_efficiency",
    "resolve_gpu",
]

GiB = 2**30
MiB = 2**20
GB = 10**9
TB = 10**12
TFLOPS = 10**12

DEFAULT_PCIE_BANDWIDTH_BYTES_PER_S = 64 * GB
"""PCIe Gen4 x16, both directions together (32 GB/s each way): the link of a custom GPU that names none."""
_PCIE_GEN3 = 32 * GB  # PCIe Gen3 x16, both directions (16 GB/s each way)
_PCIE_GEN4 = 64 * GB
_PCIE_GEN5 = 128 * GB


@dataclass(frozen=True)
class Efficiency:
    """How far real kernels fall short of the datasheet, for the derated cost model
    (:class:`sim.costs.derated.DeratedCostModel`).

    Fractions are of the GPU's datasheet HBM bandwidth or dense FP16 FLOP/s; ``*_s`` fields are
    fixed times per decoder layer (seconds). ``source`` says where the numbers come from and
    ``error_band`` how far the derated model landed from measured iteration times that were not used
    to fit them; both are printed with every run. The fitted presets are written by
    ``python -m calibrate.vidur --efficiency`` from Vidur's measured operations
    (``calibrate/vidur_data``); ``tests/test_vidur.py`` refits them and checks these constants.
    """

    weight_bandwidth: float
    """Weight reads of the matrix products (GEMM time at 1-8 tokens = weight bytes / this share of BW)."""
    gemm_flops: float
    """Large matrix products (GEMM time at >= 2048 tokens = FLOPs / this share of FLOP/s)."""
    elementwise_bandwidth: float
    """Norms, rotary embedding, activation and residual add: their bytes per token / this share of BW."""
    layer_fixed_s: float
    """The same elementwise kernels' floor per layer (launch and tail at a handful of tokens)."""
    kv_bandwidth: float
    """Reading cached K/V in decode attention (and a cached prefix during prefill)."""
    decode_attention_fixed_s: float
    """Decode attention's floor per layer (about 9 us on A100 with FlashAttention)."""
    decode_attention_per_seq_s: float
    """Decode attention's cost per sequence in the batch, per layer, beyond its K/V read."""
    prefill_attention_flops: float
    """Causal attention of a prefill chunk: ``4 x heads x head_dim`` FLOPs per (query, key) pair."""
    prefill_attention_fixed_s: float
    """Prefill attention's floor per chunk and layer."""
    routed_expert_bandwidth: float | None = None
    """A mixture of experts' routed experts, read by vLLM's fused MoE kernels (a GEMM per expert over
    its few tokens): the share of peak they read their weights at; None (no measurement): as
    ``weight_bandwidth``. Measured on the GPU itself where set, so the serving calibration's scales
    of the transferred bandwidths leave it alone."""
    source: str = ""
    error_band: str = "not validated"
    transferred: bool = False
    """True when the factors were measured on another GPU and applied to this one: its bandwidth
    shares then follow this GPU's achievable bandwidth (:func:`effective_efficiency`)."""
    measured_achievable_bandwidth: float | None = None
    """The achievable-bandwidth share (:class:`AchievableBandwidth`) of the GPU the bandwidth shares
    were measured on: a kernel that reached ``weight_bandwidth`` there is taken to reach the same
    fraction of what another GPU's memory can deliver. None: used as they are."""

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name == "transferred":
                continue
            if value is None and item.name in ("routed_expert_bandwidth", "measured_achievable_bandwidth"):
                continue
            if item.name in ("source", "error_band"):
                if not isinstance(value, str):
                    raise ValueError(f"efficiency {item.name} must be a string, got {value!r}")
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
                raise ValueError(f"efficiency {item.name} must be a finite number >= 0, got {value!r}")
            if not item.name.endswith("_s") and not 0 < value <= 1.5:
                raise ValueError(
                    f"efficiency {item.name} is a share of the datasheet peak, in (0, 1.5]; got {value!r}"
                )


class AchievableBandwidth(MeasuredShare):
    """The share of a GPU's datasheet memory bandwidth that a streaming kernel really reaches (a
    STREAM / BabelStream copy or triad, a device-to-device copy): the ceiling of every read the
    derated model charges on that GPU. No GPU reaches its datasheet figure (DRAM refresh, bank and
    read/write turnaround, the controllers' queues), and how far short it falls is a property of
    the memory technology and the part, not of the kernel: HBM parts measure 80-92 %, GDDR parts
    70-94 % in the sources below.

    ``measured``: the share was measured on this GPU (``source`` cites where); else it is the
    default of the GPU's memory technology (:data:`ACHIEVABLE_BANDWIDTH_DEFAULTS`) and ``low`` ..
    ``high`` the range of that technology's measured parts, which the GPU's cost band widens by."""

    WHAT = "achievable bandwidth"


def _default_for(
    technology: str, shares: dict[str, float], used_for: str | None = None
) -> AchievableBandwidth:
    """A memory technology's default: the median of its measured parts' shares, their range as the
    band (``used_for``: the technology borrowing them, when another)."""
    borrowed = f" (no {used_for} part measured)" if used_for and used_for != technology else ""
    return median_of_measured(AchievableBandwidth, shares, technology, borrowed)


_MEMORY_TYPES = {
    "T4-16GB": "GDDR6",
    "A10G-24GB": "GDDR6",
    "L4-24GB": "GDDR6",
    "RTX-4090-24GB": "GDDR6X",
    "A100-40GB": "HBM2",
    "A100-80GB": "HBM2e",
    "H100-80GB": "HBM3",
    "H200-141GB": "HBM3e",
    "H100-PCIe-80GB": "HBM2e",
    "H100-NVL-94GB": "HBM3",
    "B200-180GB": "HBM3e",
    "L40S-48GB": "GDDR6",
    "RTX-PRO-6000-96GB": "GDDR7",
    "MI300X-192GB": "HBM3",
}

L2_CACHE_MIB: dict[str, int] = {
    "T4-16GB": 4,
    "A10G-24GB": 6,
    "L4-24GB": 48,
    "RTX-4090-24GB": 72,
    "A100-40GB": 40,
    "A100-80GB": 40,
    "H100-80GB": 50,
    "H200-141GB": 60,
    "H100-PCIe-80GB": 50,
    "H100-NVL-94GB": 60,
    "B200-180GB": 126,
    "L40S-48GB": 96,
    "RTX-PRO-6000-96GB": 128,
    "MI300X-192GB": 256,
}
"""The last-level cache each preset ships with, in MiB (the MI300X's: its 256 MB Infinity Cache,
in front of HBM like the NVIDIA parts' L2). Decode attention reads a K/V block that several running
sequences share from memory once and from this cache after (``sim/engine/shared_reads.py``).
Sources, the device's own printout unless said (CUDA deviceQuery "L2 Cache Size: N bytes", or torch's
``L2_cache_size`` in whole MiB): T4 sylvia-ymlin/cuda-kernels-from-scratch README (4,194,304 B);
A10G torch in TorchCodec's CUDA decoding tutorial ("L2_cache_size=6MB"); L4, RTX 4090 (72 of AD102's
96), A100-80GB SXM, H100 SXM (52,428,800 B), H100 NVL (62,914,560 B: all six HBM stacks, the whole
GH100 L2), L40S: thamada/nvidia-smi deviceQuery logs; A100-40GB caps-tum/mt4g sample results (the
PCIe card, same 40 MiB); H100 PCIe: Chips and Cheese, "Nvidia's H100: Funny L2, and Tons of
Bandwidth" (2023, "50 MB of L2 cache"); H200 (60) and B200 (126): torch printouts in
ai-bot-pro/achatbot (deploy/modal/src/llm/vllm/vlm/skywork_r1v.py); RTX PRO 6000 Blackwell Server
Edition (128) torch printout in Jessi11111/fine-tuning-InternVL-78B README; MI300X: ROCm's GPU
specifications table (rocm-docs, docs/reference/gpu-specs.rst: 4 MiB of L2 per XCD, 256 MiB of
Infinity Cache) and mt4g's MI300X report (268,435,456 B of L3)."""

# What DRAM-bound reads reach on each GPU, measured: the best read rate found, over the datasheet
# figure kvsim uses (weight and K/V reads are reads). Sources:
# [RRZE] RRZE-HPC/gpu-benches @ 1038c5d (NHR@FAU), gpu-stream/*.txt: the read stream's best rate over
#        all occupancies; gpu-roofline/h200.txt.
# [yencal] yencal/gpu-bandwidth-benchmark @ fc38883, figures/: a device copy (read and write bytes
#        counted) with 16-byte loads, at 1 GB arrays.
# [cuda-demo] router-gao/cuda-demo, cuda-samples/02-cuda-bandwidth.md: CUDA's bandwidthTest
#        (device to device, read and write counted, 32 MB quick mode).
# [Vidur] microsoft/vidur's A100-80GB profiles: decode attention reads K/V at 0.938 of 2,039 GB/s
#        (kvsim's fitted kv_bandwidth; calibrate/vidur_data), above that GPU's read stream (0.871).
# Where only a copy was measured, the read share is the copy's times READ_OVER_COPY: on every part
# RRZE measured both, reads run faster than a load-and-store stream (no read/write turnaround).
# Parts that are not presets but inform their memory type's default (ACHIEVABLE_BANDWIDTH_DEFAULTS):
# V100 (HBM2, 900 GB/s) read 867 GB/s = 0.963 and A40 (GDDR6, 696 GB/s) 680 GB/s = 0.977 [RRZE].
READ_OVER_COPY = 1.056
"""Read stream / scale stream (one load and one store stream), median over the seven parts RRZE
measured both on: A100-80GB 1.022, A40 1.032, MI300X 1.035, L40 1.056, V100 1.072, A100-40GB 1.085,
H100 PCIe 1.140 [RRZE gpu-stream/*.txt]."""


def _from_copy(copy_share: float, how: str) -> AchievableBandwidth:
    share = round(min(copy_share * READ_OVER_COPY, 1.0), 3)
    return AchievableBandwidth(
        share, f"{how}: a copy at {copy_share:.3f} of the datasheet, x {READ_OVER_COPY} (reads over copies)"
    )


MEASURED_ACHIEVABLE_BANDWIDTH: dict[str, AchievableBandwidth] = {
    "T4-16GB": _from_copy(0.749, "CUDA bandwidthTest device to device, 239.6 of 320 GB/s [cuda-demo]"),
    "A100-40GB": AchievableBandwidth(0.965, "read stream 1,500 of 1,555 GB/s [RRZE gpu-stream/a100_40.txt]"),
    "A100-80GB": AchievableBandwidth(
        0.938,
        "decode attention's K/V reads at 0.938 of 2,039 GB/s in Vidur's measured kernels [Vidur]; "
        "read stream 1,776 GB/s = 0.871 [RRZE gpu-stream/a100_80.txt]",
    ),
    "H100-80GB": _from_copy(0.910, "device copy 3,050 of 3,350 GB/s [yencal figures/..._h100.png]"),
    "H200-141GB": _from_copy(
        0.856,
        "device copy 4,110 of 4,800 GB/s [yencal figures/..._h200.png]; a streaming roofline kernel "
        "reached 3,780 GB/s = 0.788 [RRZE gpu-roofline/h200.txt]",
    ),
    "H100-PCIe-80GB": AchievableBandwidth(
        0.971, "read stream 1,942 of 2,000 GB/s [RRZE gpu-stream/h100_pcie.txt]"
    ),
    "L40S-48GB": AchievableBandwidth(
        0.978,
        "read stream 845 of 864 GB/s on the L40, whose memory (48 GB GDDR6, 384-bit, 864 GB/s) the L40S "
        "shares [RRZE gpu-stream/l40.txt]",
    ),
    "MI300X-192GB": AchievableBandwidth(
        0.792, "read stream 4,199 of 5,300 GB/s [RRZE gpu-stream/mi300x.txt]"
    ),
}
"""The GPUs whose achievable bandwidth was measured, by preset name (sources above)."""

_OTHER_MEASURED_PARTS: dict[str, tuple[str, float]] = {"V100": ("HBM2", 0.963), "A40": ("GDDR6", 0.977)}
"""Measured parts that are not presets, by name: (memory type, share) (sources above)."""


def _technology_defaults() -> dict[str, AchievableBandwidth]:
    by_type: dict[str, dict[str, float]] = {}
    for name, measured in MEASURED_ACHIEVABLE_BANDWIDTH.items():
        by_type.setdefault(_MEMORY_TYPES[name], {})[name] = measured.share
    for name, (technology, share) in _OTHER_MEASURED_PARTS.items():
        by_type.setdefault(technology, {})[name] = share
    # a technology without a measured part of its own takes its nearest measured predecessor's
    predecessor = {"HBM2e": "HBM2", "HBM3": "HBM2e", "HBM3e": "HBM3", "GDDR6X": "GDDR6", "GDDR7": "GDDR6X"}
    defaults = {}
    for technology in ("HBM2", "HBM2e", "HBM3", "HBM3e", "GDDR6", "GDDR6X", "GDDR7"):
        measured_as = technology
        while measured_as not in by_type and measured_as in predecessor:
            measured_as = predecessor[measured_as]
        if measured_as in by_type:
            defaults[technology] = _default_for(measured_as, by_type[measured_as], technology)
    return defaults


ACHIEVABLE_BANDWIDTH_DEFAULTS: dict[str, AchievableBandwidth] = _technology_defaults()
"""By memory type: the median share of its measured parts, with their range (at least +-5 points)."""

UNKNOWN_MEMORY_ACHIEVABLE_BANDWIDTH = _default_for(
    "GPU",
    {name: measured.share for name, measured in MEASURED_ACHIEVABLE_BANDWIDTH.items()}
    | {name: share for name, (_, share) in _OTHER_MEASURED_PARTS.items()},
)
"""A GPU of unknown memory type: the median of every measured GPU, their whole range as its band."""


# Fitted by `python -m calibrate.vidur --efficiency` (calibrate/vidur.py) from Vidur's per-operation
# timings (microsoft/vidur, MIT; calibrate/vidur_data/README.md has the files and commits). The error
# bands compare the derated model with held-out iteration times (configs/profiles/README.md).
_A100 = Efficiency(
    weight_bandwidth=0.761,
    gemm_flops=0.694,
    elementwise_bandwidth=0.51,
    layer_fixed_s=15.6e-6,
    kv_bandwidth=0.938,
    decode_attention_fixed_s=9.28e-6,
    decode_attention_per_seq_s=1.04e-6,
    prefill_attention_flops=0.255,
    prefill_attention_fixed_s=18.1e-6,
    source="A100 factors fitted to Vidur's A100-80GB Llama-2-7B operations",
    measured_achievable_bandwidth=MEASURED_ACHIEVABLE_BANDWIDTH["A100-80GB"].share,
    error_band=(
        "decode -9..+12 %, prefill -9..+15 % vs held-out Vidur A100 Llama-2-7B iterations; Llama-3-8B "
        "(FlashInfer, not fitted): decode -10..+23 %, prefill -17..+42 %; LM head not measured"
    ),
)
_H100 = Efficiency(
    weight_bandwidth=0.791,
    gemm_flops=0.714,
    elementwise_bandwidth=0.582,
    layer_fixed_s=13.0e-6,
    # no H100 attention rows could be had: the attention factors are the A100's
    kv_bandwidth=_A100.kv_bandwidth,
    decode_attention_fixed_s=_A100.decode_attention_fixed_s,
    decode_attention_per_seq_s=_A100.decode_attention_per_seq_s,
    prefill_attention_flops=_A100.prefill_attention_flops,
    prefill_attention_fixed_s=_A100.prefill_attention_fixed_s,
    source="H100 factors fitted to Vidur's H100 Llama-2-7B operations; attention: A100 factors",
    measured_achievable_bandwidth=MEASURED_ACHIEVABLE_BANDWIDTH["H100-80GB"].share,
    error_band=(
        "decode -15..-1 %, prefill -16..+6 % vs held-out Vidur H100 Llama-2-7B iterations whose attention "
        "is itself modelled (no H100 attention data): only the matrix products and elementwise kernels "
        "are checked"
    ),
)


def _applied(factors: Efficiency, gpu: str, why: str, expected_error: str | None = None) -> Efficiency:
    """``factors`` applied to a GPU they were not measured on, saying so in the source and the band;
    ``expected_error`` states how far from measurements the times may land there (a judgment: the
    GPU differs from the measured one in more than its datasheet peaks)."""
    expected = f": expect {expected_error} (a judgment, not a measurement)" if expected_error else ""
    return replace(
        factors,
        source=f"{factors.source}, applied to {gpu} ({why})",
        error_band=(
            f"not validated on {gpu} (no measurements of it){expected}; on the measured GPU: "
            f"{factors.error_band}"
        ),
        transferred=True,
    )


def effective_efficiency(
    efficiency: Efficiency, achievable_share: float, achievable_compute: float | None = None
) -> Efficiency:
    """``efficiency`` on a GPU whose memory reaches ``achievable_share`` of its datasheet bandwidth
    and whose matrix products at best ``achievable_compute`` of its datasheet FLOP/s.

    Bandwidth shares measured on another GPU keep their fraction of what that GPU's memory delivered
    (a kernel that read at 0.761 of an A100 whose reads reach 0.938 reads at 0.761 / 0.938 of what
    any GPU's reads reach), and none exceeds ``achievable_share``. The routed experts' share was
    measured on the GPU that carries it: only capped.

    FLOP shares (``gemm_flops``, ``prefill_attention_flops``) are only capped: no matrix product runs
    faster than the best one measured on the GPU. Keeping their fraction of the measured GPU's best
    too (0.694 of an A100 whose best is 0.848 -> 0.480 on an L4 whose best is 0.586) made the L4's
    prompt-heavy steps 45 % slower, and its closed loop's TTFT at 64 users 37 % slow where the cap
    alone lands within 3 % (docs/gpu-transfer.md): a power-limited card's clocks bound its typical
    GEMMs and its best alike."""
    reference = efficiency.measured_achievable_bandwidth
    ratio = 1.0 if reference is None else achievable_share / reference

    def follow(share: float) -> float:
        return min(share * ratio, achievable_share)

    routed = efficiency.routed_expert_bandwidth
    flops_cap = float("inf") if achievable_compute is None else achievable_compute
    return replace(
        efficiency,
        weight_bandwidth=follow(efficiency.weight_bandwidth),
        kv_bandwidth=follow(efficiency.kv_bandwidth),
        elementwise_bandwidth=follow(efficiency.elementwise_bandwidth),
        routed_expert_bandwidth=None if routed is None else min(routed, achievable_share),
        gemm_flops=min(efficiency.gemm_flops, flops_cap),
        prefill_attention_flops=min(efficiency.prefill_attention_flops, flops_cap),
    )


RTX_PRO_6000_ROUTED_EXPERT_BANDWIDTH = 0.840
"""The share of peak at which vLLM's fused MoE kernels read Qwen3-30B-A3B's routed experts on the RTX
PRO 6000 (Server Edition, 1,597.6 GB/s): fitted by ``python -m calibrate.moe_layers`` to the MoE
layer times casys-kaist/LLMServingSim measured there with vLLM 0.19 (calibrate/llmservingsim_data),
at 1 and 2 expert-parallel GPUs, with its FLOPs at ``gemm_flops``: within -22..+18 % of the
24 layer shapes a serving batch has (mean |error| 7.7 %). Dense matrix products there read at 0.98
after the serving calibration: the per-expert GEMMs of a few tokens each run 1.17x slower."""

GENERIC_EFFICIENCY = _applied(_A100, "a GPU without measurements", "no data for it")
"""The factors a GPU gets when nothing better is known: the A100's, marked as not validated."""

EFFICIENCY_PRESETS: dict[str, Efficiency] = {"A100": _A100, "H100": _H100, "generic": GENERIC_EFFICIENCY}


@dataclass(frozen=True)
class GpuSpec:
    """One GPU. Memory in bytes; bandwidth in bytes/s; ``fp16_flops`` dense FP16/BF16 tensor FLOP/s;
    ``efficiency`` the derating factors of the derated cost model; ``nvlink_bandwidth_bytes_per_s``
    (``None`` without NVLink) and ``pcie_bandwidth_bytes_per_s`` the datasheet link rates, both
    directions together (see the module docstring). ``nvlink_bandwidth_bytes_per_s`` is the GPU to
    GPU link whatever the vendor calls it; ``peer_link_name`` says what (AMD's Infinity Fabric)."""

    name: str
    memory_bytes: int
    hbm_bandwidth_bytes_per_s: float
    fp16_flops: float
    efficiency: Efficiency = GENERIC_EFFICIENCY
    nvlink_bandwidth_bytes_per_s: float | None = None
    pcie_bandwidth_bytes_per_s: float = DEFAULT_PCIE_BANDWIDTH_BYTES_PER_S
    peer_link_name: str = "NVLink"
    memory_type: str = "unknown"
    """HBM2, HBM2e, HBM3, HBM3e, GDDR6, GDDR6X, GDDR7 (or unknown): picks the achievable-bandwidth
    default where the GPU itself was not measured."""
    achievable_bandwidth: AchievableBandwidth | None = None
    """The share of ``hbm_bandwidth_bytes_per_s`` real kernels can reach; None: its memory type's
    default (:data:`ACHIEVABLE_BANDWIDTH_DEFAULTS`)."""
    architecture: str = "unknown"
    """Turing, Ampere, Ada, Hopper, Blackwell, CDNA3 (or unknown): picks the achievable-compute
    default where the GPU's matrix products were not measured."""
    achievable_compute: AchievableCompute | None = None
    """The share of ``fp16_flops`` large matrix products reach; None: its architecture's default
    (:data:`sim.hardware.compute_ceilings.ACHIEVABLE_COMPUTE_DEFAULTS`)."""
    l2_cache_bytes: int = 0
    """The last-level cache (L2; the MI300X's Infinity Cache), in bytes: how much of a layer's
    shared K/V stays on chip between the sequences that read it. 0: not known (no credit for
    shared reads)."""
    preset: str | None = None
    """The preset this GPU is or was built from (``base:``); None for a custom GPU without one."""

    @property
    def memory_ceiling(self) -> AchievableBandwidth:
        """The achievable bandwidth in effect: the GPU's own, else its memory type's default."""
        if self.achievable_bandwidth is not None:
            return self.achievable_bandwidth
        return ACHIEVABLE_BANDWIDTH_DEFAULTS.get(self.memory_type, UNKNOWN_MEMORY_ACHIEVABLE_BANDWIDTH)

    @property
    def compute_ceiling(self) -> AchievableCompute:
        """The achievable compute in effect: the GPU's own, else its architecture's default."""
        if self.achievable_compute is not None:
            return self.achievable_compute
        return ACHIEVABLE_COMPUTE_DEFAULTS.get(self.architecture, UNKNOWN_ARCHITECTURE_ACHIEVABLE_COMPUTE)

    @property
    def has_own_measurements(self) -> bool:
        """Whether anything of this GPU itself was measured: its kernels, its memory bandwidth or
        its matrix products' rate."""
        return (
            not self.efficiency.transferred or self.memory_ceiling.measured or self.compute_ceiling.measured
        )

    @property
    def tensor_parallel_link_bytes_per_s(self) -> float:
        """One direction of the link tensor-parallel all-reduces use: NVLink where the card has it,
        else PCIe (peer to peer through the host's PCIe switch); half the datasheet figure."""
        link = self.nvlink_bandwidth_bytes_per_s or self.pcie_bandwidth_bytes_per_s
        return link / 2

    @property
    def tensor_parallel_link_name(self) -> str:
        return self.peer_link_name if self.nvlink_bandwidth_bytes_per_s else "PCIe"

    @property
    def host_link_bytes_per_s(self) -> float:
        """One direction of the PCIe link to host memory (swaps, offloading): half the datasheet figure."""
        return self.pcie_bandwidth_bytes_per_s / 2

    def __post_init__(self) -> None:
        if (
            isinstance(self.memory_bytes, bool)
            or not isinstance(self.memory_bytes, int)
            or self.memory_bytes <= 0
        ):
            raise ValueError(
                f"GPU {self.name!r}: memory_bytes must be a positive integer, got {self.memory_bytes!r}"
            )
        for field in ("hbm_bandwidth_bytes_per_s", "fp16_flops", "pcie_bandwidth_bytes_per_s"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ValueError(
                    f"GPU {self.name!r}: {field} must be a positive, finite number, got {value!r}"
                )
        nvlink = self.nvlink_bandwidth_bytes_per_s
        if nvlink is not None and (
            isinstance(nvlink, bool) or not isinstance(nvlink, int | float) or not 0 < nvlink < math.inf
        ):
            raise ValueError(
                f"GPU {self.name!r}: nvlink_bandwidth_bytes_per_s must be a positive number or None, got {nvlink!r}"
            )


GPU_PRESETS: dict[str, GpuSpec] = {
    # NVIDIA T4 datasheet: 16 GB GDDR6, 320+ GB/s, 65 TFLOPS mixed-precision (FP16/FP32) tensor;
    # "PCIe Gen3 x16" (32 GB/s both ways), no NVLink.
    "T4-16GB": GpuSpec(
        "T4-16GB",
        16 * GiB,
        320 * GB,
        65 * TFLOPS,
        _applied(_A100, "T4-16GB", "no T4 data in Vidur"),
        pcie_bandwidth_bytes_per_s=_PCIE_GEN3,
    ),
    # AWS G5 (A10G, an AWS-only GA102 part; NVIDIA publishes no A10G datasheet): 24 GB GDDR6 at
    # 600 GB/s; FP16 tensor 70 TFLOPS dense (vs the A10's 125) per Baseten's "A10 vs A10G" comparison.
    # PCIe Gen4 x16 (the A10 datasheet: "PCIe Gen4 64 GB/s"), no NVLink.
    "A10G-24GB": GpuSpec(
        "A10G-24GB",
        24 * GiB,
        600 * GB,
        70 * TFLOPS,
        _applied(_A100, "A10G-24GB", "no A10G data in Vidur"),
        pcie_bandwidth_bytes_per_s=_PCIE_GEN4,
    ),
    # NVIDIA L4 datasheet: 24 GB GDDR6, 300 GB/s, FP16 tensor 242 TFLOPS with sparsity = 121 dense;
    # "PCIe Gen4 x16 64GB/s", no NVLink.
    "L4-24GB": GpuSpec(
        "L4-24GB",
        24 * GiB,
        300 * GB,
        121 * TFLOPS,
        _applied(_A100, "L4-24GB", "no L4 data in Vidur"),
        pcie_bandwidth_bytes_per_s=_PCIE_GEN4,
    ),
    # NVIDIA Ada (AD102) whitepaper, GeForce RTX 4090: 24 GB GDDR6X, 1008 GB/s; FP16 tensor with FP32
    # accumulate 165.2 TFLOPS dense (330.3 with FP16 accumulate; GeForce halves the FP32-accumulate rate).
    # PCIe Gen4 x16; the 4090 has no NVLink connector.
    "RTX-4090-24GB": GpuSpec(
        "RTX-4090-24GB",
        24 * GiB,
        1008 * GB,
        165.2 * TFLOPS,
        _applied(_A100, "RTX-4090-24GB", "no RTX 4090 data in Vidur"),
        pcie_bandwidth_bytes_per_s=_PCIE_GEN4,
    ),
    # NVIDIA A100 datasheet, SXM4 40GB: HBM2 1,555 GB/s; BF16/FP16 tensor 312 TFLOPS dense (624 sparse);
    # interconnect "NVLink: 600GB/s, PCIe Gen4: 64GB/s".
    "A100-40GB": GpuSpec(
        "A100-40GB",
        40 * GiB,
        1555 * GB,
        312 * TFLOPS,
        _applied(_A100, "A100-40GB", "same chip as the measured A100-80GB, HBM2 at 1,555 GB/s"),
        nvlink_bandwidth_bytes_per_s=600 * GB,
        pcie_bandwidth_bytes_per_s=_PCIE_GEN4,
    ),
    # NVIDIA A100 datasheet, SXM4 80GB: HBM2e 2,039 GB/s (PCIe: 1,935); 312 TFLOPS dense; NVLink
    # 600 GB/s, PCIe Gen4 64 GB/s.
    "A100-80GB": GpuSpec(
        "A100-80GB",
        80 * GiB,
        2039 * GB,
        312 * TFLOPS,
        _A100,
        nvlink_bandwidth_bytes_per_s=600 * GB,
        pcie_bandwidth_bytes_per_s=_PCIE_GEN4,
    ),
    # NVIDIA H100 datasheet, SXM5: 80 GB HBM3, 3.35 TB/s; BF16/FP16 tensor 1,979 TFLOPS with
    # sparsity = 989.4 dense; interconnect "NVIDIA NVLink: 900GB/s, PCIe Gen5: 128GB/s". (The PCIe
    # and NVL cards are H100-PCIe-80GB and H100-NVL-94GB below.)
    "H100-80GB": GpuSpec(
        "H100-80GB",
        80 * GiB,
        3.35 * TB,
        989.4 * TFLOPS,
        _H100,
        nvlink_bandwidth_bytes_per_s=900 * GB,
        pcie_bandwidth_bytes_per_s=_PCIE_GEN5,
    ),
    # NVIDIA H200 datasheet, SXM: 141 GB HBM3e, 4.8 TB/s; same compute as H100 SXM (989.4 dense);
    # "NVIDIA NVLink: 900GB/s, PCIe Gen5: 128GB/s".
    "H200-141GB": GpuSpec(
        "H200-141GB",
        141 * GiB,
        4.8 * TB,
        989.4 * TFLOPS,
        _applied(_H100, "H200-141GB", "same Hopper SMs as the H100, HBM3e at 4.8 TB/s"),
        nvlink_bandwidth_bytes_per_s=900 * GB,
        pcie_bandwidth_bytes_per_s=_PCIE_GEN5,
    ),
    # NVIDIA H100 datasheet, PCIe card: 80 GB HBM2e, 2.0 TB/s (2,039 GB/s on the product brief);
    # FP16/BF16 tensor 1,513 TFLOPS with sparsity; the H100 architecture whitepaper's dense figure
    # with FP32 accumulate is 756; "NVLink: 600GB/s" (a bridge joining two cards), "PCIe Gen5: 128GB/s".
    # 114 SMs at a 350 W limit, against the SXM's 132 at 700 W: the same Hopper SMs, throttled.
    "H100-PCIe-80GB": GpuSpec(
        "H100-PCIe-80GB",
        80 * GiB,
        2.0 * TB,
        756 * TFLOPS,
        _applied(_H100, "H100-PCIe-80GB", "same Hopper SMs as the H100 SXM, fewer and power-capped", "±30 %"),
        nvlink_bandwidth_bytes_per_s=600 * GB,
        pcie_bandwidth_bytes_per_s=_PCIE_GEN5,
    ),
    # NVIDIA H100 NVL product brief and H100 datasheet (NVL column): 94 GB HBM3, 3.9 TB/s (3,938 GB/s);
    # BF16/FP16 tensor 1,671 TFLOPS with sparsity = 835.5 dense; "NVLink: 600GB/s" (bridge between a
    # pair of cards), "PCIe Gen5: 128GB/s"; 350-400 W.
    "H100-NVL-94GB": GpuSpec(
        "H100-NVL-94GB",
        94 * GiB,
        3.9 * TB,
        835.5 * TFLOPS,
        _applied(_H100, "H100-NVL-94GB", "same Hopper SMs as the H100 SXM, at 400 W", "±30 %"),
        nvlink_bandwidth_bytes_per_s=600 * GB,
        pcie_bandwidth_bytes_per_s=_PCIE_GEN5,
    ),
    # NVIDIA HGX B200 (1,000 W, as in DGX B200): 180 GB HBM3e per GPU (of the 192 GB the stacks hold),
    # 8 TB/s; FP16/BF16 tensor 2.25 PFLOPS dense (4.5 with sparsity); fifth-generation NVLink 1.8 TB/s.
    # The GPU's PCIe is Gen6, but the Gen5 hosts of HGX/DGX B200 run it at Gen5 x16 (128 GB/s).
    # Hopper's factors: the nearest measured data-centre part, but Blackwell's tensor cores
    # (tcgen05, tensor memory) are new and their kernels younger, hence the wider band.
    "B200-180GB": GpuSpec(
        "B200-180GB",
        180 * GiB,
        8 * TB,
        2250 * TFLOPS,
        _applied(
            _H100, "B200-180GB", "nearest measured data-centre GPU; a new tensor-core generation", "±40 %"
        ),
        nvlink_bandwidth_bytes_per_s=1800 * GB,
        pcie_bandwidth_bytes_per_s=_PCIE_GEN5,
    ),
    # NVIDIA L40S datasheet: 48 GB GDDR6 with ECC, 864 GB/s; BF16/FP16 tensor 362.05 TFLOPS dense
    # (733 with sparsity; a data-centre Ada part, not halved with FP32 accumulate like GeForce);
    # PCIe Gen4 x16 (64 GB/s), no NVLink. The A100's factors, as for the other Ada and Ampere cards:
    # the same warp-level (mma) tensor-core programming model, unlike Hopper's.
    "L40S-48GB": GpuSpec(
        "L40S-48GB",
        48 * GiB,
        864 * GB,
        362.05 * TFLOPS,
        _applied(_A100, "L40S-48GB", "no L40S data; Ada tensor cores are programmed like Ampere's", "±30 %"),
        pcie_bandwidth_bytes_per_s=_PCIE_GEN4,
    ),
    # NVIDIA RTX PRO 6000 Blackwell Workstation Edition datasheet: 96 GB GDDR7 with ECC, 512-bit,
    # 1,792 GB/s (28 Gbps); "4000 AI TOPS" (FP4 with sparsity); PCIe 5.0 x16, no NVLink. Dense FP16/BF16
    # tensor with FP32 accumulate: 503.8 TFLOPS (1.01 PFLOPS sparse), which is 188 SMs x 1,024 FLOP per
    # clock x 2.617 GHz and 4000 / 8: the professional card runs FP32 accumulate at full rate, unlike
    # the RTX 5090 (a BF16 GEMM measured at 417 TFLOPS on the Server Edition could not be reached at
    # half rate). The Server Edition's driver reports a 12,481 MHz memory clock, i.e. 1,597.6 GB/s
    # (LLMServingSim's RTX PRO 6000 hardware file and configs use 1597): the datasheet's 1,792 is kept
    # here, like every other preset's datasheet figure; for the Server Edition use
    # {base: RTX-PRO-6000-96GB, hbm_bandwidth_gb_per_s: 1597.6}. GB202 (sm_120) has no tcgen05/TMEM:
    # its tensor cores are programmed with warp-level mma like Ampere's and Ada's, so the A100's
    # factors (as for the RTX 4090), with the widest band of the NVIDIA cards for the bandwidth question.
    "RTX-PRO-6000-96GB": GpuSpec(
        "RTX-PRO-6000-96GB",
        96 * GiB,
        1792 * GB,
        503.8 * TFLOPS,
        replace(
            _applied(
                _A100,
                "RTX-PRO-6000-96GB",
                "no Blackwell data; sm_120 tensor cores are programmed like Ampere's",
                "±35 % (the Server Edition's memory runs at 1,597.6 GB/s, 11 % under the figure used)",
            ),
            routed_expert_bandwidth=RTX_PRO_6000_ROUTED_EXPERT_BANDWIDTH,
            source="A100 factors fitted to Vidur's A100-80GB Llama-2-7B operations, applied to "
            "RTX-PRO-6000-96GB (no Blackwell data; sm_120 tensor cores are programmed like Ampere's); "
            "routed experts: fitted to LLMServingSim's measured MoE layers (calibrate/moe_layers.py)",
        ),
        pcie_bandwidth_bytes_per_s=_PCIE_GEN5,
    ),
    # AMD Instinct MI300X data sheet: 192 GB HBM3, 5.3 TB/s; peak FP16/BF16 matrix 1,307.4 TFLOPS dense
    # (2,614.9 with sparsity); PCIe Gen5 x16 (128 GB/s); "peak aggregate Infinity Fabric bandwidth
    # 896 GB/s": seven links of 64 GB/s each way to the other GPUs of an 8-GPU platform, taken here as
    # the tensor-parallel link (right for TP 8, where every link carries the all-reduce; a TP-2 pair
    # has one link, 64 GB/s each way, 7x less). No AMD measurements: Hopper's factors, the nearest
    # HBM data-centre part, with the widest band (another vendor's kernels: ROCm, hipBLASLt).
    "MI300X-192GB": GpuSpec(
        "MI300X-192GB",
        192 * GiB,
        5.3 * TB,
        1307.4 * TFLOPS,
        _applied(_H100, "MI300X-192GB", "no AMD data; the nearest measured HBM data-centre GPU", "±50 %"),
        nvlink_bandwidth_bytes_per_s=896 * GB,
        pcie_bandwidth_bytes_per_s=_PCIE_GEN5,
        peer_link_name="Infinity Fabric",
    ),
}

GPU_PRESETS = {
    name: replace(
        spec,
        preset=name,
        memory_type=_MEMORY_TYPES[name],
        achievable_bandwidth=MEASURED_ACHIEVABLE_BANDWIDTH.get(name),
        architecture=PRESET_ARCHITECTURES[name],
        achievable_compute=MEASURED_ACHIEVABLE_COMPUTE.get(name),
        l2_cache_bytes=L2_CACHE_MIB[name] * MiB,
    )
    for name, spec in GPU_PRESETS.items()
}

# Short names that are unambiguous (compared after normalisation: lower case, alphanumerics only).
_GPU_ALIASES: dict[str, str] = {
    "t4": "T4-16GB",
    "teslat4": "T4-16GB",
    "a10g": "A10G-24GB",
    "l4": "L4-24GB",
    "rtx4090": "RTX-4090-24GB",
    "4090": "RTX-4090-24GB",
    "geforcertx4090": "RTX-4090-24GB",
    "a100sxm440gb": "A100-40GB",
    "a100sxm480gb": "A100-80GB",
    "h100": "H100-80GB",
    "h100sxm": "H100-80GB",
    "h10080gbhbm3": "H100-80GB",
    "h100sxm80gb": "H100-80GB",
    "h200": "H200-141GB",
    "h200sxm": "H200-141GB",
    "h100pcie": "H100-PCIe-80GB",
    "h100nvl": "H100-NVL-94GB",
    "b200": "B200-180GB",
    "l40s": "L40S-48GB",
    "rtxpro6000": "RTX-PRO-6000-96GB",
    "rtxpro6000blackwell": "RTX-PRO-6000-96GB",
    "rtxpro6000blackwellworkstationedition": "RTX-PRO-6000-96GB",
    "rtxpro6000blackwellserveredition": "RTX-PRO-6000-96GB",
    "mi300x": "MI300X-192GB",
    "instinctmi300x": "MI300X-192GB",
    "amdinstinctmi300x": "MI300X-192GB",
}


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower().removeprefix("nvidia").strip())


_GPU_INDEX: dict[str, str] = {_norm(k): k for k in GPU_PRESETS}
_GPU_INDEX.update(_GPU_ALIASES)

# Custom-GPU keys: exactly one per group (or none, when "base" supplies it). Units in the names.
_MEMORY_KEYS = {"memory_bytes": 1, "memory_gib": GiB, "memory_gb": GB}
_BANDWIDTH_KEYS = {"hbm_bandwidth_bytes_per_s": 1, "hbm_bandwidth_gb_per_s": GB, "hbm_bandwidth_tb_per_s": TB}
_FLOPS_KEYS = {"fp16_flops": 1, "fp16_tflops": TFLOPS}
_LINK_KEYS = ("nvlink_gb_per_s", "pcie_gb_per_s")
_MEMORY_TYPE_KEYS = ("memory_type", "achievable_bandwidth")
_COMPUTE_KEYS = ("architecture", "achievable_compute")
_L2_KEY = "l2_cache_mib"
_ALLOWED_KEYS = {
    _L2_KEY,
    "name",
    "base",
    "efficiency",
    *_MEMORY_KEYS,
    *_BANDWIDTH_KEYS,
    *_FLOPS_KEYS,
    *_LINK_KEYS,
    *_MEMORY_TYPE_KEYS,
    *_COMPUTE_KEYS,
}
_EFFICIENCY_KEYS = [
    item.name for item in fields(Efficiency) if item.name not in ("source", "error_band", "transferred")
]


def _efficiency(spec: Mapping[str, object], base: Efficiency) -> Efficiency:
    """``base`` with the factors given under ``efficiency:`` replaced (the source says which)."""
    given = spec.get("efficiency")
    if given is None:
        return base
    if not isinstance(given, Mapping):
        raise ValueError(f"custom GPU: efficiency must be a mapping of factors, got {given!r}")
    unknown = sorted(set(given) - set(_EFFICIENCY_KEYS))
    if unknown:
        raise ValueError(
            f"custom GPU: unknown efficiency key(s) {', '.join(map(str, unknown))}; allowed: {', '.join(_EFFICIENCY_KEYS)}"
        )
    if not given:
        return base
    changed = ", ".join(f"{key}={value}" for key, value in given.items())
    return replace(
        base,
        **given,
        source=f"{base.source}; overridden by the user: {changed}",
        error_band=f"not validated (user-set factors: {changed})",
    )


def _custom_ceiling(
    spec: Mapping[str, object],
    base: GpuSpec | None,
    kind_key: str,
    defaults: Mapping[str, MeasuredShare],
    share_key: str,
    share_class: type[MeasuredShare],
    peak_keys: tuple[str, ...],
    peak_name: str,
) -> dict[str, object]:
    """A custom GPU's kind (``memory_type: HBM3e``, ``architecture: Hopper``: picks the default
    ceiling) and its measured ceiling (``achievable_bandwidth: 0.88``, ``achievable_compute: 0.75``),
    else its base's. A base given another datasheet peak keeps its measured share as evidence only."""
    kind = spec.get(kind_key, getattr(base, kind_key) if base else "unknown")
    if kind not in (*defaults, "unknown"):
        raise ValueError(f"custom GPU: {kind_key} must be one of {', '.join(defaults)}, got {kind!r}")
    achievable = getattr(base, share_key) if base and kind_key not in spec else None
    share = spec.get(share_key)
    if share is not None:
        if (
            isinstance(share, bool)
            or not isinstance(share, int | float)
            or not 0 < share <= share_class.MAX_SHARE
        ):
            raise ValueError(
                f"custom GPU: {share_key} is the measured share of the {peak_name}, in "
                f"(0, {share_class.MAX_SHARE:g}]; got {share!r}"
            )
        achievable = share_class(float(share), "given by the user (custom GPU)")
    elif base and achievable is not None and any(key in spec for key in peak_keys):
        achievable = replace(
            achievable,
            measured=False,
            source=f"{base.name}'s measured share, applied to a changed {peak_name}: {achievable.source}",
        )
    return {kind_key: kind, share_key: achievable}


def _ceilings(spec: Mapping[str, object], base: GpuSpec | None) -> dict[str, object]:
    """The memory type, achievable bandwidth, architecture and achievable compute of a custom GPU."""
    memory = _custom_ceiling(
        spec,
        base,
        "memory_type",
        ACHIEVABLE_BANDWIDTH_DEFAULTS,
        "achievable_bandwidth",
        AchievableBandwidth,
        tuple(_BANDWIDTH_KEYS),
        "datasheet bandwidth",
    )
    compute = _custom_ceiling(
        spec,
        base,
        "architecture",
        ACHIEVABLE_COMPUTE_DEFAULTS,
        "achievable_compute",
        AchievableCompute,
        tuple(_FLOPS_KEYS),
        "datasheet FLOP/s",
    )
    return memory | compute


def _l2_cache(spec: Mapping[str, object], default: int) -> int:
    """A custom GPU's last-level cache in bytes (``l2_cache_mib``), else ``default``."""
    if _L2_KEY not in spec:
        return default
    value = spec[_L2_KEY]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise ValueError(f"custom GPU: {_L2_KEY} must be a finite number >= 0, got {value!r}")
    return int(value * MiB)


def _preset(name: str) -> GpuSpec:
    key = _GPU_INDEX.get(_norm(name))
    if key is None:
        hint = " (A100 comes as A100-40GB and A100-80GB)" if _norm(name).startswith("a100") else ""
        raise ValueError(f"unknown GPU {name!r}{hint}; presets: {', '.join(GPU_PRESETS)}")
    return GPU_PRESETS[key]


def _pick(spec: Mapping[str, object], keys: dict[str, int], what: str) -> float | None:
    given = [k for k in keys if k in spec]
    if len(given) > 1:
        raise ValueError(f"custom GPU: give {what} once, got {', '.join(given)}")
    if not given:
        return None
    value = spec[given[0]]
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ValueError(f"custom GPU: {given[0]} must be a positive, finite number, got {value!r}")
    return value * keys[given[0]]


def _links(spec: Mapping[str, object], nvlink: float | None, pcie: float) -> tuple[float | None, float]:
    """The NVLink and PCIe rates in bytes/s: the ones ``spec`` gives (``nvlink_gb_per_s: null``: no
    NVLink), else ``nvlink`` and ``pcie``."""
    given: dict[str, float | None] = {}
    for key in _LINK_KEYS:
        if key not in spec:
            continue
        value = spec[key]
        if value is None and key == "nvlink_gb_per_s":
            given[key] = None
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
            raise ValueError(f"custom GPU: {key} must be a positive, finite number, got {value!r}")
        given[key] = float(value) * GB
    pcie_given = given.get("pcie_gb_per_s")
    return given.get("nvlink_gb_per_s", nvlink), pcie if pcie_given is None else pcie_given


def resolve_gpu(spec: str | Mapping[str, object] | GpuSpec) -> GpuSpec:
    """A GPU preset by name (case-insensitive, e.g. ``"a100-80gb"``, ``"H100"``) or a custom GPU.

    A custom GPU is a mapping with these keys (units are part of the key names):

    * ``name`` (optional, default ``"custom"``);
    * ``base`` (optional): a preset to start from, so only the fields that differ need giving;
    * memory, one of ``memory_bytes``, ``memory_gib`` (2**30 bytes) or ``memory_gb`` (10**9 bytes);
    * bandwidth, one of ``hbm_bandwidth_bytes_per_s``, ``hbm_bandwidth_gb_per_s`` (10**9 B/s) or
      ``hbm_bandwidth_tb_per_s`` (10**12 B/s);
    * compute, one of ``fp16_flops`` (FLOP/s) or ``fp16_tflops`` (10**12 FLOP/s), dense;
    * ``nvlink_gb_per_s``, ``pcie_gb_per_s`` (optional): the datasheet link rates, both directions
      together, in 10**9 B/s (e.g. 900 and 128 for an H100 SXM); ``nvlink_gb_per_s: null`` removes a
      base's NVLink. Without ``base``: no NVLink and PCIe Gen4 x16 (64 GB/s);
    * ``memory_type`` / ``achievable_bandwidth``, ``architecture`` / ``achievable_compute``
      (optional): what picks the share of the datasheet bandwidth and FLOP/s real kernels reach
      (a technology's or an architecture's default), or your own measured shares;
    * ``l2_cache_mib`` (optional): the last-level cache in MiB (2**20 bytes), e.g. 50 for an H100;
      without ``base``, 0 (no credit for K/V blocks that running sequences share);
    * ``efficiency`` (optional): a mapping of :class:`Efficiency` factors to replace, e.g.
      ``{weight_bandwidth: 0.8}``; the rest come from ``base`` (or :data:`GENERIC_EFFICIENCY`, the A100 factors marked as not validated).

    Without ``base`` all three groups are required. Unknown keys raise ``ValueError``.
    Example: ``{"name": "H100-PCIe", "memory_gib": 80, "hbm_bandwidth_tb_per_s": 2.0, "fp16_tflops": 756}``.
    """
    if isinstance(spec, GpuSpec):
        return spec
    if isinstance(spec, str):
        return _preset(spec)
    if not isinstance(spec, Mapping):
        raise ValueError(f"GPU must be a preset name or a mapping of custom values, got {spec!r}")
    unknown = sorted(set(spec) - _ALLOWED_KEYS)
    if unknown:
        raise ValueError(
            f"custom GPU: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_ALLOWED_KEYS))}"
        )
    base_name = spec.get("base")
    base = None
    if base_name is not None:
        if not isinstance(base_name, str):
            raise ValueError(f"custom GPU: base must be a preset name, got {base_name!r}")
        base = _preset(base_name)
    name = spec.get("name", f"{base.name}-custom" if base else "custom")
    if not isinstance(name, str) or not name:
        raise ValueError(f"custom GPU: name must be a non-empty string, got {name!r}")
    memory = _pick(spec, _MEMORY_KEYS, "the memory")
    bandwidth = _pick(spec, _BANDWIDTH_KEYS, "the bandwidth")
    flops = _pick(spec, _FLOPS_KEYS, "the compute")
    if base is None:
        missing = [
            f"one of {', '.join(keys)}"
            for value, keys in ((memory, _MEMORY_KEYS), (bandwidth, _BANDWIDTH_KEYS), (flops, _FLOPS_KEYS))
            if value is None
        ]
        if missing:
            raise ValueError(f"custom GPU {name!r}: missing {'; '.join(missing)} (or give a 'base' preset)")
        assert memory is not None and bandwidth is not None and flops is not None
        efficiency = _efficiency(spec, GENERIC_EFFICIENCY)
        nvlink, pcie = _links(spec, None, DEFAULT_PCIE_BANDWIDTH_BYTES_PER_S)
        return GpuSpec(
            name,
            int(memory),
            float(bandwidth),
            float(flops),
            efficiency,
            nvlink_bandwidth_bytes_per_s=nvlink,
            pcie_bandwidth_bytes_per_s=pcie,
            l2_cache_bytes=_l2_cache(spec, 0),
            **_ceilings(spec, None),  # type: ignore[arg-type]
        )
    nvlink, pcie = _links(spec, base.nvlink_bandwidth_bytes_per_s, base.pcie_bandwidth_bytes_per_s)
    return replace(
        base,
        nvlink_bandwidth_bytes_per_s=nvlink,
        pcie_bandwidth_bytes_per_s=pcie,
        name=name,
        efficiency=_efficiency(spec, base.efficiency),
        memory_bytes=int(memory) if memory is not None else base.memory_bytes,
        hbm_bandwidth_bytes_per_s=float(bandwidth)
        if bandwidth is not None
        else base.hbm_bandwidth_bytes_per_s,
        fp16_flops=float(flops) if flops is not None else base.fp16_flops,
        l2_cache_bytes=_l2_cache(spec, base.l2_cache_bytes),
        **_ceilings(spec, base),  # type: ignore[arg-type]
    )
