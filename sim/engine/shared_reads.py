"""K/V that running sequences share is read from memory once: the rest of its reads hit the cache.

A decode step's attention reads every running sequence's K/V, block by block. Where several
sequences hold the same physical block (a prefix cache's hit, a beam's fork), the first read brings
it into the GPU's last-level cache (50 MiB of L2 on an H100) and the others find it there. So the
step's memory time counts each shared block once, and its re-reads only in the share of the shared
blocks that the cache cannot hold:

    attended context = sum of the decoding sequences' tokens - re-read tokens x hit share
    hit share        = min(1, cached tokens per layer / shared tokens)

``re-read tokens`` is what sharing saves the pool's full-attention layers (logical - physical slots),
``shared tokens`` the blocks two or more sequences hold there, each once (both from
``KVCoordinator.token_sharing``; a hybrid pool's first full-attention group speaks for them all, and
with sliding-window layers only the full-attention share of the context is credited), and ``cached tokens per layer`` the cache over one layer's K/V bytes
per token (``CostModel.shared_kv_cached_tokens``). Two assumptions, both stated in
``docs/gpu-transfer.md`` with what they do to the measured runs: the cache keeps the blocks that
several sequences read rather than the private K/V streaming past them (the kernels read a layer's
shared prefix blocks first, close together in time), and a read that hits costs no memory time (the
cache delivers several times the memory's bandwidth; a decode step is bound by the memory's). A
uniform-reuse cache (hit share = cache / all the K/V the pool holds) credits far less: on the
measured H100 runs at 20 req/s, 1 % of the context against about 14 %.

The credit is re-evaluated only when the batch's sharing changes (a request admitted with a hit,
one finished or forked): both step modes see those at the same iterations, so event skipping and
single stepping agree, and within a jump the context still grows by one token per sequence.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.kv.coordinator import KVCoordinator


class SharedReads:
    """The tokens a decode step does not read from memory because another sequence read them first."""

    def __init__(self, kv: KVCoordinator, cached_tokens_per_layer: float):
        self.kv = kv
        self.cached_tokens_per_layer = cached_tokens_per_layer
        self._rereads = 0
        self._credit = 0.0

    def credit(self) -> float:
        """Re-read tokens served by the cache, as the batch's sharing last left them."""
        rereads, shared = self.kv.token_sharing()
        if rereads != self._rereads:
            self._rereads = rereads
            # (A policy that shares without saying what has no credit.)
            hit_share = min(1.0, self.cached_tokens_per_layer / shared) if shared > 0 else 0.0
            self._credit = rereads * hit_share if rereads > 0 else 0.0
        return self._credit


def shared_reads_for(kv: KVCoordinator, cached_tokens_per_layer: float) -> SharedReads | None:
    """The credit, where the cost model gives one (a datasheet model on a GPU whose cache is known)
    and the pool can share (a prefix cache, forks sharing blocks; not plain paging or contiguous
    reservations, whose steps then pay nothing for asking; nor Jenga's pages without its prefix
    cache, SGLang's pools without the radix cache)."""
    if cached_tokens_per_layer <= 0 or not kv.may_share():
        return None
    return SharedReads(kv, cached_tokens_per_layer)
