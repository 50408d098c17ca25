"""The output column dictionary: every column kvsim writes, with its unit and meaning, in one place.

``docs/outputs.md`` is generated from these tables (``kvsim output-columns``), and a test runs an
experiment and checks that the columns written are exactly the ones documented here: a column added,
renamed or dropped without its entry fails the suite.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from policies.base import MemoryBreakdown

Columns = dict[str, tuple[str, str]]
"""column name -> (unit, meaning)."""

_FRAC = "fraction 0-1"

SUMMARY: Columns = {
    "variant": ("-", "The variant's name (its folder)."),
    "policy": (
        "-",
        "The policy that ran (`prefix` when `enable_prefix_caching: true` turned `paged` into it).",
    ),
    "policy_options": ("-", "The policy's options (JSON in summary.csv)."),
    "block_size": ("tokens", "Tokens per KV block."),
    "tensor_parallel_size": (
        "GPUs",
        "GPUs per instance (`engine.tensor_parallel_size`); the `kv_*` bytes and blocks are per GPU.",
    ),
    "data_parallel_size": (
        "ranks",
        "Data-parallel ranks of the server (`engine.data_parallel_size`), each a replica in "
        "`replicas.csv`; the `kv_*` columns are per rank.",
    ),
    "expert_parallel_size": (
        "GPUs",
        "GPUs the routed experts are dealt over (data_parallel_size x tensor_parallel_size with "
        "`engine.enable_expert_parallel`, else 1).",
    ),
    "max_model_len": ("tokens", "Longest request (prompt + output) the engine accepts."),
    "kv_pool_tokens": (
        "tokens (slots)",
        "Size of the KV pool in slots: vLLM's `GPU KV cache size` for a single-group policy. A hybrid "
        "allocator's slot is one token in one KV group (kv_groups), so a token takes a slot in each.",
    ),
    "kv_context_tokens": (
        "tokens",
        "Tokens of context the KV pool holds, counting only the layers that keep every token (full "
        "attention): kv_pool_tokens for a single-group policy; a hybrid pool's slots over its "
        "full-attention groups (Jenga: layers); SGLang's full-attention pool. What arrivals fill.",
    ),
    "kv_pool_bytes": ("bytes", "Size of the KV pool in bytes (per GPU)."),
    "kv_bytes_per_token": (
        "bytes",
        "KV cache bytes per slot, per GPU: one token in all layers (a hybrid allocator: in one group's layers).",
    ),
    "kv_groups": (
        "groups",
        "KV groups behind the engine's coordinator: 1 for a single-group policy; a hybrid allocator's "
        "groups (sim/kv/allocators.py: one per group_size layers of one kind, as vLLM groups them).",
    ),
    "num_gpu_blocks": ("blocks", "KV blocks in the pool (vLLM's `num_gpu_blocks`)."),
    "cost_model": ("-", "Which cost model timed the iterations, and what it rests on."),
    "cost_model_error_band": (
        "-",
        "How far that cost model's iteration times were measured to be off, and against what.",
    ),
    "requests_total": ("requests", "Requests that arrived (all outcomes)."),
    "requests_finished": ("requests", "Requests that generated their last token."),
    "requests_rejected": (
        "requests",
        "Requests refused because they can never run (longer than max_model_len, larger than the pool "
        "even alone, ...); the reason is in requests.parquet.",
    ),
    "requests_failed_oom": (
        "requests",
        "Requests failed for lack of KV memory at admission (`on_oom: fail`).",
    ),
    "requests_unfinished": ("requests", "Requests still queued or running when the run stopped (`until_s`)."),
    "admission_waits": (
        "requests",
        "Requests that had to wait for KV memory at admission (each counted once, however long it "
        "waited). Not crashes: with `on_oom: queue` requests wait.",
    ),
    "preemptions": ("count", "Requests taken off the GPU to free KV memory (recompute or swap)."),
    "oom_failures": ("requests", "Requests failed because they did not fit at admission (`on_oom: fail`)."),
    "swapped_out_blocks": ("blocks", "Blocks copied to host memory by swap preemptions."),
    "peak_running": ("requests", "Most requests running at once."),
    "cow_copies": ("blocks", "Shared, partly filled blocks copied before a write (copy-on-write)."),
    "fork_copied_tokens": ("tokens", "Tokens physically copied by forks of policies that cannot share."),
    "evictions": ("blocks", "Cached prefix blocks evicted to make room."),
    "prefix_cache_queries": ("tokens", "Prompt tokens looked up in the prefix cache (vLLM's metric)."),
    "prefix_cache_hits": ("tokens", "Prompt tokens served from the prefix cache (vLLM's metric)."),
    "prefix_cache_hit_rate": (_FRAC, "prefix_cache_hits / prefix_cache_queries; empty without queries."),
    "output_tokens_per_s": (
        "tokens/s",
        "Output tokens of finished requests (all samples/beams) per simulated second.",
    ),
    "ttft_p50_s": ("s", "Median time to first token of finished requests (from arrival, queueing included)."),
    "ttft_p99_s": ("s", "99th percentile time to first token."),
    "tpot_p50_s": ("s", "Median time per output token after the first."),
    "tokens_per_decode_step": (
        "tokens",
        "Tokens a decode step gave a finished request, on average over their steps: 1 without "
        "speculative decoding, 1 + accepted drafts with it (the realised mean acceptance length).",
    ),
    "e2e_p50_s": ("s", "Median end-to-end latency (arrival to last token)."),
    "e2e_p99_s": ("s", "99th percentile end-to-end latency."),
    "iterations": ("count", "Engine iterations (scheduler steps) simulated."),
    "engine_wakeups": (
        "count",
        "Engine-loop events that ran iterations: one iteration each, or a run of them jumped over in "
        "closed form (event skipping). iterations / engine_wakeups is what skipping saved; the "
        "simulator's wall time grows with this count, not with tokens.",
    ),
    "simulated_s": ("s", "Simulated time at the end of the run."),
    "wall_s": ("s", "Wall-clock time the simulation took (machine-dependent)."),
    "engine_build": (
        "-",
        "Which code ran the engine: `python` (the sources) or `native` (the compiled build of "
        "`make native`, used when it matches the sources). The results are identical; wall_s is not.",
    ),
    "mean_used_frac": (_FRAC, "Time-averaged share of the pool holding live token states."),
    "mean_reserved_frac": (_FRAC, "Time-averaged share allocated to live sequences and filled later."),
    "mean_internal_frag_frac": (
        _FRAC,
        "Time-averaged share allocated but never filled (internal fragmentation).",
    ),
    "mean_external_frag_frac": (
        _FRAC,
        "Time-averaged share of free slots stranded by a request that cannot be placed (external "
        "fragmentation; paged policies: the pool's tail past the last whole block).",
    ),
    "mean_cached_frac": (_FRAC, "Time-averaged share holding reusable prefix blocks with no live owner."),
    "mean_free_frac": (_FRAC, "Time-averaged share free."),
    "mean_running": ("requests", "Time-averaged number of running requests."),
    "memory_saved_by_sharing_frac": (
        _FRAC,
        "1 - physical / logical slots held by live sequences, time-averaged: what prefix sharing and "
        "forks saved.",
    ),
    "pinned_tokens": ("tokens", "Slots pinned in the prefix cache at warm-up (`pin_shared_prefixes`)."),
    "speculative": (
        "-",
        "engine.speculative as run: method, k, mean acceptance length and what it came from, the draft; "
        "empty without speculative decoding.",
    ),
    "lookahead_slots": (
        "slots",
        "Speculative decoding: slots each decoding request holds past its tokens (its k drafts and "
        "vLLM's num_lookahead_tokens); 0 without.",
    ),
    "draft_weight_bytes": (
        "bytes",
        "Speculative decoding: the draft's weights per GPU, beside the target's.",
    ),
    "draft_kv_bytes_per_token": (
        "bytes",
        "Speculative decoding: the draft's K/V in every token's slot (included in kv_bytes_per_token).",
    ),
    "kv_group_means": (
        _FRAC,
        "A hybrid allocator's memory split by KV group (one engine): per group, and per shared pool's "
        "free blocks, each category's time-averaged share of the whole pool (JSON); the groups' shares "
        "of a category add up to its mean_*_frac. Empty for a single-group policy. The series: "
        "kv_groups.parquet.",
    ),
    "host_tier_blocks": ("blocks", "Blocks the host-memory tier holds (`offload:`); 0 without one."),
    "host_tier_bytes": ("bytes", "host_tier_blocks x block bytes (block_size x kv_bytes_per_token)."),
    "host_cache_hits": (
        "tokens",
        "Prompt tokens served from the host tier (loaded back), beyond the GPU hit `prefix_cache_hits`.",
    ),
    "host_cache_hit_rate": (_FRAC, "host_cache_hits / prefix_cache_queries; empty without queries."),
    "total_cache_hit_rate": (
        _FRAC,
        "(prefix_cache_hits + host_cache_hits) / prefix_cache_queries: prompt tokens not prefilled.",
    ),
    "host_loaded_blocks": ("blocks", "Blocks loaded host -> GPU for host hits."),
    "host_load_bytes": ("bytes", "host_loaded_blocks x block bytes (host -> GPU)."),
    "host_load_s": ("s", "Transfer time of the loads, added to the iterations that admitted them."),
    "host_offloaded_blocks": (
        "blocks",
        "Cached blocks written GPU -> host when the GPU evicted them (not if the host held them already).",
    ),
    "host_offload_bytes": (
        "bytes",
        "host_offloaded_blocks x block bytes (GPU -> host; asynchronous, no time).",
    ),
    "host_evictions": ("blocks", "Host-tier entries dropped (least recently used) to make room."),
    "host_cached_tokens_end": ("tokens (slots)", "Slots of the host tier holding cached blocks at the end."),
}

BALANCE: Columns = {
    "replicas": ("replicas", "Engine replicas (`cluster.replicas`; 1 without a `cluster:` section)."),
    "router": ("-", "The cluster's router (`none` without a `cluster:` section)."),
    "requests_max_over_mean": (
        "ratio",
        "Load imbalance: most requests routed to one replica / the mean over replicas (1: even).",
    ),
    "requests_cv": ("ratio", "Coefficient of variation (std / mean) of the requests routed per replica."),
    "kv_usage_max_over_mean": (
        "ratio",
        "Highest replica time-averaged KV usage (1 - free - cached share) / the mean over replicas.",
    ),
    "kv_usage_cv": ("ratio", "Coefficient of variation of the replicas' time-averaged KV usage."),
    "prefix_cache_hit_rate_min": (_FRAC, "Lowest replica prefix_cache_hit_rate; empty without queries."),
    "prefix_cache_hit_rate_max": (_FRAC, "Highest replica prefix_cache_hit_rate; empty without queries."),
}
"""The cluster's load balance, at the end of every summary (a single engine is a cluster of one)."""
SUMMARY |= BALANCE
"""In a cluster run, the pool columns (kv_pool_*, num_gpu_blocks, ...) are per replica; counters,
percentiles and time-averaged shares are over the whole cluster (its pools together)."""

