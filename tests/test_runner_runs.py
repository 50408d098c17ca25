"""``sim/runner/``'s runs: who may watch a run (and stop it), the wall time a run reports, a cluster
stopped by ``until_s``, and the summary's pool figures read from the engine's KV memory. Every
expected value is worked out by hand in the comments."""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest

from sim.config import ConfigError, validate_experiment
from sim.runner import prepare_experiment, run_experiment, run_prepared, run_variant
from tests.test_runner import NAN, fake_engine, summary_for, tiny_experiment


class StopAt:
    """A :class:`sim.runner.RunWatch` that stops the run at ``at_s`` and records what it was shown."""

    def __init__(self, at_s: float):
        self.at_s = at_s
        self.arrivals: list[int] = []
        self.begun_with: list[int] | None = None

    def arrived(self, record) -> None:
        self.arrivals.append(record.request_id)

    def begin(self, engine, requests):
        self.begun_with = [request.request_id for request in requests]
        return engine.env.timeout(self.at_s)

    def outcome(self):
        return {"at_s": self.at_s}


def run_watched(data: dict, watch: StopAt):
    config = validate_experiment(data)
    (result,) = run_experiment(config, Path("experiment.yaml"), watch=lambda: watch)
    return result


def test_a_watch_sees_every_arrival_of_a_plain_run_and_may_stop_it():
    # 4 requests arrive together at 0; the watch stops the run at 1 ms, before any has finished
    # (a 64-token prompt and 4 output tokens take longer: test_runner's until_s=0.001 run, the same).
    watch = StopAt(0.001)
    result = run_watched(tiny_experiment(), watch)
    assert watch.begun_with == [0, 1, 2, 3]
    assert sorted(watch.arrivals) == [0, 1, 2, 3]
    assert (result.name, result.stopped_early) == ("v", {"at_s": 0.001})
    assert (result.summary["requests_unfinished"], result.summary["simulated_s"]) == (4, 0.001)


class Declines(StopAt):
    """A watch that leaves the run alone (no stop event), though it would name a reason if asked."""

    def begin(self, engine, requests):
        super().begin(engine, requests)


def test_a_watch_that_declines_leaves_the_run_to_its_end():
    watch = Declines(0.001)
    result = run_watched(tiny_experiment(), watch)
    assert watch.begun_with == [0, 1, 2, 3]
    assert (result.stopped_early, result.summary["requests_finished"]) == (None, 4)


def pinned() -> dict:
    data = tiny_experiment()
    data["workload"]["shared_prefix"] = {"num_prefixes": 2, "prefix_len": 48}
    data["variants"] = [{"name": "v", "policy": "prefix", "pin_shared_prefixes": True}]
    return data


def closed_loop() -> dict:
    data = tiny_experiment()
    data["workload"]["arrival"] = {"kind": "closed_loop", "num_users": 2}
    return data


def test_no_watch_is_shown_a_run_cut_short_or_whose_arrivals_are_not_known_up_front():
    """``until_s`` cuts the run, pinned prefixes change what a request finds, a closed loop's next
    arrivals depend on the run: the watch is never begun, and the run goes to its own end."""
    for data, unfinished in [
        (tiny_experiment(until_s=0.001), 4),  # stopped by until_s, not by the watch: all 4 in flight
        (pinned(), 0),
        (closed_loop(), 0),
    ]:
        watch = StopAt(0.001)
        result = run_watched(data, watch)
        assert (watch.begun_with, watch.arrivals, result.stopped_early) == (None, [], None)
        assert result.summary["requests_unfinished"] == unfinished
    # (The pinned run did pin: 2 prompts of 48 tokens, 3 blocks of 16 each, 96 slots.)
    assert result_of(pinned()).summary["pinned_tokens"] == 96


def result_of(data: dict):
    config = validate_experiment(data)
    prepared = prepare_experiment(config, Path("experiment.yaml"))
    return run_prepared(config, prepared.variants[0], prepared.workload)


