"""Where results live on disk: safe output folders (this package) and, later, readers and writers."""

from sim.storage.folders import (
    MARKER,
    RUN_FOLDER_ENTRIES,
    OutputTargetError,
    check_output_file,
    check_output_target,
    config_hash,
    read_marker,
    staged_output_dir,
    starts_with,
    write_files_atomically,
)

__all__ = [
    "MARKER",
    "RUN_FOLDER_ENTRIES",
    "OutputTargetError",
    "check_output_file",
    "check_output_target",
    "config_hash",
    "read_marker",
    "staged_output_dir",
    "starts_with",
    "write_files_atomically",
]