REPLICA_SUMMARY: Columns = {
    "replica": (
        "-",
        "The replica (0 to replicas - 1; a disaggregated cluster numbers its prefill pool first).",
    ),
    "role": ("-", "both (it prefills and decodes), or prefill / decode in a disaggregated cluster."),
    "requests_routed": (
        "requests",
        "Requests the router sent to this replica (in a disaggregated cluster: prompts to a prefill replica, "
        "requests to a decode replica).",
    ),
}

DISAGGREGATION: Columns = {
    "prefill_replicas": (
        "replicas",
        "Replicas of the prefill pool (`cluster.disaggregation.prefill.replicas`).",
    ),
    "decode_replicas": (
        "replicas",
        "Replicas of the decode pool; the pool columns above are one decode replica's.",
    ),
    "prefill_policy": ("-", "The prefill pool's policy."),
    "prefill_gpu": ("-", "The prefill pool's GPU (empty: the experiment's)."),
    "decode_gpu": ("-", "The decode pool's GPU (empty: the experiment's)."),
    "prefill_tensor_parallel_size": ("GPUs", "GPUs per prefill replica."),
    "prefill_kv_pool_tokens": ("tokens", "One prefill replica's KV pool."),
    "link": ("-", "The KV link: kind, bandwidth per GPU one way, latency, what shares a pipe."),
    "requests_disaggregated": ("requests", "Requests the decider sent through the prefill pool."),
    "kv_transfers": (
        "transfers",
        "KV transfers started (one per disaggregated request whose decode blocks were allocated).",
    ),
    "transfer_bytes_total": ("bytes", "KV bytes delivered over the link."),
    "link_utilization_frac": (
        _FRAC,
        "Time with bytes flowing, summed over the link's pipes, / (pipes x simulated_s); pipes that never "
        "carried a transfer are not counted.",
    ),
    "queue_mean_s": ("s", "Mean queue_s of the finished disaggregated requests (the prefill queue)."),
    "prefill_mean_s": ("s", "Mean prefill_s (admission to prompt done on the prefill replica)."),
    "transfer_wait_mean_s": (
        "s",
        "Mean transfer_wait_s: back-pressure, waiting for the decode replica's blocks.",
    ),
    "transfer_wait_p99_s": ("s", "99th percentile of transfer_wait_s."),
    "transfer_mean_s": ("s", "Mean transfer_s: the KV on the link."),
    "transfer_p99_s": ("s", "99th percentile of transfer_s."),
    "decode_first_step_mean_s": (
        "s",
        "Mean first_token_s - transfer_end_s: the decode replica's wait for its next iteration and the "
        "iteration that computes the prompt's last token.",
    ),
    "prefill_kv_usage_mean_frac": (
        _FRAC,
        "Time-averaged KV usage (not free, not cached) of the prefill replicas.",
    ),
    "decode_kv_usage_mean_frac": (_FRAC, "Time-averaged KV usage of the decode replicas."),
    "prefill_preemptions": ("count", "Preemptions in the prefill pool."),
    "decode_preemptions": ("count", "Preemptions in the decode pool."),
}
"""A disaggregated variant's summary has these after the columns above (its cluster total)."""

