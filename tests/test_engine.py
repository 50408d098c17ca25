"""Engine scenarios worked out by hand, and event skipping == single stepping."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from policies import PoolSpec, make_policy
from policies.base import MemoryBreakdown
from sim.config import VariantConfig
from sim.engine.core import Engine, EngineKnobs
from sim.engine.jumps import JumpCounts
from sim.outputs.metrics import requests_frame
from sim.runner import summarize
from tests.engine_helpers import ConstantCost, RoundCostModel, request


def run(policy_name, pool, requests, step_mode="skip", costs=None, until_s=None, **knobs):
    options = knobs.pop("options", {})
    policy = make_policy(policy_name, pool, **options)
    engine = Engine(
        policy,
        costs or RoundCostModel(),
        EngineKnobs(max_model_len=pool.max_model_len, step_mode=step_mode, **knobs),
        iter(requests),
        block_size=pool.block_size,
    )
    engine.run(until_s)
    return engine


def rows(engine, *extra):
    """The time series as tuples: time, the six breakdown categories, then ``extra`` columns."""
    frame = engine.recorder.frame()
    columns = ["time_s", *[c for c in frame.columns if c.endswith("_tokens")][:6], *extra]
    return [tuple(row) for row in frame[columns].itertuples(index=False)]


def assert_physical_slots_are_the_held_ones(engine):
    """At every row the slots live sequences hold (``physical_tokens``, what is shared counted once)
    are the used, reserved and internally fragmented ones, and never more than they would hold
    unshared (``logical_tokens``)."""
    frame = engine.recorder.frame()
    held = frame[["used_tokens", "reserved_tokens", "internal_fragmentation_tokens"]].sum(axis=1)
    assert (frame["physical_tokens"] == held).all()
    assert (frame["logical_tokens"] >= frame["physical_tokens"]).all()


def times(engine):
    """Each request's times and outcome; NaN (never admitted, never finished) as None: tuples compare
    NaN by identity, which compiled code (sim.native) does not keep."""
    return {
        r.request_id: tuple(
            None if value != value else value for value in (r.admitted_s, r.first_token_s, r.finish_s)
        )
        + (r.outcome,)
        for r in engine.records
    }


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_two_requests_exact_times(step_mode):
    """Decode step 1 s, prefill 0.01 s/token (see RoundCostModel).

    it 1 [0, 1.2):   r0 prefills 20 tokens -> 1.0 + 0.2; first token at 1.2
    it 2 [1.2, 2.3): r0 decodes; r1 (arrived 0.5) prefills 10 -> 1.0 + 0.1; r1's first token at 2.3
    it 3 [2.3, 3.3): both decode; r0 has its 3 tokens, r1 its 2: both finish at 3.3
    """
    engine = run(
        "paged", PoolSpec(160, 16, 128), [request(0, 0.0, 20, 3), request(1, 0.5, 10, 2)], step_mode=step_mode
    )
    got = times(engine)
    assert got[0] == pytest.approx((0.0, 1.2, 3.3, "finished"))
    assert got[1][:3] == pytest.approx((1.2, 2.3, 3.3))
    assert engine.counters.iterations == 3
    assert engine.counters.preemptions == engine.counters.admission_waits == 0
    # Everything freed at the end: the pool is all free again.
    final = rows(engine)[-1]
    assert final[1:7] == (0, 0, 0, 0, 0, 160)


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_async_scheduling_sees_an_arrival_one_iteration_later(step_mode):
    """The scenario above with vLLM's async scheduling: iteration 2 was scheduled when iteration 1
    started (t = 0), before r1 arrived at 0.5, so r1 waits for iteration 3, scheduled at 1.2.

    it 1 [0, 1.2):   r0 prefills 20 tokens -> 1.0 + 0.2; first token at 1.2
    it 2 [1.2, 2.2): r0 decodes alone (its 2nd token)
    it 3 [2.2, 3.3): r0 decodes its 3rd token and finishes; r1 prefills 10 -> 1.0 + 0.1
    it 4 [3.3, 4.3): r1 decodes its 2nd token and finishes
    """
    engine = run(
        "paged",
        PoolSpec(160, 16, 128),
        [request(0, 0.0, 20, 3), request(1, 0.5, 10, 2)],
        step_mode=step_mode,
        async_scheduling=True,
    )
    got = times(engine)
    assert got[0] == pytest.approx((0.0, 1.2, 3.3, "finished"))
    assert got[1] == pytest.approx((2.2, 3.3, 4.3, "finished"))
    assert engine.counters.iterations == 4


def test_async_scheduling_schedules_at_once_when_nothing_runs():
    """An idle engine has no step in flight to schedule ahead of: r1, arriving after r0 finished,
    is scheduled as it arrives, as without async scheduling (r0: 1.2 prefill + 1 decode -> 2.2)."""
    engine = run(
        "paged",
        PoolSpec(160, 16, 128),
        [request(0, 0.0, 20, 2), request(1, 3.0, 10, 2)],
        async_scheduling=True,
    )
    got = times(engine)
    assert got[0] == pytest.approx((0.0, 1.2, 2.2, "finished"))
    assert got[1] == pytest.approx((3.0, 4.1, 5.1, "finished"))


def _two_layer_profile():
    from sim.costs.core import (
        BlockCoefficients,
        CostProfile,
        LayerDecodeCoefficients,
        LayerPrefillCoefficients,
        ProfileCoefficients,
        ProfileCostModel,
        ProfileDevice,
        ProfileModel,
        StepCoefficients,
    )

    zero = BlockCoefficients(intercept_s=0.0, per_block_s=0.0)
    return ProfileCostModel(
        CostProfile(
            measured=True,
            label="test",
            created="2026-11-30",
            kvsim_version="test",
            device=ProfileDevice(kind="cpu", name="test"),
            model=ProfileModel(
                name="m",
                num_layers=2,
                hidden_size=8,
                num_attention_heads=2,
                num_kv_heads=2,
                head_dim=4,
                intermediate_size=16,
                vocab_size=32,
                num_params=1000,
            ),
            dtype="float32",
            block_size=16,
            coefficients=ProfileCoefficients(
                decode_per_layer=LayerDecodeCoefficients(
                    intercept_s=0.25, per_seq_s=0.0, per_context_token_s=0.0
                ),
                decode_per_step=StepCoefficients(intercept_s=0.0, per_seq_s=0.0),
                prefill_per_layer=LayerPrefillCoefficients(
                    intercept_s=0.2, per_token_s=0.005, per_attention_pair_s=0.0
                ),
                block_copy=zero,
                block_swap=zero,
            ),
        )
    )


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_prompts_sharing_an_iteration_pay_one_fixed_cost(step_mode):
    """Two layers: decode step 2 x 0.25 = 0.5 s; a prefill iteration 2 x 0.2 = 0.4 s fixed plus
    2 x 0.005 = 0.01 s per token.

    it 1 [0, 0.7):   both prompts (10 and 20 tokens) prefill together: 0.4 + 0.1 + 0.2 = 0.7
    it 2 [0.7, 1.2): both decode their second token: 0.5
    Charging the fixed cost per chunk on top of the decode intercept (the old bug) gave
    0.5 + (0.4 + 0.1) + (0.4 + 0.2) = 1.6 s for the first iteration."""
    engine = run(
        "paged",
        PoolSpec(160, 16, 128),
        [request(0, 0.0, 10, 2), request(1, 0.0, 20, 2)],
        step_mode=step_mode,
        costs=_two_layer_profile(),
    )
    got = times(engine)
    for request_id in (0, 1):
        assert got[request_id][:3] == pytest.approx((0.0, 0.7, 1.2), rel=1e-12)
        assert got[request_id][3] == "finished"
    assert engine.counters.iterations == 2


@pytest.mark.parametrize("on_oom", ["queue", "fail"])
def test_contiguous_max_reservation_oom_story(on_oom):
    """Pool 100 slots, max_model_len 40: reserving 40 per request fits two requests, not three."""
    pool = PoolSpec(100, 4, 40)
    requests = [request(i, 0.0, 10, 2) for i in range(3)]
    engine = run("contiguous", pool, requests, on_oom=on_oom, options={"reservation": "max"})
    got = times(engine)
    assert got[0] == pytest.approx((0.0, 1.2, 2.2, "finished"))
    assert got[1] == pytest.approx((0.0, 1.2, 2.2, "finished"))
    if on_oom == "fail":
        assert got[2][3] == "failed_oom" and got[2][0] is None  # never admitted
    else:
        # Waits for the two to finish at 2.2, prefills (1.0 + 0.1), decodes one more step.
        assert got[2] == pytest.approx((2.2, 3.3, 4.3, "finished"))
    # The third request waits (queue) or fails (fail): counted once, whatever the retries.
    if on_oom == "fail":
        assert (engine.counters.admission_waits, engine.counters.oom_failures) == (0, 1)
    else:
        assert (engine.counters.admission_waits, engine.counters.oom_failures) == (1, 0)
    # Iteration 2 starts at t=1.2: each request holds its final 12 tokens (10 prompt + 2 outputs) in
    # a 40-slot region: used 24, reserved 0, internal 2 x 28 = 56; the 20-slot hole left cannot serve
    # the next 40-slot reservation: external fragmentation 20. One row at t=1.2: iteration 1's first
    # tokens (used 22, reserved 2) held for no time, since iteration 2 replaced them at once.
    at_1_2 = [row[1:7] for row in rows(engine) if row[0] == pytest.approx(1.2)]
    assert at_1_2 == [(24, 0, 56, 20, 0, 0)]


@pytest.mark.parametrize("on_oom", ["queue", "fail"])
def test_every_request_that_waits_or_fails_for_memory_is_counted(on_oom):
    """As above (two 40-slot reservations fit in 100, not three) with R0 (output 2), R1 (output 4),
    R2 and R3 (output 2). With ``on_oom: fail`` R2 and R3 fail at once: 2 failures. Queued, R2 waits
    (counted once, whatever the retries; R3 behind it is not tried) until R0 ends at 2.2: it runs
    [2.2, 3.3) beside R1 and ends at 4.3. R3, now the queue's head, waits too (the second wait) until
    R1 ends at 4.3: [4.3, 5.4), done at 6.4."""
    pool = PoolSpec(100, 4, 40)
    requests = [
        request(0, 0.0, 10, 2),
        request(1, 0.0, 10, 4),
        request(2, 0.0, 10, 2),
        request(3, 0.0, 10, 2),
    ]
    engine = run("contiguous", pool, requests, on_oom=on_oom, options={"reservation": "max"})
    got = times(engine)
    if on_oom == "fail":
        assert (got[2][3], got[3][3]) == ("failed_oom", "failed_oom")
        assert (engine.counters.admission_waits, engine.counters.oom_failures) == (0, 2)
    else:
        assert got[2] == pytest.approx((2.2, 3.3, 4.3, "finished"))
        assert got[3] == pytest.approx((4.3, 5.4, 6.4, "finished"))
        assert (engine.counters.admission_waits, engine.counters.oom_failures) == (2, 0)


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_preemption_recompute_frees_the_newest_request(step_mode):
    """Pool of 3 blocks x 4 slots. r0 and r1: prompt 4, output 6 (final 10: 3 blocks each).

    it 1 [0, 1.08): both admitted (1 block each, 1 free), 8 prompt tokens: 1.0 + 0.08.
    At 1.08 the first tokens go in: r0 takes the last block; r1 cannot grow, and as the newest
    request it is preempted (1). The preemption came at an iteration's end, so admission goes on:
    it 2 [1.08, 2.12): r0 token 2; r1 readmitted (the freed block), prompt recomputed (1.0 + 0.04);
                 at 2.12 it cannot grow again: preempted (2).
    it 3 [2.12, 3.16), it 4 [3.16, 4.20): the same (preemptions 3 and 4); r0 tokens 3 and 4.
    it 5 [4.20, 5.20): r0's token 5 takes the free block (9 tokens, 3 blocks): r1 cannot be admitted.
    it 6 [5.20, 6.20): r0 token 6: finishes at 6.20.
    it 7 [6.20, 7.24): r1 admitted, 4 tokens prefilled: its (first again) token at 7.24; tokens 2-6
    at 8.24 ... 12.24: finishes at 12.24. Its first token was produced once, at 1.08."""
    engine = run("paged", PoolSpec(12, 4, 12), [request(0, 0.0, 4, 6), request(1, 0.0, 4, 6)], step_mode)
    records = {r.request_id: r for r in engine.records}
    assert (records[0].preemptions, records[1].preemptions) == (0, 4)
    assert engine.counters.preemptions == 4
    # Each preemption follows one refused token: the pool is asked again only once a victim is off.
    assert engine.kv.stats.allocation_failures == 4
    got = times(engine)
    assert got[0] == pytest.approx((0.0, 1.08, 6.20, "finished"))
    assert got[1] == pytest.approx((0.0, 1.08, 12.24, "finished"))
    assert engine.counters.iterations == 12


def test_request_too_long_is_rejected_with_reason():
    engine = run("paged", PoolSpec(160, 16, 64), [request(0, 0.0, 60, 10), request(1, 0.0, 10, 5)])
    got = {r.request_id: r for r in engine.records}
    assert got[0].outcome == "rejected" and "max_model_len=64" in got[0].reason
    assert got[1].outcome == "finished"


def test_samples_that_outgrow_the_pool_together_are_rejected_with_their_total():
    """Pool of 48 one-token blocks. Prompt 10 with samples of 12 and 9 tokens: counted as if every
    sample held the prompt, 2 x 10 + 12 + 9 = 41 slots fit (and they run); samples of 20 and 9:
    20 + 20 + 9 = 49 > 48, rejected on arrival with the total (the samples' lengths differ, so no
    single "x (lengths)" describes them)."""
    pool = PoolSpec(48, 1, 64)
    fits = run("paged", pool, [request(0, 0.0, 10, 12, n=2, sample_output_lens=(12, 9))])
    assert fits.records[0].outcome == "finished"
    over = run("paged", pool, [request(0, 0.0, 10, 20, n=2, sample_output_lens=(20, 9))])
    assert (over.records[0].outcome, over.records[0].reason) == (
        "rejected",
        "2 sequence(s) of 49 tokens in all exceed the KV pool (48 slots) even with nothing else running",
    )


def test_request_that_never_fits_is_rejected_not_retried_forever():
    # max reservation 64 > pool of 48 slots: can never be admitted.
    engine = run("contiguous", PoolSpec(48, 16, 64), [request(0, 0.0, 10, 5)], options={"reservation": "max"})
    assert engine.records[0].outcome == "rejected"
    assert engine.records[0].reason == "does not fit in the KV pool even with nothing else running"


def test_parallel_sampling_shares_prompt_blocks_and_copies_on_write():
    pool = PoolSpec(16 * 16, 16, 128)
    engine = run("prefix", pool, [request(0, 0.0, 20, 5, n=3)])
    assert engine.records[0].outcome == "finished"
    # 20-token prompt: block 1 holds 4 tokens and is shared by 3 samples -> 2 copies on first write.
    assert engine.policy.stats.cow_copies == 2
    paged = run("paged", pool, [request(0, 0.0, 20, 5, n=3)])
    assert paged.policy.stats.fork_copied_tokens == 2 * 20
    # While the 3 samples decode (25 tokens max: 2 blocks each = 6 logical blocks), the shared first
    # block makes 4 physical blocks: 1 - 4/6 saved. Paged copies everything: nothing saved.
    during = [row for row in rows(engine, "physical_tokens", "logical_tokens") if row[-1] == 6 * 16]
    assert during and all(row[-2] == 4 * 16 for row in during)
    # Time-averaged: [0, 1.2) one sequence, 2 blocks, nothing shared (32 slots each way); from the
    # fork at 1.2 to the finish at 5.2 (4 more tokens), 4 physical blocks for 6 logical ones.
    # 1 - (32 x 1.2 + 64 x 4) / (32 x 1.2 + 96 x 4) = 1 - 294.4 / 422.4.
    assert engine.env.now == pytest.approx(5.2)
    saved = engine.recorder.time_averages(engine.env.now)["memory_saved_by_sharing_frac"]
    assert saved == pytest.approx(1 - 294.4 / 422.4, rel=1e-12)
    assert paged.recorder.time_averages(paged.env.now)["memory_saved_by_sharing_frac"] == 0.0


def random_requests(seed: int, count: int, gap: float = 0.4, forks: bool = True):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(gap, count))
    out = []
    for i, arrival in enumerate(arrivals):
        shared = ((1, int(rng.integers(0, 40))),) if rng.random() < 0.5 else ()
        prompt = shared + ((100 + i, int(rng.integers(1, 60))),)
        n = int(rng.choice([1, 1, 1, 2, 3])) if forks else 1
        beam_width = int(rng.choice([1, 1, 1, 3])) if n == 1 and forks else 1
        output_len = int(rng.integers(1, 50))
        # Samples stop independently (sample 0 runs output_len); beams all run to output_len.
        samples = (output_len, *rng.integers(1, 50, n - 1).tolist()) if n > 1 else ()
        out.append(
            request(
                i,
                float(arrival),
                0,
                output_len,
                prompt=prompt,
                n=n,
                beam_width=beam_width,
                sample_output_lens=samples,
            )
        )
    return out


EQUIVALENCE_COSTS = RoundCostModel(
    intercept_s=0.01, per_seq_s=0.001, per_context_token_s=1e-5, prefill_per_token_s=1e-4
)
POLICIES = [
    ("paged", {}),
    ("prefix", {}),
    ("contiguous", {"reservation": "pow2", "placement": "buddy"}),
    ("contiguous", {"reservation": "max", "placement": "first_fit"}),
    ("radix", {}),
    ("radix", {"page_size": 16}),
]
# Each scenario drives some fast path of event skipping: a roomy pool (decode jumps that take blocks
# inside them), a small token budget (chunked-prefill jumps), a tight pool (jumps that must stop at
# flushes, preemptions), swapping, a watermark, failures at admission, prompts that cannot be chunked.
# Samples (stopping independently) and beams run in every scenario; in tight pools a group that fits
# the pool in tokens but not in whole blocks is rejected once it outgrows the pool alone.
SCENARIOS = {
    "roomy": (PoolSpec(16 * 60, 16, 160), {}, {}),
    "chunked": (PoolSpec(16 * 40, 16, 160), {"max_num_batched_tokens": 24, "max_num_seqs": 8}, {"gap": 0.05}),
    "tight": (PoolSpec(16 * 10, 16, 160), {}, {"gap": 0.1}),
    "swap": (PoolSpec(16 * 10, 16, 160), {"preemption_mode": "swap", "swap_space_blocks": 12}, {"gap": 0.1}),
    "watermark": (PoolSpec(16 * 24, 16, 160), {"watermark": 0.1}, {"gap": 0.1}),
    "fail": (PoolSpec(16 * 10, 16, 160), {"on_oom": "fail"}, {"gap": 0.1}),
    "unchunked": (
        PoolSpec(16 * 30, 16, 256),
        {"max_num_batched_tokens": 200, "enable_chunked_prefill": False},
        {"gap": 0.1},
    ),
}


def assert_same_results(single, skip):
    """Every outcome identical; times equal up to float rounding (a jump sums a closed-form series
    where single steps add one iteration at a time); time averages too."""
    assert len(single.records) == len(skip.records)
    for a, b in zip(single.records, skip.records, strict=True):
        assert (a.request_id, a.outcome, a.reason, a.preemptions, a.cached_prompt_tokens) == (
            b.request_id,
            b.outcome,
            b.reason,
            b.preemptions,
            b.cached_prompt_tokens,
        )
        for field in ("admitted_s", "first_token_s", "finish_s"):
            x, y = getattr(a, field), getattr(b, field)
            assert (math.isnan(x) and math.isnan(y)) or x == pytest.approx(y, rel=1e-9, abs=1e-12)
    assert single.counters == skip.counters
    assert single.kv.stats == skip.kv.stats  # (the pool's: one policy's, or a hybrid pool's)
    assert single.recorder.peak_running == skip.recorder.peak_running
    end = single.env.now
    assert skip.env.now == pytest.approx(end, rel=1e-9)
    averages_single = single.recorder.time_averages(end)
    averages_skip = skip.recorder.time_averages(end)
    # Within a jump the iteration time grows with the context, so the straight line between the
    # jump's ends is not exactly the staircase of single steps: the real gap is below 1e-4 here
    # (left rectangles instead of the trapezoid give 0.017).
    for key, value in averages_single.items():
        assert averages_skip[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def run_both_modes(policy, pool, requests, options, **knobs):
    """The same requests single-stepped and with event skipping, on the equivalence costs."""
    return {
        mode: run(policy, pool, requests, mode, costs=EQUIVALENCE_COSTS, options=options, **knobs)
        for mode in ("single", "skip")
    }


@pytest.mark.parametrize(("policy", "options"), POLICIES)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("seed", [1, 2])
def test_event_skipping_equals_single_stepping(policy, options, scenario, seed):
    pool, knobs, shape = SCENARIOS[scenario]
    requests = random_requests(seed, 50, **shape)
    run_both = run_both_modes(policy, pool, requests, options, beam_reparent_prob=0.2, **knobs)
    assert_same_results(run_both["single"], run_both["skip"])
    assert len(rows(run_both["skip"])) < len(rows(run_both["single"]))
    for engine in run_both.values():
        assert_physical_slots_are_the_held_ones(engine)
    jumps = run_both["skip"].jumps
    assert jumps.decode > 0
    if scenario == "chunked":
        assert jumps.prefill > 0
    if scenario in ("chunked", "roomy") and policy != "contiguous":
        assert jumps.with_growth > 0


@pytest.mark.parametrize(("policy", "options"), POLICIES[:3])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_event_skipping_equals_single_stepping_with_async_scheduling(policy, options, scenario):
    """A jump may run one iteration past an arrival (that iteration was scheduled before it came)
    and must stop before the one that sees it."""
    pool, knobs, shape = SCENARIOS[scenario]
    requests = random_requests(4, 50, **shape)
    both = run_both_modes(policy, pool, requests, options, async_scheduling=True, **knobs)
    single, skip = both["single"], both["skip"]
    assert_same_results(single, skip)
    assert skip.jumps.decode > 0
    synchronous = run(policy, pool, requests, "skip", costs=EQUIVALENCE_COSTS, options=options, **knobs)
    # Requests that came while the engine ran wait an iteration longer (later ones follow them).
    later = [
        a.admitted_s - b.admitted_s
        for a, b in zip(skip.records, synchronous.records, strict=True)
        if a.outcome == b.outcome == "finished" and not (a.preemptions or b.preemptions)
    ]
    assert max(later) > 0


@pytest.mark.parametrize(("policy", "options"), POLICIES[:3])
@pytest.mark.parametrize("until_s", [0.7, 2.35, 6.0])
def test_a_run_stopped_inside_a_jump_equals_single_stepping(policy, options, until_s):
    """``until_s`` may fall inside a jump: the iterations begun by then took their tokens and blocks,
    those ended by then are counted, and the time averages run to that instant."""
    pool, knobs, shape = SCENARIOS["chunked"]
    requests = random_requests(3, 50, **(shape | {"forks": False}))
    both = [
        run(policy, pool, requests, mode, costs=EQUIVALENCE_COSTS, options=options, until_s=until_s, **knobs)
        for mode in ("single", "skip")
    ]
    assert both[0].env.now == both[1].env.now == until_s
    assert_same_results(*both)


@pytest.mark.parametrize("block_size", [16, 4])
@pytest.mark.parametrize(("until_s", "output_tokens"), [(1.7, 2), (2.7, 4), (4.2, 6), (5.5, 10), (6.2, 10)])
def test_a_run_of_two_decoding_requests_stopped_inside_a_jump(until_s, output_tokens, block_size):
    """R0 and R1 (prompt 10, output 20) arrive at 0: iteration 1 [0, 1.2) prefills both and gives
    their first tokens; every iteration after it takes 1 s and a token for each. The iterations ended
    by ``until_s`` count, 2 tokens each: 1 by 1.7, 2 by 2.7, 3 by 4.2 (SimPy stops before the events at
    ``until``: the iteration ending exactly then is not counted), 5 by 5.5 (the one begun at 5.2 not
    yet ended), 5 by 6.2. Skipping events, the run stops inside the decode jump that starts at 1.2:
    its counts, time averages and breakdown as single steps give them. With blocks of 4 the
    sequences take a block inside the jump at their 13th and 17th tokens (the iterations starting at
    3.2 and 7.2 would write them), so the stop also lands among flushes."""
    requests = [request(0, 0.0, 10, 20), request(1, 0.0, 10, 20)]
    pool = PoolSpec(16 * 20, block_size, 160)
    both = [run("paged", pool, requests, mode, until_s=until_s) for mode in ("single", "skip")]
    assert_same_results(*both)
    for engine in both:
        assert engine.counters.output_tokens == output_tokens
        assert engine.env.now == until_s


def test_same_seed_same_results():
    pool = PoolSpec(16 * 24, 16, 160)
    first = run("prefix", pool, random_requests(3, 30))
    second = run("prefix", pool, random_requests(3, 30))
    assert times(first) == times(second)
    assert rows(first) == rows(second)


def test_beam_search_prunes_and_forks_through_the_policy():
    pool = PoolSpec(16 * 64, 16, 256)
    engine = run("prefix", pool, [request(0, 0.0, 40, 60, beam_width=4)], beam_reparent_prob=0.3)
    record = engine.records[0]
    assert record.outcome == "finished"
    # Each beam decision frees one beam and forks a survivor, whose partly filled tail is then copied.
    assert engine.policy.stats.cow_copies > 3
    assert engine.counters.output_tokens == 4 * 60
    final = engine.policy.breakdown()
    assert final.used == final.reserved == final.internal_fragmentation == 0
    assert final.cached + final.free == pool.kv_pool_tokens


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_swap_preemption_moves_kv_to_host_and_back_without_recompute(step_mode):
    """Same squeeze as the recompute test, with swap: 0.5 s per block each way (RoundCostModel), host
    room 8 blocks.

    it 1 [0, 1.08): as before. At 1.08 r1 cannot grow: preempted (1), its prompt block goes to the
                 host; the transfer is charged to the next iteration.
    it 2 [1.08, 3.08): r0 token 2; r1 swapped back in (no prefill): 1.0 + 0.5 out + 0.5 in.
    it 3 [3.08, 4.58): r1 needs a 2nd block for its first token: preempted (2), swapped out (1.5 s).
    it 4 [4.58, 6.08): swapped back in (1.5 s); r0 token 4.
    it 5 [6.08, 7.58): r0's token 5 needs the block r1 holds: r1 preempted (3), swapped out.
    it 6 [7.58, 8.58): r0 token 6: finishes at 8.58. (r1 does not fit: 0 blocks free.)
    [8.58, 9.08): r1 swapped in alone: only the transfer.
    [9.08, 10.08) ... [14.08, 15.08): r1's 6 tokens: finishes at 15.08."""
    requests = [request(0, 0.0, 4, 6), request(1, 0.0, 4, 6)]
    swap = run("paged", PoolSpec(12, 4, 12), requests, step_mode, preemption_mode="swap", swap_space_blocks=8)
    got = times(swap)
    assert got[0] == pytest.approx((0.0, 1.08, 8.58, "finished"))
    assert got[1] == pytest.approx((0.0, 1.08, 15.08, "finished"))
    assert swap.counters.preemptions == 3
    assert swap.counters.swapped_out_blocks == 3
    assert swap.counters.iterations == 13
    # Every output token counted once, the ones decoded after r1's last swap-in (a wake-up that moves
    # a block and computes nothing: the next one decodes) included: 6 + 6.
    assert swap.counters.output_tokens == 12


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_swap_without_host_room_falls_back_to_recompute(step_mode):
    """No host room: every preemption recomputes; the times are the recompute test's."""
    requests = [request(0, 0.0, 4, 6), request(1, 0.0, 4, 6)]
    engine = run(
        "paged", PoolSpec(12, 4, 12), requests, step_mode, preemption_mode="swap", swap_space_blocks=0
    )
    assert engine.counters.preemptions == 4 and engine.counters.swapped_out_blocks == 0
    got = times(engine)
    assert got[1] == pytest.approx((0.0, 1.08, 12.24, "finished"))