def test_until_s_stops_a_cluster_and_its_wall_time_is_measured_inside_the_call(tmp_path):
    # Three replicas, round robin: requests 0 and 3 go to replica 0, 1 to replica 1, 2 to replica 2;
    # at 1 ms all 4 are still in flight (test_runner's until_s=0.001 run of a single engine).
    data = tiny_experiment(until_s=0.001, cluster={"replicas": 3, "router": "round_robin"})
    config = validate_experiment(data)
    prepared = prepare_experiment(config, Path("experiment.yaml"))
    before = time.perf_counter()
    result = run_prepared(config, prepared.variants[0], prepared.workload, out_dir=tmp_path)
    elapsed = time.perf_counter() - before
    summary = result.summary
    assert result.name == "v"
    assert sorted(path.name for path in (tmp_path / "v").iterdir()) == [
        "replica_timeseries.parquet",
        "requests.parquet",
        "timeseries.parquet",
    ]
    assert pd.read_parquet(tmp_path / "v" / "replica_timeseries.parquet").equals(result.replica_timeseries)
    assert (summary["requests_unfinished"], summary["simulated_s"]) == (4, 0.001)
    rows = result.replica_summaries
    assert [(row["replica"], row["role"], row["requests_routed"]) for row in rows] == [
        (0, "both", 2),
        (1, "both", 1),
        (2, "both", 1),
    ]
    assert [(row["requests_total"], row["requests_unfinished"]) for row in rows] == [(2, 2), (1, 1), (1, 1)]
    assert sorted(result.requests["replica"]) == [0, 0, 1, 2]
    assert sorted(set(result.replica_timeseries["replica"])) == [0, 1, 2]
    # The cluster's series over the three pools of 458,096 slots (1,374,288): at the end the four
    # 64-token prompts hold 4 x 64 = 256 of them, nothing cached.
    last = result.timeseries.iloc[-1]
    assert (last["used_tokens"], last["free_tokens"]) == (256, 3 * 458_096 - 256)
    assert last["kv_cache_usage_perc"] == pytest.approx(256 / 1_374_288, rel=1e-12)
    assert 0.0 <= summary["wall_s"] <= elapsed
    assert all(row["wall_s"] == summary["wall_s"] for row in rows)


def test_a_clusters_closed_loop_users_send_every_request():
    """2 users, 6 requests over 2 replicas: only the users' first requests are in the stream up front;
    the other 4 are each sent when its user's previous one finishes, on whichever replica."""
    data = closed_loop()
    data["workload"]["num_requests"] = 6
    data["cluster"] = {"replicas": 2, "router": "round_robin"}
    summary = result_of(data).summary
    assert summary["requests_total"] == summary["requests_finished"] == 6


def disaggregated() -> dict:
    """Closed-loop users (2 users, 6 requests) on a prefill pool of one replica with 1,000 blocks of
    16 (16,000 slots) and a decode pool of two replicas of the A100-80GB's 458,096 slots each
    (test_runner's sizing), both routed prefix_aware."""
    data = closed_loop()
    data["workload"]["num_requests"] = 6
    pools = {
        "prefill": {"replicas": 1, "router": "prefix_aware", "engine": {"num_gpu_blocks_override": 1000}},
        "decode": {"replicas": 2, "router": "prefix_aware"},
    }
    data["variants"] = [{"name": "pd", "policy": "prefix", "cluster": {"disaggregation": pools}}]
    return data


