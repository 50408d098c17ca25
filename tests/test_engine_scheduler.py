"""The scheduler's knobs, each with exact times worked out on paper.

Cost model (``ConstantCost``): every iteration takes ``T = 1 s`` whatever it holds (decode, prefill
chunks or both: one fixed cost per iteration, no per-token term), swaps take ``S`` s per block and
nothing else costs time. With it an iteration boundary falls on every whole second (plus the swap
time, where a test swaps), and the expected numbers below are plain counting:

- an iteration's admissions and decode growth happen at its start, its first tokens and completions
  at its end;
- the iteration that finishes a prompt produces the first token (``first_token_s`` = its end);
- a request with output ``o`` finishes ``o - 1`` decode iterations after its first token;
- ``max_num_batched_tokens`` (the budget) pays one token per decoding sequence first, then prompt
  chunks of the prompts in progress, then the prompts of newly admitted requests.

Every scenario runs in both step modes (event skipping and one iteration at a time): both must give
the hand-worked numbers, not merely agree. Only public entry points are used (engine construction,
``run``, the request records, the counters, the output tables).
"""

from __future__ import annotations

import pytest

from policies import PoolSpec, make_policy
from sim.costs.terms import DecodeCost
from sim.engine.core import Engine, EngineKnobs
from tests.engine_helpers import ConstantCost, request

STEP_MODES = ["single", "skip"]


def run(requests, pool, step_mode, *, policy="paged", costs=None, **knobs):
    engine = Engine(
        make_policy(policy, pool),
        costs or ConstantCost(),
        EngineKnobs(max_model_len=pool.max_model_len, step_mode=step_mode, **knobs),
        iter(requests),
        block_size=pool.block_size,
    )
    engine.run()
    return engine


def outcomes(engine):
    """request id -> (admitted, first token, finish, preemptions, outcome)."""
    return {
        r.request_id: (r.admitted_s, r.first_token_s, r.finish_s, r.preemptions, r.outcome)
        for r in engine.records
    }


def max_sequences_running(engine) -> int:
    return int(engine.sink.timeseries()["num_sequences_running"].max())


# ----------------------------------------------------------------------------- token budget


@pytest.mark.parametrize("step_mode", STEP_MODES)
def test_decode_and_prefill_share_the_token_budget(step_mode):
    """The issue's first example. Budget 12, chunked prefill on.
    r0: prompt 8, n = 4, output 6. r1: prompt 20, output 3, arrives at 0.5 s.

    it 1 [0, 1): r0 admitted, its 8-token prompt prefilled (budget 12 -> 4). First token at 1.0;
                 r0 forks into 4 samples.
    (r1 arrives at 0.5, during it 1.)
    it 2 [1, 2): r0's 4 samples decode: budget 12 - 4 = 8. r1 admitted at 1.0, chunk 8 (8/20).
    it 3 [2, 3): 4 decode tokens, r1 chunk 8 (16/20).
    it 4 [3, 4): 4 decode tokens, r1 chunk 4 (20/20): r1's first token at 4.0.
    it 5 [4, 5): r0 token 5, r1 token 2.
    it 6 [5, 6): r0 token 6 = its output: finishes at 6.0; r1 token 3 = its output: finishes at 6.0.

    If decode did not take from the budget, r1 would prefill 12 + 8 and have its first token at 3.0.
    Output tokens: r0 4 samples x 6 + r1 3 = 27, in 6 iterations."""
    pool = PoolSpec(256, 4, 32)
    engine = run(
        [request(0, 0.0, 8, 6, n=4), request(1, 0.5, 20, 3)], pool, step_mode, max_num_batched_tokens=12
    )
    assert outcomes(engine) == {
        0: (0.0, 1.0, 6.0, 0, "finished"),
        1: (1.0, 4.0, 6.0, 0, "finished"),
    }
    assert engine.counters.iterations == 6
    assert engine.counters.output_tokens == 27
    assert engine.env.now == 6.0


