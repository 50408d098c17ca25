"""Synthetic workloads: arrivals, lengths, prefixes, conversations, closed loops, determinism, streaming."""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from token_content import content_length
from workloads import Request, Workload, WorkloadError, build_workload
from workloads.content import common_prefix_len
from workloads.distributions import zipf_probabilities

SHAREGPT = "traces/etalon/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"


def make(seed: int = 0, **fields: Any) -> Workload:
    config: dict[str, Any] = {
        "num_requests": 1000,
        "arrival": {"kind": "poisson", "rate_per_s": 10},
        "prompt_len": 100,
        "output_len": 20,
    }
    config.update(fields)
    return build_workload(config, seed=seed)


def first(workload: Workload, count: int) -> list[Request]:
    return list(itertools.islice(workload.requests(), count))


def drive(workload: Workload, service_s: Callable[[Request], float]) -> list[Request]:
    """A toy engine: every request finishes ``service_s(request)`` after it arrives, then the
    workload's follow_up is asked for the next one. Returns every request, in arrival order."""
    heap: list[tuple[float, int, Request]] = []
    seen: list[Request] = []
    pending = iter(workload.requests())
    upcoming = next(pending, None)
    while upcoming is not None or heap:
        if upcoming is not None and (not heap or upcoming.arrival_s <= heap[0][0]):
            request, upcoming = upcoming, next(pending, None)
            seen.append(request)
            finish = request.arrival_s + service_s(request)
            heapq.heappush(heap, (finish, request.request_id, request))
            continue
        finish, _, request = heapq.heappop(heap)
        follow = workload.follow_up(request, finish)
        if follow is not None:
            assert follow.arrival_s >= finish
            seen.append(follow)
            heapq.heappush(heap, (follow.arrival_s + service_s(follow), follow.request_id, follow))
    return seen


def gaps_of(requests: list[Request]) -> np.ndarray:
    return np.diff([request.arrival_s for request in requests])


# --------------------------------------------------------------------------------------------------
# Streaming and determinism
# --------------------------------------------------------------------------------------------------


def test_requests_stream_lazily() -> None:
    workload = make(num_requests=10**12)
    stream = workload.requests()
    assert isinstance(stream, Iterator)  # (a generator; compiled, a generator of the build's own type)
    head = list(itertools.islice(stream, 5))  # a list of 10**12 requests would never return
    assert [request.request_id for request in head] == [0, 1, 2, 3, 4]


def test_same_seed_same_stream_and_replays_restart() -> None:
    fields = {
        "prompt_len": {"kind": "lognormal", "mean": 300, "sigma": 1, "max": 4000},
        "output_len": {"kind": "table", "path": SHAREGPT, "column": "num_decode_tokens"},
        "shared_prefix": {"num_prefixes": 5, "prefix_len": {"kind": "uniform", "low": 10, "high": 500}},
        "n": {"kind": "choice", "values": [1, 2]},
    }
    one, two = make(7, **fields), make(7, **fields)
    assert first(one, 500) == first(two, 500)
    assert first(one, 500) == first(one, 500)  # a second replay is identical
    assert first(make(8, **fields), 500) != first(one, 500)


def test_sorted_unique_ids_and_unique_streams() -> None:
    workload = make(
        num_requests=3000,
        shared_prefix={"num_prefixes": 4, "prefix_len": 64},
        few_shot={"num_templates": 3, "num_shots": 2, "shot_len": 16, "instruction_len": 8},
    )
    requests = list(workload.requests())
    assert len(requests) == 3000
    assert all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(requests))
    assert len({request.request_id for request in requests}) == 3000
    own_streams = [request.prompt[-1][0] for request in requests] + [
        request.output_content_id for request in requests
    ]
    assert len(set(own_streams)) == 6000
    shared = {content_id for request in requests for content_id, _ in request.prompt[:-1]}
    assert not shared & set(own_streams)
    assert len({request.prompt[0] for request in requests}) == 4  # the system prompts
    assert len({request.prompt[1] for request in requests}) == 1  # the common instruction
    assert len(shared) <= 4 + 1 + 6  # prefixes, instruction, pool of 3 templates x 2 shots


# --------------------------------------------------------------------------------------------------
# Arrivals
# --------------------------------------------------------------------------------------------------


