"""kvsim never deletes what it did not write: output targets, markers, staging, interruption."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sim.storage import MARKER, OutputTargetError, check_output_target, read_marker, staged_output_dir
from sim.storage.folders import STAGING_MARKER, clean_stale_staging, write_marker

REPO_ROOT = Path(__file__).resolve().parents[1]


def _user_folder(path: Path) -> Path:
    (path / "sub").mkdir(parents=True)
    (path / "thesis.tex").write_text("my thesis")
    (path / "sub" / "data.csv").write_text("a,b\n1,2\n")
    return path


def _snapshot(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): p.read_text() for p in sorted(path.rglob("*")) if p.is_file()}


def test_a_users_folder_is_refused_and_left_intact(tmp_path):
    folder = _user_folder(tmp_path / "mine")
    before = _snapshot(folder)
    with pytest.raises(OutputTargetError, match="not written by kvsim"):
        check_output_target(folder, "run")
    with pytest.raises(OutputTargetError), staged_output_dir(folder, "run") as staging:
        (staging / "x").write_text("never")
    assert _snapshot(folder) == before
    assert [p.name for p in tmp_path.iterdir()] == ["mine"]  # no staging folder left either


@pytest.mark.parametrize("name", [".", "..", ""])
def test_dot_paths_are_refused(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputTargetError):
        check_output_target(name, "run")


def test_current_folder_parents_home_root_and_project_are_refused(tmp_path, monkeypatch):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    for target, why in [
        (work, "current folder"),
        (tmp_path / "a", "current folder or one of its parents"),
        (Path("results") / "..", "not '.', '..'"),
        (Path("results/../.."), "not '.', '..'"),
        (Path("/"), "folder name|root"),
        (tmp_path / "a" / "b" / "c" / "..", "not '.', '..'"),
        (Path.home(), "home"),
        (REPO_ROOT, "project"),
    ]:
        with pytest.raises(OutputTargetError, match=why):
            check_output_target(target, "run")


def test_an_existing_file_is_refused(tmp_path):
    target = tmp_path / "out"
    target.write_text("not a folder")
    with pytest.raises(OutputTargetError, match="not a folder"):
        check_output_target(target, "run")
    assert target.read_text() == "not a folder"


def test_a_marked_folder_is_replaced_and_marked_again(tmp_path):
    target = tmp_path / "out"
    with staged_output_dir(target, "run", "hash-1") as staging:
        (staging / "old.txt").write_text("first run")
    assert read_marker(target)["config_hash"] == "hash-1"
    with staged_output_dir(target, "run", "hash-2") as staging:
        (staging / "new.txt").write_text("second run")
    assert sorted(p.name for p in target.iterdir()) == [MARKER, "new.txt"]
    marker = read_marker(target)
    assert marker["kind"] == "run" and marker["config_hash"] == "hash-2"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_folder_of_another_kind_is_refused(tmp_path):
    target = tmp_path / "out"
    with staged_output_dir(target, "validation"):
        pass
    with pytest.raises(OutputTargetError, match="'validation' result"):
        check_output_target(target, "run")


def test_an_empty_folder_is_accepted(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    with staged_output_dir(target, "run") as staging:
        (staging / "f").write_text("x")
    assert (target / "f").read_text() == "x"


def test_a_failure_removes_only_the_staging_folder(tmp_path):
    target = tmp_path / "out"
    with staged_output_dir(target, "run") as staging:
        (staging / "keep.txt").write_text("result 1")
    with pytest.raises(RuntimeError), staged_output_dir(target, "run") as staging:
        (staging / "half.txt").write_text("half-written")
        raise RuntimeError("simulation failed")
    assert sorted(p.name for p in target.iterdir()) == [MARKER, "keep.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_folders_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        with staged_output_dir(tmp_path / "out", "run") as staging:
            (staging / "f").write_text("x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o755


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_stale_staging_of_a_killed_run_is_cleaned_and_foreign_ones_kept(tmp_path):
    target = tmp_path / "out"
    stale = tmp_path / ".out.partial-1-abc"
    stale.mkdir()
    (stale / STAGING_MARKER).write_text(f"{_dead_pid()}\n")
    (stale / "timeseries.parquet").write_text("half")
    alive = tmp_path / ".out.partial-2-def"
    alive.mkdir()
    (alive / STAGING_MARKER).write_text(f"{os.getpid()}\n")
    foreign = tmp_path / ".out.partial-users-own"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    messages: list[str] = []
    assert clean_stale_staging(target, messages.append) == 1
    assert not stale.exists() and alive.exists() and (foreign / "notes.txt").read_text() == "mine"
    assert "removed 1 unfinished output folder" in messages[0]


def test_staging_killed_before_its_marker_was_written_is_cleaned_only_when_it_holds_nothing(tmp_path):
    """A writer killed between creating its staging folder and finishing the marker leaves it empty,
    or with an empty marker: nothing to lose, so it goes (a dead pid in its name). With anything else
    inside, or a live pid, it stays."""
    target = tmp_path / "out"
    dead = _dead_pid()
    empty = tmp_path / f".out.partial-{dead}-aaa"
    empty.mkdir()
    blank_marker = tmp_path / f".out.partial-{dead}-bbb"
    blank_marker.mkdir()
    (blank_marker / STAGING_MARKER).write_text("")
    with_data = tmp_path / f".out.partial-{dead}-ccc"
    with_data.mkdir()
    (with_data / "notes.txt").write_text("mine")
    running = tmp_path / f".out.partial-{os.getpid()}-ddd"
    running.mkdir()
    assert clean_stale_staging(target) == 2
    assert not empty.exists() and not blank_marker.exists()
    assert (with_data / "notes.txt").read_text() == "mine" and running.exists()


def test_a_result_with_files_added_since_is_refused_naming_them(tmp_path):
    target = tmp_path / "out"
    with staged_output_dir(target, "run") as staging:
        (staging / "sub").mkdir()
        (staging / "sub" / "summary.json").write_text("{}")
    assert read_marker(target)["files"] == ["sub/summary.json"]
    (target / "notes.md").write_text("my notes")
    with pytest.raises(OutputTargetError, match=r"files were added to it since \(notes\.md\)"):
        check_output_target(target, "run")
    assert (target / "notes.md").read_text() == "my notes"


def test_staging_of_another_host_and_a_killed_replacement(tmp_path):
    target = tmp_path / "out"
    elsewhere = tmp_path / ".out.partial-1-abc"
    elsewhere.mkdir()
    # A dead pid, but on another machine sharing the file system: that writer may well be running.
    (elsewhere / STAGING_MARKER).write_text(f"{_dead_pid()} some-other-host\n")
    retired = tmp_path / f".out.replaced-{_dead_pid()}-def"  # killed between its two renames
    retired.mkdir()
    (retired / MARKER).write_text('{"kind": "run"}')
    unmarked = tmp_path / f".out.replaced-{_dead_pid()}-123"
    unmarked.mkdir()
    assert clean_stale_staging(target) == 1
    assert elsewhere.exists() and not retired.exists() and unmarked.exists()


def test_staging_killed_between_its_marker_and_its_rename(tmp_path):
    """A writer killed after it finished a staging folder (kvsim's marker written, the staging marker
    removed) but before renaming it into place: the pid in its name says whether it still runs."""
    target = tmp_path / "out"
    finished = tmp_path / f".out.partial-{_dead_pid()}-eee"
    finished.mkdir()
    (finished / "summary.json").write_text("{}")
    write_marker(finished, "run", list_files=True)
    assert read_marker(finished)["files"] == ["summary.json"]
    running = tmp_path / f".out.partial-{os.getpid()}-fff"
    running.mkdir()
    write_marker(running, "run", list_files=True)
    unproven = tmp_path / f".out.partial-{_dead_pid()}-ggg"  # its marker unreadable: not provably kvsim's
    unproven.mkdir()
    (unproven / "summary.json").write_text("{}")
    (unproven / MARKER).write_text('{"kind": "ru')
    assert clean_stale_staging(target) == 1
    assert not finished.exists() and running.exists() and unproven.exists()


def test_a_finished_staging_folder_lists_its_files_without_the_staging_marker(tmp_path):
    with staged_output_dir(tmp_path / "out", "run") as staging:
        (staging / "summary.json").write_text("{}")
        assert (staging / STAGING_MARKER).exists()
    assert read_marker(tmp_path / "out")["files"] == ["summary.json"]
    assert not (tmp_path / "out" / STAGING_MARKER).exists()


def _run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sim.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "TQDM_DISABLE": "1", "MPLBACKEND": "Agg", "PYTHONPATH": str(REPO_ROOT)},
    )


def test_cli_refuses_a_users_folder_before_running(tmp_path):
    folder = _user_folder(tmp_path / "mine")
    before = _snapshot(folder)
    config = REPO_ROOT / "configs" / "quickstart.yaml"
    result = _run_cli("run", str(config), "-o", str(folder), cwd=tmp_path)
    assert result.returncode == 2
    assert "not written by kvsim" in result.stderr and "Traceback" not in result.stderr
    assert "kvsim run" not in result.stdout  # refused before the simulation, not after it
    assert _snapshot(folder) == before
    assert [p.name for p in tmp_path.iterdir()] == ["mine"]


@pytest.mark.slow
def test_sigterm_removes_the_staging_folder_and_prints_one_line(tmp_path):
    config = REPO_ROOT / "configs" / "quickstart.yaml"
    process = subprocess.Popen(
        [sys.executable, "-m", "sim.cli", "run", str(config), "-o", str(tmp_path / "out")],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TQDM_DISABLE": "1", "MPLBACKEND": "Agg", "PYTHONPATH": str(REPO_ROOT)},
    )
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".out.partial-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(tmp_path.glob(".out.partial-*")), "the run never started writing"
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130
    assert "Traceback" not in stderr and "interrupted" in stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not hasattr(signal, "SIGTERM"), reason="POSIX signals")
@pytest.mark.parametrize("moment", ["staging made", "while renaming"])
def test_an_interrupt_at_the_edges_of_staging_leaves_nothing_half_done(tmp_path, monkeypatch, moment):
    """Ctrl-C or SIGTERM arriving just after the staging folder exists (before the block runs) must not leave
    it behind; one arriving during the final renames is delivered after them, so the target is
    whole. The signal is sent to this process at exactly that moment."""
    import sim.storage.folders as folders

    target = tmp_path / "out"
    hook = "_make_staging" if moment == "staging made" else "_replace"
    original = getattr(folders, hook)

    def interrupted(*args):
        result = original(*args)
        os.kill(os.getpid(), signal.SIGTERM)
        return result

    def as_the_cli_does(signum, frame):
        raise KeyboardInterrupt

    monkeypatch.setattr(folders, hook, interrupted)
    previous = signal.signal(signal.SIGTERM, as_the_cli_does)  # test workers may ignore SIGINT
    # Another thread, as a real run may have: the kernel may hand it the signal, and the handler then
    # runs in the main thread at its next bytecode, wherever that is.
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    ran = []
    try:
        with pytest.raises(KeyboardInterrupt), staged_output_dir(target, "run") as staging:
            (staging / "summary.csv").write_text("x\n")
            ran.append(True)
    finally:
        signal.signal(signal.SIGTERM, previous)
        stop.set()
        other.join()
    if moment == "staging made":
        assert ran == [] and list(tmp_path.iterdir()) == []
    else:
        assert ran == [True] and [p.name for p in tmp_path.iterdir()] == ["out"]
        assert (target / "summary.csv").read_text() == "x\n" and read_marker(target) is not None


def test_an_interrupt_between_the_two_renames_puts_the_old_results_back(tmp_path, monkeypatch):
    """Replacing a results folder renames the old one aside, then the new one in: stopped between the
    two, the old folder comes back under its name and nothing else is left."""
    target = tmp_path / "out"
    with staged_output_dir(target, "run") as staging:
        (staging / "summary.csv").write_text("old\n")
    real_rename = Path.rename

    def stopped_at_the_second(self, destination):
        if ".partial-" in self.name:
            raise KeyboardInterrupt
        return real_rename(self, destination)

    monkeypatch.setattr(Path, "rename", stopped_at_the_second)
    with pytest.raises(KeyboardInterrupt), staged_output_dir(target, "run") as staging:
        (staging / "summary.csv").write_text("new\n")
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert (target / "summary.csv").read_text() == "old\n" and read_marker(target) is not None


# ------------------------------------------------------------------------------------------------
# Folders that cannot be made: one message from one place, exit 2, for every command
# ------------------------------------------------------------------------------------------------


def test_an_output_under_a_file_is_refused_naming_the_file(tmp_path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    with pytest.raises(OutputTargetError, match=f"{a_file} is a file, so no folder can be made under it"):
        check_output_target(a_file / "sub" / "deeper", "run")
    assert a_file.read_text() == "mine"


def test_an_output_in_a_folder_without_write_permission_is_refused(tmp_path, monkeypatch):
    # (the tests may run as root, whom chmod does not stop: os.access is what kvsim asks)
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != locked and real_access(path, mode))
    with pytest.raises(OutputTargetError, match=f"no permission to create folders in {locked}"):
        check_output_target(locked / "out", "run")
    # an existing result inside it cannot be replaced either: its staging folder goes beside it
    (locked / "old").mkdir()
    write_marker(locked / "old", "run")
    with pytest.raises(OutputTargetError, match="no permission"):
        check_output_target(locked / "old", "run")


def test_a_write_failure_during_the_run_becomes_the_output_message(tmp_path):
    out = tmp_path / "out"
    with (
        pytest.raises(
            OutputTargetError, match=r"output folder '.*out': cannot write \(.*summary.csv\): No space"
        ),
        staged_output_dir(out, "run") as staging,
    ):
        raise OSError(28, "No space left on device", str(staging / "summary.csv"))
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_an_os_error_about_another_file_keeps_its_own_message(tmp_path):
    with pytest.raises(FileNotFoundError, match="trace.csv"), staged_output_dir(tmp_path / "out", "run"):
        raise FileNotFoundError(2, "No such file or directory", str(tmp_path / "trace.csv"))


@pytest.mark.parametrize(
    "command",
    [
        ["run", "configs/quickstart.yaml", "-q"],
        ["sweep", "configs/sweep/block-size-rate.yaml"],
        ["plan", "configs/plan/small-chat-l4.yaml"],
        ["replay-run", "configs/replays/h100-llama-2-7b-tp1-codegen.yaml"],
    ],
)
def test_every_command_refuses_an_output_under_a_file_before_running(tmp_path, capsys, command):
    from sim.cli import main

    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    root = Path(__file__).resolve().parents[1]
    argv = [command[0], str(root / command[1]), *command[2:], "-o", str(a_file / "sub")]
    assert main(argv) == 2
    assert f"{a_file} is a file, so no folder can be made under it" in capsys.readouterr().err
    assert a_file.read_text() == "mine"
