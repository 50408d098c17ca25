"""The numbers a user reads (``summarize``), checked against an independent computation.

Several hundred requests with distinct lengths and arrival times run through the engine; the test
then recomputes every summary figure itself, from the raw request records (arrival, admission,
first token, finish) and, where it says so, the time series, with plain numpy:

- latency percentiles (linear interpolation between order statistics, written out below);
- throughput (output tokens of finished requests / simulated time);
- time-weighted averages: with a constant iteration time ``T`` the KV held by each request is a
  known step function of time (its prompt from admission to first token, then one token more per
  iteration), so the exact integral of every breakdown category follows from the records alone.
  Event skipping jumps over many iterations and samples only their ends; the recorder's trapezoid
  rule is exact there for a constant ``T`` (the staircase and the straight line enclose the same
  area), a left-rectangle rule is not. Tolerance: 1e-9 relative, the size of float error.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from policies import PoolSpec, make_policy
from sim.config import VariantConfig
from sim.engine.core import Engine, EngineKnobs
from sim.runner import summarize
from tests.engine_helpers import ConstantCost, RoundCostModel, request

BLOCK = 16
# 400 blocks (enough for 32 requests of 180 tokens: no preemption) and 5 slots that cannot form a block: the paged policy reports them as external
# fragmentation all the time.
POOL = PoolSpec(BLOCK * 400 + 5, BLOCK, 256)
T = 0.25  # constant iteration time of the first cost model (exact in binary)


def many_requests(count: int = 300, seed: int = 11):
    """Poisson arrivals at 1.5/s, prompts 1-120, outputs 1-60 tokens: many distinct values, and
    few waits (max_num_seqs 32 serves about 4 requests/s at T = 0.25 s)."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / 1.5, count))
    prompts = rng.integers(1, 121, count)
    outputs = rng.integers(1, 61, count)
    return [request(i, float(arrivals[i]), int(prompts[i]), int(outputs[i])) for i in range(count)]


def run(costs, step_mode):
    engine = Engine(
        make_policy("paged", POOL),
        costs,
        EngineKnobs(
            max_model_len=POOL.max_model_len, max_num_seqs=32, max_num_batched_tokens=64, step_mode=step_mode
        ),
        iter(many_requests()),
        block_size=BLOCK,
    )
    engine.run()
    return engine


def summary_of(engine):
    return summarize(
        engine,
        engine.sink.requests(),
        VariantConfig(name="v", policy="paged"),
        "paged",
        POOL,
        SimpleNamespace(
            num_gpu_blocks=POOL.kv_pool_blocks,
            tensor_parallel_size=1,
            data_parallel_size=1,
            expert_parallel_size=1,
        ),
        "test",
        0.0,
        POOL.max_model_len,
    )


def raw_records(engine):
    """The request records as numpy arrays (the test's own copy of the raw fields)."""
    records = sorted(engine.records, key=lambda r: r.request_id)
    assert all(r.outcome == "finished" and r.preemptions == 0 for r in records)  # preconditions
    field = lambda name: np.array([getattr(r, name) for r in records], dtype=float)  # noqa: E731
    return SimpleNamespace(
        arrival=field("arrival_s"),
        admitted=field("admitted_s"),
        first=field("first_token_s"),
        finish=field("finish_s"),
        prompt=field("prompt_tokens").astype(int),
        output=field("output_tokens").astype(int),
    )


