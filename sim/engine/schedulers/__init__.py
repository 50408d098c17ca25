"""The servers' schedulers, by the name ``engine.scheduler`` gives (see :mod:`.base`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.engine.schedulers.base import Scheduler
from sim.engine.schedulers.sglang import SGLangScheduler
from sim.engine.schedulers.vllm import VLLMScheduler

if TYPE_CHECKING:
    from sim.engine.knobs import EngineKnobs

SCHEDULERS: dict[str, type[Scheduler]] = {"vllm": VLLMScheduler, "sglang": SGLangScheduler}
"""``engine.scheduler`` name -> its class (constructed from the engine's knobs)."""


def make_scheduler(knobs: EngineKnobs) -> Scheduler:
    try:
        scheduler = SCHEDULERS[knobs.scheduler]
    except KeyError:
        raise ValueError(f"unknown scheduler {knobs.scheduler!r}; known: {', '.join(SCHEDULERS)}") from None
    return scheduler(knobs)
