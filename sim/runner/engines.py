"""One engine (or cluster replica) for a prepared variant: its knobs from the engine section, and the
shared step clock of expert parallelism."""

from __future__ import annotations

from typing import Any

import simpy

from policies.base import KVCachePolicy
from sim.config import ExperimentConfig
from sim.costs.core import CostModel
from sim.engine.core import Engine, EngineKnobs
from sim.engine.lockstep import LockstepGroup
from sim.engine.schedulers.sglang import chunked_prefill_size_for
from sim.hardware.gpus import resolve_gpu
from sim.kv.allocators import SGLangMambaLayout
from sim.kv.coordinator import KVCoordinator
from sim.offload import host_load_seconds
from sim.outputs.sinks import OutputSink
from sim.runner.prepared import GIB, PreparedVariant


def _max_num_seqs(prepared: PreparedVariant) -> int:
    """``engine.max_num_seqs``, capped where SGLang caps its running requests by its Mamba pool
    (``sglang-hybrid`` on a Mamba model: ``sim/hardware/sglang_mamba_capacity.py``)."""
    if isinstance(prepared.hybrid, SGLangMambaLayout):
        return min(prepared.engine.max_num_seqs, prepared.hybrid.max_running_requests)
    return prepared.engine.max_num_seqs


def runs_async_scheduling(prepared: PreparedVariant) -> bool:
    """``engine.async_scheduling``, off where SGLang turns its overlap scheduler off (``sglang-hybrid``
    on a Mamba model with the radix cache's ``no_buffer`` strategy)."""
    if isinstance(prepared.hybrid, SGLangMambaLayout):
        return prepared.engine.async_scheduling and prepared.hybrid.capacity.overlap
    return prepared.engine.async_scheduling


def make_engine(
    config: ExperimentConfig,
    prepared: PreparedVariant,
    policy: KVCachePolicy | KVCoordinator,
    requests,
    sink: OutputSink,
    **engine_options: Any,
) -> Engine:
    """One engine (or cluster replica: ``engine_options`` carry its clock and hooks) for the variant."""
    engine_config = prepared.engine
    # (The pool's block, which a Mamba hybrid raises above engine.block_size.)
    block_bytes = prepared.pool.block_size * prepared.pool.kv_bytes_per_token
    knobs = EngineKnobs(
        max_model_len=prepared.max_model_len,
        max_num_seqs=_max_num_seqs(prepared),
        max_num_batched_tokens=engine_config.max_num_batched_tokens,
        enable_chunked_prefill=engine_config.enable_chunked_prefill,
        preemption_mode=engine_config.preemption_mode,
        swap_space_blocks=int(engine_config.swap_space * GIB // block_bytes),
        watermark=engine_config.watermark,
        on_oom=engine_config.on_oom,
        beam_reparent_prob=engine_config.beam_reparent_prob,
        scheduler=engine_config.scheduler,
        schedule_policy=engine_config.schedule_policy,
        in_batch_check_tokens=engine_config.in_batch_prefix_check_tokens,
        in_batch_deprioritize_tokens=engine_config.in_batch_prefix_deprioritize_tokens,
        schedule_conservativeness=engine_config.schedule_conservativeness,
        chunked_prefill_size=(
            chunked_prefill_size_for(resolve_gpu(config.gpu).memory_bytes)
            if engine_config.chunked_prefill_size is None
            else engine_config.chunked_prefill_size
        ),
        max_prefill_tokens=engine_config.max_prefill_tokens,
        enable_mixed_chunk=engine_config.enable_mixed_chunk,
        # a lockstep group's ranks step together, one iteration at a time (sim/engine/lockstep.py)
        step_mode="single" if prepared.lockstep else engine_config.step_mode,
        async_scheduling=runs_async_scheduling(prepared),
        speculative=prepared.speculative,
        client_overhead_s=(
            prepared.costs.request_overhead_s
            if engine_config.client_overhead_s is None
            else engine_config.client_overhead_s
        ),
    )
    return Engine(
        policy,
        prepared.costs,
        knobs,
        requests,
        seed=config.seed,
        block_size=prepared.pool.block_size,
        sink=sink,
        host_load_s=(
            host_load_seconds(prepared.offload, prepared.costs, block_bytes) if prepared.offload else None
        ),
        **engine_options,
    )


def lockstep_group(env: simpy.Environment, ranks: int, costs: CostModel) -> LockstepGroup:
    expert_parallel = costs.expert_parallel
    assert expert_parallel is not None
    return LockstepGroup(env, ranks, expert_parallel.step_s)
