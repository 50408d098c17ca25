"""``kvsim models``, ``kvsim gpus``, ``kvsim policies``: what a config may name, with the numbers that matter."""

from __future__ import annotations

import argparse
import inspect
from typing import Any

GiB = 2**30


def register(subparsers: Any) -> None:
    """Add the three listing subcommands to ``kvsim``."""
    models = subparsers.add_parser("models", help="list the model presets (config key: model)")
    models.set_defaults(func=cmd_models)
    gpus = subparsers.add_parser("gpus", help="list the GPU presets (config key: gpu)")
    gpus.set_defaults(func=cmd_gpus)
    policies = subparsers.add_parser("policies", help="list the KV-cache policies and their options")
    policies.set_defaults(func=cmd_policies)


def table(header: list[str], rows: list[list[str]], left_aligned: int = 1) -> str:
    """Columns padded to their widest cell; the first ``left_aligned`` columns left-aligned (names and
    text), the rest right-aligned (numbers)."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            cell.ljust(width) if i < left_aligned else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(header), *(line(row) for row in rows)])


def attention_kind(spec) -> str:
    """MHA, GQA or MQA by the heads (``spec.attention`` says only "mha" or "mla": the cache layout),
    plus MoE for a mixture of experts."""
    if spec.attention == "mla":
        kind = "MLA"
    elif spec.num_kv_heads == spec.num_attention_heads:
        kind = "MHA"
    else:
        kind = "MQA" if spec.num_kv_heads == 1 else "GQA"
    return f"{kind}, MoE" if getattr(spec, "num_experts", None) else kind


def models_table() -> str:
    from sim.hardware.models import MODEL_PRESETS

    rows = []
    for name, spec in MODEL_PRESETS.items():
        heads = f"{spec.num_kv_heads}/{spec.num_attention_heads}" if spec.attention == "mha" else "latent"
        rows.append(
            [
                name,
                f"{spec.num_params / 1e9:.1f}B",
                str(spec.num_layers),
                attention_kind(spec),
                heads,
                f"{spec.max_position_embeddings:,}",
                f"{spec.kv_bytes_per_token():,}",
                f"{spec.weight_bytes() / GiB:.1f}",
                f"{spec.routed_expert_bytes / GiB:.1f}" if spec.is_moe else "-",
            ]
        )
    header = [
        "model",
        "params",
        "layers",
        "attention",
        "kv/q heads",
        "context",
        "KV B/token",
        "weights GiB",
        "experts GiB",
    ]
    return (
        table(header, rows)
        + "\n\nKV bytes per token at the model's dtype (kv_cache_dtype: auto), all attention layers "
        "counted as full attention, one GPU. experts GiB: the routed experts' share of the weights, which "
        "expert parallelism deals out over the GPUs (engine.enable_expert_parallel; each holds 1 / "
        "(data_parallel_size x tensor_parallel_size) of it). A HuggingFace config.json path works too "
        "(model: path/to/config.json).\n\n" + layer_kinds_table()
    )


def layer_kinds_text(spec: Any) -> str:
    """``"sliding(128) 12 x 2,048; full 12 x 2,048"``: each attention kind's layers and the K/V bytes
    one token takes in one of them."""
    per_layer = spec.kv_bytes_per_token_per_layer()
    return "; ".join(
        f"{kind.label} {count} x {per_layer:,}"
        for kind, count in spec.layer_kind_counts
        if kind in spec.kv_bytes_per_token_by_kind()
    )


def state_text(spec: Any) -> str:
    """``"39,518,208 (gdn 36 x 1,097,728)"``: one request's state in all state layers, then per kind."""
    by_kind = spec.state_bytes_by_kind()
    if not by_kind:
        return "-"
    counts = dict(spec.layer_kind_counts)
    parts = [f"{kind.label} {counts[kind]} x {spec.state_bytes_per_layer(kind):,}" for kind in by_kind]
    return f"{sum(by_kind.values()):,} ({'; '.join(parts)})"


def layer_kinds_table() -> str:
    """The presets whose layers are not all full attention: their layer kinds and states."""
    from policies.base import policy_names
    from sim.hardware.models import MODEL_PRESETS
    from sim.kv.allocators import HYBRID_ALLOCATORS

    rows = [
        [name, layer_kinds_text(spec), state_text(spec)]
        for name, spec in MODEL_PRESETS.items()
        if spec.layer_kinds is not None
    ]
    header = ["model", "KV B/token per layer, by kind (layers x B)", "state B/request (layers x B)"]
    return (
        table(header, rows, left_aligned=3)
        + "\n\nLayer kinds: full attention keeps every token; sliding(W) the last W tokens; chunked(C) the "
        "tokens of the current C-token chunk; state layers (mamba2, gdn: Qwen3-Next's gated delta net) a "
        "fixed conv + SSM state per request, at the model dtype and the SSM state at vLLM's default "
        "(float32 for Nemotron-H). MLP-only blocks keep nothing. The uniform policies "
        f"({', '.join(policy_names())}) hold every attention layer's K/V for every token (KV B/token "
        "above) and refuse state layers; the hybrid allocators "
        f"({', '.join(HYBRID_ALLOCATORS)}) keep each kind as above (docs/policies.md)."
    )


