"""SGLang's scheduler (``engine.scheduler: sglang``): queue order, admission budget, retraction.

Followed from sgl-project/sglang 0.5.x, ``python/sglang/srt/managers/`` (no code copied):

- **Order** (``schedule_policy.py``, ``SchedulePolicy.calc_priority``): ``fcfs`` keeps arrival order;
  ``lpm`` matches every waiting prompt in the cache (``_compute_prefix_matches``; a match splits and
  refreshes the tree, :meth:`KVCachePolicy.match`) and sorts the queue by matched tokens, longest
  first (a stable sort), unless more than :data:`LPM_QUEUE_LIMIT` wait
  (``_determine_active_policy``). In-batch prefix caching holds some back to the queue's end: one
  that hits at most 32 cached tokens and shares at least 32 leading tokens with a request ahead of
  it (the requests so matched and not held back, kept in a trie of the round,
  ``waiting_queue_radix_tree``), so that requests arriving together with one new prefix do not all
  prefill it in one round (SGLang inserts a prompt into its tree after its batch ran). With no
  prefix cache ``lpm`` is FCFS. Under ``fcfs`` each request is matched when the admission loop
  reaches it (``get_new_batch_prefill`` calls ``Req.init_next_round_input``).
- **Admission** (``PrefillAdder.add_one_req``): a request is admitted while its new tokens plus
  ``min(max_new_tokens - generated, 4096)`` stay below the *remaining total tokens*: free plus
  evictable slots (less the cached tokens of its own hit that no running request holds: SGLang
  locks the matched node, ``_lock_node``, before it checks) minus, for every running request,
  ``min(max_new_tokens - generated, 4096) x new_token_ratio``
  (``_get_running_request_total_token_offset``), minus what this round admitted;
  and while this iteration's prompt tokens stay within ``max_prefill_tokens`` (``rem_input_tokens``;
  the first admission may exceed it) and ``chunked_prefill_size`` (``rem_chunk_tokens``): a request
  that does not fit the chunk left is truncated to it and becomes the one chunked request. The loop
  stops at the first request refused (``NO_TOKEN`` / ``OTHER``).
- **new_token_ratio** (``Scheduler.init_new_token_ratio``, ``update_running_batch``): starts at
  ``min(0.7 x schedule_conservativeness, 1)``, decays by ``(start - 0.14 x start) / 600`` at every
  decode step down to ``0.14 x start``; after a retraction it is reset to
  ``min(1, (decoded + 20 x batch) / sum of max_new_tokens)`` over the requests left
  (``ScheduleBatch.retract_decode``).
- **Prefill batches first** (``Scheduler.get_next_batch_to_run``): an iteration runs a prefill batch
  whenever the admission round (or the chunked prompt in progress) has one, and the decoding requests
  wait for it; it decodes only when there is nothing to prefill. With ``--enable-mixed-chunk``
  (``engine.enable_mixed_chunk``) the decoding requests join the prefill batch instead
  (``mix_with_running``), their tokens taken out of its budgets (``mixed_with_decode_tokens``).
- **batch_is_full**: a request refused for KV tokens (``AddReqResult.NO_TOKEN``) stops admissions until
  a running request leaves the batch (it finishes or is retracted: ``update_running_batch`` and the
  merge of the last batch reset the flag when the batch shrinks); only a prompt in progress is
  prefilled meanwhile, beside which the queue is tried (``get_new_batch_prefill``).
- **Retraction** (``ScheduleBatch.retract_decode``): when decode runs out of memory, requests are
  retracted fewest decoded tokens first, then longest prompt (ties: the newest), until the pool has
  20 tokens (``SGLANG_RETRACT_DECODE_STEPS``) per request left, at least one, never the last. Their KV
  is freed without entering the cache and they rejoin the queue at its back
  (``_extend_requests_to_queue``), to be recomputed.

A request with ``n > 1`` samples is forked after its prompt, as under vLLM; SGLang sends its ``n``
samples as ``n`` requests once the prompt is cached, so each sample is budgeted, reserved and given
retraction room as a request of its own.

Where kvsim's engine still differs from SGLang's (documented in docs/modelling.md): a prompt's KV is
allocated whole at admission, not chunk by chunk; budgets are in tokens, not rounded to pages.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from mypy_extensions import mypyc_attr

from policies.base import OutOfKVMemory
from sim.engine.schedulers.base import (
    HEAD_LATCHED,
    HEAD_NOT_SEEN,
    HEAD_OUT_OF_MEMORY,
    HEAD_OVER_BUDGET,
    HEAD_STUCK,
    OUT_OF_BUDGET,
    QUEUE_EMPTY,
    Scheduler,
    SchedulingEngine,
)
from token_content import TokenContent, content_length
from token_content.prefixes import ContentPrefixes

if TYPE_CHECKING:
    from sim.engine.decoding import RequestState
    from sim.engine.knobs import EngineKnobs

INIT_NEW_TOKEN_RATIO: Final = 0.7
"""``SGLANG_INIT_NEW_TOKEN_RATIO`` (``environ.py``): new_token_ratio before conservativeness."""
MIN_NEW_TOKEN_RATIO_FACTOR: Final = 0.14
"""``SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR``: the floor, as a fraction of the initial ratio."""
NEW_TOKEN_RATIO_DECAY_STEPS: Final = 600
"""``SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS``: decode steps from the initial ratio to the floor."""
RETRACT_DECODE_STEPS: Final = 20
"""``SGLANG_RETRACT_DECODE_STEPS``: tokens per request retraction leaves room for."""
CLIP_MAX_NEW_TOKENS: Final = 4096
"""``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``: the most output tokens a request is budgeted for."""
LPM_QUEUE_LIMIT: Final = 128
"""``SchedulePolicy._determine_active_policy``: ``lpm`` falls back to FCFS above this many waiting."""
UNLIMITED: Final = 1 << 61  # (below 2**62: compiled, a native int, not a boxed one)


def chunked_prefill_size_for(memory_bytes: int) -> int:
    """SGLang's default ``chunked_prefill_size`` for a GPU of ``memory_bytes`` (``server_args.py``,
    ``ServerArgs._handle_gpu_memory_settings``; it compares MiB)."""
    mebibytes = memory_bytes / 2**20
    if mebibytes < 35 * 1024:
        return 2048
    if mebibytes < 160 * 1024:
        return 8192
    return 16384


@mypyc_attr(allow_interpreted_subclasses=True)
class SGLangScheduler(Scheduler):
    """SGLang's admission, order, budget and retraction; the engine core keeps everything else
    (decode clock, prefill chunks, completions) to itself."""

    def __init__(self, knobs: EngineKnobs):
        super().__init__(knobs)
        self.lpm = knobs.schedule_policy == "lpm"
        # In-batch prefix caching (IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD, _DEPRIORITIZE_THRESHOLD):
        # a waiting request whose cache hit is at most the first is checked against the requests
        # ahead of it; sharing at least the second with one of them holds it back for the round.
        self.in_batch_check_tokens = knobs.in_batch_check_tokens
        self.in_batch_deprioritize_tokens = knobs.in_batch_deprioritize_tokens
        self.max_prefill_tokens = knobs.max_prefill_tokens
        self.chunked_prefill_size = knobs.chunked_prefill_size if knobs.chunked_prefill_size > 0 else 0
        self.init_new_token_ratio = min(INIT_NEW_TOKEN_RATIO * knobs.schedule_conservativeness, 1.0)
        self.min_new_token_ratio = min(self.init_new_token_ratio * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.new_token_ratio_decay = (
            self.init_new_token_ratio - self.min_new_token_ratio
        ) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = self.init_new_token_ratio
        # A prompt may be prefilled over several iterations when chunked_prefill_size > 0.
        self.chunks_prompts = self.chunked_prefill_size > 0
        self.mixes_batches = knobs.enable_mixed_chunk
        # (get_next_batch_to_run inserts the chunked request's chunk, process_batch_result_prefill
        # every other prompt of the batch: after it ran.)
        self.caches_chunks_after_run = True
        # batch_is_full after a refusal for KV tokens, with the running requests it was set at: it
        # stays set until fewer run (one finished or was retracted).
        self.batch_is_full = False
        self.running_when_full = 0

    def prefill_budget(self, decode_batch: int) -> int:
        """Prompt tokens this iteration may prefill: the chunk size, less the decode tokens mixed into
        the batch when they are (``PrefillAdder``'s ``rem_chunk_tokens`` with
        ``mixed_with_decode_tokens``)."""
        if not self.chunks_prompts:
            return UNLIMITED
        return self.chunked_prefill_size - self._mixed_decode_tokens(decode_batch)

    def _mixed_decode_tokens(self, decode_batch: int) -> int:
        return decode_batch if self.mixes_batches else 0

    # ------------------------------------------------------------------------- new_token_ratio
    def decode_steps(self, steps: int) -> None:
        """``steps`` decode steps ran without a retraction: the ratio decays by as many decrements."""
        self.new_token_ratio = max(
            self.new_token_ratio - steps * self.new_token_ratio_decay, self.min_new_token_ratio
        )

    def reset_after_retraction(self, engine: SchedulingEngine) -> None:
        """``retract_decode``'s new estimate from the decoding requests left, a sample each (SGLang
        runs a request's ``n`` samples as ``n`` requests)."""
        decoded = max_new = samples = 0
        for state in engine.running:
            if state.decoding:
                decoded += engine.clock.generated(state) * state.width
                max_new += sum(state.sample_lens)
                samples += state.width
        estimate = (decoded + RETRACT_DECODE_STEPS * samples) / max_new if max_new else 1.0
        self.new_token_ratio = min(1.0, estimate)

    # ------------------------------------------------------------------------------- retraction
    def preemption_victim(self, engine: SchedulingEngine) -> RequestState:
        """The running request ``retract_decode`` takes first: fewest decoded tokens, then longest
        prompt; among equals the newest (its sort is stable and it pops from the end)."""
        clock = engine.clock
        victim = engine.running[-1]
        for state in reversed(engine.running):
            key = (clock.generated(state), -state.request.prompt_len)
            if key < (clock.generated(victim), -victim.request.prompt_len):
                victim = state
        return victim

    @staticmethod
    def needs_more_room(engine: SchedulingEngine) -> bool:
        """After a retraction: does the pool still hold fewer than 20 tokens per running sample (an
        SGLang request)? ``retract_decode`` goes on retracting then, but never the last request."""
        if len(engine.running) <= 1:
            return False
        samples = sum(state.width for state in engine.running)
        return engine.kv.available_slots() < RETRACT_DECODE_STEPS * samples

    def requeue(self, engine: SchedulingEngine, state: RequestState) -> None:
        """A retracted request rejoins the queue at its back (``_extend_requests_to_queue``), ahead
        of the requests the scheduler has not received yet (:meth:`_set_aside_unseen`): they join
        the queue when it receives them."""
        unseen = self._set_aside_unseen(engine)
        engine.waiting.append(state)
        engine.waiting.extend(unseen)

    def after_preemption(self, engine: SchedulingEngine) -> None:
        """Decode ran out of memory and requests were retracted until it fit: ``retract_decode``
        goes on until the pool has room for 20 more tokens per request left, then re-estimates
        ``new_token_ratio`` from them. (Found out while growing: the requests retracted here leave
        without this iteration's token, as SGLang retracts before the step; one whose last token
        it was would otherwise come back with its whole output as prompt.)"""
        while self.needs_more_room(engine):
            engine.preempt(self.preemption_victim(engine), engine.clock.now - 1)
        self.reset_after_retraction(engine)

    # -------------------------------------------------------------------------------- admission
    def order_queue(self, engine: SchedulingEngine) -> dict[int, int]:
        """``calc_priority``: under ``lpm`` (and at most 128 waiting) every waiting prompt is matched
        and the queue sorted by hit, longest first, the requests in-batch prefix caching holds back
        last (``_compute_prefix_matches``: one whose hit is at most ``in_batch_check_tokens`` and
        which shares at least ``in_batch_deprioritize_tokens`` with a request ahead of it
        that was not held back, so that one prefills the shared prefix and the others hit it in a
        later round). Returns the hits found, by request id."""
        waiting = engine.waiting
        if not self.lpm or len(waiting) > LPM_QUEUE_LIMIT:
            return {}
        kv = engine.kv
        hits: dict[int, int] = {}
        # With no prefix cache SGLang runs FCFS (``_validate_and_adjust_policy``), and every hit is 0.
        in_batch = ContentPrefixes() if kv.may_share() else None
        deprioritized: set[int] = set()
        for state in waiting:
            content = engine.content_on_admission(state)
            request_id = state.request.request_id
            hit = hits[request_id] = kv.match(content).cached_tokens
            if in_batch is not None and hit <= self.in_batch_check_tokens:
                prompt_len = content_length(content)
                if in_batch.longest_shared(content, prompt_len) >= self.in_batch_deprioritize_tokens:
                    deprioritized.add(request_id)
                else:
                    in_batch.add(content, prompt_len)
        ordered = sorted(
            waiting,
            key=lambda state: (
                UNLIMITED if state.request.request_id in deprioritized else -hits[state.request.request_id]
            ),
        )
        waiting.clear()
        waiting.extend(ordered)
        return hits

    def running_reservation(self, engine: SchedulingEngine) -> float:
        """Tokens the running requests are expected to still decode: ``min(max_new - generated,
        4096) x new_token_ratio`` per sample (``_get_running_request_total_token_offset``)."""
        total = 0.0
        for state in engine.running:
            total += self.budgeted_output(engine, state) * self.new_token_ratio
        return total

    @staticmethod
    def new_tokens(
        engine: SchedulingEngine, state: RequestState, content: TokenContent, hits: dict[int, int]
    ) -> int:
        """Prompt tokens a waiting request must prefill as ``add_one_req`` sees them (its
        ``extend_input_len``): matched now, unless ordering the queue just matched it
        (``init_next_round_input(None)`` then)."""
        hit = hits.get(state.request.request_id)
        if hit is None:
            hit = engine.kv.match(content).cached_tokens
        return content_length(content) - hit

    @staticmethod
    def budgeted_output(engine: SchedulingEngine, state: RequestState) -> int:
        """Output tokens ``add_one_req`` budgets a request for: ``min(max_new - generated, 4096)`` for
        each of its samples still to finish, which SGLang runs as requests of their own (``n > 1``
        sends ``n`` copies after the prompt is cached)."""
        generated = engine.clock.generated(state)
        total = 0
        for length in state.sample_lens:
            left = length - generated
            total += CLIP_MAX_NEW_TOKENS if left > CLIP_MAX_NEW_TOKENS else left if left > 0 else 0
        return total

    def admit(
        self, engine: SchedulingEngine, budget: int, chunks: list[tuple[int, int]]
    ) -> tuple[int, int, str]:
        """SGLang's admission round (``get_new_batch_prefill`` / ``PrefillAdder``); ``budget``: the
        chunk budget the prompts in progress left. (No swap: nothing is swapped in.)"""
        self.rematches = False
        if not engine.waiting:
            return budget, 0, QUEUE_EMPTY
        if self.chunks_prompts and budget <= 0:
            return budget, 0, OUT_OF_BUDGET  # the decode batch took the whole chunk
        if not engine.batch_has_room(1):
            return budget, 0, HEAD_STUCK  # SGLang stops before ordering (batch_is_full)
        if self._still_full(engine) and not chunks:
            return budget, 0, HEAD_LATCHED
        unseen = self._set_aside_unseen(engine)
        stop = HEAD_NOT_SEEN  # (every waiting request came after this iteration was scheduled)
        if engine.waiting:
            hits = self.order_queue(engine)
            budget, stop = self._admission_round(engine, budget, chunks, hits)
            self.rematches = bool(engine.waiting) and stop != QUEUE_EMPTY
            if unseen and stop == QUEUE_EMPTY:
                stop = HEAD_NOT_SEEN  # the next iteration sees them
        if stop in (HEAD_OVER_BUDGET, HEAD_OUT_OF_MEMORY):
            self.batch_is_full = True  # (AddReqResult.NO_TOKEN)
        if self.batch_is_full:
            self.running_when_full = len(engine.running)
        if not engine.waiting and not unseen:
            # The round took the whole queue (its last request may have spent the budget): only an
            # arrival can change what the next rounds do, as when it found the queue empty.
            stop = QUEUE_EMPTY
        engine.waiting.extend(unseen)
        return budget, 0, stop

    def _still_full(self, engine: SchedulingEngine) -> bool:
        """Is ``batch_is_full`` still set? A running request that left since resets it (and an empty
        batch: nothing is left to leave)."""
        if self.batch_is_full and (len(engine.running) < self.running_when_full or not engine.running):
            self.batch_is_full = False
        return self.batch_is_full

    @staticmethod
    def _set_aside_unseen(engine: SchedulingEngine) -> list[RequestState]:
        """Take the requests queued after this iteration was scheduled off the queue's back and return
        them, oldest first. With the overlap scheduler (``engine.async_scheduling``) SGLang's event
        loop receives requests (``recv_requests``) before it schedules a batch, while the batch before
        it runs: a request that arrives later waits for the next batch, and is not in the queue this
        round orders and admits from. They are always the queue's back: arrivals are appended, and a
        retracted request is put back ahead of them (:meth:`requeue`)."""
        waiting = engine.waiting
        if not waiting:
            return []
        seen_until_s = engine.scheduled_at()
        unseen: list[RequestState] = []
        while waiting and waiting[-1].queued_s > seen_until_s:
            unseen.append(waiting.pop())
        unseen.reverse()
        return unseen

    def _admission_round(
        self, engine: SchedulingEngine, chunk_left: int, chunks: list[tuple[int, int]], hits: dict[int, int]
    ) -> tuple[int, str]:
        """``add_one_req`` for each waiting request in order, until one is refused; returns the
        chunk budget left and why it stopped."""
        input_left = (
            self.max_prefill_tokens
            - self._mixed_decode_tokens(engine.clock.sequences)
            - sum(tokens for tokens, _ in chunks)
        )
        reserved = self.running_reservation(engine)
        kv = engine.kv
        admitted = 0
        while engine.waiting:
            state = engine.waiting[0]
            if not engine.batch_has_room(state.width):
                return chunk_left, HEAD_STUCK
            content = engine.content_on_admission(state)
            new_tokens = self.new_tokens(engine, state, content, hits)
            output = self.budgeted_output(engine, state)
            # (add_one_req locks the matched prefix before it checks: its tokens stop being evictable)
            if new_tokens + output >= kv.available_slots_with_hit_locked(content) - reserved:
                if engine.admission_failed(state):
                    continue  # rejected, or failed (on_oom: fail)
                return chunk_left, HEAD_OVER_BUDGET
            if admitted and new_tokens >= input_left:
                return chunk_left, OUT_OF_BUDGET  # max_prefill_tokens
            whole = not self.chunks_prompts or new_tokens <= chunk_left
            seq_id = engine.new_seq_id()
            try:
                cached = kv.admit(seq_id, content, state.final_len_of(0), state.request.output_content_id)
            except OutOfKVMemory:
                if engine.admission_failed(state):
                    continue
                return chunk_left, HEAD_OUT_OF_MEMORY
            engine.start_running(state, seq_id, cached, content)
            before = state.prefilled
            chunk_left = engine.schedule_prefill(state, chunk_left, chunks)
            input_left -= state.prefilled - before
            # a chunked prompt is budgeted for its output at its last chunk
            reserved += output if whole else 0
            admitted += 1
            if kv.available_slots() - reserved <= 0:
                return chunk_left, HEAD_OVER_BUDGET
            if input_left <= 0 or chunk_left <= 0:
                return chunk_left, OUT_OF_BUDGET
        return chunk_left, QUEUE_EMPTY
