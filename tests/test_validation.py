"""`kvsim validate`: claim files, every check's computation, and the fast claims within tolerance.

Expected values are derived here by hand (arithmetic in the comments), independently of the code
under test. Everything runs in fast mode (small request counts), so the file takes seconds.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from sim import validation as v
from sim.config import ConfigError, validate_experiment
from sim.runner import run_variant

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs" / "validation"
GiB = 2**30
# The first test to use fast_results runs every claim in its setup: 35-55 s on two loaded cores, more
# than the suite's default timeout leaves to spare.
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def claims() -> dict[str, v.Claim]:
    return {claim.name: claim for claim in v.load_claims(CONFIGS)}


@pytest.fixture(scope="module")
def fast_results(claims, tmp_path_factory) -> dict[str, v.ClaimResult]:
    """Every claim, run once in fast mode (the fast subset is also the full setup of those claims)."""
    out = tmp_path_factory.mktemp("validation")
    context = v.RunContext(out, fast=True)
    return {name: v.run_claim(claim, context) for name, claim in claims.items()}


def by_target(result: v.ClaimResult) -> dict[str, v.TargetResult]:
    return {target.target.id: target for target in result.targets}


def value(result: v.ClaimResult, target: str) -> float:
    measured = by_target(result)[target].measured.value
    assert measured is not None
    return measured


def verdict(result: v.ClaimResult, target: str) -> str:
    return by_target(result)[target].verdict


# --------------------------------------------------------------------------------------------------
# Claim files
# --------------------------------------------------------------------------------------------------


def test_every_validation_yaml_loads(claims):
    paths = sorted(CONFIGS.glob("*.yaml"))
    assert len(paths) == len(claims) >= 13
    numbers = {claim.spec.number for claim in claims.values()}
    assert {"1", "2", "3", "4", "5", "6", "7", "8", "9a", "9b", "9c", "9d", "10", "cap"} <= numbers
    for claim in claims.values():
        assert claim.path.stem == claim.name
        for target in claim.spec.targets:
            assert target.not_reproducible or target.tolerance is not None
    fast = {claim.spec.number for claim in claims.values() if claim.spec.fast}
    assert fast == {"1", "2", "5", "7", "cap", "cap-hybrid", "c1", "g1", "g2", "sd1", "sd2"}


def test_claims_run_in_issue_order(claims):
    order = [claim.spec.number for claim in v.load_claims(CONFIGS)]
    assert order == [
        "1",
        "2",
        "3",
        "4",
        "5",
        "6",
        "7",
        "8",
        "9a",
        "9b",
        "9c",
        "9d",
        "10",
        "c1",
        "c2",
        "cap",
        "cap-hybrid",
        "d1",
        "g1",
        "g2",
        "j1",
        "j2",
        "m1",
        "r1",
        "sd1",
        "sd2",
    ]


def test_select_by_name_and_number():
    chosen = v.load_claims(CONFIGS, ["seed003-tail-waste", "1"])
    assert [claim.spec.number for claim in chosen] == ["1", "7"]  # issue order, whatever the order asked
    with pytest.raises(ConfigError, match="no validation claim named 'nope'"):
        v.load_claims(CONFIGS, ["nope"])


def write_claim(tmp_path: Path, data: dict, name: str = "demo") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    return path


def tail_claim_data() -> dict:
    return yaml.safe_load((CONFIGS / "seed003-tail-waste.yaml").read_text()) | {}


def test_claim_schema_errors_are_clear(tmp_path):
    data = tail_claim_data()
    data["claim"]["name"] = "demo"
    data["claim"]["surprise"] = 1
    with pytest.raises(
        ConfigError, match=r"(?s)demo\.yaml: invalid validation claim.*\n  claim\.surprise: unknown key"
    ):
        v.load_claim(write_claim(tmp_path, data))

    data = tail_claim_data()
    data["claim"]["name"] = "demo"
    data["claim"]["check"] = "tail_wast"
    with pytest.raises(ConfigError, match="unknown check 'tail_wast'"):
        v.load_claim(write_claim(tmp_path, data))

    data = tail_claim_data()
    with pytest.raises(ConfigError, match="must equal the file name 'demo'"):
        v.load_claim(write_claim(tmp_path, data))

    data = tail_claim_data()
    data["claim"]["name"] = "demo"
    del data["claim"]["targets"][0]["tolerance"]
    with pytest.raises(ConfigError, match="give `expected` and `tolerance`"):
        v.load_claim(write_claim(tmp_path, data))

    data = tail_claim_data()
    data["claim"]["name"] = "demo"
    data["claim"]["params"]["seq_lenn"] = 3
    with pytest.raises(
        ConfigError, match=r"(?s)claim.params for check 'tail_waste'.*claim\.params\.seq_lenn: unknown key"
    ):
        v.load_claim(write_claim(tmp_path, data))


def test_experiment_errors_name_the_case(tmp_path):
    data = yaml.safe_load((CONFIGS / "vllm-block-size.yaml").read_text())
    data["claim"]["name"] = "demo"
    data["cases"]["alpaca"]["engine"] = {"blok_size": 8}
    with pytest.raises(
        ConfigError, match=r"(?s)case alpaca.*engine\.blok_size: unknown key; did you mean 'block_size'"
    ):
        v.load_claim(write_claim(tmp_path, data))
    del data["cases"]["alpaca"]
    with pytest.raises(ConfigError, match="needs a case named 'alpaca'"):
        v.load_claim(write_claim(tmp_path, data))


def test_tolerances():
    assert v.Tolerance(kind="abs", value=0.03).accepts(0.204, 0.18)
    assert not v.Tolerance(kind="abs", value=0.03).accepts(0.204, 0.17)
    assert v.Tolerance(kind="rel", value=0.03).accepts(15700, 15250)  # -2.9 %
    assert not v.Tolerance(kind="rel", value=0.03).accepts(15700, 14640)  # -6.8 %
    assert v.Tolerance(kind="at_least").accepts(0.6, 0.6) and not v.Tolerance(kind="at_least").accepts(
        0.6, 0.59
    )
    assert v.Tolerance(kind="at_most").accepts(0.1, 0.05) and not v.Tolerance(kind="at_most").accepts(
        0.1, 0.11
    )
    assert v.Tolerance(kind="exact").accepts(7, 7.0) and not v.Tolerance(kind="exact").accepts(7, 7.01)
    assert v.Tolerance(kind="abs", value=0.03).describe(0.2, "{:.1%}") == "± 3 pp"
    assert v.Tolerance(kind="rel", value=0.03).describe(1, "{:.0f}") == "± 3% (relative)"


def test_judge_verdicts():
    target = v.Target(
        id="x", label="x", claimed="1", expected=1.0, units="u", tolerance=v.Tolerance(kind="abs", value=0.1),
        compare="c", if_not_holds="because",
    )  # fmt: skip
    assert v.judge(target, v.Measured(1.05)) == (v.HOLDS, "")
    assert v.judge(target, v.Measured(1.5, "numbers")) == (v.DOES_NOT_HOLD, "because numbers")
    assert v.judge(target, v.Measured(None))[0] == v.NOT_REPRODUCIBLE
    unknowable = v.Target(id="y", label="y", claimed="?", units="u", compare="c", not_reproducible="no model")
    assert v.judge(unknowable, v.Measured(3.0, "but this"))[0] == v.NOT_REPRODUCIBLE


def test_deep_merge_replaces_a_different_kind():
    base = {"workload": {"arrival": {"kind": "poisson", "rate_per_s": 2}, "num_requests": 10}}
    merged = v.deep_merge(base, {"workload": {"arrival": {"kind": "batch"}}})
    assert merged["workload"] == {"arrival": {"kind": "batch"}, "num_requests": 10}
    merged = v.deep_merge(base, {"workload": {"arrival": {"rate_per_s": 3}}})
    assert merged["workload"]["arrival"] == {"kind": "poisson", "rate_per_s": 3}
    assert base["workload"]["arrival"]["rate_per_s"] == 2  # not modified


# --------------------------------------------------------------------------------------------------
# Fast claims, asserted within tolerance against hand arithmetic
# --------------------------------------------------------------------------------------------------


def test_claim1_table1_capacity(fast_results):
    result = fast_results["vllm-table1-capacity"]
    # OPT-13B: 2 x 40 layers x 5120 x 2 B = 819,200 B = 800 KiB per token.
    assert value(result, "kv_bytes_per_token") == 819_200
    # 12 GiB = 12,884,901,888 B / 819,200 = 15,728.6 slots -> 983 blocks of 16 = 15,728.
    assert value(result, "opt13b_slots@GiB") == 15_728
    # OPT-66B over 4 GPUs: 21 GiB / 4 = 5,637,144,576 B per GPU; 72 heads / 4 = 18 per GPU:
    # 2 x 64 x 18 x 128 x 2 = 589,824 B per token per GPU -> 9,557.3 -> 597 blocks = 9,552.
    assert value(result, "opt66b_slots@GiB") == 9_552
    # OPT-175B over 8 GPUs: 264 GiB / 8 = 35,433,480,192 B; 96 / 8 = 12 heads:
    # 2 x 96 x 12 x 128 x 2 = 589,824 B -> 60,074.7 -> 3,754 blocks = 60,064.
    assert value(result, "opt175b_slots@GiB") == 60_064
    # 12e9 / 819,200 = 14,648.4 -> 915 blocks = 14,640: 6.8 % under the printed 15.7K.
    assert value(result, "opt13b_slots@GB") == 14_640
    for target in ("kv_bytes_per_token", "opt13b_slots@GiB", "opt66b_slots@GiB", "opt175b_slots@GiB"):
        assert verdict(result, target) == v.HOLDS
    for target in ("opt13b_slots@GB", "opt66b_slots@GB", "opt175b_slots@GB"):
        assert verdict(result, target) == v.DOES_NOT_HOLD


def test_claim2_max_reservation_caps_at_seven(fast_results):
    result = fast_results["vllm-fig13-max-cap"]
    # 15,728 slots; the buddy's top-level chunks are 8192 + 4096 + 2048 + 1024 + 256 + 64 + 16, so
    # there are 4 + 2 + 1 = 7 chunks of 2048 = floor(15,728 / 2048): exactly 7 while requests wait.
    for case in ("sharegpt-2rps", "alpaca-30rps", "offline-batch"):
        assert value(result, f"saturated_mean_batch@{case}") == pytest.approx(7.0, abs=1e-9)
        assert verdict(result, f"saturated_mean_batch@{case}") == v.HOLDS
    assert value(result, "peak_batch") == 7
    assert all(t.verdict == v.HOLDS for t in result.targets if not t.target.secondary)
    # vLLM batches more than Max at the same rate (its Fig. 13 number needs a latency model).
    assert value(result, "mean_batch@paged") > 7


def test_claim5_7b_kv_is_32_gib(fast_results):
    result = fast_results["seed003-7b-kv-32gb"]
    # 2 x 32 x 4096 x 4096 x 2 x 16 = 2^1 x 2^5 x 2^12 x 2^12 x 2^1 x 2^4 = 2^35 B = 32 GiB (34.36 GB).
    assert value(result, "kv_total_gib") == 32.0
    # 6,738,415,616 params x 2 B = 13.48 GB ("约14GB").
    assert value(result, "weights_gb") == pytest.approx(13.476831232)
    # 34.36 GB / 13.48 GB = 2.55 ("两倍以上").
    assert value(result, "kv_over_weights") == pytest.approx(2**35 / 13_476_831_232)
    # A 32 GiB pool = 2^35 / (16 x 524,288 B) = 4096 blocks; a 4096-token request takes 256: 16.00x.
    assert value(result, "pool_concurrency") == 16.0
    assert all(t.verdict == v.HOLDS for t in result.targets)


def test_claim7_tail_waste(fast_results):
    result = fast_results["seed003-tail-waste"]
    # Block 16: 150 = 9 x 16 + 6 -> 10 blocks = 160 slots, 10 unfilled: 10/160 = 6.25 %.
    assert value(result, "waste_block16") == 10 / 160
    assert verdict(result, "waste_block16") == v.HOLDS
    # Block 32: 150 = 4 x 32 + 22 -> 5 blocks = 160 slots, 10 unfilled: 6.25 % again, not 3.1 %.
    assert value(result, "waste_block32") == 10 / 160
    assert verdict(result, "waste_block32") == v.DOES_NOT_HOLD
    waste, breakdown = v.tail_waste(150, 16)
    assert (breakdown.used, breakdown.reserved + breakdown.internal_fragmentation) == (150, 10)


def test_capacity_line_llama31_8b(fast_results):
    result = fast_results["vllm-capacity-line-llama31-8b"]
    # 80 GiB x 0.9 = 77,309,411,328 B; weights 8,030,261,248 x 2 = 16,060,522,496 B; activation
    # peak 8192 x (3 x 14336 + 48 x 128 + 4 x 4096) x 2 = 1,073,741,824 B + logits 256 x 128,256 x 4
    # = 131,334,144 B; KV 60,043,812,864 B / (16 x 131,072 B) = 28,631 blocks = 458,096 tokens.
    memory = 80 * GiB
    kv = memory * 9 // 10 - 8_030_261_248 * 2 - (8192 * 65_536 * 2 + 256 * 128_256 * 4)
    blocks = kv // (16 * 2 * 32 * 8 * 128 * 2)
    assert blocks == 28_631
    assert value(result, "util090_tokens") == blocks * 16 == 458_096
    # Maximum concurrency for 8192 tokens = 28,631 / (8192 / 16) = 55.92x.
    assert value(result, "util090_concurrency") == pytest.approx(28_631 / 512)
    # 0.92: ceil(0.92 x 80 GiB) = 79,027,398,247 B -> 29,450 blocks = 471,200 tokens, 57.52x.
    assert value(result, "util092_tokens") == 471_200
    assert all(t.verdict == v.HOLDS for t in result.targets)


# --------------------------------------------------------------------------------------------------
# The other claims: their computations, on the fast setups
# --------------------------------------------------------------------------------------------------


def test_claim3_fig2_columns_partition_the_pool(claims, fast_results):
    result = fast_results["vllm-fig2-memory-shares"]
    table = result.output.tables["shares_vs_rate"]
    assert set(table.variant) == {"contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged"}
    for row in table.itertuples():
        # the four columns partition the pool; 'others' = external + buddy rounding + idle free
        assert row.token_states + row.reservation + row.internal + row.others == pytest.approx(1.0)
        assert row.others == pytest.approx(row.external + row.buddy_rounding + row.idle_free, abs=2e-3)
    oracle = table[table.variant == "contiguous-oracle"].iloc[0]
    assert oracle.internal == 0.0 and oracle.buddy_rounding > 0  # Oracle's waste is the buddy's rounding
    paged = table[table.variant == "paged"].iloc[0]
    assert paged.token_states_busy > 0.95  # at most one partly filled block per sequence
    assert all(target.measured.value is not None for target in result.targets)


def test_claim3_internal_split_matches_the_policy(claims):
    # The requests-table split (rule overshoot + buddy rounding) equals the policy's own time-averaged
    # internal fragmentation, for a tiny pow2-on-buddy run.
    claim = claims["vllm-fig2-memory-shares"]
    data = claim.experiment_data(fast=True)
    data["workload"]["num_requests"] = 60
    config = validate_experiment(data)
    variant = next(x for x in config.variants if x.name == "contiguous-pow2")
    result = run_variant(config, variant, claim.path.parent)
    rule, rounding = v.contiguous_internal_split(result, "pow2", "buddy")
    assert rule > 0 and rounding > 0
    assert rule + rounding == pytest.approx(result.summary["mean_internal_frag_frac"], abs=1e-3)


def test_steady_window_and_window_means_by_hand():
    # Arrivals at 0, 1, ..., 9 s: 20 % warm-up starts the window at the 3rd arrival (2 s); it ends at
    # the last one (9 s).
    requests = pd.DataFrame({"arrival_s": [float(t) for t in range(10)]})
    assert v.steady_window(requests, 0.2) == (2.0, 9.0)
    # used 0 on [0, 4) and 10 on [4, 10) (rows at equal values: no slope inside an interval);
    # waiting from 6 s. Window [2, 9]: used = 10 x 5 / 7, waiting share 3 / 7.
    series = pd.DataFrame(
        {
            "time_s": [0.0, 4.0, 4.0, 6.0, 10.0],
            "used_tokens": [0, 0, 10, 10, 10],
            "num_requests_running": [0, 1, 1, 1, 1],
            "num_requests_waiting": [0, 0, 0, 1, 1],
        }
    )
    for category in ("reserved", "internal_fragmentation", "external_fragmentation", "cached", "free"):
        series[f"{category}_tokens"] = 0
    means = v.window_means(series, 100, 2.0, 9.0)
    assert means["window_s"] == 7.0
    assert means["used"] == pytest.approx(10 * 5 / 7 / 100)
    assert means["running"] == pytest.approx(5 / 7)
    assert means["waiting_share"] == pytest.approx(3 / 7)


def test_max_closed_form_and_its_inversion_by_hand():
    from sim.validation.checks_vllm import invert_max_column, max_closed_form

    # Two requests (p, o) = (100, 200) and (300, 400); pool 4096, max_model_len 2048: B = 2.
    # E[o] = 300, E[o^2] = (40,000 + 160,000) / 2 = 100,000, E[p o] = (20,000 + 120,000) / 2 = 70,000.
    # used = 2 / 4096 x (70,000 + 50,000) / 300 = 0.1953125; reservation = 2 / 4096 x 100,000 / 600.
    requests = pd.DataFrame(
        {"outcome": ["finished", "finished"], "prompt_tokens": [100, 300], "output_tokens": [200, 400]}
    )
    closed = max_closed_form(requests, 4096, 2048)
    assert closed["batch"] == 2
    assert closed["used"] == pytest.approx(2 / 4096 * 120_000 / 300)
    assert closed["reservation"] == pytest.approx(2 / 4096 * 100_000 / 600)
    # The paper's Max column (20.4 %, 13.3 %), pool 15,728, 7 running, E[o] = 337.99:
    # E[o^2]/E[o] = 2 x 0.133 x 15,728 / 7 = 597.66; CV = sqrt(597.66 / 337.99 - 1) = 0.8765;
    # E[p o]/E[o] = 0.071 x 15,728 / 7 = 1,116.688 / 7 = 159.527.
    implied = invert_max_column(0.204, 0.133, 7, 15_728, 337.99)
    assert implied["e_o2_over_e_o"] == pytest.approx(597.664, abs=1e-3)
    assert implied["cv_o"] == pytest.approx(0.8765, abs=1e-4)
    assert implied["e_po_over_e_o"] == pytest.approx(159.527, abs=1e-3)


def test_claim3_max_matches_its_closed_form_at_saturation(fast_results):
    table = fast_results["vllm-fig2-memory-shares"].output.tables["shares_vs_rate"]
    row = table[table.variant == "contiguous-max"].iloc[0]
    assert row.waiting_share == pytest.approx(1.0) and row.mean_running == pytest.approx(7.0)
    # The closed form leaves out the prefill iteration and admission gaps, and averages over every
    # finished request, while the fast run's 80 s window sees a few dozen (the full run agrees within
    # 0.3 pp): within 2 pp.
    assert row.token_states == pytest.approx(row.closed_form_used, abs=0.02)
    assert row.reservation == pytest.approx(row.closed_form_reservation, abs=0.02)


def test_saturated_means_follow_the_recorder(claims):
    claim = claims["vllm-fig13-max-cap"]
    config = claim.config("offline-batch", {"workload": {"num_requests": 20}}, fast=True)
    (result,) = v.run_config(config, claim.path.parent, ["contiguous-max"]).values()
    frame = v.interval_frame(result.timeseries)
    whole = (frame["used_tokens"] * frame["dt"]).sum() / frame["dt"].sum() / result.summary["kv_pool_tokens"]
    # Exact: the intervals' means come from the recorder's areas (a trapezoid was within ~1 %).
    assert whole == pytest.approx(result.summary["mean_used_frac"], rel=1e-9)
    saturated = v.saturated_means(result.timeseries, int(result.summary["kv_pool_tokens"]))
    assert saturated["running"] == pytest.approx(7.0)  # 20 requests at t=0, 7 fit, the rest wait
    assert 0 < saturated["saturated_s"] < result.summary["simulated_s"]


def test_claim4_block_size(fast_results):
    result = fast_results["vllm-block-size"]
    table = result.output.tables["block_sweep"]
    alpaca = table[table.case == "alpaca"].set_index("block_size")
    # 128-token blocks hold an Alpaca-like sequence (~80 tokens) in one mostly empty block.
    assert alpaca.loc[128, "saturated_waste"] > 2 * alpaca.loc[16, "saturated_waste"]
    assert value(result, "alpaca/batch_ratio_128") < 0.8
    sharegpt = table[table.case == "sharegpt"].set_index("block_size")
    assert sharegpt.loc[128, "saturated_waste"] < alpaca.loc[128, "saturated_waste"]


def test_claim6_prealloc_vs_paged(fast_results):
    result = fast_results["seed003-prealloc-vs-paged"]
    # Preallocation: every running request holds 2048 slots of which ~(450 + 60) hold tokens: ~25 %.
    assert 0.15 < value(result, "prealloc_token_share") < 0.35
    assert value(result, "paged_token_share") > 0.8
    # Paging is memory-bound at ~2048 / (live length + tail) times the preallocated batch.
    assert value(result, "concurrency_ratio") > 2.5


def test_claim10_fig15_sharing_rises_with_width(fast_results):
    result = fast_results["vllm-fig15-sharing"]
    table = result.output.tables["saving"]
    assert set(table.q.dropna()) == {0.15}  # the fast sweep: one q, which is then the fit
    sampling = [value(result, f"sampling@{w}") for w in (2, 4, 6)]
    beams = [value(result, f"beam@{w}") for w in (2, 4, 6)]
    # More samples or beams share the prompt (and beams their common history) more ways.
    assert sampling == sorted(sampling) and beams == sorted(beams)
    # Samples share only the ~19-token prompt (about one block) out of ~80 tokens each: well under
    # half of the beams' saving, which also shares generated history.
    assert all(0 < s < 0.2 and b > 2 * s for s, b in zip(sampling, beams, strict=True))
    # Samples stopping together share the prompt n ways until the request ends; stopping
    # independently, fewer samples share it as they finish: the saving is smaller.
    table = table.set_index(["mode", "width"])
    for width in (2, 4, 6):
        together = table.loc[("sampling (identical lengths)", width), "saved"]
        assert together > table.loc[("sampling (independent lengths)", width), "saved"]


def test_claim6_partial_load_ratio_equals_the_share_ratio(fast_results):
    result = fast_results["seed003-prealloc-vs-paged"]
    (row,) = result.output.tables["partial_load"].itertuples()
    assert row.rate == 14
    # Preallocation saturates first: its batch is floor(pool / 2048) = 22 with a request waiting.
    assert row.prealloc_running == pytest.approx(22, abs=0.5) and row.prealloc_waiting_share > 0.9
    # Under one load both serve the same requests, so the live tokens per running request agree and
    # the concurrency ratio is the token-share ratio (up to which requests are live in the window).
    assert row.concurrency_ratio == pytest.approx(row.paged_token_share / row.prealloc_token_share, rel=0.05)
    assert row.paged_running > row.prealloc_running


def test_claim8_static_oom(fast_results):
    result = fast_results["seed000-13b-static-oom"]
    # LLaMA-13B: 2 x 40 x 5120 x 2 B = 819,200 B per token x 2048 = 1,677,721,600 B = 1.68 GB.
    assert value(result, "kv_per_request_gb") == pytest.approx(1.6777216)
    assert verdict(result, "kv_per_request_gb") == v.DOES_NOT_HOLD
    # The article's numbers: (16 - 5.2) / 2.8 = 3.86 -> 3 fit, the 4th OOMs.
    assert value(result, "article_arithmetic_oom_at") == 4
    assert verdict(result, "article_arithmetic_oom_at") == v.DOES_NOT_HOLD
    # Simulated: 10.8e9 / 819,200 = 13,183.6 slots -> 823 blocks = 13,168; floor(13,168 / 2048) = 6
    # requests fit, the 7th fails.
    assert value(result, "simulated_oom_at") == 7
    assert verdict(result, "simulated_oom_at") == v.HOLDS


def test_claim9a_block_overhead(fast_results):
    result = fast_results["seed000-block64-overhead"]
    overhead, fragmentation = value(result, "overhead"), value(result, "fragmentation")
    # A 64-token tail block is on average half empty: ~32 slots per sequence of a few hundred tokens.
    assert 0.03 < overhead < 0.15
    assert 0 < fragmentation < 0.15


def test_claim9b_system_prompt_saving(fast_results):
    saving = value(fast_results["seed000-system-prompt-saving"], "saving")
    assert 0.05 < saving < 0.6


def test_claim9c_template_reuse(fast_results):
    result = fast_results["seed000-template-reuse"]
    # 341-token template -> 21 full blocks = 336 cached tokens; request part ~64: 336 / 405 = 83 %.
    assert value(result, "reuse") == pytest.approx(336 / (341 + 64), abs=0.03)


def test_claim9d_recompute_vs_reuse(fast_results):
    result = fast_results["seed000-recompute-vs-reuse"]
    assert verdict(result, "short_prefix_recompute_faster") == v.NOT_REPRODUCIBLE
    # Saved prefill = 2 x params x P / FLOPS + 4 x layers x width x P^2/2 / FLOPS for P = 256:
    # 2 x 13,015,864,320 x 256 / 312e12 = 21.360 ms; 4 x 40 x 5120 x 32,768 / 312e12 = 0.086 ms.
    assert value(result, "short_prefix_recompute_faster") == pytest.approx(21.446, rel=1e-3)
    table = result.output.tables["recompute_vs_reuse"]
    assert (table.saved_ms > 0).all()
    # one 64-token block copy: 2 x 64 x 819,200 B / 1.555e12 B/s = 67 us
    assert table.cow_copy_one_block_us.iloc[0] == pytest.approx(67.4, abs=0.1)


def test_cost_claim_c1_reports_the_vidur_bands(fast_results):
    """c1 reports what calibrate.vidur computes (tests/test_vidur.py checks that), and its verdicts
    follow the stated tolerances: mean |error| <= 5 %, worst point <= 15 %."""
    from calibrate import vidur

    result = fast_results["costs-vidur-holdout"]
    bands = vidur.error_bands()
    for target in result.targets:
        model, dataset, phase, kind = target.target.id.split("/")
        band = bands[dataset][f"{model}/{phase}"]
        expected = band.mean_abs if kind == "mean" else max(-band.low, band.high)
        assert target.measured.value == pytest.approx(expected, rel=1e-12)
        limit = 0.05 if kind == "mean" else 0.15
        assert (target.verdict == v.HOLDS) == (expected <= limit + 1e-9), target.target.id
    # the datasheet roofline is too fast on every held-out point
    assert verdict(result, "analytic/a100-llama-2-7b/decode/worst") == v.DOES_NOT_HOLD
    assert (result.output.tables["errors"].query("cost_model == 'analytic'").max_rel_err < 0).all()


def test_cost_claim_c2_batch_follows_the_iteration_time(fast_results):
    """Little's law: at the same arrival rate, longer iterations keep more requests in flight. The
    derated model's iterations are longer than the roofline's, so its mean batch is larger; the
    paper's 30.42 requests at 2 req/s imply 30.42 / 2 / 337.99 = 45.0 ms per output token."""
    result = fast_results["costs-vllm-fig13-batch"]
    table = result.output.tables["batch_by_cost_model"].set_index("cost_model")
    assert table.loc["derated", "mean_iteration_s"] > table.loc["analytic", "mean_iteration_s"]
    assert value(result, "mean_batch@derated") > value(result, "mean_batch@analytic")
    assert table.loc["derated", "implied_step_s"] == pytest.approx(30.42 / 2 / 337.99, rel=1e-12)
    assert table.loc["derated", "label"].startswith("derated-analytic (A100 factors")
    assert "not validated on A100-40GB" in table.loc["derated", "error_band"]


