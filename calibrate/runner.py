"""Run a calibration: time the grid's points on a real torch layer, fit, write PROFILE.yaml + CSV.

Measurement discipline (see ``shared/reference/torch-calibration.md``):

* one intra-op thread on CPU (``torch.set_num_threads(1)``; two threads on a shared box made times
  snap to scheduler quanta and broke the fits);
* per point: an untimed warm-up call, one call to size the sample count, then ``n`` timed calls
  (``time.perf_counter`` after a synchronize; CUDA events on CUDA); the per-round value is the median;
* several rounds, each over all points in a new shuffled order, so that a slow spell of the machine
  hits random points instead of one whole sweep; a point's time is the minimum of its round medians;
* a point's tensors are built before and dropped after it, outside the timed region.

Only this module and :mod:`calibrate.kernels` import torch.
"""

from __future__ import annotations

import contextlib
import csv
import ctypes
import datetime as dt
import io
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from calibrate import CalibrationError
from calibrate.fit import LinearFit, fit_relative, quality
from calibrate.grids import Grid, Point, make_grid
from calibrate.memory import available_bytes, estimate, resident_bytes
from sim.costs.core import (
    DEFAULT_HOST_BANDWIDTH_BYTES_PER_S,
    DTYPE_BYTES,
    BlockCoefficients,
    BlockSizePoint,
    CostProfile,
    LayerDecodeCoefficients,
    LayerPrefillCoefficients,
    ProfileCoefficients,
    ProfileDevice,
    ProfileModel,
    StepCoefficients,
    kv_elements_per_token_per_layer,
)
from sim.storage import write_files_atomically

if TYPE_CHECKING:
    import torch

CSV_COLUMNS = (
    "phase",
    "round",
    "order",
    "block_size",
    "batch",
    "ctx_max",
    "ctx_sum",
    "ctx_padded",
    "num_tokens",
    "start",
    "num_blocks",
    "holdout",
    "median_s",
    "iqr_s",
    "n_samples",
    "contexts",
)

# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_GLIBC_DEFAULT_MMAP_MAX, _GLIBC_DEFAULT_TRIM_THRESHOLD = 65536, 128 * 1024


@contextlib.contextmanager
def heap_only_malloc() -> Any:
    """On glibc, serve large allocations from the heap and keep freed memory in the process.

    torch's CPU allocator is plain ``malloc``; glibc maps every block above 32 MiB (and smaller ones
    early on) with ``mmap`` and unmaps it on free, so each timed call that allocates a large output (the
    K/V gather, a block copy's ``index_select``) pays fresh page faults: that made the gather of 32k tokens
    7x slower and a 64-block copy 4x slower on our CPU, and noisy. A serving kernel writes into memory it
    already owns, and torch's CUDA caching allocator reuses blocks, so the heap-only setting measures
    what a server would see. Yields whether the setting took effect; restores glibc's defaults after."""
    libc = None
    with contextlib.suppress(OSError, AttributeError):
        candidate = ctypes.CDLL("libc.so.6")
        if candidate.mallopt(_M_MMAP_MAX, 0) and candidate.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1):
            libc = candidate
    try:
        yield libc is not None
    finally:
        if libc is not None:
            libc.mallopt(_M_MMAP_MAX, _GLIBC_DEFAULT_MMAP_MAX)
            libc.mallopt(_M_TRIM_THRESHOLD, _GLIBC_DEFAULT_TRIM_THRESHOLD)


