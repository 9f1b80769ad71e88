"""Capacity: the highest request rate at which a setting still meets its targets.

A target bounds a metric (``ttft_p99_s<=0.5``, ``slo_attainment>=0.9``). For every point of the
config's grid with the rate axis removed, the rate is searched: doubled (or halved) from a start
until the targets fail (or hold), then bisected geometrically until the highest rate that holds
and the lowest that fails are within 1 %. Every simulation of a setting draws the same traffic
(one seed: with the numpy stream, a rate only rescales the same gaps), so the answer is a
deterministic function of the config. Settings are searched in parallel like sweep points.
"""

from __future__ import annotations

import math
import operator
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .config import Config, ConfigError
from .grid import Grid, build_grid
from .metrics import METRICS
from .simulation import simulate

RATE = "workload.rate"
TOLERANCE = 0.01  # the highest passing and lowest failing rate end within 1 % of each other
MIN_RATE, MAX_RATE = 1e-3, 1e5  # requests/s: the search never leaves these


@dataclass(frozen=True)
class Target:
    metric: str
    op: str  # "<=" or ">="
    bound: float

    def holds(self, metrics: dict[str, float]) -> bool:
        value = metrics[self.metric]
        return not math.isnan(value) and {"<=": operator.le, ">=": operator.ge}[self.op](value, self.bound)

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"


def parse_target(text: str) -> Target:
    """``METRIC<=VALUE`` or ``METRIC>=VALUE``; errors name ``--target``."""
    m = re.fullmatch(r"\s*(\w+)\s*(<=|>=)\s*([-+0-9.eE]+)\s*", text)
    if not m:
        raise ConfigError(f"--target {text!r}: expected METRIC<=VALUE or METRIC>=VALUE, e.g. ttft_p99_s<=0.5")
    metric, op, value = m.groups()
    if metric not in METRICS:
        raise ConfigError(f"--target {text!r}: unknown metric {metric!r} (valid: {', '.join(METRICS)})")
    try:
        return Target(metric, op, float(value))
    except ValueError:
        raise ConfigError(f"--target {text!r}: {value!r} is not a number") from None


def default_targets(config: Config, attainment: float | None) -> list[Target]:
    """With no --target: the config's SLOs met by ``attainment`` (default 90 %) of requests."""
    if all(v is None for v in config.slo.model_dump().values()):
        raise ConfigError("capacity needs a target: --target METRIC<=VALUE, or an slo: section in the config")
    return [Target("slo_attainment", ">=", 0.9 if attainment is None else attainment)]


@dataclass(frozen=True)
class Answer:
    max_rate: float  # NaN when even the lowest rate fails
    status: str  # "found", "lowest rate fails", "bound not reached"
    binding: str  # the target that fails just above max_rate (or the status)
    metrics: dict[str, float]  # at max_rate (NaN when none)
    simulations: int


def search(config: Config, targets: list[Target]) -> Answer:
    """The highest ``workload.rate`` at which ``config`` meets every target (to 1 %)."""
    runs = 0
    cache: dict[float, dict[str, float]] = {}

    def measure(rate: float) -> dict[str, float]:
        nonlocal runs
        if rate not in cache:
            runs += 1
            cache[rate] = simulate(config.at({RATE: rate})).metrics
        return cache[rate]

    def failing(rate: float) -> list[Target]:
        m = measure(rate)
        return [t for t in targets if not t.holds(m)]

    start = config.workload.rate
    if start is None:  # a trace at its recorded rate
        from .trace import native_rate

        start = native_rate(config.workload)
    good, bad = None, None
    rate = min(max(start, MIN_RATE), MAX_RATE)
    if failing(rate):
        bad = rate
        while good is None:
            rate /= 2
            if rate < MIN_RATE:
                nan = {k: math.nan for k in METRICS}
                return Answer(math.nan, "lowest rate fails", f"fails at {MIN_RATE:g}/s: {failing(bad)[0]}", nan, runs)
            if failing(rate):
                bad = rate
            else:
                good = rate
    else:
        good = rate
        while bad is None:
            rate *= 2
            if rate > MAX_RATE:
                return Answer(good, "bound not reached", f"holds at {good:g}/s, the search bound", measure(good), runs)
            if failing(rate):
                bad = rate
            else:
                good = rate
    while bad > good * (1 + TOLERANCE):
        mid = math.sqrt(good * bad)
        if failing(mid):
            bad = mid
        else:
            good = mid
    return Answer(good, "found", str(failing(bad)[0]), measure(good), runs)


@dataclass(frozen=True)
class Capacity:
    grid: Grid  # the config's grid without its rate axis
    answers: list[Answer]  # one per grid point, C order

    @property
    def simulations(self) -> int:
        return sum(a.simulations for a in self.answers)


def _search_block(grid: Grid, indices: list[int], targets: list[Target]) -> list[tuple[int, Answer]]:
    return [(i, search(grid.config(i), targets)) for i in indices]


def settings(config: Config) -> Grid:
    """The settings a capacity search answers: ``config``'s grid with its rate axis removed."""
    return build_grid(config.model_copy(update={"sweep": {k: v for k, v in config.sweep.items() if k != RATE}}))


def run(grid: Grid, targets: list[Target], workers: int | None = None, scheduler: str | None = None,
        on_progress: Callable[[int, int], None] | None = None) -> Capacity:
    """Search every setting of ``grid`` (see :func:`settings`)."""
    workers = workers or os.cpu_count() or 1
    answers: list[Answer | None] = [None] * grid.size
    blocks = [list(range(i, grid.size, workers * 2)) for i in range(min(grid.size, workers * 2))]
    done = 0
    if on_progress:
        on_progress(0, grid.size)
    if scheduler is not None:
        from distributed import Client, LocalCluster, as_completed

        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, dashboard_address=None) if scheduler == "local" else None
        try:
            client = Client(cluster if cluster is not None else scheduler, timeout="10s")
        except (OSError, TimeoutError) as exc:
            raise ConfigError(f"--scheduler {scheduler}: cannot reach a Dask scheduler ({exc})") from None
        try:
            shared = client.scatter(grid, broadcast=True)
            futures = [client.submit(_search_block, shared, block, targets, pure=False) for block in blocks]
            results = (f.result() for f in as_completed(futures))
            for found in results:
                for i, answer in found:
                    answers[i] = answer
                done += len(found)
                if on_progress:
                    on_progress(done, grid.size)
        finally:
            client.close()
            if cluster is not None:
                cluster.close()
    else:
        with ThreadPoolExecutor(workers) as pool:
            for found in pool.map(lambda b: _search_block(grid, b, targets), blocks):
                for i, answer in found:
                    answers[i] = answer
                done += len(found)
                if on_progress:
                    on_progress(done, grid.size)
    return Capacity(grid, answers)  # type: ignore[arg-type]


def table(result: Capacity) -> np.ndarray:
    """The metrics at each setting's capacity, shape (*axes, len(METRICS)) (NaN where none)."""
    rows = np.array([[a.metrics[k] for k in METRICS] for a in result.answers], dtype=float)
    return rows.reshape(*result.grid.shape, len(METRICS))
