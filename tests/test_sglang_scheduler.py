"""``engine.scheduler: sglang`` (sim/engine/schedulers/sglang.py): hand-worked runs, step-mode
equivalence, the config keys, and ``vllm`` (the default) unchanged.

Costs are ``RoundCostModel``'s: a decode step 1 s, prefill 0.01 s per token."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from policies import PoolSpec
from sim.config import EngineConfig
from sim.engine.knobs import EngineKnobs
from sim.engine.schedulers import SCHEDULERS
from sim.engine.schedulers.sglang import SGLangScheduler, chunked_prefill_size_for
from sim.outputs.metrics import ADMISSION_BLOCKERS
from tests.engine_helpers import RoundCostModel, request
from tests.test_engine import EQUIVALENCE_COSTS, SCENARIOS, assert_same_results, random_requests, run, times

SGLANG = {"scheduler": "sglang"}


def run_in_a_pool_of_100(requests, step_mode, **knobs):
    """``radix`` under SGLang's scheduler in a pool of 100 tokens, conservativeness 0 (running
    requests reserve nothing for their output; a new one still budgets its own)."""
    return run(
        "radix", PoolSpec(100, 4, 160), requests, step_mode, schedule_conservativeness=0.0, **SGLANG, **knobs
    )


def admitted(engine) -> dict[int, float]:
    return {record.request_id: record.admitted_s for record in engine.records}


def test_lpm_admits_the_longest_cached_prefix_first():
    """One request runs at a time (max_num_seqs 1). R0 (40 tokens of stream 1, 5 out) runs from 0 to
    1.4 + 4 = 5.4 s; its prompt is cached from admission. R1 (40 fresh tokens) and R2 (R0's 40 + 10
    new) wait. At 5.4 FCFS (SGLang's default) admits R1; lpm matches both and admits R2 (40 cached
    tokens) first, whose 10 new tokens take 1.1 s, then R1 at 5.4 + 1.1 + 4 = 10.5."""
    requests = [
        request(0, 0.0, 40, 5, prompt=((1, 40),)),
        request(1, 0.1, 40, 5, prompt=((2, 40),)),
        request(2, 0.2, 50, 5, prompt=((1, 40), (3, 10))),
    ]
    pool = PoolSpec(400, 16, 128)
    fcfs = run("radix", pool, requests, max_num_seqs=1, **SGLANG)
    lpm = run("radix", pool, requests, max_num_seqs=1, schedule_policy="lpm", **SGLANG)
    assert admitted(fcfs) == pytest.approx({0: 0.0, 1: 5.4, 2: 5.4 + 1.4 + 4})
    assert admitted(lpm) == pytest.approx({0: 0.0, 2: 5.4, 1: 10.5})
    assert {r.request_id: r.cached_prompt_tokens for r in lpm.records} == {0: 0, 2: 40, 1: 0}


@pytest.mark.parametrize("step_mode", ["single", "skip"])
@pytest.mark.parametrize(
    ("shared", "threshold", "lpm_admitted", "lpm_cached"),
    [
        (40, 32, {1: 0.0, 3: 0.0, 2: 5.9}, {1: 0, 2: 40, 3: 0}),
        (32, 32, {1: 0.0, 3: 0.0, 2: 5.9}, {1: 0, 2: 32, 3: 0}),
        (31, 32, {1: 0.0, 2: 0.0, 3: 6.0}, {1: 0, 2: 0, 3: 0}),
        # engine.in_batch_prefix_deprioritize_tokens moves the boundary
        (31, 31, {1: 0.0, 3: 0.0, 2: 5.9}, {1: 0, 2: 31, 3: 0}),
        (40, 41, {1: 0.0, 2: 0.0, 3: 6.0}, {1: 0, 2: 0, 3: 0}),
    ],
)
def test_lpm_holds_back_a_request_sharing_a_new_prefix_with_one_ahead(
    step_mode, shared, threshold, lpm_admitted, lpm_cached
):
    """In-batch prefix caching (``_compute_prefix_matches``). R1 and R2 (50 tokens each, 5 out) share
    their first ``shared`` tokens, R3 (40) nothing; all arrive at 0 into an empty cache, two run at
    once. FCFS admits R1 and R2 together: R2 cannot hit R1's prompt, which enters the tree after their
    prefill batch ran (100 tokens: 2.0 s, then 4 decode steps: done at 6.0), and R3 (1.4 s) follows
    at 6.0. Under lpm every hit is 0; with 40 shared tokens (at least 32) R2 is held back to the
    queue's end: R1 and R3 prefill together (90 tokens, 1.9 s, done at 5.9) and R2 then hits R1's 40.
    So with 32 shared (SGLang's threshold); with 31 nothing is held back: lpm admits as FCFS does.
    With the threshold at 31, 31 shared tokens hold R2 back; at 41, 40 do not."""
    requests = [
        request(1, 0.0, 50, 5, prompt=((5, shared), (6, 50 - shared))),
        request(2, 0.0, 50, 5, prompt=((5, shared), (7, 50 - shared))),
        request(3, 0.0, 40, 5, prompt=((8, 40),)),
    ]
    pool = PoolSpec(400, 16, 128)
    fcfs = run("radix", pool, requests, step_mode, max_num_seqs=2, **SGLANG)
    lpm = run(
        "radix",
        pool,
        requests,
        step_mode,
        max_num_seqs=2,
        schedule_policy="lpm",
        in_batch_deprioritize_tokens=threshold,
        **SGLANG,
    )
    assert admitted(fcfs) == pytest.approx({1: 0.0, 2: 0.0, 3: 6.0})
    assert {r.request_id: r.cached_prompt_tokens for r in fcfs.records} == {1: 0, 2: 0, 3: 0}
    assert admitted(lpm) == pytest.approx(lpm_admitted)
    assert {r.request_id: r.cached_prompt_tokens for r in lpm.records} == lpm_cached


def two_cached_then_three_waiting():
    """R0 (40 tokens of stream 1) and R9 (40 of stream 9), 5 out each; meanwhile A and B (R0's 40 and
    10 new each) and C (40 fresh)."""
    return [
        request(0, 0.0, 40, 5, prompt=((1, 40),)),
        request(9, 0.0, 40, 5, prompt=((9, 40),)),
        request(1, 0.1, 50, 5, prompt=((1, 40), (2, 10))),
        request(2, 0.2, 50, 5, prompt=((1, 40), (3, 10))),
        request(3, 0.3, 40, 5, prompt=((8, 40),)),
    ]


@pytest.mark.parametrize("step_mode", ["single", "skip"])
@pytest.mark.parametrize(
    ("check_tokens", "lpm_admitted"),
    [
        (32, {0: 0.0, 9: 0.0, 1: 5.8, 2: 5.8, 3: 11.0}),
        (40, {0: 0.0, 9: 0.0, 1: 5.8, 3: 5.8, 2: 11.3}),
    ],
)
def test_lpm_checks_only_requests_that_hit_at_most_32_cached_tokens(step_mode, check_tokens, lpm_admitted):
    """R0 and R9 prefill together (1.8 s) and finish at 5.8, their tokens then cached. At 5.8 A and
    B hit 40 cached tokens, more than 32: neither is checked against the other, however much they
    share, and lpm admits them before C (0 hit), which follows when they finish: 20 new tokens
    (1.2 s) and 4 decode steps, at 11.0. With engine.in_batch_prefix_check_tokens 40 both are
    checked, and B shares A's first 40 tokens (at least 32): held back behind C. A and C prefill
    together at 5.8 (10 + 40 new tokens: 1.5 s) and finish at 5.8 + 1.5 + 4 = 11.3, when B is
    admitted, hitting the same 40 tokens."""
    engine = run(
        "radix",
        PoolSpec(800, 16, 128),
        two_cached_then_three_waiting(),
        step_mode,
        max_num_seqs=2,
        schedule_policy="lpm",
        in_batch_check_tokens=check_tokens,
        **SGLANG,
    )
    assert admitted(engine) == pytest.approx(lpm_admitted)
    assert {r.request_id: r.cached_prompt_tokens for r in engine.records} == {0: 0, 9: 0, 1: 40, 2: 40, 3: 0}


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_the_budget_leaves_out_the_cached_prefix_a_request_would_lock(step_mode):
    """``add_one_req`` locks the matched prefix before its budget check, so its cached tokens no
    running request holds stop counting as evictable. Pool of 100, conservativeness 0. R0 (40
    tokens of stream 1, 1 out) and R2 (5 tokens, 40 out) prefill together (1.45 s); R0 then ends,
    its 41 tokens cached. R1 (R0's 40 and 10 new, 45 out) arrives at 2.0: at 2.45 R2 holds 7 slots,
    so 52 are free and 41 evictable: 93, but 53 once R1's hit of 40 is locked, and R1 needs 10 + 45 =
    55: refused (without the lock it would be admitted at 2.45). It is admitted when R2 finishes at
    40.45 (100 available, 60 with the lock)."""
    requests = [
        request(0, 0.0, 40, 1, prompt=((1, 40),)),
        request(2, 0.0, 5, 40, prompt=((9, 5),)),
        request(1, 2.0, 50, 45, prompt=((1, 40), (2, 10))),
    ]
    engine = run_in_a_pool_of_100(requests, step_mode)
    assert admitted(engine) == pytest.approx({0: 0.0, 2: 0.0, 1: 40.45})
    assert {r.request_id: r.cached_prompt_tokens for r in engine.records} == {0: 0, 2: 0, 1: 40}


def test_lpm_holds_back_nothing_without_a_prefix_cache():
    """SGLang runs FCFS when its radix cache is off (``_validate_and_adjust_policy``): with plain
    paging R1 and R2, sharing 40 tokens, are admitted together as under FCFS."""
    requests = [
        request(1, 0.0, 50, 5, prompt=((5, 40), (6, 10))),
        request(2, 0.0, 50, 5, prompt=((5, 40), (7, 10))),
        request(3, 0.0, 40, 5, prompt=((8, 40),)),
    ]
    lpm = run("paged", PoolSpec(400, 16, 128), requests, max_num_seqs=2, schedule_policy="lpm", **SGLANG)
    assert admitted(lpm) == pytest.approx({1: 0.0, 2: 0.0, 3: 6.0})


@pytest.mark.parametrize("step_mode", ["single", "skip"])
@pytest.mark.parametrize(
    ("mixed", "iterations", "decays", "r0_finish"),
    [(False, 52, 50, 53.1), (True, 51, 49, 52.1)],
)
def test_new_token_ratio_decays_once_per_decode_batch(step_mode, mixed, iterations, decays, r0_finish):
    """SGLang lowers new_token_ratio once per decode batch it runs (update_running_batch), from 0.7 by
    0.602 / 600: not for a prefill batch, nor (--enable-mixed-chunk) for one that prefills a prompt
    beside the decoding requests. R0 (prompt 100, output 51) prefills in iteration 1 ([0, 2)) and
    decodes 50 tokens after it; R1 (prompt 10, output 1) arrives at 10.5, during iteration 10
    ([10, 11)), and is admitted at 11. By default its prefill is a batch of its own ([11, 12.1)): R0
    waits for it, decodes its 41 tokens left from 12.1 and finishes at 53.1, after 52 iterations of
    which 50 decode. Mixed, R1 prefills beside R0's token ([11, 12.1)): 51 iterations, 49 decode only,
    R0 done at 2 + 50 + 0.1."""
    requests = [request(0, 0.0, 100, 51), request(1, 10.5, 10, 1)]
    engine = run("radix", PoolSpec(4000, 16, 1024), requests, step_mode, enable_mixed_chunk=mixed, **SGLANG)
    assert admitted(engine) == pytest.approx({0: 0.0, 1: 11.0})
    assert times(engine)[1] == pytest.approx((11.0, 12.1, 12.1, "finished"))
    assert times(engine)[0][2] == pytest.approx(r0_finish)
    assert engine.counters.iterations == iterations
    assert engine.scheduler.new_token_ratio == pytest.approx(0.7 - decays * 0.602 / 600, rel=1e-12)


@pytest.mark.parametrize("step_mode", ["single", "skip"])
@pytest.mark.parametrize(
    ("mixed", "r1_first_token", "r0_finish", "decays"),
    [(False, 11.6, 35.6, 29), (True, 12.6, 30.6, 23)],
)
def test_a_chunked_prompt_stalls_the_decode_batch_unless_mixed(
    step_mode, mixed, r1_first_token, r0_finish, decays
):
    """chunked_prefill_size 10. R0 (prompt 10, output 30) prefills in iteration 1 ([0, 1.1)) and
    decodes 29 tokens after it; R1 (prompt 50, output 1) arrives at 5.5 and is admitted at 6.1. By
    default its 50 tokens are 5 prefill batches of 10 (1.1 s each), R0 waiting: R1's first token at
    11.6, R0's 24 tokens left from there, done at 35.6; all 29 decode batches decay the ratio. Mixed
    (--enable-mixed-chunk), R0's token takes one of each chunk's 10: 6 chunks (9 x 5 + 5), each beside
    R0's decode (1.0 + 0.09 or 0.05 s), R1's first token at 6.1 + 6 + 0.5 = 12.6, R0 done at 30.6;
    29 - 6 = 23 decode-only iterations decay it. Skipping events, either way four wake-ups: R0's
    prefill; its decode batches up to the one R1 arrives in; R1's admission and the iterations of its
    prompt after it, one jump to the one that completes it (the 5 prefill batches alone, their decode
    clock stopped; or the 6 mixed chunks, R1 having taken the whole queue); R0's decode batches to its
    end."""
    requests = [request(0, 0.0, 10, 30), request(1, 5.5, 50, 1)]
    engine = run(
        "radix",
        PoolSpec(4000, 16, 1024),
        requests,
        step_mode,
        chunked_prefill_size=10,
        enable_mixed_chunk=mixed,
        **SGLANG,
    )
    assert times(engine)[1] == pytest.approx((6.1, r1_first_token, r1_first_token, "finished"))
    assert times(engine)[0][2] == pytest.approx(r0_finish)
    assert engine.counters.output_tokens == 30 + 1  # (a prefill batch decodes no token)
    assert engine.scheduler.new_token_ratio == pytest.approx(0.7 - decays * 0.602 / 600, rel=1e-12)
    assert engine.counters.iterations == 1 + 29 + (5 if not mixed else 0)
    assert engine.wakeups == (4 if step_mode == "skip" else engine.counters.iterations)


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_a_run_stopped_inside_the_prefill_batches(step_mode):
    """The stream of the test above, stopped at 9.0 s, inside R1's third prefill batch ([8.3, 9.4)):
    8 iterations ended (R0's prefill, its 5 decode batches, R1's first two prefill batches), R0 has
    its first token and 5 more, and both requests are unfinished, whether the prefill batches were
    stepped or jumped over (3 wake-ups)."""
    requests = [request(0, 0.0, 10, 30), request(1, 5.5, 50, 1)]
    engine = run(
        "radix", PoolSpec(4000, 16, 1024), requests, step_mode, chunked_prefill_size=10, until_s=9.0, **SGLANG
    )
    assert engine.counters.iterations == 8 and engine.counters.output_tokens == 6
    assert times(engine) == {0: (0.0, 1.1, None, "unfinished"), 1: (6.1, None, None, "unfinished")}
    assert engine.wakeups == (3 if step_mode == "skip" else 9)


@pytest.mark.parametrize(("second_prompt", "second_admitted"), [(40, 1.6), (39, 0.0)])
def test_max_prefill_tokens_holds_the_second_prompt_to_the_next_iteration(second_prompt, second_admitted):
    """max_prefill_tokens 100 (``rem_input_tokens``): R0's 60 tokens are admitted (the first admission
    may take any), leaving 40; a second prompt of 40 is refused (SGLang stops at new tokens >= what is
    left) and waits for the next iteration, which starts when R0's prefill ends, 1 + 60 x 0.01 = 1.6 s;
    one of 39 joins R0 at 0."""
    requests = [request(0, 0.0, 60, 5), request(1, 0.0, second_prompt, 5)]
    pool = PoolSpec(4000, 16, 1024)
    engine = run("radix", pool, requests, max_prefill_tokens=100, **SGLANG)
    assert admitted(engine) == pytest.approx({0: 0.0, 1: second_admitted})


def test_the_new_token_ratio_budget_refuses_what_vllm_admits():
    """Pool of 1,000 slots. R0 (100 + 800 out) and R1 (100 + 500 out) arrive together. vLLM admits
    both (their prompts fit) and preempts later. SGLang admits R0, budgeting its 800 output tokens:
    1,000 - 100 - 800 = 100 left, below R1's 100 + 500. While R0 runs, the budget is 900 - k minus
    (800 - k) x new_token_ratio after k tokens, the ratio falling from 0.7 by 0.602 / 600 a step to
    0.098: it stays below 600, so R1 waits until R0 finishes at 2.0 + 799 = 801 s."""
    requests = [request(0, 0.0, 100, 800), request(1, 0.0, 100, 500)]
    pool = PoolSpec(1000, 16, 1024)
    vllm = run("radix", pool, requests)
    sglang = run("radix", pool, requests, **SGLANG)
    assert admitted(vllm) == {0: 0.0, 1: 0.0}
    assert vllm.counters.preemptions > 0
    assert times(sglang)[0] == pytest.approx((0.0, 2.0, 801.0, "finished"))
    assert admitted(sglang)[1] == pytest.approx(801.0)
    assert sglang.counters.preemptions == 0
    assert sglang.scheduler.new_token_ratio == pytest.approx(0.098)  # 799 decode steps: at the floor


@pytest.mark.parametrize(("mixed", "r0_finish", "r1_finish"), [(False, 61.3, 86.65), (True, 60.3, 86.64)])
def test_a_retraction_takes_the_fewest_decoded_and_resets_the_ratio(mixed, r0_finish, r1_finish):
    """Pool of 100, conservativeness 0 (new_token_ratio 0: running requests reserve nothing; a new
    one still budgets its own output). R0 (10 + 60 out) is admitted at 0 and takes its first token at
    1.1. R1 (20 + 60 out) arrives at 0.5 and is admitted at 1.1 (80 < 89 free); its prefill takes
    1.2 s, first token at 2.3. By default R0 waits for that prefill batch; mixed, it decodes beside
    it. Once the pool is full, at R0's 36th token, R1 is the victim (fewest decoded tokens, then the
    longer prompt): retracted without this iteration's token (its decoded tokens freed, not cached)
    and requeued; the ratio becomes (36 + 20 x 1) / 60. R1 fits again when R0 finishes: its prompt
    (20) is still cached, its 35 (mixed: 34) decoded tokens are recomputed (1.35 s; mixed beside a
    last decode, 1.34 s), then 24 (25) more steps."""
    requests = [request(0, 0.0, 10, 60), request(1, 0.5, 20, 60)]
    for step_mode in ("single", "skip"):
        engine = run_in_a_pool_of_100(requests, step_mode, enable_mixed_chunk=mixed)
        got = times(engine)
        assert got[0] == pytest.approx((0.0, 1.1, r0_finish, "finished"))
        assert got[1] == pytest.approx((1.1, 2.3, r1_finish, "finished"))
        assert [record.preemptions for record in engine.records] == [0, 1]
        assert engine.scheduler.new_token_ratio == pytest.approx(56 / 60)  # no decay at conservativeness 0
        assert engine.policy.stats.prefix_cache_hits == 20  # R1's recompute hit its cached prompt
        # The tree took R0's prompt (10) and R1's (20) when they ran, and 60 more tokens of each when
        # it finished; the retraction inserted nothing (SGLang releases a retracted request without
        # inserting it). It ends with 90: the other 60 were evicted.
        assert engine.policy.tree.total_tokens == 90
        assert engine.policy.stats.evictions == 10 + 20 + 60 + 60 - 90


@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_a_request_refused_for_kv_tokens_waits_until_a_running_one_leaves(mixed, step_mode):
    """batch_is_full: pool of 100, conservativeness 0. R0 (10 + 60 out) and R1 (20 + 60 out) both
    arrive at 0: R0 is admitted (10 + 60 < 100), R1 refused in the same round (20 + 60 >= 90 - 60,
    R0's own output budgeted). From the next iteration R1 would fit (80 < 89 free, running requests
    reserving nothing), but SGLang tries the queue again only once the batch shrinks: R1 waits for R0
    to finish at 1.1 + 59 = 60.1, then prefills (1.2 s) and decodes its 59 tokens left: done at 120.3.
    Nothing is retracted. The wait is booked to KV memory."""
    requests = [request(0, 0.0, 10, 60), request(1, 0.0, 20, 60)]
    engine = run_in_a_pool_of_100(requests, step_mode, enable_mixed_chunk=mixed)
    got = times(engine)
    assert got[0] == pytest.approx((0.0, 1.1, 60.1, "finished"))
    assert got[1] == pytest.approx((60.1, 61.3, 120.3, "finished"))
    assert [record.preemptions for record in engine.records] == [0, 0]
    frame = engine.recorder.frame()
    waiting = frame[(frame.time_s > 0) & (frame.time_s < 60.1)]
    assert len(waiting) and set(waiting.admission_blocker) == {ADMISSION_BLOCKERS.index("kv_memory")}


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_a_request_refused_at_its_prompts_end_gives_way_to_a_decode_batch(step_mode):
    """Pool of 4 blocks of 16 (paged), conservativeness 0. R0 (16 + 20 out) prefills in [0, 1.16),
    its first token taking a second block. R1 (16, two samples of 5) arrives at 0.5 and prefills in
    [1.16, 2.32) (a third block); its samples' first tokens need two more blocks, one is free: R1,
    fewest decoded, is preempted (kvsim gives a prompt its first tokens' slots at its end, SGLang at
    the next decode batch, where it retracts). So [2.32, 3.32) is that decode batch: R0's second
    token, the ratio re-estimated (min(1, (decoded + 20) / 20) = 1). Then R1 is over the budget
    (21 >= 32 free - 18 x 1 reserved) and waits for R0 to leave (batch_is_full): R0's 18 tokens left end at
    21.32; R1 prefills again [21.32, 22.48) (its first token stays the one at 2.32), 4 more steps:
    26.48. Without the decode batch after a preemption, R1 would be admitted and preempted at every
    iteration while R0 never decoded (until_s bounds that)."""
    requests = [request(0, 0.0, 16, 20), request(1, 0.5, 16, 5, n=2)]
    engine = run(
        "paged",
        PoolSpec(64, 16, 256),
        requests,
        step_mode,
        until_s=100.0,
        schedule_conservativeness=0.0,
        **SGLANG,
    )
    got = times(engine)
    assert got[0] == pytest.approx((0.0, 1.16, 21.32, "finished"))
    assert got[1] == pytest.approx((1.16, 2.32, 26.48, "finished"))
    assert [record.preemptions for record in engine.records] == [0, 1]
    assert engine.counters.iterations == 26
    assert engine.scheduler.new_token_ratio == 1.0


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_each_sample_is_budgeted_as_a_request_of_its_own(step_mode):
    """SGLang runs a request's n samples as n requests (the prompt cached first), each budgeted its
    own output. R0 (20 + 10) prefills in [0, 1.2) and decodes to 10.2. R1 (20, two samples of 30)
    arrives at 0.5 and is tried at 1.2: 20 + 2 x 30 = 80 new tokens against 100 - 21 = 79 free
    (R0 reserves nothing at conservativeness 0): refused, and batch_is_full holds it until R0 leaves.
    Budgeted once (20 + 30 = 50), it would have been admitted at 1.2. Admitted at 10.2, it prefills
    to 11.4 and decodes 29 steps to 40.4."""
    requests = [request(0, 0.0, 20, 10), request(1, 0.5, 20, 30, n=2)]
    engine = run_in_a_pool_of_100(requests, step_mode)
    assert times(engine) == {
        0: pytest.approx((0.0, 1.2, 10.2, "finished")),
        1: pytest.approx((10.2, 11.4, 40.4, "finished")),
    }


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_batch_is_full_resets_when_one_running_request_leaves(step_mode):
    """Pool of 100, conservativeness 0. At 0, R0 (10 + 20 out) and R1 (10 + 50) are admitted (30 and
    60 tokens against 100 and then 90 - 20 free), R2 (10 + 30) refused (40 >= 80 - 70): batch_is_full.
    Both prefill in [0, 1.2). R0 finishes at 1.2 + 19 = 20.2: the batch shrinks from 2 to 1, the flag
    resets, and R2 fits (40 < 70 free, R1 reserving nothing): it prefills in [20.2, 21.3), R1
    waiting, and decodes its 29 tokens left while R1 does: R2 done at 50.3, R1 (30 tokens left at
    21.3) at 51.3. Had the flag waited for an empty batch, R2 would start at R1's end."""
    requests = [request(0, 0.0, 10, 20), request(1, 0.0, 10, 50), request(2, 0.0, 10, 30)]
    engine = run_in_a_pool_of_100(requests, step_mode)
    assert times(engine) == {
        0: pytest.approx((0.0, 1.2, 20.2, "finished")),
        1: pytest.approx((0.0, 1.2, 51.3, "finished")),
        2: pytest.approx((20.2, 21.3, 50.3, "finished")),
    }


