"""The configuration reference (``docs/config-reference.md``), generated from the pydantic schema.

Every section of an experiment YAML is a pydantic model; this walks them from :class:`ExperimentConfig`
and writes one table per model (key, type, default, meaning) followed by an example. The examples are
kept here, one per model, and the tests validate each against its model, so neither the tables nor
the examples can drift from the code: ``kvsim config-reference`` prints the file, and a test compares.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Iterator
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from sim.config import (
    AcceptanceConfig,
    ClusterConfig,
    DeciderConfig,
    DisaggregationConfig,
    EngineConfig,
    ExperimentConfig,
    LinkConfig,
    OutputConfig,
    PoolConfig,
    SpeculativeConfig,
    VariantConfig,
)
from sim.costs.core import CostModelConfig
from sim.offload import OffloadConfig
from workloads import config as wl

DISTRIBUTIONS: tuple[type[BaseModel], ...] = typing.get_args(typing.get_args(wl.Dist)[0])
"""Length and time fields take a number or one of these (``kind`` selects it)."""

EXAMPLES: dict[type[BaseModel], str] = {
    ExperimentConfig: """\
name: my-experiment
seed: 7
model: Llama-3.1-8B
gpu: A100-80GB
engine: {block_size: 16, max_model_len: 8192}
workload:
  num_requests: 1000
  arrival: {kind: poisson, rate_per_s: 3.5}
  prompt_len: {kind: lognormal, median: 600, sigma: 1.0, max: 6000}
  output_len: {kind: uniform, low: 50, high: 500}
variants:
  - {name: contiguous-max, policy: contiguous, options: {reservation: max}}
  - {name: paged, policy: paged}
""",
    EngineConfig: """\
block_size: 16
max_model_len: 8192
max_num_seqs: 256
max_num_batched_tokens: 8192
gpu_memory_utilization: 0.9
kv_cache_dtype: fp8
preemption_mode: recompute
""",
    SpeculativeConfig: """\
method: eagle3
num_speculative_tokens: 3
acceptance: {mean_acceptance_length: 2.25}
""",
    AcceptanceConfig: "{rates: [0.62, 0.38, 0.25]}\n",
    VariantConfig: """\
name: prefix-32
policy: prefix
engine: {block_size: 32}
pin_shared_prefixes: true
""",
    ClusterConfig: "{replicas: 4, router: prefix_aware, prefix_weight: 3, load_weight: 2}\n",
    DisaggregationConfig: """\
prefill: {replicas: 2, engine: {max_num_batched_tokens: 8192}}
decode: {replicas: 6, router: least_kv}
link: {kind: rdma, shared_by: prefill}
decider: {mode: prefix_threshold, threshold_tokens: 256}
""",
    PoolConfig: "{replicas: 2, gpu: H100-80GB, engine: {tensor_parallel_size: 2}, policy: prefix}\n",
    LinkConfig: "{kind: custom, bandwidth_gb_per_s: 25, latency_s: 0.0005, shared_by: fabric}\n",
    DeciderConfig: "{mode: prefix_threshold, threshold_tokens: 512}\n",
    CostModelConfig: "{profile: configs/profiles/analytic-llama-3.1-8b-a100-80gb.yaml}\n",
    OutputConfig: "{timeseries_format: csv, figures: false}\n",
    OffloadConfig: "{host_memory_gib: 256, bandwidth_gb_per_s: 25}\n",
    wl.SyntheticWorkloadConfig: """\
duration_s: 600
arrival: {kind: gamma, rate_per_s: 2, cv: 3}
length_pairs: {path: traces/etalon/sharegpt_8k_filtered_stats_llama2_tokenizer.csv}
shared_prefix: {num_prefixes: 4, prefix_len: 256}
n: 2
""",
    wl.TraceWorkloadConfig: """\
