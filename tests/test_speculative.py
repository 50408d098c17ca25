"""Speculative decoding: acceptance worked by hand, the token schedule, lookahead slots per policy,
engine times by hand in both step modes, the step's cost, and bad input."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import numpy as np
import pytest
import yaml

from policies import PoolSpec, make_policy
from sim.config import ConfigError, load_experiment
from sim.costs.factory import make_cost_model
from sim.engine.core import Engine, EngineKnobs
from sim.engine.speculation import AcceptanceModel, SpeculativeDecoding, TokenSchedule, lookahead_slots
from sim.hardware.gpus import resolve_gpu
from sim.hardware.models import resolve_model
from sim.runner import engine_draft, prepare_experiment
from tests.engine_helpers import RoundCostModel, request
from tests.test_engine import times


# ------------------------------------------------------------------------------------------ acceptance
def test_rates_are_vllm_per_position_rates():
    model = AcceptanceModel.from_rates([0.8, 0.5, 0.2])
    # P(a >= 1, 2, 3) = 0.8, 0.5, 0.2 -> P(a = 0..3) = 0.2, 0.3, 0.3, 0.2
    assert model.probabilities == pytest.approx((0.2, 0.3, 0.3, 0.2))
    assert model.mean_acceptance_length == pytest.approx(2.5)


def test_mean_length_gives_one_rate_per_position():
    # 1 + a + a^2 = 1.75 -> a = 0.5: P(a >= 1) = 0.5, P(a >= 2) = 0.25
    model = AcceptanceModel.from_mean_length(1.75, 2)
    assert model.probabilities == pytest.approx((0.5, 0.25, 0.25))
    assert AcceptanceModel.from_mean_length(2.0, 1).probabilities == pytest.approx((0.0, 1.0))
    assert AcceptanceModel.from_mean_length(1.0, 3).probabilities == pytest.approx((1.0, 0, 0, 0), abs=1e-12)


def test_histogram_normalised_and_padded():
    assert AcceptanceModel.from_histogram([1, 1, 2], 2).probabilities == (0.25, 0.25, 0.5)
    assert AcceptanceModel.from_histogram([3, 1], 3).probabilities == (0.75, 0.25, 0.0, 0.0)


def test_schedule_by_hand_when_every_step_accepts_two():
    schedule = TokenSchedule(AcceptanceModel((0.0, 0.0, 1.0), "test"), seed=1)
    # iteration i starts at 1 + 3 (i - 1) and ends at 3 i
    assert [schedule.first_token(i) for i in range(1, 5)] == [1, 4, 7, 10]
    assert [schedule.last_token(i) for i in range(1, 5)] == [3, 6, 9, 12]
    assert schedule.iteration_starting_at_or_after(5) == 3
    assert schedule.iteration_starting_at_or_after(4) == 2
    assert schedule.iteration_ending_at_or_after(6) == 2
    assert schedule.iteration_ending_at_or_after(7) == 3
    assert list(schedule.starts(1, 3)) == [3.0, 6.0, 9.0]


def test_sources_say_how_the_acceptance_was_given():
    """The summary and the capacity line print the model's source as given."""
    assert AcceptanceModel.from_rates([0.8, 0.5]).source == "per-position rates 0.8, 0.5"
    # 1 + a + a^2 = 1.75 -> a = 0.5
    assert AcceptanceModel.from_mean_length(1.75, 2).source == "mean acceptance length 1.75 (alpha 0.5000)"
    assert AcceptanceModel.from_histogram([2, 3, 5], 2).source == "histogram of 10 steps"


def test_schedule_from_iteration_zero_and_past_the_first_block_of_draws():
    """Every step accepts two: iteration i starts at 1 + 3 (i - 1); clock 0 is before any iteration.
    Queries on fresh schedules beyond the first block of 4,096 drawn iterations draw what they need."""
    every_two = AcceptanceModel((0.0, 0.0, 1.0), "test")
    schedule = TokenSchedule(every_two, seed=1)
    assert list(schedule.starts(0, 2)) == [1.0, 4.0]
    assert schedule.iteration_starting_at_or_after(1) == 1
    assert schedule.iteration_starting_at_or_after(2) == 2
    # token 15,001 = 1 + 3 x 5,000 starts iteration 5,001; 15,002 the next one
    assert TokenSchedule(every_two, seed=1).iteration_starting_at_or_after(15_001) == 5_001
    assert TokenSchedule(every_two, seed=1).iteration_ending_at_or_after(15_003) == 5_001
    far = TokenSchedule(every_two, seed=1).starts(4_090, 10)
    assert list(far) == [3.0 * j for j in range(1, 11)]


def test_draws_reproducible_by_seed_and_match_their_distribution():
    model = AcceptanceModel.from_rates([0.8, 0.5, 0.2])
    steps = 20_000
    first = TokenSchedule(model, seed=[7, 1])
    accepted = np.array([first.accepted(i) for i in range(1, steps + 1)])
    again = TokenSchedule(model, seed=[7, 1])
    assert [again.accepted(i) for i in range(1, 200)] == accepted[:199].tolist()
    other = TokenSchedule(model, seed=[8, 1])
    assert [other.accepted(i) for i in range(1, 200)] != accepted[:199].tolist()
    observed = np.bincount(accepted, minlength=4)
    expected = np.array(model.probabilities) * steps
    chi_square = float(((observed - expected) ** 2 / expected).sum())
    assert chi_square < 16.27  # 3 degrees of freedom, p = 0.001


