"""vLLM's scheduler (``engine.scheduler: vllm``, the default), as V1's ``Scheduler.schedule`` runs it.

FCFS: running requests first (the engine core grows them and schedules the chunks of prompts in
progress), then waiting requests from the queue's head while the token budget
(``max_num_batched_tokens`` less the decode tokens), ``max_num_seqs`` and the KV pool allow; the
round stops at the first head that cannot be admitted. Without chunked prefill a prompt waits until
one iteration's budget holds it whole. Under ``--async-scheduling`` an iteration is scheduled while
the one before it runs, so it sees only the requests queued by then. When decode runs out of memory
the newest admitted request is preempted and requeued at the front (the base :class:`Scheduler`'s
defaults).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mypy_extensions import mypyc_attr

from policies.base import OutOfKVMemory
from sim.engine.schedulers.base import (
    HEAD_NOT_SEEN,
    HEAD_OUT_OF_MEMORY,
    HEAD_STUCK,
    OUT_OF_BUDGET,
    QUEUE_EMPTY,
    Scheduler,
    SchedulingEngine,
)
from token_content import content_length

if TYPE_CHECKING:
    from sim.engine.knobs import EngineKnobs


@mypyc_attr(allow_interpreted_subclasses=True)
class VLLMScheduler(Scheduler):
    def __init__(self, knobs: EngineKnobs):
        super().__init__(knobs)
        self.max_num_batched_tokens = knobs.max_num_batched_tokens
        # Speculative decoding: a decoding sequence's step schedules its token and its k drafts.
        speculative = knobs.speculative
        self.tokens_per_decode = 1 if speculative is None else 1 + speculative.num_speculative_tokens

    def prefill_budget(self, decode_batch: int) -> int:
        return self.max_num_batched_tokens - decode_batch * self.tokens_per_decode

    def never_admissible(self, final_len: int) -> str:
        if not self.chunks_prompts and final_len > self.max_num_batched_tokens:
            return (
                f"cannot be prefilled in one iteration (max_num_batched_tokens={self.max_num_batched_tokens:,}, "
                "chunked prefill off)"
            )
        return ""

    def admit(
        self, engine: SchedulingEngine, budget: int, chunks: list[tuple[int, int]]
    ) -> tuple[int, int, str]:
        """Admit from the head of the queue while the budget, ``max_num_seqs`` and the policy allow."""
        seen_until_s = engine.scheduled_at()
        swap_in_blocks = 0
        budget_at_start = budget
        waiting = engine.waiting
        while True:
            if not waiting:
                return budget, swap_in_blocks, QUEUE_EMPTY
            if budget <= 0:
                return budget, swap_in_blocks, OUT_OF_BUDGET
            state = waiting[0]
            if state.queued_s > seen_until_s:
                return budget, swap_in_blocks, HEAD_NOT_SEEN
            if not engine.batch_has_room(state.width):
                return budget, swap_in_blocks, HEAD_STUCK
            if state.kv_landed:
                engine.start_landed(state)
                budget = engine.schedule_prefill(state, budget, chunks)
                continue
            content = engine.content_on_admission(state)
            final_len = state.final_len_of(0)
            if not self.chunks_prompts and not state.swapped_tokens and content_length(content) > budget:
                # Without chunked prefill a prompt waits until one iteration's budget holds it. Only
                # a smaller decode batch or an unspent budget can change that.
                return budget, swap_in_blocks, OUT_OF_BUDGET if budget < budget_at_start else HEAD_STUCK
            if not engine.fits_watermark(content, final_len):
                if not engine.admission_failed(state):
                    return budget, swap_in_blocks, HEAD_OUT_OF_MEMORY
                continue
            seq_id = engine.new_seq_id()
            try:
                cached = engine.kv.admit(seq_id, content, final_len, state.request.output_content_id)
            except OutOfKVMemory:
                if not engine.admission_failed(state):
                    return budget, swap_in_blocks, HEAD_OUT_OF_MEMORY
                continue
            if state.remote_kv:
                engine.await_kv(state, seq_id, cached)
                continue  # its blocks, but no compute and no place in the batch yet (vLLM)
            swapped_in = engine.start_running(state, seq_id, cached, content)
            if swapped_in:
                swap_in_blocks += swapped_in
                continue
            budget = engine.schedule_prefill(state, budget, chunks)
