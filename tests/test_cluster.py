"""A cluster of replicas behind a router (sim/cluster/): routers worked out by hand, a cluster of one
replica against the single engine, both step modes, the cluster totals, and bad input."""

from __future__ import annotations

import random
import statistics
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import yaml

from policies.base import MemoryBreakdown, PoolSpec, PrefixHit, make_policy
from sim.cli import main
from sim.cluster.cluster import Cluster
from sim.cluster.results import balance_metrics
from sim.cluster.routers import LeastKV, LeastRequests, PrefixAware, RoundRobin, SessionAffinity
from sim.config import ClusterConfig, ConfigError, validate_experiment
from sim.engine.core import Engine, EngineKnobs
from sim.outputs import columns
from sim.outputs.metrics import BREAKDOWN_COLUMNS, cumulative_area_at, summary_key
from sim.planning.sweeps.steady import SteadyWindow
from sim.planning.sweeps.tasks import PointTask, run_point
from sim.results import load_results
from sim.runner import prepare_experiment, run_experiment
from tests.engine_helpers import RoundCostModel, request

ROOT = Path(__file__).resolve().parents[1]
CHAT = ROOT / "configs" / "chat-radix-vs-prefix.yaml"


def replica(load: int = 0, policy=None, free_slots: int = 0):
    """What a router reads of a replica: its queue, its batch and its KV memory (a policy answers
    what its coordinator does)."""
    policy = policy or SimpleNamespace(available_slots=lambda: free_slots)
    return SimpleNamespace(running=[None] * load, waiting=[], receiving={}, kv=policy)


