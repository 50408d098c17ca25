"""The compiled build (sim/native): used only when it matches the sources, never shadowing an edit,
never replacing a folder it did not write; and a run under it writes what the sources write."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from sim.native import (
    _EXT_SUFFIX,
    MANIFEST,
    MODULES,
    PACKAGES,
    PROJECT_ROOT,
    NativeBuild,
    read_build,
    sources_hash,
    why_not_current,
)
from sim.native.build import build

ROOT = Path(__file__).resolve().parents[1]


def fake_build(folder: Path, **changes: object) -> Path:
    """A build folder whose manifest matches the sources (unless ``changes`` say otherwise), with
    empty files where the extension modules go: enough for the checks, never loaded."""
    manifest = {
        "python": _EXT_SUFFIX,
        "sources": sources_hash(),
        "group": "abc__mypyc",
        "modules": list(MODULES),
    }
    manifest.update(changes)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST).write_text(json.dumps(manifest))
    build = read_build(folder)
    assert build is not None
    for module in (build.group, *build.modules):
        path = build.file_of(module)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    return folder


def python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_compiled_module_is_hashed_and_packaged():
    """A compiled module outside :data:`PACKAGES` would be used after its source changed; one outside
    pyproject's package list would be missing from an installed kvsim."""
    import tomllib
    from fnmatch import fnmatch

    packaged = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    for module in MODULES:
        package = module.split(".")[0]
        assert package in PACKAGES, module
        assert any(fnmatch(package, pattern) for pattern in packaged["include"]), module
        assert (ROOT / package / "__init__.py").is_file(), f"{package} activates the build before {module}"


def test_the_sources_hash_covers_every_file_path_and_content(tmp_path):
    for package in PACKAGES:
        (tmp_path / package / "sub").mkdir(parents=True)
        (tmp_path / package / "sub" / "a.py").write_text("x = 1\n")
    first = sources_hash(tmp_path)
    (tmp_path / "workloads" / "sub" / "a.py").write_text("x = 2\n")
    assert sources_hash(tmp_path) != first
    (tmp_path / "workloads" / "sub" / "a.py").write_text("x = 1\n")
    assert sources_hash(tmp_path) == first
    (tmp_path / "sim" / "sub" / "a.py").rename(tmp_path / "sim" / "sub" / "b.py")
    assert sources_hash(tmp_path) != first  # a renamed module is another build
    (tmp_path / "sim" / "sub" / "notes.txt").write_text("not source")
    assert sources_hash(tmp_path) == sources_hash(tmp_path)


def test_a_build_is_current_only_for_this_python_these_sources_and_every_file(tmp_path):
    assert why_not_current(None).startswith("no compiled build in ")
    current = read_build(fake_build(tmp_path / "ok"))
    assert why_not_current(current) is None
    other_python = read_build(fake_build(tmp_path / "py", python=".cpython-399-x.so"))
    assert "for another Python (.cpython-399-x.so" in why_not_current(other_python)
    stale = read_build(fake_build(tmp_path / "stale", sources="0" * 64))
    assert "the sources changed since the compiled build was made" in why_not_current(stale)
    incomplete = read_build(fake_build(tmp_path / "gone"))
    assert isinstance(incomplete, NativeBuild)
    incomplete.file_of("sim.engine.core").unlink()
    assert why_not_current(incomplete) == "the compiled build lacks sim.engine.core"
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / MANIFEST).write_text("{not json")
    assert read_build(tmp_path / "bad") is None


def test_a_stale_build_is_ignored_with_a_warning_and_refused_when_required(tmp_path):
    stale = fake_build(tmp_path / "stale", sources="0" * 64)
    probe = (
        "import sim.engine.core as m, sim.native as n; print(n.engine_build(), m.__file__.endswith('.py'))"
    )
    unset = python(probe, KVSIM_NATIVE="", KVSIM_NATIVE_BUILD=str(stale))
    assert unset.returncode == 0, unset.stderr
    assert unset.stdout.split() == ["python", "True"]
    assert "NativeBuildWarning: running the Python sources: the sources changed" in unset.stderr
    required = python(probe, KVSIM_NATIVE="1", KVSIM_NATIVE_BUILD=str(stale))
    assert required.returncode != 0
    assert (
        "NativeBuildError: KVSIM_NATIVE=1, but the sources changed since the compiled build"
        in required.stderr
    )
    missing = python(probe, KVSIM_NATIVE="1", KVSIM_NATIVE_BUILD=str(tmp_path / "none"))
    assert f"KVSIM_NATIVE=1, but no compiled build in {tmp_path / 'none'}" in missing.stderr
    off = python(probe, KVSIM_NATIVE="0", KVSIM_NATIVE_BUILD=str(stale))
    assert off.stdout.split() == ["python", "True"] and "Warning" not in off.stderr
    typo = python(probe, KVSIM_NATIVE="yes")
    assert "KVSIM_NATIVE='yes': use 1 (compiled build), 0 (sources) or leave it unset" in typo.stderr