# ------------------------------------------------------------------------------------ lookahead slots
def test_lookahead_slots_follow_vllm():
    # vLLM V1: a decoding request holds 1 + k slots for its step and num_lookahead_tokens = k more for
    # EAGLE, EAGLE-3, MTP and draft models; n-gram proposals need none (docs/speculative-research.md)
    assert lookahead_slots("eagle3", 3) == 6
    assert lookahead_slots("draft_model", 4) == 8
    assert lookahead_slots("ngram", 3) == 3


def test_paged_holds_lookahead_by_hand():
    policy = make_policy("paged", PoolSpec(64, 4, 64))
    policy.hold_lookahead(4)
    policy.admit(1, ((5, 6),), 13 + 4, 99)  # final length counts the lookahead (the coordinator adds it)
    assert len(policy.block_table(1)) == 2  # the prompt only: vLLM reserves lookahead from the first decode
    policy.grow(1, 1)  # 7 tokens + 4 lookahead -> 3 blocks
    assert len(policy.block_table(1)) == 3
    assert policy.growth_room(1) == 12 - 4 - 7
    policy.grow(1, 2)  # 9 + 4 = 13 -> 4 blocks
    assert len(policy.block_table(1)) == 4
    used, reserved, internal, external, cached, free = policy.breakdown_values()
    # targets: 4 + 4 + 4 + min(4, 17 - 12) = 16 slots; 9 hold tokens
    assert (used, reserved, internal, free) == (9, 7, 0, 64 - 16)
    policy.grow(1, 4)  # 13 tokens (its last) + 4 -> 5 blocks, the fifth's target 17 - 16 = 1
    assert (len(policy.block_table(1)), policy.growth_room(1)) == (5, 0)
    assert policy.breakdown_values()[:3] == (13, 4, 3)
    policy.free(1)
    assert policy.breakdown_values() == (0, 0, 0, 0, 0, 64)


def test_prefix_frees_lookahead_blocks_without_caching_them():
    policy = make_policy("prefix", PoolSpec(64, 4, 64))
    policy.hold_lookahead(4)
    policy.admit(1, ((5, 8),), 12 + 4, 99)
    policy.grow(1, 1)  # 9 tokens + 4 -> 4 blocks: two full (cached on free), a tail, one for drafts
    assert len(policy.block_table(1)) == 4
    policy.free(1)
    used, reserved, internal, external, cached, free = policy.breakdown_values()
    assert (used, reserved, internal, cached, free) == (0, 0, 0, 8, 56)


def test_contiguous_reserves_lookahead_inside_its_region():
    policy = make_policy("contiguous", PoolSpec(200, 16, 64), reservation="max")
    policy.hold_lookahead(6)
    policy.admit(1, ((5, 10),), 20 + 6, 99)
    assert policy.region(1)[1] == 64 + 6


def test_radix_cannot_hold_lookahead():
    policy = make_policy("radix", PoolSpec(64, 1, 64))
    with pytest.raises(ValueError, match="cannot hold lookahead"):
        policy.hold_lookahead(4)


# --------------------------------------------------------------------------------- the engine, by hand
def _engine(step_mode, speculative, requests, blocks=64, policy="paged", costs=None):
    pool = PoolSpec(blocks * 4, 4, 200)
    engine = Engine(
        make_policy(policy, pool),
        costs or RoundCostModel(),
        EngineKnobs(max_model_len=200, step_mode=step_mode, speculative=speculative),
        iter(requests),
        block_size=4,
    )
    engine.run()
    return engine


ALWAYS_TWO = SpeculativeDecoding("eagle", 2, AcceptanceModel((0.0, 0.0, 1.0), "test"), 4)
NEVER = SpeculativeDecoding("eagle", 2, AcceptanceModel((1.0, 0.0, 0.0), "test"), 4)


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_times_by_hand(step_mode):
    """Decode step 1 s, prefill 0.01 s/token. Prompt 20, output 7: the prefill iteration takes
    1.2 s and gives the first token; six more follow, three per step when every step accepts two
    drafts (2 steps: finish at 3.2 s), one per step when none is accepted (6 steps: 7.2 s), as
    without speculation."""
    two = _engine(step_mode, ALWAYS_TWO, [request(0, 0.0, 20, 7)])
    assert times(two)[0] == (0.0, pytest.approx(1.2), pytest.approx(3.2), "finished")
    assert two.counters.output_tokens == 7
    record = two.records[0]
    assert (record.decode_steps, record.decode_step_tokens) == (2, 6)  # two bursts of three tokens
    none = _engine(step_mode, NEVER, [request(0, 0.0, 20, 7)])
    plain = _engine(step_mode, None, [request(0, 0.0, 20, 7)])
    assert times(none) == times(plain)
    assert times(none)[0][2] == pytest.approx(7.2)
    assert (plain.records[0].decode_steps, plain.records[0].decode_step_tokens) == (6, 6)


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_overshoot_is_dropped_at_the_last_token(step_mode):
    """Output 6: after the first token, 3 + 3 would give 7; the request stops at its 6th token, in
    the second step, and its sequence never holds more than its final length."""
    engine = _engine(step_mode, ALWAYS_TWO, [request(0, 0.0, 20, 6)])
    assert times(engine)[0][2] == pytest.approx(3.2)
    record = engine.records[0]
    assert (record.outcome, record.decode_steps, record.decode_step_tokens) == ("finished", 2, 5)


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_requests_ending_in_one_step_leave_in_admission_order(step_mode):
    """Both admitted in the prefill iteration, request 0 first. Every step accepts two drafts, so
    the second step takes tokens 5 to 7: request 0 (output 7) ends at its 7th token, request 1
    (output 6) at its 6th, an earlier clock of the same step. They finish together at 3.4 s (the
    prefill iteration is 40 tokens: 1.4 s) and leave oldest admission first, not in the order their
    last tokens came (vLLM's scheduler walks its running requests in that order)."""
    engine = _engine(step_mode, ALWAYS_TWO, [request(0, 0.0, 20, 7), request(1, 0.0, 20, 6)])
    assert [record.request_id for record in engine.records] == [0, 1]
    assert [times(engine)[request_id][2] for request_id in (0, 1)] == [pytest.approx(3.4)] * 2