@pytest.mark.parametrize("step_mode", ["single", "skip"])
@pytest.mark.parametrize(
    ("swap_space_blocks", "preemptions", "swapped_out", "r0_finish"),
    [(8, 2, 2, 3.65), (1, 3, 1, 2.69), (0, 3, 0, 2.19)],
)
def test_two_requests_swapped_out_at_once_share_the_host_room(
    step_mode, swap_space_blocks, preemptions, swapped_out, r0_finish
):
    """Pool of 4 blocks x 4 slots; r0 (prompt 8), r1 (prompt 4), r2 (prompt 3), 2 tokens out each,
    all admitted at 0 (2 + 1 + 1 blocks: the pool is full).

    it 1 [0, 1.15): 15 prompt tokens. All three sample their first token at 1.15 (TTFT 1.15 each,
    whatever happens to their slots next). r0's token is its 9th: it needs a block; r2, the newest,
    is preempted for it (3 tokens: 1 block to the host if the host has 3 token slots left). r1's is
    its 5th: no block left, r1 is now the newest and preempted itself (4 tokens: 1 block if the host
    has 4 slots left).
    - Host room 8 blocks: both swapped out (2). it 2 [1.15, 3.65): r0 token 2, 2 blocks out, r1
      swapped back in to the block it left (1 in): 1.0 + 0.5 x 3. r0 finishes at 3.65.
    - Host room 1 block (4 slots): r2 takes 3 of them, the 1 left cannot take r1: it recomputes.
      it 2 [1.15, 2.69): r0 token 2, r2's block out, r1 re-admitted, prompt 4 recomputed: 1.0 + 0.5
      + 0.04. At 2.69 r1's prompt is done first and its token needs a block r0 still holds: r1 is
      preempted again (3), recompute again; then r0 finishes at 2.69.
    - No host room: every preemption recomputes; it 2 [1.15, 2.19): 1.0 + 0.04 (r1's prompt)."""
    requests = [request(0, 0.0, 8, 2), request(1, 0.0, 4, 2), request(2, 0.0, 3, 2)]
    engine = run(
        "paged",
        PoolSpec(16, 4, 16),
        requests,
        step_mode,
        preemption_mode="swap",
        swap_space_blocks=swap_space_blocks,
    )
    assert engine.counters.preemptions == preemptions
    assert engine.counters.swapped_out_blocks == swapped_out
    got = times(engine)
    assert [got[request_id][1] for request_id in range(3)] == pytest.approx([1.15] * 3)
    assert got[0] == pytest.approx((0.0, 1.15, r0_finish, "finished"))
    assert {outcome for *_, outcome in got.values()} == {"finished"}
    assert engine.counters.output_tokens == 6


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_two_swap_outs_in_one_decode_step_are_both_charged(step_mode):
    """Pool of 4 blocks x 4 slots, host room 8 blocks. r0 (prompt 7: 2 blocks), r1 and r2 (prompt 3:
    1 block each), 3 tokens out each, all admitted at 0. it 1 [0, 1.13): 13 prompt tokens; the first
    tokens fit (r0's 8th, r1's and r2's 4th). it 2's tokens need slots as it starts, at 1.13: r0's
    9th takes r2's block (r2, the newest, swapped out: 1 block), r1's 5th finds none and r1 is
    swapped out too (1 block), in one decode step's growth. it 2 [1.13, 3.13): r0's second token and
    both blocks out, 1.0 + 2 x 0.5 s (no admission in an iteration that preempted). it 3 [3.13,
    4.63): r0's last token, r1 swapped back in (0.5 s): r0 ends at 4.63."""
    requests = [request(0, 0.0, 7, 3), request(1, 0.0, 3, 3), request(2, 0.0, 3, 3)]
    engine = run(
        "paged", PoolSpec(16, 4, 16), requests, step_mode, preemption_mode="swap", swap_space_blocks=8
    )
    assert times(engine)[0] == pytest.approx((0.0, 1.13, 4.63, "finished"))
    assert (engine.counters.preemptions, engine.counters.swapped_out_blocks) == (2, 2)
    assert {outcome for *_, outcome in times(engine).values()} == {"finished"}


