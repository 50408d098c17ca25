"""Disaggregated prefill and decode (sim/cluster/disaggregated.py, sim/cluster/link.py): hand-worked
transfers and link sharing, back-pressure into the prefill pool, the decider, an instantaneous link,
block conservation in both pools and on the link, both step modes, and bad input."""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import simpy
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.base import PoolSpec, make_policy
from sim.cli import main
from sim.cluster.disaggregated import Decider, DisaggregatedCluster, PoolShape
from sim.cluster.link import LinkSpec, TransferLink
from sim.cluster.routers import LeastRequests, SessionAffinity
from sim.config import ConfigError, DeciderConfig, validate_experiment
from sim.engine.core import Engine, EngineKnobs
from sim.outputs import columns
from sim.outputs.metrics import BREAKDOWN_COLUMNS
from sim.results import load_results
from sim.runner import prepare_experiment, run_experiment
from tests.engine_helpers import RoundCostModel, request

ROOT = Path(__file__).resolve().parents[1]
BLOCK = 16
KV_BYTES = 1000  # per token, per GPU: round transfer sizes


def build_cluster(
    requests,
    *,
    prefill_blocks=100,
    decode_blocks=100,
    link=None,
    decider=None,
    policy="paged",
    step_mode="skip",
    replicas=(1, 1),
    costs=None,
    tensor_parallel=(1, 1),
    follow_up=None,
    routers=None,
    on_delivered=None,
    max_num_batched_tokens=2048,
):
    """A cluster of ``replicas`` (prefill, decode) engines with round-number costs (decode step 1 s,
    prefill 0.01 s per token, no fixed cost for prefill alone)."""
    knobs = EngineKnobs(
        max_model_len=4096,
        max_num_seqs=16,
        max_num_batched_tokens=max_num_batched_tokens,
        step_mode=step_mode,
    )
    costs = costs or RoundCostModel(intercept_s=1.0, prefill_per_token_s=0.01)
    link = link or LinkSpec("custom", 32_000.0, 0.1, "fabric")

    roles = []

    def build(index, role, env, upstream, follow_up, transfer):
        roles.append(role)
        blocks = prefill_blocks if role == "prefill" else decode_blocks
        pool = PoolSpec(blocks * BLOCK, BLOCK, 4096, KV_BYTES)
        return Engine(
            make_policy(policy, pool),
            costs,
            knobs,
            (),
            block_size=BLOCK,
            env=env,
            upstream=upstream,
            follow_up=follow_up,
            transfer=transfer,
            prefill_only=role == "prefill",
        )

    cluster = DisaggregatedCluster(
        PoolShape(replicas[0], BLOCK, KV_BYTES, tensor_parallel[0]),
        PoolShape(replicas[1], BLOCK, KV_BYTES, tensor_parallel[1]),
        build,
        routers or (LeastRequests(), LeastRequests()),
        Decider(decider or DeciderConfig()),
        link,
        iter(requests),
        follow_up=follow_up,
        on_delivered=on_delivered,
    )
    cluster.built_roles = roles  # (what the builder was asked for, replica by replica)
    return cluster


def records(cluster):
    rows = [record for engine in cluster.replicas for record in engine.records]
    return {record.request_id: record for record in rows}


# ------------------------------------------------------------------------------------ hand-worked
def test_two_transfers_share_the_link_then_decode_by_hand():
    """Prompts of 16 and 48 tokens arrive at 0 and prefill together: 1 s fixed + 64 x 0.01 = 1.64 s.
    The decode replica allocates both at 1.64; their 1 and 3 blocks (16,000 and 48,000 bytes) wait
    the 0.1 s latency, then share 32,000 B/s: 16,000 B/s each, so the first ends at 1.74 + 1.0 = 2.74
    and the second, alone from then at 32,000 B/s with 32,000 bytes left, at 3.74. The first computes
    its last prompt token at 2.74 (1.01 s: first token at 3.75); the second, landed at 3.74, joins the
    next iteration (1 s decode + 0.01 s for its token): 3.75-4.76, its first token; 4.76-5.76 the
    first's third token (it finishes), 5.76-6.76 the second's."""
    cluster = build_cluster([request(0, 0.0, 16, 3), request(1, 0.0, 48, 3)])
    cluster.run()
    first, second = records(cluster)[0], records(cluster)[1]
    for record in (first, second):
        assert record.outcome == "finished"
        assert record.admitted_s == 0.0
        assert record.prefill_done_s == pytest.approx(1.64)
        assert record.transfer_start_s == pytest.approx(1.64)
        assert (record.prefill_replica, record.replica) == (0, 0)  # (the sink's stamp is the engine's)
    assert (first.transfer_bytes, second.transfer_bytes) == (16_000, 48_000)
    assert first.transfer_end_s == pytest.approx(2.74)
    assert second.transfer_end_s == pytest.approx(3.74)
    assert first.first_token_s == pytest.approx(3.75)
    assert first.finish_s == pytest.approx(5.76)
    assert second.first_token_s == pytest.approx(4.76)
    assert second.finish_s == pytest.approx(6.76)
    link = cluster.link
    assert (link.transfers, link.bytes_sent) == (2, 64_000)
    assert link.busy_s() == pytest.approx(2.0)  # bytes flowed from 1.74 to 3.74
    assert not cluster.flights
    # The cluster's transfer series (time, prompts waiting for decode blocks, transfers in flight,
    # bytes in flight): both allocated at once at 1.64 (no row with prompts waiting: same instant),
    # 32,000 of the second's bytes left when the first ends at 2.74, nothing after 3.74.
    assert cluster.rows == [
        (0.0, 0, 0, 0.0),
        (pytest.approx(1.64), 0, 2, 64_000),
        (2.74, 0, 1, 32_000),
        (3.74, 0, 0, 0),
    ]
    # Both pools end empty: every block came back (the prefill blocks at the transfers' ends).
    for engine in cluster.replicas:
        assert engine.policy.breakdown().used == 0
        assert not engine.held and not engine.receiving


