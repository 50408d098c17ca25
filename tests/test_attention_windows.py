"""A decode step over sliding-window layers reads a window of each sequence, not all of it: the
attended context by hand, skip == single across window crossings, the windows of the presets."""

from __future__ import annotations

import random

import pytest

from policies import PoolSpec, make_policy
from sim.costs.core import attention_windows
from sim.engine.core import Engine, EngineKnobs
from sim.engine.jumps import JumpCounts
from sim.engine.windows import NEVER, AttendedWindows
from sim.hardware.models import resolve_model
from tests.engine_helpers import RoundCostModel, request
from tests.test_engine import times


def _costs(windows):
    costs = RoundCostModel(per_context_token_s=0.01)
    costs.attention_windows = windows
    return costs


def _run(step_mode, windows, requests, blocks=64, **knobs):
    pool = PoolSpec(blocks * 4, 4, 200)
    engine = Engine(
        make_policy("paged", pool),
        _costs(windows),
        EngineKnobs(max_model_len=200, step_mode=step_mode, **knobs),
        iter(requests),
        block_size=4,
    )
    engine.run()
    return engine


def _assert_same_times(skip, single):
    """Event skipping gives every request single stepping's outcome and times."""
    assert skip.counters.iterations == single.counters.iterations
    for request_id, row in times(single).items():
        assert times(skip)[request_id][3] == row[3]
        assert times(skip)[request_id][:3] == pytest.approx(row[:3], rel=1e-9)


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_step_times_by_hand(step_mode):
    """Decode step 1 s + 0.01 s per attended token; half the layers see the last 4 tokens. Prompt 2,
    output 6: the prefill iteration takes 1 + 2 x 0.01 = 1.02 s; the 5 decode steps hold 4..8
    tokens, attending 0.5 x n + 0.5 x min(n, 4) = 4, 4.5, 5, 5.5, 6 tokens: 1.04 + 1.045 + 1.05 +
    1.055 + 1.06 s. Without the window: 4..8 tokens, 1.04 .. 1.08 s."""
    windowed = _run(step_mode, ((4, 0.5),), [request(0, 0.0, 2, 6)])
    assert times(windowed)[0][2] == pytest.approx(1.02 + 1.04 + 1.045 + 1.05 + 1.055 + 1.06)
    full = _run(step_mode, (), [request(0, 0.0, 2, 6)])
    assert times(full)[0][2] == pytest.approx(1.02 + 1.04 + 1.05 + 1.06 + 1.07 + 1.08)


def _stream(count, seed=5):
    rng = random.Random(seed)
    arrival = 0.0
    out = []
    for index in range(count):
        arrival += rng.expovariate(0.7)
        out.append(request(index, arrival, rng.randint(2, 40), rng.randint(1, 40)))
    return out


def test_skip_equals_single_across_crossings_and_preemptions():
    windows = ((8, 0.25), (24, 0.5))
    skip = _run("skip", windows, _stream(40), blocks=40)
    single = _run("single", windows, _stream(40), blocks=40)
    assert skip.counters.preemptions == single.counters.preemptions > 0
    _assert_same_times(skip, single)
    # a crossing is one more event per request, window and admission at most
    full = _run("skip", (), _stream(40), blocks=40)
    admissions = 40 + skip.counters.preemptions
    assert skip.wakeups <= full.wakeups + len(windows) * admissions


def test_skip_equals_single_with_chunked_prompts_beside_windowed_decodes():
    """Prompts chunked 10 tokens at a time (less 1 per decoding request) while others decode over
    sliding windows: skipping runs jumps that prefill chunks, inside which the attended context grows
    by the windows' rate per token (a sequence past its window adds only the full layers' share), not
    by one per sequence; at 0.01 s per attended token a wrong rate changes the chunked iterations'
    times. Single stepping, which plans no jump, is the reference."""
    windows = ((4, 0.5),)
    requests = [
        request(index, arrival, prompt, output)
        for index, (arrival, prompt, output) in enumerate(
            [(0.0, 3, 40), (0.1, 2, 35), (0.2, 4, 30), (2.5, 60, 5), (9.0, 45, 3), (20.0, 70, 4)]
        )
    ]

    skip, single = (
        _run(mode, windows, requests, blocks=256, max_num_batched_tokens=10) for mode in ("skip", "single")
    )
    assert skip.jumps.prefill > 0  # the path under test ran
    _assert_same_times(skip, single)


