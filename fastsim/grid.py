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
from dataclasses import dataclass
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from . import __version__
from .config import Config, ConfigError, coupled_section, cross_checks, get_dotted, section_validator
from .metrics import METRICS
from .simulation import simulate
from .traffic import generate

SECONDS_PER_BLOCK = 0.25
SECONDS_PER_REQUEST = 1.6e-7  # traffic + kernel + metrics per request: ~6.2 M/s per worker, measured
# Below this many requests per point, a point is mostly Python holding the GIL (config, traffic
# set-up, metrics: ~150 us): worker threads then contend for it and run slower than one thread.
# Measured: 3000 points of 1000 requests, 1.1 s on one thread, 1.5 s on two; of 3000, 2.7 s, 1.9 s.
MIN_REQUESTS_FOR_THREADS = 2000


@dataclass(frozen=True)
class Grid:
    """A validated sweep: the base config and each axis's values, normalised (``1e3`` on an
    integer axis is ``1000``). Points are flat indices in C order of the axes (the last axis
    varies fastest); a point's config is built on demand, without validating it again.

    Axes of a coupled section (:func:`~fastsim.config.coupled_section`: a preset fills the rest
    of the section, or fields are checked together) are not set key by key: a point takes the
    whole section validated for its combination of those axes' values (``sections``).
    """

    base: Config
    keys: tuple[str, ...]
    axes: tuple[tuple[Any, ...], ...]
    # coupled section -> (positions of its axes in ``keys``, {their value indices: section})
    sections: dict[str, tuple[tuple[int, ...], dict[tuple[int, ...], Any]]]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(values) for values in self.axes)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def max_requests(self) -> int:
        """The most requests any point simulates."""
        from .memory import requests

        key = "workload.n_requests"
        if key not in self.keys:
            return requests(self.base)
        return max(requests(self.base.at({key: n})) for n in self.axes[self.keys.index(key)])

    def indices(self, index: int) -> tuple[int, ...]:
        """Per-axis value indices of the point at flat ``index``."""
        out = []
        for values in reversed(self.axes):
            index, j = divmod(index, len(values))
            out.append(j)
        return tuple(reversed(out))

    def config_at(self, idx: tuple[int, ...]) -> Config:
        """The config of the point with per-axis value indices ``idx``."""
        values = {key: values[j] for key, values, j in zip(self.keys, self.axes, idx)}
        for section, (positions, objects) in self.sections.items():
            for p in positions:
                del values[self.keys[p]]
            values[section] = objects[tuple(idx[p] for p in positions)]
        return self.base.at(values)

    def config(self, index: int) -> Config:
        return self.config_at(self.indices(index))


def build_grid(config: Config) -> Grid:
    """Validate ``config.sweep`` into a :class:`Grid`; errors name the axis and the value.

    Each axis value is validated once; axes of one coupled section in combination; and the
    checks that span sections (:func:`fastsim.config.cross_checks`) on every combination of the axes they
    read. Never every point of the grid (unless every axis is one that those checks read).
    """
    keys = list(config.sweep)
    normalised: dict[str, list[Any]] = {k: [None] * len(v) for k, v in config.sweep.items()}
    groups: dict[str | None, list[str]] = {}
    for key in keys:
        groups.setdefault(coupled_section(key), []).append(key)
    sections: dict[str, tuple[tuple[int, ...], dict[tuple[int, ...], Any]]] = {}
    validators: dict[str, Callable[[dict[str, Any]], Any]] = {}

    def validated(section: str, values: dict[str, Any]) -> Any:
        if section not in validators:
            validators[section] = section_validator(config, section)
        try:
            return validators[section](values)
        except ConfigError as exc:
            if len(values) == 1:
                ((key, value),) = values.items()
                raise ConfigError(f"sweep axis {key!r}, value {value!r}: {exc}") from None
            raise ConfigError(f"sweep point {values}: {exc}") from None

    for key in groups.pop(None, []):  # value by value, in the section that holds the key
        section = key.rsplit(".", 1)[0] if "." in key else ""
        for j, value in enumerate(config.sweep[key]):
            node = validated(section, {key: value})
            normalised[key][j] = get_dotted(node, key[len(section) + 1 :] if section else key)
    for section, group in groups.items():
        objects = {}
        for combo in itertools.product(*(range(len(config.sweep[k])) for k in group)):
            node = validated(section, {k: config.sweep[k][j] for k, j in zip(group, combo)})
            objects[combo] = node
            for k, j in zip(group, combo):
                normalised[k][j] = get_dotted(node, k[len(section) + 1 :])
        sections[section] = (tuple(keys.index(k) for k in group), objects)
    grid = Grid(config, tuple(keys), tuple(tuple(normalised[k]) for k in keys), sections)
    _check_combinations(grid)
    return grid


def _check_combinations(grid: Grid) -> None:
    """Run each cross-section check on every combination of the axes it reads (the others at
    their first value)."""
    for prefixes, check in cross_checks(read_traces=True):
        read = [p for p, k in enumerate(grid.keys) if k.startswith(prefixes)]
        for combo in itertools.product(*(range(len(grid.axes[p])) for p in read)):
            idx = [0] * len(grid.keys)
            for p, j in zip(read, combo):
                idx[p] = j
            try:
                check(grid.config_at(tuple(idx)))
            except ConfigError as exc:
                point = {grid.keys[p]: grid.axes[p][j] for p, j in zip(read, combo)}
                raise ConfigError(f"sweep point {point}: {exc}") from None