TRANSFER_TIMESERIES: Columns = {
    "time_s": ("s", "Simulated time; a row holds until the next one."),
    "requests_awaiting_decode": (
        "requests",
        "Prompts done on a prefill replica whose decode replica has not allocated their blocks yet (their "
        "prefill blocks are held).",
    ),
    "transfers_in_flight": (
        "transfers",
        "KV transfers started and not ended (in their latency, or flowing).",
    ),
    "transfer_bytes_in_flight": ("bytes", "Bytes of those transfers not delivered yet."),
}
"""``<variant>/replicas.csv`` (cluster runs): the SUMMARY columns but BALANCE, for the replica alone,
then these."""

TIMESERIES: Columns = {
    "time_s": (
        "s",
        "Simulated time of the sample; a row holds until the next one. A state replaced at the same "
        "instant is not written (completions followed at once by the next iteration), except the end "
        "of an event-skipping jump, which shows the tokens decoded during it.",
    ),
    "used_tokens": ("tokens (slots)", "Slots holding live token states."),
    "reserved_tokens": ("tokens (slots)", "Slots allocated to live sequences that they will fill later."),
    "internal_fragmentation_tokens": ("tokens (slots)", "Slots allocated that will never be filled."),
    "external_fragmentation_tokens": (
        "tokens (slots)",
        "Free slots stranded by a request that cannot be placed (contiguous: the waiting or last "
        "reservation fits in no hole, though it would fit in the empty pool); paged: the pool's tail "
        "past the last whole block.",
    ),
    "cached_tokens": (
        "tokens (slots)",
        "Slots of cached prefix blocks with no live owner (evictable or pinned).",
    ),
    "free_tokens": (
        "tokens (slots)",
        "Free slots. The six `*_tokens` breakdown columns sum to kv_pool_tokens.",
    ),
    "num_requests_running": ("requests", "Requests running (vLLM's metric)."),
    "num_requests_waiting": ("requests", "Requests queued: the queue length (vLLM's metric)."),
    "num_sequences_running": ("sequences", "Sequences running (a request with n > 1 or beams has several)."),
    "admission_waits": ("requests", "Cumulative `admission_waits` (see summary)."),
    "preemptions": ("count", "Cumulative `preemptions` (see summary)."),
    "oom_failures": ("requests", "Cumulative `oom_failures` (see summary)."),
    "cow_copies": ("blocks", "Cumulative copy-on-write block copies."),
    "prefix_cache_queries": ("tokens", "Cumulative prompt tokens looked up in the prefix cache."),
    "prefix_cache_hits": ("tokens", "Cumulative prompt tokens served from the prefix cache."),
    "evictions": ("blocks", "Cumulative evictions of cached blocks."),
    "physical_tokens": ("tokens (slots)", "Slots held by live sequences, a shared block counted once."),
    "logical_tokens": ("tokens (slots)", "Slots live sequences would hold if nothing were shared."),
    "admission_blocker": (
        "code",
        "What holds the head of the waiting queue back: 0 nothing (or nothing waits), 1 KV memory, "
        "2 max_num_seqs, 3 the token budget (max_num_batched_tokens).",
    ),
    "host_cached_tokens": ("tokens (slots)", "Host-tier slots holding cached blocks (`offload:`)."),
    "host_free_tokens": ("tokens (slots)", "Free host-tier slots: host_cached + host_free = the host tier."),
    "host_cache_hits": ("tokens", "Cumulative prompt tokens served from the host tier."),
    "host_loaded_blocks": ("blocks", "Cumulative blocks loaded host -> GPU."),
    "host_offloaded_blocks": ("blocks", "Cumulative blocks written GPU -> host at eviction."),
    "host_evictions": ("blocks", "Cumulative host-tier entries dropped to make room."),
    **{
        f"{category}_token_s": (
            "token-s (slot-seconds)",
            f"Exact time integral of {category}_tokens from t=0 to this row, including the tokens "
            "decoded inside event-skipping jumps, which no row shows: a window's mean is the "
            "difference of two rows' values over the time between them.",
        )
        for category in MemoryBreakdown.CATEGORIES
    },
    "kv_cache_usage_perc": (
        _FRAC,
        "vLLM's gauge `kv_cache_usage_perc`: despite the name a fraction from 0 to 1, not a percentage; "
        "1 - (free + cached) / pool (evictable cache counts as free, as in vLLM).",
    ),
}

