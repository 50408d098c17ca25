"""The draft of speculative decoding as hardware sees it: the weights it adds beside the target's, the
KV its layers keep per token, and the shapes a cost model prices one draft step on.

- ``eagle`` / ``eagle3`` / ``mtp``: a head of ``draft_layers`` decoder layers of the target's width
  (EAGLE's and EAGLE-3's one layer, DeepSeek-V3's and Qwen3-Next's one MTP layer). vLLM registers its
  attention layers in the target's KV cache, so every token keeps their K/V too; each draft step
  reads the head's layers and an LM head (the target's, shared; EAGLE-3's own smaller one, which also
  takes memory).
- ``draft_model``: a whole smaller model, its own weights and KV per token.
- ``ngram``: proposals from a lookup in the prompt on the CPU: no weights, no KV, no GPU time.

A mixture of experts' head is priced as a dense layer of the target's active parameters per layer,
and held at its total parameters per layer."""

from __future__ import annotations

from dataclasses import dataclass, replace

from sim.hardware.models import ModelSpec, resolve_model

EAGLE3_DRAFT_VOCAB = 32000
"""EAGLE-3's Llama heads predict over a 32,000-token draft vocabulary (``draft_vocab_size`` in the
published heads' config.json, e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B)."""


@dataclass(frozen=True)
class Draft:
    method: str
    step_shapes: ModelSpec | None  # what one draft step reads and computes (None: no GPU work)
    weight_bytes: int  # per GPU, beside the target's
    kv_bytes_per_token: int  # per GPU, added to every token's slot
    description: str


def _per_layer(total: int, model: ModelSpec) -> int:
    """Parameters of one decoder layer, on average (embedding and LM head left out)."""
    head = model.vocab_size * model.hidden_size
    return max(0, (total - 2 * head) // model.num_layers)


def draft_for(
    method: str,
    target: ModelSpec,
    *,
    kv_cache_dtype: str = "auto",
    tensor_parallel_size: int = 1,
    draft_model: str | None = None,
    draft_layers: int | None = None,
    draft_vocab_size: int | None = None,
) -> Draft:
    tp = tensor_parallel_size
    if method == "ngram":
        return Draft(method, None, 0, 0, "n-gram prompt lookup on the CPU: no draft weights or KV")
    if method == "draft_model":
        spec = resolve_model(draft_model or "")
        return Draft(
            method,
            spec,
            spec.weight_bytes_per_gpu(tp),
            spec.kv_bytes_per_token(kv_cache_dtype, tensor_parallel_size=tp),
            f"draft model {spec.name}",
        )
    layers = draft_layers or 1
    own_vocab = draft_vocab_size or (EAGLE3_DRAFT_VOCAB if method == "eagle3" else 0)
    active = target.num_active_params or target.num_params
    head_vocab = own_vocab or target.vocab_size
    step_params = layers * _per_layer(active, target) + head_vocab * target.hidden_size
    held_params = layers * _per_layer(target.num_params, target) + own_vocab * target.hidden_size
    shapes = replace(
        target,
        name=f"{target.name} {method} head",
        num_layers=layers,
        vocab_size=head_vocab,
        num_params=step_params,
        num_active_params=None,
        num_experts=None,
        experts_per_token=None,
        moe_intermediate_size=None,
        shared_expert_intermediate_size=0,
        num_dense_layers=0,
        layer_kinds=None,
        routed_expert_bits=None,  # a dense head: no routed experts to quantise (gpt-oss's MXFP4)
    )
    kv_per_layer = target.kv_bytes_per_token_per_layer(kv_cache_dtype, tp)
    return Draft(
        method,
        shapes,
        -(-held_params * target.weight_dtype_bytes // tp),
        layers * kv_per_layer,
        f"{method} head: {layers} layer(s) of {target.name}'s width"
        + (f", own LM head of {own_vocab:,} tokens" if own_vocab else ", the target's LM head"),
    )
