"""The engine's settings, as the runner resolves them from an experiment's ``engine:`` section."""

from __future__ import annotations

from dataclasses import dataclass

from sim.engine.speculation import SpeculativeDecoding


@dataclass(frozen=True)
class EngineKnobs:
    """Scheduler knobs, named and defaulted as vLLM's engine arguments where vLLM has them."""

    max_model_len: int
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_chunked_prefill: bool = True
    preemption_mode: str = "recompute"  # recompute | swap
    swap_space_blocks: int = 0  # host pool for preemption_mode=swap, in blocks
    watermark: float = 0.0  # fraction of the pool kept free at admission (vLLM V0 used 0.01)
    # queue: a failed admission waits; fail: a request whose first admission fails fails (the seeds' OOM
    # story). A preempted request waits to come back either way.
    on_oom: str = "queue"
    beam_reparent_prob: float = 0.15  # q: per beam and decode step, the beam is replaced by a survivor's fork
    step_mode: str = "skip"  # skip | single
    client_overhead_s: float = 0.0  # outside the engine, added to every request's TTFT and E2E
    # vLLM's --async-scheduling (scheduler vllm): iteration k+1 is scheduled while iteration k runs,
    # so a request queued during iteration k is first scheduled in iteration k+2.
    async_scheduling: bool = False
    # scheduler sglang (sim/engine/schedulers/sglang.py; SGLang's server_args.py names and defaults):
    scheduler: str = "vllm"  # vllm | sglang
    schedule_policy: str = "fcfs"  # fcfs | lpm
    # lpm's in-batch prefix caching (IN_BATCH_PREFIX_CACHING_CHECK / _DEPRIORITIZE_THRESHOLD)
    in_batch_check_tokens: int = 32
    in_batch_deprioritize_tokens: int = 32
    schedule_conservativeness: float = 1.0
    chunked_prefill_size: int = 8192  # -1: no chunking
    max_prefill_tokens: int = 16384
    enable_mixed_chunk: bool = False  # else prefill batches first, decoding requests waiting for them
    # Speculative decoding (engine.speculative): drafts per step, their acceptance, the lookahead slots.
    speculative: SpeculativeDecoding | None = None
