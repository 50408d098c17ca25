"""When the prefix cache hears that a prompt chunk was scheduled (``KVCoordinator.prompt_scheduled``).

vLLM caches a chunk's full blocks when it schedules the chunk (``allocate_slots`` calls
``cache_blocks``): a request admitted later in the same step can hit them. SGLang inserts a chunk
into its radix tree once the batch that computed it has run (``cache_unfinished_req``, from
``get_next_batch_to_run`` for the chunked request and ``process_batch_result_prefill`` for the
others), so requests admitted in one round never hit each other's prompts. The scheduler says which
(``Scheduler.caches_chunks_after_run``); the admission desk and the jump landing report every chunk
here, and the wake-up tells :meth:`ChunkReports.batch_ran` when its iterations have run.
"""

from __future__ import annotations

from sim.engine.decoding import RequestState
from sim.kv.coordinator import KVCoordinator


class ChunkReports:
    def __init__(self, kv: KVCoordinator, after_run: bool):
        self.kv = kv
        self.after_run = after_run
        # Reports held until the batch runs: (sequence, tokens scheduled). (No request leaves the
        # batch between its chunk's scheduling and the end of that wake-up's iterations.)
        self._pending: list[tuple[int, int]] = []
        # From now on the pool caches prompts only as far as they are reported (defer_prompt_keys).
        kv.defer_prompt_keys()

    def scheduled(self, state: RequestState) -> None:
        """``state``'s prompt is scheduled (or swapped in, or landed) up to ``prefilled``."""
        if self.after_run:
            self._pending.append((state.seq_ids[0], state.prefilled))
        else:
            self.kv.prompt_scheduled(state.seq_ids[0], state.prefilled)

    def batch_ran(self) -> None:
        """The iterations whose chunks are held have run: the pool hears of them, in the order they
        were scheduled."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        for seq_id, tokens in pending:
            self.kv.prompt_scheduled(seq_id, tokens)
