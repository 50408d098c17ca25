"""Results folders that kvsim may create, replace and clean up, and nothing else.

The rule: **kvsim never deletes what it did not write.** Every folder kvsim writes carries a marker file
(:data:`MARKER`, JSON with the folder's kind, the kvsim version and a hash of the config that made it).
A folder may be replaced only when it carries that marker (or is empty); anything else is refused before
any simulation runs. Paths that could only be a mistake (``/``, the home folder, the current folder or
one of its parents, the project's own root) are refused whatever they hold.

The marker also lists the files kvsim wrote; a folder in which someone has since put files of their own
(notes, a notebook's checkpoints) is refused too, naming them, since replacing it would delete them.

Writing is staged: a hidden sibling ``.NAME.partial-PID-XXXX`` is filled and renamed over the target at
the end, so a failed or interrupted run never leaves something that looks like a result. A run killed
outright (SIGKILL) leaves its staging folder behind; the next run of the same output removes the ones
whose process is gone, since their own staging marker says kvsim made them (and on which host: on a
shared file system a writer on another machine is left alone). The same holds for the retired copy of
a replaced folder, ``.NAME.replaced-PID-XXXX``, should a run be killed between two renames.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import hashlib
import json
import os
import secrets
import shutil
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MARKER = ".kvsim-results"
"""Marker of a finished kvsim folder."""

RUN_FOLDER_ENTRIES = ("config.yaml", "summary.csv", "capacity.txt", "figures")
"""What a run's results folder holds besides its marker and one folder per variant (``sim.results``)."""

STAGING_MARKER = ".kvsim-partial"
"""Marker of a staging folder: holds the pid of the process writing it."""


class OutputTargetError(ValueError):
    """An output path kvsim refuses to write to (raised before any work)."""


@functools.cache
def kvsim_version() -> str:
    # (cached: reading the installed metadata parses files, and a plan stamps hundreds of folders)
    from importlib import metadata

    try:
        return metadata.version("kvsim")
    except metadata.PackageNotFoundError:
        return "unknown"


def config_hash(config: Any) -> str:
    """A short, stable hash of a JSON-able config (sorted keys)."""
    text = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_marker(folder: str | Path) -> dict[str, Any] | None:
    """The marker of a kvsim folder, or None when ``folder`` has none (or an unreadable one)."""
    path = Path(folder) / MARKER
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _files_in(folder: Path) -> list[str]:
    """Every file under ``folder`` (relative, '/'-separated), the markers left out."""
    return sorted(
        path.relative_to(folder).as_posix()
        for path in folder.rglob("*")
        if not path.is_dir() and path.name not in (MARKER, STAGING_MARKER)
    )


