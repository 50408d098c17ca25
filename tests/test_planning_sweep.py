"""kvsim sweep: equal to one-by-one runs, the same on every executor, resumable after a kill."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

from sim.cli import main
from sim.config import validate_experiment
from sim.planning.sweeps.driver import progress_enabled
from sim.planning.sweeps.executors import DaskExecutor, ExecutorError, LocalExecutor
from sim.planning.sweeps.run import run_sweep
from sim.planning.sweeps.spec import load_sweep_spec
from sim.planning.sweeps.tasks import PointOutcome, run_point
from sim.results import load_sweep
from sim.runner import run_experiment
from sim.storage import OutputTargetError
from tests.planning_helpers import TINY_EXPERIMENT, sweep_file

NONDETERMINISTIC = ["wall_s"]  # the only column that depends on the machine


def deterministic(table: pd.DataFrame) -> pd.DataFrame:
    return table.drop(columns=NONDETERMINISTIC).sort_values(["point_index", "variant"]).reset_index(drop=True)


class Counting:
    """Runs points and counts them; optionally raises KeyboardInterrupt (a kill) before run ``stop_at``."""

    def __init__(self, stop_at: int | None = None, fail: set[str] | None = None):
        self.calls: list[str] = []
        self.stop_at = stop_at
        self.fail = fail or set()

    def __call__(self, task):
        if self.stop_at is not None and len(self.calls) == self.stop_at:
            raise KeyboardInterrupt
        self.calls.append(task.point_id)
        if task.point_id in self.fail:
            return PointOutcome(task.point_id, False, error="RuntimeError: injected")
        return run_point(task)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The sweep run once in this process: its table is what every other way of running must give."""
    tmp = tmp_path_factory.mktemp("reference")
    sweep = load_sweep_spec(sweep_file(tmp))
    return sweep, run_sweep(sweep, tmp / "out", figures=True)


def test_sweep_equals_points_run_one_by_one(reference):
    sweep, result = reference
    assert len(result.table) == 4 and result.counts.ran == 4
    for point in sweep.points:
        config = validate_experiment(point.config.model_dump(mode="json"))
        alone = run_experiment(config, point.base_dir / "x.yaml")[0].summary
        row = result.table[result.table["point_id"] == point.point_id].iloc[0]
        for key, value in alone.items():
            if key in NONDETERMINISTIC or isinstance(value, dict):
                continue
            if value is None:
                assert pd.isna(row[key]), key
            else:
                assert row[key] == pytest.approx(value), key
        assert row["engine.block_size"] == point.values["engine.block_size"]
        assert row["workload.arrival.rate_per_s"] == point.values["workload.arrival.rate_per_s"]


def test_outputs_and_results_api(reference):
    sweep, result = reference
    out = result.out_dir
    loaded = load_sweep(out)
    assert loaded.axes == ["engine.block_size", "workload.arrival.rate_per_s"]
    pd.testing.assert_frame_equal(loaded.table, pd.read_parquet(out / "sweep.parquet"))
    assert len(pd.read_csv(out / "sweep.csv")) == 4
    assert sorted(path.name for path in (out / "figures").iterdir()) == [
        "engine.block_size.png",
        "workload.arrival.rate_per_s.png",
    ]
    point = loaded.point(sweep.points[0].point_id)
    assert point.variants == ["paged"] and len(point.requests("paged")) == 40
    marker = json.loads((out / ".kvsim-results").read_text())
    assert marker["kind"] == "sweep"
    assert (
        json.loads((out / "points" / sweep.points[0].point_id / ".kvsim-results").read_text())["kind"]
        == "point"
    )


def assert_same_rows_on(executor, reference, out_dir):
    """The reference sweep run again on ``executor`` gives the same rows (the executor is closed)."""
    sweep, result = reference
    try:
        again = run_sweep(sweep, out_dir, executor, figures=False)
    finally:
        executor.close()
    pd.testing.assert_frame_equal(deterministic(again.table), deterministic(result.table))


def test_local_processes_give_identical_rows(reference, tmp_path):
    assert_same_rows_on(LocalExecutor(2), reference, tmp_path / "out")


def test_dask_local_cluster_gives_identical_rows(reference, tmp_path):
    pytest.importorskip("distributed")
    assert_same_rows_on(DaskExecutor(workers=2), reference, tmp_path / "out")