@pytest.mark.parametrize(
    ("tensor_parallel", "transfer_s"),
    [((1, 1), 1.0), ((2, 1), 2.0), ((2, 2), 1.0), ((1, 2), 1.0)],
)
def test_pools_of_different_tp_send_the_whole_models_kv_over_the_lanes_they_share(
    tensor_parallel, transfer_s
):
    """A prompt of 20 tokens (two blocks, the second partly filled): prefill 1 s + 20 x 0.01 = 1.2 s.
    Each prefill rank holds 1/TP of the KV and sends its share: 2 blocks x 16 tokens x 1,000 bytes per
    token per GPU x prefill TP; the lanes are the smaller TP, each at 32,000 B/s, after 0.1 s of
    latency. TP 1 -> 1: 32,000 B in 1.0 s; 2 -> 1: 64,000 B over one lane, 2.0 s; 2 -> 2: 64,000 B
    over two, 1.0 s; 1 -> 2: 32,000 B over one lane (one prefill GPU sends), 1.0 s."""
    prefill_tp = tensor_parallel[0]
    cluster = build_cluster([request(0, 0.0, 20, 2)], tensor_parallel=tensor_parallel)
    cluster.run()
    record = records(cluster)[0]
    assert record.transfer_start_s == pytest.approx(1.2)
    assert record.transfer_bytes == 2 * BLOCK * KV_BYTES * prefill_tp
    assert record.transfer_end_s == pytest.approx(1.2 + 0.1 + transfer_s)


def test_an_instantaneous_link_leaves_only_the_recomputed_token():
    """Infinite bandwidth, no latency, the same costs on both sides: TTFT = the prefill (1 s + 32 x
    0.01) + the decode replica's iteration for the prompt's last token (1 s + 0.01); the transfer and
    the wait for it take no time."""
    link = LinkSpec("custom", math.inf, 0.0, "fabric")
    cluster = build_cluster([request(0, 0.5, 32, 2)], link=link)
    cluster.run()
    record = records(cluster)[0]
    assert record.admitted_s == 0.5
    assert record.prefill_done_s == pytest.approx(1.82)
    assert record.transfer_start_s == record.transfer_end_s == record.prefill_done_s
    assert record.first_token_s == pytest.approx(2.83)
    assert record.finish_s == pytest.approx(3.83)  # one decode step
    assert record.transfer_bytes == 2 * BLOCK * KV_BYTES


def test_a_full_decode_pool_pushes_back_on_the_prefill_pool():
    """An instantaneous link; the prefill pool has 7 blocks, the decode pool 4. Requests 0 (prompt 48,
    10 out) and 1 (prompt 32, 2 out) prefill together (1 + 0.8 s) in 3 + 2 blocks (the token a prefill
    replica samples takes no slot), and request 2 (arrived at 1.0; 3 blocks) does not fit. At 1.8
    the decode replica allocates request 0 (3 blocks); request 1's 2 do not fit beside them, so it
    waits there, its 3 blocks held in the prefill pool. Request 0's KV lands at once: its prefill
    blocks free and request 2 is admitted at 1.8 (done 1 + 0.48 s later). Request 0 computes its last
    prompt token (1.8-2.81) and decodes 9 steps, growing to 58 tokens (4 blocks: the decode pool is
    full) until 11.81. Only then is request 1 allocated (11.81: 10.01 s of back-pressure), runs
    11.81-12.82-13.82; request 2 (3 blocks) must wait for it: 13.82-14.83-15.83."""
    requests = [request(0, 0.0, 48, 10), request(1, 0.0, 32, 2), request(2, 1.0, 48, 2)]
    link = LinkSpec("c", math.inf, 0.0, "pair")
    cluster = build_cluster(requests, prefill_blocks=7, decode_blocks=4, link=link)
    cluster.run()
    rows = records(cluster)
    expected = {  # admitted, prefill done, transfer start (= end), first token, finish
        0: (0.0, 1.8, 1.8, 2.81, 11.81),
        1: (0.0, 1.8, 11.81, 12.82, 13.82),
        2: (1.8, 3.28, 13.82, 14.83, 15.83),
    }
    for index, times in expected.items():
        record = rows[index]
        got = (
            record.admitted_s,
            record.prefill_done_s,
            record.transfer_start_s,
            record.first_token_s,
            record.finish_s,
        )
        assert got == pytest.approx(times), index
        assert record.transfer_end_s == record.transfer_start_s
        assert (record.outcome, record.preemptions) == ("finished", 0)


def test_the_prefix_threshold_decider_prefills_short_uncached_prompts_on_the_decode_replica():
    decider = DeciderConfig(mode="prefix_threshold", threshold_tokens=40)
    shared = ((7, 64),)
    requests = [
        request(0, 0.0, 30, 2),  # 30 uncached tokens: not above 40, prefilled where it decodes
        request(1, 0.0, 100, 2),  # 100: disaggregated
        request(2, 0.0, 64 + 20, 2, prompt=(*shared, (500, 20))),  # 84 uncached: disaggregated
        # After request 2 ran on the decode replica, 64 of its tokens are cached there: 20 + 1 left.
        request(3, 50.0, 64 + 20, 2, prompt=(*shared, (501, 20))),
    ]
    cluster = build_cluster(requests, decider=decider, policy="prefix")
    cluster.run()
    rows = records(cluster)
    assert [rows[index].prefill_replica for index in range(4)] == [-1, 0, 0, -1]
    assert math.isnan(rows[0].transfer_start_s) and rows[0].transfer_bytes == 0
    assert rows[3].cached_prompt_tokens == 64
    assert cluster.disaggregated == 2
    assert cluster.routed == [2, 4]  # the prefill replica: 2 prompts; the decode replica: all 4