def write_marker(folder: str | Path, kind: str, config_digest: str = "", *, list_files: bool = False) -> None:
    """Mark ``folder`` as kvsim's. ``list_files``: also list the files it holds now (a finished folder,
    written in one go); then files added to it later make it irreplaceable. A folder kvsim keeps adding
    to (a resumable sweep) is marked without a list."""
    marker: dict[str, Any] = {
        "kind": kind,
        "kvsim_version": kvsim_version(),
        "config_hash": config_digest,
        "written": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    if list_files:
        marker["files"] = _files_in(Path(folder))
    (Path(folder) / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


def _project_root() -> Path:
    return Path(__file__).resolve().parents[2]


def _forbidden_reason(target: Path) -> str | None:
    """Why ``target`` (absolute, resolved) can never be a results folder, or None."""
    if target == Path(target.anchor):
        return "it is the file-system root"
    if target == Path.home().resolve():
        return "it is your home folder"
    cwd = Path.cwd().resolve()
    if target == cwd or target in cwd.parents:
        return "it is the current folder or one of its parents"
    if target == _project_root():
        return "it is the kvsim project folder"
    return None


def check_output_target(out_dir: str | Path, kind: str) -> Path:
    """Refuse, before any work, an output folder kvsim may not replace; return it resolved.

    Accepted: a path that does not exist yet, an empty folder, or a folder carrying kvsim's marker of
    the same ``kind`` ("run", "validation", "sweep", "plan")."""
    given = Path(out_dir)
    if str(out_dir).strip() == "" or given.name in ("", ".", ".."):
        raise OutputTargetError(f"output folder {str(out_dir)!r}: give a folder name, not '.', '..' or ''")
    target = given.expanduser().resolve()
    reason = _forbidden_reason(target)
    if reason:
        raise OutputTargetError(f"output folder {str(out_dir)!r} ({target}): refused, {reason}")
    if target.exists() and not target.is_dir():
        raise OutputTargetError(f"output folder {str(out_dir)!r} exists and is not a folder")
    _check_can_create(target, out_dir)
    if target.is_dir() and any(target.iterdir()):
        marker = read_marker(target)
        if marker is None:
            raise OutputTargetError(
                f"output folder {str(out_dir)!r} exists and was not written by kvsim (no {MARKER} "
                "marker): kvsim never replaces files it did not write. Choose another folder with -o, "
                "or move that one away yourself."
            )
        if marker.get("kind") != kind:
            raise OutputTargetError(
                f"output folder {str(out_dir)!r} holds a kvsim {marker.get('kind')!r} result, not a "
                f"{kind!r} one: refusing to replace it; choose another folder with -o"
            )
        foreign = _foreign_files(target, marker)
        if foreign:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise OutputTargetError(
                f"output folder {str(out_dir)!r} is a kvsim result, but files were added to it since "
                f"({shown}): replacing it would delete them. Move them away, or choose another folder with -o."
            )
    return target


def _check_can_create(target: Path, out_dir: str | Path) -> None:
    """Refuse an output folder that cannot be made: a file where a parent folder would go, or a
    parent kvsim may not write in (the staging folder goes beside the output, so its parent counts
    even when the output folder exists)."""
    ancestor = target.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputTargetError(
            f"output folder {str(out_dir)!r}: {ancestor} is a file, so no folder can be made under it"
        )
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputTargetError(
            f"output folder {str(out_dir)!r}: no permission to create folders in {ancestor}; choose "
            "another folder with -o"
        )


def output_os_error(error: OSError, out_dir: str | Path) -> OutputTargetError:
    """An operating-system failure while writing results, as the one message every command prints
    (the checks above catch most of these before any work; a disk that fills up, or permissions that
    change during a run, land here)."""
    where = f" ({error.filename})" if error.filename else ""
    return OutputTargetError(
        f"output folder {str(out_dir)!r}: cannot write{where}: {error.strerror or error}"
    )


def _foreign_files(folder: Path, marker: dict[str, Any]) -> list[str]:
    """Files in a marked folder that its marker does not list (none when the marker predates lists)."""
    listed = marker.get("files")
    if not isinstance(listed, list):
        return []
    return sorted(set(_files_in(folder)) - set(listed))


def check_output_file(path: str | Path, is_ours: Callable[[Path], bool], what: str) -> Path:
    """Refuse, before any work, a file target kvsim may not replace: a folder, or an existing file that
    ``is_ours`` does not recognise as one kvsim wrote (``what`` names the kind, e.g. "kvsim profile")."""
    target = Path(path).expanduser()
    if target.is_dir():
        raise OutputTargetError(f"{path}: is a folder; give a file name")
    if target.exists() and not is_ours(target):
        raise OutputTargetError(
            f"{path}: exists and is not a {what}: kvsim never overwrites files it did not write. "
            "Choose another name, or move that file away yourself."
        )
    return target


def starts_with(path: Path, prefix: str) -> bool:
    """Whether a file's first bytes are ``prefix`` (how kvsim recognises the files it writes)."""
    try:
        with path.open("rb") as handle:
            return handle.read(len(prefix.encode())) == prefix.encode()
    except OSError:
        return False


def write_files_atomically(contents: dict[Path, str]) -> None:
    """Write several text files so that each appears complete or not at all: every one goes to a hidden
    temporary sibling first, and they are renamed into place only once all are written."""
    staged: list[tuple[Path, Path]] = []
    try:
        for path, text in contents.items():
            temporary = path.parent / f".{path.name}.partial-{os.getpid()}-{secrets.token_hex(3)}"
            temporary.write_text(text, encoding="utf-8")
            staged.append((temporary, path))
        for temporary, path in staged:
            os.replace(temporary, path)
    finally:
        for temporary, _ in staged:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _writer(folder: Path) -> tuple[int, str] | None:
    """``(pid, host)`` of the kvsim process that made a staging or retired folder, or None when the
    folder does not prove it is kvsim's (then it is never touched)."""
    staging = folder / STAGING_MARKER
    try:
        pid_text, *host = staging.read_text(encoding="utf-8").split()
        return int(pid_text), host[0] if host else socket.gethostname()
    except (OSError, ValueError, IndexError):
        pass
    # A retired folder is a finished result renamed aside, and a staging folder without its staging
    # marker one whose writer was killed between finishing it and renaming it into place: both hold
    # kvsim's marker, and their writer's pid is in their name.
    if read_marker(folder) is None:
        return None
    for infix in (".replaced-", ".partial-"):
        parts = folder.name.split(infix)
        if len(parts) == 2:
            try:
                return int(parts[1].split("-")[0]), socket.gethostname()
            except ValueError:
                return None
    return None


def stale_staging_folders(out_dir: Path) -> list[Path]:
    """Staging (and retired) folders of ``out_dir`` left by kvsim processes of this host that no
    longer run."""
    stale = []
    here = socket.gethostname()
    candidates = [
        *out_dir.parent.glob(f".{out_dir.name}.partial-*"),
        *out_dir.parent.glob(f".{out_dir.name}.replaced-*"),
    ]
    for folder in candidates:
        writer = _writer(folder)
        if writer is None:
            gone = _unfinished_staging(folder)
        else:
            gone = writer[1] == here and not _pid_alive(writer[0])
        if gone:
            stale.append(folder)
    return stale


def _unfinished_staging(folder: Path) -> bool:
    """A staging folder whose writer was killed between creating it and finishing its marker: empty,
    or holding only an empty marker, with a pid in its name that runs nowhere here. (It holds no
    data, so removing it can lose nothing.)"""
    try:
        pid = int(folder.name.split(".partial-")[1].split("-")[0])
        contents = list(folder.iterdir())
    except (IndexError, ValueError, OSError):
        return False
    only_an_empty_marker = [path.name for path in contents] == [STAGING_MARKER] and not (
        folder / STAGING_MARKER
    ).stat().st_size
    return (not contents or only_an_empty_marker) and not _pid_alive(pid)


def clean_stale_staging(out_dir: Path, log: Callable[[str], None] | None = None) -> int:
    """Remove ``out_dir``'s staging folders whose writer is gone (only ones carrying kvsim's staging
    marker); returns how many were removed."""
    removed = 0
    for folder in stale_staging_folders(out_dir):
        shutil.rmtree(folder, ignore_errors=True)
        removed += 1
    if removed and log:
        log(
            f"kvsim: removed {removed} unfinished output folder(s) of {out_dir.name} left by an interrupted run"
        )
    return removed


def _make_staging(out_dir: Path, trying: list[Path]) -> Path:
    """Create a staging folder beside ``out_dir``. ``trying`` holds the name being created *before* it
    is created, so that an interrupt at any moment (a signal handler runs between any two bytecodes)
    leaves the caller a name to clean up."""
    # os.mkdir honours the umask (tempfile.mkdtemp would make it 0700, unreadable to colleagues).
    for _ in range(100):
        staging = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}-{secrets.token_hex(3)}"
        trying[:] = [staging]
        try:
            staging.mkdir()
        except FileExistsError:
            trying.clear()
            continue
        (staging / STAGING_MARKER).write_text(f"{os.getpid()} {socket.gethostname()}\n", encoding="utf-8")
        return staging
    raise OutputTargetError(f"could not create a staging folder beside {out_dir}")


@contextmanager
def scratch_folder(beside: Path) -> Iterator[Path]:
    """A private working folder named and marked as a staging folder of ``beside``: removed when
    the block ends, however it ends; one left by a process killed meanwhile is removed by the next
    :func:`clean_stale_staging` of ``beside``."""
    trying: list[Path] = []
    try:
        yield _make_staging(beside, trying)
    finally:
        for folder in trying:
            shutil.rmtree(folder, ignore_errors=True)


def _replace(staging: Path, out_dir: Path, kind: str) -> None:
    """Rename ``staging`` over ``out_dir``; an existing ``out_dir`` is checked once more (it may have
    changed during the run) and removed only if it is kvsim's or empty."""
    if not out_dir.exists():
        staging.rename(out_dir)
        return
    check_output_target(out_dir, kind)
    retired = out_dir.parent / f".{out_dir.name}.replaced-{os.getpid()}-{secrets.token_hex(3)}"
    out_dir.rename(retired)
    try:
        staging.rename(out_dir)
    except BaseException:
        retired.rename(out_dir)  # interrupted or failed between the renames: the old results come back
        raise
    shutil.rmtree(retired, ignore_errors=True)


def _is_about(error: OSError, target: Path, staging: list[Path]) -> bool:
    """Whether an OS error names the output folder, its staging folder or a file in either (an
    OSError from elsewhere, e.g. a trace that cannot be read, keeps its own message)."""
    if not error.filename:
        return False
    named = Path(str(error.filename))
    return any(named == folder or folder in named.parents for folder in [target, *staging])


@contextmanager
def staged_output_dir(
    out_dir: str | Path,
    kind: str,
    config_digest: str = "",
    log: Callable[[str], None] | None = None,
    *,
    clean_stale: bool = True,
) -> Iterator[Path]:
    """A staging folder that replaces ``out_dir`` (with kvsim's marker) only when the block succeeds.

    Call :func:`check_output_target` before any expensive work; this checks again, cleans stale staging
    folders of the same output (unless the caller did already, ``clean_stale=False``: a plan's store
    cleans its points folder once, where a scan per point grows with the folder), and never removes
    anything but its own staging folder on failure."""
    target = check_output_target(out_dir, kind)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise output_os_error(error, out_dir) from None
    if clean_stale:
        clean_stale_staging(target, log)
    # Created inside ``try``: Ctrl-C or SIGTERM (raised as KeyboardInterrupt) may land between any two
    # bytecodes, also right after the folder exists, and the staging folder must not outlive the run.
    # (Signal masks would not do: a signal sent to the process may be taken by another thread.)
    trying: list[Path] = []
    committed = False
    try:
        staging = _make_staging(target, trying)
        yield staging
        # The result's marker is written while the staging marker still names this process, so a
        # kill at any moment leaves a folder that one of the two markers proves is kvsim's.
        write_marker(staging, kind, config_digest, list_files=True)
        (staging / STAGING_MARKER).unlink()
        _replace(staging, target, kind)
        committed = True
    except BaseException as error:
        if not committed:
            for folder in trying:
                with contextlib.suppress(OSError):
                    shutil.rmtree(folder)
        if isinstance(error, OSError) and _is_about(error, target, trying):
            raise output_os_error(error, out_dir) from None
        raise
