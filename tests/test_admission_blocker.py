"""The engine records what holds the waiting queue's head back (the planner's binding limit)."""

from __future__ import annotations

import pytest

from policies import PoolSpec, make_policy
from sim.engine.core import Engine, EngineKnobs
from sim.outputs.metrics import ADMISSION_BLOCKERS, KV_MEMORY, MAX_NUM_SEQS, TOKEN_BUDGET
from tests.engine_helpers import RoundCostModel, request
from tests.test_engine import run


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


def external_fragmentation_changes(engine) -> list[tuple[float, int]]:
    """(time, external fragmentation in slots) at every row where it changes."""
    changes: list[tuple[float, int]] = []
    frame = engine.recorder.frame()
    for time_s, external in zip(frame["time_s"], frame["external_fragmentation_tokens"], strict=True):
        if not changes or changes[-1][1] != external:
            changes.append((float(time_s), int(external)))
    return changes


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_reading_the_head_leaves_what_the_pool_shows(step_mode):
    """contiguous (oracle reservations, first fit) in 100 slots, 10 tokens an iteration (1 s + 0.01 s a
    token). R0 (40 + 2) takes [0, 42), prefills 4 chunks of 10 to 4.4 s and decodes its last token to
    5.4. R1 (50 + 10: a region of 60) arrives at 0.05; R0's chunks leave no budget, so the scheduler
    first asks for it at 4.4: no hole of the 58 free slots holds it, all are external fragmentation
    until R0 leaves. R1 runs in [0, 60) from 5.4 to 19.9 (5 chunks, 9 decode steps), its 40 free
    slots too few for the next request of its size. Before 4.4 the pool was asked only about R0, whose
    region the 58 free slots hold: none external. Single steps report what holds R1 back at every
    iteration from 1.1 (the budget) and skipped ones not; that reading asks the pool quietly, so both
    step modes show the same memory (it made R1 the pool's reference from 1.1, single steps only)."""
    engine = run(
        "contiguous",
        PoolSpec(100, 1, 100),
        [request(0, 0.0, 40, 2), request(1, 0.05, 50, 10)],
        step_mode,
        options={"reservation": "oracle", "placement": "first_fit"},
        max_num_batched_tokens=10,
    )
    assert {record.request_id: (record.admitted_s, record.finish_s) for record in engine.records} == {
        0: (0.0, pytest.approx(5.4)),
        1: (pytest.approx(5.4), pytest.approx(19.9)),
    }
    assert external_fragmentation_changes(engine) == [
        (0.0, 0),
        (pytest.approx(4.4), 58),
        (pytest.approx(5.4), 40),
        (pytest.approx(19.9), 0),
    ]