source: {kind: azure, path: traces/azure/AzureLLMInferenceTrace_conv.csv}
window: {start_s: 0, end_s: 600}
target_rate_per_s: 4
max_model_len: 8192
on_too_long: cap
""",
    wl.PoissonArrival: "{kind: poisson, rate_per_s: 3.5}\n",
    wl.GammaArrival: "{kind: gamma, rate_per_s: 2, burstiness: 0.25}\n",
    wl.ConstantArrival: "{kind: constant, rate_per_s: 10}\n",
    wl.BatchArrival: "{kind: batch, at_s: 0}\n",
    wl.ClosedLoopArrival: "{kind: closed_loop, num_users: 64, think_time_s: {kind: exponential, mean: 5}}\n",
    wl.LengthPairsConfig: "{path: traces/vidur/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv}\n",
    wl.SharedPrefixConfig: "{num_prefixes: 8, prefix_len: 512, zipf_s: 1.1, fraction: 0.8}\n",
    wl.FewShotConfig: "{num_templates: 3, instruction_len: 40, num_shots: 5, shot_len: 60}\n",
    wl.MultiTurnConfig: "{turns: {kind: uniform, low: 2, high: 6}, user_turn_len: 80, think_time_s: 10}\n",
    wl.ConstantDist: "{kind: constant, value: 512}\n",
    wl.UniformDist: "{kind: uniform, low: 50, high: 500}\n",
    wl.NormalDist: "{kind: normal, mean: 300, std: 80, min: 1}\n",
    wl.LognormalDist: "{kind: lognormal, mean: 800, sigma: 1.2, max: 8000}\n",
    wl.ExponentialDist: "{kind: exponential, mean: 5}\n",
    wl.TableDist: """\
{kind: table, path: traces/etalon/sharegpt_8k_filtered_stats_llama2_tokenizer.csv, column: num_decode_tokens}
""",
    wl.ChoiceDist: "{kind: choice, values: [1, 2, 4], weights: [6, 3, 1]}\n",
    wl.AzureSource: "{kind: azure, path: traces/azure/AzureLLMInferenceTrace_code.csv}\n",
    wl.MooncakeSource: "{kind: mooncake, path: traces/mooncake/conversation_trace.jsonl}\n",
    wl.LengthTableSource: """\
{kind: length_table, path: traces/etalon/bwb_stats_llama2_tokenizer_filtered_v2.csv, order: shuffle}
""",
    wl.CsvSource: """\
{kind: csv, path: my-trace.csv, arrival_column: ts, arrival_unit: ms, prompt_len_column: input_tokens,
 output_len_column: output_tokens}