# --------------------------------------------------------------------------------------------------
# Claim d1: DistServe's goodput per GPU, colocated against 2 prefill + 1 decode GPUs
# --------------------------------------------------------------------------------------------------


def test_d1_latencies_with_either_first_token_by_hand():
    from sim.validation.checks_disaggregation import request_latencies

    # r0 prefilled where it decodes: first token 0.1 s after arrival, 63 steps to 0.73 s.
    # r1 disaggregated: prompt done on the prefill replica at 1.07 s, first token from the decode
    # replica at 1.12 s, done at 1.75 s. r2 rejected: misses both.
    requests = pd.DataFrame(
        {
            "outcome": ["finished", "finished", "rejected"],
            "arrival_s": [0.0, 1.0, 2.0],
            "prefill_done_s": [float("nan"), 1.07, float("nan")],
            "first_token_s": [0.1, 1.12, float("nan")],
            "finish_s": [0.73, 1.75, float("nan")],
            "output_tokens": [64, 64, 0],
            "ttft_s": [0.1, 0.12, float("nan")],
            "tpot_s": [0.63 / 63, 0.63 / 63, float("nan")],
        }
    )
    ttft, tpot = request_latencies(requests, "client")
    assert list(ttft) == pytest.approx([0.1, 0.12, float("inf")])
    assert list(tpot) == pytest.approx([0.01, 0.01, float("inf")])
    ttft, tpot = request_latencies(requests, "prefill")
    # r1: TTFT 1.07 - 1.0 = 0.07 s; TPOT (1.75 - 1.07) / 63 = 0.68 / 63: TTFT + 63 TPOT is still 0.75 s.
    assert list(ttft) == pytest.approx([0.1, 0.07, float("inf")])
    assert list(tpot) == pytest.approx([0.01, 0.68 / 63, float("inf")])


