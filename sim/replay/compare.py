"""Measured against simulated, request by request: the numbers a replay report prints.

Both tables have one row per measured request (the same ``request_id``). Latencies follow the data's
own definitions (:class:`sim.replay.measured.MeasuredRun`): TTFT and E2E from the run's anchor,
TPOT as its publisher computed it. Errors are signed relative errors ``simulated / measured - 1``
(and their absolute values), so +10 % means kvsim is 10 % slow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from sim.replay.measured import MeasuredRun

STATISTICS = ("mean", "p50", "p90", "p99")
LATENCIES = ("ttft_s", "tpot_s", "e2e_s")
LATENCY_NAMES = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E"}


def per_request_tpot(frame: pd.DataFrame) -> pd.Series:
    """``(E2E - TTFT) / (output - 1)`` per request (NaN for one-token outputs)."""
    decode = (frame["output_tokens"] - 1).where(frame["output_tokens"] > 1)
    return (frame["e2e_s"] - frame["ttft_s"]) / decode


def headline_tpot(frame: pd.DataFrame, definition: str) -> float:
    """The run's TPOT as its publisher defines it (see ``TpotDefinition``)."""
    if definition == "ratio_of_means":
        decoded_tokens = frame["output_tokens"].mean() - 1
        if not decoded_tokens > 0:  # one-token outputs only: no decode step to time
            return math.nan
        return float((frame["e2e_s"].mean() - frame["ttft_s"].mean()) / decoded_tokens)
    return float(per_request_tpot(frame).mean())


def statistics(values: pd.Series) -> dict[str, float]:
    clean = values.dropna().to_numpy(dtype=float)
    if not len(clean):
        return {name: math.nan for name in STATISTICS}
    return {
        "mean": float(clean.mean()),
        "p50": float(np.percentile(clean, 50)),
        "p90": float(np.percentile(clean, 90)),
        "p99": float(np.percentile(clean, 99)),
    }


def throughput(frame: pd.DataFrame) -> dict[str, float]:
    """Requests and output tokens per second from the first arrival to the last finish."""
    finished = frame.dropna(subset=["e2e_s"])
    if finished.empty:
        return {"requests_per_s": math.nan, "output_tokens_per_s": math.nan}
    span = float((finished["arrival_s"] + finished["e2e_s"]).max() - frame["arrival_s"].min())
    if span <= 0:
        return {"requests_per_s": math.nan, "output_tokens_per_s": math.nan}
    return {
        "requests_per_s": len(finished) / span,
        "output_tokens_per_s": float(finished["output_tokens"].sum()) / span,
    }


def relative_error(simulated: float, measured: float) -> float:
    if not (math.isfinite(simulated) and math.isfinite(measured)) or measured == 0:
        return math.nan
    return simulated / measured - 1


@dataclass(frozen=True)
class ScopeComparison:
    """One stretch of the run (the whole run, or one load stage)."""

    name: str
    requests: int
    compared: int
    not_compared: dict[str, int]
    """Requests left out of the statistics, by why (:data:`NOT_COMPARED`; only reasons that occur)."""
    metrics: dict[str, dict[str, dict[str, float]]]
    """``metrics[latency][side][statistic]``, side one of measured, simulated, signed_error, abs_error;
    ``tpot_s`` also has ``headline`` (the publisher's definition) as a statistic."""
    throughput: dict[str, dict[str, float]]

    def error(self, latency: str, statistic: str = "mean") -> float:
        return self.metrics[latency]["signed_error"][statistic]

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "requests": self.requests,
            "compared": self.compared,
            "not_compared": self.not_compared,
            "metrics": self.metrics,
            "throughput": self.throughput,
        }


def paired_frame(run: MeasuredRun, simulated: pd.DataFrame) -> pd.DataFrame:
    """One row per measured request: its measured and simulated latencies side by side (``*_measured``,
    ``*_simulated``), its stage, lengths and outcome. (The simulated TTFT and E2E already hold the
    time outside the engine that client-side data includes: the requests' ``client_overhead_s``.)"""
    measured = run.requests.set_index("request_id")
    sim = simulated.set_index("request_id")
    missing = measured.index.difference(sim.index)
    if len(missing):
        raise ValueError(
            f"the simulation has no row for {len(missing)} measured request(s), e.g. {missing[0]}"
        )
    sim = sim.loc[measured.index]
    finished = sim["outcome"] == "finished"
    frame = pd.DataFrame(
        {
            "request_id": measured.index,
            "stage": measured["stage"].to_numpy(),
            "arrival_s": measured["arrival_s"].to_numpy(),
            "prompt_tokens": measured["prompt_tokens"].to_numpy(),
            "output_tokens": measured["output_tokens"].to_numpy(),
            "outcome_simulated": sim["outcome"].to_numpy(),
            "reason_simulated": sim["reason"].to_numpy() if "reason" in sim else "",
            "preemptions_simulated": sim["preemptions"].to_numpy(),
            "cached_prompt_tokens_simulated": sim["cached_prompt_tokens"].to_numpy(),
            "ttft_s_measured": measured["ttft_s"].to_numpy(),
            "e2e_s_measured": measured["e2e_s"].to_numpy(),
            "ttft_s_simulated": sim["ttft_s"].where(finished).to_numpy(),
            "e2e_s_simulated": sim["e2e_s"].where(finished).to_numpy(),
        }
    )
    for side in ("measured", "simulated"):
        frame[f"tpot_s_{side}"] = per_request_tpot(
            frame.rename(columns={f"ttft_s_{side}": "ttft_s", f"e2e_s_{side}": "e2e_s"})
        )
    return frame