def test_skip_equals_single_with_windows_and_speculative_decoding():
    """Sliding windows and speculative decoding together: inside a decode jump each iteration's
    attended context grows by the windows' rate times the tokens that iteration's step accepted (the
    token schedule). Single stepping, which plans no jump, is the reference."""
    from sim.engine.speculation import AcceptanceModel, SpeculativeDecoding

    speculative = SpeculativeDecoding("eagle", 2, AcceptanceModel.from_rates([0.7, 0.4]), 4)
    windows = ((6, 0.5),)

    skip, single = (
        _run(mode, windows, _stream(12, seed=9), blocks=256, speculative=speculative)
        for mode in ("skip", "single")
    )
    assert skip.jumps.decode > 0  # the path under test ran
    _assert_same_times(skip, single)


@pytest.mark.parametrize("step_mode", ["single", "skip"])
def test_a_decode_jump_reaches_an_arrival_at_the_attended_context_s_rate(step_mode):
    """Where a decode jump ends before an arrival is found at the attended context's rate: past its
    window (half the layers see the last 4 tokens) a sequence attends 0.5 n + 2 of its n tokens, so
    each iteration costs 0.025 s more than the one before at 0.05 s per attended token, not 0.05.
    r0: prompt 10, output 40; r1: prompt 2, output 1, arrives at 16.5. Decode step j of r0 holds
    11 + j tokens: 1 + 0.05 x (0.5 (11 + j) + 2) = 1.375 + 0.025 j s.

    it 1 [0, 1.1):         r0 prefills 10 (1 + 0.1 s)                           wake-up 1
    it 2 [1.1, 2.5):       step 1 (1.4 s); after it the arrival is 14.0 s away: wake-up 2: a decode
                           steps 2..10 take 1.4 x 9 + 0.025 x 45 = 13.725 s < 14,   jump over it 3-12
                           step 11 ends at 2.5 + 15.375 = 17.875: r1 arrives in it 12
    it 13 [17.875, 19.57): step 12 (1.675 s) + r1 prefills 2 (0.02 s)           wake-up 3
    it 14-40:              steps 13-39; r0 ends at 1.1 + 1.375 x 39 + 0.025 x 780  wake-up 4: a jump
                           + 0.02 = 74.245                                       over it 15-40
    Both jumps take blocks of 4 inside them."""
    costs = RoundCostModel(per_context_token_s=0.05)
    costs.attention_windows = ((4, 0.5),)
    engine = Engine(
        make_policy("paged", PoolSpec(256 * 4, 4, 200)),
        costs,
        EngineKnobs(max_model_len=200, step_mode=step_mode),
        iter([request(0, 0.0, 10, 40), request(1, 16.5, 2, 1)]),
        block_size=4,
    )
    engine.run()
    got = times(engine)
    assert got[0] == (0.0, pytest.approx(1.1), pytest.approx(74.245), "finished")
    assert got[1] == (pytest.approx(17.875), pytest.approx(19.57), pytest.approx(19.57), "finished")
    assert engine.counters.iterations == 40
    if step_mode == "skip":
        assert engine.jumps == JumpCounts(single=2, decode=2, with_growth=2)
        assert (engine.jumps.single, engine.wakeups) == (2, 4)


def test_windows_of_the_presets():
    # gpt-oss: 18 sliding-window layers of 128 tokens among 36; Gemma 3 27B: 52 of 62 at 1,024;
    # Llama 4 Scout: chunked local (8,192) in 3 layers of 4, counted as a window; Mistral-7B-v0.1: all.
    assert attention_windows(resolve_model("gpt-oss-20b")) == ((128, 0.5),)
    assert attention_windows(resolve_model("Gemma-3-27B")) == ((1024, 52 / 62),)
    assert attention_windows(resolve_model("Llama-4-Scout-17B-16E")) == ((8192, 0.75),)
    assert attention_windows(resolve_model("Mistral-7B-v0.1")) == ((4096, 1.0),)
    assert attention_windows(resolve_model("Llama-3.1-8B")) == ()