def test_d1_attainment_and_slo_reading_by_hand():
    from sim.validation.checks_disaggregation import local_slope, share_within, slo_at

    values = np.array([0.1 * i for i in range(1, 11)])  # 0.1 .. 1.0 s
    # 9 of 10 are within 0.9 s: the inverted CDF's 90th percentile is 0.9 itself, not 0.91.
    assert slo_at(values, 0.9) == pytest.approx(0.9)
    assert share_within(values, 0.9) == 0.9
    assert share_within(values, 0.85) == 0.8
    # a request that did not finish (inf) misses; one without a TPOT (NaN: one output token) meets
    assert share_within(np.array([0.1, np.inf, np.nan, 2.0]), 1.0) == 0.5
    # y = 2x + 8 near x = 2; the point at x = 5 is outside the +-1 window
    assert local_slope([(1, 10), (2, 12), (3, 14), (5, 100)], 2, 1) == pytest.approx(2.0)
    assert local_slope([(2, 12), (5, 100)], 2, 1) is None


def test_d1_bisection_by_hand():
    from sim.validation.checks_disaggregation import bisect_goodput

    probed = []

    def meets(rate):
        probed.append(rate)
        return rate <= 2.07

    # [0.25, 8]: 4.125 misses, 2.1875 misses, 1.21875, 1.703125, 1.9453125, 2.06640625 meet,
    # 2.126953125, 2.0966796875, 2.08154296875 miss; the bracket is then 0.0151 <= 0.02 wide.
    low, high, why = bisect_goodput(meets, 0.25, 8.0, 0.02)
    assert (low, high, why) == (2.06640625, 2.08154296875, "")
    assert probed[:3] == [0.25, 8.0, 4.125] and len(probed) == 11
    assert bisect_goodput(lambda rate: True, 0.25, 8.0, 0.02) == (
        None,
        None,
        "meets its SLOs still at 8 req/s per GPU (the search's high end)",
    )
    assert bisect_goodput(lambda rate: False, 0.25, 8.0, 0.02)[:2] == (None, None)