def test_poisson_rate_and_cv() -> None:
    requests = list(make(num_requests=20000, arrival={"kind": "poisson", "rate_per_s": 8}).requests())
    gaps = gaps_of(requests)
    assert requests[0].arrival_s == 0.0
    assert 1 / gaps.mean() == pytest.approx(8, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize(
    ("burst", "cv"), [({"cv": 3.0}, 3.0), ({"cv": 0.5}, 0.5), ({"burstiness": 0.25}, 2.0)]
)
def test_gamma_rate_and_cv(burst: dict, cv: float) -> None:
    arrival = {"kind": "gamma", "rate_per_s": 4, **burst}
    gaps = gaps_of(list(make(1, num_requests=40000, arrival=arrival).requests()))
    assert 1 / gaps.mean() == pytest.approx(4, rel=0.1)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.15)


def test_constant_rate_and_batch() -> None:
    requests = list(make(num_requests=101, arrival={"kind": "constant", "rate_per_s": 4}).requests())
    assert [request.arrival_s for request in requests] == [index / 4 for index in range(101)]
    batch = list(make(num_requests=50, arrival={"kind": "batch", "at_s": 2.5}).requests())
    assert len(batch) == 50 and {request.arrival_s for request in batch} == {2.5}


def test_duration_ends_the_stream() -> None:
    requests = list(
        make(num_requests=None, duration_s=100, arrival={"kind": "poisson", "rate_per_s": 5}).requests()
    )
    assert requests[-1].arrival_s <= 100
    assert len(requests) == pytest.approx(500, rel=0.15)


# --------------------------------------------------------------------------------------------------
# Lengths, n, beam width
# --------------------------------------------------------------------------------------------------


def test_length_distributions() -> None:
    def lens(spec: Any, count: int = 20000) -> np.ndarray:
        return np.array([r.prompt_len for r in make(3, num_requests=count, prompt_len=spec).requests()])

    assert set(lens(77, 10)) == {77}
    uniform = lens({"kind": "uniform", "low": 10, "high": 13})
    assert set(uniform) == {10, 11, 12, 13}
    normal = lens({"kind": "normal", "mean": 100, "std": 50, "min": 60, "max": 150})
    assert normal.min() == 60 and normal.max() == 150
    assert (normal == 60).mean() == pytest.approx(0.21, abs=0.02)  # P(N < 60) = 0.212
    lognormal = lens({"kind": "lognormal", "mean": 500, "sigma": 0.8})
    assert lognormal.mean() == pytest.approx(500, rel=0.03)
    assert np.median(lens({"kind": "lognormal", "median": 300, "sigma": 0.5})) == pytest.approx(300, rel=0.03)
    exponential = lens({"kind": "exponential", "mean": 40})
    assert exponential.mean() == pytest.approx(40, rel=0.03) and exponential.min() >= 1
    choice = Counter(lens({"kind": "choice", "values": [5, 9], "weights": [3, 1]}))
    assert choice[5] / 20000 == pytest.approx(0.75, abs=0.02)


def test_lengths_sampled_from_a_table_column() -> None:
    import pandas as pd

    table = pd.read_csv(SHAREGPT)["num_decode_tokens"]
    outputs = np.array(
        [
            request.output_len
            for request in make(
                4,
                num_requests=20000,
                output_len={"kind": "table", "path": SHAREGPT, "column": "num_decode_tokens"},
            ).requests()
        ]
    )
    assert set(outputs) <= set(table)
    assert outputs.mean() == pytest.approx(table.mean(), rel=0.02)


def test_n_and_beam_width() -> None:
    requests = list(
        make(
            num_requests=4000, n={"kind": "choice", "values": [1, 4], "weights": [1, 1]}, beam_width=3
        ).requests()
    )
    assert {request.beam_width for request in requests} == {3}
    assert Counter(request.n for request in requests)[4] / 4000 == pytest.approx(0.5, abs=0.03)
    with pytest.raises(WorkloadError, match="n: 1.5 is not an integer"):
        make(n={"kind": "choice", "values": [1, 1.5]})


# --------------------------------------------------------------------------------------------------
# Shared prefixes and templates
# --------------------------------------------------------------------------------------------------


