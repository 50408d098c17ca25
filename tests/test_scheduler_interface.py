"""The engine knows its scheduler only through ``sim/engine/schedulers/base.py``: a third scheduler
is one class and one name in the registry. Here a shortest-prompt-first one, written against that
interface alone, runs with times worked out by hand; and the core has no branch on which runs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from policies import PoolSpec, make_policy
from sim.engine import schedulers
from sim.engine.core import Engine, EngineKnobs
from sim.engine.schedulers.base import SchedulingEngine
from sim.engine.schedulers.vllm import VLLMScheduler
from tests.engine_helpers import ConstantCost, request

ROOT = Path(__file__).resolve().parents[1]


class ShortestPromptFirst(VLLMScheduler):
    """vLLM's admission over a queue sorted by prompt length (a stable sort: ties keep arrival order)."""

    def admit(
        self, engine: SchedulingEngine, budget: int, chunks: list[tuple[int, int]]
    ) -> tuple[int, int, str]:
        ordered = sorted(engine.waiting, key=lambda state: state.request.prompt_len)
        engine.waiting.clear()
        engine.waiting.extend(ordered)
        return super().admit(engine, budget, chunks)


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_a_third_scheduler_is_one_class_and_one_name(monkeypatch, step_mode):
    """max_num_seqs 1, every iteration 1 s, three requests at 0 with prompts 30, 10, 20 and outputs 2:
    each runs [t, t+1) prefill (first token) and [t+1, t+2) its second token. Shortest prompt first
    serves r1 at 0, r2 at 2, r0 at 4; vLLM's FCFS serves them in arrival order."""
    monkeypatch.setitem(schedulers.SCHEDULERS, "spf", ShortestPromptFirst)
    pool = PoolSpec(256, 4, 64)
    finishes = {}
    for name in ("spf", "vllm"):
        engine = Engine(
            make_policy("paged", pool),
            ConstantCost(),
            EngineKnobs(max_model_len=64, max_num_seqs=1, step_mode=step_mode, scheduler=name),
            iter([request(0, 0.0, 30, 2), request(1, 0.0, 10, 2), request(2, 0.0, 20, 2)]),
            block_size=pool.block_size,
        )
        engine.run()
        assert isinstance(engine.scheduler, schedulers.SCHEDULERS[name])
        finishes[name] = {
            record.request_id: (record.admitted_s, record.finish_s) for record in engine.records
        }
    assert finishes["spf"] == {1: (0.0, 2.0), 2: (2.0, 4.0), 0: (4.0, 6.0)}
    assert finishes["vllm"] == {0: (0.0, 2.0), 1: (2.0, 4.0), 2: (4.0, 6.0)}


def test_an_unknown_scheduler_is_named():
    with pytest.raises(ValueError, match="unknown scheduler 'fifo'; known: vllm, sglang"):
        schedulers.make_scheduler(EngineKnobs(max_model_len=64, scheduler="fifo"))


def test_the_core_has_no_branch_on_which_scheduler_runs():
    source = (ROOT / "sim" / "engine" / "core.py").read_text()
    names = {node.id for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Name)}
    attributes = {node.attr for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Attribute)}
    assert not {"SGLangScheduler", "VLLMScheduler"} & names
    assert "_sglang" not in attributes and '"sglang"' not in source and "'sglang'" not in source


def test_schedulers_import_nothing_of_the_engine_core():
    """One-way imports: the core imports its schedulers, never the other way (they see it through
    the SchedulingEngine protocol)."""
    from tests.test_layering import forbidden_imports

    assert forbidden_imports("sim/engine/schedulers", ("sim.engine.core",)) == {}


class NeverAdmits(VLLMScheduler):
    """A broken scheduler: it never admits anything."""

    def admit(
        self, engine: SchedulingEngine, budget: int, chunks: list[tuple[int, int]]
    ) -> tuple[int, int, str]:
        return budget, 0, "stuck"


def test_a_scheduler_that_never_admits_stops_the_run_with_a_reason(monkeypatch):
    """Nothing running, a request waiting, no arrival to come: no iteration can ever be scheduled.
    The engine says so at once (a bug in a scheduler, or an impossible config), not a silent hang."""
    from sim.engine.errors import EngineStalled

    monkeypatch.setitem(schedulers.SCHEDULERS, "never", NeverAdmits)
    pool = PoolSpec(256, 4, 64)
    engine = Engine(
        make_policy("paged", pool),
        ConstantCost(),
        EngineKnobs(max_model_len=64, scheduler="never"),
        iter([request(0, 0.0, 10, 2)]),
        block_size=pool.block_size,
    )
    with pytest.raises(EngineStalled, match=r"^at t=0\.000000s nothing can run: 1 waiting, none admissible$"):
        engine.run()