def test_the_prefix_threshold_is_exclusive_a_prompt_exactly_at_it_stays_on_the_decode_replica():
    # llm-d's decider disaggregates when the uncached tokens *exceed* the threshold: 40 of 40 stays,
    # 41 goes (the edge a >= would move).
    decider = DeciderConfig(mode="prefix_threshold", threshold_tokens=40)
    cluster = build_cluster([request(0, 0.0, 40, 2), request(1, 0.0, 41, 2)], decider=decider)
    cluster.run()
    rows = records(cluster)
    assert (rows[0].prefill_replica, rows[1].prefill_replica) == (-1, 0)
    assert cluster.disaggregated == 1


def test_a_decode_side_hit_shrinks_the_transfer():
    shared = ((7, 64),)
    requests = [
        request(0, 0.0, 80, 2, prompt=(*shared, (500, 16))),
        request(1, 30.0, 80, 2, prompt=(*shared, (501, 16))),
    ]
    cluster = build_cluster(requests, policy="prefix")
    cluster.run()
    rows = records(cluster)
    assert rows[0].transfer_bytes == 5 * BLOCK * KV_BYTES
    assert rows[1].decode_cached_tokens == 64
    assert rows[1].transfer_bytes == 1 * BLOCK * KV_BYTES  # only the block past the shared prefix


# ------------------------------------------------------------------------------------------- link
def test_processor_sharing_by_hand():
    """Three transfers in one pipe of 300 B/s, no latency: 300 B at 0, 300 B at 0.5, 150 B at 1.0.
    0-0.5: one at 300 B/s (150 B left); 0.5-1.0: two at 150 B/s (75 and 225 left); then three at
    100 B/s: the first ends at 1.75 (150 and 75 left); then two at 150 B/s: the third ends at 2.25
    (75 left of the second), which alone at 300 B/s ends at 2.5."""
    env = simpy.Environment()
    link = TransferLink(env, LinkSpec("c", 300.0, 0.0, "fabric"))
    ends: dict[str, float] = {}

    def start(name, nbytes, at):
        yield env.timeout(at)
        link.send(nbytes, 0, 1, 1, lambda: ends.setdefault(name, env.now))

    env.process(start("a", 300, 0.0))
    env.process(start("b", 300, 0.5))
    env.process(start("c", 150, 1.0))
    env.run()
    assert ends["a"] == pytest.approx(1.75)
    assert ends["c"] == pytest.approx(2.25)
    assert ends["b"] == pytest.approx(2.5)
    assert link.busy_s() == pytest.approx(2.5)


@pytest.mark.parametrize(
    ("shared_by", "expected"), [("pair", 1.0), ("fabric", 2.0), ("prefill", 2.0), ("decode", 1.0)]
)
def test_transfers_of_different_pairs_share_only_what_the_link_shares(shared_by, expected):
    """Two 100-byte transfers at 100 B/s from replica 0 to replicas 2 and 3: alone, 1 s each; sharing
    a pipe, 2 s both."""
    env = simpy.Environment()
    link = TransferLink(env, LinkSpec("c", 100.0, 0.0, shared_by))
    ends: list[float] = []
    link.send(100, 0, 2, 1, lambda: ends.append(env.now))
    link.send(100, 0, 3, 1, lambda: ends.append(env.now))
    env.run()
    assert ends == [pytest.approx(expected)] * 2


# --------------------------------------------------------------------- invariants, step modes
def random_requests(seed, count=120):
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(0.3, count))
    shared = ((900 + int(rng.integers(3)), 48),)
    out = []
    for index in range(count):
        tail = int(rng.integers(1, 200))
        prompt = (*shared, (5_000 + index, tail)) if rng.random() < 0.6 else ((5_000 + index, tail + 20),)
        out.append(
            request(
                index,
                float(arrivals[index]),
                sum(n for _, n in prompt),
                int(rng.integers(1, 60)),
                prompt=prompt,
            )
        )
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_blocks_are_conserved_in_both_pools_and_the_link(seed):
    """Small pools (heavy back-pressure and preemption): every replica's breakdown sums to its pool in
    every row of its series; at the end nothing is held, received or in flight, and every request has
    one outcome."""
    link = LinkSpec("c", 200_000.0, 0.01, "prefill")
    cluster = build_cluster(
        random_requests(seed),
        prefill_blocks=40,
        decode_blocks=30,
        policy="prefix",
        link=link,
        replicas=(2, 2),
    )
    cluster.run()
    for engine in cluster.replicas:
        series = engine.sink.timeseries()
        assert (series[list(BREAKDOWN_COLUMNS)].sum(axis=1) == engine.policy.pool_slots).all()
        assert engine.policy.breakdown().used == 0
        assert not engine.held and not engine.receiving
    rows = records(cluster)
    assert sorted(rows) == list(range(120))
    assert all(record.outcome == "finished" for record in rows.values())
    assert cluster.link.in_flight == 0 and not cluster.flights
    assert sum(engine.counters.preemptions for engine in cluster.replicas) > 0  # the pools were short


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("budget", [2048, 96])
def test_both_step_modes_agree(seed, budget):
    """Outcomes, times, every replica's time averages and cache counters. With a budget of 96 tokens
    the prompts' chunks take whole iterations: a jump that left no budget for admissions ran past a
    finished send, whose blocks single steps free at the next iteration start (the prefill replicas'
    used and cached slots differed, not the requests; found by ``tools/fuzz_step_modes.py``)."""
    link = LinkSpec("c", 200_000.0, 0.01, "fabric")
    outcomes = []
    replica_books = []
    for mode in ("skip", "single"):
        cluster = build_cluster(
            random_requests(seed),
            prefill_blocks=60,
            decode_blocks=40,
            policy="prefix",
            link=link,
            replicas=(2, 2),
            step_mode=mode,
            max_num_batched_tokens=budget,
        )
        cluster.run()
        end = cluster.env.now
        replica_books.append(
            [(engine.recorder.time_averages(end), engine.kv.stats) for engine in cluster.replicas]
        )
        rows = records(cluster)
        frame = pd.DataFrame(
            [
                (
                    r.request_id,
                    r.replica,
                    r.prefill_replica,
                    r.first_token_s,
                    r.finish_s,
                    r.transfer_start_s,
                    r.preemptions,
                )
                for r in rows.values()
            ],
            columns=["id", "replica", "prefill", "first", "finish", "transfer", "preemptions"],
        ).sort_values("id", ignore_index=True)
        outcomes.append((frame, sum(engine.counters.iterations for engine in cluster.replicas)))
    (skip, skip_iterations), (single, single_iterations) = outcomes
    assert skip[["replica", "prefill", "preemptions"]].equals(single[["replica", "prefill", "preemptions"]])
    for column in ("first", "finish", "transfer"):
        np.testing.assert_allclose(skip[column], single[column], rtol=0, atol=1e-9)
    assert skip_iterations == single_iterations
    for (skip_means, skip_stats), (single_means, single_stats) in zip(*replica_books, strict=True):
        assert skip_stats == single_stats
        assert skip_means == pytest.approx(single_means, rel=1e-9, abs=1e-12)


