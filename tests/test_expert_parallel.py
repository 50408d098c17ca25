"""Data and expert parallelism for mixtures of experts (vLLM --data-parallel-size N
--enable-expert-parallel): per-GPU weights and KV pool, the routed-expert read of a rank against a
Monte Carlo count, the all-to-all, the DP ranks' shared step clock, the config's checks, the replay
mapping, and DP 1 without expert parallelism giving exactly what it gave before. Expected numbers are
worked out by hand in the comments."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import simpy

from calibrate.moe_layers import fit_routed_expert_bandwidth
from policies.base import PoolSpec, make_policy
from sim.cluster.cluster import Cluster
from sim.cluster.routers import RoundRobin, VllmDataParallel
from sim.config import ConfigError, validate_experiment
from sim.costs.core import CostModelError
from sim.costs.factory import make_cost_model
from sim.costs.terms import AllToAllCost, ExpertParallelCost, expected_distinct_experts
from sim.engine.core import Engine, EngineKnobs
from sim.engine.lockstep import LockstepGroup
from sim.hardware.capacity import size_kv_pool
from sim.hardware.gpus import GPU_PRESETS, RTX_PRO_6000_ROUTED_EXPERT_BANDWIDTH, GpuSpec, resolve_gpu
from sim.hardware.models import MODEL_PRESETS, expert_parallel_problems
from sim.replay.readers import read_llmservingsim_bench
from sim.replay.simulate import experiment_data
from sim.replay.spec import validate_replay_spec
from sim.runner import prepare_experiment, run_experiment
from tests.engine_helpers import RoundCostModel, request
from tests.test_moe import HALF, TINY_MOE

ROOT = Path(__file__).resolve().parents[1]
QWEN_MOE = MODEL_PRESETS["Qwen3-30B-A3B"]
QWEN_RUN = (
    ROOT / "reference_runs/llmservingsim-vllm-0.19/bench/examples/RTXPRO6000/Qwen3-30B-A3B-Instruct-2507"
)
# The measured run's GPU, as configs/replays/rtxpro6000-qwen3-30b-a3b-dp2.yaml gives it.
RTX_PRO_SERVER = {
    "base": "RTX-PRO-6000-96GB",
    "name": "RTX-PRO-6000-Server",
    "hbm_bandwidth_gb_per_s": 1597.6,
    "memory_bytes": 101_976_440_832,
}


def approx(value: float) -> object:
    return pytest.approx(value, rel=1e-12, abs=0.0)


# ----------------------------------------------------------------------------------- capacity


def test_tiny_moe_weights_and_pool_per_gpu_at_ep_2_by_hand() -> None:
    # TINY_MOE: 452 params, 2 bytes each = 904 B; its one MoE layer holds 4 routed experts of 24
    # params = 96 params = 192 B. EP 2 keeps 2 whole experts (96 B) and the other 712 B whole:
    # 712 + 96 = 808 B per GPU. KV: 2 x 2 layers x 1 head x 2 dims x 2 B = 16 B a token, 256 B a block.
    assert TINY_MOE.weight_bytes_per_gpu(1) == 904
    assert TINY_MOE.weight_bytes_per_gpu(1, expert_parallel_size=2) == 808
    # EP 4 (DP 2 x TP 2): the rest split over TP 2 (356 B), one expert (48 B) per GPU: 404 B.
    assert TINY_MOE.weight_bytes_per_gpu(2, expert_parallel_size=4) == 356 + 48
    # 9,768 B of memory, all of it for the engine, no activation reserve: EP 2 leaves 9,768 - 808 =
    # 8,960 B = 35 blocks exactly; without, 8,864 B: 34 blocks (8,704 B) and 160 B unused.
    gpu = GpuSpec("tiny", 9_768, 1e3, 1e4, HALF)
    common = {"gpu_memory_utilization": 1.0, "activation_reserve_bytes": 0}
    with_ep = size_kv_pool(TINY_MOE, gpu, expert_parallel_size=2, data_parallel_size=2, **common)
    without = size_kv_pool(TINY_MOE, gpu, **common)
    assert (with_ep.weight_bytes, with_ep.available_kv_bytes, with_ep.num_gpu_blocks) == (808, 8_960, 35)
    assert (without.weight_bytes, without.available_kv_bytes, without.num_gpu_blocks) == (904, 8_864, 34)
    assert with_ep.kv_pool_tokens == 560
    assert with_ep.capacity_lines(256)[2] == (
        "data_parallel_size 2 (a pool per rank), routed experts dealt over 2 GPUs, per GPU: weights 0.00 GiB, "
        "activation reserve 0.00 GiB, KV cache 0.00 GiB (16 B per token)"
    )


def test_the_measured_runs_pool_per_rank_by_hand() -> None:
    # Qwen3-30B-A3B: routed experts 48 layers x 128 x 3 x 2048 x 768 = 28,991,029,248 params; the
    # rest 30,532,122,624 - 28,991,029,248 = 1,541,093,376 params. EP 2 per GPU: 2 x 1,541,093,376 +
    # 28,991,029,248 (half the experts at 2 B) = 32,073,216,000 B (today's replicas held 61,064,245,248).
    assert QWEN_MOE.routed_expert_params == 28_991_029_248
    assert QWEN_MOE.weight_bytes_per_gpu(1, expert_parallel_size=2) == 32_073_216_000
    # Budget ceil(0.9 x 101,976,440,832) = 91,778,796,749; activation reserve (sim/hardware/capacity.py)
    # 8192 x (3 x 6144 + (32 + 2 x 4) x 128 + 4 x 2048) x 2 + 256 x 151,936 x 4 = 675,676,160.
    # KV: 91,778,796,749 - 32,073,216,000 - 675,676,160 = 59,029,904,589 B over 16 x 98,304 B blocks:
    # 37,530 blocks = 600,480 tokens per rank (two full replicas: 19,098 blocks, 305,568 tokens).
    capacity = size_kv_pool(
        QWEN_MOE, resolve_gpu(RTX_PRO_SERVER), expert_parallel_size=2, data_parallel_size=2
    )
    assert capacity.weight_bytes == 32_073_216_000
    assert capacity.activation_reserve_bytes == 675_676_160
    assert capacity.available_kv_bytes == 59_029_904_589
    assert (capacity.num_gpu_blocks, capacity.kv_pool_tokens) == (37_530, 600_480)
    replica = size_kv_pool(QWEN_MOE, resolve_gpu(RTX_PRO_SERVER))
    assert (replica.num_gpu_blocks, replica.kv_pool_tokens) == (19_098, 305_568)


@pytest.mark.parametrize(
    ("model", "dp", "tp", "ep", "knob", "words"),
    [
        (
            MODEL_PRESETS["Llama-3.1-8B"],
            2,
            1,
            True,
            "enable_expert_parallel",
            "Llama-3.1-8B is a dense model",
        ),
        # 128 mod 3 = 2: vLLM would give two GPUs 43 experts and one 42
        (
            QWEN_MOE,
            3,
            1,
            True,
            "enable_expert_parallel",
            "= 3 x 1 = 3, does not divide Qwen3-30B-A3B's 128 routed",
        ),
        (QWEN_MOE, 3, 1, True, "enable_expert_parallel", "vLLM would give 2 GPU(s) one expert more"),
        (QWEN_MOE, 2, 1, False, "data_parallel_size", "splits every expert tensor-parallel over all 2 GPUs"),
    ],
)
def test_parallelism_kvsim_does_not_run_is_named(model, dp, tp, ep, knob, words) -> None:
    problems = expert_parallel_problems(model, dp, tp, ep)
    assert len(problems) == 1
    assert problems[0][0] == knob
    assert words in problems[0][1]


def test_parallelism_kvsim_runs_has_no_problem() -> None:
    assert expert_parallel_problems(QWEN_MOE, 2, 1, True) == []
    assert expert_parallel_problems(QWEN_MOE, 4, 2, True) == []  # EP 8 divides 128
    assert expert_parallel_problems(MODEL_PRESETS["Llama-3.1-8B"], 2, 1, False) == []  # dense DP: replicas
    assert expert_parallel_problems(QWEN_MOE, 1, 2, False) == []  # one server, experts TP-split


# --------------------------------------------------------------------------- a rank's experts


@pytest.mark.parametrize(
    ("tokens", "num_experts", "per_token", "ranks"), [(3, 8, 3, 2), (16, 128, 8, 2), (40, 128, 8, 4)]
)
def test_a_ranks_expert_reads_against_monte_carlo(
    tokens: int, num_experts: int, per_token: int, ranks: int
) -> None:
    """Each of ``tokens`` tokens (all ranks' together) draws ``per_token`` distinct experts of
    ``num_experts`` uniformly; rank 0 holds experts 0 .. E/ranks - 1 and reads those that any token
    chose. With 40,000 trials a 5-sigma band tells the expectation from two near misses: the
    with-replacement count over the rank's experts, and the count over the rank's own tokens only."""
    local = num_experts // ranks
    cost = ExpertParallelCost(num_experts, per_token, local, 1.0, 0.0, AllToAllCost())
    rng = np.random.default_rng(20261201)
    trials = 40_000
    keys = rng.random((trials, tokens, num_experts))
    chosen = np.argpartition(keys, per_token - 1, axis=-1)[..., :per_token]
    touched = np.zeros((trials, num_experts), dtype=bool)
    touched[np.arange(trials)[:, None, None], chosen] = True
    local_touched = touched[:, :local].sum(axis=1)
    local_pairs = (chosen < local).sum(axis=(1, 2))
    mean, standard_error = local_touched.mean(), local_touched.std(ddof=1) / math.sqrt(trials)
    expected = cost.step_s(tokens)  # expert_read_s 1 s, no FLOPs, no all-to-all: the experts read
    assert abs(mean - expected) < 5 * standard_error
    with_replacement = local * (1 - (1 - 1 / local) ** (tokens * per_token / ranks))
    own_tokens_only = expected_distinct_experts(tokens / ranks, num_experts, per_token) * local / num_experts
    for near_miss in (with_replacement, own_tokens_only):
        assert abs(mean - near_miss) > 5 * standard_error
    # the (token, local expert) pairs the rank multiplies: tokens x k x local / E on average
    pairs_error = local_pairs.std(ddof=1) / math.sqrt(trials)
    assert abs(local_pairs.mean() - tokens * per_token * local / num_experts) < 5 * pairs_error


def test_shared_part_and_all_to_all_by_hand() -> None:
    # A GPU of 1,000 B/s peak, 10^4 FLOP/s, 128 GB/s of PCIe (64 GB/s a direction), every share 0.5;
    # TINY_MOE at DP 2, EP 2: 2 of 4 experts per GPU, 1 MoE layer.
    gpu = GpuSpec("unit", 2**30, 1e3, 1e4, HALF, pcie_bandwidth_bytes_per_s=128e9)
    rank = make_cost_model(
        {"kind": "derated", "calibration": "none"},
        TINY_MOE,
        gpu,
        block_size=16,
        data_parallel_size=2,
        expert_parallel_size=2,
    )
    shared = rank.expert_parallel
    assert shared is not None
    # one expert (24 params, 48 B) read at 500 B/s: 0.096 s; one token's FLOPs on the rank:
    # 2 x 2 experts/token x 2/4 local x 24 params = 48 FLOPs at 5,000 FLOP/s = 0.0096 s
    assert (shared.local_experts, shared.expert_read_s) == (2, approx(0.096))
    assert shared.routed_flops_per_token_s == approx(0.0096)
    # dispatch + combine, 1 MoE layer: 2 calls x 10 us x log2(2) = 20 us; per token 1/2 x (2 x 4 hidden
    # + 4 router logits) x 2 B = 12 B over 64 GB/s = 1.875e-10 s
    a2a = shared.all_to_all
    assert (a2a.per_iteration_s, a2a.per_token_s) == (approx(20e-6), approx(12 / 64e9))
    # 3 tokens: 2 x (1 - (2/4)^3) = 1.75 local experts read; hypot(1.75 x 0.096, 3 x 0.0096) + a2a
    assert shared.step_s(3) == approx(math.hypot(0.168, 0.0288) + 20e-6 + 3 * 12 / 64e9)
    assert shared.step_s(0) == 0.0
    # The rank's own iteration reads no routed expert (the shared part does): one decode token costs
    # it less than the replica that reads the two experts the token chose.
    replica = make_cost_model({"kind": "derated", "calibration": "none"}, TINY_MOE, gpu, block_size=16)
    assert replica.expert_parallel is None
    assert rank.iteration_s(1, 16) < replica.iteration_s(1, 16)


def test_the_rtx_pro_6000s_routed_expert_share_is_the_fit_to_the_measured_layers() -> None:
    share, shapes = fit_routed_expert_bandwidth()
    assert round(share, 3) == RTX_PRO_6000_ROUTED_EXPERT_BANDWIDTH == 0.840
    assert len(shapes) == 24  # 12 token counts x EP 1 and 2
    assert shapes["error"].min() > -0.23 and shapes["error"].max() < 0.18
    # the derated rank reads its experts at that share: at EP 2 over 256 tokens, per MoE layer,
    # 64 x (1 - (120/128)^256) experts x 9,437,184 B at 1,597.6 GB/s x 0.840 in quadrature with
    # 1,024 (token, expert) pairs x 2 x 4,718,592 FLOPs at 503.8 TFLOP/s x 0.694 (about 450.9 us
    # against the 445.3 us measured), times 48 layers, plus the all-to-all
    rank = make_cost_model(
        "derated",
        QWEN_MOE,
        resolve_gpu(RTX_PRO_SERVER),
        block_size=16,
        data_parallel_size=2,
        expert_parallel_size=2,
    )
    shared = rank.expert_parallel
    assert shared is not None
    touched = 64 * (1 - (120 / 128) ** 256)
    layer_s = math.hypot(touched * 9_437_184 / (1597.6e9 * 0.840), 1024 * 2 * 4_718_592 / (503.8e12 * 0.694))
    assert layer_s == pytest.approx(450.9e-6, rel=1e-3)
    assert shared.step_s(256) - shared.all_to_all.seconds(256) == pytest.approx(48 * layer_s, rel=1e-12)


def test_expert_parallelism_needs_the_derated_model() -> None:
    with pytest.raises(CostModelError, match="derated cost model only"):
        make_cost_model("analytic", QWEN_MOE, GPU_PRESETS["A100-80GB"], block_size=16, expert_parallel_size=2)


# -------------------------------------------------------------------------------- lockstep


def lockstep_cluster(stream, shared_s) -> Cluster:
    """Two ranks behind round robin; own iteration = 1 s + 0.01 s per prefill token (RoundCostModel)."""
    pool = PoolSpec(4096, 16, 512)
    groups: list[LockstepGroup] = []

    def build(index, env, upstream, follow_up):
        if not groups:
            groups.append(LockstepGroup(env, 2, shared_s))
        return Engine(
            make_policy("paged", pool), RoundCostModel(), EngineKnobs(max_model_len=512, step_mode="single"), (),
            env=env, upstream=upstream, follow_up=follow_up, lockstep=groups[0],
        )  # fmt: skip

    cluster = Cluster(2, build, RoundRobin(), iter(stream))
    cluster.run()
    return cluster


def outcomes(cluster: Cluster) -> dict[int, tuple[float, float]]:
    return {
        record.request_id: (record.first_token_s, record.finish_s)
        for engine in cluster.replicas
        for record in engine.records
    }


def test_ranks_step_together_as_long_as_the_slowest_plus_the_shared_part() -> None:
    # shared part = 0.5 s + 0.1 s per token of both ranks (an idle rank's dummy batch adds 1 token).
    # t = 0: rank 0 prefills 100 tokens (own 1 + 1.0 = 2.0 s), rank 1 10 tokens (1.1 s):
    #   2.0 + 0.5 + 0.1 x 110 = 13.5 s -> both first tokens at 13.5
    # t = 13.5: both decode one token (own 1 s): 1 + 0.5 + 0.1 x 2 = 1.7 -> 15.2, request 1 done
    # t = 15.2: rank 0 decodes, rank 1 runs a dummy batch: 1 + 0.5 + 0.1 x 2 = 1.7 -> 16.9, request 0 done
    stream = [request(0, 0.0, 100, 3), request(1, 0.0, 10, 2)]
    cluster = lockstep_cluster(stream, lambda tokens: 0.5 + 0.1 * tokens)
    times = outcomes(cluster)
    assert times[0] == (approx(13.5), approx(16.9))
    assert times[1] == (approx(13.5), approx(15.2))


def test_a_rank_given_work_mid_step_starts_at_the_next_boundary() -> None:
    # t = 0: rank 0 prefills 100 tokens alone (own 2 s), rank 1 idle (dummy token):
    #   2 + 0.5 + 0.1 x 101 = 12.6 s. Request 1 reaches rank 1 at t = 1 and waits for 12.6.
    # t = 12.6: rank 0 decodes (own 1 s), rank 1 prefills 10 tokens (own 1.1 s):
    #   1.1 + 0.5 + 0.1 x 11 = 2.7 -> 15.3: request 0's second token and request 1's only one.
    stream = [request(0, 0.0, 100, 2), request(1, 1.0, 10, 1)]
    cluster = lockstep_cluster(stream, lambda tokens: 0.5 + 0.1 * tokens)
    times = outcomes(cluster)
    assert times[0] == (approx(12.6), approx(15.3))
    assert times[1] == (approx(15.3), approx(15.3))


def test_a_rank_prefilling_two_prompts_exchanges_both_prompts_tokens() -> None:
    # Round robin: requests 0 and 2 go to rank 0, request 1 to rank 1; one output token each.
    # t = 0: rank 0 prefills 100 + 50 tokens in one iteration (own 1 + 1.5 = 2.5 s), rank 1 10 tokens
    #   (1.1 s): 2.5 + 0.5 + 0.1 x (150 + 10) = 19.0 s -> every first (and last) token at 19.0
    stream = [request(0, 0.0, 100, 1), request(1, 0.0, 10, 1), request(2, 0.0, 50, 1)]
    cluster = lockstep_cluster(stream, lambda tokens: 0.5 + 0.1 * tokens)
    assert outcomes(cluster) == {
        0: (approx(19.0), approx(19.0)),
        1: (approx(19.0), approx(19.0)),
        2: (approx(19.0), approx(19.0)),
    }


def test_the_group_s_steps_and_dummy_batches_by_hand() -> None:
    """The group alone, with two stand-in ranks of a group of three; shared part 0.5 s + 0.1 s per
    token of all ranks, an idle rank adding its one dummy token:
    t = 0:    a (own 2.0 s, 100 tokens) and b (own 1.1 s, 10 tokens) join; one rank idle:
              2.0 + 0.5 + 0.1 x 111 = 13.6 s, the step ends at 13.6 for both
    t = 13.6: a alone with no tokens (nothing to exchange): its own 1.0 s, no shared part -> 14.6
    t = 14.6: b alone with 1 token: 1.0 + 0.5 + 0.1 x (1 + 2 dummy) = 1.8 s -> 16.4
    Three steps, in which 1 + 2 + 2 = 5 (rank, step) pairs ran a dummy batch."""

    env = simpy.Environment()
    group = LockstepGroup(env, 3, lambda tokens: 0.5 + 0.1 * tokens)
    a, b = SimpleNamespace(busy_until=None), SimpleNamespace(busy_until=None)
    assert (group.steps, group.dummy_rank_steps, group.in_flight()) == (0, 0, False)
    seen = []

    def ranks():
        step = group.join(a, 2.0, 100)
        assert group.join(b, 1.1, 10) is step  # the same step
        yield step
        seen.append(("end", env.now, group.in_flight(), a.busy_until, b.busy_until))
        yield group.join(a, 1.0, 0)
        seen.append(("end", env.now, a.busy_until))
        yield group.join(b, 1.0, 1)
        seen.append(("end", env.now, b.busy_until))

    def watcher():
        yield env.timeout(5.0)
        seen.append(("mid", group.in_flight(), group.boundary().triggered))

    env.process(ranks())
    env.process(watcher())
    env.run()
    assert seen == [
        ("mid", True, False),
        ("end", approx(13.6), False, approx(13.6), approx(13.6)),
        ("end", approx(14.6), approx(14.6)),
        ("end", approx(16.4), approx(16.4)),
    ]
    assert (group.steps, group.dummy_rank_steps) == (3, 5)


def test_a_group_needs_a_rank() -> None:
    LockstepGroup(simpy.Environment(), 1, lambda tokens: 0.0)  # one rank: expert parallelism over TP
    with pytest.raises(ValueError, match="needs at least one rank, got 0"):
        LockstepGroup(simpy.Environment(), 0, lambda tokens: 0.0)


def test_vllm_data_parallel_balancer_weighs_waiting_four_times() -> None:
    def rank(running: int, waiting: int):
        return type("Rank", (), {"running": [None] * running, "waiting": [None] * waiting})()

    # scores 4 x 1 + 0 = 4, 4 x 0 + 3 = 3, 4 x 0 + 3 = 3: the first of the two lowest
    assert VllmDataParallel().choose(None, [rank(0, 1), rank(3, 0), rank(3, 0)]) == 1  # type: ignore[arg-type]
    # least_requests would tie 1 waiting with 1 running; vllm_dp takes the running one
    assert VllmDataParallel().choose(None, [rank(0, 1), rank(1, 0)]) == 1  # type: ignore[arg-type]


# --------------------------------------------------------------------------- config and runs


def experiment(model: str, gpu, engine: dict, **extra) -> dict:
    return {
        "name": "ep",
        "seed": 3,
        "model": model,
        "gpu": gpu,
        "engine": {"max_model_len": 4096, "max_num_seqs": 64, "max_num_batched_tokens": 2048} | engine,
        "workload": {
            "num_requests": 80,
            "arrival": {"kind": "poisson", "rate_per_s": 8.0},
            "prompt_len": {"kind": "uniform", "low": 100, "high": 1500},
            "output_len": {"kind": "uniform", "low": 20, "high": 300},
        },
        "variants": [{"name": "prefix", "policy": "prefix"}],
        "output": {"figures": False},
    } | extra


def run_summary(data: dict, tmp_path: Path) -> dict:
    config = validate_experiment(data, tmp_path / "ep.yaml")
    return run_experiment(config, tmp_path / "ep.yaml")[0].summary


# What the committed code before data and expert parallelism (88c8035) gave for these two runs, checked
# equal when data and expert parallelism landed, and re-pinned since with every change of the costs:
# last on 2026-12-05, when shared K/V blocks came to be read once a step and the serving terms were
# refitted with it (issue 37; these runs share no prompt: the refit moved them); the code path of DP 1
# without EP did not change. No async scheduling: off here. Re-pinned on 2026-12-07, when the derated
# model's fits came to give the same bits on every machine (sim/costs/least_squares.py): the MoE run
# moved in its last bits (at most 1e-15 relative).
BEFORE = {
    ("Qwen3-30B-A3B", "A100-80GB", 1): {
        "kv_pool_tokens": 158368,
        "iterations": 515,
        "simulated_s": 16.774041863612354,
        "ttft_p50_s": 0.09085421176331056,
        "e2e_p99_s": 11.8351944922492,
        "tpot_p50_s": 0.040270217187320344,
        "output_tokens_per_s": 801.1783986990635,
    },
    ("Llama-3.1-8B", "H100-80GB", 2): {
        "kv_pool_tokens": 1044864,
        "iterations": 2329,
        "simulated_s": 9.97062759193888,
        "ttft_p50_s": 0.023252150357266813,
        "e2e_p99_s": 1.297702585877329,
        "tpot_p50_s": 0.004337029918781156,
        "output_tokens_per_s": 1347.8589864157852,
    },
}


@pytest.mark.parametrize(("model", "gpu", "tp"), list(BEFORE))
def test_dp_1_without_expert_parallelism_gives_what_it_gave_before(model, gpu, tp, tmp_path) -> None:
    engine = {"tensor_parallel_size": tp, "data_parallel_size": 1, "enable_expert_parallel": False}
    summary = run_summary(experiment(model, gpu, engine | {"async_scheduling": False}), tmp_path)
    assert {key: summary[key] for key in BEFORE[model, gpu, tp]} == BEFORE[model, gpu, tp]
    assert (summary["data_parallel_size"], summary["expert_parallel_size"]) == (1, 1)


def test_a_dense_models_data_parallel_ranks_are_replicas_behind_vllms_balancer(tmp_path) -> None:
    ranks = run_summary(experiment("Llama-3.1-8B", "A100-80GB", {"data_parallel_size": 2}), tmp_path / "dp")
    replicas = run_summary(
        experiment("Llama-3.1-8B", "A100-80GB", {}, cluster={"replicas": 2, "router": "vllm_dp"}),
        tmp_path / "c",
    )
    same = ("iterations", "simulated_s", "ttft_p50_s", "e2e_p99_s", "kv_pool_tokens", "router")
    assert {key: ranks[key] for key in same} == {key: replicas[key] for key in same}
    assert ranks["data_parallel_size"] == 2 and ranks["router"] == "vllm_dp"


def test_an_expert_parallel_run_writes_its_ranks_and_pool(tmp_path) -> None:
    data = experiment(
        "Qwen3-30B-A3B", RTX_PRO_SERVER, {"data_parallel_size": 2, "enable_expert_parallel": True}
    )
    config = validate_experiment(data, tmp_path / "ep.yaml")
    prepared = prepare_experiment(config, tmp_path / "ep.yaml")
    assert prepared.variants[0].lockstep
    result = run_experiment(config, tmp_path / "ep.yaml", prepared=prepared)[0]
    summary = result.summary
    assert (summary["data_parallel_size"], summary["expert_parallel_size"]) == (2, 2)
    assert summary["kv_pool_tokens"] == 600_480  # as worked out above, per rank
    assert summary["requests_finished"] == 80
    assert len(result.replica_summaries) == 2 and summary["router"] == "vllm_dp"
    assert "EP 2: 64 of 128 routed experts per GPU" in summary["cost_model"]
    assert result.capacity_lines[0] == "GPU KV cache size: 600,480 tokens"


def test_expert_parallelism_over_one_servers_tp_group(tmp_path) -> None:
    # TP 2 with and without EP hold the same bytes per GPU (half of every expert, or half of the
    # experts whole: 30,532,122,624 B either way), so the same pool; with EP the server is a
    # lockstep group of one rank, stepped one iteration at a time (a wake-up per iteration).
    split = run_summary(
        experiment("Qwen3-30B-A3B", "A100-80GB", {"tensor_parallel_size": 2}), tmp_path / "tp"
    )
    dealt = run_summary(
        experiment("Qwen3-30B-A3B", "A100-80GB", {"tensor_parallel_size": 2, "enable_expert_parallel": True}),
        tmp_path / "ep",
    )
    assert QWEN_MOE.weight_bytes_per_gpu(2) == QWEN_MOE.weight_bytes_per_gpu(2, expert_parallel_size=2)
    assert dealt["kv_pool_tokens"] == split["kv_pool_tokens"]
    assert (dealt["data_parallel_size"], dealt["expert_parallel_size"]) == (1, 2)
    assert dealt["iterations"] == dealt["engine_wakeups"] > split["engine_wakeups"]
    assert "EP 2: 64 of 128 routed experts per GPU" in dealt["cost_model"]


@pytest.mark.parametrize(
    ("engine", "extra", "words"),
    [
        (
            {"enable_expert_parallel": True},
            {"model": "Llama-3.1-8B"},
            "engine.enable_expert_parallel: Llama-3.1-8B is a dense",
        ),
        (
            {"data_parallel_size": 3, "enable_expert_parallel": True},
            {},
            "engine.enable_expert_parallel: the expert-parallel size",
        ),
        (
            {"data_parallel_size": 2},
            {},
            "engine.data_parallel_size: 2 on Qwen3-30B-A3B, a mixture of experts",
        ),
        (
            {"data_parallel_size": 2, "enable_expert_parallel": True},
            {"cluster": {"replicas": 2}},
            "a cluster: section of such servers",
        ),
        (
            {"data_parallel_size": 2, "enable_expert_parallel": True},
            {"cost_model": "analytic"},
            "derated cost model only",
        ),
    ],
)
def test_bad_parallelism_is_refused_before_anything_runs(engine, extra, words, tmp_path) -> None:
    data = experiment("Qwen3-30B-A3B", "A100-80GB", engine) | extra
    config = validate_experiment(data, tmp_path / "ep.yaml")
    with pytest.raises(ConfigError, match="nothing was simulated") as error:
        prepare_experiment(config, tmp_path / "ep.yaml")
    assert words in str(error.value)


def test_a_variants_override_is_named_by_its_key(tmp_path) -> None:
    data = experiment("Qwen3-30B-A3B", "A100-80GB", {})
    data["variants"] = [{"name": "dp", "policy": "prefix", "engine": {"data_parallel_size": 2}}]
    config = validate_experiment(data, tmp_path / "ep.yaml")
    with pytest.raises(ConfigError, match=r"variants\.0\.engine\.data_parallel_size: 2 on Qwen3-30B-A3B"):
        prepare_experiment(config, tmp_path / "ep.yaml")


# ------------------------------------------------------------------------------------- replay


def test_the_replay_maps_data_parallel_size_and_expert_parallelism_to_the_engine() -> None:
    run = read_llmservingsim_bench(QWEN_RUN)
    # vllm/meta.json: "data_parallel_size": 2, "enable_expert_parallel": true, "tensor_parallel_size": 1
    assert (run.settings.data_parallel_size, run.settings.enable_expert_parallel) == (2, True)
    spec = validate_replay_spec(
        {
            "name": "qwen",
            "run": {"format": "llmservingsim_bench", "path": str(QWEN_RUN)},
            "gpu": RTX_PRO_SERVER,
        },
        "qwen.yaml",
    )
    data = experiment_data(run, spec)
    engine = data["engine"]
    assert (
        engine["data_parallel_size"],
        engine["enable_expert_parallel"],
        engine["tensor_parallel_size"],
    ) == (2, True, 1)
    assert "cluster" not in data  # the DP ranks come from the engine section, behind vLLM's balancer