def run_block(grid: Grid, block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Simulate a block of points (flat indices); returns (indices, metrics rows). Runs in workers.

    Consecutive points with the same workload reuse one draw of traffic (blocks are grouped by
    workload, so one draw is all that needs keeping).
    """
    rows = np.empty((len(block), len(METRICS)))
    workload, traffic = None, None
    for r, index in enumerate(block.tolist()):
        config = grid.config(index)
        if config.workload != workload:
            workload, traffic = config.workload, generate(config.workload)
        rows[r] = list(simulate(config, traffic).metrics.values())
    return block, rows


def make_blocks(grid: Grid, todo: np.ndarray, workers: int) -> list[np.ndarray]:
    """Chunk the points still to do (flat indices, ascending) into blocks, grouping points with
    the same workload (C order within each workload)."""
    if not todo.size:
        return []
    workload_axes = [j for j, k in enumerate(grid.keys) if k.startswith("workload.")]
    if workload_axes:
        coords = np.unravel_index(todo, grid.shape)
        todo = todo[np.lexsort((todo, *[coords[j] for j in reversed(workload_axes)]))]
    by_time = max(1, int(SECONDS_PER_BLOCK / (grid.max_requests * SECONDS_PER_REQUEST)))
    by_balance = max(1, math.ceil(todo.size / (4 * workers)))
    size = min(by_time, by_balance)
    return [todo[j : j + size] for j in range(0, todo.size, size)]


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

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """The finished points recorded so far: (indices, metrics rows)."""
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
        return records["index"], records["metrics"]

    def open(self, resume: bool) -> tuple[np.ndarray, np.ndarray]:
        """Start (or, with ``resume``, continue) the file; returns the points already done."""
        indices, rows = np.empty(0, np.int64), np.empty((0, self.n_metrics))
        if resume and self.path.exists():
            indices, rows = self.load()
        # Rewrite without any torn tail, so appends stay aligned.
        self._write_fresh(indices, rows)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        return indices, rows

    def _write_fresh(self, indices: np.ndarray, rows: np.ndarray) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(self.header)
            f.write(self._records(indices, rows))
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


Results = Iterator[tuple[np.ndarray, np.ndarray]]


def _in_process(grid: Grid, blocks: list[np.ndarray]) -> Results:
    for block in blocks:
        yield run_block(grid, block)


def _warm_up() -> None:
    """Load (or compile) every kernel, the lesson's and the serving model's, so that workers
    never compile concurrently."""
    from .kernels import POLICIES

    tiny = Config().with_values({"workload.n_requests": 2})
    serving = {"engine.max_batched_tokens": 64, "engine.kv_cache_gb": 1.0}
    for policy in POLICIES:
        simulate(tiny.with_values({"engine.policy": policy}))
        simulate(tiny.with_values({"engine.policy": policy, **serving}))


def _threads(grid: Grid, blocks: list[np.ndarray], workers: int) -> Results:
    """Run blocks on worker threads: the kernels release the GIL (``nogil``), the Python around
    them is a few percent of a point, and threads cost nothing to start (no imports, no Numba
    start-up per process)."""
    queue = deque(blocks)
    with ThreadPoolExecutor(workers, thread_name_prefix="fastsim") as pool:
        pending: set[Future] = set()
        try:
            while queue or pending:  # a few blocks in flight per worker, so Ctrl-C stops soon
                while queue and len(pending) < 2 * workers:
                    pending.add(pool.submit(run_block, grid, queue.popleft()))
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    yield future.result()
        finally:
            for future in pending:
                future.cancel()


def _dask(grid: Grid, blocks: list[np.ndarray], scheduler: str, workers: int) -> Results:
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
        shared = client.scatter(grid, broadcast=True)  # sent once, not with every block
        futures = [client.submit(run_block, shared, block, pure=False) for block in blocks]
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
    grid: Grid,
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
    table = np.full((grid.size, len(METRICS)), np.nan)
    log = Checkpoint(checkpoint, grid.base, grid.size) if checkpoint is not None else None
    finished = np.zeros(grid.size, dtype=bool)
    if log is not None:
        indices, rows = log.open(resume)
        table[indices] = rows
        finished[indices] = True
    todo = np.flatnonzero(~finished)
    blocks = make_blocks(grid, todo, workers)
    n_done = grid.size - todo.size
    if on_progress:
        on_progress(n_done, grid.size)
    if not blocks:
        results: Iterator = iter(())
    elif scheduler is not None:
        _warm_up()  # fill Numba's cache here, so local Dask workers only load it
        results = _dask(grid, blocks, scheduler, workers)
    elif workers == 1 or len(blocks) == 1 or grid.max_requests < MIN_REQUESTS_FOR_THREADS:
        results = _in_process(grid, blocks)
    else:
        _warm_up()  # compile or load once, before threads call the kernels
        results = _threads(grid, blocks, workers)
    try:
        for indices, rows in results:
            table[indices] = rows
            if log is not None:
                log.append(indices, rows)
            n_done += len(indices)
            if on_progress:
                on_progress(n_done, grid.size)
    finally:
        if log is not None:
            log.close()
    return table.reshape(*grid.shape, len(METRICS))
