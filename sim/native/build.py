"""``python -m sim.native.build``: compile :data:`sim.native.MODULES` with mypyc into ``build/native/``.

The build is made in a staging folder next to the target and moved into place only when complete,
with a manifest naming the Python and the hash of the sources it was built from. A previous build is
replaced only when it is one (it has a manifest): kvsim never removes a folder it did not write.
Needs the ``dev`` extra (mypy, which ships mypyc, and setuptools, which builds its extensions) and a C
compiler. About a minute on two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sim.native import (
    _EXT_SUFFIX,
    MANIFEST,
    MODULES,
    PROJECT_ROOT,
    build_folder,
    read_build,
    sources_hash,
    why_not_current,
)


def module_path(module: str) -> str:
    return "/".join(module.split(".")) + ".py"


@contextmanager
def _working_directory(folder: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def compile_into(staging: Path, jobs: int) -> str:
    """Compile every module into ``staging`` (extension files laid out by module path); returns the
    name of mypyc's shared library module."""
    from mypyc.build import mypycify
    from setuptools import setup

    c_folder = staging / "c"
    # mypyc names modules by their paths relative to the working directory: the project root.
    with _working_directory(PROJECT_ROOT):
        extensions = mypycify(
            [module_path(module) for module in MODULES], opt_level="3", target_dir=str(c_folder)
        )
        setup(
            name="kvsim-native",
            ext_modules=extensions,
            script_args=[
                "--quiet",
                "build_ext",
                "--build-lib",
                str(staging / "lib"),
                "--build-temp",
                str(staging / "temp"),
                "--parallel",
                str(jobs),
            ],
        )
    groups = [path.name[: -len(_EXT_SUFFIX)] for path in (staging / "lib").glob(f"*__mypyc{_EXT_SUFFIX}")]
    if len(groups) != 1:
        raise RuntimeError(f"expected one mypyc shared library in {staging / 'lib'}, found {groups}")
    return groups[0]


def build(target: Path | None = None, jobs: int = 2) -> Path:
    """Build into ``target`` (default :func:`sim.native.build_folder`), replacing an earlier build
    there; returns ``target``."""
    target = build_folder() if target is None else target
    if target.exists() and read_build(target) is None:
        raise SystemExit(
            f"{target} exists and is not a kvsim compiled build (no {MANIFEST}): not touching it"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    sources = sources_hash()
    staging = Path(tempfile.mkdtemp(prefix=".native-staging-", dir=target.parent))
    try:
        group = compile_into(staging, jobs)
        if sources_hash() != sources:
            raise SystemExit("the sources changed while compiling: run it again")
        manifest = {"python": _EXT_SUFFIX, "sources": sources, "group": group, "modules": list(MODULES)}
        (staging / "lib" / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        retired = None
        if target.exists():
            retired = Path(tempfile.mkdtemp(prefix=".native-retired-", dir=target.parent))
            target.rename(retired / "build")
        (staging / "lib").rename(target)
        if retired is not None:
            shutil.rmtree(retired)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.native.build", description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="C compilations in parallel (default 2)")
    parser.add_argument("--force", action="store_true", help="rebuild even when the build is current")
    args = parser.parse_args(argv)
    if not args.force and why_not_current(read_build()) is None:
        print(f"the compiled build in {build_folder()} is current (--force rebuilds it)", file=sys.stderr)
        return 0
    started = time.perf_counter()
    target = build(jobs=args.jobs)
    print(
        f"compiled {len(MODULES)} modules into {target} in {time.perf_counter() - started:.0f} s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
