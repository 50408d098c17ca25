"""Where points run: in this process, in local worker processes, or on a Dask cluster.

Every executor has the same two methods: ``run(fn, tasks)`` yields ``fn(task)`` results as they
complete (in any order), and ``close()``. Results do not depend on the executor: a point is a
deterministic function of its config (tests check local == one-by-one == Dask).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, Protocol

DEFAULT_DASK_TIMEOUT_S = 10.0
# Not matplotlib: the fork server's imports delay the first points, and a plan's workers draw its
# figures only at the end, importing it side by side.
WORKER_MODULES = ["sim.planning.sweeps.tasks", "sim.runner", "sim.results"]
"""What a point runs on (the engine, its outputs), for local workers to start with."""


class ExecutorError(RuntimeError):
    """An executor cannot start (Dask missing, scheduler unreachable); raised before any point runs."""


class Executor(Protocol):
    description: str
    shares_files: bool
    """Whether the workers see this machine's files (then a point works in the sweep's own folder,
    where the next run cleans what a killed worker left; otherwise in the worker's temp folder)."""

    def run(self, fn: Callable[[Any], Any], tasks: list[Any]) -> Iterator[Any]: ...

    def close(self) -> None: ...


class InlineExecutor:
    """One point after the other in this process (``--jobs 1``)."""

    description = "this process"
    shares_files = True

    def run(self, fn: Callable[[Any], Any], tasks: list[Any]) -> Iterator[Any]:
        for task in tasks:
            yield fn(task)

    def close(self) -> None:
        """Nothing to release."""


def _start_worker() -> None:
    # Ctrl-C goes to the whole process group: only the driver handles it (and stops the workers).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # tqdm's default lock holds a named multiprocessing semaphore (these workers start by forkserver),
    # created by a point's first (disabled) bar. An interrupted sweep terminates the workers mid-point,
    # before they can unlink it, and the resource tracker then reports it as leaked. A worker draws no
    # bar: a thread lock is all it needs.
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())


def _fork_server() -> Any:
    # forkserver: workers do not inherit the driver's threads (tqdm's monitor, Dask's loop).
    context = multiprocessing.get_context("forkserver")
    # Imported once, by the fork server, rather than by every worker it forks (about a second of CPU
    # each, on the cores the first points need).
    context.set_forkserver_preload(WORKER_MODULES)
    return context


def start_fork_server() -> None:
    """Start the fork server local workers come from, in the background: its imports (about a
    second) then overlap the driver reading and validating its spec instead of delaying the first
    points. A spec that fails leaves only an idle server, which exits with the driver."""
    _fork_server()
    threading.Thread(
        target=multiprocessing.forkserver.ensure_running, name="kvsim-fork-server", daemon=True
    ).start()


def local_jobs(jobs: int | None, dask: str | None, dask_local: int | None) -> int | None:
    """How many local worker processes ``make_executor`` starts for these flags (None: none, Dask)."""
    if dask or dask_local:
        return None
    return jobs or os.cpu_count() or 1


class LocalExecutor:
    """``jobs`` worker processes on this machine (started on first use, reused across plan rounds)."""

    def __init__(self, jobs: int):
        self.jobs = jobs
        self.description = f"{jobs} local processes"
        self.shares_files = True
        self._pool: ProcessPoolExecutor | None = None

    def _get_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=_fork_server(), initializer=_start_worker)
        return self._pool

    def run(self, fn: Callable[[Any], Any], tasks: list[Any]) -> Iterator[Any]:
        pool = self._get_pool()
        pending: set[Future] = {pool.submit(fn, task) for task in tasks}
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    yield future.result()
        except BaseException:
            for future in pending:
                future.cancel()
            self._terminate()
            raise

    def _terminate(self) -> None:
        """Stop the workers now (an interrupted sweep loses only the points in flight)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        processes = list(getattr(pool, "_processes", {}).values())  # our own children
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            if process.is_alive():
                process.terminate()

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


class DaskExecutor:
    """A Dask cluster: an existing scheduler (``address``) or a ``LocalCluster`` of ``workers``."""

    def __init__(self, address: str | None = None, workers: int | None = None, timeout_s: float = 10.0):
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise ExecutorError(
                "the Dask executors need the optional extra: pip install 'kvsim[dask]'"
            ) from None
        self._cluster = None
        self.shares_files = not address  # a remote scheduler's workers may be on other machines
        if address:
            try:
                self._client = Client(address, timeout=f"{timeout_s}s")
            except (OSError, TimeoutError) as error:
                raise ExecutorError(
                    f"cannot reach the Dask scheduler at {address} within {timeout_s:g} s ({error}); "
                    "is `dask scheduler` running there, and the port open?"
                ) from None
            self.description = f"Dask scheduler {address}"
        else:
            import logging

            workers = workers or os.cpu_count() or 1
            self._cluster = LocalCluster(
                n_workers=workers,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                silence_logs=logging.ERROR,
            )
            self._client = Client(self._cluster, timeout=f"{timeout_s}s")
            self.description = f"Dask LocalCluster of {workers} workers"

    def run(self, fn: Callable[[Any], Any], tasks: list[Any]) -> Iterator[Any]:
        from distributed import as_completed

        futures = self._client.map(fn, tasks, pure=False)
        try:
            for future in as_completed(futures):
                result = future.result()
                future.release()  # the cluster forgets it: memory stays bounded over many points
                yield result
        except BaseException:
            self._client.cancel(futures)
            raise

    def close(self) -> None:
        self._client.close()
        if self._cluster is not None:
            self._cluster.close()


def make_executor(
    jobs: int | None = None,
    dask: str | None = None,
    dask_local: int | None = None,
    dask_timeout_s: float = DEFAULT_DASK_TIMEOUT_S,
) -> Executor:
    """``--dask ADDRESS`` / ``--dask-local N`` / ``--jobs N`` (default: one process per core)."""
    if dask and dask_local:
        raise ExecutorError("give --dask ADDRESS or --dask-local N, not both")
    if dask:
        return DaskExecutor(address=dask, timeout_s=dask_timeout_s)
    if dask_local:
        return DaskExecutor(workers=dask_local, timeout_s=dask_timeout_s)
    if jobs is not None and jobs < 1:
        raise ExecutorError(f"--jobs must be at least 1, got {jobs}")
    jobs = local_jobs(jobs, dask, dask_local) or 1
    return InlineExecutor() if jobs == 1 else LocalExecutor(jobs)