def side(frame: pd.DataFrame, name: str) -> pd.DataFrame:
    """``frame``'s ``name`` side (measured or simulated) with plain column names."""
    columns = {f"{latency}_{name}": latency for latency in LATENCIES}
    return frame.rename(columns=columns)[["arrival_s", "output_tokens", *LATENCIES]]


NOT_COMPARED = {
    "measured_failed": "failed in the measured run (no latency recorded)",
    "rejected": "rejected by kvsim before it ran",
    "failed_oom": "failed in kvsim (its KV could never fit)",
    "unfinished": "not finished by kvsim when the simulation ended",
}
"""Why a measured request is not compared, in the order the reasons are checked."""


def not_compared(frame: pd.DataFrame) -> dict[str, int]:
    """How many requests of ``frame`` (a paired frame) each reason of :data:`NOT_COMPARED` leaves
    out; a request the measured run lost counts there whatever kvsim did with it."""
    measured_failed = frame["ttft_s_measured"].isna() | frame["e2e_s_measured"].isna()
    outcome = frame["outcome_simulated"].where(~measured_failed, "measured_failed")
    outcome = outcome.where(
        outcome.isin(list(NOT_COMPARED)) | frame[["ttft_s_simulated", "e2e_s_simulated"]].notna().all(axis=1),
        "unfinished",
    )
    counts = outcome.value_counts()
    return {reason: int(counts[reason]) for reason in NOT_COMPARED if counts.get(reason, 0)}


def rejection_examples(frame: pd.DataFrame, limit: int = 3) -> list[str]:
    """The first few distinct reasons kvsim gave for requests it rejected or failed."""
    unserved = frame[frame["outcome_simulated"].isin(("rejected", "failed_oom"))]
    reasons = [str(reason) for reason in unserved.get("reason_simulated", pd.Series(dtype=str)) if reason]
    return list(dict.fromkeys(reasons))[:limit]


def compare_scope(name: str, frame: pd.DataFrame, tpot_definition: str) -> ScopeComparison:
    """Statistics of the requests both sides finished (the measured run's failures, and requests the
    simulation left unfinished, are counted apart)."""
    both = frame.dropna(subset=["ttft_s_measured", "e2e_s_measured", "ttft_s_simulated", "e2e_s_simulated"])
    metrics: dict[str, dict[str, dict[str, float]]] = {}
    sides = {label: side(both, label) for label in ("measured", "simulated")}
    for latency in LATENCIES:
        values = {label: statistics(table[latency]) for label, table in sides.items()}
        if latency == "tpot_s":
            for label, table in sides.items():
                values[label]["headline"] = headline_tpot(table, tpot_definition) if len(table) else math.nan
        signed = {
            stat: relative_error(values["simulated"][stat], values["measured"][stat])
            for stat in values["measured"]
        }
        metrics[latency] = {
            **values,
            "signed_error": signed,
            "abs_error": {stat: abs(value) for stat, value in signed.items()},
        }
    flows = {label: throughput(side(frame, label)) for label in ("measured", "simulated")}
    flows["signed_error"] = {
        key: relative_error(flows["simulated"][key], flows["measured"][key]) for key in flows["measured"]
    }
    return ScopeComparison(name, len(frame), len(both), not_compared(frame), metrics, flows)


def compare(run: MeasuredRun, paired: pd.DataFrame) -> list[ScopeComparison]:
    """The whole run, then each load stage when there are several."""
    scopes = [compare_scope("whole run", paired, run.tpot_definition)]
    if len(run.stages) > 1:
        for index, stage in enumerate(run.stages):
            scopes.append(
                compare_scope(
                    f"stage {index + 1} ({stage.label})",
                    paired[paired["stage"] == index],
                    run.tpot_definition,
                )
            )
    return scopes


def headline_errors(scope: ScopeComparison) -> dict[str, float]:
    """The three figures the project's goal is stated in: signed errors of mean TTFT, the publisher's
    TPOT and mean E2E."""
    return {
        "ttft_mean": scope.error("ttft_s"),
        "tpot": scope.error("tpot_s", "headline"),
        "e2e_mean": scope.error("e2e_s"),
    }


def in_system(arrival_s: np.ndarray, e2e_s: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Requests in the system (arrived, not finished) at each of ``times``: the one occupancy both a
    measured per-request table and a simulation give (finished requests only)."""
    keep = np.isfinite(e2e_s)
    starts = np.sort(arrival_s[keep])
    ends = np.sort(arrival_s[keep] + e2e_s[keep])
    return np.searchsorted(starts, times, side="right") - np.searchsorted(ends, times, side="right")
