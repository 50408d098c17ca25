"""Trace statistics: the numbers of ``traces/README.md`` for any trace file or workload config.

Conventions (the README's): percentiles use linear interpolation (numpy's and pandas' default);
``rate_per_s`` = (N - 1) / (last arrival - first arrival); ``interarrival_cv`` = std / mean of the
gaps between consecutive arrivals (std with ddof=1, as pandas); ``peak_per_s`` / ``peak_per_min`` =
most requests in one 1 s / 60 s bucket, buckets counted from the first arrival.

Prefix reuse upper bound (an unlimited cache, requests replayed in arrival order, nothing evicted):
each request can be served the longest prefix of its prompt that some earlier request also had.

* ``prefix_reuse.cached_prompt_tokens_frac`` is token-exact: prefixes are compared on the prompts'
  segments (same stream, same offsets), so the last, partial block of a prompt counts the tokens it
  shares with an earlier prompt. This is the number the README gives (37.4 % on Mooncake).
* ``..._last_token_recomputed``: the same, but a request whose whole prompt was seen before still
  computes its last prompt token (vLLM always recomputes at least one token to get logits).
* ``..._by_block_size[B]``: what vLLM's block-granular prefix cache can serve with block size ``B``:
  only full blocks are cached, and the last token is recomputed: ``floor(min(hit, len - 1) / B) * B``.

Where a trace has block hashes, ``hash_blocks`` also gives the numbers computed directly from the hash
ids (the README's method: a request's hit is its leading run of hash ids seen in earlier requests;
tokens = min(run * block, prompt_len)); on the shipped Mooncake trace both methods agree exactly.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from token_content import TokenContent
from workloads.base import TraceError, Workload
from workloads.config import (
    AnyWorkloadConfig,
    LengthTableSource,
    TraceWorkloadConfig,
    parse_workload_config,
)
from workloads.request import Request

DEFAULT_BLOCK_SIZES = (16,)
_PERCENTILES = (50, 90, 99)


class PrefixTrie:
    """Longest previously seen prefix of token contents, token-exact, with unlimited memory.

    A node is reached by an exact sequence of segments; for each stream that follows a node it keeps
    the longest length any earlier content had there, so a partly shared last segment counts the
    tokens both contents have."""

    def __init__(self) -> None:
        self._longest: dict[tuple[int, int], int] = {}
        self._child: dict[tuple[int, int, int], int] = {}
        self._nodes = 1

    def match_and_insert(self, prompt: TokenContent) -> int:
        """Tokens of ``prompt`` shared with the longest matching earlier content; then remember it."""
        node = 0
        matched = 0
        matching = True
        for content_id, length in prompt:
            if length <= 0:
                continue
            key = (node, content_id)
            longest = self._longest.get(key, 0)
            if matching:
                if longest >= length:
                    matched += length
                else:
                    matched += longest
                    matching = False
            if length > longest:
                self._longest[key] = length
            child_key = (node, content_id, length)
            child = self._child.get(child_key)
            if child is None:
                child = self._nodes
                self._nodes += 1
                self._child[child_key] = child
                matching = False
            node = child
        return matched


def _summary(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {}
    out = {"mean": float(values.mean())}
    for q in _PERCENTILES:
        out[f"p{q}"] = float(np.percentile(values, q))
    out["min"] = float(values.min())
    out["max"] = float(values.max())
    return out


class StatsAccumulator:
    """Collects requests (and their hash ids, when the trace has them) and computes the statistics."""

    def __init__(self, block_sizes: Sequence[int] = DEFAULT_BLOCK_SIZES, hash_block_len: int | None = None):
        self.block_sizes = tuple(int(size) for size in block_sizes)
        self.hash_block_len = hash_block_len
        self.arrivals: list[float] = []
        self.prompt_lens: list[int] = []
        self.output_lens: list[int] = []
        self.trie = PrefixTrie()
        self.cached_tokens = 0
        self.cached_tokens_last = 0
        self.cached_by_block = dict.fromkeys(self.block_sizes, 0)
        self.requests_with_hit = 0
        # hash-id method
        self.hash_counts: list[int] = []
        self.seen: set[Hashable] = set()
        self.block_refs = 0
        self.block_refs_seen = 0
        self.hash_cached_tokens = 0
        self.beyond_first = 0
        self.not_prefix_shaped = 0
        self.hash_mismatches = 0
        self.first_blocks: set[Hashable] = set()

    def add(
        self, arrival_s: float, prompt: TokenContent, output_len: int, hash_ids: list[Hashable] | None = None
    ) -> None:
        prompt_len = sum(length for _, length in prompt)
        self.arrivals.append(arrival_s)
        self.prompt_lens.append(prompt_len)
        self.output_lens.append(output_len)
        hit = self.trie.match_and_insert(prompt)
        self.cached_tokens += hit
        self.requests_with_hit += hit > 0
        recomputed = min(hit, prompt_len - 1)
        self.cached_tokens_last += recomputed
        for size in self.block_sizes:
            self.cached_by_block[size] += recomputed // size * size
        if hash_ids is not None:
            self._add_hashes(prompt_len, hash_ids)

    def _add_hashes(self, prompt_len: int, hash_ids: list[Hashable]) -> None:
        block = self.hash_block_len
        assert block is not None
        seen = self.seen
        flags = [hash_id in seen for hash_id in hash_ids]
        run = flags.index(False) if False in flags else len(flags)
        if any(flags[run:]):
            self.not_prefix_shaped += 1
        self.hash_counts.append(len(hash_ids))
        self.block_refs += len(hash_ids)
        self.block_refs_seen += sum(flags)
        self.hash_cached_tokens += min(run * block, prompt_len)
        self.beyond_first += run >= 2
        if not block * (len(hash_ids) - 1) < prompt_len <= block * len(hash_ids):
            self.hash_mismatches += 1
        if hash_ids:
            self.first_blocks.add(hash_ids[0])
        seen.update(hash_ids)

    def result(self, clock_origin: datetime | None = None) -> dict[str, Any]:
        count = len(self.prompt_lens)
        out: dict[str, Any] = {"requests": count}
        arrivals = np.asarray(self.arrivals, dtype=float)
        if count and np.isfinite(arrivals).all():
            out.update(arrival_stats(arrivals, clock_origin))
        prompt = np.asarray(self.prompt_lens, dtype=float)
        output = np.asarray(self.output_lens, dtype=float)
        out["prompt_tokens"] = _summary(prompt)
        out["output_tokens"] = _summary(output)
        total = float(prompt.sum())
        if count and total > 0:
            out["prompt_tokens_total"] = int(total)
            out["output_tokens_total"] = int(output.sum())
            out["prefix_reuse"] = {
                "cached_prompt_tokens_frac": self.cached_tokens / total,
                "cached_prompt_tokens_frac_last_token_recomputed": self.cached_tokens_last / total,
                "cached_prompt_tokens_frac_by_block_size": {
                    str(size): value / total for size, value in self.cached_by_block.items()
                },
                "cached_prompt_tokens": self.cached_tokens,
                "requests_with_cached_prefix_frac": self.requests_with_hit / count,
            }
        if self.hash_counts:
            out["hash_blocks"] = {
                "hash_block_len": self.hash_block_len,
                "per_request": _summary(np.asarray(self.hash_counts, dtype=float)),
                "block_references": self.block_refs,
                "distinct_blocks": len(self.seen),
                "block_reuse_frac": self.block_refs_seen / self.block_refs if self.block_refs else 0.0,
                "cached_prompt_tokens_frac": self.hash_cached_tokens / total if total else 0.0,
                "requests_reusing_beyond_first_block_frac": self.beyond_first / count,
                "non_prefix_shaped_requests": self.not_prefix_shaped,
                "length_mismatches": self.hash_mismatches,
                "all_share_first_block": len(self.first_blocks) == 1,
            }
        return out


def arrival_stats(arrivals: np.ndarray, clock_origin: datetime | None = None) -> dict[str, Any]:
    """Span, rate, inter-arrival CV, peaks, gaps and ties of sorted arrival times (seconds)."""
    count = arrivals.size
    first, last = float(arrivals[0]), float(arrivals[-1])
    span = last - first
    out: dict[str, Any] = {
        "first_arrival_s": first,
        "last_arrival_s": last,
        "span_s": span,
        "rate_per_s": (count - 1) / span if span > 0 else math.nan,
    }
    gaps = np.diff(arrivals)
    if gaps.size >= 2 and gaps.mean() > 0:
        out["interarrival_cv"] = float(gaps.std(ddof=1) / gaps.mean())
    else:
        out["interarrival_cv"] = math.nan
    offsets = arrivals - first
    per_s = np.bincount(np.floor(offsets).astype(np.int64))
    per_min = np.bincount(np.floor(offsets / 60.0).astype(np.int64))
    out["peak_per_s"] = int(per_s.max())
    out["peak_per_min"] = int(per_min.max())
    out["longest_gap_s"] = float(gaps.max()) if gaps.size else 0.0
    out["minutes"] = int(per_min.size)
    out["empty_minutes"] = int((per_min == 0).sum())
    if clock_origin is not None:
        start = clock_origin.hour * 3600.0 + clock_origin.minute * 60 + clock_origin.second
        start += clock_origin.microsecond / 1e6
        wall = np.floor((start + arrivals) / 60.0).astype(np.int64)
        wall_counts = np.bincount(wall - wall[0])
        out["wallclock_minutes"] = int(wall_counts.size)
        out["empty_wallclock_minutes"] = int((wall_counts == 0).sum())
    out["distinct_arrival_times"] = int(np.unique(arrivals).size)
    out["tied_consecutive_frac"] = float((gaps == 0).mean()) if gaps.size else 0.0
    return out


# --------------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------------


def not_utf8(error: UnicodeDecodeError) -> str:
    return f"not UTF-8 text (byte {error.object[error.start]:#04x} at offset {error.start}); save the file as UTF-8"


def read_utf8(path: Path) -> str:
    """A text file's content; a file in another encoding is a TraceError naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise TraceError(not_utf8(error), path) from None