@pytest.mark.parametrize("mixed", [False, True])
def test_the_ratio_never_decays_in_an_iteration_that_retracts(monkeypatch, mixed):
    """``update_running_batch`` either retracts (and re-estimates the ratio) or decays it, never both
    in one decode batch: recorded by iteration on a tight random stream that retracts twice."""
    calls: list[tuple[str, int]] = []

    class Recording(SGLangScheduler):
        def decode_steps(self, steps: int) -> None:
            calls.append(("decay", self.engine.clock.iteration))
            super().decode_steps(steps)

        def after_preemption(self, engine) -> None:
            self.engine = engine
            calls.append(("retract", engine.clock.iteration))
            super().after_preemption(engine)

        def admit(self, engine, budget, chunks):
            self.engine = engine
            return super().admit(engine, budget, chunks)

    monkeypatch.setitem(SCHEDULERS, "sglang", Recording)
    pool, _, shape = SCENARIOS["tight"]
    engine = run(
        "radix", pool, random_requests(66, 50, **shape), "single", enable_mixed_chunk=mixed, **SGLANG
    )
    assert isinstance(engine.scheduler, Recording) and engine.counters.preemptions > 0
    retracting = {iteration for kind, iteration in calls if kind == "retract"}
    assert retracting and not retracting & {iteration for kind, iteration in calls if kind == "decay"}


