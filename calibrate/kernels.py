"""One decoder layer of a model's shapes in plain torch, reading and writing a paged KV pool.

Layout (one layer): ``k_pool``, ``v_pool`` are ``[num_blocks, block_size, num_kv_heads, head_dim]``.
A sequence's block table lists its block ids in order (any ids, not contiguous); token ``pos`` of the
sequence lives in slot ``block_table[pos // block_size] * block_size + pos % block_size``.

Attention gathers the sequence's blocks through the block table with ``index_select`` (faster than
advanced indexing on CPU) and runs ``torch.nn.functional.scaled_dot_product_attention`` with a length
or causal mask. Grouped-query attention: for decode the ``H / Hkv`` query heads of a group are folded
into the query-length dimension (1.1-1.9x faster than ``enable_gqa`` on CPU); prefill uses
``enable_gqa=True``. Query head ``h`` reads KV head ``h // (H / Hkv)``, the ``repeat_interleave``
convention of Llama-style checkpoints.

Note the padding of a plain-torch gather: a ragged batch is gathered to its longest sequence, so it
costs about ``batch * max_context`` rather than ``sum(context)``. Calibration fits on uniform batches.

This module imports torch at the top; import it only when a calibration runs.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from sim.costs.core import ModelShape

# --------------------------------------------------------------------------------------------------
# Paged attention
# --------------------------------------------------------------------------------------------------


def slot_mapping(
    block_tables: torch.Tensor, seq_index: torch.Tensor, positions: torch.Tensor, block_size: int
) -> torch.Tensor:
    """Pool slots of tokens ``positions`` of sequences ``seq_index`` (rows of ``block_tables``)."""
    blocks = block_tables[seq_index, torch.div(positions, block_size, rounding_mode="floor")]
    return blocks.long() * block_size + positions % block_size


def write_kv(
    k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Store new tokens' K and V (``[tokens, Hkv, D]``) at ``slots`` (``[tokens]``, int64)."""
    num_kv_heads, head_dim = k_pool.shape[2], k_pool.shape[3]
    k_pool.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, k)
    v_pool.view(-1, num_kv_heads, head_dim).index_copy_(0, slots, v)


def gather_kv(pool: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """``[B, max_blocks]`` block tables -> ``[B, Hkv, max_blocks * block_size, D]`` (a view of one gather)."""
    _, block_size, num_kv_heads, head_dim = pool.shape
    batch = block_tables.shape[0]
    gathered = pool.index_select(0, block_tables.reshape(-1).long())
    return gathered.view(batch, -1, num_kv_heads, head_dim).transpose(1, 2)


def paged_decode_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
) -> torch.Tensor:
    """One query token per sequence. ``q`` ``[B, H, D]``; ``block_tables`` ``[B, max_blocks]`` (unused
    entries must hold a valid block id; they are masked); ``context_lens`` ``[B]``, each >= 1,
    including the new token. Returns ``[B, H, D]``."""
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_pool.shape[2]
    group = num_heads // num_kv_heads
    k = gather_kv(k_pool, block_tables)
    v = gather_kv(v_pool, block_tables)
    keep = torch.arange(k.shape[2], device=q.device)[None, :] < context_lens[:, None]
    out = F.scaled_dot_product_attention(
        q.view(batch, num_kv_heads, group, head_dim), k, v, attn_mask=keep[:, None, None, :]
    )
    return out.reshape(batch, num_heads, head_dim)