@pytest.mark.parametrize("step_mode", STEP_MODES)
def test_chunked_prefill_off_waits_for_a_budget_that_holds_the_whole_prompt(step_mode):
    """The issue's second example: budget 22, chunked prefill off.
    r0: prompt 8, n = 4, output 6. r1: prompt 20, output 2 (final 22 = the budget), arrives at 0.5 s.

    it 1 [0, 1): r0 prefilled (8 <= 22). First token at 1.0, 4 samples.
    it 2-6 [1, 6): r0's 4 samples decode: 22 - 4 = 18 < 20, so r1 cannot be prefilled in one
                 iteration and stays waiting (not admitted: it holds no KV, as in vLLM).
                 r0's 6th token ends it 6: r0 finishes at 6.0.
    it 7 [6, 7): nothing decodes: budget 22 >= 20: r1 admitted at 6.0 and prefilled; first token 7.0.
    it 8 [7, 8): r1's second token: finishes at 8.0.

    With chunking (the knob ignored), r1 would prefill 18 + 2 and have its first token at 3.0; with
    decode outside the budget, it would prefill all 20 at it 2 (first token 2.0)."""
    pool = PoolSpec(256, 4, 32)
    engine = run(
        [request(0, 0.0, 8, 6, n=4), request(1, 0.5, 20, 2)],
        pool,
        step_mode,
        max_num_batched_tokens=22,
        enable_chunked_prefill=False,
    )
    assert outcomes(engine) == {
        0: (0.0, 1.0, 6.0, 0, "finished"),
        1: (6.0, 7.0, 8.0, 0, "finished"),
    }
    assert engine.counters.iterations == 8


@pytest.mark.parametrize("step_mode", STEP_MODES)
def test_chunked_prefill_off_admits_a_prompt_exactly_the_budget_left(step_mode):
    """Budget 22, chunked prefill off. r0: prompt 8, n = 4, output 6; r1: prompt 18, output 2,
    arrives at 0.5 s. At it 2 [1, 2) r0's 4 samples take 4 tokens: 18 left, exactly r1's prompt, which
    fits (vLLM refuses only a prompt larger than the budget): r1 is admitted at 1.0, first token 2.0,
    second at 3.0."""
    pool = PoolSpec(256, 4, 32)
    engine = run(
        [request(0, 0.0, 8, 6, n=4), request(1, 0.5, 18, 2)],
        pool,
        step_mode,
        max_num_batched_tokens=22,
        enable_chunked_prefill=False,
    )
    assert outcomes(engine) == {
        0: (0.0, 1.0, 6.0, 0, "finished"),
        1: (1.0, 2.0, 3.0, 0, "finished"),
    }


@pytest.mark.parametrize("step_mode", STEP_MODES)
def test_prompts_in_progress_take_the_budget_before_new_admissions(step_mode):
    """Budget 8, chunked prefill on. r0: prompt 12, output 2; r1: prompt 6, output 2; both at 0.

    it 1 [0, 1): r0 admitted, chunk 8 (8/12): the budget is spent, r1 is not admitted.
    it 2 [1, 2): r0's prompt goes first: chunk 4 (12/12), budget 4 left: r1 admitted at 1.0, chunk 4
                 (4/6). r0's first token at 2.0.
    it 3 [2, 3): r0 decodes (budget 7): token 2 = its output: finishes at 3.0; r1 chunk 2 (6/6):
                 first token at 3.0.
    it 4 [3, 4): r1's token 2: finishes at 4.0."""
    pool = PoolSpec(256, 4, 32)
    engine = run([request(0, 0.0, 12, 2), request(1, 0.0, 6, 2)], pool, step_mode, max_num_batched_tokens=8)
    assert outcomes(engine) == {
        0: (0.0, 2.0, 3.0, 0, "finished"),
        1: (1.0, 3.0, 4.0, 0, "finished"),
    }
    assert engine.counters.iterations == 4


@pytest.mark.parametrize("step_mode", STEP_MODES)
def test_decode_filling_the_whole_budget_holds_admissions_back(step_mode):
    """Budget 4 = r0's 4 samples (prompt 4, n = 4, output 3). r1 (prompt 4, output 1) arrives at 0.5.

    it 1 [0, 1): r0 prefilled (4/4 of the budget). First token at 1.0, 4 samples.
    it 2, 3 [1, 3): the 4 samples take the whole budget: r1 is not admitted. r0 finishes at 3.0.
    it 4 [3, 4): r1 admitted at 3.0, prefilled; its only token is its first: finishes at 4.0."""
    pool = PoolSpec(256, 4, 32)
    engine = run(
        [request(0, 0.0, 4, 3, n=4), request(1, 0.5, 4, 1)], pool, step_mode, max_num_batched_tokens=4
    )
    assert outcomes(engine) == {
        0: (0.0, 1.0, 3.0, 0, "finished"),
        1: (3.0, 4.0, 4.0, 0, "finished"),
    }