def test_chunked_prefill_size_and_max_prefill_tokens_are_honoured():
    """A 100-token prompt alone with chunked_prefill_size 30: chunks 30, 30, 30, 10, the first token
    at 1.3 x 3 + 1.1 = 5.0 s (max_num_batched_tokens plays no part). With -1 it goes in whole: 2.0 s.
    max_prefill_tokens 100: of two 60-token prompts only the first is admitted at 0 (60 >= 100 - 60);
    the second at the next iteration, 1.6 s."""
    alone = [request(0, 0.0, 100, 1)]
    pool = PoolSpec(400, 16, 128)
    chunked = run("radix", pool, alone, chunked_prefill_size=30, max_num_batched_tokens=8, **SGLANG)
    assert chunked.records[0].first_token_s == pytest.approx(5.0)
    assert chunked.counters.iterations == 4
    whole = run("radix", pool, alone, chunked_prefill_size=-1, **SGLANG)
    assert whole.records[0].first_token_s == pytest.approx(2.0)
    two = [request(0, 0.0, 60, 5), request(1, 0.0, 60, 5)]
    limited = run("radix", pool, two, max_prefill_tokens=100, **SGLANG)
    assert admitted(limited) == pytest.approx({0: 0.0, 1: 1.6})


@pytest.mark.parametrize("options", [{}, {"page_size": 16}])
@pytest.mark.parametrize("schedule_policy", ["fcfs", "lpm"])
@pytest.mark.parametrize("scenario", ["roomy", "chunked", "tight", "unchunked"])
@pytest.mark.parametrize("overlap", [False, True])
def test_event_skipping_equals_single_stepping(options, schedule_policy, scenario, overlap):
    """With the overlap scheduler too (``async_scheduling``): skipping let a jump run one iteration
    past an arrival, as vLLM's async scheduling does, while SGLang's admission saw the arrival at
    once, so the two step modes disagreed (found by ``tools/fuzz_step_modes.py``)."""
    pool, knobs, shape = SCENARIOS[scenario]
    knobs = dict(knobs)
    if "max_num_batched_tokens" in knobs:
        knobs["chunked_prefill_size"] = knobs.pop("max_num_batched_tokens")
    if knobs.pop("enable_chunked_prefill", True) is False:
        knobs["chunked_prefill_size"] = -1
    requests = random_requests(1, 50, **shape)
    both = [
        run(
            "radix",
            pool,
            requests,
            mode,
            costs=EQUIVALENCE_COSTS,
            options=options,
            beam_reparent_prob=0.2,
            schedule_policy=schedule_policy,
            async_scheduling=overlap,
            **SGLANG,
            **knobs,
        )
        for mode in ("single", "skip")
    ]
    assert_same_results(*both)
    assert both[1].jumps.decode > 0


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_the_overlap_scheduler_sees_a_request_at_the_batch_after_next(step_mode):
    """SGLang's overlap loop receives requests, schedules batch k+1 and launches it while batch k
    runs: a request that arrives during batch k is first scheduled in batch k+2. R0 (10 + 20 out) runs
    alone: prefill 0-1.1 s (1 + 10 x 0.01), then decode steps of 1.1 s (1 + 0.1 per sequence). R1
    (10 + 2 out) arrives at 1.5 s, during the first decode step (1.1-2.2), which was scheduled at 0
    ... so the step after it (2.2-3.3) was scheduled at 1.1, before R1 came: R1 is admitted at 3.3.
    Without overlap it is admitted at 2.2."""
    requests = [request(0, 0.0, 10, 20), request(1, 1.5, 10, 2)]
    pool = PoolSpec(400, 16, 128)
    costs = RoundCostModel(intercept_s=1.0, per_seq_s=0.1, prefill_per_token_s=0.01)
    overlap = run("radix", pool, requests, step_mode, costs=costs, async_scheduling=True, **SGLANG)
    plain = run("radix", pool, requests, step_mode, costs=costs, async_scheduling=False, **SGLANG)
    assert admitted(plain)[1] == pytest.approx(2.2)
    assert admitted(overlap)[1] == pytest.approx(3.3)
    assert admitted(overlap)[0] == admitted(plain)[0] == 0.0  # (nothing running: seen at once)