def detect_source(path: Path) -> dict[str, Any]:
    """The ``source:`` mapping of a known trace format, from a file's header or first line."""
    import csv
    import json

    if path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        with open(path, "rb") as handle:
            for raw in handle:
                if raw.strip():
                    try:
                        record = json.loads(raw)
                    except json.JSONDecodeError as error:
                        raise TraceError(f"invalid JSON on the first line: {error.msg}", path, 1) from None
                    fields = set(record) if isinstance(record, dict) else set()
                    if {"timestamp", "input_length", "output_length", "hash_ids"} <= fields:
                        return {"kind": "mooncake", "path": str(path)}
                    raise TraceError(
                        f"unknown JSONL fields {sorted(fields)}; write a config with source kind jsonl", path
                    )
        raise TraceError("empty file", path)
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            header = next(csv.reader(handle), None)
    except UnicodeDecodeError as error:
        raise TraceError(not_utf8(error), path, 1) from None
    if not header:
        raise TraceError("empty file (no header row)", path)
    columns = {cell.strip() for cell in header}
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= columns:
        return {"kind": "azure", "path": str(path)}
    if {"num_prefill_tokens", "num_decode_tokens"} <= columns:
        return {"kind": "length_table", "path": str(path), "order": "sequential"}
    raise TraceError(
        f"unknown CSV columns {sorted(columns)}; write a config with source kind csv (a column mapping)", path
    )