# ------------------------------------------------------------------------------------------ routers
def test_round_robin_cycles_through_the_replicas_in_a_real_cluster():
    # 7 requests, 3 replicas: 0 1 2 0 1 2 0, so replicas 0/1/2 get 3/2/2 requests.
    stream = [request(i, arrival_s=float(i), prompt_len=16, output_len=2) for i in range(7)]
    pool = PoolSpec(1024, 16, 256)

    def build(index, env, upstream, follow_up):
        return Engine(
            make_policy("paged", pool), RoundCostModel(), EngineKnobs(max_model_len=256), (),
            env=env, upstream=upstream, follow_up=follow_up,
        )  # fmt: skip

    cluster = Cluster(3, build, RoundRobin(), iter(stream))
    cluster.run()
    served = {record.request_id: index for index, e in enumerate(cluster.replicas) for record in e.records}
    assert [served[i] for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert cluster.routed == [3, 2, 2]
    assert all(record.outcome == "finished" for e in cluster.replicas for record in e.records)


def test_least_requests_and_least_kv_pick_by_hand():
    replicas = [
        replica(load=3, free_slots=100),
        replica(load=1, free_slots=300),
        replica(load=1, free_slots=300),
    ]
    # Fewest running + waiting: 1 (replicas 1 and 2 tie, the lower index wins).
    assert LeastRequests().choose(request(0, 0.0, 16, 1), replicas) == 1
    # Most free KV slots: 300 (1 and 2 tie -> 1); with replica 2 at 301 it wins.
    assert LeastKV().choose(request(0, 0.0, 16, 1), replicas) == 1
    replicas[2] = replica(load=1, free_slots=301)
    assert LeastKV().choose(request(0, 0.0, 16, 1), replicas) == 2


def test_least_requests_counts_the_queue_too():
    # A replica's load is its running and its waiting requests (and, decoding remote prompts, those
    # whose KV is on its way): 1 running + 2 waiting weighs more than 2 running.
    queued = SimpleNamespace(running=[None], waiting=[None, None], receiving={}, kv=None)
    busy = SimpleNamespace(running=[None, None], waiting=[], receiving={}, kv=None)
    receiving = SimpleNamespace(running=[None], waiting=[], receiving={7: None, 8: None}, kv=None)
    assert LeastRequests().choose(request(0, 0.0, 16, 1), [queued, busy]) == 1
    assert LeastRequests().choose(request(0, 0.0, 16, 1), [receiving, busy]) == 1


def test_session_affinity_keeps_a_conversation_on_its_first_replica():
    router = SessionAffinity()
    replicas = [replica(load=2), replica(load=0), replica(load=1)]
    assert router.choose(request(0, 0.0, 16, 1, session_id=7), replicas) == 1  # new: least loaded
    replicas[1] = replica(load=5)
    assert router.choose(request(1, 1.0, 16, 1, session_id=7), replicas) == 1  # sticks despite the load
    assert router.choose(request(2, 2.0, 16, 1, session_id=8), replicas) == 2  # new session: least loaded
    assert router.choose(request(3, 3.0, 16, 1), replicas) == 2  # no session: least loaded


def _prefix_policy_holding(prompt):
    """A prefix-caching policy whose cache holds ``prompt`` (admitted, then freed: cached, idle)."""
    policy = make_policy("prefix", PoolSpec(1024, 16, 512))
    if prompt:
        policy.admit(1, prompt, final_len=sum(length for _, length in prompt) + 1, output_content_id=99)
        policy.free(1)
    return policy


def test_prefix_aware_weighs_the_cached_fraction_against_the_load():
    """Replica 1 holds 64 tokens of stream 1 in its cache; loads are 0, 2, 1.

    Load scores (max - load) / (max - min) = (2-0)/2, (2-2)/2, (2-1)/2 = 1, 0, 0.5, times load_weight 2.
    - prompt = 64 cached + 36 new tokens: replica 1 hits 64 / 100 -> 3 x 0.64 + 0 = 1.92 against
      replica 0's 0 + 2 x 1 = 2.0: the idle replica wins;
    - prompt = 64 cached + 16 new tokens: 3 x 64/80 = 2.4 > 2.0: the replica holding the prefix wins.
    """
    cached = ((1, 64),)
    replicas = [
        replica(load=0, policy=_prefix_policy_holding(())),
        replica(load=2, policy=_prefix_policy_holding(cached)),
        replica(load=1, policy=_prefix_policy_holding(())),
    ]
    router = PrefixAware(prefix_weight=3.0, load_weight=2.0)
    long_prompt = request(5, 0.0, 0, 1, prompt=((1, 64), (2, 36)))
    assert router.scores(long_prompt, replicas) == pytest.approx([2.0, 1.92, 1.0])
    assert router.choose(long_prompt, replicas) == 0
    short_prompt = request(6, 0.0, 0, 1, prompt=((1, 64), (3, 16)))
    assert router.scores(short_prompt, replicas) == pytest.approx([2.0, 2.4, 1.0])
    assert router.choose(short_prompt, replicas) == 1
    # lookup() changed nothing: no statistics counted on the replica that was asked.
    assert replicas[1].kv.stats.prefix_cache_queries == 64  # its own admission of 64 tokens only


def test_prefix_aware_counts_host_tier_hits_at_host_weight():
    """Both replicas held the 8 full-block tokens of an 11-token prompt; replica 1's GPU evicted them
    to its host tier. A 12-token prompt extending it: replica 0 hits 8 tokens on the GPU, replica 1
    0 on the GPU and 8 in host memory. Loads 1, 0 -> load scores 0, 1 (x 2).
    - host_weight 0.8: 3 x 8/12 = 2.0 against 3 x 0.8 x 8/12 + 2 = 3.6: replica 1 wins;
    - host_weight 0 (GPU hits only, as before host tiers were scored): 2.0 against 2.0, a tie: replica 0.
    """
    prompt = ((1, 8), (2, 3))
    on_gpu = make_policy("prefix", PoolSpec(16, 4, 16))
    on_gpu.enable_host_tier(8)
    on_gpu.admit(1, prompt, 11, output_content_id=101)
    on_gpu.free(1)
    on_host = make_policy("prefix", PoolSpec(16, 4, 16))
    on_host.enable_host_tier(8)
    on_host.admit(1, prompt, 11, output_content_id=101)
    on_host.free(1)
    on_host.admit(2, ((999, 16),), 16, output_content_id=102)  # takes every GPU block: evicts to host
    on_host.free(2)
    extended = request(8, 0.0, 0, 1, prompt=((1, 8), (3, 4)))
    assert on_gpu.lookup(extended.prompt) == PrefixHit(8, (0, 1), 0)
    assert on_host.lookup(extended.prompt) == PrefixHit(0, (), 8)
    replicas = [replica(load=1, policy=on_gpu), replica(load=0, policy=on_host)]
    weighted = PrefixAware(prefix_weight=3.0, load_weight=2.0, host_weight=0.8)
    assert weighted.scores(extended, replicas) == pytest.approx([2.0, 3.6])
    assert weighted.choose(extended, replicas) == 1
    gpu_only = PrefixAware(prefix_weight=3.0, load_weight=2.0, host_weight=0.0)
    assert gpu_only.scores(extended, replicas) == pytest.approx([2.0, 2.0])
    assert gpu_only.choose(extended, replicas) == 0


def test_prefix_aware_falls_back_to_the_load_when_hits_tie():
    """Nobody holds stream 5: prefix scores tie at 0; loads 2, 1, 1 -> load scores 0, 1, 1 (x2); the
    lowest index of the two least loaded wins."""
    replicas = [replica(load=load, policy=_prefix_policy_holding(((1, 64),))) for load in (2, 1, 1)]
    router = PrefixAware(prefix_weight=3.0, load_weight=2.0)
    unseen = request(7, 0.0, 0, 1, prompt=((5, 48),))
    assert router.scores(unseen, replicas) == pytest.approx([0.0, 2.0, 2.0])
    assert router.choose(unseen, replicas) == 1


# ------------------------------------------------------------------------------- whole experiments
def chat_data(num_requests: int = 120, **cluster) -> dict:
    data = yaml.safe_load(CHAT.read_text())
    data["workload"]["num_requests"] = num_requests
    data["workload"]["arrival"]["rate_per_s"] = 4.0
    data["gpu"] = "L4-24GB"  # a tight pool: replicas evict, so which one holds a prefix matters
    data["variants"] = [variant for variant in data["variants"] if variant["name"] in ("prefix", "radix")]
    if cluster:
        data["cluster"] = cluster
    return data


def run(data: dict):
    config = validate_experiment(data, CHAT)
    return run_experiment(config, CHAT)


def test_a_cluster_of_one_replica_is_the_single_engine_run():
    """Behind a router that reads no replica state, bit for bit."""
    data = chat_data()
    data["engine"]["async_scheduling"] = False
    single = run(data)
    data["cluster"] = {"replicas": 1, "router": "round_robin"}
    cluster = run(data)
    for alone, one in zip(single, cluster, strict=True):
        assert one.requests.equals(alone.requests)
        assert one.timeseries.equals(alone.timeseries)
        # wall_s is the machine's time, not a result: left out rather than asserted to differ.
        differ = {key for key in alone.summary if key != "wall_s" and alone.summary[key] != one.summary[key]}
        assert differ == {"router"}
        assert (alone.summary["router"], one.summary["router"]) == ("none", "round_robin")


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_behind_a_router_that_reads_its_cache_a_replica_runs_the_same_requests(async_scheduling):
    """``prefix_aware`` looks up every arrival in the replicas' caches, so a replica's jumps stop
    before the iteration an arrival falls in (and a lone engine with async scheduling may jump over
    the iteration after an arrival's, scheduled before the request came): the two sum different spans
    of the same iterations, equal to rounding, with more wake-ups (and time-series rows) in the
    cluster."""
    data = chat_data()
    data["engine"]["async_scheduling"] = async_scheduling
    single = run(data)
    data["cluster"] = {"replicas": 1, "router": "prefix_aware"}
    cluster = run(data)
    for alone, one in zip(single, cluster, strict=True):
        assert alone.summary["engine_wakeups"] < one.summary["engine_wakeups"]
        assert alone.summary["iterations"] == one.summary["iterations"]
        pd.testing.assert_frame_equal(one.requests, alone.requests, rtol=1e-12, atol=1e-9)
        # (The time series has a row per wake-up; its time averages are in the summary.)
        for key in ("mean_used_frac", "mean_cached_frac", "mean_free_frac", "mean_running", "simulated_s"):
            assert one.summary[key] == pytest.approx(alone.summary[key], rel=1e-12), key


@pytest.mark.parametrize("router", ["prefix_aware", "least_kv", "least_requests", "session_affinity"])
def test_a_cluster_routes_the_same_in_both_step_modes(router):
    """Replicas jump over iterations only up to the next time a request could reach them (an arrival,
    or another replica's wake-up end, where a follow-up turn may be born), so single steps agree:
    routers that read the replicas' state (cache, free KV, queues) see the same state in both modes."""
    data = chat_data(replicas=3, router=router)
    skip = run(data)
    data["engine"]["step_mode"] = "single"
    single = run(data)
    for jumped, stepped in zip(skip, single, strict=True):
        left = jumped.requests.sort_values("request_id").reset_index(drop=True)
        right = stepped.requests.sort_values("request_id").reset_index(drop=True)
        assert left["replica"].equals(right["replica"])
        assert left["cached_prompt_tokens"].equals(right["cached_prompt_tokens"])
        pd.testing.assert_series_equal(left["finish_s"], right["finish_s"], rtol=0, atol=1e-9)
        assert jumped.summary["iterations"] == stepped.summary["iterations"]


def test_cluster_totals_add_up_over_the_replicas():
    (result, _) = run(chat_data(replicas=3, router="round_robin"))
    replicas = result.replica_summaries
    summary = result.summary
    assert [row["requests_routed"] for row in replicas] == [40, 40, 40]  # round robin, 120 requests
    summed = ("requests_finished", "prefix_cache_queries", "prefix_cache_hits", "evictions", "iterations")
    for key in (*summed, "engine_wakeups"):
        assert summary[key] == sum(row[key] for row in replicas), key
    # Each replica wakes at most once per iteration, and skipping saves some of them.
    assert 0 < summary["engine_wakeups"] < summary["iterations"]
    assert summary["prefix_cache_hit_rate"] == summary["prefix_cache_hits"] / summary["prefix_cache_queries"]
    rates = [row["prefix_cache_hit_rate"] for row in replicas]
    assert (summary["prefix_cache_hit_rate_min"], summary["prefix_cache_hit_rate_max"]) == (
        min(rates),
        max(rates),
    )
    assert (summary["requests_max_over_mean"], summary["requests_cv"]) == (1.0, 0.0)
    # Time-averaged shares over the three pools together: the mean of the replicas' shares (equal pools).
    assert summary["mean_used_frac"] == pytest.approx(sum(row["mean_used_frac"] for row in replicas) / 3)
    # The total series: the breakdown sums to the three pools in every row, and its last row is the sum
    # of the replicas' last rows.
    total, per_replica = result.timeseries, result.replica_timeseries
    assert (total[list(BREAKDOWN_COLUMNS)].sum(axis=1) == 3 * summary["kv_pool_tokens"]).all()
    last = per_replica.groupby("replica").tail(1)
    for name in ("used_tokens", "cached_tokens", "prefix_cache_hits", "preemptions"):
        assert total[name].iloc[-1] == last[name].sum()
    assert summary["peak_running"] == total["num_requests_running"].max()
    assert summary["peak_running"] <= sum(row["peak_running"] for row in replicas)


def test_balance_metrics_by_hand():
    """Routed 6, 2, 4: mean 4, max / mean 1.5, population std sqrt(8/3) = 1.63299, CV 0.408248.
    KV usage (1 - free - cached) 0.5, 0.25, 0.75: mean 0.5, max / mean 1.5, std sqrt(0.125/3), CV
    0.408248. Hit rates 0.1, none (no queries), 0.3: min 0.1, max 0.3."""
    rows = [
        {"mean_free_frac": 0.25, "mean_cached_frac": 0.25, "prefix_cache_hit_rate": 0.1},
        {"mean_free_frac": 0.5, "mean_cached_frac": 0.25, "prefix_cache_hit_rate": None},
        {"mean_free_frac": 0.2, "mean_cached_frac": 0.05, "prefix_cache_hit_rate": 0.3},
    ]
    got = balance_metrics("least_kv", [6, 2, 4], rows)
    assert got == {
        "replicas": 3,
        "router": "least_kv",
        "requests_max_over_mean": pytest.approx(1.5),
        "requests_cv": pytest.approx(0.408248, rel=1e-5),
        "kv_usage_max_over_mean": pytest.approx(1.5),
        "kv_usage_cv": pytest.approx(0.408248, rel=1e-5),
        "prefix_cache_hit_rate_min": 0.1,
        "prefix_cache_hit_rate_max": 0.3,
    }
    idle = balance_metrics("round_robin", [0, 0], rows[:2])
    assert idle["requests_max_over_mean"] is None and idle["requests_cv"] is None


def test_an_unbalanced_cluster_reports_its_imbalance():
    """session_affinity keeps conversations where they started, so replicas get unequal shares; the
    summary's balance columns are recomputed here from the per-replica rows (statistics.pstdev)."""
    (result, _) = run(chat_data(replicas=3, router="session_affinity"))
    routed = [row["requests_routed"] for row in result.replica_summaries]
    assert sum(routed) == 120 and len(set(routed)) > 1
    mean = sum(routed) / 3
    summary = result.summary
    assert summary["requests_max_over_mean"] == pytest.approx(max(routed) / mean)
    assert summary["requests_cv"] == pytest.approx(statistics.pstdev(routed) / mean)
    usage = [1 - row["mean_free_frac"] - row["mean_cached_frac"] for row in result.replica_summaries]
    assert summary["kv_usage_cv"] == pytest.approx(statistics.pstdev(usage) / statistics.mean(usage))
    # The total series' area columns, read at the end of the run, give the summary's exact time
    # averages over the replicas' pools together (which the recorders' own areas give).
    total = result.timeseries
    end = np.array([summary["simulated_s"]])
    pool = summary["kv_pool_tokens"] * 3
    for category in ("used", "reserved", "free", "cached"):
        area = cumulative_area_at(total, f"{category}_token_s", f"{category}_tokens", end)[0]
        assert area / end[0] / pool == pytest.approx(summary[summary_key(category)], rel=1e-9)


def test_cluster_run_writes_the_documented_files(tmp_path, capsys):
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(chat_data(60, replicas=2, router="session_affinity")))
    out = tmp_path / "run"
    assert main(["run", str(path), "-q", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "session_affinity" in printed and "req max/mean" in printed
    results = load_results(out)
    assert results.is_cluster("prefix")
    own = [name for name in columns.SUMMARY if name not in columns.BALANCE]
    assert list(results.replica_summaries("prefix").columns) == [*own, *columns.REPLICA_SUMMARY]
    assert list(results.replica_timeseries("prefix").columns) == ["replica", *columns.TIMESERIES]
    assert list(results.timeseries("prefix").columns) == list(columns.TIMESERIES)
    assert set(results.requests("prefix")["replica"]) == {0, 1}
    assert (out / "figures" / "replicas.png").stat().st_size > 10_000


# -------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("cluster", "message"),
    [
        ({"replicas": 0}, r"cluster\.replicas: Input should be greater than 0 \(got 0\)"),
        ({"router": "least_load"}, r"cluster\.router: unknown router 'least_load'; did you mean 'least_kv'"),
        ({"replicaz": 2}, r"cluster\.replicaz: unknown key; did you mean 'replicas'"),
        (
            {"prefix_weight": 0, "load_weight": 0},
            r"cluster: prefix_weight and load_weight are both 0",
        ),
    ],
)
def test_bad_cluster_sections_are_refused_when_loading(cluster, message):
    with pytest.raises(ConfigError, match=message):
        validate_experiment(chat_data() | {"cluster": cluster}, CHAT)


def test_a_variant_override_is_checked_too():
    data = chat_data(replicas=2)
    data["variants"][1]["cluster"] = {"replicas": -1}
    with pytest.raises(ConfigError, match=r"variants\.1\.cluster\.replicas: Input should be greater than 0"):
        validate_experiment(data, CHAT)


def test_prefix_aware_with_a_policy_without_lookup_fails_before_any_simulation():
    data = chat_data(replicas=2, router="prefix_aware")
    data["variants"].append({"name": "paged", "policy": "paged", "cluster": {"router": "round_robin"}})
    data["variants"].append({"name": "contiguous", "policy": "contiguous"})
    config = validate_experiment(data, CHAT)
    with pytest.raises(ConfigError) as raised:
        prepare_experiment(config, CHAT)
    message = str(raised.value)
    assert "nothing was simulated" in message
    assert "variants.3 (contiguous): cluster.router: router 'prefix_aware'" in message
    assert "policy 'contiguous' has no prefix cache" in message
    assert "paged" not in message.split("\n", 1)[1]  # its own override picked round_robin


def test_cluster_config_defaults():
    assert ClusterConfig() == ClusterConfig(
        replicas=1, router="round_robin", prefix_weight=3.0, load_weight=2.0, host_weight=0.8
    )


def test_plan_probe_of_a_cluster_measures_shares_over_every_replica_pool():
    """A plan probe's steady-state shares come from the total series: over the two pools together,
    so the six breakdown shares still sum to 1."""
    data = chat_data(60, replicas=2, router="least_requests")
    data["variants"] = data["variants"][:1]
    outcome = run_point(PointTask("p", data, str(ROOT / "configs"), SteadyWindow(0.2, 0.1)))
    assert outcome.ok, outcome.error
    steady = outcome.summaries[0]["steady"]
    shares = [steady[summary_key(name)] for name in MemoryBreakdown.CATEGORIES]
    assert sum(shares) == pytest.approx(1.0)


class WatchingLeastKV(LeastKV):
    """``least_kv`` that notes the free slots it reads at every arrival."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, tuple[int, ...]]] = []

    def choose(self, request, replicas):
        self.seen.append((request.arrival_s, tuple(engine.kv.available_slots() for engine in replicas)))
        return super().choose(request, replicas)


def test_a_router_reading_the_pools_sees_what_single_steps_show_at_every_arrival():
    """Two replicas (blocks of 4, long outputs, so decode jumps take blocks inside them) behind
    ``least_kv``: at every arrival the free slots it reads are single stepping's, the blocks taken at
    the start of the iteration in progress included. (A jump that held the iteration an arrival falls
    in booked that iteration's blocks only when it landed, after the router had read the pool.)"""
    rng = random.Random(3)
    arrival = 0.0
    stream = []
    for index in range(40):
        arrival += rng.expovariate(0.6)
        stream.append(request(index, arrival, rng.randint(4, 30), rng.randint(20, 60)))
    seen = {}
    for mode in ("single", "skip"):
        pool = PoolSpec(4 * 120, 4, 256)

        def build(index, env, upstream, follow_up, mode=mode, pool=pool):
            return Engine(
                make_policy("paged", pool), RoundCostModel(per_seq_s=0.05), EngineKnobs(max_model_len=256, step_mode=mode),
                (), block_size=4, env=env, upstream=upstream, follow_up=follow_up,
            )  # fmt: skip

        router = WatchingLeastKV()
        cluster = Cluster(2, build, router, iter(stream))
        cluster.run()
        seen[mode] = router.seen
        if mode == "skip":
            assert sum(engine.jumps.with_growth for engine in cluster.replicas) > 0
    assert seen["skip"] == seen["single"]