def test_a_retracted_request_goes_back_ahead_of_the_requests_not_received_yet():
    """The queue holds A (queued at 1), B (at 5) and C (at 6); the iteration was scheduled at 4, so
    SGLang has received A only. A request retracted now is appended to SGLang's queue behind A, and
    B and C join when they are received: the order is A, retracted, B, C."""
    from collections import deque

    from sim.engine.decoding import RequestState
    from sim.engine.schedulers.base import SchedulingEngine
    from sim.outputs.metrics import RequestRecord

    class QueueOnly(SchedulingEngine):
        """An engine with a queue and the time its iteration was scheduled, nothing else."""

        def __init__(self, waiting):
            self.waiting = waiting

        def scheduled_at(self):
            return 4.0

    def queued(request_id, at):
        state = RequestState(request(request_id, at, 8, 4), RequestRecord(request_id, at, 8, 4, 1, 1, 4))
        state.queued_s = at
        return state

    engine = QueueOnly(deque([queued(0, 1.0), queued(1, 5.0), queued(2, 6.0)]))
    scheduler = SGLangScheduler(EngineKnobs(max_model_len=100, scheduler="sglang"))
    scheduler.requeue(engine, queued(9, 0.5))  # (A 0, B 1, C 2, the retracted one 9)
    assert [state.request.request_id for state in engine.waiting] == [0, 9, 1, 2]