def test_watermark_keeps_admission_headroom():
    """Pool of 40 slots; each prompt takes 8. A watermark of 0.7 keeps 28 slots free at admission:
    r0 leaves 32 >= 28 and is admitted; r1 would leave 24 < 28, so it waits until r0 has finished.

    r0: [0, 1.08) prefill 8 (1.0 + 0.08), [1.08, 2.08) token 2: finishes at 2.08.
    r1: admitted at 2.08, prefilled by 3.16, token 2 by 4.16."""
    requests = [request(0, 0.0, 8, 2), request(1, 0.0, 8, 2)]
    plain = times(run("paged", PoolSpec(40, 4, 16), requests))
    guarded = times(run("paged", PoolSpec(40, 4, 16), requests, watermark=0.7))
    assert plain[1] == pytest.approx((0.0, 1.16, 2.16, "finished"))
    assert guarded[0] == pytest.approx((0.0, 1.08, 2.08, "finished"))
    assert guarded[1] == pytest.approx((2.08, 3.16, 4.16, "finished"))


def test_the_watermark_at_its_edge_in_whole_blocks():
    """Pool of 40 slots in blocks of 4; r1 is admitted only if the free slots less its prompt's
    whole blocks stay at or above watermark x 40. After r0's prompt 32 slots are free.
    - Prompts of 8, watermark 0.6: 32 - 8 = 24 = 24, exactly at the edge: r1 joins r0 at 0 (their
      16 prompt tokens: first tokens at 1.16, both done at 2.16).
    - Prompts of 7 (2 blocks each), watermark 0.625: 32 - 8 = 24 < 25 (7 tokens would leave 25):
      r1 waits for r0, which ends at 2.07; r1 runs [2.07, 3.14) and ends at 4.14."""
    pool = PoolSpec(40, 4, 16)
    edge = times(run("paged", pool, [request(0, 0.0, 8, 2), request(1, 0.0, 8, 2)], watermark=0.6))
    assert edge[1] == pytest.approx((0.0, 1.16, 2.16, "finished"))
    blocks = times(run("paged", pool, [request(0, 0.0, 7, 2), request(1, 0.0, 7, 2)], watermark=0.625))
    assert blocks[0] == pytest.approx((0.0, 1.07, 2.07, "finished"))
    assert blocks[1] == pytest.approx((2.07, 3.14, 4.14, "finished"))


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_time_averages_and_summary_by_hand(step_mode):
    """One request, prompt 10, output 2, pool 100 slots of 4-slot blocks (25 blocks).

    [0, 1.1): prefill 10 tokens (1.0 + 0.1 s); 3 blocks: used 10, reserved 2 (final 12)
    [1.1, 2.1): the first token went in at 1.1 and the second at the next iteration's start: used 12
    finish at 2.1. Used area = 10 x 1.1 + 12 x 1.0 = 23 slot-seconds; reserved = 2 x 1.1 = 2.2;
    free = 88 x 1.1 + 88 x 1.0 = 184.8 (3 blocks held throughout)."""
    engine = run("paged", PoolSpec(100, 4, 40), [request(0, 0.0, 10, 2)], step_mode=step_mode)
    averages = engine.recorder.time_averages(engine.env.now)
    assert engine.env.now == pytest.approx(2.1)
    assert averages["mean_used_frac"] == pytest.approx(23 / 2.1 / 100)
    assert averages["mean_reserved_frac"] == pytest.approx(2.2 / 2.1 / 100)
    assert averages["mean_free_frac"] == pytest.approx(184.8 / 2.1 / 100)
    assert averages["mean_running"] == pytest.approx(1.0)
    table = requests_frame(engine.records)
    assert table.loc[0, "ttft_s"] == pytest.approx(1.1)
    assert table.loc[0, "tpot_s"] == pytest.approx(1.0)
    assert table.loc[0, "e2e_s"] == pytest.approx(2.1)
    frame = engine.recorder.frame()
    assert frame["kv_cache_usage_perc"].max() == pytest.approx(12 / 100)
    summary = summarize(
        engine,
        engine.sink.requests(),
        VariantConfig(name="v", policy="paged"),
        "paged",
        PoolSpec(100, 4, 40),
        SimpleNamespace(
            num_gpu_blocks=25, tensor_parallel_size=1, data_parallel_size=1, expert_parallel_size=1
        ),
        "test",
        0.0,
        40,
    )
    # 2 output tokens in 2.1 s; one finished request: its TTFT, TPOT and e2e are every percentile.
    assert summary["output_tokens_per_s"] == pytest.approx(2 / 2.1)
    assert (summary["ttft_p50_s"], summary["ttft_p99_s"]) == pytest.approx((1.1, 1.1))
    assert (summary["tpot_p50_s"], summary["e2e_p99_s"]) == pytest.approx((1.0, 2.1))
    assert summary["requests_finished"] == summary["requests_total"] == 1
    assert summary["peak_running"] == 1 and summary["iterations"] == 2


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_streamed_outputs_equal_in_memory_outputs(tmp_path, monkeypatch, fmt):
    """Tables handed to a file sink in small chunks read back exactly as the in-memory ones."""
    import sim.engine.ledger
    import sim.outputs.metrics
    from sim.outputs.sinks import FileSink

    pool = PoolSpec(16 * 24, 16, 160)
    memory = run("prefix", pool, random_requests(5, 30))
    monkeypatch.setattr(sim.outputs.metrics, "CHUNK_ROWS", 7)
    monkeypatch.setattr(sim.engine.ledger, "CHUNK_ROWS", 7)
    sink = FileSink(tmp_path, fmt)
    policy = make_policy("prefix", pool)
    engine = Engine(
        policy, RoundCostModel(), EngineKnobs(max_model_len=160), iter(random_requests(5, 30)), sink=sink
    )
    engine.run()
    sink.close()
    expected_requests = memory.sink.requests().sort_values("request_id", ignore_index=True)
    got_requests = sink.requests().sort_values("request_id", ignore_index=True)
    pd.testing.assert_frame_equal(got_requests, expected_requests, check_dtype=False)
    pd.testing.assert_frame_equal(sink.timeseries(), memory.recorder.frame(), check_dtype=False)
    thinned = sink.timeseries(max_rows=10)
    assert len(thinned) <= 10 and thinned["time_s"].is_monotonic_increasing


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_time_averages_across_a_jump_that_takes_blocks_by_hand(step_mode):
    """Prompt 10, output 30 (final 40 = 10 blocks of 4), pool 100 slots; decode steps 1 s.

    [0, 1.1): prefill (1.0 + 0.1 s), 3 blocks: used 10, allocated 12. Then 29 decode iterations of
    1 s; during the j-th the sequence holds 11 + j tokens in ceil((11 + j) / 4) blocks; it ends at
    30.1. Used area = 11 + sum(11 + j) = 765 slot-seconds; allocated = 13.2 + 12 + 4 * (16 + 20 +
    ... + 40) = 809.2; reserved = allocated - used = 44.2 (no internal fragmentation: 40 = 10 blocks);
    free = 100 * 30.1 - 809.2. Skipping does it in a jump that takes 7 blocks inside it."""
    engine = run("paged", PoolSpec(100, 4, 64), [request(0, 0.0, 10, 30)], step_mode=step_mode)
    assert engine.env.now == pytest.approx(30.1, rel=1e-12)
    averages = engine.recorder.time_averages(engine.env.now)
    assert averages["mean_used_frac"] == pytest.approx(765 / 30.1 / 100, rel=1e-12)
    assert averages["mean_reserved_frac"] == pytest.approx(44.2 / 30.1 / 100, rel=1e-12)
    assert averages["mean_internal_frag_frac"] == 0.0
    assert averages["mean_free_frac"] == pytest.approx((3010 - 809.2) / 30.1 / 100, rel=1e-12)
    assert engine.counters.iterations == 30 and engine.counters.output_tokens == 30
    if step_mode == "skip":
        # The prefill, the first decode iteration (the first token was grown on its own), one jump.
        assert engine.jumps == JumpCounts(single=1, decode=1, with_growth=1)
        # The jump's end is a row (its 40 tokens in 10 whole blocks), then the completion's (all free).
        at_end = [row for row in rows(engine) if row[0] == pytest.approx(30.1, rel=1e-12)]
        assert at_end == [(at_end[0][0], 40, 0, 0, 0, 0, 60), (at_end[0][0], 0, 0, 0, 0, 0, 100)]
    # The series' last row (30.1, the engine idle) carries the same areas, though skipping wrote no
    # row inside the jump; the row at 1.1 carries the prefill's: used 10 x 1.1, reserved 2 x 1.1.
    frame = engine.recorder.frame()
    last = frame.iloc[-1]
    assert last["time_s"] == pytest.approx(30.1, rel=1e-12)
    assert last["used_token_s"] == pytest.approx(765, rel=1e-12)
    assert last["reserved_token_s"] == pytest.approx(44.2, rel=1e-12)
    assert last["free_token_s"] == pytest.approx(3010 - 809.2, rel=1e-12)
    at_1_1 = frame[np.isclose(frame["time_s"], 1.1)].iloc[0]
    assert (at_1_1["used_token_s"], at_1_1["reserved_token_s"]) == pytest.approx((11.0, 2.2), rel=1e-12)


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_a_run_stopped_inside_a_jump_books_what_single_steps_would(step_mode):
    """The scenario above stopped at 10.5 s, inside the jump (iteration 2 + j runs [1.1 + j, 2.1 + j)).
    Iterations 1 to 10 have ended (the 10th at 10.1): 10 iterations, 10 output tokens; the 11th is in
    progress, holding 21 tokens. Used area = 10 x 1.1 + (12 + ... + 20) + 21 x 0.4 = 11 + 144 + 8.4."""
    engine = run("paged", PoolSpec(100, 4, 64), [request(0, 0.0, 10, 30)], step_mode=step_mode, until_s=10.5)
    assert engine.env.now == 10.5
    assert (engine.counters.iterations, engine.counters.output_tokens) == (10, 10)
    averages = engine.recorder.time_averages(10.5)
    assert averages["mean_used_frac"] == pytest.approx(163.4 / 10.5 / 100, rel=1e-12)
    assert [(r.outcome, r.finish_s != r.finish_s) for r in engine.records] == [("unfinished", True)]