def test_zipf_popularity_of_system_prompts() -> None:
    workload = make(num_requests=30000, shared_prefix={"num_prefixes": 8, "prefix_len": 512, "zipf_s": 1.1})
    requests = list(workload.requests())
    prefixes = [request.prompt[0] for request in requests]
    assert {length for _, length in prefixes} == {512}
    counts = Counter(content_id for content_id, _ in prefixes)
    ranked = [content_id for content_id, _ in counts.most_common()]
    # prefix i was created i-th, so popularity order = creation order = id order
    assert ranked == sorted(ranked)
    expected = zipf_probabilities(8, 1.1)
    observed = np.array([counts[content_id] for content_id in sorted(counts)]) / len(requests)
    np.testing.assert_allclose(observed, expected, atol=0.01)
    assert all(request.prompt_len == 512 + 100 for request in requests)


def test_prefix_fraction_and_uniform_popularity() -> None:
    requests = list(
        make(
            num_requests=20000,
            shared_prefix={"num_prefixes": 4, "prefix_len": 32, "zipf_s": 0, "fraction": 0.3},
        ).requests()
    )
    with_prefix = [request for request in requests if len(request.prompt) == 2]
    assert len(with_prefix) / 20000 == pytest.approx(0.3, abs=0.02)
    shares = np.array(list(Counter(request.prompt[0][0] for request in with_prefix).values())) / len(
        with_prefix
    )
    np.testing.assert_allclose(shares, 0.25, atol=0.02)


def test_few_shot_templates() -> None:
    workload = make(
        num_requests=2000,
        shared_prefix={"num_prefixes": 1, "prefix_len": 40},
        few_shot={
            "num_templates": 5,
            "instruction_len": 30,
            "num_shots": 3,
            "shot_len": {"kind": "uniform", "low": 20, "high": 90},
            "example_pool_size": 6,
        },
    )
    requests = list(workload.requests())
    templates = {request.prompt[1:-1] for request in requests}
    assert len(templates) == 5
    instruction = {template[0] for template in templates}
    assert len(instruction) == 1 and next(iter(instruction))[1] == 30
    examples = {segment for template in templates for segment in template[1:]}
    assert len(examples) <= 6
    assert all(
        len(template) == 4 and all(20 <= length <= 90 for _, length in template[1:]) for template in templates
    )
    # two requests of the same template share system prompt + template, and nothing after it
    a, b = [request for request in requests if request.prompt[1:-1] == requests[0].prompt[1:-1]][:2]
    assert common_prefix_len(a.prompt, b.prompt) == 40 + content_length(a.prompt[1:-1])


# --------------------------------------------------------------------------------------------------
# Conversations and closed loops
# --------------------------------------------------------------------------------------------------


def test_multi_turn_prompt_extends_the_previous_context() -> None:
    workload = make(
        num_requests=60,
        shared_prefix={"num_prefixes": 2, "prefix_len": 50},
        multi_turn={"turns": 4, "user_turn_len": 25, "think_time_s": 2.0},
        output_len={"kind": "uniform", "low": 5, "high": 40},
    )
    starts = list(workload.requests())
    assert len(starts) == 15  # 60 requests in conversations of 4
    turn1 = starts[0]
    turn2 = workload.follow_up(turn1, finish_s=turn1.arrival_s + 1.0)
    assert turn2 is not None
    assert turn2.prompt == (
        *turn1.prompt,
        (turn1.output_content_id, turn1.output_len),
        (turn2.prompt[-1][0], 25),
    )
    assert turn2.prompt_len == turn1.prompt_len + turn1.output_len + 25
    assert turn2.arrival_s == turn1.arrival_s + 1.0 + 2.0
    assert turn2.session_id == turn1.session_id and turn2.request_id == turn1.request_id + 1
    assert turn2.prompt[-1][0] not in {segment[0] for segment in turn1.prompt} | {turn1.output_content_id}
    assert turn2.output_content_id != turn1.output_content_id
    with pytest.raises(WorkloadError, match="not the latest turn"):
        workload.follow_up(turn1, 99.0)  # asked twice for the same turn
    turn3 = workload.follow_up(turn2, finish_s=turn2.arrival_s + 1.0)
    assert turn3 is not None and turn3.prompt[: len(turn2.prompt)] == turn2.prompt
    assert common_prefix_len(turn3.prompt, turn2.prompt) == turn2.prompt_len
    turn4 = workload.follow_up(turn3, finish_s=turn3.arrival_s + 1.0)
    assert turn4 is not None and workload.follow_up(turn4, turn4.arrival_s + 1.0) is None


