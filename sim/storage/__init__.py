"""Where results live on disk: safe output folders (this package) and, later, readers and writers."""

from sim.storage.folders import (
    MARKER,
    OutputTargetError,
    check_output_target,
    config_hash,
    read_marker,
    staged_output_dir,
)

__all__ = [
    "MARKER",
    "OutputTargetError",
    "check_output_target",
    "config_hash",
    "read_marker",
    "staged_output_dir",
]