def test_a_jump_takes_blocks_up_to_the_room_the_pool_has():
    """The scenario above in a pool of 52 slots (13 blocks of 4): when iteration 2 plans its jump the
    sequence holds 12 tokens in 3 blocks, so 40 slots are free: 10 blocks, enough for 40 more tokens,
    more than the 28 iterations left (it ends at 40 tokens = 10 blocks in all). The jump runs to the
    end in one wake-up, taking its 7 blocks inside it."""
    engine = run("paged", PoolSpec(52, 4, 64), [request(0, 0.0, 10, 30)])
    assert engine.records[0].finish_s == pytest.approx(30.1, rel=1e-12)
    assert engine.counters.iterations == 30
    assert engine.jumps == JumpCounts(single=1, decode=1, with_growth=1)
    assert (engine.jumps.single, engine.wakeups) == (1, 2)


@pytest.mark.parametrize("policy_name", ["paged", "prefix", "contiguous"])
def test_area_columns_are_the_exact_integrals_of_single_stepping(policy_name):
    """At every row of a skipping run, each ``<category>_token_s`` equals the integral from 0 of the
    category's step function written by single stepping (which has a row at every iteration, so its
    series is the exact state): the areas hold what skipping wrote no row for (the tokens decoded
    inside jumps, the blocks taken there)."""
    pool = PoolSpec(400, 4, 64)
    requests = [
        request(index, arrival, prompt, output)
        for index, (arrival, prompt, output) in enumerate(
            [(0.0, 10, 30), (0.5, 7, 25), (3.0, 20, 12), (9.0, 5, 40), (9.2, 13, 3), (30.0, 6, 9)]
        )
    ]
    skip = run(policy_name, pool, requests).recorder.frame()
    single = run(policy_name, pool, requests, step_mode="single").recorder.frame()
    assert len(single) > len(skip)  # skipping wrote fewer rows
    single_times = single["time_s"].to_numpy()
    for category in MemoryBreakdown.CATEGORIES:
        values = single[f"{category}_tokens"].to_numpy(dtype=float)
        integral = np.concatenate([[0.0], np.cumsum(values[:-1] * np.diff(single_times))])
        # The single run's integral at each skip row's time (rows at the same instant hold no time).
        at = np.searchsorted(single_times, skip["time_s"].to_numpy(), side="right") - 1
        expected = integral[at] + values[at] * (skip["time_s"].to_numpy() - single_times[at])
        np.testing.assert_allclose(skip[f"{category}_token_s"], expected, rtol=1e-12, atol=1e-9)