def test_a_disaggregated_run_books_each_pool_and_replica_apart(tmp_path):
    config = validate_experiment(disaggregated())
    prepared = prepare_experiment(config, Path("experiment.yaml"))
    before = time.perf_counter()
    result = run_prepared(config, prepared.variants[0], prepared.workload, out_dir=tmp_path)
    elapsed = time.perf_counter() - before
    assert sorted(path.name for path in (tmp_path / "pd").iterdir()) == [
        "replica_timeseries.parquet",
        "requests.parquet",
        "timeseries.parquet",
        "transfer_timeseries.parquet",
    ]
    summary = result.summary
    assert (result.name, summary["variant"]) == ("pd", "pd")
    # Every request finished, the 4 follow-ups sent as their users' previous requests finished; every
    # one was prefilled on replica 0 and sent over the link (the decider's default: always). Its
    # decode replica: the first (prefix_aware ties go to the first, and a request reaches its decode
    # replica only once its prompt is done, so both replicas look idle to the router).
    assert summary["requests_total"] == summary["requests_finished"] == 6
    assert summary["requests_disaggregated"] == 6
    requests = result.requests
    assert (set(requests["prefill_replica"]), set(requests["replica"])) == ({0}, {1})
    assert summary["router"] == "prefill prefix_aware, decode prefix_aware"
    assert summary["replicas"] == 3
    # The variant's summary is its decode pool's; the prefill pool's own figures beside it.
    assert (summary["kv_pool_tokens"], summary["prefill_kv_pool_tokens"]) == (458_096, 16_000)
    rows = [
        (row["variant"], row["kv_pool_tokens"], row["requests_total"], row["replica"], row["role"])
        for row in result.replica_summaries
    ]
    assert rows == [
        ("pd-prefill", 16_000, 6, 0, "prefill"),
        ("pd", 458_096, 6, 1, "decode"),
        ("pd", 458_096, 0, 2, "decode"),
    ]
    assert [row["requests_routed"] for row in result.replica_summaries] == [6, 6, 0]
    assert 0.0 <= summary["wall_s"] <= elapsed
    assert all(row["wall_s"] == summary["wall_s"] for row in result.replica_summaries)
    assert result.capacity_lines == [
        "prefill pool: GPU KV cache size: 16,000 tokens",
        "prefill pool: Maximum concurrency for 1,024 tokens per request: 15.62x",  # 16,000 / 1,024
        "decode pool: GPU KV cache size: 458,096 tokens",
        "decode pool: Maximum concurrency for 1,024 tokens per request: 447.36x",
        "link: rdma: 50 GB/s per GPU one way, 20 us latency, shared by prefill",
    ]
    # The cluster's series over the three pools: 16,000 + 2 x 458,096 = 932,192 slots; at first the
    # two users' 64-token prompts hold 128 of them on the prefill replica.
    first = result.timeseries.iloc[0]
    assert (first["used_tokens"], first["free_tokens"]) == (128, 932_192 - 128)
    assert first["kv_cache_usage_perc"] == pytest.approx(128 / 932_192, rel=1e-12)
    # On the link: each user's prompt (64 tokens x 131,072 B = 8,388,608 B) crosses beside the other
    # user's, three times over.
    link = pd.read_parquet(tmp_path / "pd" / "transfer_timeseries.parquet")
    assert list(link["transfers_in_flight"]) == [0, 2, 0, 2, 0, 2, 0]
    assert list(link["transfer_bytes_in_flight"]) == [0.0, 16_777_216.0] * 3 + [0.0]
    per_replica = result.replica_timeseries
    assert pd.read_parquet(tmp_path / "pd" / "replica_timeseries.parquet").equals(per_replica)
    assert list(per_replica.columns[:2]) == ["replica", "role"]
    roles = per_replica.drop_duplicates("replica")
    assert list(zip(roles["replica"], roles["role"], strict=True)) == [
        (0, "prefill"),
        (1, "decode"),
        (2, "decode"),
    ]


def test_a_disaggregated_runs_bar_counts_every_request_as_it_arrives(monkeypatch):
    import sim.outputs.progress

    updates: list[int] = []

    class FakeBar:
        def __init__(self, **options):
            self.total = options["total"]

        def update(self, count):
            updates.append(count)

        def close(self):
            pass

    monkeypatch.setattr(sim.outputs.progress, "tqdm", lambda *args, **options: FakeBar(**options))
    data = disaggregated()
    data["workload"] |= {"num_requests": 5, "arrival": {"kind": "constant", "rate_per_s": 2.0}}
    config = validate_experiment(data)
    prepared = prepare_experiment(config, Path("experiment.yaml"))
    run_prepared(config, prepared.variants[0], prepared.workload, progress=True)
    # Constant rate 2/s: arrivals at 0, 0.5, 1.0, 1.5 and 2.0 s, one update of 1 each.
    assert updates == [1] * 5


