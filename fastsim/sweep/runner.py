"""Running a grid: every point's row of numbers from a task (simulate it, or search it), in
blocks, on this thread, worker threads, forked worker processes (many small points, which are
mostly Python) or a Dask cluster, recorded in a checkpoint as blocks finish.

The table is a NumPy array of shape (points, columns) in C order of the grid. Each point is a
pure function of its config, so the table is bit-identical whatever runs it. Work goes out in
blocks (roughly a quarter of a second of simulation each, since a task costs up to 2 ms to
dispatch on Dask); points that share workload values go in the same block, so a block draws each
distinct traffic once. Ctrl-C takes effect at once: the points that finished are kept in the
checkpoint, worker threads are told to stop and not waited for (a kernel cannot be interrupted;
a search stops between two simulations), worker processes (forked, or a local Dask cluster's)
are ended, and ignore the terminal's Ctrl-C themselves so that none prints a traceback.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import sys
import threading
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Callable, Iterator, NamedTuple, Protocol

import numpy as np

from ..analysis.batch import MAX_REQUESTS, metric_rows
from ..analysis.metrics import METRICS, SORT_BELOW
from ..analysis.simulation import simulate
from ..engine.checks import check
from ..engine.kernels import Plan
from ..model import fleet
from ..model.schema import Config, ConfigError
from .checkpoint import Checkpoint
from .grid import Grid

SECONDS_PER_BLOCK = 0.25
SECONDS_PER_REQUEST = 1.6e-7  # traffic + kernel + metrics per request: ~6.2 M/s per worker, measured
SECONDS_PER_POINT = 4e-5  # and the Python around them, per point (measured on 10-request points)
# Below this many requests per point, the Python of a point (its config and traffic: ~40 us)
# holds the GIL for much of it: worker threads then contend for it. Measured on 2 cores, 3000
# points of 1000 requests: one thread 1.32 s, two threads 0.85 s, two forked processes 0.72 s.
MIN_REQUESTS_FOR_THREADS = 2000
# Such points go to worker processes instead (forked, Linux) when there is enough work for it:
# forking costs milliseconds (2000 points of 100 requests: 0.16 s on one thread, 0.12 s forked).
MIN_SECONDS_FOR_PROCESSES = 1.0
# Points estimated longer than this run on a worker thread even alone, so that Ctrl-C (which
# the main thread sees only between two calls into a kernel) takes effect at once.
INTERRUPT_S = 0.2


class Task(Protocol):
    """What a grid computes per point: rows of float64 for a block of points' configs. ``stop``
    (threads only) is set on Ctrl-C: a long task returns early by raising
    :class:`fastsim.analysis.targets.Stopped`."""

    columns: list[str]
    name: str  # what computed the rows, for the checkpoint's fingerprint
    seconds_per_request: float  # a point's work per simulated request, for sizing blocks

    def __call__(self, configs: list[Config], stop: threading.Event | None) -> np.ndarray: ...


class Simulate:
    """Simulate each point: its metrics (:data:`fastsim.analysis.metrics.METRICS`)."""

    columns = list(METRICS)
    name = "sweep"
    seconds_per_request = SECONDS_PER_REQUEST

    def __call__(self, configs: list[Config], stop: threading.Event | None = None) -> np.ndarray:
        """Small points that share an engine run in one compiled call (:mod:`fastsim.analysis.batch`);
        consecutive points with the same workload reuse one draw of traffic (blocks are grouped by
        workload)."""
        return metric_rows(configs)


def run_block(grid: Grid, block: np.ndarray, task: Task, stop: threading.Event | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
    """A block of points (flat indices): (indices, rows). Runs in workers."""
    return block, task([grid.config(i) for i in block.tolist()], stop)


def point_seconds(grid: Grid, seconds_per_request: float = SECONDS_PER_REQUEST) -> float:
    """The estimated time of the grid's largest point."""
    return SECONDS_PER_POINT + grid.max_requests * seconds_per_request


def make_blocks(grid: Grid, todo: np.ndarray, workers: int, seconds_per_request: float = SECONDS_PER_REQUEST
                ) -> list[np.ndarray]:
    """Chunk the points still to do (flat indices, ascending) into blocks, grouping points with
    the same workload (C order within each workload)."""
    if not todo.size:
        return []
    workload_axes = [j for j, k in enumerate(grid.keys) if k.startswith("workload.")]
    if workload_axes:
        coords = np.unravel_index(todo, grid.shape)
        todo = todo[np.lexsort((todo, *[coords[j] for j in reversed(workload_axes)]))]
    by_time = max(1, int(SECONDS_PER_BLOCK / point_seconds(grid, seconds_per_request)))
    by_balance = max(1, math.ceil(todo.size / (4 * workers)))
    size = min(by_time, by_balance)
    return [todo[j : j + size] for j in range(0, todo.size, size)]