def test_unreachable_dask_scheduler_is_a_clear_error(tmp_path, capsys):
    pytest.importorskip("distributed")
    path = sweep_file(tmp_path)
    out = tmp_path / "out"
    code = main(["sweep", str(path), "-o", str(out), "--dask", "tcp://127.0.0.1:9", "--dask-timeout", "1"])
    assert code == 2
    err = capsys.readouterr().err
    assert "cannot reach the Dask scheduler at tcp://127.0.0.1:9 within 1 s" in err
    assert not out.exists()
    with pytest.raises(ExecutorError, match="not both"):
        from sim.planning.sweeps.executors import make_executor

        make_executor(dask="tcp://127.0.0.1:9", dask_local=2)


def test_resume_after_an_interruption_recomputes_nothing(reference, tmp_path):
    sweep, result = reference
    out = tmp_path / "out"
    killed = Counting(stop_at=2)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(sweep, out, fn=killed, figures=False)
    points = out / "points"
    assert len([p for p in points.iterdir() if not p.name.startswith(".")]) == 2
    assert not [p for p in points.iterdir() if p.name.startswith(".")]  # no half-written point
    assert not (out / "sweep.parquet").exists()

    resumed = Counting()
    again = run_sweep(sweep, out, fn=resumed, figures=False)
    assert len(resumed.calls) == 2 and set(resumed.calls).isdisjoint(killed.calls)
    assert (again.counts.ran, again.counts.skipped_done) == (2, 2)

    third = Counting()
    final = run_sweep(sweep, out, fn=third, figures=False)
    assert third.calls == [] and final.counts.skipped_done == 4
    pd.testing.assert_frame_equal(final.table, again.table)
    pd.testing.assert_frame_equal(deterministic(final.table), deterministic(result.table))


def test_failing_point_is_recorded_and_retried_on_request(reference, tmp_path):
    sweep, _ = reference
    bad = sweep.points[1].point_id
    out = tmp_path / "out"
    first = run_sweep(sweep, out, fn=Counting(fail={bad}), figures=False)
    assert first.counts.failed == 1 and first.counts.ran == 4
    failed = first.table[first.table["status"] == "failed"]
    assert list(failed["point_id"]) == [bad] and list(failed["error"]) == ["RuntimeError: injected"]
    skipping = Counting()
    second = run_sweep(sweep, out, fn=skipping, figures=False)
    assert skipping.calls == [] and second.counts.skipped_failed == 1
    retrying = Counting()
    third = run_sweep(sweep, out, fn=retrying, retry_failed=True, figures=False)
    assert retrying.calls == [bad]
    assert set(third.table["status"]) == {"ok"}


def test_foreign_folder_is_refused_before_any_run(reference, tmp_path):
    sweep, _ = reference
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    counting = Counting()
    with pytest.raises(OutputTargetError, match="was not written by kvsim"):
        run_sweep(sweep, foreign, fn=counting)
    assert counting.calls == [] and (foreign / "notes.txt").read_text() == "keep me"


def test_killed_cli_sweep_resumes_without_recomputing(tmp_path):
    """SIGKILL a real `kvsim sweep` once its first point is on disk; the re-run simulates only the rest."""
    path = sweep_file(tmp_path, axes={"seed": [1, 2, 3, 4, 5, 6]})
    out = tmp_path / "out"
    env = os.environ | {"TQDM_DISABLE": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "sim.cli", "sweep", str(path), "-o", str(out), "-j", "1", "-q"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            done = (
                [p for p in (out / "points").glob("*") if not p.name.startswith(".")] if out.exists() else []
            )
            if done:
                break
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait()
    finished = {p.name for p in (out / "points").iterdir() if not p.name.startswith(".")}
    assert finished
    counting = Counting()
    sweep = load_sweep_spec(path)
    result = run_sweep(sweep, out, fn=counting, figures=False)
    assert set(counting.calls) == set(sweep.ids()) - finished
    assert result.counts.skipped_done == len(finished)
    assert set(result.table["status"]) == {"ok"} and len(result.table) == 6
    # Stale staging is cleaned. (A worker process of the killed sweep may outlive it, orphaned, to the
    # end of the point it was simulating in its own scratch folder there; it removes that folder when
    # the point ends, and a later run removes it if the worker dies first.)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and [p for p in (out / "points").iterdir() if p.name.startswith(".")]:
        time.sleep(0.1)
    left = [p for p in (out / "points").iterdir() if p.name.startswith(".")]
    assert not left, [
        (p.name, sorted(q.name for q in p.iterdir()), [q.read_text() for q in p.glob(".kvsim-partial")])
        for p in left
    ]


def test_progress_bar_is_quiet_in_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert not progress_enabled()
    monkeypatch.delenv("CI")
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert not progress_enabled()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert progress_enabled() and not progress_enabled(quiet=True)


def test_cli_sweep_prints_counts(tmp_path, capsys):
    path = sweep_file(tmp_path, axes={"seed": [1]})
    out = tmp_path / "out"
    assert main(["sweep", str(path), "-o", str(out), "-j", "1", "-q"]) == 0
    assert "1 points: 1 simulated" in capsys.readouterr().out
    assert main(["sweep", str(path), "-o", str(out), "-j", "1", "-q"]) == 0
    assert "0 simulated, 1 already done (skipped)" in capsys.readouterr().out
    assert Path(out / "sweep.parquet").is_file()


def test_interrupted_cli_sweep_says_what_it_kept(tmp_path, capsys, monkeypatch):
    import sim.planning.sweeps.run as sweep_module

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_module, "run_sweep", interrupted)
    path = sweep_file(tmp_path, axes={"seed": [1]})
    assert main(["sweep", str(path), "-o", str(tmp_path / "out"), "-j", "1", "-q"]) == 130
    assert "interrupted; 0 finished point(s) kept" in capsys.readouterr().err


