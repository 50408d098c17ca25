"""Closed-loop clients with their own per-request overhead (``arrival.send_delay_s``).

``vllm bench serve --max-concurrency N`` launches N requests at t=0 and each later one when a slot
frees; each reaches the engine only after the client's and the API server's own work. These tests pin
the arithmetic (hand-worked, exact), the seeding (a user's k-th request takes its k-th draw, whatever
order the engine finishes requests in) and what it does to the engine (users stop running in lockstep).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from sim.config import ConfigError, validate_experiment
from sim.runner import run_variant
from tests.test_workloads_synthetic import drive, make
from workloads import Request, WorkloadError, build_workload

JITTER = {"kind": "uniform", "low": 0.001, "high": 0.011}


def closed(users: int, **arrival: Any) -> dict[str, Any]:
    return {"kind": "closed_loop", "num_users": users, **arrival}


def by_user(requests: list[Request], users: int) -> dict[int, list[Request]]:
    out: dict[int, list[Request]] = {}
    for request in sorted(requests, key=lambda r: r.request_id):
        out.setdefault(request.request_id % users, []).append(request)
    return out


# --------------------------------------------------------------------------------------------------
# The workload alone
# --------------------------------------------------------------------------------------------------


def test_constant_overhead_hand_worked() -> None:
    # 2 users, ramp-up 2 s, think 0.5 s, overhead 0.25 s (all exact in binary):
    # user 0's first request reaches the engine at 0 + 0.25, user 1's at 2 * 1/2 + 0.25.
    workload = make(num_requests=6, arrival=closed(2, think_time_s=0.5, ramp_up_s=2.0, send_delay_s=0.25))
    first = list(workload.requests())
    assert [(r.request_id, r.arrival_s) for r in first] == [(0, 0.25), (1, 1.25)]
    # finished at 3 s: the next request is sent after 0.5 s of think time, seen 0.25 s later
    nxt = workload.follow_up(first[0], finish_s=3.0)
    assert nxt is not None and (nxt.request_id, nxt.arrival_s) == (2, 3.75)
    # A toy engine serving every request in 1 s: each user's cycle is 1 + 0.5 + 0.25 = 1.75 s.
    requests = drive(
        make(num_requests=6, arrival=closed(2, think_time_s=0.5, send_delay_s=0.25)), lambda r: 1.0
    )
    for user_requests in by_user(requests, 2).values():
        assert [r.arrival_s for r in user_requests] == [0.25, 2.0, 3.75]


def test_overhead_is_added_to_every_request_of_a_conversation() -> None:
    workload = make(
        num_requests=8,
        arrival=closed(2, think_time_s=2.0, send_delay_s=0.25),
        multi_turn={"turns": 2, "user_turn_len": 10, "think_time_s": 1.0},
    )
    first = list(workload.requests())
    assert [r.arrival_s for r in first] == [0.25, 0.25]
    turn2 = workload.follow_up(first[0], finish_s=4.0)
    assert turn2 is not None and turn2.arrival_s == 4.0 + 1.0 + 0.25  # the turn's think time, then overhead
    assert turn2.session_id == first[0].session_id
    new_conversation = workload.follow_up(turn2, finish_s=8.0)
    assert new_conversation is not None and new_conversation.arrival_s == 8.0 + 2.0 + 0.25  # the user's think
    assert new_conversation.session_id != first[0].session_id


def test_default_is_no_overhead_and_first_requests_arrive_together() -> None:
    first = list(make(num_requests=40, arrival=closed(4)).requests())
    assert [(r.request_id, r.arrival_s) for r in first] == [(0, 0.0), (1, 0.0), (2, 0.0), (3, 0.0)]


def test_seeded_overheads_spread_the_first_requests_in_arrival_order() -> None:
    config = {"num_requests": 160, "arrival": closed(16, send_delay_s=JITTER)}
    first = list(make(5, **config).requests())
    assert [r.arrival_s for r in first] == sorted(r.arrival_s for r in first)  # the stream's contract
    assert sorted(r.request_id for r in first) == list(range(16))  # ids still name the users
    assert [r.request_id for r in first] != list(range(16))  # ... but a later user may arrive first
    assert len({r.arrival_s for r in first}) == 16
    assert all(0.001 <= r.arrival_s <= 0.011 for r in first)
    assert [r.arrival_s for r in make(5, **config).requests()] == [r.arrival_s for r in first]  # seeded
    assert [r.arrival_s for r in make(6, **config).requests()] != [r.arrival_s for r in first]


def test_overheads_follow_the_user_not_the_finishing_order() -> None:
    # Request k of user u takes the k-th draw of u's stream, however the engine orders finishes.
    config = {
        "num_requests": 120,
        "arrival": closed(6, send_delay_s={"kind": "exponential", "mean": 0.004}),
        "prompt_len": {"kind": "uniform", "low": 10, "high": 100},
        "output_len": {"kind": "uniform", "low": 1, "high": 100},
    }

    def overheads(service_s) -> dict[int, float]:
        requests = drive(make(9, **config), service_s)
        assert len(requests) == 120
        finishes = {r.request_id: r.arrival_s + service_s(r) for r in requests}
        # overhead = arrival - the user's previous finish (no think time); first requests: arrival
        return {r.request_id: r.arrival_s - finishes.get(r.request_id - 6, 0.0) for r in requests}

    fast = overheads(lambda r: 0.5)
    skewed = overheads(lambda r: 5.0 if r.request_id % 2 else 0.1)
    assert fast.keys() == skewed.keys() == set(range(120))
    assert fast == pytest.approx(skewed, rel=0, abs=1e-12)
    assert len(set(fast.values())) == 120 and min(fast.values()) >= 0.0


def test_an_overhead_leaves_the_rest_of_the_stream_unchanged() -> None:
    def content(overhead: Any) -> dict[int, tuple]:
        config = {
            "num_requests": 60,
            "arrival": closed(4, send_delay_s=overhead),
            "prompt_len": {"kind": "uniform", "low": 10, "high": 100},
            "output_len": {"kind": "uniform", "low": 1, "high": 50},
            "shared_prefix": {"num_prefixes": 3, "prefix_len": 20},
        }
        requests = drive(make(2, **config), lambda r: 1.0)
        return {r.request_id: (r.prompt, r.output_len, r.output_content_id, r.session_id) for r in requests}

    assert content(JITTER) == content(0.0)


def test_duration_drops_only_the_users_whose_first_request_comes_too_late() -> None:
    workload = make(num_requests=8, duration_s=0.005, arrival=closed(8, send_delay_s=JITTER))
    first = list(workload.requests())
    assert first and len(first) < 8
    assert all(r.arrival_s <= 0.005 for r in first)


# --------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------


def test_a_negative_overhead_is_refused_naming_the_key() -> None:
    with pytest.raises(
        ValidationError, match=r"send_delay_s\n.*must be >= 0 \(a time in seconds\), not -0\.002"
    ):
        build_workload(
            {
                "num_requests": 4,
                "arrival": closed(2, send_delay_s=-0.002),
                "prompt_len": 8,
                "output_len": 2,
            },
            seed=0,
        )
    with pytest.raises(
        WorkloadError, match=r"arrival\.send_delay_s: -0\.5 is below the smallest allowed value 0"
    ):
        make(num_requests=4, arrival=closed(2, send_delay_s={"kind": "constant", "value": -0.5}))
    with pytest.raises(WorkloadError, match=r"arrival\.send_delay_s: -0\.001 is below"):
        make(
            num_requests=4,
            arrival=closed(2, send_delay_s={"kind": "uniform", "low": -0.001, "high": 0.01}),
        )
    with pytest.raises(ValidationError, match="send_delay_s"):
        make(num_requests=4, arrival=closed(2, send_delay_s="2ms"))


def test_an_experiment_with_a_negative_overhead_fails_validation() -> None:
    with pytest.raises(ConfigError, match=r"workload\.arrival\.send_delay_s: must be >= 0 .*not -1"):
        validate_experiment(_experiment(closed(2, send_delay_s=-1)))


# --------------------------------------------------------------------------------------------------
# Through the engine
# --------------------------------------------------------------------------------------------------


def _experiment(arrival: dict[str, Any], num_requests: int = 16) -> dict[str, Any]:
    return {
        "name": "overhead",
        "seed": 3,
        "model": "Llama-3.1-8B",
        "gpu": "H100-80GB",
        "engine": {"max_model_len": 1024},
        "workload": {"num_requests": num_requests, "arrival": arrival, "prompt_len": 512, "output_len": 8},
        "variants": [{"name": "v", "policy": "paged"}],
    }


def _requests(arrival: dict[str, Any]):
    config = validate_experiment(_experiment(arrival))
    return run_variant(config, config.variants[0], Path(".")).requests.sort_values("request_id")


def test_without_overhead_users_run_in_lockstep() -> None:
    requests = _requests(closed(4))
    assert set(requests.outcome) == {"finished"}
    # every round of 4 arrives together, is prefilled in one step and finishes in one step
    assert requests.ttft_s.round(9).nunique() == 1
    assert requests.groupby(requests.request_id // 4).finish_s.nunique().eq(1).all()


def test_jittered_overheads_break_the_lockstep() -> None:
    requests = _requests(closed(4, send_delay_s={"kind": "uniform", "low": 0.0, "high": 0.1}))
    assert set(requests.outcome) == {"finished"}
    assert requests.head(4).admitted_s.nunique() == 4  # the first requests reach the engine apart
    assert requests.first_token_s.nunique() > 8  # lockstep: 4 (one per round)


def test_the_engine_sees_each_follow_up_one_overhead_after_the_finish() -> None:
    requests = _requests(closed(4, send_delay_s=0.25)).set_index("request_id")
    assert (requests.loc[range(4), "arrival_s"] == 0.25).all()
    for request_id in range(4, 16):
        assert requests.at[request_id, "arrival_s"] == requests.at[request_id - 4, "finish_s"] + 0.25