def gpus_table() -> str:
    from sim.costs.serving import default_calibration
    from sim.hardware.gpus import GPU_PRESETS

    calibration = default_calibration()
    rows = [
        [
            name,
            f"{spec.memory_bytes / GiB:g}",
            f"{spec.hbm_bandwidth_bytes_per_s / 1e9:,.0f}",
            f"{spec.fp16_flops / 1e12:,.1f}",
            f"{spec.l2_cache_bytes / 2**20:g}",
            spec.memory_type,
            _ceiling_text(spec.memory_ceiling),
            spec.architecture,
            _ceiling_text(spec.compute_ceiling),
            calibration.evidence(spec),
        ]
        for name, spec in GPU_PRESETS.items()
    ]
    header = [
        "gpu",
        "memory GiB",
        "bandwidth GB/s",
        "fp16 dense TFLOP/s",
        "L2 MiB",
        "memory",
        "achievable",
        "architecture",
        "achievable GEMM",
        "evidence",
    ]
    return (
        table(header, rows)
        + "\n\nachievable: the share of the datasheet bandwidth DRAM-bound kernels reach, measured on that GPU "
        "or (~) its memory type's default with the measured parts' range; no modelled read is faster. "
        "achievable GEMM: the share of the dense FP16 FLOP/s the best measured matrix product reaches, "
        "or (~) its architecture's default; no modelled matrix product is faster. "
        "evidence: measured (runs in the serving fit), transferred (its kernels, memory or GEMMs measured) or "
        "datasheet-only; it picks the GPU's error band (docs/gpu-transfer.md). "
        "L2: the last-level cache (the MI300X's Infinity Cache), where K/V blocks that running sequences "
        "share are read once for all of them."
        "\nCustom GPUs: gpu: {base: H100-80GB, memory_gib: 79.19} or {name, memory_gib, "
        "hbm_bandwidth_gb_per_s, fp16_tflops, memory_type, achievable_bandwidth, architecture, "
        "achievable_compute, l2_cache_mib}."
    )


def _ceiling_text(ceiling: Any) -> str:
    if ceiling.measured:
        return f"{ceiling.share:.1%}"
    low, high = ceiling.band
    return f"~{ceiling.share:.1%} ({low:.0%}..{high:.0%})"


def policy_option_lines(name: str) -> list[str]:
    """``option = default (values)`` for each option a config may set (Python-only hooks left out)."""
    from policies.base import policy_class

    cls = policy_class(name)
    values = getattr(cls, "OPTION_VALUES", {})
    lines = []
    for parameter in list(inspect.signature(cls).parameters.values())[1:]:  # after the pool
        if callable(parameter.default):
            continue  # a Python-only hook (a callable) cannot come from YAML
        choice = f" ({' | '.join(values[parameter.name])})" if parameter.name in values else ""
        lines.append(f"{parameter.name} = {parameter.default}{choice}")
    return lines


def source_docstring(module) -> str:
    """A module's docstring read from its source file: the compiled build (mypyc) drops
    ``__doc__``, but the sources it was built from stay in the project."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    source = root.joinpath(*module.__name__.split(".")).with_suffix(".py")
    if not source.is_file():
        return ""
    return ast.get_docstring(ast.parse(source.read_text(encoding="utf-8"))) or ""


def policies_table() -> str:
    import policies  # noqa: F401  (registers every policy)
    from policies.base import policy_class, policy_names

    blocks = []
    for name in policy_names():
        module = inspect.getmodule(policy_class(name))
        module_doc = (module.__doc__ if module else "") or (source_docstring(module) if module else "")
        summary = module_doc.strip().split("\n\n")[0].replace("\n", " ")
        options = policy_option_lines(name)
        blocks.append(f"{name}\n  {summary}\n  options: " + ("; ".join(options) if options else "none"))
    from sim.kv import allocators

    hybrid_doc = (allocators.__doc__ or source_docstring(allocators)).strip().split("\n\n")
    for name in allocators.HYBRID_ALLOCATORS:
        paragraph = next(part for part in hybrid_doc if part.startswith(f"``{name}``: "))
        summary = " ".join(paragraph.split()).removeprefix(f"``{name}``: ")
        names = ", ".join(allocators.hybrid_allocator_options(name)) or "none"
        blocks.append(f"{name}\n  {summary}\n  options: {names}")
    return "\n\n".join(blocks) + "\n\nIn a config: variants: [{name: NAME, policy: POLICY, options: {...}}]."


def cmd_models(args: argparse.Namespace) -> int:
    print(models_table())
    return 0


def cmd_gpus(args: argparse.Namespace) -> int:
    print(gpus_table())
    return 0


def cmd_policies(args: argparse.Namespace) -> int:
    print(policies_table())
    return 0