def test_d1_params_errors_name_the_key(tmp_path):
    data = yaml.safe_load((CONFIGS / "distserve-fig1-goodput.yaml").read_text())
    data["claim"]["params"]["ratios"]["ratio"] = ["2p1d", "nope"]
    with pytest.raises(ConfigError, match=r"ratios\.ratio: unknown setup\(s\) nope"):
        v.load_claim(write_claim(tmp_path, data, "distserve-fig1-goodput"))
    data = yaml.safe_load((CONFIGS / "distserve-fig1-goodput.yaml").read_text())
    data["claim"]["params"]["search"]["low_per_gpu"] = 9
    with pytest.raises(ConfigError, match="low_per_gpu must be below high_per_gpu"):
        v.load_claim(write_claim(tmp_path, data, "distserve-fig1-goodput"))
    # a variant the experiment lacks: refused before anything runs
    data = yaml.safe_load((CONFIGS / "distserve-fig1-goodput.yaml").read_text())
    data["claim"]["params"]["setups"]["colocated"]["variant"] = "nope"
    claim = v.load_claim(write_claim(tmp_path, data, "distserve-fig1-goodput"))
    with pytest.raises(ConfigError, match=r"claim\.params\.setups\.colocated\.variant: no variant 'nope'"):
        v.run_claim(claim, v.RunContext(tmp_path, fast=True))


