"""``kvsim replay-run``: read a measured run, replay it through the engine, compare, report."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.replay.compare import ScopeComparison, compare, paired_frame, rejection_examples
from sim.replay.figures import write_figures
from sim.replay.measured import MeasuredRun
from sim.replay.report import comparison_document, write_report
from sim.replay.simulate import EXPERIMENT_FILE, SimulatedRun, prepare_replay, simulate
from sim.replay.spec import ReplaySpec, read_run
from sim.storage import check_output_target, config_hash, staged_output_dir

SIMULATION_FOLDER = "simulation"
RESULTS_FOLDER = "results"
MEASURED_FILE = "measured_requests.csv"
PAIRED_FILE = "paired_requests.csv"


@dataclass
class ReplayOutcome:
    run: MeasuredRun
    simulated: SimulatedRun
    scopes: list[ScopeComparison]
    document: dict[str, Any]


def simulation_facts(simulated: SimulatedRun, out_dir: Path, client_overhead_s: float) -> dict[str, Any]:
    """What the report says of the simulation that ran."""
    config = simulated.config
    summary = simulated.result.summary
    engine = config.engine
    blocks = engine.num_gpu_blocks_override
    return {
        "model": config.model,
        "gpu": config.gpu if isinstance(config.gpu, str) else dict(config.gpu),
        "policy": summary["policy"],
        "cost_model": summary["cost_model"],
        "cost_model_error_band": summary["cost_model_error_band"],
        "client_overhead_s": client_overhead_s,
        "kv_pool_tokens": summary["kv_pool_tokens"],
        "data_parallel_size": summary["data_parallel_size"],
        "expert_parallel_size": summary["expert_parallel_size"],
        "kv_pool_source": f"the run's {blocks:,} recorded GPU blocks"
        if blocks
        else "sized from the GPU and model",
        "max_num_seqs": engine.max_num_seqs,
        "max_num_batched_tokens": engine.max_num_batched_tokens,
        "block_size": engine.block_size,
        "enable_chunked_prefill": engine.enable_chunked_prefill,
        "async_scheduling": engine.async_scheduling,
        "preemptions": summary["preemptions"],
        "prefix_cache_hit_rate": summary["prefix_cache_hit_rate"],
        "unfinished": summary["requests_total"] - summary["requests_finished"],
        "engine_wall_s": summary["wall_s"],
        "engine_build": summary["engine_build"],
        "experiment": str(out_dir / SIMULATION_FOLDER / EXPERIMENT_FILE),
    }


def replay_run(
    spec: ReplaySpec,
    base_dir: Path,
    out_dir: Path,
    *,
    log: Callable[[str], None] | None = None,
) -> ReplayOutcome:
    """Replay the run ``spec`` names and write the report into ``out_dir`` (staged: a failure leaves
    nothing behind). Every input is read and checked before the simulation starts."""
    check_output_target(out_dir, "replay")
    run = read_run(spec, base_dir)
    with staged_output_dir(out_dir, "replay", config_hash(spec.model_dump(mode="json")), log=log) as staging:
        prepared = prepare_replay(run, spec, staging / SIMULATION_FOLDER)
        simulated = simulate(prepared, staging / SIMULATION_FOLDER / RESULTS_FOLDER)
        overhead = float(simulated.requests["client_overhead_s"].max()) if len(simulated.requests) else 0.0
        paired = paired_frame(run, simulated.requests)
        scopes = compare(run, paired)
        facts = simulation_facts(simulated, out_dir, overhead)
        facts["rejection_examples"] = rejection_examples(paired)
        document = comparison_document(run, scopes, facts)
        run.requests.to_csv(staging / MEASURED_FILE, index=False)
        paired.to_csv(staging / PAIRED_FILE, index=False)
        figures = write_figures(run, paired, simulated.timeseries, staging / "figures")
        write_report(staging, document, figures)
    return ReplayOutcome(run, simulated, scopes, document)