def test_the_build_never_replaces_a_folder_it_did_not_write(tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("user data")
    with pytest.raises(SystemExit, match="is not a kvsim compiled build"):
        build(foreign)
    assert (foreign / "keep.txt").read_text() == "user data"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["mine"]  # no staging left behind


def _current_build() -> bool:
    return why_not_current(read_build()) is None


@pytest.mark.skipif(not _current_build(), reason="no current compiled build (make native)")
def test_compiled_and_python_runs_write_identical_outputs(tmp_path):
    """The same experiment (paged, prefix with sampling and beams, contiguous buddy) under each build,
    in fresh processes: every table equal bit for bit, the summaries equal but for wall time and the
    build's name."""
    config = tmp_path / "experiment.yaml"
    config.write_text(
        """
name: native-equivalence
seed: 7
model: Llama-2-7B
gpu: {base: A100-80GB, memory_gib: 16.3}
engine: {block_size: 16, max_num_seqs: 64, max_num_batched_tokens: 512, max_model_len: 2048}
workload:
  arrival: {kind: poisson, rate_per_s: 30}
  num_requests: 300
  prompt_len: {kind: lognormal, median: 600, sigma: 0.6, max: 1500}
  output_len: {kind: lognormal, median: 200, sigma: 0.7, max: 500}
  n: {kind: choice, values: [1, 2], weights: [8, 2]}
  beam_width: {kind: choice, values: [1, 2], weights: [9, 1]}
  shared_prefix: {num_prefixes: 4, prefix_len: 256}
variants:
  - {name: paged, policy: paged}
  - {name: prefix, policy: prefix}
  - {name: buddy, policy: contiguous, options: {reservation: max, placement: buddy}}
output: {figures: false}
"""
    )
    outputs = {}
    for mode in ("0", "1"):
        out = tmp_path / f"out-{mode}"
        done = subprocess.run(
            [sys.executable, "-m", "sim.cli", "run", str(config), "--output", str(out), "--quiet"],
            cwd=ROOT,
            env={**os.environ, "KVSIM_NATIVE": mode, "TQDM_DISABLE": "1"},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        outputs[mode] = out
    for variant in ("paged", "prefix", "buddy"):
        python_dir, native_dir = (
            next(outputs[mode].rglob(f"{variant}/summary.json")).parent for mode in "01"
        )
        summaries = [json.loads((folder / "summary.json").read_text()) for folder in (python_dir, native_dir)]
        assert [summary.pop("engine_build") for summary in summaries] == ["python", "native"]
        for summary in summaries:
            summary.pop("wall_s")
        assert summaries[0] == summaries[1], variant
        for table in ("requests.parquet", "timeseries.parquet"):
            pd.testing.assert_frame_equal(
                pd.read_parquet(python_dir / table), pd.read_parquet(native_dir / table), check_exact=True
            )
    assert PROJECT_ROOT == ROOT


def test_the_request_stream_stays_lazy(tmp_path):
    """A trace's requests are read as the engine pulls them, under either build (mypyc compiles a
    returned generator expression into a list: a compiled workload would read the whole trace up
    front, outside the engine's timed run and all in memory)."""
    from workloads import build_workload
    from workloads.config import parse_workload_config

    trace = tmp_path / "trace.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,10,2\n2023-11-16 18:15:50.0000000,20,3\nnot a time,1,1\n"
    )
    config = parse_workload_config({"source": {"kind": "azure", "path": str(trace)}})
    stream = build_workload(config, seed=0, base_dir=tmp_path).requests()
    first = next(stream)  # the bad third row has not been read yet: nothing raised
    assert first.prompt_len == 10


@pytest.mark.skipif(not _current_build(), reason="no current compiled build (make native)")
def test_random_experiments_agree_between_the_builds(tmp_path):
    """Twelve whole experiments drawn by the step-mode fuzzer (hybrid allocators, clusters, speculative
    decoding and the rest) under the sources and the compiled build: every summary value and every
    table's checksum the same bit for bit, in both step modes (``make fuzz-builds`` runs thousands)."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.fuzz_step_modes", "--builds", "--cases", "12", "--seed", "4"]
        + ["--out", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "KVSIM_NATIVE": "0", "TQDM_DISABLE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    counts = json.loads(done.stdout.splitlines()[-1].split(" in ")[0].replace("'", '"'))
    assert counts["differs"] == counts["crashed"] == 0 and counts["same"] >= 8, counts
