"""What counts as bad input for every command: one message, exit code 2 (``sim.cli.main``)."""

from __future__ import annotations


def input_errors() -> tuple[type[Exception], ...]:
    """The errors that mean bad input (a config, a file, an output folder), which every command
    reports in one message with exit code 2 (imported when needed: building the CLI imports none)."""
    from policies.base import PolicyError
    from sim.config import ConfigError
    from sim.costs.core import CostModelError
    from sim.storage import OutputTargetError
    from workloads.base import WorkloadError

    return (ConfigError, WorkloadError, PolicyError, CostModelError, FileNotFoundError, OutputTargetError)