""",
    wl.JsonlSource: "{kind: jsonl, path: my-trace.jsonl, prompt_len_field: input, output_len_field: output}\n",
    wl.TimeWindow: "{start_s: 3600, end_s: 4200}\n",
    wl.SpreadTies: "{mode: uniform}\n",
}

FORMS: dict[type[BaseModel], str] = {
    wl.SyntheticWorkloadConfig: "synthetic: no `source` key",
    wl.TraceWorkloadConfig: "trace: with a `source` key",
}
"""Names of the forms of a section that takes one of several models without a ``kind`` key."""

_CONSTRAINTS = (
    (annotated_types.Gt, "gt", "> {}"),
    (annotated_types.Ge, "ge", ">= {}"),
    (annotated_types.Lt, "lt", "< {}"),
    (annotated_types.Le, "le", "<= {}"),
    (annotated_types.MinLen, "min_length", "at least {} long"),
    (annotated_types.MaxLen, "max_length", "at most {} long"),
)


def _constraints(metadata: list[Any]) -> list[str]:
    found = []
    for item in metadata:
        for kind, attribute, text in _CONSTRAINTS:
            if isinstance(item, kind):
                found.append(text.format(getattr(item, attribute)))
    return found


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _strip_annotated(annotation: Any) -> tuple[Any, list[Any]]:
    metadata: list[Any] = []
    while typing.get_origin(annotation) is typing.Annotated:
        base, *extra = typing.get_args(annotation)
        metadata += extra
        annotation = base
    return annotation, metadata


def _members(annotation: Any) -> list[Any]:
    """The alternatives of a (possibly annotated, possibly nested) union, flattened."""
    annotation, _ = _strip_annotated(annotation)
    if _is_union(annotation):
        return [member for argument in typing.get_args(annotation) for member in _members(argument)]
    return [annotation]


def type_text(annotation: Any, field_metadata: list[Any] | None = None) -> str:
    """A field's type in words: ``int >= 0``, ``auto | fp16``, ``number or distribution``...
    ``field_metadata``: constraints pydantic keeps on the field (``Field(gt=0)``) rather than the type."""
    members = _members(annotation)
    models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
    words: list[str] = []
    if set(DISTRIBUTIONS) <= set(models):
        models = [m for m in models if m not in DISTRIBUTIONS]
        distribution = True
    else:
        distribution = False
    for raw in typing.get_args(annotation) if _is_union(_strip_annotated(annotation)[0]) else [annotation]:
        base, metadata = _strip_annotated(raw)
        if isinstance(base, type) and issubclass(base, BaseModel) or _is_union(base):
            continue
        words.append(_scalar_text(base, metadata + (field_metadata or [])))
    if models:
        kinds = [_kind(model) for model in models]
        words.append("mapping (kind: " + " | ".join(kinds) + ")" if all(kinds) else "mapping (see below)")
    if distribution:
        words.append("distribution")
    words = [word for word in words if word and word != "null"] + (["null"] if "null" in words else [])
    return " or ".join(words)


def _scalar_text(base: Any, metadata: list[Any]) -> str:
    if base is type(None):
        return "null"
    if typing.get_origin(base) is Literal:
        return " | ".join(str(value) for value in typing.get_args(base))
    if typing.get_origin(base) is list:
        (item,) = typing.get_args(base)
        return f"list of {type_text(item)}"
    if typing.get_origin(base) is dict:
        return "mapping"
    names = {int: "int", float: "number", bool: "bool", str: "string"}
    text = names.get(base, getattr(base, "__name__", str(base)))
    limits = _constraints(metadata)
    return f"{text} {', '.join(limits)}" if limits else text


def _kind(model: type[BaseModel]) -> str:
    field = model.model_fields.get("kind")
    if field is None or typing.get_origin(field.annotation) is not Literal:
        return ""
    values = typing.get_args(field.annotation)
    return str(values[0]) if len(values) == 1 else ""


def default_text(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
        return "(the section's defaults)" if isinstance(value, BaseModel) else f"`{value!r}`"
    if field.default is PydanticUndefined:
        return "**required**"
    if field.default is None:
        return "none"
    if field.default == "":
        return '`""`'
    return f"`{str(field.default).lower() if isinstance(field.default, bool) else field.default}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def nested_models(annotation: Any) -> list[type[BaseModel]]:
    """The models a field's value may hold: itself, as list items or as a mapping's values."""
    found = []
    for member in _members(annotation):
        if typing.get_origin(member) is list:
            found += nested_models(typing.get_args(member)[0])
        elif typing.get_origin(member) is dict:
            found += nested_models(typing.get_args(member)[1])
        elif isinstance(member, type) and issubclass(member, BaseModel):
            found.append(member)
    return found


def _container_suffix(annotation: Any) -> str:
    """How a nested model's key path continues past its field: ``[]`` for list items, ``.<key>`` for
    a mapping's values (``zip[].<key>`` for both)."""
    base, _ = _strip_annotated(annotation)
    if typing.get_origin(base) is list:
        return "[]" + _container_suffix(typing.get_args(base)[0])
    if typing.get_origin(base) is dict:
        return ".<key>" + _container_suffix(typing.get_args(base)[1])
    return ""