@pytest.mark.parametrize(
    ("knobs", "prompt", "output", "n", "reason"),
    [
        ({}, 30, 3, 1, "prompt 30 + output 3 = 33 tokens exceeds max_model_len=32"),
        ({}, 4, 0, 1, "output_len must be at least 1"),
        ({"max_num_seqs": 3}, 4, 2, 4, "n/beam_width=4 exceeds max_num_seqs=3"),
        (
            {},
            16,
            16,
            3,
            "3 sequence(s) x (prompt 16 + output 16 = 32 tokens) exceed the KV pool (64 slots) even with nothing else running",
        ),
        (
            {"max_num_batched_tokens": 20, "enable_chunked_prefill": False},
            18,
            3,
            1,
            "prompt 18 + output 3 = 21 tokens cannot be prefilled in one iteration (max_num_batched_tokens=20, chunked prefill off)",
        ),
    ],
)
def test_requests_that_can_never_run_are_rejected_on_arrival(knobs, prompt, output, n, reason):
    """Pool 64 slots, max_model_len 32. Each request is rejected at once with its reason; the next
    request (prompt 4, output 1) runs alone: admitted at 0, done after one iteration."""
    pool = PoolSpec(64, 4, 32)
    engine = run([request(0, 0.0, prompt, output, n=n), request(1, 0.0, 4, 1)], pool, "skip", **knobs)
    records = {r.request_id: r for r in engine.records}
    assert (records[0].outcome, records[0].reason) == ("rejected", reason)
    assert outcomes(engine)[1] == (0.0, 1.0, 1.0, 0, "finished")


def test_the_limits_themselves_are_admissible():
    """The boundaries are inclusive: final length = max_model_len (32), n = max_num_seqs (2),
    2 x 32 tokens = the pool (64 slots), and with chunked prefill off final length = the budget (32).

    it 1 [0, 1): prefill 30; first token at 1.0, 2 samples (2 x 31 tokens in 2 x 8 = 16 blocks).
    it 2 [1, 2): token 2 = the output: finishes at 2.0."""
    pool = PoolSpec(64, 4, 32)
    engine = run(
        [request(0, 0.0, 30, 2, n=2)],
        pool,
        "skip",
        max_num_seqs=2,
        max_num_batched_tokens=32,
        enable_chunked_prefill=False,
    )
    assert outcomes(engine) == {0: (0.0, 1.0, 2.0, 0, "finished")}


# ----------------------------------------------------------------------------- max_num_seqs


@pytest.mark.parametrize("step_mode", STEP_MODES)
def test_max_num_seqs_counts_every_sample(step_mode):
    """max_num_seqs 4. r0: prompt 4, n = 2, output 3; r1: prompt 4, output 2; r2: prompt 4, n = 2,
    output 2; all at 0.

    it 1 [0, 1): r0 admitted (2 sequences once forked), r1 (3); r2 would make 5 > 4: waits.
                 First tokens of r0 and r1 at 1.0.
    it 2 [1, 2): r1's token 2: finishes at 2.0 (2 sequences left: r0's). r2 still waits (2 + 1 + 2).
    it 3 [2, 3): r2 admitted at 2.0 (2 + 2 = 4); r0's token 3: finishes at 3.0; r2's first token 3.0.
    it 4 [3, 4): r2's token 2: finishes at 4.0.

    Sequences running (the time series): r0's 2 + r1's 1 = 3 from 1.0 to 2.0; r0's 2 + r2's 1 (not
    forked until its first token) = 3 from 2.0 to 3.0; r2's 2 after. Counting requests (or only the
    sample admitted before the fork) would admit r2 at 0 and run 5 sequences from 1.0."""
    pool = PoolSpec(256, 4, 32)
    requests = [request(0, 0.0, 4, 3, n=2), request(1, 0.0, 4, 2), request(2, 0.0, 4, 2, n=2)]
    engine = run(requests, pool, step_mode, max_num_seqs=4)
    assert outcomes(engine) == {
        0: (0.0, 1.0, 3.0, 0, "finished"),
        1: (0.0, 1.0, 2.0, 0, "finished"),
        2: (2.0, 3.0, 4.0, 0, "finished"),
    }
    assert max_sequences_running(engine) == 3


