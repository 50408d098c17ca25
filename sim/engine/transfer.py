"""What an engine tells a disaggregated cluster (``sim/cluster/disaggregated.py``) about KV transfers.

A prefill replica runs each prompt and produces its first token, then keeps the request's blocks until
the cluster says its KV has crossed the link (:meth:`Engine.release_held`). A decode replica receives
requests whose prompt was computed elsewhere (:meth:`Engine.submit_remote`): it allocates their blocks
as an admission (vLLM's ``WAITING_FOR_REMOTE_KVS``: blocks held, no compute, not in the batch), and
once the cluster says the KV has landed (:meth:`Engine.kv_received`) schedules them with their last
prompt token to compute, as vLLM's scheduler does (``num_computed_tokens = len(prompt) - 1``). Both
notices take effect at the replica's next iteration start, where vLLM's scheduler processes finished
sends and receives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sim.engine.decoding import RequestState


class KVTransferHooks(Protocol):
    def prefilled(self, state: RequestState) -> None:
        """(Prefill replica) ``state``'s prompt is done: its blocks stay held until released."""

    def kv_allocated(self, state: RequestState, cached_tokens: int) -> None:
        """(Decode replica) ``state``'s blocks are allocated, ``cached_tokens`` of its prompt from the
        local prefix cache: the rest can be sent."""

    def remote_dropped(self, state: RequestState) -> None:
        """(Decode replica) ``state`` reached an outcome (rejected, failed) before its KV was allocated:
        the prefill replica's blocks can go."""