def test_a_single_group_run_names_its_cost_model_and_one_kv_group():
    summary = result_of(tiny_experiment()).summary
    # The default cost model on an A100-80GB: derated-analytic, with the band measured on Vidur's A100
    # iterations (test_config_and_run's run prints the same).
    assert summary["cost_model"].startswith("derated-analytic")
    assert summary["cost_model_error_band"].startswith("decode -9..+12 %, prefill -9..+15 %")
    assert (summary["kv_groups"], summary["kv_group_means"]) == (1, None)
    # A single engine is a cluster of one, behind no router.
    assert (summary["replicas"], summary["router"]) == (1, "none")


def test_the_capacity_lines_say_what_speculative_decoding_takes():
    """After vLLM's two lines, one on speculative decoding. EAGLE-3's head: (218,112,128 + 32,000 x 4,096)
    params x 2 B = 698,368,256 B = 0.65 GiB, one layer's K/V (8 heads x 128 x (K, V) x 2 B = 4,096 B) per
    token; k + k = 6 lookahead slots (test_speculative: k for the drafts, k more ahead for a draft head).
    N-gram lookup has no weights or KV (no footprint is named; the pool is the plain run's 458,096
    tokens) and holds only the k slots."""

    def lines(speculative: dict) -> list[str]:
        data = tiny_experiment(engine={"speculative": speculative})
        (variant,) = prepare_experiment(validate_experiment(data), Path("experiment.yaml")).variants
        return variant.capacity_lines()

    assert lines(SPEC)[2:] == [
        "Speculative decoding: eagle3, k=3, mean acceptance length 2.50; eagle3 head: 1 layer(s) of "
        "Llama-3.1-8B's width, own LM head of 32,000 tokens: 0.65 GiB of weights, 4,096 B of KV per token "
        "(in the size above); 6 lookahead slots per decoding request"
    ]
    ngram = {"method": "ngram", "num_speculative_tokens": 2, "acceptance": {"mean_acceptance_length": 1.5}}
    assert lines(ngram) == [
        "GPU KV cache size: 458,096 tokens",
        "Maximum concurrency for 1,024 tokens per request: 447.36x",
        "Speculative decoding: ngram, k=2, mean acceptance length 1.50; n-gram prompt lookup on the CPU: no "
        "draft weights or KV; 2 lookahead slots per decoding request",
    ]


def test_every_replicas_kv_memory_has_the_variants_policy_pool_and_options():
    data = tiny_experiment()
    data["variants"] = [
        {"name": "v", "policy": "radix", "options": {"page_size": 16}, "cluster": {"replicas": 2}}
    ]
    (variant,) = prepare_experiment(validate_experiment(data), Path("experiment.yaml")).variants
    first, second = variant.replica_policies
    assert first is variant.policy and second is not first and type(second) is type(first)
    assert (second.pool, second.page_size) == (first.pool, 16)


def test_expert_parallel_ranks_step_together():
    """Qwen3-30B-A3B, data parallel 2 with expert parallelism: the two ranks are a lockstep group, each
    iteration as long as the slowest rank's plus the shared part. vLLM's balancer sends requests 0 and 2
    to rank 0 and request 1 to rank 1; rank 1's lighter batch still waits for rank 0 every step, so
    the three identical requests get their first token and finish at the same instants."""
    data = tiny_experiment(
        model="Qwen3-30B-A3B",
        gpu="H100-80GB",
        engine={"data_parallel_size": 2, "enable_expert_parallel": True},
    )
    data["workload"]["num_requests"] = 3
    result = result_of(data)
    requests = result.requests.sort_values("request_id")
    assert list(requests["replica"]) == [0, 1, 0]
    assert requests["first_token_s"].nunique() == requests["finish_s"].nunique() == 1
    assert [row["requests_finished"] for row in result.replica_summaries] == [2, 1]