@pytest.mark.parametrize("step_mode", STEP_MODES)
def test_max_num_seqs_one_runs_requests_one_after_another(step_mode):
    """max_num_seqs 1; three requests (prompt 4, outputs 2, 1, 3) at 0: each waits for the previous.

    r0: [0, 1) prefill, [1, 2) token 2 -> finish 2.0. r1: admitted 2.0, [2, 3) prefill = its only
    token -> finish 3.0. r2: admitted 3.0, first token 4.0, tokens 2, 3 at 5.0, 6.0."""
    pool = PoolSpec(256, 4, 32)
    requests = [request(0, 0.0, 4, 2), request(1, 0.0, 4, 1), request(2, 0.0, 4, 3)]
    engine = run(requests, pool, step_mode, max_num_seqs=1)
    assert outcomes(engine) == {
        0: (0.0, 1.0, 2.0, 0, "finished"),
        1: (2.0, 3.0, 3.0, 0, "finished"),
        2: (3.0, 4.0, 6.0, 0, "finished"),
    }
    assert max_sequences_running(engine) == 1


# ----------------------------------------------------------------------------------- watermark


@pytest.mark.parametrize("step_mode", STEP_MODES)
def test_watermark_boundary_is_inclusive(step_mode):
    """Pool 40 slots in blocks of 4, watermark 0.5: an admission must leave >= 20 slots free.
    r0: prompt 8, r1: prompt 12, r2: prompt 4; output 2 each; all at 0.

    it 1 [0, 1): r0: 40 - 8 = 32 >= 20, admitted. r1: 32 - 12 = 20 >= 20 (the boundary), admitted.
                 r2: 20 - 4 = 16 < 20: waits. First tokens at 1.0: r0 grows to 9 tokens (a 3rd
                 block), r1 to 13 (a 4th): 40 - 12 - 16 = 12 slots free.
    it 2 [1, 2): r2: 12 - 4 < 20, waits. r0 and r1 take their 2nd token: both finish at 2.0.
    it 3 [2, 3): pool empty: r2 admitted at 2.0, first token 3.0; it 4: finishes at 4.0.

    Without the watermark r2 would be admitted at 0; with a strict '>' r1 would wait too."""
    pool = PoolSpec(40, 4, 32)
    requests = [request(0, 0.0, 8, 2), request(1, 0.0, 12, 2), request(2, 0.0, 4, 2)]
    engine = run(requests, pool, step_mode, watermark=0.5)
    assert outcomes(engine) == {
        0: (0.0, 1.0, 2.0, 0, "finished"),
        1: (0.0, 1.0, 2.0, 0, "finished"),
        2: (2.0, 3.0, 4.0, 0, "finished"),
    }
    unguarded = run(requests, pool, step_mode)
    assert outcomes(unguarded)[2] == (0.0, 1.0, 2.0, 0, "finished")


# ------------------------------------------------------------------------------------ preemption


@pytest.mark.parametrize("step_mode", STEP_MODES)
def test_preemption_is_counted_once_per_request_not_per_sample(step_mode):
    """Paged pool of 6 blocks x 4 slots. r0: prompt 4, output 5 (final 9: 3 blocks);
    r1: prompt 4, n = 2, output 6 (final 10: 3 blocks per sample). Both at 0.

    it 1 [0, 1): both admitted (1 block each, 4 free). At 1.0: r0 grows to 5 tokens (block 2, 3 free);
                 r1 forks (the paged policy copies the prompt block: 2 free) and both samples grow
                 to 5 tokens (a 2nd block each: 0 free).
    it 2-4 [1, 4): tokens 6, 7, 8 fit the held blocks.
    it 5 at 4.0: r0 needs a 3rd block for token 9: none free, so the newest request, r1, is
                 preempted (recompute: both samples freed; they restart from the prompt). ONE
                 preemption, of one request with two sequences. No admission after a preemption.
                 r0's token 5 = its output: finishes at 5.0.
    it 6 [5, 6): r1 admitted again (admitted_s stays its first admission, 0.0), prompt recomputed.
    At 6.0 r1's samples have their first tokens again; tokens 2..6 in it 7-11: finishes at 11.0.
    Its first token stays the first one ever produced (1.0)."""
    pool = PoolSpec(24, 4, 16)
    engine = run([request(0, 0.0, 4, 5), request(1, 0.0, 4, 6, n=2)], pool, step_mode)
    assert outcomes(engine) == {
        0: (0.0, 1.0, 5.0, 0, "finished"),
        1: (0.0, 1.0, 11.0, 1, "finished"),
    }
    assert engine.counters.preemptions == 1
    assert engine.counters.iterations == 11
    # Tokens produced, including the 4 x 2 that r1 lost: r0 5 + r1 (4 + 6) x 2 = 25.
    assert engine.counters.output_tokens == 25