def release_free_heap() -> None:
    """Hand freed heap memory back to the system (glibc ``malloc_trim``) between points, outside any
    timing: with trimming otherwise off (:func:`heap_only_malloc`), the free lists of one point's
    tensors would otherwise pile up with the next ones' and the process would grow well past the
    largest point. The next point's untimed warm-up call takes the page faults."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


PointProgress = Callable[[int, int, "Point", float], None]
"""``(points done, points in total, the point just timed, seconds elapsed)``, after every point."""

NOISY_SPREAD = 0.05
"""A run whose median spread across rounds exceeds 5 % is flagged as noisy in the profile."""


def grid_points(grid: Grid, block_size: int, swaps: bool) -> list[Point]:
    """Every point the grid times, at ``block_size`` (the sweep at its own block sizes)."""
    points: list[Point] = []
    points += [Point("decode", block_size, contexts=(ctx,) * b) for b, ctx in grid.decode_points()]
    points += [Point("decode", block_size, contexts=tuple(c), holdout=True) for c in grid.decode_holdout]
    points += [Point("head", block_size, num_tokens=b) for b in grid.head_batches]
    points += [
        Point("prefill", block_size, num_tokens=n, start=s)
        for n in grid.prefill_chunks
        for s in grid.prefill_starts
    ]
    points += [
        Point("prefill", block_size, num_tokens=n, start=s, holdout=True) for n, s in grid.prefill_holdout
    ]
    block_phases = ["copy"] + (["swap_out", "swap_in"] if swaps else [])
    for phase in block_phases:
        points += [Point(phase, block_size, num_blocks=n) for n in grid.block_counts]
        points += [Point(phase, block_size, num_blocks=n, holdout=True) for n in grid.block_holdout]
    for size in sweep_sizes(grid, block_size):
        points += [Point("sweep_attn", size, contexts=(ctx,) * b) for b, ctx in grid.sweep_decode]
        for phase in block_phases:
            points += [Point("sweep_" + phase, size, num_blocks=n) for n in grid.sweep_block_counts]
    return points


def sweep_sizes(grid: Grid, block_size: int) -> list[int]:
    return sorted(set(grid.sweep_block_sizes) | {block_size})


# --------------------------------------------------------------------------------------------------
# Building and timing points
# --------------------------------------------------------------------------------------------------


class Bench:
    """Holds the layer's weights and builds a closure per point (tensors made outside the timing)."""

    def __init__(self, model: ProfileModel, device: torch.device, dtype: torch.dtype, seed: int):
        from calibrate import kernels

        self.kernels = kernels
        self.model = model
        self.device, self.dtype = device, dtype
        self.layer = kernels.DecoderLayer(model, dtype, device, seed=seed)
        self._head: Any = None
        self.rng = np.random.default_rng(seed)

    @property
    def head(self) -> Any:
        if self._head is None:
            self._head = self.kernels.LMHead(self.model, self.dtype, self.device)
        return self._head

    def _randn(self, *shape: int) -> torch.Tensor:
        import torch

        return torch.randn(*shape, device=self.device, dtype=self.dtype)

    def _paged(self, contexts: tuple[int, ...], block_size: int) -> dict[str, torch.Tensor]:
        """A pool holding ``contexts`` with block tables drawn from a random permutation of ids."""
        import torch

        blocks_per = [-(-ctx // block_size) for ctx in contexts]
        ids = self.rng.permutation(sum(blocks_per))
        table = np.zeros((len(contexts), max(blocks_per)), dtype=np.int32)
        offset = 0
        for row, count in enumerate(blocks_per):
            table[row, :count] = ids[offset : offset + count]
            table[row, count:] = ids[offset]  # padding: any valid id, masked out
            offset += count
        shape = (len(ids), block_size, self.model.num_kv_heads, self.model.head_dim)
        return {
            "k_pool": self._randn(*shape),
            "v_pool": self._randn(*shape),
            "block_tables": torch.from_numpy(table).to(self.device),
            "context_lens": torch.tensor(contexts, device=self.device),
        }

    def _block_cache(self, num_blocks: int, block_size: int) -> tuple[torch.Tensor, ...]:
        import torch

        total = 2 * num_blocks + 1
        cache = self._randn(
            self.model.num_layers, 2, total, block_size, self.model.num_kv_heads, self.model.head_dim
        )
        order = torch.from_numpy(self.rng.permutation(total)[: 2 * num_blocks]).to(self.device)
        return cache, order[:num_blocks], order[num_blocks:]

    def make(self, point: Point) -> Callable[[], Any]:
        import torch

        k = self.kernels
        if point.phase in ("decode", "sweep_attn"):
            state = self._paged(point.contexts, point.block_size)
            batch = len(point.contexts)
            seq = torch.arange(batch, device=self.device)
            slots = k.slot_mapping(state["block_tables"], seq, state["context_lens"] - 1, point.block_size)
            if point.phase == "sweep_attn":
                q = self._randn(batch, self.model.num_attention_heads, self.model.head_dim)
                return lambda: k.paged_decode_attention(
                    q, state["k_pool"], state["v_pool"], state["block_tables"], state["context_lens"]
                )
            x = self._randn(batch, self.model.hidden_size)
            return lambda: self.layer.decode(x, slots=slots, **state)
        if point.phase == "head":
            x = self._randn(point.num_tokens, self.model.hidden_size)
            head = self.head
            return lambda: head(x)
        if point.phase == "prefill":
            total = point.start + point.num_tokens
            state = self._paged((total,), point.block_size)
            table = state["block_tables"][0]
            positions = torch.arange(point.start, total, device=self.device)
            zeros = torch.zeros_like(positions)
            slots = k.slot_mapping(state["block_tables"], zeros, positions, point.block_size)
            x = self._randn(point.num_tokens, self.model.hidden_size)
            return lambda: self.layer.prefill(
                x, state["k_pool"], state["v_pool"], table, point.start, slots=slots
            )
        cache, src, dst = self._block_cache(point.num_blocks, point.block_size)
        if point.phase.endswith("copy"):
            return lambda: k.copy_blocks(cache, src, dst)
        host = torch.empty(
            (*cache.shape[:2], point.num_blocks, *cache.shape[3:]), dtype=cache.dtype, pin_memory=True
        )
        if point.phase.endswith("swap_out"):
            return lambda: k.swap_out(cache, src, host)
        if point.phase.endswith("swap_in"):
            return lambda: k.swap_in(cache, dst, host)
        raise ValueError(f"unknown phase {point.phase!r}")


GRAPH_PHASES = frozenset({"decode", "sweep_attn", "head", "prefill"})
"""Phases timed as CUDA-graph replays with ``cuda_graphs``: the compute a serving engine captures
(vLLM replays decode batches from CUDA graphs; V1 captures piecewise graphs for mixed batches too).
Block copies and host swaps stay eager: engines launch them as plain copies."""


def capture_cuda_graph(fn: Callable[[], Any]) -> Callable[[], Any] | None:
    """``fn`` captured into a CUDA graph (replayed by the returned callable), or None when ``fn`` cannot
    be captured (a host synchronisation inside it, say): the caller then times it eagerly."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):
            fn()  # warm-up outside the graph: lazy initialisation must not be captured
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
    except RuntimeError:
        torch.cuda.synchronize()
        return None
    return graph.replay


def measure(
    fn: Callable[[], Any], device: torch.device, grid: Grid, graph: bool = False
) -> tuple[float, float, int, bool]:
    """Median and IQR of the per-call time in seconds, the number of samples, and whether the samples
    are CUDA-graph replays (``graph`` asks for one; a call that cannot be captured runs eagerly)."""
    import torch

    cuda = device.type == "cuda"
    replayed = None
    if cuda and graph:
        replayed = capture_cuda_graph(fn)
        if replayed is not None:
            fn = replayed

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    fn()
    sync()  # untimed warm-up
    started = time.perf_counter()
    fn()
    sync()
    estimate = max(time.perf_counter() - started, 1e-7)
    count = min(grid.max_samples, max(grid.min_samples, math.ceil(grid.min_time_s / estimate)))
    samples = []
    for _ in range(count):
        if cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(begin.elapsed_time(end) / 1e3)
        else:
            started = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - started)
    q25, q50, q75 = np.percentile(samples, [25, 50, 75])
    return float(q50), float(q75 - q25), count, replayed is not None


# --------------------------------------------------------------------------------------------------
# Fitting the samples
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    point: Point
    time_s: float
    """Minimum over rounds of the per-round median."""
    spread: float
    """(max - min) / min of the round medians."""


def _decode_features(points: list[Point], padded: bool = False) -> np.ndarray:
    return np.array([[1.0, p.batch, p.ctx_padded if padded else p.ctx_sum] for p in points])


def _prefill_features(points: list[Point]) -> np.ndarray:
    return np.array([[1.0, p.num_tokens, p.num_tokens * (p.start + p.num_tokens / 2)] for p in points])


def _block_features(points: list[Point]) -> np.ndarray:
    return np.array([[1.0, p.num_blocks] for p in points])


def _fit_phase(
    rows: list[Measured],
    features: Callable[[list[Point]], np.ndarray],
    names: tuple[str, ...],
) -> tuple[LinearFit, dict[str, Any]]:
    train = [row for row in rows if not row.point.holdout]
    held = [row for row in rows if row.point.holdout]
    y = np.array([row.time_s for row in train])
    fit = fit_relative(features([row.point for row in train]), y, names)
    report: dict[str, Any] = {
        "model": " + ".join(names),
        **quality(y, fit.predict(features([r.point for r in train]))),
    }
    if held:
        held_y = np.array([row.time_s for row in held])
        report["holdout"] = quality(held_y, fit.predict(features([row.point for row in held])))
    report["coefficients"] = fit.as_dict()
    return fit, report


def fit_profile_coefficients(
    measured: list[Measured], model: ProfileModel, block_size: int, dtype_bytes: int, swaps_measured: bool
) -> tuple[ProfileCoefficients, dict[str, Any]]:
    """Per-phase weighted least squares; returns the coefficients and the fit-quality report."""

    def phase(name: str, size: int | None = block_size) -> list[Measured]:
        return [m for m in measured if m.point.phase == name and (size is None or m.point.block_size == size)]

    report: dict[str, Any] = {}
    decode_rows = phase("decode")
    decode, report["decode"] = _fit_phase(
        decode_rows, _decode_features, ("intercept", "per_seq", "per_context_token")
    )
    uniform_held = [m for m in decode_rows if m.point.holdout and not m.point.ragged]
    ragged = [m for m in decode_rows if m.point.ragged]
    for key, rows, padded in (
        ("holdout_uniform", uniform_held, False),
        ("holdout_ragged_sum_context", ragged, False),
        ("holdout_ragged_padded_context", ragged, True),
    ):
        if rows:
            y = np.array([m.time_s for m in rows])
            report["decode"][key] = quality(
                y, decode.predict(_decode_features([m.point for m in rows], padded))
            )
    train = [m for m in decode_rows if not m.point.holdout]
    squared = np.column_stack(
        [_decode_features([m.point for m in train]), [float(m.point.ctx_sum) ** 2 for m in train]]
    )
    y_train = np.array([m.time_s for m in train])
    quadratic = fit_relative(
        squared, y_train, ("intercept", "per_seq", "per_context_token", "per_context_token_sq")
    )
    report["decode"]["with_sum_context_squared"] = {
        **quality(y_train, quadratic.predict(squared)),
        "coefficients": quadratic.as_dict(),
        "note": "diagnostic only: the engine needs a step linear in the summed context",
    }
    several = [m for m in train if m.point.batch > 1]
    if len(several) < len(train) and len(several) >= 3:
        x_several = _decode_features([m.point for m in several])
        y_several = np.array([m.time_s for m in several])
        without = fit_relative(x_several, y_several, ("intercept", "per_seq", "per_context_token"))
        single = [m for m in train if m.point.batch == 1]
        report["decode"]["excluding_batch_1"] = {
            **quality(y_several, without.predict(x_several)),
            "coefficients": without.as_dict(),
            "batch_1": quality(
                np.array([m.time_s for m in single]),
                without.predict(_decode_features([m.point for m in single])),
            ),
            "note": "diagnostic only: CPU BLAS runs batch 1 as a matrix-vector product, often much cheaper "
            "per step than a batch-2 matrix product; this fit leaves batch 1 out to show that step",
        }
    report["decode"]["note"] = (
        "fitted on uniform batches; holdout = every held-out batch predicted from sum(context), as the "
        "simulator does. The plain-torch gather pads a ragged batch to its longest sequence, so ragged "
        "holdouts are also predicted from batch * max(context)"
    )
    head, report["head"] = _fit_phase(
        phase("head"), lambda pts: np.array([[1.0, p.num_tokens] for p in pts]), ("intercept", "per_seq")
    )
    prefill, report["prefill"] = _fit_phase(
        phase("prefill"), _prefill_features, ("intercept", "per_token", "per_attention_pair")
    )
    copy, report["copy"] = _fit_phase(phase("copy"), _block_features, ("intercept", "per_block"))

    def swap_coefficients(size: int, prefix: str = "") -> tuple[BlockCoefficients, dict[str, Any]]:
        if swaps_measured:
            out, out_report = _fit_phase(
                phase(prefix + "swap_out", size), _block_features, ("intercept", "per_block")
            )
            back, in_report = _fit_phase(
                phase(prefix + "swap_in", size), _block_features, ("intercept", "per_block")
            )
            return (
                BlockCoefficients(
                    intercept_s=(out["intercept"] + back["intercept"]) / 2,
                    per_block_s=(out["per_block"] + back["per_block"]) / 2,
                    measured=True,
                    note="mean of the swap-out and swap-in fits (pinned host memory)",
                ),
                {"swap_out": out_report, "swap_in": in_report},
            )
        bandwidth = DEFAULT_HOST_BANDWIDTH_BYTES_PER_S
        block_bytes = model.num_layers * kv_elements_per_token_per_layer(model) * dtype_bytes * size
        return (
            BlockCoefficients(
                intercept_s=0.0,
                per_block_s=block_bytes / bandwidth,
                measured=False,
                note=f"not measured (no host-device link on this device): analytic, block bytes / "
                f"{bandwidth / 1e9:g} GB/s",
            ),
            {},
        )

    swap, swap_report = swap_coefficients(block_size)
    report.update(swap_report)

    sweep: list[BlockSizePoint] = []
    slopes: dict[int, float] = {}
    sizes = sorted({m.point.block_size for m in measured if m.point.phase == "sweep_attn"})
    for size in sizes:
        rows = phase("sweep_attn", size)
        slopes[size] = fit_relative(
            np.array([[1.0, m.point.ctx_sum] for m in rows]), [m.time_s for m in rows], ("intercept", "slope")
        )["slope"]
    sweep_report: dict[str, Any] = {}
    for size in sizes:
        factor = slopes[size] / slopes[block_size] if slopes.get(block_size, 0.0) > 0 else 1.0
        size_copy, _ = _fit_phase(phase("sweep_copy", size), _block_features, ("intercept", "per_block"))
        size_swap, _ = swap_coefficients(size, "sweep_")
        sweep.append(
            BlockSizePoint(
                block_size=size,
                per_context_token_s=decode["per_context_token"] * factor,
                block_copy=BlockCoefficients(
                    intercept_s=size_copy["intercept"], per_block_s=size_copy["per_block"]
                ),
                block_swap=size_swap,
            )
        )
        sweep_report[str(size)] = {
            "attention_per_context_token_s": slopes[size],
            "factor_vs_main_block_size": factor,
            "copy_per_block_s": size_copy["per_block"],
        }
    report["block_size_sweep"] = {
        "method": "attention-only (gather + SDPA) slope over sum(context) per block size, as a factor on the "
        "decode per-context-token cost; copy (and swap) refitted per block size",
        "points": sweep_report,
    }
    coefficients = ProfileCoefficients(
        decode_per_layer=LayerDecodeCoefficients(
            intercept_s=decode["intercept"],
            per_seq_s=decode["per_seq"],
            per_context_token_s=decode["per_context_token"],
        ),
        decode_per_step=StepCoefficients(intercept_s=head["intercept"], per_seq_s=head["per_seq"]),
        prefill_per_layer=LayerPrefillCoefficients(
            intercept_s=prefill["intercept"],
            per_token_s=prefill["per_token"],
            per_attention_pair_s=prefill["per_attention_pair"],
        ),
        block_copy=BlockCoefficients(intercept_s=copy["intercept"], per_block_s=copy["per_block"]),
        block_swap=swap,
        block_size_sweep=[point for point in sweep if point.block_size != block_size],
    )
    return coefficients, report


def load_samples(path: str | Path) -> list[Measured]:
    """Read a samples CSV back into measured points (minimum over rounds of the round medians)."""
    medians: dict[Point, list[float]] = {}
    with Path(path).open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            phase = row["phase"]
            if row["contexts"]:
                contexts = tuple(int(value) for value in row["contexts"].split())
            elif phase in ("decode", "sweep_attn"):
                contexts = (int(row["ctx_max"]),) * int(row["batch"])
            else:
                contexts = ()
            point = Point(
                phase,
                int(row["block_size"]),
                contexts=contexts,
                num_tokens=int(row["num_tokens"]),
                start=int(row["start"]),
                num_blocks=int(row["num_blocks"]),
                holdout=bool(int(row["holdout"])),
            )
            medians.setdefault(point, []).append(float(row["median_s"]))
    return [
        Measured(point, min(values), (max(values) - min(values)) / min(values))
        for point, values in medians.items()
    ]


def refit(profile: CostProfile, csv_path: str | Path) -> tuple[ProfileCoefficients, dict[str, Any]]:
    """Fit a profile's coefficients again from its raw samples."""
    return fit_profile_coefficients(
        load_samples(csv_path),
        profile.model,
        profile.block_size,
        DTYPE_BYTES[profile.dtype],
        profile.coefficients.block_swap.measured,
    )


# --------------------------------------------------------------------------------------------------
# The whole run
# --------------------------------------------------------------------------------------------------


def kvsim_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("kvsim")
    except metadata.PackageNotFoundError:
        import tomllib

        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        try:
            return str(tomllib.loads(pyproject.read_text())["project"]["version"])
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "unknown"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _load() -> list[float] | None:
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except OSError:
        return None


def samples_csv_text(rows: list[dict[str, Any]]) -> str:
    handle = io.StringIO(newline="")
    writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    return handle.getvalue()


def write_samples_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text(samples_csv_text(rows), encoding="utf-8", newline="")


def is_samples_csv(path: Path) -> bool:
    """Whether ``path`` is a samples CSV kvsim wrote (it starts with this module's header)."""
    from sim.storage import starts_with

    return starts_with(path, ",".join(CSV_COLUMNS))


def is_profile_yaml(path: Path) -> bool:
    """Whether ``path`` is a cost profile kvsim wrote (its first key is ``kvsim_profile``)."""
    from sim.storage import starts_with

    return starts_with(path, "kvsim_profile:")


DTYPE_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2}


def run_calibration(
    model: Any,
    output: str | Path,
    *,
    device: str = "cpu",
    dtype: str | None = None,
    grid: str | Grid = "quick",
    block_size: int = 16,
    seed: int = 0,
    cuda_graphs: bool = False,
    progress: Callable[[str], None] | None = None,
    on_point: PointProgress | None = None,
) -> CostProfile:
    """Time ``model``'s layer on ``device``, fit, write ``output`` (YAML) and the CSV beside it (both
    appear together at the end, or not at all). ``progress`` gets a line at the start and after each
    round; ``on_point`` is called after every point.

    ``model`` is a ``sim.hardware.models.ModelSpec`` (or a :class:`ProfileModel`). Raises
    :class:`calibrate.CalibrationError` before any work when the grid would not fit in memory."""
    import torch

    from calibrate import kernels

    say = progress or (lambda message: None)
    spec = model if isinstance(model, ProfileModel) else ProfileModel.from_spec(model)
    if spec.attention != "mha":
        raise ValueError(
            f"{spec.name}: calibration builds MHA/GQA layers only (attention={spec.attention!r})"
        )
    if device == "cuda" and not torch.cuda.is_available():
        raise CalibrationError("--device cuda, but torch sees no CUDA device (use --device cpu)")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda, got {device!r}")
    if cuda_graphs and device != "cuda":
        raise ValueError("cuda_graphs needs device cuda")
    dtype = dtype or ("bfloat16" if device == "cuda" else "float32")
    torch_dtype = kernels.dtype_from_name(dtype)
    plan = grid if isinstance(grid, Grid) else make_grid(grid, device)
    torch_device = torch.device(device)
    previous_threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    csv_path = output.with_suffix(".csv")
    load_start = _load()
    started = time.perf_counter()
    swaps = device == "cuda"
    points = grid_points(plan, block_size, swaps)
    runtime = resident_bytes() if device == "cpu" else 0  # on CUDA the estimate is of device memory
    needed = estimate(points, spec, DTYPE_SIZES[dtype], runtime)
    free = available_bytes() if device == "cpu" else None
    if free is not None and needed.peak_bytes > free:
        torch.set_num_threads(previous_threads)
        raise CalibrationError(
            f"the {plan.name} grid for {spec.name} ({dtype}) needs {needed.describe()}, but only "
            f"{free / 2**30:.1f} GiB of memory is available: use a smaller grid (--grid smoke), a smaller "
            "model or --dtype bfloat16"
        )
    say(
        f"calibrating {spec.name} on {device} ({dtype}), grid {plan.name}: {len(points)} points x "
        f"{plan.rounds} rounds; memory {needed.describe()}"
    )
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    graph_misses = 0
    medians: dict[int, list[float]] = {index: [] for index in range(len(points))}
    allocator = "torch CUDA caching allocator" if device == "cuda" else "malloc"
    try:
        with torch.inference_mode(), heap_only_malloc() as heap_only:
            if device == "cpu" and heap_only:
                allocator = "glibc malloc, heap only (mmap off, no trim): no page faults per call"
            bench = Bench(spec, torch_device, torch_dtype, seed)
            for round_index in range(plan.rounds):
                for order, index in enumerate(rng.permutation(len(points))):
                    point = points[int(index)]
                    fn = bench.make(point)
                    median, iqr, count, replayed = measure(
                        fn, torch_device, plan, graph=cuda_graphs and point.phase in GRAPH_PHASES
                    )
                    del fn
                    release_free_heap()
                    graph_misses += cuda_graphs and point.phase in GRAPH_PHASES and not replayed
                    median = float(f"{median:.9g}")  # the CSV's precision, so that a refit reproduces
                    medians[int(index)].append(median)
                    rows.append(
                        {
                            "phase": point.phase,
                            "round": round_index,
                            "order": order,
                            "block_size": point.block_size,
                            "batch": point.batch,
                            "ctx_max": point.ctx_max,
                            "ctx_sum": point.ctx_sum,
                            "ctx_padded": point.ctx_padded,
                            "num_tokens": point.num_tokens,
                            "start": point.start,
                            "num_blocks": point.num_blocks,
                            "holdout": int(point.holdout),
                            "median_s": f"{median:.9g}",
                            "iqr_s": f"{iqr:.9g}",
                            "n_samples": count,
                            "contexts": " ".join(str(c) for c in point.contexts) if point.ragged else "",
                        }
                    )
                    if on_point is not None:
                        on_point(len(rows), plan.rounds * len(points), point, time.perf_counter() - started)
                say(
                    f"round {round_index + 1}/{plan.rounds}: {len(points)} points, {time.perf_counter() - started:.1f} s"
                )
            device_name = torch.cuda.get_device_name(torch_device) if device == "cuda" else cpu_name()
    finally:
        torch.set_num_threads(previous_threads)
    elapsed = time.perf_counter() - started
    measured = [
        Measured(point, min(values), (max(values) - min(values)) / min(values))
        for point, values in zip(points, medians.values(), strict=True)
    ]
    coefficients, report = fit_profile_coefficients(
        measured, spec, block_size, torch.tensor([], dtype=torch_dtype).element_size(), swaps
    )
    spreads = np.array([m.spread for m in measured])
    noisy = bool(plan.rounds > 1 and float(np.median(spreads)) > NOISY_SPREAD)
    report["timing"] = {
        "rounds": plan.rounds,
        "points": len(points),
        "samples": int(sum(int(row["n_samples"]) for row in rows)),
        "elapsed_s": round(elapsed, 2),
        "median_spread_across_rounds": float(np.median(spreads)),
        "p90_spread_across_rounds": float(np.percentile(spreads, 90)),
        "noisy": noisy,
        "allocator": allocator,
        "cuda_graphs": cuda_graphs,
        "graph_capture_failures": graph_misses,
        "load_average_start": load_start,
        "load_average_end": _load(),
    }
    notes = [
        "decode_per_layer and prefill_per_layer were timed on one real decoder layer of the model's shapes "
        "(random weights) and are multiplied by the layer count; decode_per_step is the final norm + LM head",
        "the decode context term was fitted on uniform batches; a vLLM-like kernel costs sum(context), "
        "this plain-torch gather costs batch * max(context) on ragged batches (see fit_quality.decode)",
    ]
    if not swaps:
        notes.append(
            "swap was not measured on this device; its coefficients are an analytic host-bandwidth estimate"
        )
    if cuda_graphs:
        notes.append(
            "decode, LM head and prefill points were timed as CUDA-graph replays (no per-kernel launch "
            f"cost, as vLLM's captured decode); {graph_misses} timed call(s) could not be captured and ran "
            "eagerly; block copies and swaps are eager"
        )
    else:
        notes.append(
            "timed eagerly (one kernel launch per operation): at small batches launch overhead dominates, "
            "which a serving engine that replays CUDA graphs does not pay"
        )
    if noisy:
        notes.append(f"noisy run: median spread across rounds above {NOISY_SPREAD:.0%}; consider rerunning")
    threads = 1 if device == "cpu" else previous_threads
    profile = CostProfile(
        measured=True,
        tensor_parallel_size=1,  # one GPU timed alone: its times are a TP-1 instance's
        label=f"measured: {device_name} ({device}, {dtype}{', CUDA graphs' if cuda_graphs else ''}), "
        f"torch {torch.__version__}, {spec.name}",
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        kvsim_version=kvsim_version(),
        device=ProfileDevice(
            kind=device,
            name=device_name,
            torch_version=str(torch.__version__),
            num_threads=threads,
            load_average=load_start,
        ),
        model=spec,
        dtype=dtype,
        block_size=block_size,
        timed_layers=1,
        coefficients=coefficients,
        fit_quality=report,
        grid={
            **plan.describe(),
            "block_size": block_size,
            "device": device,
            "seed": seed,
            "cuda_graphs": cuda_graphs,
        },
        samples_csv=csv_path.name,
        notes=notes,
    )
    write_files_atomically({csv_path: samples_csv_text(rows), output: profile.yaml_text()})
    say(f"wrote {output} and {csv_path} in {elapsed:.1f} s")
    return profile