def test_run_variant_runs_the_variant_it_is_given_with_its_own_overrides():
    """The second of two variants: its own engine override and policy, its own errors named by its index."""
    data = tiny_experiment()
    data["variants"] = [
        {"name": "a", "policy": "paged"},
        {"name": "b", "policy": "prefix", "engine": {"block_size": 32}},
    ]
    # Drawn lengths and arrivals: the experiment's seed gives the same stream as run_experiment's.
    data["workload"] |= {
        "arrival": {"kind": "poisson", "rate_per_s": 10.0},
        "prompt_len": {"kind": "uniform", "low": 16, "high": 200},
    }
    config = validate_experiment(data)
    result = run_variant(config, config.variants[1], Path("."))
    summary = result.summary
    # Block 32: 60,043,812,864 // (32 x 131,072) = 14,315 blocks (test_runner's sizing).
    assert (summary["variant"], summary["policy"], summary["block_size"]) == ("b", "prefix", 32)
    assert summary["num_gpu_blocks"] == 14_315
    (_, both) = run_experiment(config, Path("experiment.yaml"))
    drawn = ["request_id", "arrival_s", "prompt_tokens", "output_tokens"]
    assert result.requests[drawn].equals(both.requests[drawn])
    assert both.requests["prompt_tokens"].nunique() > 1
    data["variants"][1]["engine"] = {"block_size": 2048}
    config = validate_experiment(data)
    with pytest.raises(ConfigError) as error:
        run_variant(config, config.variants[1], Path("."))
    assert str(error.value) == (
        "variants.1.engine.block_size: 2,048 is larger than max_model_len (1,024): even the longest request "
        "would leave most of its only block empty"
    )


def test_a_prepared_variant_runs_once():
    config = validate_experiment(tiny_experiment())
    prepared = prepare_experiment(config, Path("experiment.yaml"))
    run_prepared(config, prepared.variants[0], prepared.workload)
    with pytest.raises(RuntimeError) as error:
        run_prepared(config, prepared.variants[0], prepared.workload)
    assert str(error.value) == "variant 'v' already ran: prepare it again"


def test_tables_streamed_to_a_folder_are_read_back_from_it_unless_kept(tmp_path):
    """Streamed to a folder, a run keeps no table in memory: its requests are read back from the file
    (here cut to its first row after the run); with keep_tables they are the rows kept as written."""
    config = validate_experiment(tiny_experiment())

    def cut(folder: Path) -> None:
        path = folder / "v" / "requests.parquet"
        pd.read_parquet(path).head(1).to_parquet(path)

    (streamed,) = run_experiment(config, Path("experiment.yaml"), out_dir=tmp_path / "streamed")
    (kept,) = run_experiment(config, Path("experiment.yaml"), out_dir=tmp_path / "kept", keep_tables=True)
    prepared = prepare_experiment(config, Path("experiment.yaml"))
    alone = run_prepared(config, prepared.variants[0], prepared.workload, out_dir=tmp_path / "alone")
    for folder in ("streamed", "kept", "alone"):
        cut(tmp_path / folder)
    assert (len(streamed.requests), len(kept.requests), len(alone.requests)) == (1, 4, 1)


