"""Build the cost model an experiment's ``cost_model:`` asks for: the analytic roofline, the derated
model with its serving terms, a measured profile, any of them with its GPU times scaled (an error
band's edge). (Apart from ``core.py``, which the models build on, so that the imports run one way.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sim.costs.core import (
    AnalyticCostModel,
    CostModel,
    CostModelConfig,
    CostModelError,
    ProfileCostModel,
    one_line_problems,
    resolve_profile_path,
)
from sim.costs.derated import DeratedCostModel
from sim.costs.scaled import ScaledCostModel
from sim.costs.serving import (
    NEUTRAL,
    CalibrationError,
    ServingCalibration,
    default_calibration,
    load_calibration,
)
from sim.hardware.gpus import GpuSpec
from sim.hardware.models import ModelSpec


def serving_calibration(name: str, base_dir: str | Path | None = None) -> ServingCalibration:
    """The calibration ``cost_model: {calibration: ...}`` names (see :class:`CostModelConfig`)."""
    if name == "default":
        return default_calibration()
    if name == "none":
        return NEUTRAL
    try:
        return load_calibration(resolve_profile_path(name, base_dir, "serving calibration"))
    except CalibrationError as error:
        raise CostModelError(str(error)) from None


def make_cost_model(
    config: CostModelConfig | str | dict[str, Any] | None,
    model: ModelSpec,
    gpu: GpuSpec,
    *,
    block_size: int,
    kv_cache_dtype: str = "auto",
    base_dir: str | Path | None = None,
    tensor_parallel_size: int = 1,
    data_parallel_size: int = 1,
    expert_parallel_size: int = 1,
) -> CostModel:
    """Build the cost model an experiment asked for (``None`` means the default, derated), for one
    instance of ``tensor_parallel_size`` GPUs; with ``expert_parallel_size`` > 1, for one rank of a
    data-parallel group of ``data_parallel_size`` whose routed experts are dealt over
    ``expert_parallel_size`` GPUs (the derated model only: :attr:`CostModel.expert_parallel`).

    ``kv_cache_dtype`` sizes the analytic model's K/V traffic. A profile's times are those of the dtype
    it was measured in (``profile.dtype``); they are not rescaled for another cache dtype."""
    if not isinstance(config, CostModelConfig):
        try:
            config = CostModelConfig.model_validate(config)
        except ValidationError as error:
            problems = one_line_problems(error, top_level="cost_model")
            raise CostModelError(f"invalid cost_model {config!r}: {problems}") from None
    if expert_parallel_size > 1 and config.kind != "derated":
        raise CostModelError(
            f"cost_model {config.kind}: expert parallelism (engine.enable_expert_parallel) is modelled by "
            "the derated cost model only (each rank's routed experts and the all-to-all between ranks); "
            "use cost_model: derated"
        )
    built = _unscaled_cost_model(
        config,
        model,
        gpu,
        block_size,
        kv_cache_dtype,
        base_dir,
        tensor_parallel_size,
        data_parallel_size,
        expert_parallel_size,
    )
    if config.time_scale == 1.0:
        return built
    return ScaledCostModel(built, config.time_scale)


def _unscaled_cost_model(
    config: CostModelConfig,
    model: ModelSpec,
    gpu: GpuSpec,
    block_size: int,
    kv_cache_dtype: str,
    base_dir: str | Path | None,
    tensor_parallel_size: int,
    data_parallel_size: int = 1,
    expert_parallel_size: int = 1,
) -> CostModel:
    bandwidth = None if config.host_bandwidth_gb_per_s is None else config.host_bandwidth_gb_per_s * 1e9
    if config.kind in ("derated", "analytic"):
        common: dict[str, Any] = {
            "kv_cache_dtype": kv_cache_dtype,
            "block_size": block_size,
            "host_bandwidth_bytes_per_s": bandwidth or gpu.host_link_bytes_per_s,
            "tensor_parallel_size": tensor_parallel_size,
        }
        if config.kind == "analytic":
            return AnalyticCostModel(model, gpu, **common)
        return DeratedCostModel(
            model,
            gpu,
            serving=serving_calibration(config.calibration, base_dir),
            data_parallel_size=data_parallel_size,
            expert_parallel_size=expert_parallel_size,
            **common,
        )
    assert config.profile is not None
    path = resolve_profile_path(config.profile, base_dir)
    return ProfileCostModel.from_yaml(
        path,
        model,
        config.rescale,
        block_size=block_size,
        host_bandwidth_bytes_per_s=bandwidth,
        tensor_parallel_size=tensor_parallel_size,
        tensor_parallel_rescale=config.tensor_parallel_rescale,
        gpu=gpu,
    )