Results = Iterator[tuple[np.ndarray, np.ndarray]]
# (points done, points in all, fraction of the estimated work done: points weighted by their requests)
Progress = Callable[[int, int, float], None]


class _Backend(NamedTuple):
    """Where blocks run, as a context manager's value: ``submit(block)`` returns a future of its
    (indices, rows), at most ``in_flight`` out at once. Left by an exception (Ctrl-C), the context
    stops the work in flight at once: the one cancel path."""

    submit: Callable[[np.ndarray], Future]
    in_flight: int


def _run_blocks(backend: _Backend, blocks: list[np.ndarray], keep: Callable[[np.ndarray, np.ndarray], None]
                ) -> Results:
    """The one loop: keep up to ``in_flight`` blocks submitted, yield each as it finishes. On
    Ctrl-C the blocks that finished but were not yet yielded go to ``keep`` (the backend then
    stops the rest: a kernel cannot be interrupted, so it is not waited for)."""
    queue = deque(blocks)
    pending: set[Future] = set()
    try:
        while queue or pending:
            while queue and len(pending) < backend.in_flight:
                pending.add(backend.submit(queue.popleft()))
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                yield future.result()
    except KeyboardInterrupt:
        for future in pending:
            if future.done() and not future.cancelled() and future.exception() is None:
                keep(*future.result())
        raise


# The axes that can change which kernel a point runs (the lesson's or the serving model's, which
# policy, which kind of fleet); rates, seeds and lengths never do.
KERNEL_KEYS = ("engine.", "hardware.", "model.", "calibration.", "fleet.", "workload.prefix_tokens")


def _kernel_kind(config: Config) -> tuple:
    plan = Plan.of(config)
    return plan.lesson, plan.policy == "continuous", fleet.kind(config)


def warm_up(grid: Grid, batched: bool = False) -> None:
    """Load (or compile, once) the kernels the grid's points run, before workers call them: each
    kind of kernel among the values of the axes that choose one, on as few requests as take the
    same metrics code as the grid's smallest point (a run of up to ``SORT_BELOW`` requests has
    its own, which a grid of larger points would compile for nothing: 4.6 s of a first run);
    ``batched``: as small points run, many to a compiled call (:mod:`fastsim.analysis.batch`)."""
    first = [0] * len(grid.keys)
    points = [tuple(first)]
    for a, key in enumerate(grid.keys):
        if key.startswith(KERNEL_KEYS):
            points += [tuple(first[:a] + [j] + first[a + 1:]) for j in range(1, len(grid.axes[a]))]
    kinds: dict[tuple, Config] = {}
    for idx in points:
        config = grid.config_at(idx)
        try:
            check(config)  # a plan's candidate may be one that cannot run
        except ConfigError:
            continue
        kinds.setdefault(_kernel_kind(config), config)
    n = 8 if grid.min_requests <= SORT_BELOW else SORT_BELOW + 1
    for config in kinds.values():
        tiny = config.at({"workload.n_requests": n, "workload.trace": None, "workload.rate": config.workload.rate or 1.0})
        if batched:
            metric_rows([tiny])
        else:
            simulate(tiny, checked=True)


@contextlib.contextmanager
def _here(grid: Grid, task: Task) -> Iterator[_Backend]:
    """Blocks run in the calling thread as they are submitted: Ctrl-C lands between two points."""

    def submit(block: np.ndarray) -> Future:
        future: Future = Future()
        future.set_result(run_block(grid, block, task))
        return future

    yield _Backend(submit, 1)


@contextlib.contextmanager
def _threads(grid: Grid, task: Task, workers: int) -> Iterator[_Backend]:
    """Worker threads: the kernels release the GIL (``nogil``), the Python around them is a few
    percent of a point, and threads cost nothing to start (no imports, no Numba start-up per
    process). A running block is told to stop on Ctrl-C and is not waited for (the caller exits,
    or the thread ends with its block)."""
    stop = threading.Event()
    pool = ThreadPoolExecutor(workers, thread_name_prefix="fastsim")
    try:
        yield _Backend(lambda block: pool.submit(run_block, grid, block, task, stop), 2 * workers)
    finally:
        stop.set()
        pool.shutdown(wait=False, cancel_futures=True)