def test_chunked_prefill_jump_by_hand():
    """A 100-token prompt alone, 30 tokens per iteration: chunks 30, 30, 30, 10; no decode batch, so
    each iteration costs the decode intercept (1 s) plus 0.01 s per prefilled token. The first token
    comes at 1.3 + 1.3 + 1.3 + 1.1 = 5.0 s, after one wake-up that jumps over the last three."""
    engine = run("paged", PoolSpec(400, 16, 128), [request(0, 0.0, 100, 1)], max_num_batched_tokens=30)
    record = engine.records[0]
    assert record.first_token_s == pytest.approx(5.0, rel=1e-12)
    assert record.finish_s == record.first_token_s  # a single output token
    assert engine.counters.iterations == 4
    assert engine.jumps == JumpCounts(prefill=1)


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_prefill_jump_ends_at_a_decoding_request_s_last_token(step_mode):
    """Pins how far a prefill jump runs: up to and including the iteration in which a decoding request
    finishes (not fewer). r0: prompt 4, output 4; r1: prompt 60, output 3, arrives at 0.5; 11 tokens
    per iteration, one of them per decoding sequence; 1 s per iteration + 0.01 s per prompt token.

    it 1 [0, 1.04):     r0 prefills 4 (first token)              wake-up 1 (a prompt completes)
    it 2 [1.04, 2.14):  r0 decodes (2nd), r1 prefills 10        wake-up 2, planned at it 2:
    it 3 [2.14, 3.24):  r0 (3rd), r1 10                          r0 finishes at the end of it 4,
    it 4 [3.24, 4.34):  r0 (4th, finishes), r1 10 (30 of 60)     so the jump is it 3 and 4
    it 5 [4.34, 5.45):  r1 prefills 11 alone                     wake-up 3: r1's prompt completes in
    it 6 [5.45, 6.56):  r1 11                                    it 7 (8 tokens, 3 of the budget left,
    it 7 [6.56, 7.64):  r1 8 (first token)                       nothing queued): it 6 and 7
    it 8, 9 [7.64, 9.64): r1 decodes (2nd, 3rd)                  wake-up 4: a decode jump over it 9
    """
    engine = run(
        "paged",
        PoolSpec(16 * 40, 16, 128),
        [request(0, 0.0, 4, 4), request(1, 0.5, 60, 3)],
        step_mode=step_mode,
        max_num_batched_tokens=11,
    )
    got = times(engine)
    assert got[0] == pytest.approx((0.0, 1.04, 4.34, "finished"))
    assert got[1] == pytest.approx((1.04, 7.64, 9.64, "finished"))
    assert engine.counters.iterations == 9
    if step_mode == "skip":
        assert engine.jumps == JumpCounts(single=1, decode=1, prefill=2, with_growth=0)
        assert (engine.jumps.single, engine.wakeups) == (1, 4)


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_decode_jumps_run_up_to_the_iteration_an_arrival_falls_in(step_mode):
    """A decode jump runs the iterations up to and including the one during which the next request
    arrives (the one after it admits it); a request arriving during iteration 1 allows no jump.
    r0: prompt 10, output 8; r1, r2: prompt 10, output 1, arriving at 2.6 and 4.7; 1 s per
    iteration + 0.01 s per prompt token.

    it 1 [0, 1.1):     r0 prefills (first token)                          wake-up 1
    it 2 [1.1, 2.1):   r0 2nd; r1 arrives 0.5 s after it 2 ends:          wake-up 2: a decode jump
    it 3 [2.1, 3.1):   r0 3rd (r1 arrives at 2.6, inside it)              over it 3
    it 4 [3.1, 4.2):   r0 4th, r1 prefills 10 (first and last token)      wake-up 3 (a prompt completes)
    it 5 [4.2, 5.2):   r0 5th; r2 arrives at 4.7, inside it 5: no jump    wake-up 4
    it 6 [5.2, 6.3):   r0 6th, r2 prefills 10 (first and last token)      wake-up 5
    it 7, 8 [6.3, 8.3): r0 7th, 8th                                       wake-up 6: a jump over it 8
    """
    engine = run(
        "paged",
        PoolSpec(16 * 40, 16, 128),
        [request(0, 0.0, 10, 8), request(1, 2.6, 10, 1), request(2, 4.7, 10, 1)],
        step_mode=step_mode,
    )
    got = times(engine)
    assert got[0] == pytest.approx((0.0, 1.1, 8.3, "finished"))
    assert got[1] == pytest.approx((3.1, 4.2, 4.2, "finished"))
    assert got[2] == pytest.approx((5.2, 6.3, 6.3, "finished"))
    assert engine.counters.iterations == 8
    if step_mode == "skip":
        assert engine.jumps == JumpCounts(single=4, decode=2)
        assert (engine.jumps.single, engine.wakeups) == (4, 6)