def test_trace_workload_points_run(tmp_path):
    """A trace workload's resolved config must validate again on the worker (defaults stay unset)."""
    trace = Path(__file__).parent / "data" / "traces" / "azure" / "AzureLLMInferenceTrace_conv_head200.csv"
    experiment = {
        "name": "trace",
        "model": "Llama-3.1-8B",
        "gpu": "H100-80GB",
        "workload": {"source": {"kind": "azure", "path": str(trace)}, "num_requests": 30},
        "variants": [{"name": "paged", "policy": "paged"}],
    }
    path = sweep_file(tmp_path, experiment=experiment, axes={"workload.target_rate_per_s": [2.0, 4.0]})
    result = run_sweep(load_sweep_spec(path), tmp_path / "out", figures=False)
    assert list(result.table["status"]) == ["ok", "ok"]
    assert list(result.table["requests_total"]) == [30, 30]


def test_sigterm_stops_a_local_sweep_cleanly(tmp_path):
    """SIGTERM (``timeout``, Slurm) while two worker processes are mid-point: the sweep exits 130 with its
    one-line notice, and no semaphore of a terminated worker is left for the resource tracker to
    report as leaked (tqdm's default lock in the workers was one). The workers simulate in the
    sweep's own points folder, not the system temp folder: what a killed worker leaves there, the next
    run removes."""
    experiment = TINY_EXPERIMENT | {"workload": TINY_EXPERIMENT["workload"] | {"num_requests": 20_000}}
    path = sweep_file(tmp_path, experiment=experiment, axes={"seed": [1, 2, 3, 4]})
    out = tmp_path / "out"
    # The workers' point folders go here, to be watched. A short path: the forkserver's socket is made
    # in it too, and a Unix socket's path has a length limit that pytest's tmp_path can exceed.
    scratch = Path(tempfile.mkdtemp(prefix="kvsim-sigterm-"))
    env = os.environ | {"TQDM_DISABLE": "1", "TMPDIR": str(scratch)}
    process = subprocess.Popen(
        [sys.executable, "-m", "sim.cli", "sweep", str(path), "-o", str(out), "-j", "2"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        # A variant's folder in a point folder: that point's experiment (and its bars) has started.
        while time.monotonic() < deadline and process.poll() is None:
            if len(list((out / "points").glob(".*.partial-*/paged"))) >= 2:
                break
            time.sleep(0.05)
        if process.poll() is not None:
            pytest.fail(
                f"the sweep ended before the signal (exit {process.returncode}): {process.stderr.read()}"
            )
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
        process.wait()
        left_in_temp = list(scratch.glob("kvsim-point-*"))
        shutil.rmtree(scratch, ignore_errors=True)
    assert process.returncode == 130, stderr
    assert "kvsim sweep: interrupted;" in stderr
    assert "leaked" not in stderr and "Traceback" not in stderr, stderr
    assert left_in_temp == []
    # the next run (here: one that finds every point to do again) cleans the killed workers' folders
    from sim.planning.sweeps.store import PointStore

    PointStore(out).clean_stale()
    assert list((out / "points").glob(".*.partial-*")) == []


def test_the_fork_server_starts_early_only_for_local_workers():
    from sim.planning.sweeps.executors import LocalExecutor, local_jobs, make_executor

    assert local_jobs(None, "tcp://127.0.0.1:9", None) is None  # Dask: reached after the spec is read
    assert local_jobs(3, None, 2) is None
    assert local_jobs(3, None, None) == 3
    assert local_jobs(None, None, None) == (os.cpu_count() or 1)
    executor = make_executor(jobs=3)
    assert isinstance(executor, LocalExecutor) and executor.jobs == 3
    executor.close()