_worker: tuple = ()  # a worker process's (grid, task)


def _start_worker(grid: Grid, task: Task, parent: int) -> None:
    """A worker process's set-up: Ctrl-C is the parent's to handle (it stops the pool and keeps
    what finished), and the worker ends quietly with its parent (killed, the parent could not
    read its results: the worker would only print a broken pipe)."""
    import signal

    global _worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:  # Linux: the kernel kills this process when its parent dies
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before that took effect
        os._exit(0)
    # A worker's errors reach the parent with its results. All it could print itself is its own
    # end when the parent is gone: a broken pipe, in the instant before the kernel kills it.
    sys.stderr = open(os.devnull, "w")
    _worker = (grid, task)


def _block_in_worker(block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A block, in a worker process (the grid and task came with the fork)."""
    return run_block(_worker[0], block, _worker[1])


def _can_fork() -> bool:
    """Forking is safe here: Linux, and no other thread that a child could inherit mid-lock (a
    notebook's kernel has some: its sweeps of small points stay on one thread)."""
    return sys.platform == "linux" and threading.active_count() == 1


@contextlib.contextmanager
def _processes(grid: Grid, task: Task, workers: int) -> Iterator[_Backend]:
    """Forked worker processes, for points too small for threads to share the GIL well. Forked,
    a worker starts in milliseconds with the grid, the task and the loaded kernels already in its
    memory; every worker is forked here, before any other thread (the pool's own, a progress
    bar's) exists. Ctrl-C kills them."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"), initializer=_start_worker,
                               initargs=(grid, task, os.getpid()))
    pool.submit(os.getpid).result()  # a forking pool starts every worker at its first task

    finished = False
    try:
        yield _Backend(lambda block: pool.submit(_block_in_worker, block), 2 * workers)
        finished = True
    finally:
        if not finished:
            for process in list((pool._processes or {}).values()):
                with contextlib.suppress(OSError):
                    process.kill()
        pool.shutdown(wait=finished, cancel_futures=not finished)  # idle workers exit at once


def check_scheduler(address: str) -> None:
    """Refuse a ``--scheduler`` that is neither ``local`` nor a Dask address (``tcp://host:8786``)
    before any work starts."""
    if address == "local":
        return
    from distributed.comm.addressing import parse_address, parse_host_port

    try:
        host, port = parse_host_port(parse_address(address)[1])
        if not host or not 0 < port < 65536:
            raise ValueError("no host" if not host else f"port {port} out of range")
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"--scheduler {address!r}: not 'local' nor a Dask scheduler address such as "
                          f"tcp://host:8786 ({exc})") from None


@contextlib.contextmanager
def _sigint_ignored() -> Iterator[None]:
    """Ignore SIGINT (on the main thread) while processes are started: they keep ignoring it,
    so a terminal's Ctrl-C, sent to the whole process group, reaches only this process, which
    stops them and keeps what finished (they would each print a traceback)."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _quiet_workers() -> Iterator[None]:
    """Local Dask workers started meanwhile log errors only (not the warnings a cancel on
    Ctrl-C makes each print): the setting is read from the environment they inherit."""
    key = "DASK_LOGGING__DISTRIBUTED"
    previous = os.environ.get(key)
    os.environ[key] = "error"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = previous


def _listening(address: str) -> None:
    """Raise OSError at once when nothing listens at a tcp:// address (Dask retries for its
    whole timeout before it says so)."""
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    if address.startswith("tcp://") and port.isdigit():
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()


@contextlib.contextmanager
def _dask(grid: Grid, task: Task, scheduler: str, workers: int, batched: bool) -> Iterator[_Backend]:
    """A Dask cluster (``local``: one started here, of ``workers`` processes). Every block is
    submitted at once; Ctrl-C ends a local cluster's workers, which may be deep in a kernel."""
    from distributed import Client, LocalCluster

    cluster = None
    if scheduler == "local":
        with _sigint_ignored(), _quiet_workers():  # what its processes inherit
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
    else:
        try:
            _listening(scheduler)
            client = Client(scheduler, timeout="10s")
        except (OSError, TimeoutError, ValueError) as exc:
            raise ConfigError(f"--scheduler {scheduler}: cannot reach a Dask scheduler ({exc})") from None
    quiet = logging.getLogger("distributed")  # the scheduler, here, would log the loss of killed workers
    level = quiet.level
    try:
        client.run(warm_up, grid, batched)
        shared = client.scatter(grid, broadcast=True)  # sent once, not with every block
        executor = client.get_executor(pure=False)
        try:
            yield _Backend(lambda block: executor.submit(run_block, shared, block, task), 1 << 62)
        except BaseException:
            if cluster is not None:  # its workers may be deep in a kernel: end them, not wait
                quiet.setLevel(logging.CRITICAL)
                _kill_workers(cluster)
            raise
        finally:
            executor.shutdown(wait=False)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
        quiet.setLevel(level)


def _kill_workers(cluster) -> None:
    """End a local cluster's worker processes at once (its nannies then close quickly)."""
    import signal

    for nanny in cluster.workers.values():
        pid = getattr(getattr(getattr(nanny, "process", None), "process", None), "pid", None)
        if pid:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def run_grid(
    grid: Grid,
    workers: int | None = None,
    scheduler: str | None = None,
    checkpoint: Path | None = None,
    resume: bool = False,
    on_progress: Progress | None = None,
    task: Task | None = None,
) -> np.ndarray:
    """Run ``task`` (default: simulate) on every grid point; returns the table, shape
    (*axes, len(task.columns)).

    ``workers``: threads on this machine (default: every core; 1 runs one point at a time, in
    the calling thread unless a point is long enough that Ctrl-C should not wait for it).
    ``scheduler``: a Dask scheduler address, or ``"local"`` for a local Dask cluster.
    ``checkpoint``: file to record finished points in; ``resume`` continues from it.
    ``on_progress(done, total, work)``: after each block, points done of all, and the fraction of
    the estimated work done (a point's estimate grows with its requests, so an ETA holds across
    an ``n_requests`` axis).
    """
    task = Simulate() if task is None else task
    if workers is not None and workers < 1:
        raise ConfigError(f"workers must be at least 1 (got {workers})")
    workers = workers or os.cpu_count() or 1
    columns = len(task.columns)
    table = np.full((grid.size, columns), np.nan)
    log = Checkpoint(checkpoint, grid.base, grid.size, task.columns, task.name) if checkpoint is not None else None
    finished = np.zeros(grid.size, dtype=bool)
    if log is not None:
        indices, rows = log.open(resume)
        table[indices] = rows
        finished[indices] = True

    def record(indices: np.ndarray, rows: np.ndarray) -> None:
        table[indices] = rows
        if log is not None:
            log.append(indices, rows)

    todo = np.flatnonzero(~finished)
    blocks = make_blocks(grid, todo, workers, task.seconds_per_request)
    n_done = grid.size - todo.size
    batched = isinstance(task, Simulate) and grid.min_requests <= MAX_REQUESTS  # which code the points run
    seconds = point_seconds(grid, task.seconds_per_request)
    if not blocks:
        backend = _here(grid, task)
    elif scheduler is not None:
        warm_up(grid, batched)  # fill Numba's cache here, so local Dask workers only load it
        backend = _dask(grid, task, scheduler, workers, batched)
    elif (workers == 1 or len(blocks) == 1) and seconds < INTERRUPT_S:
        backend = _here(grid, task)  # Ctrl-C lands between two points
    elif grid.max_requests * task.seconds_per_request < MIN_REQUESTS_FOR_THREADS * SECONDS_PER_REQUEST:
        if todo.size * seconds < MIN_SECONDS_FOR_PROCESSES or not _can_fork():
            backend = _here(grid, task)
        else:
            warm_up(grid, batched)  # compile or load once, before the workers are forked
            backend = _processes(grid, task, min(workers, len(blocks)))
    else:
        warm_up(grid, batched)  # compile or load once, before threads call the kernels
        backend = _threads(grid, task, min(workers, len(blocks)))
    if on_progress:
        cost = SECONDS_PER_POINT + grid.requests_per_point() * task.seconds_per_request  # estimated, per point
        work_total = float(cost.sum())
        work = work_total - float(cost[todo].sum())
    try:
        with backend as where:
            results = _run_blocks(where, blocks, record)
            if on_progress:  # the bar (and its thread) starts once any worker process was forked
                on_progress(n_done, grid.size, work / work_total)
            for indices, rows in results:
                record(indices, rows)
                n_done += len(indices)
                if on_progress:
                    work += float(cost[indices].sum())
                    on_progress(n_done, grid.size, min(1.0, work / work_total))
    finally:
        if log is not None:
            log.close()
    return table.reshape(*grid.shape, columns)