def workload_stats(
    workload: Workload, block_sizes: Sequence[int] = DEFAULT_BLOCK_SIZES, max_requests: int | None = None
) -> dict[str, Any]:
    """Statistics of the requests a workload yields (``requests()`` only: no closed-loop follow-ups)."""
    from workloads.traces import TraceWorkload

    if isinstance(workload, TraceWorkload):
        accumulator = StatsAccumulator(block_sizes, workload.block_len)
        for index, (request, row) in enumerate(workload.records()):
            if max_requests is not None and index >= max_requests:
                break
            accumulator.add(request.arrival_s, request.prompt, request.output_len, row.hash_ids)
        origin = None
        config = workload.config
        if config.arrival is None and config.window is None and config.time_scale is None:
            origin = workload.trace_origin if config.target_rate_per_s is None else None
        out = accumulator.result(origin)
        out["counts"] = workload.counts.as_dict()
        return out
    accumulator = StatsAccumulator(block_sizes)
    requests: Iterable[Request] = workload.requests()
    for index, request in enumerate(requests):
        if max_requests is not None and index >= max_requests:
            break
        accumulator.add(request.arrival_s, request.prompt, request.output_len)
    return accumulator.result()


def _lengths_only(
    config: TraceWorkloadConfig, base_dir: Path | None, block_sizes: Sequence[int]
) -> dict[str, Any]:
    from workloads.base import resolve_path
    from workloads.traces import RowCounts, TraceReader, field_map

    path = resolve_path(config.source.path, base_dir, "workload.source.path")
    counts = RowCounts()
    accumulator = StatsAccumulator(block_sizes)
    for index, row in enumerate(
        TraceReader(path, field_map(config.source), counts, config.on_bad_row).rows()
    ):
        accumulator.add(math.nan, ((index << 2 | 1, row.prompt_len),), row.output_len)
    out = accumulator.result()
    out.pop("prefix_reuse", None)  # every prompt is unique: nothing to say
    out["counts"] = counts.as_dict()
    return out


