"""Grid sweeps: expand a config's ``sweep:`` into points, run them in blocks, gather a table.

The table is a NumPy array of shape (*axis lengths, len(METRICS)) in C order (the last axis
varies fastest). Each point is a pure function of its config, so the table is bit-identical
whatever runs it: this thread, a pool of worker threads, or a Dask cluster.

Work goes out in blocks of points (roughly a quarter of a second each), since a task costs up to
2 ms (Dask) to dispatch. Points that share workload values are put in the same block, so a block
draws each distinct traffic once.

Completed blocks can be appended to a checkpoint file as they arrive; a sweep restarted from it
runs only the missing points.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from . import __version__
from .config import Config, ConfigError
from .metrics import METRICS
from .simulation import simulate
from .traffic import generate

Point = dict[str, Any]
Block = list[tuple[int, Point]]

SECONDS_PER_BLOCK = 0.25
SECONDS_PER_REQUEST = 1.6e-7  # traffic + kernel + metrics per request: ~6.2 M/s per worker, measured


def shape(config: Config) -> tuple[int, ...]:
    return tuple(len(v) for v in config.sweep.values())


def points(config: Config) -> list[Point]:
    """Every grid point as {dotted key: value}, in C order of the axes."""
    keys = list(config.sweep)
    return [dict(zip(keys, combo)) for combo in itertools.product(*config.sweep.values())]


def validate_grid(config: Config) -> list[Point]:
    """Check every axis value and every combination; errors name the axis and the value."""
    for key, values in config.sweep.items():
        for value in values:
            try:
                config.with_values({key: value})
            except ConfigError as exc:
                raise ConfigError(f"sweep axis {key!r}, value {value!r}: {exc}") from None
    grid = points(config)
    for point in grid:
        try:
            config.with_values(point)
        except ConfigError as exc:
            raise ConfigError(f"sweep point {point}: {exc}") from None
    return grid


def run_block(base: Config, block: Block) -> tuple[np.ndarray, np.ndarray]:
    """Simulate a block of points; returns (point indices, metrics rows). Runs in workers.

    Consecutive points with the same workload reuse one draw of traffic (blocks are grouped by
    workload, so one draw is all that needs keeping).
    """
    rows = np.empty((len(block), len(METRICS)))
    workload, traffic = None, None
    for r, (_, point) in enumerate(block):
        config = base.with_values(point)
        if config.workload != workload:
            workload, traffic = config.workload, generate(config.workload)
        rows[r] = list(simulate(config, traffic).metrics.values())
    return np.array([i for i, _ in block], dtype=np.int64), rows


def make_blocks(config: Config, grid: list[Point], todo: Iterable[int], workers: int) -> list[Block]:
    """Chunk the points still to do into blocks, grouping points with the same workload."""
    keys = list(config.sweep)
    workload_axes = [k for k in keys if k.startswith("workload.")]
    index_of = {k: {repr(v): j for j, v in enumerate(config.sweep[k])} for k in workload_axes}

    def workload_rank(i: int) -> tuple[int, ...]:
        return tuple(index_of[k][repr(grid[i][k])] for k in workload_axes)

    todo = sorted(todo, key=workload_rank)  # stable: C order within each workload
    if not todo:
        return []
    requests = max(config.sweep.get("workload.n_requests", [config.workload.n_requests]))
    by_time = max(1, int(SECONDS_PER_BLOCK / (requests * SECONDS_PER_REQUEST)))
    by_balance = max(1, math.ceil(len(todo) / (4 * workers)))
    size = min(by_time, by_balance)
    return [[(i, grid[i]) for i in todo[j : j + size]] for j in range(0, len(todo), size)]


class Checkpoint:
    """Append-only file of finished points, safe against SIGKILL at any moment.

    Layout: a header (magic, SHA-256 of the sweep's fingerprint, point and metric counts), then
    fixed-size records (int64 point index, float64 metrics). Each block is appended with one write
    and fsync'd; a torn last record (the process died mid-write) is ignored on reading.
    """

    MAGIC = b"fastsim-checkpoint-1\n"

    def __init__(self, path: Path, config: Config, n_points: int):
        self.path = path
        self.n_metrics = len(METRICS)
        self.record = np.dtype([("index", "<i8"), ("metrics", "<f8", (self.n_metrics,))])
        fingerprint = json.dumps(
            {"config": config.model_dump(), "version": __version__, "metrics": list(METRICS)},
            sort_keys=True,
            default=repr,
        )
        digest = hashlib.sha256(fingerprint.encode()).digest()
        self.header = self.MAGIC + digest + np.array([n_points, self.n_metrics], "<i8").tobytes()
        self._fd: int | None = None

    def load(self) -> dict[int, np.ndarray]:
        """The finished points recorded so far (index -> metrics row)."""
        data = self.path.read_bytes()
        if not data.startswith(self.MAGIC):
            raise ConfigError(f"{self.path}: not a fastsim checkpoint")
        if data[: len(self.header)] != self.header:
            raise ConfigError(
                f"{self.path}: checkpoint of a different sweep (config, grid or fastsim version changed); "
                "delete it to start over"
            )
        body = data[len(self.header) :]
        usable = len(body) - len(body) % self.record.itemsize
        records = np.frombuffer(body[:usable], dtype=self.record)
        return {int(i): m for i, m in zip(records["index"], records["metrics"])}

    def open(self, resume: bool) -> dict[int, np.ndarray]:
        """Start (or, with ``resume``, continue) the file; returns the points already done."""
        done: dict[int, np.ndarray] = {}
        if resume and self.path.exists():
            done = self.load()
            # Rewrite without any torn tail or duplicate records, so appends stay aligned.
            self._write_fresh(done)
        else:
            self._write_fresh({})
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        return done

    def _write_fresh(self, done: dict[int, np.ndarray]) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(self.header)
            f.write(self._records(np.fromiter(done, np.int64, len(done)), np.array(list(done.values()))))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def _records(self, indices: np.ndarray, rows: np.ndarray) -> bytes:
        rec = np.empty(len(indices), dtype=self.record)
        rec["index"] = indices
        if len(indices):
            rec["metrics"] = rows
        return rec.tobytes()

    def append(self, indices: np.ndarray, rows: np.ndarray) -> None:
        assert self._fd is not None
        os.write(self._fd, self._records(indices, rows))
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _in_process(base: Config, blocks: list[Block]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for block in blocks:
        yield run_block(base, block)


def _warm_up() -> None:
    """Load (or compile) every kernel, so that workers never compile concurrently."""
    from .kernels import POLICIES

    tiny = Config().with_values({"workload.n_requests": 2})
    for policy in POLICIES:
        simulate(tiny.with_values({"engine.policy": policy}))


def _threads(base: Config, blocks: list[Block], workers: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Run blocks on worker threads: the kernels release the GIL (``nogil``), the Python around
    them is a few percent of a point, and threads cost nothing to start (no imports, no Numba
    start-up per process)."""
    queue = deque(blocks)
    with ThreadPoolExecutor(workers, thread_name_prefix="fastsim") as pool:
        pending: set[Future] = set()
        try:
            while queue or pending:  # a few blocks in flight per worker, so Ctrl-C stops soon
                while queue and len(pending) < 2 * workers:
                    pending.add(pool.submit(run_block, base, queue.popleft()))
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    yield future.result()
        finally:
            for future in pending:
                future.cancel()


def _dask(base: Config, blocks: list[Block], scheduler: str, workers: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    from distributed import Client, LocalCluster, as_completed

    cluster = None
    if scheduler == "local":
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
    else:
        try:
            client = Client(scheduler, timeout="10s")
        except (OSError, TimeoutError) as exc:
            raise ConfigError(f"--scheduler {scheduler}: cannot reach a Dask scheduler ({exc})") from None
    try:
        client.run(_warm_up)
        futures = [client.submit(run_block, base, block, pure=False) for block in blocks]
        try:
            for future in as_completed(futures):
                yield future.result()
        finally:
            client.cancel(futures)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def run_grid(
    config: Config,
    workers: int | None = None,
    scheduler: str | None = None,
    checkpoint: Path | None = None,
    resume: bool = False,
    on_progress: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """Run every grid point; returns the metrics table (shape (*axes, len(METRICS))).

    ``workers``: threads on this machine (default: every core; 1 runs in the calling thread).
    ``scheduler``: a Dask scheduler address, or ``"local"`` for a local Dask cluster.
    ``checkpoint``: file to record finished points in; ``resume`` continues from it.
    """
    if workers is not None and workers < 1:
        raise ConfigError(f"workers must be at least 1 (got {workers})")
    workers = workers or os.cpu_count() or 1
    grid = validate_grid(config)
    table = np.full((len(grid), len(METRICS)), np.nan)
    log = Checkpoint(checkpoint, config, len(grid)) if checkpoint is not None else None
    done = log.open(resume) if log is not None else {}
    for i, row in done.items():
        table[i] = row
    todo = [i for i in range(len(grid)) if i not in done]
    blocks = make_blocks(config, grid, todo, workers)
    if on_progress:
        on_progress(len(done), len(grid))
    if not blocks:
        results: Iterator = iter(())
    elif scheduler is not None:
        _warm_up()  # fill Numba's cache here, so local Dask workers only load it
        results = _dask(config, blocks, scheduler, workers)
    elif workers == 1 or len(blocks) == 1:
        results = _in_process(config, blocks)
    else:
        _warm_up()  # compile or load once, before threads call the kernels
        results = _threads(config, blocks, workers)
    n_done = len(done)
    try:
        for indices, rows in results:
            table[indices] = rows
            if log is not None:
                log.append(indices, rows)
            n_done += len(indices)
            if on_progress:
                on_progress(n_done, len(grid))
    finally:
        if log is not None:
            log.close()
    return table.reshape(*shape(config), len(METRICS))
