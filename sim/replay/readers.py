"""Readers of measured serving runs, one function per format, each returning a :class:`MeasuredRun`.

* :func:`read_blis_csv`: the per-request CSV the BLIS project published for vLLM v0.15 on H100
  (``index, arrival_s, input_tokens, ..., ttft_s, e2e_s``) with its ``runs.csv`` of server settings.
* :func:`read_llmservingsim_bench`: LLMServingSim's bench folder (``vllm/meta.json``,
  ``vllm/requests.jsonl``, ``vllm/timeseries.csv``) and the workload file it replayed (token ids).
* :func:`read_vllm_bench_json`: ``vllm bench serve --save-result --save-detailed`` output.

Every problem with a file is a :class:`ReplayInputError` naming the file and, for a row, its line.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pandas as pd

from sim.replay.measured import MeasuredRun, ServerSettings, Stage
from sim.replay.prompts import CyclingPrompts, chains_from_token_ids


class ReplayInputError(ValueError):
    """A measured run cannot be read: the message names the file (and line) and the bad value."""


def _where(path: Path, line: int | None) -> str:
    return f"{path}:{line}" if line is not None else str(path)


def _number(value: Any, name: str, path: Path, line: int | None, *, integer: bool = False) -> float:
    """``value`` as a finite non-negative number (an int when ``integer``), or a clear error."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ReplayInputError(f"{_where(path, line)}: {name} must be a number, got {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise ReplayInputError(f"{_where(path, line)}: {name} must be finite and >= 0, got {value!r}")
    if integer and number != int(number):
        raise ReplayInputError(f"{_where(path, line)}: {name} must be a whole number, got {value!r}")
    return int(number) if integer else number


def _open(path: Path, what: str = "") -> TextIO:
    """``path`` opened for reading text, or an error that names it (and what it is)."""
    try:
        return path.open(encoding="utf-8", newline="")
    except OSError as error:
        raise ReplayInputError(f"{path}: cannot read{' ' + what if what else ''}: {error.strerror}") from None


def _json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` for each non-blank line of a JSON Lines file."""
    with _open(path) as handle:
        for number, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                item = json.loads(text)
            except json.JSONDecodeError as error:
                raise ReplayInputError(f"{path}:{number}: not valid JSON ({error.msg})") from None
            if not isinstance(item, dict):
                raise ReplayInputError(f"{path}:{number}: expected a JSON object, got {type(item).__name__}")
            yield number, item


def _require(item: dict[str, Any], keys: tuple[str, ...], path: Path, line: int | None) -> None:
    missing = [key for key in keys if key not in item]
    if missing:
        raise ReplayInputError(f"{_where(path, line)}: missing field(s) {', '.join(missing)}")


def _stage_of(arrivals: np.ndarray, stages: list[Stage]) -> np.ndarray:
    starts = np.array([stage.start_s for stage in stages])
    return np.clip(np.searchsorted(starts, arrivals, side="right") - 1, 0, len(stages) - 1)


def _single_stage(arrivals: np.ndarray, rate: float | None = None) -> list[Stage]:
    end = float(arrivals.max()) if len(arrivals) else 0.0
    observed = (len(arrivals) - 1) / end if len(arrivals) > 1 and end > 0 else None
    return [Stage(0.0, end, rate if rate is not None else observed)]


# --------------------------------------------------------------------------------------------------
# BLIS: per-request CSV + runs.csv (vLLM v0.15.1, H100)
# --------------------------------------------------------------------------------------------------

BLIS_COLUMNS = ("index", "arrival_s", "input_tokens", "output_tokens_server", "has_error", "ttft_s", "e2e_s")
BLIS_RUN_COLUMNS = (
    "run",
    "model",
    "tp",
    "max_num_seqs",
    "max_num_batched_tokens",
    "gpu_kv_blocks",
    "block_size",
)
BLIS_STAGES_COLUMN = "stages(rate req/s,duration s)"


def read_blis_csv(
    path: Path,
    runs_csv: Path | None = None,
    *,
    run: str | None = None,
    gpu: str | None = None,
    prompts: CyclingPrompts | None | str = "from_runs",
) -> MeasuredRun:
    """A BLIS replay CSV. ``runs_csv`` (default: ``runs.csv`` beside it) gives the server settings of
    row ``run`` (default: the CSV's stem). ``prompts``: the rule that says which requests repeat
    which prompt; ``"from_runs"`` builds the documented one (request i sends prompt i mod 100, groups
    of 10 sharing the run's ``system_prompt_len``), None replays without prompt identity."""
    runs_csv = runs_csv if runs_csv is not None else path.parent / "runs.csv"
    name = run or path.stem
    settings_row = _blis_settings_row(runs_csv, name)
    line = settings_row.pop("_line")
    stages = _blis_stages(settings_row.get(BLIS_STAGES_COLUMN, ""), runs_csv, line)
    settings = ServerSettings(
        model=settings_row["model"],
        gpu=gpu,
        tensor_parallel_size=int(_number(settings_row["tp"], "tp", runs_csv, line, integer=True)),
        max_num_seqs=int(_number(settings_row["max_num_seqs"], "max_num_seqs", runs_csv, line, integer=True)),
        max_num_batched_tokens=int(
            _number(
                settings_row["max_num_batched_tokens"], "max_num_batched_tokens", runs_csv, line, integer=True
            )
        ),
        # The published servers ran with max_model_len 4096 (real-runs README; not in runs.csv).
        max_model_len=4096,
        block_size=int(_number(settings_row["block_size"], "block_size", runs_csv, line, integer=True)),
        num_gpu_blocks=int(
            _number(settings_row["gpu_kv_blocks"], "gpu_kv_blocks", runs_csv, line, integer=True)
        ),
        engine_version="vLLM v0.15.1",
        async_scheduling=async_scheduling_by_default("0.15.1"),
    )
    requests = _blis_requests(path)
    requests["stage"] = _stage_of(requests["arrival_s"].to_numpy(), stages)
    notes = [
        "latencies are client-side (the inference-perf client's send to its receipt of the first / last "
        "streamed token: HTTP, the API server, tokenization and SSE streaming included)",
        "output lengths are the server's own counts (output_tokens_server; the client's re-tokenized "
        "counts are wrong for some requests)",
        "the server also had 8 GiB of CPU KV offload (vLLM OffloadingConnector); not replayed",
    ]
    chains = None
    if prompts == "from_runs":
        system = settings_row.get("system_prompt_len")
        system_tokens = (
            int(_number(system, "system_prompt_len", runs_csv, line, integer=True)) if system else 0
        )
        prompts = CyclingPrompts(distinct=100, group_size=10, system_prompt_tokens=system_tokens)
    if isinstance(prompts, CyclingPrompts):
        chains = prompts.chains(requests["prompt_tokens"].tolist(), settings.block_size)
        notes.append(
            f"prompt identity from a rule: {prompts.describe()} (which prompts share a group is not recorded)"
        )
    else:
        notes.append("no prompt identity: every prompt is unique (prefix caching cannot be replayed)")
    return MeasuredRun(
        name=name,
        source_format="blis_csv",
        path=path,
        requests=requests,
        settings=settings,
        anchor="client",
        tpot_definition="ratio_of_means",
        stages=stages,
        prompt_hashes=chains,
        hash_block_len=settings.block_size,
        notes=notes,
    )


def _blis_settings_row(runs_csv: Path, name: str) -> dict[str, Any]:
    with _open(runs_csv, "the runs table") as handle:
        reader = csv.DictReader(handle)
        missing = [column for column in BLIS_RUN_COLUMNS if column not in (reader.fieldnames or [])]
        if missing:
            raise ReplayInputError(f"{runs_csv}: missing column(s) {', '.join(missing)}")
        known = []
        for number, row in enumerate(reader, start=2):
            known.append(row["run"])
            if row["run"] == name:
                return {**row, "_line": number}
    raise ReplayInputError(f"{runs_csv}: no run named {name!r} (runs: {', '.join(known)})")


def _blis_stages(text: str, path: Path, line: int) -> list[Stage]:
    try:
        items = json.loads(text) if text else []
    except json.JSONDecodeError:
        raise ReplayInputError(f"{path}:{line}: {BLIS_STAGES_COLUMN} is not a JSON list: {text!r}") from None
    if not isinstance(items, list) or not items:
        raise ReplayInputError(f"{path}:{line}: {BLIS_STAGES_COLUMN} must be a non-empty list, got {text!r}")
    stages, start = [], 0.0
    for item in items:
        if not isinstance(item, dict) or "duration" not in item or "rate" not in item:
            raise ReplayInputError(f"{path}:{line}: a stage needs duration and rate, got {item!r}")
        duration = _number(item["duration"], "stage duration", path, line)
        rate = _number(item["rate"], "stage rate", path, line)
        stages.append(Stage(start, start + duration, rate))
        start += duration
    return stages


def _blis_requests(path: Path) -> pd.DataFrame:
    rows: list[tuple[float, int, int, float, float]] = []
    with _open(path) as handle:
        reader = csv.DictReader(handle)
        missing = [column for column in BLIS_COLUMNS if column not in (reader.fieldnames or [])]
        if missing:
            raise ReplayInputError(f"{path}: missing column(s) {', '.join(missing)}")
        for number, row in enumerate(reader, start=2):
            arrival = _number(row["arrival_s"], "arrival_s", path, number)
            prompt = int(_number(row["input_tokens"], "input_tokens", path, number, integer=True))
            output = int(
                _number(row["output_tokens_server"], "output_tokens_server", path, number, integer=True)
            )
            failed = row["has_error"].strip() not in ("0", "", "False", "false")
            if prompt < 1 or output < 1:
                raise ReplayInputError(
                    f"{path}:{number}: input_tokens and output_tokens_server must be >= 1, got {prompt} and {output}"
                )
            if rows and arrival < rows[-1][0]:
                raise ReplayInputError(f"{path}:{number}: arrival_s {arrival} is before the previous row's")
            ttft = math.nan if failed else _number(row["ttft_s"], "ttft_s", path, number)
            e2e = math.nan if failed else _number(row["e2e_s"], "e2e_s", path, number)
            if not failed and e2e < ttft:
                raise ReplayInputError(f"{path}:{number}: e2e_s {e2e} is shorter than ttft_s {ttft}")
            rows.append((arrival, prompt, output, ttft, e2e))
    if not rows:
        raise ReplayInputError(f"{path}: no requests")
    return _request_frame(rows)


def _request_frame(rows: list[tuple[float, int, int, float, float]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=["arrival_s", "prompt_tokens", "output_tokens", "ttft_s", "e2e_s"])
    frame["arrival_s"] -= frame["arrival_s"].iloc[0]
    frame.insert(0, "request_id", np.arange(len(frame)))
    frame["stage"] = 0
    return frame


# --------------------------------------------------------------------------------------------------
# LLMServingSim's bench folder (vLLM 0.19, in-process AsyncLLM)
# --------------------------------------------------------------------------------------------------

LSS_REQUEST_FIELDS = (
    "request_id",
    "input_toks",
    "output_toks",
    "queued_ts",
    "first_token_ts",
    "last_token_ts",
)


ASYNC_SCHEDULING_SINCE = (0, 14)
"""vLLM turned async scheduling on by default in 0.14 (PR #27614, the last step of its async
scheduling plan, issue #27679): ``SchedulerConfig.async_scheduling`` None means on unless a feature
in use rules it out."""


def async_scheduling_by_default(version: str) -> bool | None:
    """Whether vLLM ``version`` ("0.15.1", "v0.19.0") schedules asynchronously by default (None: not a
    version number)."""
    match = re.match(r"v?(\d+)\.(\d+)", version.strip())
    if match is None:
        return None
    return (int(match[1]), int(match[2])) >= ASYNC_SCHEDULING_SINCE


def _lss_async_scheduling(meta: dict[str, Any]) -> bool | None:
    """The resolved config's switch where the folder recorded it, else the version's default."""
    resolved = (meta.get("resolved_config") or {}).get("scheduler_config") or {}
    if isinstance(resolved.get("async_scheduling"), bool):
        return resolved["async_scheduling"]
    return async_scheduling_by_default(str(meta.get("vllm_version", "")))


def read_llmservingsim_bench(
    folder: Path, *, workload: Path | None = None, gpu: str | None = None, use_token_ids: bool = True
) -> MeasuredRun:
    """A bench run folder (the one holding ``vllm/``). ``workload``: the JSONL it replayed (default:
    ``meta.json``'s ``dataset_path`` resolved against the LLMServingSim checkout the folder sits
    in); its token ids give the prompts' identity."""
    meta_path = folder / "vllm" / "meta.json"
    meta = _json_file(meta_path)
    if not isinstance(meta.get("engine_kwargs"), dict):
        raise ReplayInputError(f"{meta_path}: missing engine_kwargs (is this an LLMServingSim bench folder?)")
    kwargs = meta["engine_kwargs"]
    kv = meta.get("kv_cache") or {}
    hardware = meta.get("hardware") or {}
    settings = ServerSettings(
        model=kwargs.get("model") or meta.get("model"),
        gpu=gpu or hardware.get("device_name"),
        tensor_parallel_size=int(kwargs.get("tensor_parallel_size") or 1),
        data_parallel_size=int(kwargs.get("data_parallel_size") or 1),
        enable_expert_parallel=bool(kwargs.get("enable_expert_parallel")),
        max_num_seqs=kwargs.get("max_num_seqs"),
        max_num_batched_tokens=kwargs.get("max_num_batched_tokens"),
        max_model_len=kwargs.get("max_model_len"),
        block_size=int(kv.get("block_size") or 16),
        num_gpu_blocks=kv.get("num_gpu_blocks"),
        gpu_memory_utilization=float(kv.get("gpu_memory_utilization") or 0.9),
        enable_prefix_caching=bool(kv.get("enable_prefix_caching", True)),
        kv_cache_dtype=str(kwargs.get("kv_cache_dtype") or "auto"),
        engine_version=f"vLLM {meta.get('vllm_version', '?')}",
        async_scheduling=_lss_async_scheduling(meta),
    )
    requests, order = _lss_requests(folder / "vllm" / "requests.jsonl")
    notes = [
        "latencies are engine-side, anchored at the engine's queued_ts (in-process AsyncLLM: no HTTP, no "
        "API server); arrivals are the queued_ts, so the client's own submission delay is not replayed",
    ]
    chains = None
    if use_token_ids:
        # Only the token ids need the workload file: without them a run whose JSONL is not at hand
        # still replays (every prompt unique).
        workload_path = workload if workload is not None else _lss_workload_path(folder, meta, meta_path)
        token_ids = _lss_token_ids(workload_path, requests, order)
        chains = chains_from_token_ids(token_ids, settings.block_size)
        notes.append(
            f"prompt identity from the token ids in {workload_path.name} ({settings.block_size}-token blocks)"
        )
    else:
        notes.append("no prompt identity: every prompt is unique (prefix caching cannot be replayed)")
    if settings.num_gpu_blocks is None:
        notes.append(
            "the run did not record its GPU KV block count: the pool is sized from the GPU and model"
        )
    timeseries = _lss_timeseries(folder / "vllm" / "timeseries.csv", notes)
    return MeasuredRun(
        name=f"{folder.parent.name}-{folder.name}",
        source_format="llmservingsim_bench",
        path=folder,
        requests=requests,
        settings=settings,
        anchor="engine",
        tpot_definition="per_request",
        stages=_single_stage(requests["arrival_s"].to_numpy()),
        prompt_hashes=chains,
        hash_block_len=settings.block_size,
        timeseries=timeseries,
        notes=notes,
    )


def _json_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ReplayInputError(f"{path}: cannot read: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise ReplayInputError(f"{path}:{error.lineno}: not valid JSON ({error.msg})") from None
    if not isinstance(data, dict):
        raise ReplayInputError(f"{path}: expected a JSON object at the top level")
    return data


def _lss_requests(path: Path) -> tuple[pd.DataFrame, list[int]]:
    """The requests in the order the engine queued them, and each one's line index in the workload."""
    items = []
    for number, item in _json_lines(path):
        _require(item, LSS_REQUEST_FIELDS, path, number)
        request_id = str(item["request_id"])
        try:
            workload_index = int(request_id.rsplit("-", 1)[-1])
        except ValueError:
            raise ReplayInputError(
                f"{path}:{number}: request_id {request_id!r} does not end in a number"
            ) from None
        queued = _number(item["queued_ts"], "queued_ts", path, number)
        first = _number(item["first_token_ts"], "first_token_ts", path, number)
        last = _number(item["last_token_ts"], "last_token_ts", path, number)
        if not queued <= first <= last:
            raise ReplayInputError(
                f"{path}:{number}: expected queued_ts <= first_token_ts <= last_token_ts, got {queued}, {first}, {last}"
            )
        prompt = int(_number(item["input_toks"], "input_toks", path, number, integer=True))
        output = int(_number(item["output_toks"], "output_toks", path, number, integer=True))
        if prompt < 1 or output < 1:
            raise ReplayInputError(f"{path}:{number}: input_toks and output_toks must be >= 1")
        items.append((queued, workload_index, prompt, output, first - queued, last - queued))
    if not items:
        raise ReplayInputError(f"{path}: no requests")
    # DP ranks queue on their own threads: the file is in submission order, not always queue order.
    items.sort(key=lambda item: (item[0], item[1]))
    order = [item[1] for item in items]
    rows = [(queued, prompt, output, ttft, e2e) for queued, _, prompt, output, ttft, e2e in items]
    return _request_frame(rows), order


def _lss_workload_path(folder: Path, meta: dict[str, Any], meta_path: Path) -> Path:
    dataset = meta.get("dataset_path")
    if not isinstance(dataset, str):
        raise ReplayInputError(f"{meta_path}: no dataset_path; name the workload file")
    for root in [folder, *folder.parents]:
        candidate = root / dataset
        if candidate.is_file():
            return candidate
    raise ReplayInputError(
        f"{meta_path}: dataset_path {dataset!r} not found above {folder}; name the workload file"
    )


def _lss_token_ids(path: Path, requests: pd.DataFrame, order: list[int]) -> list[list[int]]:
    lines: dict[int, list[int]] = {}
    for index, (number, item) in enumerate(_json_lines(path)):
        ids = item.get("input_tok_ids")
        if not isinstance(ids, list) or not all(isinstance(token, int) for token in ids):
            raise ReplayInputError(f"{path}:{number}: input_tok_ids must be a list of integers")
        lines[index] = ids
    prompts = []
    for position, workload_index in enumerate(order):
        ids = lines.get(workload_index)
        if ids is None:
            raise ReplayInputError(f"{path}: has no line for request {workload_index} ({len(lines)} lines)")
        expected = int(requests["prompt_tokens"].iloc[position])
        if len(ids) != expected:
            raise ReplayInputError(
                f"{path}: line {workload_index + 1} has {len(ids)} token ids, but the run measured "
                f"input_toks={expected} for request bench-{workload_index}: not the workload this run replayed"
            )
        prompts.append(ids)
    return prompts


def _lss_timeseries(path: Path, notes: list[str]) -> pd.DataFrame | None:
    if not path.is_file():
        return None
    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError) as error:
        raise ReplayInputError(f"{path}: cannot read: {error}") from None
    if "t" not in frame:
        raise ReplayInputError(f"{path}: missing column t")
    series = pd.DataFrame({"time_s": frame["t"].astype(float)})
    for source, target in (("running", "running"), ("waiting", "waiting")):
        if source in frame:
            series[target] = frame[source].astype(float)
    if "kv_cache_pct" in frame and frame["kv_cache_pct"].abs().sum() > 0:
        series["kv_usage_frac"] = frame["kv_cache_pct"].astype(float) / 100
    elif "kv_cache_pct" in frame:
        notes.append(
            "its timeseries.csv has kv_cache_pct 0 throughout (not recorded): KV usage is not compared"
        )
    notes.append("the server's 1 s samples are placed on the replay's clock with t = 0 at the first request")
    return series


# --------------------------------------------------------------------------------------------------
# vllm bench serve --save-result --save-detailed
# --------------------------------------------------------------------------------------------------

VLLM_BENCH_FIELDS = ("input_lens", "output_lens", "ttfts", "itls")


def read_vllm_bench_json(
    path: Path,
    *,
    model: str | None = None,
    gpu: str | None = None,
    arrival_seed: int = 0,
    settings: Callable[[ServerSettings], ServerSettings] | None = None,
) -> MeasuredRun:
    """A ``vllm bench serve`` result saved with ``--save-detailed``. Arrivals are its ``start_times``
    when it has them (newer vLLM); otherwise they are regenerated from its ``request_rate`` and
    ``burstiness`` (gamma gaps, as its client draws them) with ``arrival_seed``: the same process, not
    the same draws, which the report says. E2E is TTFT plus the inter-token latencies."""
    data = _json_file(path)
    _require(data, VLLM_BENCH_FIELDS, path, None)
    if not isinstance(data["input_lens"], list):
        raise ReplayInputError(f"{path}: input_lens must be a list (one entry per request)")
    count = len(data["input_lens"])
    if count == 0:
        raise ReplayInputError(f"{path}: no requests (input_lens is empty): nothing to replay or compare")
    for key in VLLM_BENCH_FIELDS:
        if not isinstance(data[key], list) or len(data[key]) != count:
            raise ReplayInputError(f"{path}: {key} must be a list of {count} entries (one per request)")
    errors = data.get("errors") or [""] * count
    notes = ["latencies are client-side (vllm bench serve: HTTP, the API server and streaming included)"]
    arrivals = _vllm_bench_arrivals(data, count, path, arrival_seed, notes)
    rows = []
    for index in range(count):
        where = f"request {index}"
        prompt = int(_number(data["input_lens"][index], f"input_lens[{index}]", path, None, integer=True))
        output = int(_number(data["output_lens"][index], f"output_lens[{index}]", path, None, integer=True))
        failed = bool(errors[index]) or output < 1
        ttft = itl_sum = math.nan
        if not failed:
            ttft = _number(data["ttfts"][index], f"ttfts[{index}]", path, None)
            itls = data["itls"][index]
            if not isinstance(itls, list):
                raise ReplayInputError(f"{path}: itls[{index}] must be a list ({where})")
            itl_sum = sum(_number(gap, f"itls[{index}]", path, None) for gap in itls)
        rows.append((arrivals[index], prompt, max(output, 1), ttft, ttft + itl_sum))
    order = np.argsort(arrivals, kind="stable")
    rows = [rows[index] for index in order]
    if not rows:
        raise ReplayInputError(f"{path}: no requests")
    requests = _request_frame(rows)
    rate = data.get("request_rate")
    numeric_rate = float(rate) if isinstance(rate, int | float) and math.isfinite(rate) else None
    server = ServerSettings(model=model or data.get("model_id"), gpu=gpu, engine_version="vLLM (bench serve)")
    if settings is not None:
        server = settings(server)
    notes.append("prompt content is not saved by vllm bench serve: every prompt is replayed as unique")
    return MeasuredRun(
        max_concurrency=_max_concurrency(data, path),
        name=path.stem,
        source_format="vllm_bench_json",
        path=path,
        requests=requests,
        settings=server,
        anchor="client",
        tpot_definition="per_request",
        stages=_single_stage(requests["arrival_s"].to_numpy(), numeric_rate),
        notes=notes,
    )


def _max_concurrency(data: dict[str, Any], path: Path) -> int | None:
    value = data.get("max_concurrency")
    if value in (None, 0):
        return None
    return int(_number(value, "max_concurrency", path, None, integer=True))


def _vllm_bench_arrivals(
    data: dict[str, Any], count: int, path: Path, seed: int, notes: list[str]
) -> np.ndarray:
    starts = data.get("start_times")
    concurrency = _max_concurrency(data, path)
    if concurrency is not None:
        # The send times of a closed loop follow the measured server's pace; the replay runs the loop.
        notes.append(
            f"closed loop (max_concurrency={concurrency}): each request is sent when one of the "
            f"{concurrency} slots frees, as the client did; the recorded send times are not replayed "
            "(the client's own delay between a finish and the next send is not modelled)"
        )
    elif isinstance(starts, list) and len(starts) == count:
        values = np.array([_number(value, "start_times", path, None) for value in starts], dtype=float)
        notes.append("arrivals are the client's recorded send times (start_times)")
        return values - values.min()
    rate = data.get("request_rate")
    burstiness = data.get("burstiness") or 1.0
    if rate in (None, "inf") or (isinstance(rate, float) and math.isinf(rate)):
        notes.append("request_rate inf and no start_times: every request is replayed as sent at t = 0")
        return np.zeros(count)
    rate = _number(rate, "request_rate", path, None)
    burstiness = _number(burstiness, "burstiness", path, None)
    if rate <= 0 or burstiness <= 0:
        raise ReplayInputError(f"{path}: request_rate and burstiness must be positive")
    # vLLM's client: gamma gaps of shape burstiness and mean 1 / rate (burstiness 1 = Poisson).
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), count)
    gaps[0] = 0.0
    notes.append(
        f"no start_times: arrivals regenerated from request_rate={rate:g}/s, burstiness={burstiness:g} with "
        f"seed {seed} (the same process as the client's, not its draws)"
    )
    return np.cumsum(gaps)