# ---------------------------------------------------------------------------- configs, bad input
def disaggregated_data(**disaggregation):
    pools = {"prefill": {"replicas": 1}, "decode": {"replicas": 2}} | disaggregation
    return {
        "name": "pd",
        "seed": 1,
        "model": "Llama-3.1-8B",
        "gpu": "H100-80GB",
        "engine": {"max_model_len": 4096, "max_num_batched_tokens": 2048, "num_gpu_blocks_override": 2000},
        "workload": {
            "num_requests": 60,
            "arrival": {"kind": "poisson", "rate_per_s": 8},
            "prompt_len": {"kind": "uniform", "low": 100, "high": 1500},
            "output_len": {"kind": "uniform", "low": 10, "high": 200},
        },
        "variants": [
            {"name": "colocated", "policy": "prefix", "cluster": {"replicas": 3, "router": "least_requests"}},
            {"name": "pd", "policy": "prefix", "cluster": {"disaggregation": pools}},
        ],
    }


def test_every_replica_of_both_pools_has_its_own_host_tier():
    # Llama-3.1-8B in bf16: 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 B = 131,072 B a token, a block of
    # 16 tokens 2 MiB, so 1 GiB of host memory holds 512 blocks, on each of the 2 + 3 replicas. (The
    # replicas after each pool's first once ran without their tier: 512 x 2 = 1,024 blocks in all.)
    data = disaggregated_data(prefill={"replicas": 2}, decode={"replicas": 3})
    data["offload"] = {"host_memory_gib": 1}
    data["workload"]["num_requests"] = 10
    config = validate_experiment(data)
    (_, pd) = prepare_experiment(config, ROOT / "pd.yaml").variants
    assert pd.prefill_pool is not None and pd.prefill_pool.replica_policies is not None
    assert pd.replica_policies is not None
    replicas = [*pd.prefill_pool.replica_policies, *pd.replica_policies]
    assert len({id(policy) for policy in replicas}) == 5
    assert [policy.host_tier.capacity_blocks for policy in replicas] == [512] * 5
    (_, result) = run_experiment(config, ROOT / "pd.yaml")
    assert result.summary["host_tier_blocks"] == 5 * 512
    assert [row["host_tier_blocks"] for row in result.replica_summaries] == [512] * 5


def test_a_pools_own_bad_options_are_named_by_the_pools_key():
    data = disaggregated_data(prefill={"replicas": 1, "options": {"bogus": 1}})
    with pytest.raises(ConfigError) as error:
        prepare_experiment(validate_experiment(data), ROOT / "pd.yaml")
    assert str(error.value).split("\n")[1] == (
        "  variants.1 (pd): variants.1.cluster.disaggregation.prefill.options: unknown option(s) 'bogus' "
        "for policy 'prefix' (valid: none)"
    )


def test_a_model_that_does_not_fit_a_pools_own_gpu_names_the_pools_gpu_key():
    data = disaggregated_data(prefill={"replicas": 1, "gpu": "T4"})
    with pytest.raises(ConfigError) as error:
        prepare_experiment(validate_experiment(data), ROOT / "pd.yaml")
    line = str(error.value).split("\n")[1]
    # (16 GiB x 0.9 = 14.40 GiB against 14.96 GiB of bf16 weights: the pool's GPU, not the experiment's.)
    assert line.startswith(
        "  variants.1 (pd): model, variants.1.cluster.disaggregation.prefill.gpu: Llama-3.1-8B on T4-16GB "
        "does not fit"
    )