def trace_stats(
    target: str | Path | AnyWorkloadConfig | Workload,
    *,
    seed: int = 0,
    base_dir: Path | None = None,
    block_sizes: Sequence[int] = DEFAULT_BLOCK_SIZES,
    on_bad_row: str = "error",
    on_unsorted: str = "error",
    max_requests: int | None = None,
) -> dict[str, Any]:
    """Statistics of a trace file (format detected from its header), a YAML config (its ``workload:``
    section, or the whole file), a workload config, or a workload.

    A raw trace file is read as it is (no window, no scaling); a config's transformations apply."""
    from workloads.factory import build_workload

    source: dict[str, Any] | None = None
    if isinstance(target, str | Path):
        # A file named on the command line: relative to the current folder, as any command's argument
        # (not to the project root, as a path inside a config may be).
        path = Path(target).expanduser().absolute()
        if not path.is_file():
            raise TraceError("file not found", target)
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            try:
                data = yaml.safe_load(read_utf8(path)) or {}
            except yaml.YAMLError as error:
                mark = getattr(error, "problem_mark", None)
                line = mark.line + 1 if mark else None
                raise TraceError(f"malformed YAML: {getattr(error, 'problem', error)}", path, line) from None
            if not isinstance(data, dict):
                raise TraceError("a config must be a YAML mapping", path)
            section = data.get("workload", data)
            seed = data.get("seed", seed)
            if not isinstance(seed, int) or seed < 0:
                raise TraceError(f"seed: must be a non-negative integer (got {seed!r})", path)
            config = parse_workload_config(section)
            base_dir = path.parent
        else:
            source = detect_source(path)
            config = TraceWorkloadConfig.model_validate(
                {
                    "source": source,
                    "on_bad_row": on_bad_row,
                    "on_unsorted": on_unsorted,
                    "on_too_long": "keep",
                }
                if source["kind"] != "length_table"
                else {"source": source, "on_bad_row": on_bad_row, "arrival": {"kind": "batch"}}
            )
            base_dir = None
        target = config
    if isinstance(target, TraceWorkloadConfig) and isinstance(target.source, LengthTableSource) and source:
        out = _lengths_only(target, base_dir, block_sizes)
    else:
        workload = (
            target if isinstance(target, Workload) else build_workload(target, seed=seed, base_dir=base_dir)
        )
        out = workload_stats(workload, block_sizes, max_requests)
        out["workload"] = {
            key: value for key, value in workload.describe().items() if key not in ("config", "counts")
        }
    if source is not None:
        out["format"] = source["kind"]
        out["file"] = source["path"]
    return out


__all__ = [
    "PrefixTrie",
    "StatsAccumulator",
    "arrival_stats",
    "detect_source",
    "trace_stats",
    "workload_stats",
]