def key_name(name: str, field: FieldInfo) -> str:
    """The key a YAML file writes: the alias where the field has one (``set:`` for ``overrides``)."""
    return field.alias or name


def walk_sections(
    root: type[BaseModel],
    skip: set[type[BaseModel]],
    forms: dict[type[BaseModel], str],
) -> Iterator[tuple[str, str, type[BaseModel]]]:
    """``(key path, form, model)`` for ``root`` and every model nested in it, parents before children,
    each model once; models in ``skip`` are not visited (documented elsewhere). ``form`` tells apart
    the models a key may take: their ``kind``, else ``forms``."""
    seen = set(skip)
    stack: list[tuple[str, str, type[BaseModel]]] = [("(top level)", "", root)]
    while stack:
        path, form, model = stack.pop(0)
        if model in seen and model is not root:
            continue
        seen.add(model)
        yield path, form, model
        prefix = "" if path == "(top level)" else f"{path}."
        children = []
        for name, field in model.model_fields.items():
            suffix = _container_suffix(field.annotation)
            for child in [m for m in nested_models(field.annotation) if m not in seen]:
                kind = _kind(child)
                form = f"kind: {kind}" if kind else forms.get(child, "")
                children.append((f"{prefix}{key_name(name, field)}{suffix}", form, child))
        stack = children + stack


def sections() -> Iterator[tuple[str, str, type[BaseModel]]]:
    """``(key path, form, model)`` for every section of an experiment, parents before children, each
    model once; the distributions last (they are shared by many keys)."""
    yield from walk_sections(ExperimentConfig, set(DISTRIBUTIONS), FORMS)
    for model in DISTRIBUTIONS:
        yield "distribution", f"kind: {_kind(model)}", model


def model_doc(model: type[BaseModel]) -> str:
    doc = model.__doc__ or ""
    if doc.startswith(BaseModel.__doc__ or "\0") or not doc.strip():
        return ""
    return " ".join(doc.split())


def markdown() -> str:
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated by `kvsim config-reference` from the pydantic schema (sim/reference.py); "
        "tests/test_reference_docs.py fails when it is out of date. Do not edit by hand. -->",
        "",
        "Every key of an experiment YAML, its type, default and meaning, section by section, each with an "
        "example that the tests validate. Unknown keys are errors (with a did-you-mean). Lengths and "
        "times (`prompt_len`, `output_len`, `n`, `think_time_s`, ...) take a plain number or a "
        "**distribution** (last sections). `kvsim models`, `kvsim gpus` and `kvsim policies` list the "
        "names `model`, `gpu` and `policy` accept.",
    ]
    for path, form, model in sections():
        lines += section_lines("##", path, form, model, EXAMPLES[model])
    return "\n".join(lines) + "\n"


def section_lines(
    level: str,
    path: str,
    form: str,
    model: type[BaseModel],
    example: str,
    meaning: Callable[[type[BaseModel], str, FieldInfo], str] | None = None,
    type_of: Callable[[FieldInfo], str] | None = None,
) -> list[str]:
    """One section of a reference: heading, the model's docstring, a table of its keys (key, type,
    default, meaning) and the example. ``meaning`` and ``type_of`` replace the field's description
    and type words (a reference whose models lack some descriptions, or point elsewhere)."""
    lines = ["", f"{level} `{path}`" + (f" ({form})" if form else ""), ""]
    doc = model_doc(model)
    if doc:
        lines += [doc, ""]
    lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        text = meaning(model, name, field) if meaning else field.description
        text = _cell(text or ("Selects this form." if name == "kind" else ""))
        kind = _cell(type_of(field) if type_of else type_text(field.annotation, field.metadata))
        lines.append(f"| `{key_name(name, field)}` | {kind} | {default_text(field)} | {text} |")
    return [*lines, "", "Example:", "", "```yaml", example.rstrip("\n"), "```"]