@pytest.mark.parametrize("step_mode", ["single", "skip"])
@pytest.mark.parametrize("r1_arrival_s", [0.0, 0.5])
def test_prefill_jump_stops_before_an_iteration_with_budget_for_a_queued_request(step_mode, r1_arrival_s):
    """A prefill jump goes on through iterations whose chunk takes the whole budget (a queued request
    could not be admitted in them) and stops before the first one that leaves budget over, since that
    one admits the queued request. r0: prompt 29, output 1; r1: prompt 5, output 1, queued at 0 (behind
    r0: iteration 1 stops for want of budget) or arriving at 0.5 (during iteration 1: the queue was
    empty); 10 tokens per iteration; 1 s per iteration + 0.01 s per prompt token.

    it 1 [0, 1.1):     r0 prefills 10                          wake-up 1: a prefill jump over it 2
    it 2 [1.1, 2.2):   r0 10 (the whole budget)
    it 3 [2.2, 3.3):   r0 9 (first and last token), r1 1       wake-up 2 (1 token of budget left)
    it 4 [3.3, 4.34):  r1 4 (first and last token)             wake-up 3
    """
    engine = run(
        "paged",
        PoolSpec(16 * 40, 16, 128),
        [request(0, 0.0, 29, 1), request(1, r1_arrival_s, 5, 1)],
        step_mode=step_mode,
        max_num_batched_tokens=10,
    )
    got = times(engine)
    assert got[0] == pytest.approx((0.0, 3.3, 3.3, "finished"))
    assert got[1] == pytest.approx((2.2, 4.34, 4.34, "finished"))
    assert engine.counters.iterations == 4
    if step_mode == "skip":
        assert engine.jumps == JumpCounts(single=2, prefill=1)
        assert (engine.jumps.single, engine.wakeups) == (2, 3)


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_an_arrival_at_an_iteration_s_start_is_admitted_by_it(step_mode):
    """A request arriving exactly when an iteration starts is admitted by that iteration, so a prefill
    jump whose next iteration would leave budget over stops before it. Every iteration takes 1 s;
    r0: prompt 25, output 1; r1: prompt 5, output 1, arrives at 2.0; 10 tokens per iteration.

    it 1 [0, 1), it 2 [1, 2): r0 prefills 10 + 10             wake-up 1: a prefill jump over it 2
    it 3 [2, 3): r0 5 and r1 5 (both first and last tokens)   wake-up 2
    """
    engine = run(
        "paged",
        PoolSpec(16 * 40, 16, 128),
        [request(0, 0.0, 25, 1), request(1, 2.0, 5, 1)],
        step_mode=step_mode,
        costs=ConstantCost(1.0),
        max_num_batched_tokens=10,
    )
    got = times(engine)
    assert got[0] == (0.0, 3.0, 3.0, "finished")
    assert got[1] == (2.0, 3.0, 3.0, "finished")
    assert engine.counters.iterations == 3
    if step_mode == "skip":
        assert engine.jumps == JumpCounts(single=1, prefill=1)
        assert (engine.jumps.single, engine.wakeups) == (1, 2)


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_an_arrival_as_iteration_1_ends_allows_no_decode_jump(step_mode):
    """A request arriving exactly when iteration 1 of a wake-up ends is admitted by the next
    iteration, so no decode jump runs past it. Every iteration takes 1 s; r0: prompt 10, output 5;
    r1: prompt 10, output 1, arrives at 2.0.

    it 1 [0, 1):  r0 prefills (first token)                   wake-up 1
    it 2 [1, 2):  r0 2nd; r1 arrives as it ends: no jump       wake-up 2
    it 3 [2, 3):  r0 3rd, r1 prefills (first and last token)   wake-up 3
    it 4, 5 [3, 5): r0 4th, 5th                                wake-up 4: a decode jump over it 5
    """
    engine = run(
        "paged",
        PoolSpec(16 * 40, 16, 128),
        [request(0, 0.0, 10, 5), request(1, 2.0, 10, 1)],
        step_mode=step_mode,
        costs=ConstantCost(1.0),
    )
    got = times(engine)
    assert got[0] == (0.0, 1.0, 5.0, "finished")
    assert got[1] == (2.0, 3.0, 3.0, "finished")
    assert engine.counters.iterations == 5
    if step_mode == "skip":
        assert engine.jumps == JumpCounts(single=3, decode=1)
        assert (engine.jumps.single, engine.wakeups) == (3, 4)


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_prefill_jump_with_one_token_of_budget(step_mode):
    """A prompt chunked one token per iteration inside a jump (the budget left beside a decoding
    request is exactly 1), and that one token of budget is enough to admit a request that arrives
    while the decoding request runs on. r0: prompt 2, output 6; r1: prompt 3, output 1, arrives at
    0.5; r2: prompt 1, output 1, arrives at 4.5; 2 tokens per iteration; 1 s per iteration + 0.01 s
    per prompt token.

    it 1 [0, 1.02):     r0 prefills 2 (first token)                    wake-up 1
    it 2 [1.02, 2.03):  r0 decodes (2nd), r1 prefills 1                wake-up 2: a prefill jump over
    it 3 [2.03, 3.04):  r0 (3rd), r1 1                                 it 3 and 4 (r1's prompt
    it 4 [3.04, 4.05):  r0 (4th), r1 1: its first and last token       completes in it 4)
    it 5 [4.05, 5.05):  r0 (5th); r2 arrives at 4.5, inside it 5       wake-up 3: no jump
    it 6 [5.05, 6.06):  r0 (6th, last), r2 prefills 1 (first, last)    wake-up 4
    """
    engine = run(
        "paged",
        PoolSpec(16 * 40, 16, 128),
        [request(0, 0.0, 2, 6), request(1, 0.5, 3, 1), request(2, 4.5, 1, 1)],
        step_mode=step_mode,
        max_num_batched_tokens=2,
    )
    got = times(engine)
    assert got[0] == pytest.approx((0.0, 1.02, 6.06, "finished"))
    assert got[1] == pytest.approx((1.02, 4.05, 4.05, "finished"))
    assert got[2] == pytest.approx((5.05, 6.06, 6.06, "finished"))
    assert engine.counters.iterations == 6
    if step_mode == "skip":
        assert engine.jumps == JumpCounts(single=3, prefill=1)
        assert (engine.jumps.single, engine.wakeups) == (3, 4)


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_a_decode_jump_with_no_budget_runs_past_a_queued_request(step_mode):
    """With no token budget left, a queued request cannot be admitted: the decode jump runs to the
    next completion though the queue head is untried. 2 tokens per iteration, one per decoding
    sequence; 1 s per iteration + 0.01 s per prompt token. r0: prompt 2, output 4; r1: prompt 1,
    output 4; r2: prompt 1, output 1; all queued at 0.

    it 1 [0, 1.02):     r0 prefills 2 (first token); the budget is spent      wake-up 1
    it 2 [1.02, 2.03):  r0 2nd; r1 prefills 1 (first token)                  wake-up 2
    it 3 [2.03, 3.03):  r0 3rd, r1 2nd: budget 0, r2 waits                   wake-up 3: a decode
    it 4 [3.03, 4.03):  r0 4th (finishes), r1 3rd                            jump over it 4
    it 5 [4.03, 5.04):  r1 4th (finishes); r2 prefills 1 (first and last)    wake-up 4
    """
    engine = run(
        "paged",
        PoolSpec(16 * 40, 16, 128),
        [request(0, 0.0, 2, 4), request(1, 0.0, 1, 4), request(2, 0.0, 1, 1)],
        step_mode=step_mode,
        max_num_batched_tokens=2,
    )
    got = times(engine)
    assert got[0] == pytest.approx((0.0, 1.02, 4.03, "finished"))
    assert got[1] == pytest.approx((1.02, 2.03, 5.04, "finished"))
    assert got[2] == pytest.approx((4.03, 5.04, 5.04, "finished"))
    assert engine.counters.iterations == 5
    if step_mode == "skip":
        assert engine.jumps == JumpCounts(single=3, decode=1)
        assert (engine.jumps.single, engine.wakeups) == (3, 4)


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_async_decode_jump_runs_the_iteration_scheduled_before_an_arrival(step_mode):
    """With async scheduling a decode jump runs one iteration past the one an arrival falls in: that
    next iteration was scheduled when the arrival's started. r0: prompt 10, output 8; r1: prompt 10,
    output 1, arrives at 2.6; 1 s per iteration + 0.01 s per prompt token.

    it 1 [0, 1.1):     r0 prefills (first token)                          wake-up 1
    it 2 [1.1, 2.1):   r0 2nd                                             wake-up 2: a decode jump
    it 3 [2.1, 3.1):   r0 3rd; r1 arrives at 2.6                          over it 3 and it 4 (it 4
    it 4 [3.1, 4.1):   r0 4th                                             was scheduled at 2.1)
    it 5 [4.1, 5.2):   r0 5th, r1 prefills 10 (first and last token)      wake-up 3
    it 6-8 [5.2, 8.2): r0 6th-8th                                         wake-up 4: a jump over 7, 8
    r0 holds 10 + k tokens after iteration k: in it 7 its 17th needs a second block of 16, taken
    inside the last jump.
    """
    engine = run(
        "paged",
        PoolSpec(16 * 40, 16, 128),
        [request(0, 0.0, 10, 8), request(1, 2.6, 10, 1)],
        step_mode=step_mode,
        async_scheduling=True,
    )
    got = times(engine)
    assert got[0] == pytest.approx((0.0, 1.1, 8.2, "finished"))
    assert got[1] == pytest.approx((4.1, 5.2, 5.2, "finished"))
    assert engine.counters.iterations == 8
    if step_mode == "skip":
        assert engine.jumps == JumpCounts(single=2, decode=2, with_growth=1)
        assert (engine.jumps.single, engine.wakeups) == (2, 4)


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_async_prefill_jump_runs_the_iteration_scheduled_before_an_arrival(step_mode):
    """With async scheduling, iteration 2 was scheduled when iteration 1 started (t = 0), so a request
    arriving during iteration 1 cannot stop a jump that runs iteration 2. r0: prompt 15, output 1,
    10 tokens per iteration; r1 (prompt 5, output 1) arrives at 0.5. 1 s + 0.01 s per prompt token.

    it 1 [0, 1.1):     r0 prefills 10
    it 2 [1.1, 2.15):  r0 prefills 5: its first and last token. Planned at it 1 as a jump (it 2
                       leaves 5 tokens of budget, but its admissions saw the queue at t = 0: empty)
    it 3 [2.15, 3.2):  r1, seen at 1.1 when it 2 started, prefills 5: first and last token"""
    engine = run(
        "paged",
        PoolSpec(16 * 40, 16, 128),
        [request(0, 0.0, 15, 1), request(1, 0.5, 5, 1)],
        step_mode=step_mode,
        max_num_batched_tokens=10,
        async_scheduling=True,
    )
    got = times(engine)
    assert got[0] == pytest.approx((0.0, 2.15, 2.15, "finished"))
    assert got[1] == pytest.approx((2.15, 3.2, 3.2, "finished"))
    assert engine.counters.iterations == 3
    if step_mode == "skip":
        assert engine.jumps == JumpCounts(single=1, prefill=1)
        assert (engine.jumps.single, engine.wakeups) == (1, 2)


