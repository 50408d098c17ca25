"""Speculative decoding in a variant: which policies can hold its lookahead slots, its acceptance model
(rates, a mean length or a measured histogram file) and what it adds to the summary."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from policies.base import policy_class
from sim.config import (
    ConfigError,
    EngineConfig,
)
from sim.engine.speculation import AcceptanceModel, SpeculativeDecoding, lookahead_slots
from sim.kv.allocators import is_hybrid_allocator
from sim.runner.prepared import PreparedVariant
from workloads.base import TraceError, resolve_path
from workloads.stats import not_utf8


def speculation_problem(policy_name: str, key: Callable[[str], str]) -> str:
    """Why ``policy_name`` cannot serve speculative decoding ("" when it can)."""
    if is_hybrid_allocator(policy_name):
        return (
            f"{policy_name} with {key('speculative')} is not modelled yet (a draft's slots in every "
            "KV group); use policy paged, prefix or contiguous"
        )
    if not policy_class(policy_name).HOLDS_LOOKAHEAD:
        return (
            f"policy {policy_name!r} cannot hold the lookahead slots {key('speculative')} needs "
            "(each decoding request's drafts); use policy paged, prefix or contiguous"
        )
    return ""


def speculative_knobs(
    engine: EngineConfig,
    base_dir: Path | None = None,
    key: Callable[[str], str] | None = None,
    max_model_len: int | None = None,
) -> SpeculativeDecoding | None:
    """What the engine needs of ``engine.speculative``: the acceptance distribution (a histogram file
    read relative to ``base_dir``) and the slots a decoding sequence holds past its tokens. Drafts
    that could not sit in a sequence of ``max_model_len`` tokens beside its next one are refused
    (before anything per draft is built: a file may say 2**63)."""
    speculative = engine.speculative
    if speculative is None:
        return None
    k = speculative.num_speculative_tokens
    if max_model_len is not None and k >= max_model_len:
        name = (key or (lambda name: f"engine.{name}"))("speculative") + ".num_speculative_tokens"
        raise ConfigError(
            f"{name}: {k} drafts per step cannot sit in a sequence of max_model_len {max_model_len} "
            "beside its next token; give fewer than max_model_len"
        )
    acceptance = speculative.acceptance
    if acceptance.rates is not None:
        model = AcceptanceModel.from_rates(acceptance.rates)
    elif acceptance.mean_acceptance_length is not None:
        model = AcceptanceModel.from_mean_length(acceptance.mean_acceptance_length, k)
    else:
        histogram = acceptance.histogram
        if histogram is None:
            where = (key or (lambda name: f"engine.{name}"))("speculative") + ".acceptance.histogram_file"
            try:
                path = resolve_path(acceptance.histogram_file or "", base_dir)
            except TraceError as error:
                raise ConfigError(f"{where}: {error}") from None
            histogram = read_acceptance_histogram(path, k, where)
        counts = [histogram.get(accepted, 0.0) for accepted in range(k + 1)]
        model = AcceptanceModel.from_histogram(counts, k)
    return SpeculativeDecoding(speculative.method, k, model, lookahead_slots(speculative.method, k))


def read_acceptance_histogram(path: Path, num_speculative_tokens: int, where: str) -> dict[int, float]:
    """A measured acceptance histogram: a CSV with columns ``accepted_drafts,count``, one row per
    number of accepted drafts (0..k). Every problem names the file, the line and the value."""
    import csv

    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{where}: {path}: {not_utf8(error)}") from None
    except OSError as error:
        raise ConfigError(f"{where}: cannot read {path}: {error.strerror or error}") from None
    rows = list(csv.reader(text.splitlines()))
    if not rows or [cell.strip() for cell in rows[0]] != ["accepted_drafts", "count"]:
        raise ConfigError(f"{where}: {path}: line 1 must be the header accepted_drafts,count")
    histogram: dict[int, float] = {}
    for line, row in enumerate(rows[1:], start=2):
        if not row or not "".join(row).strip():
            continue
        try:
            accepted, count = int(row[0]), float(row[1])
        except (ValueError, IndexError):
            raise ConfigError(
                f"{where}: {path}: line {line}: {','.join(row)!r} is not a whole number and a count"
            ) from None
        if not 0 <= accepted <= num_speculative_tokens:
            raise ConfigError(
                f"{where}: {path}: line {line}: {accepted} accepted drafts is outside 0..{num_speculative_tokens} "
                "(num_speculative_tokens)"
            )
        if count < 0 or count != count:
            raise ConfigError(f"{where}: {path}: line {line}: count {row[1]!r} must be >= 0")
        histogram[accepted] = histogram.get(accepted, 0.0) + count
    if not any(count > 0 for count in histogram.values()):
        raise ConfigError(f"{where}: {path}: no step counted (every count is 0, or no rows)")
    return histogram


def speculative_summary(prepared: PreparedVariant) -> dict[str, Any]:
    """What speculative decoding adds to a run's summary (empty text and zeros without it)."""
    speculative, draft = prepared.speculative, prepared.draft
    if speculative is None or draft is None:
        return {
            "speculative": "",
            "lookahead_slots": 0,
            "draft_weight_bytes": 0,
            "draft_kv_bytes_per_token": 0,
        }
    acceptance = speculative.acceptance
    return {
        "speculative": (
            f"{speculative.method}, k={speculative.num_speculative_tokens}, mean acceptance length "
            f"{acceptance.mean_acceptance_length:.3g} ({acceptance.source}); {draft.description}"
        ),
        "lookahead_slots": speculative.lookahead_slots,
        "draft_weight_bytes": draft.weight_bytes,
        "draft_kv_bytes_per_token": draft.kv_bytes_per_token,
    }
