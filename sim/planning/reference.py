"""The plan and sweep file reference (``docs/plan-reference.md``), generated from the pydantic schema.

As ``docs/config-reference.md`` (:mod:`sim.reference`, whose walk and tables this reuses): one table
per model of a plan file (:class:`PlanSpec` and the models nested in it) and of a sweep file
(:class:`SweepSpec`), each followed by an example the tests validate. The sections a plan shares
with an experiment (``engine``, a candidate's policy) point to the config reference instead of
repeating it. ``kvsim config-reference --plan`` prints the file, and a test compares.
"""

from __future__ import annotations

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from sim.config import ClusterConfig, EngineConfig, VariantConfig
from sim.planning.plans.spec import (
    CandidateGrid,
    ClusterCheck,
    Goodput,
    GpuChoice,
    PlanSpec,
    SearchSpec,
    SLOs,
)
from sim.planning.sweeps.spec import AxisSpec, RangeAxis, SweepSpec
from sim.reference import nested_models, section_lines, type_text, walk_sections

EXPERIMENT_SECTIONS: dict[type[BaseModel], str] = {
    EngineConfig: "engine",
    VariantConfig: "variants[]",
    ClusterConfig: "cluster",
}
"""Models a plan file shares with an experiment: documented in docs/config-reference.md, under these keys."""

FORMS: dict[type[BaseModel], str] = {RangeAxis: "a range instead of a list of values"}

MEANINGS: dict[tuple[type[BaseModel], str], str] = {
    (PlanSpec, "description"): "Free text, kept in plan.json and shown in the report.",
    (PlanSpec, "models"): "Model preset names (see `kvsim models`) or paths to a Hugging Face "
    "config.json (relative to the plan file); each is crossed with every GPU and candidate.",
    (PlanSpec, "gpus"): "GPU preset names (see `kvsim gpus`), or mappings with a custom GPU, a label, "
    "a price per GPU-hour and a cost model (`gpus[]`).",
    (PlanSpec, "engine"): "The engine section every candidate starts from (an experiment's); the "
    "candidates' block sizes and engine knobs override it.",
    (PlanSpec, "slos"): "What a rate must meet on the steady-state window of every seed.",
    (PlanSpec, "target_rate_per_s"): "The request rate (requests per second) the GPUs are counted for.",
    (PlanSpec, "candidates"): "What is compared, crossed with every model and GPU: policies x block "
    "sizes x engine knobs x cluster keys.",
    (PlanSpec, "search"): "How each candidate's maximum sustainable rate is searched and each probe run.",
    (SearchSpec, "seeds"): "Every rate runs once per seed; it passes only when every seed meets every SLO.",
    (SLOs, "ttft_p99_s"): "At most this p99 time to first token, in seconds.",
    (SLOs, "ttft_p50_s"): "At most this median time to first token, in seconds.",
    (SLOs, "ttft_mean_s"): "At most this mean time to first token, in seconds.",
    (SLOs, "tpot_p50_s"): "At most this median time per output token, in seconds.",
    (SLOs, "tpot_p99_s"): "At most this p99 time per output token, in seconds.",
    (SLOs, "tpot_mean_s"): "At most this mean time per output token, in seconds.",
    (SLOs, "e2e_p99_s"): "At most this p99 end-to-end latency, in seconds.",
    (SLOs, "e2e_mean_s"): "At most this mean end-to-end latency, in seconds.",
    (SLOs, "max_preemptions_per_request"): "At most this many preemptions per request of the window "
    "(their total over the window's requests).",
    (SLOs, "max_rejected_frac"): "At most this share of the window's requests rejected.",
}
"""Meanings of the plan keys whose fields carry no description of their own (a test fails when one
here is no longer needed, or a key has neither)."""