def test_vllm_mode_ignores_the_sglang_keys():
    """``scheduler: vllm`` (the default) runs as before: the SGLang keys change nothing."""
    pool, knobs, shape = SCENARIOS["tight"]
    requests = random_requests(2, 50, **shape)
    for policy in ("prefix", "radix"):
        plain = run(policy, pool, requests, **knobs)
        keyed = run(
            policy,
            pool,
            requests,
            scheduler="vllm",
            schedule_policy="lpm",
            schedule_conservativeness=0.3,
            chunked_prefill_size=5,
            max_prefill_tokens=7,
            **knobs,
        )
        assert_same_results(plain, keyed)
        assert plain.counters.preemptions > 0


def test_config_keys_and_defaults():
    engine = EngineConfig()
    assert (engine.scheduler, engine.schedule_policy, engine.schedule_conservativeness) == (
        "vllm",
        "fcfs",
        1.0,
    )
    assert (engine.chunked_prefill_size, engine.max_prefill_tokens) == (None, 16384)
    assert engine.enable_mixed_chunk is False  # SGLang's default: prefill batches first
    # SGLang's IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD and _DEPRIORITIZE_THRESHOLD
    assert (engine.in_batch_prefix_check_tokens, engine.in_batch_prefix_deprioritize_tokens) == (32, 32)
    assert [chunked_prefill_size_for(gib * 2**30) for gib in (24, 80, 141, 192)] == [2048, 8192, 8192, 16384]
    for bad, message in [
        ({"scheduler": "tgi"}, "scheduler"),
        ({"chunked_prefill_size": 0}, "chunked_prefill_size must be a positive"),
        ({"schedule_conservativeness": -1}, "schedule_conservativeness"),
        ({"scheduler": "sglang", "preemption_mode": "swap"}, "retracts requests"),
        (
            {"scheduler": "sglang", "schedule_policy": "lpm", "in_batch_prefix_check_tokens": -1},
            "check_tokens",
        ),
        (
            {"scheduler": "sglang", "schedule_policy": "lpm", "in_batch_prefix_deprioritize_tokens": 0},
            "deprioritize_tokens",
        ),
    ]:
        with pytest.raises(ValidationError, match=message):
            EngineConfig(**bad)