def test_expert_parallelism_over_one_servers_tp_group_runs_as_a_cluster_of_one_rank():
    """Qwen3-30B-A3B at TP 2 with expert parallelism: one engine, a lockstep group of one rank that
    pays the shared part of each step alone (no idle rank adds a dummy token); a cluster of one
    replica builds the same group, and the two runs agree request by request (async scheduling off,
    as test_cluster's cluster of one)."""
    data = tiny_experiment(
        model="Qwen3-30B-A3B",
        gpu="H100-80GB",
        engine={"tensor_parallel_size": 2, "enable_expert_parallel": True, "async_scheduling": False},
    )
    data["workload"]["num_requests"] = 3
    alone = result_of(data)
    data["cluster"] = {"replicas": 1}
    one = result_of(data)
    columns = ["request_id", "first_token_s", "finish_s", "ttft_s", "e2e_s"]
    assert alone.requests[columns].equals(one.requests[columns])
    # The three prompts in one iteration (their first tokens), then 3 decode steps for 4 output tokens.
    assert alone.summary["iterations"] == one.summary["iterations"] == 4


def test_the_pool_figures_come_from_the_kv_memory_where_it_has_them():
    """A KV memory that reports its bytes by part and its context tokens (a hybrid pool's coordinator)
    is read, not the pool's slots: 100 + 23 = 123 bytes and 77 tokens, where the pool's 160 slots of
    3 bytes would say 480 bytes and 160 tokens (test_runner's hand-made summary)."""
    engine = fake_engine(8.0, 100)
    engine.kv.breakdown_bytes = lambda: {"full": 100, "mamba": 23}
    engine.kv.context_tokens = 77
    table = pd.DataFrame(
        {
            "outcome": ["finished"],
            "sample_output_tokens": [4],
            "ttft_s": [1.0],
            "tpot_s": [0.5],
            "e2e_s": [2.5],
            "decode_steps": [3],
            "decode_step_tokens": [3],
        }
    )
    summary = summary_for(table, engine=engine)
    assert (summary["kv_pool_bytes"], summary["kv_context_tokens"]) == (123, 77)
    # Without them, the pool's own: 160 slots x 3 bytes, 160 tokens.
    summary = summary_for(table)
    assert (summary["kv_pool_bytes"], summary["kv_context_tokens"]) == (480, 160)


def test_a_summary_over_one_simulated_second_and_an_unstated_error_band():
    # 4 output tokens finished in exactly 1 simulated second: 4 tokens/s; no band given: "not validated".
    table = pd.DataFrame(
        {
            "outcome": ["finished"],
            "sample_output_tokens": [4],
            "ttft_s": [0.25],
            "tpot_s": [0.25],
            "e2e_s": [1.0],
            "decode_steps": [3],
            "decode_step_tokens": [3],
        }
    )
    summary = summary_for(table, engine=fake_engine(1.0, 100))
    assert (summary["output_tokens_per_s"], summary["simulated_s"]) == (4.0, 1.0)
    assert summary["cost_model_error_band"] == "not validated"


def test_tokens_per_decode_step_needs_both_columns_and_some_steps():
    table = pd.DataFrame(
        {
            "outcome": ["finished", "finished", "unfinished"],
            "sample_output_tokens": [1, 1, 9],
            "ttft_s": [1.0, 2.0, NAN],
            "tpot_s": [NAN, NAN, NAN],
            "e2e_s": [1.0, 2.0, NAN],
            # one-token outputs take no decode step; the unfinished request's steps do not count
            "decode_steps": [0, 0, 4],
            "decode_step_tokens": [0, 0, 6],
        }
    )
    assert summary_for(table)["tokens_per_decode_step"] is None
    # A table read back from an older run, with only one of the two columns: no figure either.
    for column in ("decode_steps", "decode_step_tokens"):
        older = table.assign(decode_steps=[2, 3, 4], decode_step_tokens=[2, 6, 6]).drop(columns=column)
        assert summary_for(older)["tokens_per_decode_step"] is None, column
    # Both, with steps: (2 + 6) / (2 + 3) = 1.6 over the finished two.
    both = table.assign(decode_steps=[2, 3, 4], decode_step_tokens=[2, 6, 6])
    assert summary_for(both)["tokens_per_decode_step"] == 1.6