EXAMPLES: dict[type[BaseModel], str] = {
    PlanSpec: """\
name: llama31-8b-chat
models: [Llama-3.1-8B]
gpus:
  - {gpu: A100-80GB, price_per_hour: 1.8}
  - H100-80GB
engine: {max_model_len: 8192, max_num_seqs: 256}
workload:
  arrival: {kind: poisson, rate_per_s: 1}
  length_pairs: {path: traces/etalon/sharegpt_8k_filtered_stats_llama2_tokenizer.csv}
slos: {ttft_p99_s: 2.0, tpot_p50_s: 0.05}
target_rate_per_s: 50
candidates:
  policies: [{name: paged, policy: paged}, {name: prefix, policy: prefix}]
  block_sizes: [16, 32]
search: {start_rate_per_s: 2, seeds: [1, 2], min_requests: 600}
""",
    GpuChoice: "{gpu: H100-80GB, name: H100 (measured), price_per_hour: 3.0, "
    "cost_model: configs/profiles/analytic-llama-3.1-8b-a100-80gb.yaml}\n",
    SLOs: """\
ttft_p99_s: 2.0
tpot_p50_s: 0.05
max_rejected_frac: 0.01
goodput: {ttft_s: 1.0, tpot_s: 0.1, min_attainment: 0.9}
""",
    Goodput: "{ttft_s: 1.0, tpot_s: 0.1, min_attainment: 0.9}\n",
    CandidateGrid: """\
policies:
  - {name: contiguous, policy: contiguous, options: {reservation: max}}
  - {name: paged, policy: paged}
block_sizes: [16, 32]
engine: {max_num_seqs: [128, 256]}
cluster: {replicas: [1, 2], router: [round_robin, prefix_aware]}
""",
    SearchSpec: """\
start_rate_per_s: 2
seeds: [1, 2, 3]
min_requests: 800
min_duration_s: 60
rel_tolerance: 0.05
cluster_check: {router: least_requests, max_extra_replicas: 4}
""",
    ClusterCheck: "{router: prefix_aware, max_extra_replicas: 2}\n",
    SweepSpec: """\
name: block-sizes
base: ../quickstart.yaml
set: {workload.num_requests: 300}
axes:
  engine.block_size: [16, 32]
  workload.arrival.rate_per_s: {from: 1, to: 4, steps: 4}
  seed: [1, 2]
zip:
  - {gpu: [A100-80GB, H100-80GB], engine.gpu_memory_utilization: [0.9, 0.92]}
""",
    RangeAxis: "{from: 8, to: 64, steps: 4, log: true, integer: true}\n",
}


def plan_sections() -> list[tuple[str, str, type[BaseModel]]]:
    return list(walk_sections(PlanSpec, set(EXPERIMENT_SECTIONS), FORMS))


def sweep_sections() -> list[tuple[str, str, type[BaseModel]]]:
    return list(walk_sections(SweepSpec, set(EXPERIMENT_SECTIONS), FORMS))


def meaning(model: type[BaseModel], name: str, field: FieldInfo) -> str:
    return field.description or MEANINGS.get((model, name), "")


def type_words(field: FieldInfo) -> str:
    """The field's type in words, with an experiment's section named where a plan shares one, and
    what a sweep's axes map their key paths to."""
    text = type_text(field.annotation, field.metadata)
    if field.annotation in (dict[str, AxisSpec], list[dict[str, AxisSpec]]):
        axis = f"mapping of key paths to {type_text(AxisSpec)}"
        text = axis if field.annotation == dict[str, AxisSpec] else f"list of {axis}"
    text = text.replace("list of Any", "list of values")
    shared = [EXPERIMENT_SECTIONS[m] for m in nested_models(field.annotation) if m in EXPERIMENT_SECTIONS]
    if shared:
        return text.replace("(see below)", f"(an experiment's `{shared[0]}`, see config-reference.md)")
    return text


def markdown() -> str:
    lines = [
        "# Plan and sweep file reference",
        "",
        "<!-- Generated by `kvsim config-reference --plan` from the pydantic schema "
        "(sim/planning/reference.py); tests/test_reference_docs.py fails when it is out of date. Do not "
        "edit by hand. -->",
        "",
        "Every key of a plan file (`kvsim plan`) and of a sweep file (`kvsim sweep`), its type, default "
        "and meaning, section by section, each with an example that the tests validate. Unknown keys "
        "are errors (with a did-you-mean). The sections a plan shares with an experiment (`engine`, "
        "the candidates' `policies`, `candidates.cluster`'s keys) and a plan's `workload` are an "
        "experiment's: see [config-reference.md](config-reference.md). `--set KEY.PATH=VALUE` "
        "overrides a key of the plan file, or of a sweep's base experiment, from the command line.",
        "",
        "## Plan files",
    ]
    for path, form, model in plan_sections():
        lines += section_lines("###", f"{path}", form, model, EXAMPLES[model], meaning, type_words)
    lines += ["", "## Sweep files"]
    for path, form, model in sweep_sections():
        lines += section_lines("###", f"{path}", form, model, EXAMPLES[model], meaning, type_words)
    return "\n".join(lines) + "\n"