def test_prefill_pairs_and_reads_past_the_window_by_hand():
    from sim.costs.terms import attended_context, attended_pairs, attention_pairs, pairs_past_window

    # queries at positions 2..5 would see 3, 4, 5, 6 keys; a 3-token window: 3, 3, 3, 3 -> 6 left out
    assert pairs_past_window(4, 2, 3) == 6
    assert pairs_past_window(4, 2, 6) == 0  # the last query sees exactly the window
    assert pairs_past_window(4, 0, 2) == (1 + 2) * 2 / 2  # positions 2, 3 see 3, 4 keys: 1 + 2 left out
    # half the layers windowed: the other half sees every pair (the usual n x (start + n/2) count)
    assert attended_pairs(4, 2, ((3, 0.5),)) == attention_pairs(4, 2) - 0.5 * 6
    assert attended_context(10, ((4, 0.5),)) == 10 - 0.5 * 6
    assert attended_context(3, ((4, 0.5),)) == 3


def test_a_windowed_model_prefills_faster_in_every_cost_model():
    from sim.costs.factory import make_cost_model
    from sim.hardware.gpus import resolve_gpu

    model = resolve_model("gpt-oss-20b")
    for kind in ("analytic", "derated"):
        costs = make_cost_model(kind, model, resolve_gpu("H100-80GB"), block_size=16)
        # a chunk of 512 tokens after 8,000: the sliding half of the layers sees 128 keys per query
        windowed = costs.iteration_s(0, 0, [(512, 8000)])
        costs.attention_windows = ()
        if costs.linear_iteration is not None:
            from dataclasses import replace

            linear = costs.linear_iteration
            costs._linear = replace(linear, prefill=replace(linear.prefill, windows=()))
        assert windowed < costs.iteration_s(0, 0, [(512, 8000)])


class _Decoding:
    """A decoding request as the windows read it (``sim.engine.decoding.RequestState``'s fields)."""

    def __init__(self, admission, width, context):
        self.seq_ids = list(range(width))
        self.admission = admission
        self.context = context
        self.synced_clock = 0
        self.end_version = 0
        self.decoding = False
        self.windows_held = 0


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("sizes, shares", [((4, 9), (0.25, 0.5)), ((9, 4), (0.5, 0.25))])
def test_attended_context_equals_a_count_over_every_sequence(seed, sizes, shares):
    """Two windows (4 tokens in a quarter of the layers, 9 in half), requests of 1 to 3 sequences
    entering at clocks past 0, leaving and coming back with another context (a preemption),
    checked at every clock against a count over the sequences themselves: each attends over
    1/4 x tokens + 1/4 x min(tokens, 4) + 1/2 x min(tokens, 9). A sequence that enters with at least
    W tokens counts W at once; one that enters below counts its tokens up to W, and the clock at
    which it would hold W + 1 is the next crossing (a jump ends there, not earlier). The windows in
    either order (a sequence may hold the second and not yet the first)."""
    windows = AttendedWindows(tuple(zip(sizes, shares, strict=True)))
    rng = random.Random(seed)
    requests = [_Decoding(admission, rng.randint(1, 3), 0) for admission in range(12)]
    held_at_entry = {}

    def tokens(state, now):
        return state.context + now - state.synced_clock

    for now in range(1, 40):
        windows.cross(now)
        for state in requests:
            if state.decoding and rng.random() < 0.15:  # leaves, its tokens told to the policy first
                state.context, state.synced_clock = tokens(state, now), now
                windows.remove(state)
                state.decoding = False
                state.end_version += 1
            elif not state.decoding and rng.random() < 0.3:  # enters (again), from 0 to 12 tokens
                state.context, state.synced_clock = rng.randint(0, 12), now
                state.decoding = True
                state.end_version += 1
                windows.add(state, now)
                held_at_entry[state.admission] = [state.context >= size for size in sizes]
        live = [state for state in requests if state.decoding]
        offset_sum = sum(len(s.seq_ids) * (s.context - s.synced_clock) for s in live)
        sequences = sum(len(s.seq_ids) for s in live)
        expected = sum(
            len(s.seq_ids)
            * (
                0.25 * tokens(s, now)
                + sum(share * min(tokens(s, now), size) for size, share in zip(sizes, shares, strict=True))
            )
            for s in live
        )
        assert windows.attended(offset_sum, sequences, now) == pytest.approx(expected, rel=1e-12)
        below = [
            (s, size, share)
            for s in live
            for size, share, held in zip(sizes, shares, held_at_entry[s.admission], strict=True)
            if not held and tokens(s, now) <= size
        ]
        growth = 0.25 * sequences + sum(len(s.seq_ids) * share for s, _, share in below)
        assert windows.growth(sequences) == pytest.approx(growth, rel=1e-12)
        crossing = min((now + size + 1 - tokens(s, now) for s, size, _ in below), default=NEVER)
        assert windows.next_crossing() == crossing