# Shared squeeze for recompute and swap: pool 5 blocks x 4 slots.
# r0: prompt 4, output 8 (final 12: 3 blocks); r1: prompt 8, output 6 (final 14: 4 blocks); both at 0.
# it 1 [0, 1): r0 1 block, r1 2 blocks. At 1.0: r0 -> 5 tokens (block 2), r1 -> 9 tokens (block 3):
#              0 free.
# it 2-4: r0 6, 7, 8 tokens; r1 10, 11, 12 tokens (token 4 of its output), all in held blocks.
# it 5 at 4.0: r0 needs block 3 for token 9 (oldest first): none free, the newest request (r1,
#              12 tokens = 3 blocks) is preempted. r0 takes one of its blocks: 2 free.
#              r0 then needs 3 blocks until it finishes, so r1's 12 tokens (3 blocks) cannot come
#              back before r0 has finished.
SQUEEZE = [request(0, 0.0, 4, 8), request(1, 0.0, 8, 6)]
SQUEEZE_POOL = PoolSpec(20, 4, 16)


@pytest.mark.parametrize("step_mode", STEP_MODES)
def test_recompute_preemption_exact_times(step_mode):
    """The squeeze above with recompute.

    it 5 [4, 5): r0 token 5. it 6-8 [5, 8): r0 tokens 6, 7, 8: finishes at 8.0 (r1 cannot come back:
    3 blocks needed, 2 free). it 9 [8, 9): r1 readmitted with its prompt + 4 generated tokens (12)
    recomputed in one iteration: its 5th token at 9.0; it 10: its 6th, finishes at 10.0."""
    engine = run(SQUEEZE, SQUEEZE_POOL, step_mode)
    assert outcomes(engine) == {
        0: (0.0, 1.0, 8.0, 0, "finished"),
        1: (0.0, 1.0, 10.0, 1, "finished"),
    }
    assert engine.counters.preemptions == 1
    assert engine.counters.swapped_out_blocks == 0
    assert engine.counters.iterations == 10
    # Recompute loses no output token: 8 + 6.
    assert engine.counters.output_tokens == 14


@pytest.mark.parametrize("step_mode", STEP_MODES)
def test_recompute_of_a_preempted_request_uses_chunks_of_the_budget(step_mode):
    """The squeeze with a budget of 5 tokens (chunked prefill on).

    it 1 [0, 1): r0 chunk 4 (4/4), r1 admitted, chunk 1 (1/8). r0's first token at 1.0 (5 tokens,
                 block 2).
    it 2 [1, 2): r0 decodes (budget 4): token 2; r1 chunk 4 (5/8).
    it 3 [2, 3): r0 token 3; r1 chunk 3 (8/8): first token at 3.0, 9 tokens: block 3, pool full.
    it 4 [3, 4): r0 token 4 (8 tokens); r1 token 2 (10 tokens).
    it 5 at 4.0: r0's token 5 needs block 3: r1 (10 tokens) preempted. r0 token 5.
    it 6-8 [5, 8): r0 tokens 6, 7, 8: finishes at 8.0 (r1 needs 3 blocks, 2 free until then).
    it 9, 10 [8, 10): r1 recomputes its 8 + 2 = 10 tokens in chunks of 5 and 5: its 3rd token at 10.0.
    it 11-13: tokens 4, 5, 6: finishes at 13.0. Its first token stays the first ever (3.0)."""
    engine = run(SQUEEZE, SQUEEZE_POOL, step_mode, max_num_batched_tokens=5)
    assert outcomes(engine) == {
        0: (0.0, 1.0, 8.0, 0, "finished"),
        1: (0.0, 3.0, 13.0, 1, "finished"),
    }
    assert engine.counters.preemptions == 1


def run_squeeze_with_swap(step_mode, host_blocks):
    """The squeeze, preempting by swap into ``host_blocks`` blocks of host room at S = 0.25 s per block."""
    return run(
        SQUEEZE,
        SQUEEZE_POOL,
        step_mode,
        costs=ConstantCost(1.0, swap_block_s=0.25),
        preemption_mode="swap",
        swap_space_blocks=host_blocks,
    )