def paged_prefill_attention(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_table: torch.Tensor, start: int
) -> torch.Tensor:
    """A prefill chunk of one sequence: ``q`` ``[N, H, D]`` for positions ``start .. start+N-1``, whose
    K/V (and the prefix's) are already in the pool. Causal. Returns ``[N, H, D]``."""
    num_tokens, num_heads, head_dim = q.shape
    block_size = k_pool.shape[1]
    total = start + num_tokens
    used = block_table[: -(-total // block_size)][None, :]
    k = gather_kv(k_pool, used)[:, :, :total]
    v = gather_kv(v_pool, used)[:, :, :total]
    keys = torch.arange(total, device=q.device)
    queries = torch.arange(start, total, device=q.device)
    keep = keys[None, :] <= queries[:, None]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k, v, attn_mask=keep[None, None], enable_gqa=True
    )
    return out[0].transpose(0, 1)


# --------------------------------------------------------------------------------------------------
# The decoder layer
# --------------------------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    variance = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(variance + eps) * weight


def apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate-half form) of ``x`` ``[T, heads, D]`` at ``positions`` ``[T]``."""
    angles = positions[:, None].to(inv_freq.dtype) * inv_freq[None, :]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)[:, None, :].to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)[:, None, :].to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class DecoderLayer:
    """A Llama-shaped layer with random weights: RMSNorm, fused QKV projection, rotary embedding, KV
    write through the slot mapping, paged attention, output projection, residual, RMSNorm, gated
    (SwiGLU) MLP (two-matrix ReLU MLP when ``gated_mlp`` is False, as in OPT), residual."""

    def __init__(self, model: ModelShape, dtype: torch.dtype, device: torch.device, seed: int = 0):
        if model.attention != "mha":
            raise ValueError("calibration builds MHA/GQA layers only; MLA models are not supported")
        if model.num_attention_heads % model.num_kv_heads:
            raise ValueError("num_attention_heads must be a multiple of num_kv_heads")
        self.num_heads, self.num_kv_heads = model.num_attention_heads, model.num_kv_heads
        self.head_dim, self.hidden = model.head_dim, model.hidden_size
        self.intermediate = model.intermediate_size
        generator = torch.Generator(device="cpu").manual_seed(seed)
        q_width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim

        def weight(rows: int, cols: int) -> torch.Tensor:
            # In place: a second full-size fp32 temporary would double the peak for the largest matrix.
            w = torch.randn(rows, cols, generator=generator).div_(math.sqrt(cols))
            return w.to(device=device, dtype=dtype)

        self.w_qkv = weight(q_width + 2 * kv_width, self.hidden)
        self.w_o = weight(self.hidden, q_width)
        self.gated = bool(getattr(model, "gated_mlp", True))
        self.w_gate_up = weight((2 if self.gated else 1) * self.intermediate, self.hidden)
        self.w_down = weight(self.hidden, self.intermediate)
        self.norm_attn = torch.ones(self.hidden, device=device, dtype=dtype)
        self.norm_mlp = torch.ones(self.hidden, device=device, dtype=dtype)
        exponent = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=device) / self.head_dim
        self.inv_freq = 1.0 / (10000.0**exponent)

    def _qkv(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        tokens = x.shape[0]
        q_width, kv_width = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        qkv = rms_norm(x, self.norm_attn) @ self.w_qkv.T
        q, k, v = qkv.split([q_width, kv_width, kv_width], dim=-1)
        q = apply_rope(q.reshape(tokens, self.num_heads, self.head_dim), positions, self.inv_freq)
        k = apply_rope(k.reshape(tokens, self.num_kv_heads, self.head_dim), positions, self.inv_freq)
        return q, k, v.reshape(tokens, self.num_kv_heads, self.head_dim)

    def _finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        x = x + attn.reshape(x.shape[0], -1) @ self.w_o.T
        hidden = rms_norm(x, self.norm_mlp) @ self.w_gate_up.T
        if self.gated:
            gate, up = hidden.chunk(2, dim=-1)
            return x + (F.silu(gate) * up) @ self.w_down.T
        return x + F.relu(hidden) @ self.w_down.T

    def decode(
        self,
        x: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        slots: torch.Tensor,
    ) -> torch.Tensor:
        """One decode step for ``B`` sequences: ``x`` ``[B, hidden]``, the new token of sequence ``b``
        at position ``context_lens[b] - 1`` stored at ``slots[b]``."""
        q, k, v = self._qkv(x, context_lens - 1)
        write_kv(k_pool, v_pool, slots, k, v)
        return self._finish(x, paged_decode_attention(q, k_pool, v_pool, block_tables, context_lens))

    def prefill(
        self,
        x: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        block_table: torch.Tensor,
        start: int,
        slots: torch.Tensor,
    ) -> torch.Tensor:
        """A prefill chunk of one sequence: ``x`` ``[N, hidden]`` at positions ``start .. start+N-1``."""
        positions = torch.arange(start, start + x.shape[0], device=x.device)
        q, k, v = self._qkv(x, positions)
        write_kv(k_pool, v_pool, slots, k, v)
        return self._finish(x, paged_prefill_attention(q, k_pool, v_pool, block_table, start))


class LMHead:
    """Final RMSNorm and the logits projection, run once per step (not per layer)."""

    def __init__(self, model: ModelShape, dtype: torch.dtype, device: torch.device, seed: int = 1):
        generator = torch.Generator(device="cpu").manual_seed(seed)
        weight = torch.randn(model.vocab_size, model.hidden_size, generator=generator)
        # In place: the LM head is the largest matrix (Llama-3.1-8B: 2 GiB in fp32); no second copy.
        self.weight = weight.div_(math.sqrt(model.hidden_size)).to(device=device, dtype=dtype)
        self.norm = torch.ones(model.hidden_size, device=device, dtype=dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.norm) @ self.weight.T


# --------------------------------------------------------------------------------------------------
# Block copy and swap across all layers
# --------------------------------------------------------------------------------------------------


def copy_blocks(cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy-on-write: ``cache`` ``[layers, 2, num_blocks, block_size, Hkv, D]``, blocks ``src`` -> ``dst``
    in every layer, K and V, in one ``index_copy_``."""
    cache.index_copy_(2, dst, cache.index_select(2, src))


def swap_out(cache: torch.Tensor, src: torch.Tensor, host: torch.Tensor) -> None:
    """Device -> host: blocks ``src`` of every layer into ``host`` ``[layers, 2, n, ...]`` (pinned)."""
    host.copy_(cache.index_select(2, src), non_blocking=True)


def swap_in(cache: torch.Tensor, dst: torch.Tensor, host: torch.Tensor) -> None:
    """Host -> device: ``host`` ``[layers, 2, n, ...]`` into blocks ``dst`` of every layer."""
    cache.index_copy_(2, dst, host.to(cache.device, non_blocking=True))


def dtype_from_name(name: str) -> torch.dtype:
    table: dict[str, Any] = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if name not in table:
        raise ValueError(f"dtype must be one of {', '.join(table)}, got {name!r}")
    return table[name]