def test_sglang_keys_under_the_vllm_scheduler_are_refused_naming_the_scheduler():
    # They used to be ignored silently (results identical to leaving them out, issue 41).
    for bad in (
        {"schedule_policy": "lpm"},
        {"max_prefill_tokens": 4096, "chunked_prefill_size": 512},
        {"enable_mixed_chunk": True},  # (vLLM's iterations always mix)
        {"schedule_policy": "lpm", "in_batch_prefix_check_tokens": 64},
    ):
        with pytest.raises(ValidationError, match="engine.scheduler vllm ignores"):
            EngineConfig(**bad)
        assert EngineConfig(scheduler="sglang", **bad).scheduler == "sglang"
    # their defaults, written out, change nothing under either scheduler and stay accepted
    assert EngineConfig(schedule_policy="fcfs", max_prefill_tokens=16384).scheduler == "vllm"


def test_in_batch_thresholds_need_the_lpm_order():
    """Only lpm holds requests back; under fcfs the thresholds would change nothing, so they are
    refused there, naming the key and the order; their defaults written out stay accepted."""
    with pytest.raises(ValidationError, match=r"in_batch_prefix_deprioritize_tokens: 16: .*lpm only.*'fcfs'"):
        EngineConfig(scheduler="sglang", in_batch_prefix_deprioritize_tokens=16)
    lpm = EngineConfig(scheduler="sglang", schedule_policy="lpm", in_batch_prefix_deprioritize_tokens=16)
    assert lpm.in_batch_prefix_deprioritize_tokens == 16
    assert EngineConfig(scheduler="sglang", in_batch_prefix_check_tokens=32).schedule_policy == "fcfs"


