"""Interfaces are promises: every experiment, plan, sweep and replay file kvsim has shipped still
loads (tests/compat/, gathered from the git history by tools/compat_corpus.py): ``kvsim check``
passes each, and a few run end to end."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sim.cli import main

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "compat"
ENTRIES = json.loads((CORPUS / "manifest.json").read_text())

NOT_REDISTRIBUTED = {
    "reference_runs/blis-h100-vllm-0.15/": "BLIS's measured runs are not redistributed "
    "(reference_runs/blis-h100-vllm-0.15/README.md says where to fetch them)",
}
"""Data folders a corpus file may name that a checkout need not hold: its file is skipped without them."""


def missing_data(path: Path) -> str | None:
    """Why ``path`` cannot be checked here (it names data that is not redistributed and absent), or None."""
    text = path.read_text()
    for folder, why in NOT_REDISTRIBUTED.items():
        if folder in text and not any((ROOT / folder).glob("*.csv")):
            return why
    return None


def test_the_manifest_lists_every_corpus_file():
    assert sorted(entry["file"] for entry in ENTRIES) == sorted(path.name for path in CORPUS.glob("*.yaml"))
    assert {entry["kind"] for entry in ENTRIES} == {"experiment", "plan", "sweep", "replay"}


@pytest.mark.parametrize("entry", ENTRIES, ids=[entry["file"] for entry in ENTRIES])
def test_every_shipped_file_still_loads(entry, capsys):
    path = CORPUS / entry["file"]
    why = missing_data(path)
    if why:
        pytest.skip(why)
    code = main(["check", str(path)])
    out, err = capsys.readouterr()
    assert (code, err) == (0, ""), err
    assert out == f"ok: {path} ({entry['kind']})\n"  # the kind told by the keys is the one shipped


def run_end_to_end(command: str, name: str, tmp_path: Path, capsys, *extra: str) -> str:
    """``kvsim COMMAND`` on a corpus file into a fresh folder; what it printed."""
    code = main([command, str(CORPUS / name), "-o", str(tmp_path / "out"), *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_the_first_quickstart_runs(tmp_path, capsys):
    # The oldest shipped experiment, shortened: it loads and its three allocators run.
    stdout = run_end_to_end(
        "run", "quickstart@159b4f1.yaml", tmp_path, capsys, "--set", "workload.num_requests=60", "-q"
    )
    assert "kvsim run quickstart:" in stdout
    assert (tmp_path / "out" / "summary.csv").is_file()


def test_the_first_sweep_runs_on_the_quickstart_of_its_time(tmp_path, capsys):
    stdout = run_end_to_end(
        "sweep",
        "sweep.block-size-rate@0cb14dd.yaml",
        tmp_path,
        capsys,
        "--set",
        "workload.num_requests=30",
        "-j",
        "1",
        "-q",
    )
    assert "4 points: 4 simulated" in stdout


def test_the_first_shipped_replay_runs(tmp_path, capsys):
    # 300 measured requests on an RTX 4090 (LLMServingSim's run, shipped): the smallest replay.
    stdout = run_end_to_end("replay-run", "replays.rtx4090-llama-3.1-8b@b135464.yaml", tmp_path, capsys)
    assert "kvsim replay-run rtx4090-llama-3.1-8b: 300 requests" in stdout


def test_the_corpus_is_what_the_history_gives():
    """tests/compat/ is what tools/compat_corpus.py makes of the git history (skipped outside a
    full clone: a shallow or exported copy has not the history)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    shallow = subprocess.run(
        ["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True
    )
    if shallow.returncode != 0 or shallow.stdout.strip() != "false":
        pytest.skip("a shallow clone holds only part of the history")
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import compat_corpus
    finally:
        sys.path.remove(str(ROOT / "tools"))
    assert compat_corpus.differences(compat_corpus.generate()) == []