@pytest.mark.parametrize("step_mode", STEP_MODES)
def test_swap_preemption_exact_times(step_mode):
    """The squeeze with swap (host room 8 blocks), S = 0.25 s per block and direction.

    it 5 [4, 5.75): r1's 12 tokens (3 blocks) go to the host: 1 + 3 x 0.25. r0 token 5.
    it 6-8 [5.75, 8.75): r0 tokens 6, 7, 8: finishes at 8.75. r1 waits (3 blocks, 2 free).
    [8.75, 9.5): r1's 3 blocks come back (0.75 s): nothing to recompute, nothing else to run.
    [9.5, 10.5), [10.5, 11.5): r1's tokens 5 and 6: finishes at 11.5."""
    engine = run_squeeze_with_swap(step_mode, host_blocks=8)
    assert outcomes(engine) == {
        0: (0.0, 1.0, 8.75, 0, "finished"),
        1: (0.0, 1.0, 11.5, 1, "finished"),
    }
    assert engine.counters.preemptions == 1
    assert engine.counters.swapped_out_blocks == 3
    assert engine.env.now == 11.5


@pytest.mark.parametrize("step_mode", STEP_MODES)
def test_swap_without_enough_host_room_recomputes(step_mode):
    """Host room of 2 blocks < the 3 blocks r1 holds: the preemption falls back to recompute, and
    the times are the recompute test's, with no swap time."""
    engine = run_squeeze_with_swap(step_mode, host_blocks=2)
    assert outcomes(engine) == {
        0: (0.0, 1.0, 8.0, 0, "finished"),
        1: (0.0, 1.0, 10.0, 1, "finished"),
    }
    assert engine.counters.swapped_out_blocks == 0


@pytest.mark.parametrize("step_mode", STEP_MODES)
def test_exactly_enough_host_room_swaps(step_mode):
    """Host room of exactly 3 blocks (12 slots) holds r1's 12 tokens: it swaps (the swap test's times)."""
    engine = run_squeeze_with_swap(step_mode, host_blocks=3)
    assert outcomes(engine)[1] == (0.0, 1.0, 11.5, 1, "finished")
    assert engine.counters.swapped_out_blocks == 3


@pytest.mark.parametrize("step_mode", STEP_MODES)
def test_a_partly_filled_last_block_is_swapped_out_whole(step_mode):
    """The squeeze with r1's prompt 7 (not a whole block): at 1.0 r0 has 5 tokens (2 blocks), r1 8
    (2 blocks); at 2.0 r1's 9th token takes the last free block; at 4.0 r0's 9th token needs a block
    and r1, the newest, holds 11 tokens in 3 blocks (the last partly filled): all 3 go to the host."""
    engine = run(
        [request(0, 0.0, 4, 8), request(1, 0.0, 7, 6)],
        SQUEEZE_POOL,
        step_mode,
        costs=ConstantCost(1.0, swap_block_s=0.25),
        preemption_mode="swap",
        swap_space_blocks=8,
    )
    assert engine.counters.preemptions == 1
    assert engine.counters.swapped_out_blocks == 3
    assert [record.outcome for record in engine.records] == ["finished", "finished"]


@pytest.mark.parametrize("step_mode", STEP_MODES)
def test_a_swapped_out_request_rejected_alone_gives_back_its_host_room(step_mode):
    """vLLM V0's watermark (0.35 of 40 slots: 14) applies at admission, not to growth. r0 (4 + 12) and
    r1 (20 + 20) are admitted at 0 (r1 leaves 40 - 4 - 20 = 16 >= 14 slots). They grow a token an
    iteration: at r0's 13th token (its 4th block) the pool of 10 blocks is full, and r1, the
    newest, holds 28 tokens in 7 blocks: swapped out. Once r0 finishes, r1 alone would leave
    40 - 28 = 12 < 14 slots: it can never come back, and is rejected, its 28 host tokens given back."""
    engine = run(
        [request(0, 0.0, 4, 12), request(1, 0.0, 20, 20)],
        PoolSpec(40, 4, 64),
        step_mode,
        costs=ConstantCost(1.0, swap_block_s=0.25),
        preemption_mode="swap",
        swap_space_blocks=16,
        watermark=0.35,
    )
    assert [record.outcome for record in engine.records] == ["finished", "rejected"]
    assert engine.counters.swapped_out_blocks == 7
    assert engine.batch.swap_tokens_used == 0