@pytest.mark.parametrize(
    ("outputs", "first_rows"),
    [
        # Entries (clock, admission) popped (8, 9) then (9, 8): each one's admission number is the
        # other's clock (admissions count from 1; the step ends at clocks 8 and 9).
        ({7: 7, 8: 6}, [7, 8]),
        # Popped (8, 6), (8, 8), (9, 7): the first two of one clock, the last of another.
        ({5: 6, 6: 7, 7: 6}, [5, 6, 7]),
    ],
)
def test_several_ends_of_one_step_leave_in_admission_order(outputs, first_rows):
    """Nine requests admitted together (ids = admission order); those not named decode 20 tokens.
    The second step (tokens 5 to 7, every step accepting two drafts) ends the named ones at their 6th
    or 7th token: they leave in admission order whatever clock each last token had."""
    requests = [request(index, 0.0, 20, outputs.get(index, 20)) for index in range(9)]
    engine = _engine("skip", ALWAYS_TWO, requests, blocks=128)
    assert [record.request_id for record in engine.records][: len(first_rows)] == first_rows


def _stream(count, seed=3):
    rng = random.Random(seed)
    arrival = 0.0
    out = []
    for index in range(count):
        arrival += rng.expovariate(0.5)
        out.append(request(index, arrival, rng.randint(5, 60), rng.randint(1, 50)))
    return out


@pytest.mark.parametrize("policy", ["paged", "prefix"])
def test_skip_equals_single_under_preemption(policy):
    speculative = SpeculativeDecoding("eagle", 3, AcceptanceModel.from_rates([0.8, 0.6, 0.4]), 6)
    costs = RoundCostModel(per_context_token_s=0.001)
    skip = _engine("skip", speculative, _stream(30), blocks=40, policy=policy, costs=costs)
    single = _engine("single", speculative, _stream(30), blocks=40, policy=policy, costs=costs)
    assert skip.counters.preemptions == single.counters.preemptions > 0
    assert skip.counters.iterations == single.counters.iterations
    assert skip.counters.output_tokens == single.counters.output_tokens
    for request_id, row in times(skip).items():
        assert row[3] == times(single)[request_id][3]
        assert row[:3] == pytest.approx(times(single)[request_id][:3], rel=1e-9)
    # the pool's breakdown sums to the pool at every observation
    frame = skip.recorder.frame()
    columns = [c for c in frame.columns if c.endswith("_tokens")][:6]
    assert (frame[columns].sum(axis=1) == 160).all()


def test_skip_equals_single_with_chunked_prompts_beside_speculative_decodes():
    """Prompts chunked 12 tokens at a time (less 3 per decoding request: 1 + 2 drafts) while others
    decode speculatively: skipping runs jumps that prefill chunks, whose iterations each grow the
    decoding context by the tokens that iteration's step accepts (the token schedule), not by one;
    with a cost per context token a wrong growth changes every time. Single stepping, which plans no
    jump, is the reference."""
    speculative = SpeculativeDecoding("eagle", 2, AcceptanceModel.from_rates([0.7, 0.4]), 4)
    costs = RoundCostModel(per_context_token_s=0.003)
    requests = _stream(16, seed=11)

    def run(step_mode):
        pool = PoolSpec(400 * 4, 4, 200)
        knobs = EngineKnobs(
            max_model_len=200, step_mode=step_mode, speculative=speculative, max_num_batched_tokens=12
        )
        engine = Engine(make_policy("paged", pool), costs, knobs, iter(requests), block_size=4)
        engine.run()
        return engine

    skip, single = run("skip"), run("single")
    assert skip.jumps.prefill > 0  # the path under test ran
    assert skip.counters.iterations == single.counters.iterations
    assert skip.counters.output_tokens == single.counters.output_tokens
    for request_id, row in times(single).items():
        assert times(skip)[request_id][3] == row[3]
        assert times(skip)[request_id][:3] == pytest.approx(row[:3], rel=1e-9)
    # The slot-seconds of the tokens decoded inside jumps follow the token schedule (an iteration
    # that accepts two drafts fills three slots per sequence): the time averages are single stepping's.
    end = single.env.now
    averages = single.recorder.time_averages(end)
    for key, value in skip.recorder.time_averages(end).items():
        assert value == pytest.approx(averages[key], rel=1e-9, abs=1e-12), key