def percentile(values, q):
    """Linear interpolation between the order statistics x[floor(h)] and x[floor(h) + 1] at rank
    h = (count - 1) q / 100 (numpy's and pandas' default definition)."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    if low + 1 >= len(ordered):
        return ordered[-1]
    return ordered[low] + (rank - low) * (ordered[low + 1] - ordered[low])


def exact_areas(rec, pool: PoolSpec):
    """Integrals over time (slot-seconds) of used, internal fragmentation and held slots, and of the
    number of running requests, from the records alone, for a constant iteration time T.

    A request with prompt p and output o holds p tokens from admission a to its first token f
    (admission allocates the whole prompt); at f its first token goes in and the next iteration,
    starting at f, writes token 2 at once: it holds p + 1 + j tokens during [f + (j-1)T, f + jT)
    for j = 1 .. o - 1, and frees everything at its finish f + (o - 1)T. Blocks held: ceil(len / 16).
    The last block (index ceil(F/16) - 1, F = p + o) has ceil(F/16) x 16 - F slots that are never
    filled: internal fragmentation while that block is held."""
    used = internal = held = 0.0
    for p, o, a, f, e in zip(rec.prompt, rec.output, rec.admitted, rec.first, rec.finish, strict=True):
        assert e == pytest.approx(f + (o - 1) * T, rel=1e-12)  # constant iteration time
        final_blocks = -(-(p + o) // pool.block_size)
        tail = final_blocks * pool.block_size - (p + o)
        pieces = [(p, f - a)] + [(p + 1 + j, T) for j in range(1, o)]
        for length, duration in pieces:
            blocks = -(-length // pool.block_size)
            used += length * duration
            held += blocks * pool.block_size * duration
            internal += (tail if blocks == final_blocks else 0) * duration
    running = float(np.sum(rec.finish - rec.admitted))
    return used, internal, held, running


@pytest.mark.parametrize("step_mode", ["skip", "single"])
def test_time_averages_equal_the_exact_integrals_from_the_records(step_mode):
    engine = run(ConstantCost(T), step_mode)  # every iteration takes T, whatever it holds
    rec = raw_records(engine)
    end = float(rec.finish.max())
    assert engine.env.now == end
    used, internal, held, running = exact_areas(rec, POOL)
    pool = POOL.kv_pool_tokens
    summary = summary_of(engine)
    expected = {
        "mean_used_frac": used / end / pool,
        "mean_internal_frag_frac": internal / end / pool,
        "mean_reserved_frac": (held - used - internal) / end / pool,
        "mean_external_frag_frac": 5 / pool,
        "mean_cached_frac": 0.0,
        "mean_free_frac": (POOL.kv_pool_blocks * BLOCK * end - held) / end / pool,
        "mean_running": running / end,
    }
    for key, value in expected.items():
        assert summary[key] == pytest.approx(value, rel=1e-9, abs=1e-15), key
    # Event skipping did jump over iterations (fewer sampled instants than iterations), so the
    # check above covers the recorder's rule across a jump, not only single steps.
    if step_mode == "skip":
        assert engine.sink.timeseries()["time_s"].nunique() < engine.counters.iterations


def test_percentiles_means_and_throughput_from_the_requests_table():
    """Iteration times that vary with the batch, the context and the prompt chunks, so TTFT, TPOT
    and end-to-end latency all take many distinct values."""
    costs = RoundCostModel(
        intercept_s=0.01, per_seq_s=0.001, per_context_token_s=1e-5, prefill_per_token_s=1e-4
    )
    engine = run(costs, "skip")
    rec = raw_records(engine)
    ttft = rec.first - rec.arrival
    e2e = rec.finish - rec.arrival
    several = rec.output > 1
    tpot = (rec.finish - rec.first)[several] / (rec.output[several] - 1)
    assert len(set(np.round(e2e, 9))) > 250 and len(set(np.round(tpot, 9))) > 100  # distinct values
    summary = summary_of(engine)
    for key, values, q in (
        ("ttft_p50_s", ttft, 50),
        ("ttft_p99_s", ttft, 99),
        ("tpot_p50_s", tpot, 50),
        ("e2e_p50_s", e2e, 50),
        ("e2e_p99_s", e2e, 99),
    ):
        assert summary[key] == pytest.approx(percentile(values, q), rel=1e-12), key
    end = float(rec.finish.max())
    assert summary["simulated_s"] == end
    assert summary["output_tokens_per_s"] == pytest.approx(rec.output.sum() / end, rel=1e-12)
    assert summary["requests_finished"] == summary["requests_total"] == 300
    assert summary["mean_running"] == pytest.approx(np.sum(rec.finish - rec.admitted) / end, rel=1e-9)
    # Peak running: sweep the admissions (+1) and finishes (-1); a finish at the same instant as an
    # admission comes first (completions end an iteration, admissions start the next one).
    events = sorted([(t, 1) for t in rec.admitted] + [(t, -1) for t in rec.finish])
    assert summary["peak_running"] == max(np.cumsum([step for _, step in events]))
    # The per-request latency columns of the table, against the raw times.
    table = engine.sink.requests().sort_values("request_id")
    np.testing.assert_allclose(table["ttft_s"], ttft, rtol=1e-12)
    np.testing.assert_allclose(table["e2e_s"], e2e, rtol=1e-12)
    np.testing.assert_allclose(table["queue_s"], rec.admitted - rec.arrival, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(table["tpot_s"][several], tpot, rtol=1e-12)
    assert table["tpot_s"][~several].isna().all()


def test_time_averages_equal_the_step_integral_of_the_single_step_series():
    """One iteration at a time, every change happens at an instant and the series holds a row after
    each: the breakdown is a step function of the rows, and its integral (each row's values times the
    time to the next row) over the run is the summary's time average."""
    costs = RoundCostModel(
        intercept_s=0.01, per_seq_s=0.001, per_context_token_s=1e-5, prefill_per_token_s=1e-4
    )
    engine = run(costs, "single")
    series = engine.sink.timeseries()
    times = series["time_s"].to_numpy()
    widths = np.diff(np.append(times, engine.env.now))
    end = engine.env.now
    summary = summary_of(engine)
    for category, key in (
        ("used_tokens", "mean_used_frac"),
        ("reserved_tokens", "mean_reserved_frac"),
        ("internal_fragmentation_tokens", "mean_internal_frag_frac"),
        ("free_tokens", "mean_free_frac"),
    ):
        area = float(np.sum(series[category].to_numpy() * widths))
        assert summary[key] == pytest.approx(area / end / POOL.kv_pool_tokens, rel=1e-9), key
    running = float(np.sum(series["num_requests_running"].to_numpy() * widths))
    assert summary["mean_running"] == pytest.approx(running / end, rel=1e-9)