@pytest.mark.parametrize("step_mode", STEP_MODES)
def test_swap_is_not_used_for_requests_with_several_samples(step_mode):
    """The n = 2 preemption scenario with swap mode and ample host room: samples restart from the
    prompt (their diverged tokens cannot be swapped back as one), so the times equal recompute's."""
    pool = PoolSpec(24, 4, 16)
    engine = run(
        [request(0, 0.0, 4, 5), request(1, 0.0, 4, 6, n=2)],
        pool,
        step_mode,
        costs=ConstantCost(1.0, swap_block_s=0.25),
        preemption_mode="swap",
        swap_space_blocks=64,
    )
    assert outcomes(engine)[1] == (0.0, 1.0, 11.0, 1, "finished")
    assert engine.counters.swapped_out_blocks == 0


@pytest.mark.parametrize("step_mode", STEP_MODES)
def test_on_oom_fail_fails_only_requests_never_preempted(step_mode):
    """on_oom: fail. Pool 3 blocks x 4 slots. r0: prompt 8, output 4 (final 12); r1: prompt 4,
    output 1, arrives at 0.5.

    it 1 [0, 1): r0 admitted (2 blocks), first token at 1.0 (9 tokens: block 3, pool full).
    it 2 at 1.0: r1 does not fit: it fails at once (outcome failed_oom, never admitted).
    r0's tokens 2-4 at 2.0, 3.0, 4.0: finishes at 4.0."""
    pool = PoolSpec(12, 4, 16)
    engine = run([request(0, 0.0, 8, 4), request(1, 0.5, 4, 1)], pool, step_mode, on_oom="fail")
    got = outcomes(engine)
    assert got[0] == (0.0, 1.0, 4.0, 0, "finished")
    assert got[1][3:] == (0, "failed_oom")
    reasons = {r.request_id: r.reason for r in engine.records}
    assert reasons == {0: "", 1: "KV cache out of memory at admission (on_oom: fail)"}
    assert [r.request_id for r in engine.records if r.outcome == "failed_oom"] == [1]


@pytest.mark.parametrize("step_mode", STEP_MODES)
def test_on_oom_fail_lets_a_preempted_request_wait_to_come_back(step_mode):
    """on_oom: fail means a request whose first admission does not fit fails; a preempted request
    already holds its place (it was admitted, and has tokens out): it waits for memory to come back,
    as with on_oom: queue. The squeeze: r1, preempted at 4.0, needs 3 blocks while r0 leaves it 2
    until r0 finishes at 8.0; then it is recomputed and finishes at 10.0, exactly the queue run's
    times (test_recompute_preemption_exact_times)."""
    failing = run(SQUEEZE, SQUEEZE_POOL, step_mode, on_oom="fail")
    queueing = run(SQUEEZE, SQUEEZE_POOL, step_mode, on_oom="queue")
    assert (
        outcomes(failing)
        == outcomes(queueing)
        == {
            0: (0.0, 1.0, 8.0, 0, "finished"),
            1: (0.0, 1.0, 10.0, 1, "finished"),
        }
    )
    assert failing.counters.oom_failures == 0 and failing.counters.preemptions == 1
    assert failing.counters.admission_waits == queueing.counters.admission_waits == 1


class ContextCost(ConstantCost):
    """Iteration = 1 s + 1/16 s per token the decoding sequences hold (after this iteration's token);
    an iteration without decode costs 1 s."""

    @property
    def decode(self) -> DecodeCost:
        return DecodeCost(1.0, 0.0, 0.0625)


@pytest.mark.parametrize("step_mode", STEP_MODES)
def test_recompute_with_a_context_dependent_iteration_time(step_mode):
    """The squeeze with ContextCost: the times follow the tokens the batch holds.

    it 1 [0, 1): no decode: 1 s. r0 5 tokens, r1 9.
    it 2: 6 + 10 = 16 tokens: 2 s -> 3.0. it 3: 7 + 11 = 18: 2.125 -> 5.125. it 4: 8 + 12 = 20: 2.25
    -> 7.375. it 5: r1 preempted, r0 9 tokens: 1.5625 -> 8.9375. it 6-8: r0 10, 11, 12 tokens:
    1.625 + 1.6875 + 1.75 -> 14.0: r0 finishes. it 9: r1's 12 tokens recomputed, no decode: 1 s ->
    15.0 (13 tokens). it 10: 14 tokens: 1.875 -> 16.875: r1 finishes."""
    engine = run(SQUEEZE, SQUEEZE_POOL, step_mode, costs=ContextCost())
    assert outcomes(engine) == {
        0: (0.0, 1.0, 14.0, 0, "finished"),
        1: (0.0, 1.0, 16.875, 1, "finished"),
    }
    series = engine.sink.timeseries()
    categories = [c for c in series.columns if c.endswith("_tokens")][:6]
    assert (series[categories] >= 0).all().all()
    assert (series[categories].sum(axis=1) == SQUEEZE_POOL.kv_pool_tokens).all()

    # At 14.0: r0 finishes, and r1's 12 recomputed tokens are admitted at once (3 blocks, 8 free);
    # the empty pool in between holds for no time and is not written. At 15.0 its 13th token goes
    # in (4th block: 4 free), and the next iteration's 14th at once: one row, (14 used, 4 free).
    def at(time_s):
        rows = series[series.time_s == time_s][["used_tokens", "free_tokens"]].to_numpy()
        return [tuple(int(v) for v in row) for row in rows]

    assert at(14.0)[-1:] == [(12, 8)]
    assert (0, 20) not in at(14.0)
    assert at(15.0) == [(14, 4)]