def test_a_decode_jump_stops_at_an_arrival_by_the_token_schedule():
    """A decode jump ends with the iteration an arrival falls in; under speculative decoding its
    iterations' times grow with the context by the tokens each step accepts (three per sequence
    here), so where the arrival falls is found on the token schedule, not one token per iteration.
    At 0.05 s per context token the difference grows to whole iterations within a jump. Single stepping is the
    reference."""
    costs = RoundCostModel(per_context_token_s=0.05)
    requests = [request(0, 0.0, 30, 150), request(1, 0.0, 20, 150)] + [
        request(2 + index, 40.0 + 37.3 * index, 10, 5) for index in range(8)
    ]
    skip = _engine("skip", ALWAYS_TWO, requests, costs=costs)
    single = _engine("single", ALWAYS_TWO, requests, costs=costs)
    assert skip.jumps.decode > 0
    assert skip.counters.iterations == single.counters.iterations
    for request_id, row in times(single).items():
        assert times(skip)[request_id][3] == row[3]
        assert times(skip)[request_id][:3] == pytest.approx(row[:3], rel=1e-9)


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_a_prompt_in_progress_with_no_budget_left_is_a_decode_jump(step_mode):
    """Each decoding request takes 3 of the 5 tokens an iteration may schedule (1 + 2 drafts, every
    step accepts both): with two of them decoding the budget is 5 - 6 < 0, and a prompt in progress
    gets no chunk, so the iterations until the next completion are a decode jump (no prefill jump
    without chunks). 1 s per decode step + 0.01 s per prompt token. r0: prompt 3, output 13, at 0;
    r1: prompt 3, output 7, at 0.5; r2: prompt 10, output 1, at 0.6.

    it 1 [0, 1.03):     r0 prefills 3 (first token)                          wake-up 1
    it 2 [1.03, 2.05):  r0 tokens 2-4; r1 prefills 2 (budget 2); r2 waits     wake-up 2 (it 3 admits)
    it 3 [2.05, 3.07):  r0 5-7; r1 1 (first token), r2 1 (budget 2)          wake-up 3
    it 4 [3.07, 4.07):  r0 8-10, r1 2-4; r2 nothing (budget -1)              wake-up 4: a decode jump
    it 5 [4.07, 5.07):  r0 11-13, r1 5-7: both finish                        over it 5
    it 6 [5.07, 6.12):  r2 prefills 5                                        wake-up 5: a prefill jump
    it 7 [6.12, 7.16):  r2 4 (first and last token)                          over it 7
    """
    knobs = EngineKnobs(
        max_model_len=200, step_mode=step_mode, speculative=ALWAYS_TWO, max_num_batched_tokens=5
    )
    requests = [request(0, 0.0, 3, 13), request(1, 0.5, 3, 7), request(2, 0.6, 10, 1)]
    engine = Engine(
        make_policy("paged", PoolSpec(64 * 4, 4, 200)), RoundCostModel(), knobs, iter(requests), block_size=4
    )
    engine.run()
    got = times(engine)
    assert got[0] == (0.0, pytest.approx(1.03), pytest.approx(5.07), "finished")
    assert got[1] == (pytest.approx(1.03), pytest.approx(3.07), pytest.approx(5.07), "finished")
    assert got[2] == (pytest.approx(2.05), pytest.approx(7.16), pytest.approx(7.16), "finished")
    assert engine.counters.iterations == 7
    if step_mode == "skip":
        jumps = engine.jumps
        assert (jumps.single, jumps.decode, jumps.prefill, engine.wakeups) == (3, 1, 1, 5)


def test_acceptance_zero_is_never_faster():
    """With nothing accepted, each step still pays for its drafts: the run is slower than without."""
    cfg = _experiment({"speculative": SPEC | {"acceptance": {"rates": [0.0, 0.0, 0.0]}}})
    prepared = prepare_experiment(cfg, Path("."))
    plain, speculative = prepared.variants
    for batch in (1, 16, 64, 256):
        context = batch * 1000
        assert speculative.costs.decode.step_s(batch, context) > plain.costs.decode.step_s(batch, context)


# ------------------------------------------------------------------------------------- cost of a step
SPEC = {"method": "eagle3", "num_speculative_tokens": 3, "acceptance": {"mean_acceptance_length": 2.5}}
BASE = {
    "name": "spec",
    "seed": 1,
    "model": "Llama-3.1-8B",
    "gpu": "H100-80GB",
    "engine": {"max_model_len": 4096},
    "workload": {
        "num_requests": 10,
        "arrival": {"kind": "poisson", "rate_per_s": 1},
        "prompt_len": 200,
        "output_len": 50,
    },
    "variants": [{"name": "plain", "policy": "paged"}],
    "output": {"figures": False},
}


def _experiment(engine_changes, policy="paged", tmp=None):
    data = copy.deepcopy(BASE)
    data["variants"].append({"name": "speculative", "policy": policy, "engine": engine_changes})
    path = Path(tmp or "/tmp") / f"spec-{abs(hash(str(engine_changes))) % 10**8}.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_experiment(path)