def test_a_disaggregated_run_writes_its_tables_and_summary(tmp_path):
    config_file = tmp_path / "pd.yaml"
    config_file.write_text(yaml.safe_dump(disaggregated_data()))
    assert main(["run", str(config_file), "-o", str(tmp_path / "out")]) == 0
    results = load_results(tmp_path / "out")
    summary = results.variant_summary("pd")
    assert summary["requests_finished"] == results.variant_summary("colocated")["requests_finished"] == 60
    assert (summary["prefill_replicas"], summary["decode_replicas"]) == (1, 2)
    assert summary["requests_disaggregated"] == summary["kv_transfers"] == 60
    requests = results.requests("pd")
    assert summary["transfer_bytes_total"] == requests["transfer_bytes"].sum()
    # The summary's split is the requests' own, recomputed from their timestamps.
    done = requests[requests["outcome"] == "finished"]
    assert summary["transfer_mean_s"] == pytest.approx(
        (done["transfer_end_s"] - done["transfer_start_s"]).mean()
    )
    assert summary["transfer_wait_mean_s"] == pytest.approx(
        (done["transfer_start_s"] - done["prefill_done_s"]).mean()
    )
    assert summary["prefill_mean_s"] == pytest.approx((done["prefill_done_s"] - done["admitted_s"]).mean())
    assert summary["decode_first_step_mean_s"] == pytest.approx(
        (done["first_token_s"] - done["transfer_end_s"]).mean()
    )
    # One pipe (one prefill replica's NICs), busy at most while a transfer was in flight.
    series_in_flight = results.transfer_timeseries("pd")
    times = series_in_flight["time_s"].to_numpy()
    busy = float(
        ((series_in_flight["transfers_in_flight"].to_numpy()[:-1] > 0) * (times[1:] - times[:-1])).sum()
    )
    assert 0 < summary["link_utilization_frac"] * summary["simulated_s"] <= busy + 1e-9
    # The TTFT split adds up, request by request.
    split = requests["queue_s"] + requests["prefill_s"] + requests["transfer_wait_s"] + requests["transfer_s"]
    rest = requests["first_token_s"] - requests["transfer_end_s"]
    np.testing.assert_allclose(split + rest, requests["first_token_s"] - requests["arrival_s"], atol=1e-9)
    assert (rest > 0).all()
    assert set(requests["replica"]) <= {1, 2} and set(requests["prefill_replica"]) == {0}
    replicas = results.replica_summaries("pd")
    assert list(replicas["role"]) == ["prefill", "decode", "decode"]
    assert list(replicas["requests_routed"]) == [60, *replicas["requests_routed"][1:]]
    assert replicas["requests_routed"][1:].sum() == 60
    series = results.transfer_timeseries("pd")
    assert series["transfers_in_flight"].iloc[-1] == 0 and series["transfers_in_flight"].max() >= 1
    capacity = (tmp_path / "out" / "capacity.txt").read_text()
    assert "link: rdma: 50 GB/s per GPU one way" in capacity
    # Exactly the documented columns (docs/outputs.md).
    assert list(summary) == [*columns.SUMMARY, *columns.DISAGGREGATION]
    assert list(series.columns) == list(columns.TRANSFER_TIMESERIES)
    assert list(requests.columns) == list(columns.REQUESTS)
    own = [name for name in columns.SUMMARY if name not in columns.BALANCE]
    assert list(replicas.columns) == [*own, *columns.REPLICA_SUMMARY]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"prefill": {"replicas": 0}}, r"disaggregation\.prefill\.replicas: Input should be greater than 0"),
        ({"link": {"kind": "custom", "latency_s": 0.001}}, r"a custom link needs bandwidth_gb_per_s"),
        ({"link": {"kind": "carrier-pigeon"}}, r"disaggregation\.link\.kind"),
    ],
)
def test_bad_disaggregation_sections_are_refused_when_loading(change, message):
    with pytest.raises(ConfigError, match=message):
        validate_experiment(disaggregated_data(**change), ROOT / "configs" / "x.yaml")


def test_replicas_beside_pools_are_refused():
    data = disaggregated_data()
    data["variants"][1]["cluster"]["replicas"] = 4
    with pytest.raises(ConfigError, match=r"replicas do not apply with disaggregation"):
        validate_experiment(data, ROOT / "configs" / "x.yaml")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"decode": {"replicas": 1, "policy": "contiguous"}},
            r"variants\.1\.cluster\.disaggregation\.decode\.policy: contiguous has no blocks",
        ),
        (
            {"prefill": {"replicas": 1, "gpu": "T4", "engine": {"num_gpu_blocks_override": None}}},
            r"disaggregation\.prefill.*Llama-3\.1-8B.*T4|T4.*does not fit|weights",
        ),
        (
            {"decode": {"replicas": 1, "engine": {"block_size": 32}}},
            r"the pools' block sizes differ \(16 and 32\)",
        ),
        (
            {"link": {"kind": "nvlink"}, "prefill": {"replicas": 1, "gpu": "L4"}},
            r"link\.kind: nvlink, but the prefill pool's GPU L4-24GB has no NVLink",
        ),
    ],
)
def test_impossible_disaggregations_fail_before_any_simulation(change, message):
    config = validate_experiment(disaggregated_data(**change), ROOT / "configs" / "x.yaml")
    with pytest.raises(ConfigError, match=message):
        prepare_experiment(config, ROOT / "configs" / "x.yaml")


@settings(max_examples=12, deadline=None)
@given(
    lengths=st.lists(
        st.tuples(st.integers(1, 300), st.integers(1, 40), st.floats(0.0, 2.0), st.booleans()),
        min_size=1,
        max_size=25,
    ),
    prefill_blocks=st.integers(20, 40),
    decode_blocks=st.integers(20, 40),
    shared_by=st.sampled_from(["pair", "prefill", "decode", "fabric"]),
)
def test_any_stream_ends_with_every_block_back_and_one_outcome_each(
    lengths, prefill_blocks, decode_blocks, shared_by
):
    """Random prompts (some sharing a prefix), outputs, gaps and pool sizes: every series row of every
    replica sums to its pool, every request ends with exactly one record, and nothing stays held,
    received or on the link."""
    requests, clock = [], 0.0
    for index, (prompt_len, output_len, gap, shares) in enumerate(lengths):
        clock += gap
        prompt = ((77, 32), (6_000 + index, prompt_len)) if shares else ((6_000 + index, prompt_len),)
        requests.append(request(index, clock, sum(n for _, n in prompt), output_len, prompt=prompt))
    link = LinkSpec("c", 500_000.0, 0.002, shared_by)
    cluster = build_cluster(
        requests,
        prefill_blocks=prefill_blocks,
        decode_blocks=decode_blocks,
        policy="prefix",
        link=link,
        replicas=(2, 2),
    )
    cluster.run()
    for engine in cluster.replicas:
        series = engine.sink.timeseries()
        assert (series[list(BREAKDOWN_COLUMNS)].sum(axis=1) == engine.policy.pool_slots).all()
        assert engine.policy.breakdown().used == 0
        assert not engine.held and not engine.receiving and not engine.running and not engine.waiting
    rows = [record for engine in cluster.replicas for record in engine.records]
    assert sorted(record.request_id for record in rows) == list(range(len(requests)))
    assert {record.outcome for record in rows} <= {"finished", "rejected"}
    assert cluster.link.in_flight == 0 and not cluster.flights