def test_multi_turn_total_and_context_limit() -> None:
    config = {
        "num_requests": 500,
        "multi_turn": {"turns": {"kind": "uniform", "low": 1, "high": 8}, "user_turn_len": 30},
        "output_len": 50,
    }
    requests = drive(make(5, **config), lambda request: 3.0)
    assert len(requests) == 500
    assert sorted(request.request_id for request in requests) == list(range(500))
    assert drive(make(5, **config), lambda request: 3.0) == requests
    limited = make(5, **{**config, "multi_turn": {**config["multi_turn"], "max_context_len": 400}})
    capped = drive(limited, lambda request: 3.0)
    assert max(request.final_len for request in capped) <= 400
    assert limited.describe()["counts"]["conversations_cut_at_max_context"] > 0


def test_closed_loop_follow_up_timing() -> None:
    workload = make(
        num_requests=30,
        arrival={"kind": "closed_loop", "num_users": 3, "think_time_s": 2.0, "ramp_up_s": 3.0},
    )
    starts = list(workload.requests())
    assert [(r.request_id, r.arrival_s, r.session_id) for r in starts] == [
        (0, 0.0, 0),
        (1, 1.0, 1),
        (2, 2.0, 2),
    ]
    nxt = workload.follow_up(starts[1], finish_s=10.0)
    assert nxt is not None and nxt.arrival_s == 12.0 and nxt.request_id == 4 and nxt.session_id == 1
    requests = drive(
        make(num_requests=30, arrival={"kind": "closed_loop", "num_users": 3, "think_time_s": 2.0}),
        lambda r: 5.0,
    )
    assert len(requests) == 30
    by_user: dict[int, list[Request]] = {}
    for request in requests:
        by_user.setdefault(request.request_id % 3, []).append(request)
    for user_requests in by_user.values():
        arrivals = [request.arrival_s for request in user_requests]
        assert arrivals == [7.0 * index for index in range(10)]  # 5 s service + 2 s think


def test_closed_loop_does_not_depend_on_finish_order() -> None:
    config = {
        "num_requests": 200,
        "arrival": {
            "kind": "closed_loop",
            "num_users": 8,
            "think_time_s": {"kind": "exponential", "mean": 1},
        },
        "prompt_len": {"kind": "uniform", "low": 10, "high": 100},
        "output_len": {"kind": "uniform", "low": 1, "high": 100},
        "shared_prefix": {"num_prefixes": 3, "prefix_len": 20},
        "multi_turn": {
            "turns": {"kind": "uniform", "low": 1, "high": 4},
            "user_turn_len": {"kind": "uniform", "low": 5, "high": 9},
        },
    }

    def content(requests: list[Request]) -> dict[int, tuple]:
        return {r.request_id: (r.prompt, r.output_len, r.output_content_id, r.session_id) for r in requests}

    fast = drive(make(9, **config), lambda request: 0.5)
    slow_odd = drive(make(9, **config), lambda request: 5.0 if request.request_id % 2 else 0.1)
    assert len(fast) == len(slow_odd) == 200
    assert content(fast) == content(slow_odd)
    continued = [r for r in fast if len(r.prompt) > 2]
    assert continued  # some conversations went on


def test_closed_loop_rejects_stale_follow_ups() -> None:
    workload = make(num_requests=10, arrival={"kind": "closed_loop", "num_users": 2})
    first_two = list(workload.requests())
    workload.follow_up(first_two[0], 1.0)
    with pytest.raises(WorkloadError, match="latest request"):
        workload.follow_up(first_two[0], 2.0)


def test_describe_is_small_and_json_able() -> None:
    import json

    workload = make(num_requests=100, shared_prefix={"num_prefixes": 2, "prefix_len": 8})
    list(workload.requests())
    info = workload.describe()
    assert info["kind"] == "synthetic" and info["counts"]["requests"] == 100 and info["rate_per_s"] == 10
    assert len(json.dumps(info)) < 2000