REQUESTS: Columns = {
    "request_id": ("-", "The request's id in the workload's stream (identical across variants)."),
    "arrival_s": ("s", "Arrival time."),
    "prompt_tokens": ("tokens", "Prompt length."),
    "output_tokens": (
        "tokens",
        "Tokens its longest sample/beam generates: the request's decode steps (with `n > 1` samples "
        "stop independently, see `sample_lengths`; beams all run to this length).",
    ),
    "n": ("-", "Parallel samples."),
    "beam_width": ("-", "Beam width (1: no beam search)."),
    "sample_output_tokens": (
        "tokens",
        "Tokens all its samples/beams generate together (equals output_tokens when n = beam_width = 1).",
    ),
    "admitted_s": ("s", "First admission (its KV memory allocated); empty if never admitted."),
    "first_token_s": ("s", "Time of the first output token; empty if none."),
    "finish_s": ("s", "Time of the last output token; empty unless finished."),
    "preemptions": ("count", "Times this request was preempted."),
    "cached_prompt_tokens": ("tokens", "Prompt tokens served from the prefix cache at first admission."),
    "outcome": ("-", "finished, rejected, failed_oom or unfinished."),
    "reason": ("-", "Why a request was rejected or failed (with its numbers); empty otherwise."),
    "replica": ("-", "The cluster replica its router sent it to (0 without a `cluster:` section)."),
    "client_overhead_s": (
        "s",
        "Time outside the engine counted in ttft_s and e2e_s (HTTP, API server, tokenization, "
        "streaming): engine.client_overhead_s, by default the cost model's fitted request_overhead_s.",
    ),
    "prefill_replica": (
        "-",
        "Disaggregated serving: the prefill replica that computed its prompt (-1: it was prefilled where it "
        "decoded). Replicas are numbered across the cluster, prefill pool first; `replica` is the decode one.",
    ),
    "prefill_done_s": ("s", "Disaggregated: its prompt finished on the prefill replica (empty otherwise)."),
    "transfer_start_s": (
        "s",
        "Disaggregated: the decode replica allocated its blocks and the KV transfer began (empty otherwise).",
    ),
    "transfer_end_s": ("s", "Disaggregated: the last byte of its KV reached the decode replica."),
    "transfer_bytes": (
        "bytes",
        "Disaggregated: KV bytes sent over the link: the prompt's blocks the decode replica did not have cached.",
    ),
    "decode_cached_tokens": (
        "tokens",
        "Disaggregated: prompt tokens the decode replica already held in its prefix cache (not sent).",
    ),
    "decode_steps": (
        "count",
        "Decode iterations it took part in after a first token (each admission's prefill gives one token "
        "of its own).",
    ),
    "decode_step_tokens": (
        "tokens",
        "Tokens those decode steps gave it: decode_steps without speculative decoding; with it, 1 + the "
        "accepted drafts of each step (its tokens arrive in bursts of that size).",
    ),
    "ttft_s": (
        "s",
        "first_token_s - arrival_s + client_overhead_s: time to first token as a client measures it, "
        "queueing included.",
    ),
    "e2e_s": ("s", "finish_s - arrival_s + client_overhead_s: end-to-end latency as a client measures it."),
    "tpot_s": (
        "s",
        "(finish_s - first_token_s) / (output_tokens - 1): time per decode step after the first token "
        "(with n > 1 or beams: per token of the longest sample, which every step extends).",
    ),
    "queue_s": ("s", "admitted_s - arrival_s: time waiting before the first admission."),
    "prefill_s": (
        "s",
        "Disaggregated: prefill_done_s - admitted_s, the prompt's time on the prefill replica.",
    ),
    "transfer_wait_s": (
        "s",
        "Disaggregated: transfer_start_s - prefill_done_s, waiting for the decode replica to allocate the "
        "blocks (back-pressure: the prefill replica holds them meanwhile).",
    ),
    "transfer_s": ("s", "Disaggregated: transfer_end_s - transfer_start_s, the KV on the link."),
}