# ------------------------------------------------------------------------------------ the link's spec
@pytest.mark.parametrize(
    ("section", "gpu", "expected"),
    [
        # rdma: one 400 Gb/s NIC per GPU (50 GB/s), 20 us assumed
        ({}, "H100-80GB", ("rdma", 50e9, 20e-6, "prefill")),
        # nvlink: the prefill GPU's NVLink one way, 900 / 2 GB/s on the H100, 10 us
        ({"kind": "nvlink", "shared_by": "pair"}, "H100-80GB", ("nvlink", 450e9, 10e-6, "pair")),
        # pcie: the prefill GPU's host link one way (the H100's Gen5 x16: 64 GB/s; the L4's Gen4: 32)
        ({"kind": "pcie"}, "H100-80GB", ("pcie", 64e9, 10e-6, "prefill")),
        ({"kind": "pcie", "shared_by": "fabric"}, "L4-24GB", ("pcie", 32e9, 10e-6, "fabric")),
        # given figures replace the kind's
        (
            {"kind": "nvlink", "bandwidth_gb_per_s": 100, "latency_s": 0.0},
            "L4-24GB",
            ("nvlink", 100e9, 0.0, "prefill"),
        ),
        (
            {"kind": "custom", "bandwidth_gb_per_s": 12.5, "latency_s": 0.003, "shared_by": "decode"},
            "L4-24GB",
            ("custom", 12.5e9, 0.003, "decode"),
        ),
    ],
)
def test_a_links_bandwidth_and_latency_come_from_its_kind_and_the_prefill_gpu(section, gpu, expected):
    from sim.cluster.link import resolve_link
    from sim.config import LinkConfig
    from sim.hardware.gpus import resolve_gpu

    link = resolve_link(LinkConfig.model_validate(section), resolve_gpu(gpu))
    assert (link.name, link.bandwidth_bytes_per_s, link.latency_s, link.shared_by) == expected


def test_nvlink_on_a_gpu_without_it_is_refused_naming_the_key():
    from sim.cluster.link import resolve_link
    from sim.config import LinkConfig
    from sim.hardware.gpus import resolve_gpu

    with pytest.raises(
        ValueError,
        match=r"^disaggregation\.link\.kind: nvlink, but the prefill pool's GPU L4-24GB has no NVLink; "
        r"use pcie, rdma, or give bandwidth_gb_per_s$",
    ):
        resolve_link(LinkConfig(kind="nvlink"), resolve_gpu("L4-24GB"), "disaggregation.link")


def test_the_links_bound_on_the_next_end_and_its_bytes_in_flight_by_hand():
    """32,000 B/s per lane, 0.1 s latency. At 0, 16,000 bytes over 2 lanes (from replica 0) and
    32,000 over 1 (from replica 1), shared by prefill replica: separate pipes. In their latency the
    bound is the earliest flowing end, 0.1 + 16,000 / 64,000 = 0.35; at 0.2 both flow, the first has
    16,000 - 0.1 x 64,000 = 9,600 left, the second 32,000 - 3,200 = 28,800."""
    env = simpy.Environment()
    link = TransferLink(env, LinkSpec("custom", 32_000.0, 0.1, "prefill"))
    ended: list[tuple[int, float]] = []
    link.send(16_000, 0, 0, 2, lambda: ended.append((0, env.now)))
    link.send(32_000, 1, 0, 1, lambda: ended.append((1, env.now)))
    assert link.earliest_end_s() == pytest.approx(0.35)
    assert link.bytes_in_flight() == 48_000
    env.run(until=0.2)
    for pipe in link.pipes.values():
        pipe.progress()
    assert link.bytes_in_flight() == pytest.approx(9_600 + 28_800)
    assert link.earliest_end_s() == pytest.approx(0.35)
    env.run()
    assert ended == [(0, pytest.approx(0.35)), (1, pytest.approx(1.1))]


@pytest.mark.parametrize(
    ("shared_by", "second_end"), [("prefill", 1.1), ("fabric", 1.6), ("decode", 1.6), ("pair", 1.1)]
)
def test_two_prefill_replicas_share_a_pipe_only_when_the_link_says_so(shared_by, second_end):
    """Prefill replicas 0 and 1 send 16,000 and 32,000 bytes to decode replica 0 at 0 (32,000 B/s,
    0.1 s latency, one lane each). Apart: 0.6 and 1.1. In one pipe (fabric; decode, the same
    receiver): 16,000 B/s each until the first ends at 0.1 + 1.0 = 1.1, then the second's 16,000
    bytes left alone: 1.1 + 0.5 = 1.6."""
    env = simpy.Environment()
    link = TransferLink(env, LinkSpec("custom", 32_000.0, 0.1, shared_by))
    ends: dict[int, float] = {}
    link.send(16_000, 0, 0, 1, lambda: ends.__setitem__(0, env.now))
    link.send(32_000, 1, 0, 1, lambda: ends.__setitem__(1, env.now))
    env.run()
    first_end = 0.6 if second_end == 1.1 else 1.1
    assert ends == {0: pytest.approx(first_end), 1: pytest.approx(second_end)}