def test_engine_wakeups_count_events_not_iterations():
    """One request, prompt 20, output 10, nothing else: iteration 1 prefills and gives the first
    token (a prompt completing ends a wake-up); the 9 decode iterations after it have nothing that
    could interrupt them before the request finishes, so skipping runs them in one wake-up. Single
    stepping wakes once per iteration."""
    requests = [request(0, 0.0, 20, 10)]
    skip = run("paged", PoolSpec(160, 16, 128), requests)
    single = run("paged", PoolSpec(160, 16, 128), requests, step_mode="single")
    assert skip.counters.iterations == single.counters.iterations == 10
    assert (skip.wakeups, single.wakeups) == (2, 10)


def test_fewer_collections_raises_the_youngest_threshold_and_restores_it():
    import gc

    from sim.engine.gc_tuning import YOUNG_COLLECTION_EVERY, fewer_collections

    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        with fewer_collections():
            assert gc.get_threshold() == (YOUNG_COLLECTION_EVERY, 10, 10) == (1_000_000, 10, 10)
        assert gc.get_threshold() == (700, 10, 10)
        with pytest.raises(ZeroDivisionError), fewer_collections():
            raise ZeroDivisionError
        assert gc.get_threshold() == (700, 10, 10)
        # A user's larger threshold, or a disabled collector (0), is left as it is.
        for user in [(2_000_000, 5, 5), (0, 10, 10)]:
            gc.set_threshold(*user)
            with fewer_collections():
                assert gc.get_threshold() == user
            assert gc.get_threshold() == user
    finally:
        gc.set_threshold(*saved)


