"""Golden summaries: every shipped experiment config, shortened, and what it gives, to the last bit
(and the simulations of the replays whose measured runs ship).

``python -m tools.golden_summaries`` runs each config of :data:`CONFIGS` (with :data:`SHORTER`
applied) and writes ``tests/golden/summaries.json``: per variant its summary (less wall time and
build) and checksums of its per-request table and its time series. The test suite reruns them and
compares exactly, with the Python sources and with the compiled build: a refactor of the engine,
the policies or the costs that moves any number, anywhere, fails there. A change meant to move
results regenerates the file, and the diff shows which numbers moved.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "summaries.json"

CONFIGS = (
    "configs/quickstart.yaml",
    "configs/chat-radix-vs-prefix.yaml",
    "configs/cluster-chat-routers.yaml",
    "configs/cluster-mooncake.yaml",
    "configs/cluster-mooncake-offload.yaml",
    "configs/disaggregated-chat.yaml",
    "configs/hicache-multi-turn.yaml",
    "configs/hybrid-gpt-oss.yaml",
    "configs/hybrid-prefix-gpt-oss.yaml",
    "configs/hybrid-prefix-caches.yaml",
    "configs/offload-multi-turn.yaml",
    "configs/speculative-eagle3.yaml",
    "configs/notebooks/small-run.yaml",
    "configs/traces/azure-code.yaml",
    "configs/traces/azure-conv.yaml",
    "configs/traces/mooncake.yaml",
    "configs/traces/mooncake-offload.yaml",
    "configs/traces/mooncake-radix-vs-prefix.yaml",
)
SHORTER = ("workload.num_requests=150", "output.figures=false")
"""Every config runs its first 150 requests: enough to fill pools, preempt and hit caches in most,
short enough for the suite."""
TIGHT = ("engine.num_gpu_blocks_override=1100", "workload.arrival.rate_per_s=20")
PRESSED_RUNS = (
    ("configs/quickstart.yaml", TIGHT),
    ("configs/chat-radix-vs-prefix.yaml", TIGHT),
    ("configs/chat-radix-vs-prefix.yaml", (*TIGHT, "engine.scheduler=sglang")),
    ("configs/offload-multi-turn.yaml", TIGHT),
    ("configs/hicache-multi-turn.yaml", TIGHT),
    ("configs/speculative-eagle3.yaml", TIGHT),
)
"""The same configs in a pool of 1,100 blocks (17,600 tokens: one request at 16,384) at 20 requests/s: preemptions (SGLang's retractions),
evictions and host-tier traffic, which the shipped settings rarely reach in 150 requests."""
REPLAYS = (
    "configs/replays/rtx4090-llama-3.1-8b.yaml",
    "configs/replays/rtxpro6000-llama-3.1-8b.yaml",
    "configs/replays/rtxpro6000-qwen3-30b-a3b-dp2.yaml",
    "configs/replays/rtxpro6000-qwen3-32b-tp2.yaml",
)
"""The replays whose measured runs ship with kvsim (the BLIS H100 runs are fetched by hand)."""
LEFT_OUT = ("wall_s", "engine_build")  # what a run measures of the machine, not of the simulation


def table_checksum(frame: Any) -> str:
    """A checksum of a table's values, bit for bit (floats by their bits), in row order."""
    import pandas as pd

    hashes = pd.util.hash_pandas_object(frame.reset_index(drop=True), index=False)
    digest = hashlib.sha256(hashes.to_numpy().tobytes())
    digest.update(",".join(map(str, frame.columns)).encode())
    return digest.hexdigest()[:20]


def run(config: str, overrides: tuple[str, ...]) -> dict[str, Any]:
    from sim.config import load_experiment
    from sim.runner import prepare_experiment, run_experiment

    path = ROOT / config
    experiment = load_experiment(path, [*SHORTER, *overrides])
    results = run_experiment(experiment, path, prepared=prepare_experiment(experiment, path))
    variants = {}
    for result in results:
        summary = {key: value for key, value in result.summary.items() if key not in LEFT_OUT}
        requests = result.sink.requests().sort_values("request_id", kind="stable")
        variants[result.name] = {
            "summary": json.loads(json.dumps(summary, default=str)),
            "requests": table_checksum(requests),
            "timeseries": table_checksum(result.sink.timeseries()),
        }
        if result.kv_group_timeseries is not None:  # a hybrid allocator's split by KV group
            variants[result.name]["kv_groups"] = table_checksum(result.kv_group_timeseries)
    return variants


def replay(spec_path: str) -> dict[str, Any]:
    """The simulated side of a shipped replay (what ``kvsim replay-run`` compares)."""
    import tempfile

    from sim.replay.simulate import prepare_replay, simulate
    from sim.replay.spec import load_replay_spec, read_run

    path = ROOT / spec_path
    spec = load_replay_spec(path)
    with tempfile.TemporaryDirectory(prefix="kvsim-golden-") as folder:
        prepared = prepare_replay(read_run(spec, path.parent), spec, Path(folder) / "simulation")
        simulated = simulate(prepared, Path(folder) / "simulation" / "results")
        summary = {key: value for key, value in simulated.result.summary.items() if key not in LEFT_OUT}
        return {
            simulated.result.name: {
                "summary": json.loads(json.dumps(summary, default=str)),
                "requests": table_checksum(simulated.requests.sort_values("request_id", kind="stable")),
                "timeseries": table_checksum(simulated.timeseries),
            }
        }


def runs() -> list[tuple[str, tuple[str, ...]]]:
    return [(config, ()) for config in CONFIGS] + list(PRESSED_RUNS)


def key_of(config: str, overrides: tuple[str, ...]) -> str:
    return " ".join([config, *overrides])


def generate() -> dict[str, Any]:
    golden = {key_of(config, overrides): run(config, overrides) for config, overrides in runs()}
    return golden | {spec_path: replay(spec_path) for spec_path in REPLAYS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 when anything moved")
    args = parser.parse_args(argv)
    current = generate()
    if args.check:
        golden = json.loads(GOLDEN.read_text())
        moved = [key for key in sorted(set(golden) | set(current)) if golden.get(key) != current.get(key)]
        print("\n".join(f"moved: {key}" for key in moved) or "golden summaries: identical")
        return 1 if moved else 0
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN.relative_to(ROOT)} ({len(current)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
