"""The compiled build: the engine's hot modules compiled with mypyc, kept out of the source tree.

``make native`` (``python -m sim.native.build``) compiles :data:`MODULES` into ``build/native/``
with a manifest of what it was built from. Importing ``sim``, ``policies``, ``token_content`` or
``workloads`` calls :func:`activate`, which puts a finder in front of the normal import system that
loads those modules from the build, but only when the build is *current*: built by this Python, and
from exactly the sources in the tree now (a hash of every ``.py`` file of :data:`PACKAGES`). A stale build is never used: an edited module must not be shadowed by an old
compiled copy of itself (which an in-place mypyc build would do, silently), and compiled modules
bake in the types of what they import. All or nothing: the modules call each other natively, so a
mix of compiled and edited source is not an option.

``KVSIM_NATIVE`` chooses: unset, the build is used when it is current (a stale one is reported
once and ignored); ``0``, never; ``1``, always (an error when there is no current build: CI and
benchmarks use it so that they measure what they say). ``KVSIM_NATIVE_BUILD`` names another folder
for the build. The results do not depend on it: the test suite runs in both modes, and
``summary.json``'s ``engine_build`` says which one ran.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import sysconfig
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

# The engine's hot path: what a wake-up runs (engine, decode clock, jumps, arrivals, policies, the
# recorder, the cost model and its per-iteration terms, the request and the length of its token
# content, and the trace reader and synthetic generator that stream requests into the run:
# interpreted, reading a 9,000-request trace took a fifth of its replay's instructions, and a plan's
# probes spent 5 % of their time drawing requests). Their classes become native classes; the rest
# stays Python.
MODULES = (
    "policies._free_space",
    "policies._host_tier",
    "policies._mamba_radix_tree",
    "policies._radix_tree",
    "policies._swa_radix_tree",
    "policies._two_pool_radix_tree",
    "policies.base",
    "policies.hybrid.block_pool",
    "policies.hybrid.block_tables",
    "policies.hybrid.chunked_local",
    "policies.hybrid.full",
    "policies.hybrid.group",
    "policies.hybrid.jenga_cache",
    "policies.hybrid.jenga_pages",
    "policies.hybrid.mamba",
    "policies.hybrid.marconi",
    "policies.hybrid.prefix_pool",
    "policies.hybrid.sglang_sliding_window",
    "policies.hybrid.sliding_window",
    "policies.contiguous",
    "policies.paged",
    "policies.prefix",
    "policies.radix",
    "sim.costs.derated",
    "sim.costs.terms",
    "sim.engine.admission",
    "sim.engine.arrivals",
    "sim.engine.batch",
    "sim.engine.beams",
    "sim.engine.chunk_reports",
    "sim.engine.completions",
    "sim.engine.core",
    "sim.engine.decoding",
    "sim.engine.event_skip",
    "sim.engine.growth",
    "sim.engine.handoff",
    "sim.engine.jumps",
    "sim.engine.landing",
    "sim.engine.ledger",
    "sim.engine.observe",
    "sim.engine.knobs",
    "sim.engine.schedulers.base",
    "sim.engine.schedulers.sglang",
    "sim.engine.schedulers.vllm",
    "sim.engine.shared_reads",
    "sim.engine.speculation",
    "sim.engine.unbacked",
    "sim.engine.wakeup",
    "sim.engine.windows",
    "sim.kv.coordinator",
    "sim.kv.interface",
    "sim.kv.multi_group",
    "sim.kv.single_group",
    "sim.kv.jenga",
    "sim.kv.jenga_prefix",
    "sim.kv.sglang_mamba_radix",
    "sim.kv.sglang_swa_radix",
    "sim.kv.sglang_tree",
    "sim.outputs.group_series",
    "sim.outputs.metrics",
    "token_content.segments",
    "workloads.arrivals",
    "workloads.content",
    "workloads.distributions",
    "workloads.request",
    "workloads.samples",
    "workloads.synthetic",
    "workloads.traces",
)
PACKAGES = (
    "sim",
    "policies",
    "token_content",
    "workloads",
)  # every source file of these goes into the build's hash
PROJECT_ROOT = Path(__file__).resolve().parents[2]
BUILD_DIR = PROJECT_ROOT / "build" / "native"
MANIFEST = "manifest.json"
ENV_VAR = "KVSIM_NATIVE"
DIR_ENV_VAR = "KVSIM_NATIVE_BUILD"  # another folder for the build (tests; several builds side by side)


class NativeBuildError(RuntimeError):
    """``KVSIM_NATIVE=1`` asked for the compiled build and there is no current one."""


class NativeBuildWarning(UserWarning):
    """A compiled build exists but is stale: it is ignored and the sources run."""


@dataclass(frozen=True)
class NativeBuild:
    """A build on disk, as its manifest describes it."""

    folder: Path
    python: str  # the extension suffix of the interpreter that built it (version and ABI)
    sources: str  # hash of the sources it was built from
    group: str  # mypyc's shared library, which every compiled module imports
    modules: tuple[str, ...]

    def file_of(self, module: str) -> Path:
        return self.folder.joinpath(*module.split(".")).with_suffix(_EXT_SUFFIX)


_EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
_active: NativeBuild | None = None
_checked = False


def sources_hash(root: Path = PROJECT_ROOT, packages: Sequence[str] = PACKAGES) -> str:
    """SHA-256 over the path and content of every ``.py`` file of ``packages``, in path order."""
    digest = hashlib.sha256()
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def build_folder() -> Path:
    """Where the build is: ``build/native`` of the project, or ``$KVSIM_NATIVE_BUILD``."""
    override = os.environ.get(DIR_ENV_VAR, "").strip()
    return Path(override) if override else BUILD_DIR


def read_build(folder: Path | None = None) -> NativeBuild | None:
    """The build in ``folder`` (default :func:`build_folder`), or None when there is none (or its
    manifest is unreadable)."""
    folder = build_folder() if folder is None else folder
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        return NativeBuild(
            folder=folder,
            python=manifest["python"],
            sources=manifest["sources"],
            group=manifest["group"],
            modules=tuple(manifest["modules"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def why_not_current(build: NativeBuild | None) -> str | None:
    """None when ``build`` can be used; else why not, in words."""
    if build is None:
        return f"no compiled build in {build_folder()} (make native)"
    if build.python != _EXT_SUFFIX:
        return f"the compiled build is for another Python ({build.python}, this one is {_EXT_SUFFIX})"
    if build.sources != sources_hash():
        return "the sources changed since the compiled build was made (make native rebuilds it)"
    missing = [module for module in (build.group, *build.modules) if not build.file_of(module).is_file()]
    if missing:
        return f"the compiled build lacks {', '.join(missing)}"
    return None


class _NativeFinder(importlib.abc.MetaPathFinder):
    """Finds the compiled modules (and their shared library) in the build folder."""

    def __init__(self, build: NativeBuild):
        self._files = {module: build.file_of(module) for module in (build.group, *build.modules)}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        file = self._files.get(fullname)
        if file is None:
            return None
        return importlib.util.spec_from_file_location(fullname, file)


def activate() -> None:
    """Load the compiled modules from a current build from now on, as ``KVSIM_NATIVE`` allows.
    Idempotent; must run before any of :data:`MODULES` is imported (``sim``, ``policies``,
    ``token_content`` and ``workloads`` call it first thing)."""
    global _active, _checked
    if _checked:
        return
    _checked = True
    choice = os.environ.get(ENV_VAR, "").strip()
    if choice == "0":
        return
    if choice not in ("", "1"):
        raise NativeBuildError(f"{ENV_VAR}={choice!r}: use 1 (compiled build), 0 (sources) or leave it unset")
    build = read_build()
    problem = why_not_current(build)
    if problem is not None:
        if choice == "1":
            raise NativeBuildError(f"{ENV_VAR}=1, but {problem}")
        if build is not None:  # no build at all is the normal case: say nothing
            warnings.warn(f"running the Python sources: {problem}", NativeBuildWarning, stacklevel=2)
        return
    assert build is not None
    already = [module for module in build.modules if module in sys.modules]
    if already:
        raise NativeBuildError(f"compiled modules imported before the build was activated: {already}")
    sys.meta_path.insert(0, _NativeFinder(build))
    _active = build


def engine_build() -> str:
    """Which code runs the engine in this process, for summaries and benchmarks: ``native`` once
    :func:`activate` took the compiled build (every compiled module then loads from it), else
    ``python``."""
    return "python" if _active is None else "native"


def build_status() -> str:
    """Whether the compiled build is in use in this process, and if not why, in words (``kvsim
    --version``)."""
    if _active is not None:
        return f"the compiled build in {_active.folder} is in use"
    if os.environ.get(ENV_VAR, "").strip() == "0":
        return f"the compiled build is not in use: {ENV_VAR}=0"
    return f"the compiled build is not in use: {why_not_current(read_build())}"