# ----------------------------------------------------------------- disaggregated pools, checked up front
def pd_variant(decider: dict | None = None, link: dict | None = None, **changes: dict) -> dict:
    """test_runner's tiny experiment as one disaggregated variant: a prefill and a decode pool of one
    replica each, policy prefix, both routed least_requests, every request disaggregated."""
    data = tiny_experiment()
    section: dict = {"prefill": {"replicas": 1}, "decode": {"replicas": 1}}
    for role, change in changes.items():
        section[role] = section[role] | change
    if decider is not None:
        section["decider"] = decider
    if link is not None:
        section["link"] = link
    data["variants"] = [{"name": "pd", "policy": "prefix", "cluster": {"disaggregation": section}}]
    return data


def problems_of(data: dict) -> list[str]:
    """The problems prepare_experiment reports, one a line, less its heading."""
    with pytest.raises(ConfigError) as error:
        prepare_experiment(validate_experiment(data), Path("experiment.yaml"))
    heading, *lines = str(error.value).split("\n")
    assert heading == f"experiment.yaml: cannot run ({len(lines)} problem(s); nothing was simulated)"
    return lines


WHERE = "  variants.0 (pd): variants.0.cluster.disaggregation"
NO_BLOCKS = (
    "has no blocks: KV is sent and received block by block (vLLM's NIXL connector, Mooncake); use "
    "paged, prefix or radix"
)
SPEC = {"method": "eagle3", "num_speculative_tokens": 3, "acceptance": {"mean_acceptance_length": 2.5}}


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (
            pd_variant(prefill={"policy": "vllm-hybrid"}),
            ".prefill.policy: vllm-hybrid does not run in a disaggregated cluster yet",
        ),
        (pd_variant(decode={"policy": "contiguous"}), f".decode.policy: contiguous {NO_BLOCKS}"),
        (
            # (Expert parallelism over one GPU is accepted alone, with a warning: here it is refused.)
            tiny_experiment(model="Qwen3-30B-A3B", gpu="H100-80GB")
            | {"variants": pd_variant(decode={"engine": {"enable_expert_parallel": True}})["variants"]},
            ".decode.engine: data or expert parallelism inside a disaggregated pool is not modelled (give "
            "the pool more replicas instead)",
        ),
        (
            pd_variant(decode={"engine": {"scheduler": "sglang"}}),
            ".decode.engine.scheduler: sglang is not modelled in disaggregated pools (only vllm's scheduler)",
        ),
        (
            pd_variant(decider={"mode": "prefix_threshold"}, decode={"policy": "paged"}),
            ".decider.mode: prefix_threshold reads the decode replica's prefix cache, but policy 'paged' has "
            "none; use prefix or radix in the decode pool, or mode: always",
        ),
        (
            pd_variant(prefill={"policy": "paged", "router": "prefix_aware"}),
            ".prefill.router: prefix_aware routes by prefix, but policy 'paged' has no prefix cache",
        ),
        (
            pd_variant(decode={"policy": "paged", "router": "prefix_aware"}),
            ".decode.router: prefix_aware routes by prefix, but policy 'paged' has no prefix cache",
        ),
        (
            pd_variant(decode={"engine": {"speculative": SPEC}}),
            ": speculative decoding with disaggregated pools is not modelled yet",
        ),
        (
            pd_variant(link={"kind": "nvlink"}, prefill={"gpu": "L4"}),
            ".link.kind: nvlink, but the prefill pool's GPU L4-24GB has no NVLink; use pcie, rdma, or give "
            "bandwidth_gb_per_s",
        ),
    ],
)
def test_what_a_disaggregated_pool_cannot_do_is_refused_naming_its_key(data, problem):
    assert problems_of(data) == [WHERE + problem]