def test_length_pairs_keep_rows_together() -> None:
    import pandas as pd

    table = pd.read_csv(SHAREGPT)
    pairs = set(zip(table.num_prefill_tokens, table.num_decode_tokens, strict=True))
    workload = build_workload(
        {
            "num_requests": 3000,
            "arrival": {"kind": "poisson", "rate_per_s": 5},
            "length_pairs": {"path": SHAREGPT},
        },
        seed=2,
    )
    drawn = [(request.prompt_len, request.output_len) for request in workload.requests()]
    assert set(drawn) <= pairs and len(set(drawn)) > 2500
    assert workload.describe()["num_requests"] == 3000
    with pytest.raises(ValueError, match="give one or the other"):
        build_workload(
            {
                "num_requests": 3,
                "arrival": {"kind": "batch"},
                "prompt_len": 3,
                "length_pairs": {"path": SHAREGPT},
            },
            seed=0,
        )


def test_parallel_samples_draw_independent_lengths() -> None:
    """n = 4: sample 0 keeps the request's drawn length, the other three are fresh draws from the
    same output distribution (exponential, mean 100 tokens: so is their mean); `identical` gives
    every sample the request's length, and n = 1 streams are the same in both modes."""
    spec = {"kind": "exponential", "mean": 100}
    independent = list(make(4, num_requests=3000, n=4, output_len=spec).requests())
    identical = list(make(4, num_requests=3000, n=4, output_len=spec, sample_lengths="identical").requests())
    assert [r.output_len for r in independent] == [r.output_len for r in identical]
    assert all(r.sample_output_lens == () and r.output_lens == (r.output_len,) * 4 for r in identical)
    assert all(
        r.sample_output_lens[0] == r.output_len and len(r.sample_output_lens) == 4 for r in independent
    )
    others = np.array([r.sample_output_lens[1:] for r in independent], dtype=float)
    assert others.mean() == pytest.approx(100, rel=0.03)
    # Independent of sample 0: the correlation of sample 1 with sample 0 is ~0 (3000 pairs: sd 0.018).
    firsts = np.array([r.output_len for r in independent], dtype=float)
    assert abs(np.corrcoef(firsts, others[:, 0])[0, 1]) < 0.06
    assert all(r.final_len == r.prompt_len + max(r.sample_output_lens) for r in independent)
    # The same seed gives each request the same samples (they do not depend on the order of draws).
    again = list(make(4, num_requests=3000, n=4, output_len=spec).requests())
    assert [r.sample_output_lens for r in again] == [r.sample_output_lens for r in independent]
    single = list(make(4, num_requests=50, output_len=spec).requests())
    assert single == list(make(4, num_requests=50, output_len=spec, sample_lengths="identical").requests())


def test_beams_all_run_to_the_request_length() -> None:
    requests = list(make(2, num_requests=20, n=1, beam_width=4).requests())
    assert all(r.sample_output_lens == () and r.output_lens == (r.output_len,) * 4 for r in requests)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {
                "shared_prefix": {
                    "num_prefixes": 2,
                    "prefix_len": {"kind": "uniform", "low": 16, "high": 1e30},
                }
            },
            r"shared_prefix.prefix_len: 1e\+30 is too large for a count \(at most 2\*\*53\)",
        ),
        (
            {"prompt_len": {"kind": "lognormal", "median": 1e30, "sigma": 0.5}},
            r"prompt_len: median 1e\+30 is too large for a count",
        ),
        ({"output_len": {"kind": "constant", "value": 1e19}}, r"output_len: 1e\+19 is too large for a count"),
    ],
)
def test_a_count_past_what_a_64_bit_draw_holds_is_refused_up_front(fields, message):
    """Found by tests/fuzz_bad_input.py: a uniform bound of 1e30 tokens raised numpy's own error
    (``high is out of bounds for int64``), and a lognormal median of 1e30 drew lengths that wrapped
    negative in the cast to integers and failed inside the run. Counts are refused past 2**53."""
    with pytest.raises(WorkloadError, match=message):
        make(**fields)


def test_a_wide_lognormals_tail_stays_a_count():
    """A lognormal whose median is sane but whose tail runs past any count (sigma 80): its draws are
    capped at 2**53 tokens, never cast into negative lengths; the engine rejects them as longer than
    max_model_len."""
    lengths = [
        request.prompt_len
        for request in first(make(prompt_len={"kind": "lognormal", "median": 100, "sigma": 80}), 200)
    ]
    assert min(lengths) >= 1 and max(lengths) == 2**53
