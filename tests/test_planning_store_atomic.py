"""The planning store's atomic writes (sim/planning/sweeps/store.py): a replaced folder or file appears whole
or not at all, an interrupted replacement puts the old one back, and no path kvsim did not create in
that call is ever removed, even one named like kvsim's own staging."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sim.planning.sweeps.store import replace_dir_atomic, write_atomic


def listing(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def fill_with(text: str):
    def fill(folder: Path) -> None:
        (folder / "a.png").write_text(text)

    return fill


def test_a_folder_is_replaced_whole_and_nothing_is_left_beside_it(tmp_path):
    figures = tmp_path / "figures"
    replace_dir_atomic(figures, fill_with("first"))
    replace_dir_atomic(figures, fill_with("second"))
    assert listing(tmp_path) == {"figures/a.png": "second"}
    assert [p.name for p in tmp_path.iterdir()] == ["figures"]


def test_a_failing_fill_keeps_the_old_folder(tmp_path):
    figures = tmp_path / "figures"
    replace_dir_atomic(figures, fill_with("old"))

    def broken(folder: Path) -> None:
        (folder / "half.png").write_text("half")
        raise RuntimeError("plotting failed")

    with pytest.raises(RuntimeError, match="plotting failed"):
        replace_dir_atomic(figures, broken)
    assert listing(tmp_path) == {"figures/a.png": "old"}
    assert [p.name for p in tmp_path.iterdir()] == ["figures"]


def test_stopped_between_the_two_renames_the_old_folder_comes_back(tmp_path, monkeypatch):
    figures = tmp_path / "figures"
    replace_dir_atomic(figures, fill_with("old"))
    real_rename = Path.rename
    calls = []

    def rename(self, target):
        calls.append(self.name)
        if len(calls) == 2:  # the new folder moving into place: a Ctrl-C lands here
            raise KeyboardInterrupt
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        replace_dir_atomic(figures, fill_with("new"))
    monkeypatch.undo()
    assert calls[0] == "figures" and ".partial-" in calls[1]
    assert listing(tmp_path) == {"figures/a.png": "old"}
    assert [p.name for p in tmp_path.iterdir()] == ["figures"]


def test_paths_named_like_kvsim_staging_are_never_touched(tmp_path):
    """Before, the staging names were ``.NAME.partial-PID``: a folder or file at that name (a user's,
    or another writer's) was removed. Now every sibling is this call's own fresh name."""
    pid = os.getpid()
    foreign_folder = tmp_path / f".figures.partial-{pid}"
    foreign_folder.mkdir()
    (foreign_folder / "keep.txt").write_text("user")
    foreign_file = tmp_path / f".report.md.partial-{pid}"
    foreign_file.write_text("user")
    replace_dir_atomic(tmp_path / "figures", fill_with("x"))
    write_atomic(tmp_path / "report.md", lambda path: path.write_text("report"))
    with pytest.raises(RuntimeError):
        write_atomic(tmp_path / "report.md", lambda path: (_ for _ in ()).throw(RuntimeError("no")))
    assert listing(tmp_path) == {
        f".figures.partial-{pid}/keep.txt": "user",
        f".report.md.partial-{pid}": "user",
        "figures/a.png": "x",
        "report.md": "report",
    }