def test_d1_goodputs_follow_their_probes(fast_results):
    """Each goodput is the highest probe that met both SLOs, below every probe that missed one; the
    ratio is the quotient; the same cluster judged with DistServe's first token (prefill replica)
    never has a later TTFT than with the client's (decode replica)."""
    result = fast_results["distserve-fig1-goodput"]
    probes = result.output.tables["probes"]
    for setup in ("colocated", "2p1d", "2p1d-client"):
        rows = probes[probes.setup == setup]
        goodput = value(result, f"goodput_per_gpu@{setup}")
        assert goodput == rows[rows.meets].rate_per_gpu.max()
        assert goodput < rows[~rows.meets].rate_per_gpu.min()
        # under --fast the bisection stops at 0.1 req/s
        assert rows[~rows.meets].rate_per_gpu.min() - goodput <= 0.1
    assert value(result, "ratio") == value(result, "goodput_per_gpu@2p1d") / value(
        result, "goodput_per_gpu@colocated"
    )
    both = probes[probes.setup == "2p1d"].merge(
        probes[probes.setup == "2p1d-client"], on="rate_per_gpu", suffixes=("_prefill", "_client")
    )
    assert len(both) >= 2  # the setups share their runs where they probe the same rate
    assert (both.ttft_p_s_prefill < both.ttft_p_s_client).all()
    # the SLOs are the single-phase runs' P90s: a 64-token request's TPOT is below its TTFT
    ttft_slo, tpot_slo = (result.output.values[f"{key}_slo_s"].value for key in ("ttft", "tpot"))
    assert ttft_slo is not None and tpot_slo is not None and 0 < tpot_slo < ttft_slo


