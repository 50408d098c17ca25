"""The engine records what holds the waiting queue's head back (the planner's binding limit)."""

from __future__ import annotations

import pytest

from policies import PoolSpec, make_policy
from sim.engine.core import Engine, EngineKnobs
from sim.outputs.metrics import ADMISSION_BLOCKERS, KV_MEMORY, MAX_NUM_SEQS, TOKEN_BUDGET
from tests.engine_helpers import RoundCostModel, request


def blockers(pool, requests, step_mode="skip", **knobs):
    """Time spent with each blocker set, from the time series (a row's value holds until the next)."""
    engine = Engine(
        make_policy("paged", pool),
        RoundCostModel(),
        EngineKnobs(max_model_len=pool.max_model_len, step_mode=step_mode, **knobs),
        iter(requests),
        block_size=pool.block_size,
    )
    engine.run()
    frame = engine.recorder.frame()
    spans = frame["time_s"].diff().shift(-1).fillna(0.0)
    totals = spans.groupby(frame["admission_blocker"]).sum()
    return {ADMISSION_BLOCKERS[int(code)]: float(seconds) for code, seconds in totals.items() if seconds > 0}


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_batch_full_is_max_num_seqs(step_mode):
    """Two requests at t=0, max_num_seqs=1: r1 waits while r0 runs (prefill 0.1 s, then 1 s per decode
    step: first token at 1.1, finishes at 3.1 with 3 tokens)."""
    got = blockers(
        PoolSpec(160, 16, 128),
        [request(0, 0.0, 10, 3), request(1, 0.0, 10, 3)],
        step_mode=step_mode,
        max_num_seqs=1,
    )
    assert got["max_num_seqs"] == pytest.approx(3.1)
    assert "kv_memory" not in got and "token_budget" not in got


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_full_pool_is_kv_memory(step_mode):
    """A pool of 2 blocks (32 slots): r0 holds both (20 + 4 tokens), r1 (20 tokens) cannot fit until r0
    finishes at 0.2 + 4 = 4.2 s."""
    got = blockers(
        PoolSpec(32, 16, 64), [request(0, 0.0, 20, 4), request(1, 0.0, 20, 4)], step_mode=step_mode
    )
    assert got["kv_memory"] == pytest.approx(4.2)
    assert "max_num_seqs" not in got


def test_spent_budget_is_token_budget():
    """Budget 16 tokens per iteration, chunked prefill: r0's 20-token prompt takes the first
    iteration's budget, so r1 (arrived with it) waits one iteration for lack of tokens, not memory."""
    got = blockers(
        PoolSpec(160, 16, 128),
        [request(0, 0.0, 20, 2), request(1, 0.0, 4, 2)],
        step_mode="single",
        max_num_batched_tokens=16,
    )
    assert got["token_budget"] == pytest.approx(1.16)  # decode-free iteration: 1 s + 16 x 0.01 s
    assert "kv_memory" not in got and "max_num_seqs" not in got


def test_codes_match_names():
    assert ADMISSION_BLOCKERS[KV_MEMORY] == "kv_memory"
    assert ADMISSION_BLOCKERS[MAX_NUM_SEQS] == "max_num_seqs"
    assert ADMISSION_BLOCKERS[TOKEN_BUDGET] == "token_budget"


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_a_request_the_schedule_has_not_seen_yet_is_held_back_by_nothing(step_mode):
    """Async scheduling: iteration k+1 is planned as iteration k starts. r1 arrives at 1.5, inside the
    iteration 1.1-2.1 whose successor was planned at 1.1 without it: until the plan made at 2.1
    admits it, nothing holds it back but the schedule's timing (no limit binds), so the blocker stays
    "none" over the whole run (to r1's last token at 6.2)."""
    got = blockers(
        PoolSpec(160, 16, 128),
        [request(0, 0.0, 10, 5), request(1, 1.5, 10, 3)],
        step_mode=step_mode,
        async_scheduling=True,
    )
    assert got == {"none": pytest.approx(6.2)}