def test_a_run_takes_until_s_or_a_stop_event_not_both():
    """A cluster stops its engines with an event, a single run at ``until_s``: both at once is a
    caller's mistake, refused before anything runs (the clock stays at 0)."""
    pool = PoolSpec(160, 16, 128)
    engine = Engine(
        make_policy("paged", pool),
        RoundCostModel(),
        EngineKnobs(max_model_len=128),
        iter([request(0, 0.0, 10, 2)]),
        block_size=16,
    )
    with pytest.raises(ValueError, match=r"^an engine run takes until_s or a stop event, not both$"):
        engine.run(until_s=5.0, stop=engine.env.event())
    assert engine.env.now == 0 and not engine.records


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_a_follow_up_arriving_inside_a_decode_jump_is_admitted_on_time(step_mode):
    """R3 (prompt 10, output 30) and R0 (prompt 10, output 3) start at 0; R0's user sends R2 (prompt
    10, output 2) 0.5 s after R0 ends; R1 (prompt 10, output 5) is an open-loop request at 20.
    it 1 [0, 1.2): both prompts. R0's tokens at 1.2, 2.2, 3.2: it ends at 3.2, R2 arrives at 3.7,
    while R3 decodes alone (skipping events: inside a jump, which must end at R2's arrival as at any
    other), and joins at the next iteration, [4.2, 5.3): first token 5.3, done at 6.3. Iterations
    start at 5.3 + k after it; R1 joins at 20.3: first token 21.4, done at 25.4. R3's 29 decode
    steps and the two prompts beside them: 1.2 + 29 + 0.1 + 0.1 = 30.4."""

    def follow_up(done, finish_s):
        return request(2, finish_s + 0.5, 10, 2) if done.request_id == 0 else None

    requests = [request(3, 0.0, 10, 30), request(0, 0.0, 10, 3), request(1, 20.0, 10, 5)]
    pool = PoolSpec(16 * 40, 16, 160)
    engine = Engine(
        make_policy("paged", pool),
        RoundCostModel(),
        EngineKnobs(max_model_len=160, step_mode=step_mode),
        iter(requests),
        block_size=16,
        follow_up=follow_up,
    )
    engine.run()
    got = times(engine)
    assert got[0] == pytest.approx((0.0, 1.2, 3.2, "finished"))
    assert got[2] == pytest.approx((4.2, 5.3, 6.3, "finished"))
    assert got[1] == pytest.approx((20.3, 21.4, 25.4, "finished"))
    assert got[3] == pytest.approx((0.0, 1.2, 30.4, "finished"))


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_each_decode_step_attends_the_prompt_the_tokens_so_far_and_its_own(step_mode):
    """1 s per iteration + 0.01 s per prompt token + 0.01 s per attended token. Iteration 1 prefills
    prompts 10 and 30: 1 + 0.4 = 1.4 s, both first tokens at 1.4. Iteration 2 decodes both, each
    attending its prompt, its first token and the one it computes: 12 + 32 = 44 tokens, 1.44 s, to
    2.84 (request 1's second and last token). Iteration 3 decodes request 0 alone: 10 + 2 + 1 = 13
    tokens, 1.13 s, to 3.97."""
    pool = PoolSpec(16 * 64, 16, 512)
    engine = Engine(
        make_policy("paged", pool),
        RoundCostModel(per_context_token_s=0.01),
        EngineKnobs(max_model_len=512, step_mode=step_mode),
        iter([request(0, 0.0, 10, 3), request(1, 0.0, 30, 2)]),
        block_size=pool.block_size,
    )
    engine.run()
    times = {record.request_id: (record.first_token_s, record.finish_s) for record in engine.records}
    assert times == {0: pytest.approx((1.4, 3.97)), 1: pytest.approx((1.4, 2.84))}