# --------------------------------------------------------------------------------------------------
# Command line and output folder
# --------------------------------------------------------------------------------------------------


def kvsim(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kvsim")
    v.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_writes_csv_and_markdown(tmp_path, capsys):
    out = tmp_path / "val"
    assert kvsim(["validate", "seed003-tail-waste", "5", "-o", str(out), "-q"]) == 0
    table = pd.read_csv(out / "validation.csv")
    assert list(table.claim.unique()) == ["seed003-7b-kv-32gb", "seed003-tail-waste"]
    assert set(table.verdict) <= set(v.VERDICTS)
    row = table[table.target == "waste_block32"].iloc[0]
    assert (row.verdict, row.simulated, row.expected) == (v.DOES_NOT_HOLD, "6.25%", "3.10%")
    assert "10 are unfilled" in row.explanation
    report = (out / "validation.md").read_text()
    assert (
        "| # | claim | source | setup | expected | simulated | tolerance | verdict | explanation |" in report
    )
    assert "**does not hold**" in report and "figures/seed003-tail-waste.png" in report
    assert (out / "figures" / "seed003-tail-waste.png").is_file()
    assert "2 claim(s)" in capsys.readouterr().out
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".val.partial-")]


def test_failed_run_leaves_previous_results(tmp_path, monkeypatch):
    out = tmp_path / "val"
    assert kvsim(["validate", "7", "-o", str(out), "-q"]) == 0
    before = (out / "validation.md").read_text()

    def broken(claim, context):
        raise RuntimeError("boom")

    check = v.CHECKS["tail_waste"]
    monkeypatch.setitem(v.CHECKS, "tail_waste", v.Check(broken, check.params))
    with pytest.raises(RuntimeError, match="boom"):
        kvsim(["validate", "7", "-o", str(out), "-q"])
    assert (out / "validation.md").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["val"]


def test_list_claims(capsys):
    assert kvsim(["validate", "--list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(list(CONFIGS.glob("*.yaml")))
    assert "vllm-fig2-memory-shares" in lines[2]


def test_custom_config_dir(tmp_path):
    shutil.copy(CONFIGS / "seed003-tail-waste.yaml", tmp_path)
    assert kvsim(["validate", "--configs", str(tmp_path), "-o", str(tmp_path / "out"), "-q"]) == 0
    assert len(pd.read_csv(tmp_path / "out" / "validation.csv")) == 2


def test_the_cli_registers_validate_without_importing_the_checks() -> None:
    """Every kvsim command builds the whole parser: the checks (and what they import) load only when a
    claim needs them, and then all of them are registered."""
    import subprocess
    import sys

    code = (
        "import sys; from sim.cli import build_parser; build_parser(); "
        "print(any(name.startswith('sim.validation.checks_') for name in sys.modules)); "
        "import sim.validation as v; print(sorted(v.CHECKS) == sorted(v.registry.checks()) and len(v.CHECKS) > 5)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]