KV_GROUPS: Columns = {
    "time_s": ("s", "Simulated time; the entry's row holds until its next one."),
    "kv_group": (
        "-",
        "A KV group (`full`, `sliding(W)`, `chunked(C)`, `mamba`, as the hybrid allocator groups the "
        "layers), or a pool the groups share (`shared pool`, or `shared pool (<its groups>)` with "
        "several): its free slots belong to no group.",
    ),
    "used_tokens": ("tokens (slots)", "The entry's slots holding live token states."),
    "reserved_tokens": ("tokens (slots)", "The entry's slots allocated to live sequences, filled later."),
    "internal_fragmentation_tokens": ("tokens (slots)", "The entry's slots allocated but never filled."),
    "external_fragmentation_tokens": ("tokens (slots)", "The entry's stranded free slots."),
    "cached_tokens": ("tokens (slots)", "The entry's slots holding reusable blocks with no live owner."),
    "free_tokens": ("tokens (slots)", "Free slots (a shared pool's entry)."),
}

TABLES: dict[str, tuple[str, Columns]] = {
    "summary": ("`summary.csv` (one row per variant) and `<variant>/summary.json` (the same keys)", SUMMARY),
    "timeseries": (
        "`<variant>/timeseries.parquet` (or `.csv`): one row per change of state, sampled at engine events",
        TIMESERIES,
    ),
    "requests": ("`<variant>/requests.parquet` (or `.csv`): one row per request", REQUESTS),
    "disaggregation": (
        "A disaggregated variant's `summary.json` / `summary.csv` row: after the summary columns",
        DISAGGREGATION,
    ),
    "transfer_timeseries": (
        "`<variant>/transfer_timeseries.parquet` (disaggregated runs): one row per change of the handoffs or the link",
        TRANSFER_TIMESERIES,
    ),
    "kv_groups": (
        "`<variant>/kv_groups.parquet` (hybrid allocators, one engine): each KV group's breakdown, one "
        "row per group and change of state; at every instant the groups' rows add up to the "
        "timeseries row in force (figures/kv_groups.png draws it)",
        KV_GROUPS,
    ),
    "replicas": (
        "`<variant>/replicas.csv` (cluster runs): one row per replica, with the summary columns up to "
        "`pinned_tokens` for that replica alone, then these",
        REPLICA_SUMMARY,
    ),
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> str:
    lines = [
        "# Output columns",
        "",
        "<!-- Generated by `kvsim output-columns` from sim/outputs/columns.py; tests/test_reference_docs.py fails "
        "when a written column is missing here or a documented one is no longer written. "
        "Do not edit by hand. -->",
        "",
        "A results folder (`kvsim run`, default `results/<name>/`) holds `config.yaml` (the resolved "
        "config), `summary.csv`, `capacity.txt` (vLLM's start-up lines, once per distinct pool), "
        "`.kvsim-results` (the marker that lets kvsim replace the folder), `figures/*.png` and one "
        "folder per variant with `summary.json`, `timeseries.parquet` and `requests.parquet`. Units: "
        "*tokens (slots)* are KV slots, one token's K and V in every layer; *fraction 0-1* is a share, "
        "never a percentage; times are simulated seconds unless stated. Read a folder from Python with "
        "`sim.results.load_results(path)`. A variant with a `cluster:` section (several replicas behind "
        "a router) writes the cluster total in `summary.json`, `summary.csv` and `timeseries.parquet` "
        "(its pool columns per replica; counters, percentiles and shares over the whole cluster; in the "
        "total series `admission_blocker` is the blocker most replicas are held back by), and beside "
        "them `replicas.csv` (one summary row per replica) and `replica_timeseries.parquet` (every "
        "replica's rows, a `replica` column first, then the time series columns).",
    ]
    for title, columns in TABLES.values():
        lines += ["", f"## {title}", "", "| column | unit | meaning |", "|---|---|---|"]
        lines += [f"| `{name}` | {unit} | {_cell(meaning)} |" for name, (unit, meaning) in columns.items()]
    return "\n".join(lines) + "\n"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "output-columns", help="print the output column dictionary (Markdown; docs/outputs.md is this output)"
    )
    parser.set_defaults(func=cmd_output_columns)


def cmd_output_columns(args: argparse.Namespace) -> int:
    sys.stdout.write(markdown())
    return 0