def test_every_problem_of_both_pools_is_reported_each_on_its_line():
    # Two of the prefill pool's own, then what the pools cannot do together.
    data = pd_variant(
        prefill={"policy": "contiguous", "engine": {"scheduler": "sglang"}},
        decode={"engine": {"block_size": 32}},
    )
    assert problems_of(data) == [
        f"{WHERE}.prefill.policy: contiguous {NO_BLOCKS}",
        f"{WHERE}.prefill.engine.scheduler: sglang is not modelled in disaggregated pools (only vllm's scheduler)",
        f"{WHERE}: the pools' block sizes differ (16 and 32): blocks are sent as they are; give both the "
        "same engine.block_size",
    ]
    # A hybrid allocator has no prefix lookup (has_prefix_lookup) for a prefix_aware router either.
    assert problems_of(pd_variant(prefill={"policy": "vllm-hybrid", "router": "prefix_aware"})) == [
        f"{WHERE}.prefill.policy: vllm-hybrid does not run in a disaggregated cluster yet",
        f"{WHERE}.prefill.router: prefix_aware routes by prefix, but policy 'vllm-hybrid' has no prefix cache",
    ]
    # Each pool's own preparation fails: both are told, the prefill pool's under its key.
    problems = problems_of(pd_variant(prefill={"gpu": "nonexistent"}, decode={"gpu": "T4"}))
    assert len(problems) == 2
    assert problems[0].startswith(f"{WHERE}.prefill.gpu: unknown GPU 'nonexistent'; presets: T4-16GB, ")
    # (The model does not fit the decode pool's own GPU: named by the pool's gpu key.)
    assert problems[1].startswith(
        "  variants.0 (pd): model, variants.0.cluster.disaggregation.decode.gpu: Llama-3.1-8B on T4-16GB "
        "does not fit"
    )


def test_disaggregated_pools_that_need_no_prefix_cache_are_accepted():
    # Paged in both pools, routed least_requests, every request disaggregated (mode: always); and
    # prefix_threshold beside a decode pool that has a prefix cache.
    for data in (
        pd_variant(prefill={"policy": "paged"}, decode={"policy": "paged"}),
        pd_variant(decider={"mode": "prefix_threshold"}, prefill={"policy": "paged"}),
    ):
        (variant,) = prepare_experiment(validate_experiment(data), Path("experiment.yaml")).variants
        assert variant.prefill_pool is not None and variant.link is not None


def test_both_pools_warnings_are_kept():
    # Block 24 in both pools: vLLM accepts 1, 8, 16, ... only; each pool warns under its own key.
    data = pd_variant(prefill={"engine": {"block_size": 24}}, decode={"engine": {"block_size": 24}})
    warnings = prepare_experiment(validate_experiment(data), Path("experiment.yaml")).warnings
    text = "block_size: 24 is not a block size vLLM accepts (1, 8, 16, 32, 64, 128, 256); simulated as given"
    where = "variants.0 (pd): variants.0.cluster.disaggregation"
    assert warnings == [
        f"{where}.prefill: variants.0.cluster.disaggregation.prefill.engine.{text}",
        f"{where}.decode: variants.0.cluster.disaggregation.decode.engine.{text}",
    ]


def test_both_pools_pin_the_shared_prefixes_and_read_files_next_to_the_experiment(tmp_path):
    # Two system prompts of 48 tokens = 3 full blocks of 16 each: 96 slots pinned in each pool.
    data = pd_variant()
    data["workload"]["shared_prefix"] = {"num_prefixes": 2, "prefix_len": 48}
    data["variants"][0]["pin_shared_prefixes"] = True
    # A cost profile found only in the experiment's folder (as test_runner's single-engine run).
    source = Path(__file__).parents[1] / "configs" / "profiles" / "analytic-llama-3.1-8b-a100-80gb.yaml"
    (tmp_path / "only-here.yaml").write_text(source.read_text())
    data["cost_model"] = {"profile": "only-here.yaml"}
    (decode,) = prepare_experiment(validate_experiment(data), tmp_path / "experiment.yaml").variants
    assert decode.prefill_pool is not None
    assert (decode.prefill_pool.pinned_tokens, decode.pinned_tokens) == (96, 96)
    assert "profile" in decode.prefill_pool.costs.label and "profile" in decode.costs.label