def test_requests_whose_kv_is_in_flight_when_the_clock_stops_are_booked_unfinished_once():
    """The two prompts of the hand-worked run above, the clock stopped at 2.0 s: both were prefilled
    (1.64 s) and allocated on the decode replica, the first's KV lands at 2.74 and the second's at
    3.74, so both are still on their way. Each is booked once, unfinished, by the decode replica that
    holds its blocks; the prefill replica still holds both prompts' blocks."""
    cluster = build_cluster([request(0, 0.0, 16, 3), request(1, 0.0, 48, 3)])
    cluster.run(until_s=2.0)
    prefill, decode = cluster.replicas
    assert sorted(decode.receiving) == [0, 1] and sorted(prefill.held) == [0, 1]
    rows = [record for engine in cluster.replicas for record in engine.records]
    assert sorted(record.request_id for record in rows) == [0, 1]
    for record in rows:
        assert record.outcome == "unfinished"
        assert record.prefill_done_s == pytest.approx(1.64) and math.isnan(record.first_token_s)
        assert math.isnan(record.transfer_end_s)  # (not landed)


@pytest.mark.python_sources  # stand-ins for RequestState (the compiled hand-off takes compiled states)
def test_prompts_that_landed_reach_the_queue_front_in_the_order_they_landed():
    # vLLM's _update_waiting_for_remote_kv: prompts whose KV landed since the last step join the
    # queue's front, first landed first, ahead of what was waiting; the finished sends free first.
    from types import SimpleNamespace

    from sim.engine.handoff import KVHandOff

    class Hooks:
        def kv_allocated(self, state, cached_tokens):
            pass

    def state(request_id):
        return SimpleNamespace(
            request=SimpleNamespace(request_id=request_id), remote_kv=True, kv_landed=False
        )

    handoff = KVHandOff(Hooks(), prefill_only=False)
    first, second, third = state(1), state(2), state(3)
    for receiving in (first, second, third):
        handoff.receive(receiving, 0)
    handoff.landed(second)
    handoff.landed(first)
    waiting = deque([third])
    assert handoff.notices_waiting
    handoff.take_notices(None, waiting)
    assert [item.request.request_id for item in waiting] == [2, 1, 3]
    assert (second.remote_kv, second.kv_landed) == (False, True)
    assert set(handoff.receiving) == {3} and not handoff.notices_waiting


def test_a_prefill_replica_takes_no_slot_for_the_token_it_samples():
    """A 16-token prompt in a prefill pool of one 16-token block: the prompt fills the block and the
    token sampled at its end needs none there (vLLM allocates the prefill instance no slot for it;
    the decode replica recomputes it), so the request is served as on a larger pool (before: the
    arrival check counted a slot for that token and rejected the request; a prefill replica that
    took a slot for it would run out of blocks)."""
    cluster = build_cluster([request(0, 0.0, 16, 3)], prefill_blocks=1)
    cluster.run()
    record = records(cluster)[0]
    assert (record.outcome, record.preemptions) == ("finished", 0)
    assert record.prefill_done_s == pytest.approx(1.16)
    assert record.transfer_bytes == 16_000


def test_a_request_the_decode_pool_can_never_hold_is_rejected_there_and_its_prefill_blocks_freed():
    """Decode pool 2 blocks (32 slots), a request of prompt 16 + output 40 = 56 tokens: the prefill
    replica computes its prompt (1 + 0.16 = 1.16 s) and holds its block for the send; the decode
    replica, offered it at 1.16, rejects it on arrival with the reason, nothing is sent, and the
    prefill block goes back at the prefill replica's next iteration start. A later request that fits
    runs as usual."""
    cluster = build_cluster([request(0, 0.0, 16, 40), request(1, 5.0, 16, 3)], decode_blocks=2)
    cluster.run()
    rejected, served = records(cluster)[0], records(cluster)[1]
    assert rejected.outcome == "rejected"
    assert rejected.reason.endswith("exceed the KV pool (32 slots) even with nothing else running")
    assert rejected.prefill_done_s == pytest.approx(1.16)
    assert math.isnan(rejected.transfer_start_s) and rejected.transfer_bytes == 0
    assert served.outcome == "finished"
    assert (cluster.link.transfers, cluster.link.bytes_sent) == (1, 16_000)
    assert not cluster.flights
    # The dropped prompt no longer waits for decode blocks: the series ends with nothing pending.
    assert cluster.rows[-1][1:] == (0, 0, 0)
    for engine in cluster.replicas:
        assert engine.policy.breakdown().used == 0
        assert not engine.held and not engine.receiving


@pytest.mark.parametrize(
    "extra",
    [
        {"n": 3, "sample_output_lens": (2, 3, 4)},
        {"n": 3},
        {"beam_width": 2},
    ],
    ids=["samples-of-their-own-lengths", "samples", "beams"],
)
def test_the_prefill_replica_runs_one_sequence_and_the_decode_replica_forks_the_rest(extra):
    """A 32-token prompt (2 blocks) in a prefill pool of exactly 2 blocks: the prefill replica runs the
    prompt once, with one token out, whatever the request's samples or beams (three copies of the
    prompt would need 6 blocks: it would be rejected there); the decode replica forks them after the
    KV lands and the request finishes with all its sequences' tokens."""
    stream = [request(0, 0.0, 32, 4, **extra)]
    cluster = build_cluster(stream, prefill_blocks=2)
    cluster.run()
    record = records(cluster)[0]
    assert (record.outcome, record.prefill_replica, record.preemptions) == ("finished", 0, 0)
    assert record.prefill_done_s == pytest.approx(1.32)
    assert record.transfer_bytes == 32_000
    assert record.sample_output_tokens == sum(stream[0].output_lens)