@pytest.mark.parametrize("step_mode", STEP_MODES)
def test_a_request_that_preempted_another_is_preempted_in_turn(step_mode):
    """Pool 7 blocks x 4 slots. rA: prompt 4, output 12 (final 16: 4 blocks); r0: prompt 4, output
    12 (4 blocks); r1: prompt 4, output 8 (3 blocks); all at 0.

    it 1 [0, 1): all admitted (3 blocks); at 1.0 each holds 5 tokens (2 blocks each: 6 of 7).
    it 2-4: 6, 7, 8 tokens each.
    it 5 at 4.0: rA takes the last block for token 9; r0 needs one: the newest, r1 (8 tokens), is
                 preempted (1); r0 takes one of its blocks. 1 block free; r1 needs 2.
    it 6-8: rA and r0 reach 12 tokens (8 generated each).
    it 9 at 8.0: rA takes the free block (13 tokens); r0 needs its 4th: r0 is now the newest running:
                 preempted (r0: 1), with 8 generated tokens: it will recompute 4 + 8 = 12 tokens.
    it 10-12 [9, 12): rA's tokens 10-12 (finishes at 12.0). Each iteration r0 is readmitted (3 free
                 blocks), recomputes its 12 tokens, and at the iteration's end cannot store its next
                 token (13th: a 4th block) and is preempted again (r0: 2, 3, 4); at 12.0 that happens
                 before rA frees its blocks.
    it 13 [12, 13): empty pool: r0 (12 tokens, 3 blocks) and r1 (prompt + 4 generated = 8 tokens,
                 2 blocks) admitted; at 13.0 r0 takes its 9th token (4th block), r1 its 5th (3rd
                 block): the pool is full and enough.
    it 14-16: r0 tokens 10-12, r1 tokens 6-8: both finish at 16.0."""
    pool = PoolSpec(28, 4, 16)
    engine = run([request(0, 0.0, 4, 12), request(1, 0.0, 4, 12), request(2, 0.0, 4, 8)], pool, step_mode)
    assert outcomes(engine) == {
        0: (0.0, 1.0, 12.0, 0, "finished"),
        1: (0.0, 1.0, 16.0, 4, "finished"),
        2: (0.0, 1.0, 16.0, 1, "finished"),
    }
    assert engine.counters.preemptions == 5
    assert engine.counters.iterations == 16


@pytest.mark.parametrize("step_mode", STEP_MODES)
def test_swap_room_is_given_back_when_the_request_returns(step_mode):
    """Host room of exactly 3 blocks (r1's 12 tokens: the threshold hit exactly), and the squeeze twice:
    r2, r3 as r0, r1 but arriving at 20 s, after both have finished (11.5 s) and the engine idles. r1's
    blocks came back at 9.5 s, so the room is whole again: r3 swaps too, and every time is the swap
    test's, shifted by 20 s (r2 finishes at 28.75, r3 at 31.5)."""
    second = [request(2, 20.0, 4, 8), request(3, 20.0, 8, 6)]
    engine = run(
        SQUEEZE + second,
        SQUEEZE_POOL,
        step_mode,
        costs=ConstantCost(1.0, swap_block_s=0.25),
        preemption_mode="swap",
        swap_space_blocks=3,
    )
    assert outcomes(engine) == {
        0: (0.0, 1.0, 8.75, 0, "finished"),
        1: (0.0, 1.0, 11.5, 1, "finished"),
        2: (20.0, 21.0, 28.75, 0, "finished"),
        3: (20.0, 21.0, 31.5, 1, "finished"),
    }
    assert engine.counters.swapped_out_blocks == 6
