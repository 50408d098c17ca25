"""Workloads: streams of requests (synthetic or replayed from traces) that know nothing of memory.

The engine needs only :func:`build_workload`, :class:`Workload` and :class:`Request`; the ``workload:``
section of an experiment config is a :data:`WorkloadConfig`.
"""

import sim  # noqa: F401, I001  (first: it activates the compiled build of the request type, if any)
from workloads.base import TraceError, TraceWarning, Workload, WorkloadError
from workloads.config import (
    AnyWorkloadConfig,
    SyntheticWorkloadConfig,
    TraceWorkloadConfig,
    WorkloadConfig,
    parse_workload_config,
)
from workloads.factory import build_workload
from workloads.request import Request

__all__ = [
    "AnyWorkloadConfig",
    "Request",
    "SyntheticWorkloadConfig",
    "TraceError",
    "TraceWarning",
    "TraceWorkloadConfig",
    "Workload",
    "WorkloadConfig",
    "WorkloadError",
    "build_workload",
    "parse_workload_config",
]