def test_follow_ups_come_from_the_original_request_wherever_it_ended():
    """A closed-loop user sends the next request 1 s after each outcome. Request 0 (prompt 16) runs
    prefill then decode replica; request 1 (prompt 48) is rejected by the prefill pool of 2 blocks
    (32 slots) as it arrives at 0. The user hears of both with the request it sent (output 3, not the
    prefill replica's one-token copy), and its follow-ups (ids 10, 11; prompt 16) are served in turn;
    no flight is left behind."""
    heard = []

    def follow_up(original, now):
        heard.append((original.request_id, original.output_len, round(now, 9)))
        if original.request_id >= 10:
            return None
        return request(original.request_id + 10, now + 1.0, 16, 2)

    cluster = build_cluster(
        [request(0, 0.0, 16, 3), request(1, 0.0, 48, 3)], prefill_blocks=2, follow_up=follow_up
    )
    cluster.run()
    rows = records(cluster)
    assert rows[1].outcome == "rejected" and rows[0].outcome == "finished"
    assert heard[0] == (1, 3, 0.0)  # the rejection, as it arrived
    assert (heard[1][0], heard[1][1]) == (0, 3) and heard[1][2] == pytest.approx(rows[0].finish_s)
    assert rows[11].arrival_s == pytest.approx(1.0) and rows[10].arrival_s == pytest.approx(
        rows[0].finish_s + 1.0
    )
    assert rows[10].outcome == rows[11].outcome == "finished"
    assert rows[10].prefill_replica == rows[11].prefill_replica == 0
    assert sorted(request_id for request_id, _, _ in heard) == [0, 1, 10, 11]
    assert not cluster.flights


def test_each_pools_router_chooses_by_the_request_it_is_given():
    """Two prefill and two decode replicas, each pool routed by session. At t=0 session 8's request
    goes to the idle prefill replica 0 and session 7's to prefill replica 1; both pools choose as a
    request arrives, when both decode replicas are still empty (the prompts are on the prefill
    side), so both sessions map to decode replica 2 (the first of the least loaded). Session 7's next
    request, at t=20 with every replica idle, follows its session to prefill replica 1 where the least
    loaded choice would be 0."""
    stream = [
        request(0, 0.0, 16, 2, session_id=8),
        request(1, 0.0, 16, 2, session_id=7),
        request(2, 20.0, 16, 2, session_id=7),
    ]
    delivered = []
    cluster = build_cluster(
        stream, replicas=(2, 2), routers=(SessionAffinity(), SessionAffinity()), on_delivered=delivered.append
    )
    cluster.run()
    assert delivered == [2, 1]  # the progress callback: requests delivered at each arrival instant
    decoded_on = {
        record.request_id: index for index, engine in enumerate(cluster.replicas) for record in engine.records
    }
    rows = records(cluster)
    assert [rows[i].prefill_replica for i in range(3)] == [0, 1, 1]
    assert decoded_on == {0: 2, 1: 2, 2: 2}
    assert cluster.routed == [1, 2, 3, 0]
    roles = ["prefill", "prefill", "decode", "decode"]
    assert cluster.built_roles == roles and [cluster.role_of(index) for index in range(4)] == roles
    assert all(rows[i].outcome == "finished" for i in range(3))


def test_a_pipe_ends_the_transfer_due_now_even_when_rounding_left_it_a_hair_short():
    """Two transfers of 500 B share a 1,000 B/s pipe, one with one lane and one with two: each gets
    half the pipe times its lanes, 500 and 1,000 B/s, so the faster is due at 0.5 s. If it still had
    a little more than its end was planned for (here 2 bytes: more than the 1-byte rounding margin),
    the end planned for 0.5 s still ends the transfer with the least time left, and only it; the
    slower one, alone from then with 250 B left at 1,000 B/s, ends at 0.75 s."""
    from sim.cluster.link import Pipe, Transfer

    env = simpy.Environment()
    ended = []
    pipe = Pipe(env, 1000.0, lambda: None)
    slow = Transfer(500, 1, lambda: ended.append(("slow", env.now)))
    fast = Transfer(500, 2, lambda: ended.append(("fast", env.now)))
    pipe.add(slow)
    pipe.add(fast)
    fast.remaining += 2.0  # (what a drift of float arithmetic could leave, exaggerated)
    env.run(until=0.6)
    assert ended == [("fast", 0.5)]
    assert pipe.active == [slow]
    env.run()
    assert ended == [("fast", 0.5), ("slow", pytest.approx(0.75))]


def test_a_link_without_latency_starts_flowing_at_once_and_shares_one_fabric():
    """No latency: a transfer flows from the instant it is sent (no wait, the series changes at
    once). With no sharing named, every pair shares one fabric pipe: two 1,000-byte sends from
    different pairs at 0 over 1,000 B/s each get half: both end at 2 s. Bytes in flight never count
    below zero, and a send of nothing over an instantaneous link ends at once."""
    from sim.cluster.link import TransferLink

    env = simpy.Environment()
    changes, ended = [], []
    link = TransferLink(
        env, LinkSpec("custom", 1000.0, 0.0, "fabric"), on_change=lambda: changes.append(env.now)
    )
    link.send(1000, 0, 2, 1, lambda: ended.append(("a", env.now)))
    link.send(1000, 1, 3, 1, lambda: ended.append(("b", env.now)))
    assert changes == [0.0, 0.0] and list(link.pipes) == ["fabric"]
    assert link.earliest_end_s() == pytest.approx(2.0)
    assert link.bytes_in_flight() == 2000
    env.run()
    assert ended == [("a", pytest.approx(2.0)), ("b", pytest.approx(2.0))]
    assert (link.transfers, link.in_flight, link.bytes_sent) == (2, 0, 2000)
    assert link.bytes_in_flight() == 0
    instant = TransferLink(env, LinkSpec("custom", math.inf, 0.0, "pair"))
    instant.send(0, 0, 1, 1, lambda: ended.append(("c", env.now)))
    assert ended[-1] == ("c", env.now) and not instant.pipes