def test_the_sglang_scheduler_on_a_policy_it_was_not_built_for_warns(tmp_path):
    from sim.config import ConfigWarning, validate_experiment

    data = {
        "name": "x",
        "model": "Llama-3.1-8B",
        "gpu": "A100-80GB",
        "engine": {"scheduler": "sglang"},
        "workload": {
            "num_requests": 5,
            "arrival": {"kind": "poisson", "rate_per_s": 1},
            "prompt_len": {"kind": "constant", "value": 100},
            "output_len": {"kind": "constant", "value": 10},
        },
        "variants": [{"name": "r", "policy": "radix"}, {"name": "c", "policy": "contiguous"}],
    }
    with pytest.warns(
        ConfigWarning, match="variant c: engine.scheduler sglang runs policy contiguous"
    ) as seen:
        validate_experiment(data, tmp_path / "x.yaml")
    assert len(seen) == 1  # radix is SGLang's own: no warning


# ------------------------------------------------------------------------------------------------
# The retraction rules alone, on a stand-in engine (the scheduler sees the engine through a protocol;
# the compiled build checks the clock's and the pool's classes, which a stand-in is not: these run on
# the Python sources, and the end-to-end tests above run the same rules in both builds)
# ------------------------------------------------------------------------------------------------


class _Request:
    def __init__(self, prompt_len: int, longest_output_len: int = 100):
        self.prompt_len = prompt_len
        self.longest_output_len = longest_output_len


class _State:
    def __init__(
        self, name: str, generated: int, prompt_len: int, longest_output_len: int = 100, samples: int = 1
    ):
        self.name, self.generated, self.decoding = name, generated, True
        self.request = _Request(prompt_len, longest_output_len)
        self.sample_lens = [longest_output_len] * samples

    @property
    def width(self) -> int:
        return len(self.sample_lens)


class _Clock:
    @staticmethod
    def generated(state: _State) -> int:
        return state.generated


class _Pool:
    def __init__(self, free_slots: int):
        self.free_slots = free_slots

    def available_slots(self) -> int:
        return self.free_slots


class _Engine:
    def __init__(self, running: list[_State], free_slots: int = 0):
        self.running, self.clock, self.kv = running, _Clock(), _Pool(free_slots)


def _sglang() -> SGLangScheduler:
    return SGLangScheduler(EngineKnobs(max_model_len=4096, scheduler="sglang"))


@pytest.mark.python_sources
@pytest.mark.parametrize(
    ("running", "victim"),
    [
        # fewest decoded tokens first, whatever their prompts or order
        ([("a", 5, 10), ("b", 3, 10), ("c", 9, 10)], "b"),
        # among the fewest decoded, the longest prompt
        ([("a", 3, 10), ("b", 3, 30), ("c", 3, 20)], "b"),
        # among equals, the newest (retract_decode sorts stably and pops from the end)
        ([("a", 5, 10), ("b", 3, 20), ("c", 3, 20)], "c"),
        ([("a", 3, 20), ("b", 3, 20), ("c", 5, 10)], "b"),
    ],
)
def test_the_retraction_victim_is_fewest_decoded_then_longest_prompt_then_newest(running, victim):
    engine = _Engine([_State(*entry) for entry in running])
    assert _sglang().preemption_victim(engine).name == victim  # type: ignore[arg-type]


@pytest.mark.python_sources
@pytest.mark.parametrize(
    ("running", "free_slots", "more"),
    [
        (1, 0, False),  # never the last request
        (2, 39, True),  # 20 tokens per request left: 40 for two
        (2, 40, False),
        (3, 59, True),
        (3, 60, False),
    ],
)
def test_retraction_goes_on_until_twenty_free_tokens_per_request_but_never_the_last(
    running, free_slots, more
):
    engine = _Engine([_State(str(index), 0, 10) for index in range(running)], free_slots)
    assert _sglang().needs_more_room(engine) is more  # type: ignore[arg-type]


@pytest.mark.python_sources
def test_samples_count_as_requests_in_budgets_and_retraction():
    """A request of 3 samples of 100 tokens that decoded 20 is three SGLang requests: budgeted 3 x 80
    (each clipped at 4,096 on its own), reserving 3 x 80 x 0.7; it needs 20 free tokens per sample
    to stop retracting; and the ratio's estimate counts its decoded tokens, max_new_tokens and the
    20-token steps three times."""
    three = _State("a", 20, 10, longest_output_len=100, samples=3)
    assert SGLangScheduler.budgeted_output(_Engine([three]), three) == 240  # type: ignore[arg-type]
    huge = _State("b", 0, 10, longest_output_len=5000, samples=2)
    assert SGLangScheduler.budgeted_output(_Engine([huge]), huge) == 2 * 4096  # type: ignore[arg-type]
    assert _sglang().running_reservation(_Engine([three])) == pytest.approx(240 * 0.7)  # type: ignore[arg-type]
    one = _State("c", 0, 10)
    assert _sglang().needs_more_room(_Engine([three, one], free_slots=79)) is True  # type: ignore[arg-type]
    assert _sglang().needs_more_room(_Engine([three, one], free_slots=80)) is False  # type: ignore[arg-type]
    scheduler = _sglang()
    scheduler.reset_after_retraction(_Engine([three, _State("d", 40, 5, 200)]))  # type: ignore[arg-type]
    assert scheduler.new_token_ratio == pytest.approx((3 * 20 + 40 + 20 * 4) / (3 * 100 + 200))


