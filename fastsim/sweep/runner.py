"""Running a grid: every point's row of numbers from a task (simulate it, or search it), in
blocks, on this thread, worker threads, forked worker processes (many small points, which are
mostly Python) or a Dask cluster (:mod:`.backends`: which one is chosen here), recorded in a
checkpoint as blocks finish.

The table is a NumPy array of shape (points, columns) in C order of the grid. Each point is a
pure function of its config, so the table is bit-identical whatever runs it. Work goes out in
blocks (roughly a quarter of a second of simulation each, since a task costs up to 2 ms to
dispatch on Dask); points that share workload values go in the same block, so a block draws each
distinct traffic once. Ctrl-C takes effect at once: the points that finished are kept in the
checkpoint, and the backend stops the blocks in flight.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, wait
from pathlib import Path
from typing import Callable, Iterator, Protocol

import numpy as np

from ..analysis.batch import MAX_REQUESTS, metric_rows
from ..analysis.metrics import METRICS, SORT_BELOW
from ..analysis.simulation import simulate
from ..engine.checks import check
from ..engine import paths
from ..model.schema import Config, ConfigError
from . import backends
from .memory import requests
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


def _run_blocks(backend: backends.Backend, blocks: list[np.ndarray], keep: Callable[[np.ndarray, np.ndarray], None]
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


def warm_up(grid: Grid, batched: bool = False) -> None:
    """Load (or compile, once) the kernels the grid's points run, before workers call them: each
    compiled path (:func:`fastsim.engine.paths.compiled`) among the values of every axis (the
    others at their first), on as few requests as take the
    same metrics code as the grid's smallest point (a run of up to ``SORT_BELOW`` requests has
    its own, which a grid of larger points would compile for nothing: 4.6 s of a first run);
    ``batched``: as small points run, many to a compiled call (:mod:`fastsim.analysis.batch`)."""
    first = [0] * len(grid.keys)
    points = [tuple(first)]
    for a in range(len(grid.keys)):
        points += [tuple(first[:a] + [j] + first[a + 1:]) for j in range(1, len(grid.axes[a]))]
    kinds: dict[tuple, Config] = {}
    for idx in points:
        config = grid.config_at(idx)
        try:
            check(config)  # a plan's candidate may be one that cannot run
        except ConfigError:
            continue
        kinds.setdefault(paths.compiled(config), config)
    n = 8 if grid.min_requests <= SORT_BELOW else SORT_BELOW + 1
    for config in kinds.values():
        if paths.of(config).shares == paths.BLOCKS:  # a trace's recorded sharing: its first requests
            tiny = config.at({"workload.n_requests": min(n, requests(config))})
        else:
            tiny = config.at({"workload.n_requests": n, "workload.trace": None,
                              "workload.rate": config.workload.rate or 1.0})
        if batched:
            metric_rows([tiny])
        else:
            simulate(tiny, checked=True)


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
    the calling thread, or on one worker thread when that is the main thread: Ctrl-C then takes
    effect at once, and never lands in compiled code, :func:`.backends.in_worker`).
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
        backend = backends.here(grid, task)
    elif scheduler is not None:
        backends.in_worker(warm_up, grid, batched)  # fill Numba's cache here, so local Dask workers only load it
        backend = backends.dask(grid, task, scheduler, workers, functools.partial(warm_up, grid, batched))
    elif workers == 1 or len(blocks) == 1:
        backend = backends.here(grid, task)  # one at a time (off the main thread: Ctrl-C takes effect at once)
    elif grid.max_requests * task.seconds_per_request < MIN_REQUESTS_FOR_THREADS * SECONDS_PER_REQUEST:
        if todo.size * seconds < MIN_SECONDS_FOR_PROCESSES or not backends.can_fork():
            backend = backends.here(grid, task)
        else:
            backends.in_worker(warm_up, grid, batched)  # compile or load once, before the workers are forked
            backend = backends.processes(grid, task, min(workers, len(blocks)))
    else:
        backends.in_worker(warm_up, grid, batched)  # compile or load once, before threads call the kernels
        backend = backends.threads(grid, task, min(workers, len(blocks)))
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