def test_step_cost_adds_drafts_and_verification():
    cfg = _experiment({"speculative": SPEC})
    prepared = prepare_experiment(cfg, Path("."))
    plain, speculative = prepared.variants
    target = plain.costs
    step = speculative.costs.decode
    # EAGLE-3's head (one layer, a 32k-token LM head) proposes 3 drafts; the verification adds what
    # 3 more tokens per request cost the target at that batch
    for batch in (1, 64):
        extra = target.iteration_s(0, 0, [(4, 0)] * batch) - target.iteration_s(0, 0, [(1, 0)] * batch)
        drafts = step.intercept_s - target.decode.intercept_s
        expected = target.decode.step_s(batch, 1000 * batch) + extra + drafts
        expected += 3 * (step.per_seq_s - target.decode.per_seq_s) / 3 * batch
        expected += (step.per_context_token_s - target.decode.per_context_token_s) * 1000 * batch
        assert step.step_s(batch, 1000 * batch) == pytest.approx(expected, rel=1e-12)
    # each of the 3 draft forwards is a model-runner call of its own: it pays the draft's whole
    # decode intercept, the serving overhead per iteration (0.19 ms, fitted on plain runs) included
    draft = engine_draft(resolve_model(cfg.model), speculative.engine)
    draft_costs = make_cost_model(
        cfg.cost_model, draft.step_shapes, resolve_gpu(cfg.gpu), block_size=speculative.engine.block_size
    )
    assert step.intercept_s - target.decode.intercept_s == pytest.approx(
        3 * draft_costs.decode.intercept_s, rel=1e-12
    )
    assert draft_costs.decode.intercept_s > target.iteration_overhead_s > 0.00015
    # the draft's KV (one layer of 32) rides in every token's slot: the pool holds fewer tokens
    assert speculative.capacity.kv_bytes_per_token == plain.capacity.kv_bytes_per_token * 33 // 32
    assert speculative.capacity.weight_bytes > plain.capacity.weight_bytes


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "speculative, message",
    [
        ({**SPEC, "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({**SPEC, "acceptance": {"rates": [0.9, 1.2, 0.1]}}, "must lie in [0, 1], got 1.2"),
        ({**SPEC, "acceptance": {"rates": [0.5, 0.7, 0.1]}}, "position 2's rate 0.7 exceeds"),
        ({**SPEC, "acceptance": {"rates": [0.5]}}, "1 rates for num_speculative_tokens 3"),
        (
            {**SPEC, "acceptance": {"histogram": {0: 5, 4: 1}}},
            "4 accepted drafts exceeds num_speculative_tokens 3",
        ),
        ({**SPEC, "acceptance": {"mean_acceptance_length": 4.5}}, "outside [1, 4]"),
        ({**SPEC, "acceptance": {}}, "exactly one of"),
        ({**SPEC, "method": "draft_model"}, "needs draft_model"),
        ({**SPEC, "method": "ngram", "draft_layers": 1}, "draft_layers is for eagle"),
    ],
)
def test_bad_speculative_settings(speculative, message, tmp_path):
    with pytest.raises(ConfigError) as error:
        _experiment({"speculative": speculative}, tmp=tmp_path)
    assert message in str(error.value)
    assert "speculative" in str(error.value)


def test_policy_that_cannot_hold_lookahead_is_refused(tmp_path):
    cfg = _experiment({"speculative": SPEC}, policy="radix", tmp=tmp_path)
    with pytest.raises(ConfigError, match=r"variants\.1\.policy: policy 'radix' cannot hold the lookahead"):
        prepare_experiment(cfg, tmp_path)


def test_sglang_scheduler_refused(tmp_path):
    with pytest.raises(ConfigError, match="scheduler vllm only"):
        _experiment({"speculative": SPEC, "scheduler": "sglang"}, tmp=tmp_path)


def test_draft_model_that_does_not_fit(tmp_path):
    data = copy.deepcopy(BASE)
    data["gpu"] = "L4-24GB"
    data["variants"] = [
        {
            "name": "draft",
            "policy": "paged",
            "engine": {"speculative": {**SPEC, "method": "draft_model", "draft_model": "Llama-3.1-8B"}},
        }
    ]
    path = tmp_path / "draft.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="does not fit.*speculative draft"):
        prepare_experiment(load_experiment(path), tmp_path)


def test_samples_are_rejected_with_their_reason():
    engine = _engine("skip", ALWAYS_TWO, [request(0, 0.0, 20, 7, n=2)])
    assert engine.records[0].outcome == "rejected"
    assert "not modelled with speculative decoding" in engine.records[0].reason


def test_histogram_file_read_and_its_errors_named(tmp_path):
    (tmp_path / "accepted.csv").write_text("accepted_drafts,count\n0,378\n1,240\n2,130\n3,252\n")
    cfg = _experiment(
        {"speculative": {**SPEC, "acceptance": {"histogram_file": "accepted.csv"}}}, tmp=tmp_path
    )
    prepared = prepare_experiment(cfg, tmp_path / "spec.yaml")
    acceptance = prepared.variants[1].speculative.acceptance
    assert acceptance.probabilities == pytest.approx((0.378, 0.240, 0.130, 0.252))
    (tmp_path / "accepted.csv").write_text("accepted_drafts,count\n0,378\n4,240\n")
    with pytest.raises(ConfigError, match=r"accepted\.csv: line 3: 4 accepted drafts is outside 0\.\.3"):
        prepare_experiment(cfg, tmp_path / "spec.yaml")


def test_a_histogram_file_that_is_not_utf8_is_named_not_a_traceback(tmp_path):
    (tmp_path / "accepted.csv").write_bytes(b"accepted_drafts,count\n0,3\xff\n")
    cfg = _experiment(
        {"speculative": {**SPEC, "acceptance": {"histogram_file": "accepted.csv"}}}, tmp=tmp_path
    )
    with pytest.raises(ConfigError) as error:
        prepare_experiment(cfg, tmp_path / "spec.yaml")
    # 22 bytes of header and newline, then "0,3": the byte 0xff is the 26th, at offset 25.
    assert (
        str(error.value)
        .split("\n")[1]
        .endswith(
            f"engine.speculative.acceptance.histogram_file: {tmp_path / 'accepted.csv'}: not UTF-8 text "
            "(byte 0xff at offset 25); save the file as UTF-8"
        )
    )


def test_summary_says_what_speculation_ran_and_costs(tmp_path):
    from sim.runner import run_experiment

    data = copy.deepcopy(BASE)
    data["variants"].append({"name": "speculative", "policy": "paged", "engine": {"speculative": SPEC}})
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    plain, speculative = (
        result.summary for result in run_experiment(load_experiment(path), tmp_path / "out")
    )
    assert (plain["speculative"], plain["lookahead_slots"], plain["tokens_per_decode_step"]) == ("", 0, 1.0)
    assert speculative["speculative"].startswith("eagle3, k=3, mean acceptance length 2.5")
    assert speculative["lookahead_slots"] == 6
    assert speculative["draft_kv_bytes_per_token"] == 4096  # one layer: 8 KV heads x 128 x 2 (K, V) x 2 B
    # EAGLE-3's head: one Llama-3.1-8B layer (218,112,128 params) and a 32,000 x 4,096 LM head, bf16
    assert speculative["draft_weight_bytes"] == (218_112_128 + 32_000 * 4_096) * 2
    assert speculative["kv_bytes_per_token"] == plain["kv_bytes_per_token"] + 4096


def test_draft_model_sizes_from_its_preset():
    from sim.hardware.draft import draft_for
    from sim.hardware.models import resolve_model

    # Llama-3.2-1B: 1,235,814,400 params at 2 B; 16 layers x 8 KV heads x 64 x (K, V) x 2 B per token
    draft = draft_for("draft_model", resolve_model("Llama-3.1-8B"), draft_model="Llama-3.2-1B")
    assert (draft.weight_bytes, draft.kv_bytes_per_token) == (1_235_814_400 * 2, 16 * 8 * 64 * 2 * 2)
    # its own decode step prices each draft step: a 1B model's weights, not the target's
    assert draft.step_shapes is not None and draft.step_shapes.num_layers == 16
    # tensor parallelism splits the draft like the target (vLLM runs the draft model at the target's TP)
    split = draft_for(
        "draft_model", resolve_model("Llama-3.1-8B"), draft_model="Llama-3.2-1B", tensor_parallel_size=2
    )
    assert split.kv_bytes_per_token == 16 * 4 * 64 * 2 * 2


def test_capacity_line_says_what_the_draft_takes(tmp_path):
    cfg = _experiment({"speculative": SPEC}, tmp=tmp_path)
    plain, speculative = prepare_experiment(cfg, tmp_path / "spec.yaml").variants
    (line,) = [line for line in speculative.capacity_lines() if line.startswith("Speculative decoding")]
    # EAGLE-3's head: (218,112,128 + 32,000 x 4,096) params x 2 B = 698,368,256 B = 0.65 GiB; one
    # layer's K/V per token; 2k = 6 lookahead slots
    assert "eagle3, k=3, mean acceptance length 2.50" in line
    assert "0.65 GiB of weights, 4,096 B of KV per token" in line
    assert line.endswith("6 lookahead slots per decoding request")
    assert not [line for line in plain.capacity_lines() if line.startswith("Speculative")]


# ------------------------------------------------------------------------------ where speculation stops paying
def test_break_even_batch_is_the_first_batch_slower_than_plain_steps():
    from types import SimpleNamespace

    from sim.costs.terms import DecodeCost
    from sim.validation.checks_costs import _break_even_batch

    # plain 1 ms + 0.01 ms per request, speculative 1.5 ms + 0.03 ms per request, 2 tokens a step:
    # 2 (1 + 0.01 B) < 1.5 + 0.03 B  <=>  B > 50
    plain = SimpleNamespace(decode=DecodeCost(1e-3, 1e-5, 0.0))
    speculative = SimpleNamespace(decode=DecodeCost(1.5e-3, 3e-5, 0.0))
    assert _break_even_batch(plain, speculative, 2.0, 700) == 51
    # with 3 tokens a step: 3 + 0.03 B < 1.5 + 0.03 B never holds
    assert _break_even_batch(plain, speculative, 3.0, 700) is None


def test_draft_heads_and_ngram_by_hand():
    from sim.hardware.draft import Draft, draft_for

    # n-gram proposes from the prompt on the CPU: nothing on the GPU
    assert draft_for("ngram", resolve_model("Llama-3.1-8B")) == Draft(
        "ngram", None, 0, 0, "n-gram prompt lookup on the CPU: no draft weights or KV"
    )
    # a draft model keeps its own KV in the cache's dtype: fp8, 16 layers x 8 KV heads x 64 x (K, V) x 1 B
    small = draft_for(
        "draft_model", resolve_model("Llama-3.1-8B"), draft_model="Llama-3.2-1B", kv_cache_dtype="fp8"
    )
    assert (small.method, small.kv_bytes_per_token, small.description) == (
        "draft_model",
        16 * 8 * 64 * 2,
        "draft model Llama-3.2-1B",
    )
    # DeepSeek-V2-Lite's MTP head: one layer, priced as a dense layer of the active parameters per layer
    # ((2,451,435,008 - 2 x 102,400 x 2,048) // 27 = 75,259,429) plus the target's LM head
    # (102,400 x 2,048 = 209,715,200), held at the total per layer
    # ((15,706,484,224 - 419,430,400) // 27 = 566,187,178), 2 B each, halved at TP 2
    target = resolve_model("DeepSeek-V2-Lite")
    mtp = draft_for("mtp", target, tensor_parallel_size=2)
    shapes = mtp.step_shapes
    assert shapes is not None
    assert (shapes.name, shapes.num_layers, shapes.vocab_size, shapes.num_params) == (
        "DeepSeek-V2-Lite mtp head",
        1,
        102_400,
        75_259_429 + 209_715_200,
    )
    assert (shapes.num_active_params, shapes.num_experts, shapes.experts_per_token) == (None, None, None)
    assert (
        shapes.moe_intermediate_size,
        shapes.shared_expert_intermediate_size,
        shapes.num_dense_layers,
    ) == (
        None,
        0,
        0,
    )
    assert (mtp.method, mtp.weight_bytes) == ("mtp", 566_187_178)
    assert mtp.description == "mtp head: 1 layer(s) of DeepSeek-V2-Lite's width, the target's LM head"
    # gpt-oss-20b's EAGLE-3 head at TP 2: two layers of full attention whatever the target's kinds, a
    # 32,000-token LM head of its own; each layer's K/V per token: 8 KV heads / 2 x 64 x (K, V) x 2 B
    eagle3 = draft_for("eagle3", resolve_model("gpt-oss-20b"), tensor_parallel_size=2, draft_layers=2)
    assert eagle3.step_shapes is not None
    assert (eagle3.step_shapes.layer_kinds, eagle3.step_shapes.vocab_size) == (None, 32_000)
    assert eagle3.kv_bytes_per_token == 2 * 4 * 64 * 2 * 2
    assert (
        eagle3.description == "eagle3 head: 2 layer(s) of gpt-oss-20b's width, own LM head of 32,000 tokens"
    )


class _RoutedRound(RoundCostModel):
    """Round numbers whose decode step adds a routed-experts term (0.5 s at batch 1, 0.25 s at 2) and
    whose block copies cost 0.1 s each."""

    @property
    def decode(self):
        from sim.costs.terms import RoutedDecodeCost

        return RoutedDecodeCost(1.0, 0.1, 0.01, batch_s=(0.0, 0.5, 0.25))

    def copy_blocks_s(self, num_blocks):
        return 0.1 * num_blocks


@pytest.mark.parametrize("linear", [False, True])
def test_speculative_step_and_iteration_by_hand(linear):
    """Target: 1 s + 0.1 s per request + 0.01 s per context token (+ 0.5 / 0.25 s at batches 1 / 2),
    prefill 0.01 s per token, its fixed cost the 1 s intercept; draft step 0.2 s + 0.02 s per request
    + 0.001 s per token; k = 3. The step: 1 + 3 x 0.2 = 1.6 s + 0.16 s per request + 0.013 s per
    token, and per batch B what 3 more tokens per request add to the target's pass: 4 x 0.01 B -
    0.01 B = 0.03 B, up to the largest batch (4), plus the routed term; beyond it nothing. With or
    without the target's compiled linear terms, the same times."""
    from sim.costs.speculative import SpeculativeCostModel, speculative_step
    from sim.costs.terms import DecodeCost, LinearIterationCost, PrefillCost

    target = _RoutedRound(1.0, 0.1, 0.01, prefill_per_token_s=0.01)
    if linear:
        target._linear = LinearIterationCost(target.decode, PrefillCost(1.0, 0.0, 0.01, 0.0))
    step = speculative_step(target, 3, DecodeCost(0.2, 0.02, 0.001), max_batch=4)
    assert (step.intercept_s, step.per_seq_s, step.per_context_token_s) == pytest.approx((1.6, 0.16, 0.013))
    assert step.batch_s == pytest.approx((0.0, 0.03 + 0.5, 0.06 + 0.25, 0.09, 0.12))
    assert step.step_s(2, 100) == pytest.approx(1.6 + 0.32 + 1.3 + 0.31)
    assert step.step_s(5, 0) == pytest.approx(1.6 + 0.8)
    costs = SpeculativeCostModel(target, step, "eagle3, k=3")
    assert costs.label == "test: round numbers + speculative decoding (eagle3, k=3)"
    assert costs.iteration_s(2, 100) == pytest.approx(1.6 + 0.32 + 1.3 + 0.31)
    # with a 10-token chunk: one fixed cost (the step's 1.6 s over the prefill's 1 s), no routed term
    assert costs.iteration_s(2, 100, [(10, 0)]) == pytest.approx(1.6 + 0.32 + 1.3 + 0.1)
    assert costs.iteration_s(0, 0, [(10, 0)]) == pytest.approx(1.0 + 0.1)
    # copies (0.1 s per block here) and swaps (0.5 s per block) are the target's
    assert (costs.copy_blocks_s(2), costs.swap_blocks_s(2)) == pytest.approx((0.2, 1.0))


def test_a_request_whose_tokens_and_drafts_outgrow_the_pool_is_rejected_on_arrival():
    """Pool of 8 blocks x 4 = 32 slots; ALWAYS_TWO holds 4 lookahead slots past a sequence's tokens.
    Prompt 20 + output 8 = 28 tokens: with its 4 draft slots, 32, exactly the pool: admitted. Output 9:
    29 + 4 = 33 > 32: rejected on arrival, naming the pool (without speculation it would fit)."""
    fits = _engine("single", ALWAYS_TWO, [request(0, 0.0, 20, 8)], blocks=8)
    assert fits.records[0].outcome == "finished"
    over = _engine("single", ALWAYS_TWO, [request(0, 0.0, 20, 9)], blocks=8)
    record = over.records[0]
    assert record.outcome == "rejected"
    assert record.reason == (
        "1 sequence(s) x (prompt 20 + output 9 = 29 tokens) exceed the KV pool (32 slots) even with "
        "nothing else running"
    )
    assert _engine("single", None, [request(0, 0.0, 20, 9)], blocks=8).records[0].outcome == "finished"


def test_samples_under_speculation_are_rejected_with_the_reason():
    """Speculative decoding runs one sequence per request: n=2 is refused on arrival, and says why."""
    engine = _engine("single", ALWAYS_TWO, [request(0, 0.0, 20, 5, n=2, sample_output_lens=(5, 3))])
    record = engine.records[0]
    assert (record.outcome, record.reason) == (
        "rejected",
        "n/beam_width=2: samples and beams are not modelled with speculative decoding "
        "(engine.speculative runs one sequence per request)",
    )


@pytest.mark.parametrize("until_s", [4.6, 6.9, 9.5, 16.0])
def test_a_run_stopped_inside_a_speculative_jump_equals_single_stepping(until_s):
    """``until_s`` inside a decode jump: the iteration in progress holds the tokens its sequences
    gained by its start, which under speculation is the token schedule's count, not one per iteration
    (the time averages of used and reserved slots were off by ~1e-7 of the pool; found by
    ``tools/fuzz_step_modes.py``). Single stepping is the reference."""
    from tests.test_engine import assert_same_results

    speculative = SpeculativeDecoding("eagle", 3, AcceptanceModel.from_rates([0.8, 0.6, 0.4]), 6)
    costs = RoundCostModel(per_context_token_s=0.001)

    def run(step_mode):
        pool = PoolSpec(256 * 4, 4, 200)
        knobs = EngineKnobs(max_model_len=200, step_mode=step_mode, speculative=speculative)
        engine = Engine(make_policy("paged", pool), costs, knobs, iter(_stream(6, seed=5)), block_size=4)
        engine.run(until_s)
        return engine

    skip, single = run("skip"), run("single")
    assert skip.jumps.decode > 0
    assert skip.env.now == single.env.now == until_s
    assert_same_results(single, skip)


def test_a_swapped_in_speculative_request_owes_its_lookahead_blocks_not_tokens():
    """Swapped back in, a speculative request holds blocks for its tokens but not for the drafts'
    lookahead slots: its growth room is below zero. The decode clock read that as tokens already told
    to the pool, and counted them as told twice when it left again: the time series' used slots went
    negative (-8 at the end of a Mistral-7B run with nothing running; found by
    ``tests/fuzz_step_modes.py``). Now no row holds a negative category, the run ends with nothing
    used, and both step modes agree."""
    from tests.test_engine import assert_same_results

    speculative = SpeculativeDecoding("eagle", 3, AcceptanceModel.from_rates([0.8, 0.6, 0.4]), 6)
    costs = RoundCostModel(per_context_token_s=0.001)

    def run(step_mode):
        pool = PoolSpec(40 * 4, 4, 200)
        knobs = EngineKnobs(
            max_model_len=200,
            step_mode=step_mode,
            speculative=speculative,
            preemption_mode="swap",
            swap_space_blocks=200,
        )
        engine = Engine(make_policy("paged", pool), costs, knobs, iter(_stream(30)), block_size=4)
        engine.run()
        return engine

    skip, single = run("skip"), run("single")
    assert skip.counters.swapped_out_blocks > 0
    assert_same_results(single, skip)
    for engine in (skip, single):
        frame = engine.recorder.frame()
        columns = [c for c in frame.columns if c.endswith("_tokens")][:6]
        assert (frame[columns] >= 0).all().all()
        assert (frame[columns].sum(axis=1) == 160).all()
        assert frame["used_tokens"].iloc[-1] == 0


@pytest.mark.parametrize("model_name", ["Llama-3.1-8B", "gpt-oss-20b", "Nemotron-H-8B-Base-8K"])
@pytest.mark.parametrize(
    "cost_model",
    ["analytic", "derated", {"kind": "derated", "time_scale": 1.25}, {"kind": "analytic", "time_scale": 0.8}],
)
def test_identical_chunks_cost_what_the_list_of_them_costs(model_name, cost_model):
    """``uniform_prefill_s`` (the speculative table's entry per batch size, in constant time; the list
    took O(batch), so a table to max_num_seqs 2**63 never ended) against ``iteration_s`` of the list:
    dense, windowed and Mamba layers, every kind of model and a time scale on each."""
    costs = make_cost_model(cost_model, resolve_model(model_name), resolve_gpu("H100-80GB"), block_size=16)
    for count in (0, 1, 7, 300):
        for num_tokens, start in ((1, 0), (5, 0), (3, 1000)):
            listed = costs.iteration_s(0, 0.0, [(num_tokens, start)] * count)
            assert costs.uniform_prefill_s(count, num_tokens, start) == pytest.approx(listed, rel=1e-12)


def test_a_huge_max_num_seqs_with_speculation_is_prepared_at_once(tmp_path):
    """The draft-cost table runs to the largest batch that can run: max_num_seqs, but never more
    sequences than the pool holds tokens (a table to 2**63 never ended)."""
    config = load_experiment(
        Path("configs/speculative-eagle3.yaml"),
        ["engine.max_num_seqs=9223372036854775807", "workload.num_requests=5"],
    )
    prepared = prepare_experiment(config, Path("configs/speculative-eagle3.yaml"))
    assert len(prepared.variants) == len(config.variants)


def test_drafts_that_cannot_fit_a_sequence_are_refused_before_anything_is_built():
    """k drafts and the step's own token sit in one sequence: k >= max_model_len is refused, naming
    the key (at 2**63 the acceptance model, one rate per draft, never finished building)."""
    config = load_experiment(
        Path("configs/speculative-eagle3.yaml"),
        ["variants.1.engine.speculative.num_speculative_tokens=9223372036854775808"],
    )
    with pytest.raises(ConfigError, match=r"num_speculative_tokens: 9223372036854775808 drafts per step"):
        prepare_experiment(config, Path("configs/speculative-eagle3.yaml"))