@pytest.mark.python_sources
def test_new_token_ratio_after_a_retraction_by_hand():
    """``retract_decode``: (decoded + 20 x requests left) / their max_new_tokens, at most 1."""
    scheduler = _sglang()
    two = _Engine([_State("a", 10, 5, 100), _State("b", 30, 5, 300)])
    scheduler.reset_after_retraction(two)  # type: ignore[arg-type]
    assert scheduler.new_token_ratio == pytest.approx((10 + 30 + 20 * 2) / 400)
    nearly_done = _Engine([_State("a", 90, 5, 100)])
    scheduler.reset_after_retraction(nearly_done)  # type: ignore[arg-type]
    assert scheduler.new_token_ratio == 1.0  # (90 + 20) / 100 = 1.1, capped
    none_decoding = _Engine([])
    scheduler.reset_after_retraction(none_decoding)  # type: ignore[arg-type]
    assert scheduler.new_token_ratio == 1.0  # nothing left to estimate from


def test_sglang_settings_by_hand():
    """SGLang's server_args and constants: chunked_prefill_size <= 0 is no chunking (any prompt whole),
    1 is chunks of one token; new_token_ratio starts at min(0.7 x conservativeness, 1), floors at 0.14
    of that, and decays to it in 600 steps; the prefill budget is the chunk, less the decode tokens
    when they are mixed in."""

    def scheduler(**knobs) -> SGLangScheduler:
        return SGLangScheduler(EngineKnobs(max_model_len=4096, scheduler="sglang", **knobs))

    unchunked = scheduler(chunked_prefill_size=-1)
    assert not unchunked.chunks_prompts and unchunked.prefill_budget(100) > 10**15
    one = scheduler(chunked_prefill_size=1)
    assert one.chunks_prompts and one.prefill_budget(0) == 1
    assert scheduler(chunked_prefill_size=8192).prefill_budget(100) == 8192  # a prefill batch of its own
    assert scheduler(chunked_prefill_size=8192, enable_mixed_chunk=True).prefill_budget(100) == 8092
    default = scheduler()
    assert default.new_token_ratio == pytest.approx(0.7) and default.min_new_token_ratio == pytest.approx(
        0.098
    )
    assert default.new_token_ratio_decay == pytest.approx((0.7 - 0.098) / 600)
    default.decode_steps(300)
    assert default.new_token_ratio == pytest.approx(0.7 - 300 * (0.7 - 0.098) / 600)
    cautious = scheduler(schedule_conservativeness=2.0)
    assert cautious.new_token_ratio == 1.0 and cautious.min_new_token_ratio == pytest.approx(0.14)


@pytest.mark.python_sources
def test_budgets_of_a_request_past_its_output_and_of_an_empty_batch():
    """A request that has generated its longest output is budgeted 0 more tokens (not 1), and a
    batch with nothing running reserves nothing."""
    done = _State("a", 120, 10, longest_output_len=100)
    assert SGLangScheduler.budgeted_output(_Engine([done]), done) == 0  # type: ignore[arg-type]
    assert _sglang().running_reservation(_Engine([])) == 0.0  # type: ignore[arg-type]


@pytest.mark.python_sources
def test_every_output_budget_is_clipped_at_4096_tokens():
    # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION: a request is budgeted at most 4,096 more tokens, in
    # admission as in what the running batch reserves (x new_token_ratio, 0.7 at the start):
    # (min(10,000, 4,096) + min(300 - 100, 4,096)) x 0.7 = 3,007.2.
    long = _State("a", 0, 10, longest_output_len=10_000)
    short = _State("b", 100, 10, longest_output_len=300)
    assert _sglang().running_reservation(_Engine([long, short])) == pytest.approx(3007.2)  # type: ignore[arg-type]
    assert SGLangScheduler.budgeted_output(_Engine([long]), long) == 4096  # type: ignore[arg-type]


class _Match:
    def __init__(self, cached_tokens: int):
        self.cached_tokens = cached_tokens


class _Waiting:
    def __init__(self, request_id: int):
        self.request = type("R", (), {"request_id": request_id})()


class _MatchingEngine:
    """A queue whose request i has i cached tokens (its prompt is 40 tokens of stream i: no two share
    a token), over a pool with a prefix cache."""

    def __init__(self, waiting: int):
        from collections import deque

        self.waiting = deque(_Waiting(index) for index in range(waiting))
        self.kv = self

    @staticmethod
    def content_on_admission(state: _Waiting) -> tuple[tuple[int, int], ...]:
        return ((state.request.request_id, 40),)

    @staticmethod
    def match(content: tuple[tuple[int, int], ...]) -> _Match:
        return _Match(content[0][0])

    @staticmethod
    def may_share() -> bool:
        return True


@pytest.mark.python_sources
@pytest.mark.parametrize(("waiting", "sorted_by_hit"), [(128, True), (129, False)])
def test_lpm_sorts_up_to_128_waiting_and_keeps_arrival_order_above(waiting, sorted_by_hit):
    # SchedulePolicy._determine_active_policy: lpm turns into FCFS when *more than* 128 wait.
    scheduler = SGLangScheduler(EngineKnobs(max_model_len=4096, scheduler="sglang", schedule_policy="lpm"))
    engine = _MatchingEngine(waiting)
    hits = scheduler.order_queue(engine)  # type: ignore[arg-type]
    order = [state.request.request_id for state in engine.waiting]
    if sorted_by_hit:
        assert order == list(range(waiting - 1, -1, -1)) and hits[5] == 5
    else:
        assert order == list(range(waiting)) and hits == {}


@pytest.mark.parametrize(("second_output", "second_admitted"), [(20, False), (19, True)])
def test_a_request_that_exactly_fills_the_remaining_budget_is_refused(second_output, second_admitted):
    """Pool of 100, conservativeness 0 (running requests reserve nothing beyond what admission
    budgeted this round). R0 (10 + 60 out) is admitted at 0, leaving 100 - 10 - 60 = 30. R1's 10 new
    tokens plus its output: 10 + 20 = 30 is refused (``add_one_req`` needs strictly less than what is
    left), 10 + 19 = 29 joins R0 at 0."""
    requests = [request(0, 0.0, 10, 60), request(1, 0.0, 10, second_output)]
    engine = run_in_a_pool_of_100(requests, "skip")
    assert (admitted(engine)[1] == 0.0) is second_admitted
