"""What differs between the servers' schedulers, behind one interface the engine core holds.

The engine core (``sim/engine/core.py``) runs the iteration loop: decode growth, the chunks of the
prompts in progress, completions, event skipping. At a few points it asks its scheduler:

- :meth:`Scheduler.prefill_budget`: prompt tokens an iteration beside a decode batch may prefill;
- :attr:`Scheduler.mixes_batches`: whether an iteration decodes and prefills together, or prefill
  batches go first and the decoding requests wait for them (SGLang without mixed chunks);
- :meth:`Scheduler.admit`: one admission round over the waiting queue (its order, the token and
  sequence budgets, what the policy can hold), returning why it stopped (:data:`QUEUE_EMPTY` ...);
- :meth:`Scheduler.preemption_victim`, :meth:`Scheduler.requeue`, :meth:`Scheduler.after_preemption`:
  who leaves when decode runs out of memory, where they wait, what else follows (SGLang's retraction);
- :meth:`Scheduler.decode_steps`: per-step bookkeeping (SGLang's ``new_token_ratio``);
- :attr:`Scheduler.caches_chunks_after_run`: when a scheduled prompt chunk enters the prefix cache.

A scheduler works on the engine only through :class:`SchedulingEngine`, the services the core
offers (admit the queue's head, schedule its prefill, preempt, ...): this module imports nothing of
the core, so the imports run one way. A new scheduler is one module with a subclass of
:class:`Scheduler` and its name in :data:`sim.engine.schedulers.SCHEDULERS`.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Final

from mypy_extensions import mypyc_attr

from token_content import TokenContent

if TYPE_CHECKING:
    from sim.engine.decoding import DecodeClock, RequestState
    from sim.engine.knobs import EngineKnobs
    from sim.kv.coordinator import KVCoordinator


# Why the admission round of an iteration stopped: what the next iterations' admissions depend on.
QUEUE_EMPTY: Final = "empty"  # an arrival could be admitted at the next iteration with a free token budget
OUT_OF_BUDGET: Final = "budget"  # the head was not tried: any iteration with a free token budget tries it
HEAD_STUCK: Final = "stuck"  # the head waits for a sequence to leave (max_num_seqs) or a smaller decode batch
HEAD_OUT_OF_MEMORY: Final = "memory"  # stuck: the head was tried and does not fit in KV memory now
# (scheduler sglang) the head is over the KV token budget, which new_token_ratio changes every step
HEAD_OVER_BUDGET: Final = "kv budget"
# async scheduling: the head was queued after this iteration was scheduled; the next one sees it
HEAD_NOT_SEEN: Final = "not seen"
NOT_TRIED: Final = "not tried"  # a preemption this iteration: no admission (vLLM), the batch changes anyway
# (scheduler sglang) refused for KV memory before: nothing is tried until a running request leaves
HEAD_LATCHED: Final = "latched"
NEXT_TRIES_HEAD = (OUT_OF_BUDGET, HEAD_OVER_BUDGET, HEAD_NOT_SEEN)  # so no jump past the next iteration


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled, it still takes test doubles written in Python
class SchedulingEngine:
    """The engine core as a scheduler sees it: its queues and pool, and the steps of admitting and
    preempting a request, which keep the core's own books (batch counts, records, prefill chunks).
    The engine's admission desk (``sim/engine/admission.py``) is one. (A base class, not a protocol:
    compiled, a scheduler's calls through a protocol were Python calls, several per admission.)"""

    waiting: deque[RequestState]
    running: list[RequestState]
    kv: KVCoordinator
    clock: DecodeClock

    def batch_has_room(self, width: int) -> bool:
        """Whether ``width`` more sequences stay within ``max_num_seqs``."""
        raise NotImplementedError

    def content_on_admission(self, state: RequestState) -> TokenContent:
        raise NotImplementedError

    def fits_watermark(self, content: TokenContent, final_len: int) -> bool:
        raise NotImplementedError

    def admission_failed(self, state: RequestState) -> bool:
        """The queue's head does not fit now: True when it was removed (rejected or failed)."""
        raise NotImplementedError

    def new_seq_id(self) -> int:
        raise NotImplementedError

    def start_running(self, state: RequestState, seq_id: int, cached: int, content: TokenContent) -> int:
        """The head, admitted as ``seq_id``, leaves the queue and runs; returns blocks swapped in."""
        raise NotImplementedError

    def schedule_prefill(self, state: RequestState, budget: int, chunks: list[tuple[int, int]]) -> int:
        """Schedule ``state``'s next prompt chunk in this iteration; returns the budget left."""
        raise NotImplementedError

    def await_kv(self, state: RequestState, seq_id: int, cached: int) -> None:
        raise NotImplementedError

    def start_landed(self, state: RequestState) -> None:
        raise NotImplementedError

    def scheduled_at(self) -> float:
        """When the iteration starting now was scheduled (earlier under async scheduling)."""
        raise NotImplementedError

    def preempt(self, state: RequestState, at_clock: int) -> int:
        """Take ``state`` off the GPU; returns blocks swapped out."""
        raise NotImplementedError


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled, it still takes schedulers written in Python
class Scheduler:
    """The base. Subclasses implement :meth:`prefill_budget` and :meth:`admit`; the rest defaults to
    what vLLM does (preempt the newest request, requeue it at the front) and is overridden where a
    server differs."""

    def __init__(self, knobs: EngineKnobs):
        self.chunks_prompts = knobs.enable_chunked_prefill
        """Whether a prompt may be prefilled over several iterations."""
        self.mixes_batches = True
        """An iteration decodes the running batch and prefills prompts beside it (vLLM; SGLang with
        ``--enable-mixed-chunk``). False: an iteration that prefills anything decodes nothing, and
        one decodes only when nothing can be prefilled (SGLang's default, prefill batches first)."""
        self.rematches = False
        """The last admission round matched waiting prompts in the cache and the queue still waits:
        the next iteration matches them again (a cache access), so the engine may not jump past it."""
        self.caches_chunks_after_run = False
        """When a prompt's scheduled chunk becomes hittable: False, as it is scheduled (vLLM's
        ``allocate_slots`` caches its blocks then); True, once its batch has run (SGLang's
        ``cache_unfinished_req``), so a request admitted in the same round cannot hit it."""

    def prefill_budget(self, decode_batch: int) -> int:
        """Prompt tokens an iteration that decodes ``decode_batch`` sequences may prefill."""
        raise NotImplementedError

    def admit(
        self, engine: SchedulingEngine, budget: int, chunks: list[tuple[int, int]]
    ) -> tuple[int, int, str]:
        """One admission round with ``budget`` prompt tokens left: admits from the waiting queue,
        appending the prefill chunks it schedules to ``chunks``. Returns the budget left, blocks
        swapped in, and why it stopped."""
        raise NotImplementedError

    def never_admissible(self, final_len: int) -> str:
        """Why a request of ``final_len`` tokens (prompt and output) could never be scheduled, beyond
        what any scheduler refuses (the model's length, the pool): "" when it can be."""
        return ""

    def preemption_victim(self, engine: SchedulingEngine) -> RequestState:
        """The running request that leaves when decode runs out of memory: the newest admitted."""
        return engine.running[-1]

    def requeue(self, engine: SchedulingEngine, state: RequestState) -> None:
        """Where a preempted request waits: at the queue's front (it was admitted before the rest)."""
        engine.waiting.appendleft(state)

    def after_preemption(self, engine: SchedulingEngine) -> None:
        """Decode ran out of memory and requests were preempted until it fit: nothing more."""

    def decode_steps(self, steps: int) -> None:
        """``steps`` decode steps ran without a preemption: nothing to book."""
