"""Run an experiment: every variant is prepared and checked (``prepare``: ``instance``,
``disaggregated``, ``hybrid``, ``checks``, ``resolve``, ``speculative``), then replays the identical
request stream (``run``: ``engines``, ``clusters``) and is summarised (``summary``); results go to one
folder. The names below are the runner's interface to the commands, planning, replays and notebooks."""

from sim.runner.checks import (
    check_engine,
    check_parallelism,
    check_pool_holds_a_request,
    check_reservation_fits,
    has_prefix_lookup,
    policy_options,
    unknown_options_error,
)
from sim.runner.instance import attach_host_tier, pin_prefixes
from sim.runner.prepare import prepare_experiment
from sim.runner.prepared import PreparedExperiment, PreparedVariant, VariantResult
from sim.runner.resolve import (
    engine_cost_model,
    engine_draft,
    engine_expert_parallel_size,
    engine_pool,
    policy_name_for,
    resolve_hardware,
    size_pool,
)
from sim.runner.run import RunWatch, run_experiment, run_prepared, run_variant
from sim.runner.speculative import (
    read_acceptance_histogram,
    speculation_problem,
    speculative_knobs,
    speculative_summary,
)
from sim.runner.summary import summarize

__all__ = [
    "PreparedExperiment",
    "PreparedVariant",
    "RunWatch",
    "VariantResult",
    "attach_host_tier",
    "check_engine",
    "check_parallelism",
    "check_pool_holds_a_request",
    "check_reservation_fits",
    "engine_cost_model",
    "engine_draft",
    "engine_expert_parallel_size",
    "engine_pool",
    "has_prefix_lookup",
    "pin_prefixes",
    "policy_name_for",
    "policy_options",
    "prepare_experiment",
    "read_acceptance_histogram",
    "resolve_hardware",
    "run_experiment",
    "run_prepared",
    "run_variant",
    "size_pool",
    "speculation_problem",
    "speculative_knobs",
    "speculative_summary",
    "summarize",
    "unknown_options_error",
]
