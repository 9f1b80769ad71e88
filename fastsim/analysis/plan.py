"""The planner's question: the cheapest fleet that meets the targets (docs/planning.md,
"Plan").

For one candidate setting (a config), :func:`search` finds the fewest ``fleet.replicas`` (up to a
limit) whose fleet meets every target at the workload's traffic: doubling from one replica until
the targets hold, then bisecting. It is exact about its answer: it has simulated the count it
returns (the targets hold) and one fewer (they fail), so the answer needs no monotonicity beyond
the bracket it reports. :class:`PlanSearch` is the search as a sweep task, one row per candidate,
and :func:`ranking` orders candidates by price per hour, then GPUs, then TTFT p99.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..engine import checks
from ..model.schema import Config, ConfigError
from .metrics import METRICS
from .simulation import simulate
from .targets import Stopped, Target, failing

REPLICAS = "fleet.replicas"
MAX_REPLICAS = 64
SECONDS_PER_REQUEST = 12 * 4 * 1.6e-7  # ~12 simulations of a fleet of a few replicas
MET, NEVER_MET, CANNOT_RUN = range(3)  # a candidate's status


@dataclass(frozen=True)
class Answer:
    status: int  # MET, NEVER_MET (up to the limit) or CANNOT_RUN (the candidate fails its checks)
    replicas: int | None  # None unless MET
    binding: str  # the target that fails with one replica fewer ("" when one replica suffices),
    # the one that fails at the limit (NEVER_MET), or why the candidate cannot run
    metrics: dict[str, float]  # at the answer (NaN when none)
    simulations: int

    @property
    def says(self) -> str:
        """What binds, as tables and datasets say it."""
        if self.status == CANNOT_RUN:
            return f"cannot run: {self.binding}"
        return f"never met: {self.binding}" if self.status == NEVER_MET else self.binding


def search(config: Config, targets: list[Target], max_replicas: int = MAX_REPLICAS,
           stop: threading.Event | None = None) -> Answer:
    """The fewest replicas of ``config``'s fleet (at most ``max_replicas``) that meet every
    target. ``stop``: raise :class:`~fastsim.analysis.targets.Stopped` once set (checked
    between simulations)."""
    cache: dict[int, dict[str, float]] = {}
    nan = {k: math.nan for k in METRICS}
    try:
        checks.check(config)  # whatever the replicas: they do not change what one engine can run
    except ConfigError as exc:
        return Answer(CANNOT_RUN, None, str(exc), nan, 0)

    def measure(replicas: int) -> dict[str, float]:
        if replicas not in cache:
            if stop is not None and stop.is_set():
                raise Stopped
            cache[replicas] = simulate(config.at({REPLICAS: replicas}), checked=True).metrics
        return cache[replicas]

    bad, good = 0, 1
    while failing(targets, measure(good)):
        bad = good
        if good == max_replicas:
            return Answer(NEVER_MET, None, str(failing(targets, measure(good))[0]), nan, len(cache))
        good = min(2 * good, max_replicas)
    while good - bad > 1:
        mid = (bad + good) // 2
        if failing(targets, measure(mid)):
            bad = mid
        else:
            good = mid
    binding = str(failing(targets, measure(bad))[0]) if bad else ""
    return Answer(MET, good, binding, measure(good), len(cache))


class PlanSearch:
    """:func:`search` as a sweep task. A sweep task's rows are numbers (they are checkpointed as
    such): :meth:`row` writes an :class:`Answer` as one (``replicas`` NaN unless the targets hold)
    and :meth:`answers` reads them back, the one place that knows the columns."""

    seconds_per_request = SECONDS_PER_REQUEST

    def __init__(self, targets: list[Target], max_replicas: int = MAX_REPLICAS):
        if max_replicas < 1:
            raise ConfigError(f"--max-replicas must be at least 1 (got {max_replicas})")
        self.targets = targets
        self.max_replicas = max_replicas
        self.columns = ["replicas", "status", "binding", "simulations", *METRICS]
        self.name = f"plan up to {max_replicas} replicas: " + "; ".join(map(str, targets))

    def row(self, a: Answer) -> list[float]:
        names = [str(t) for t in self.targets]
        return [math.nan if a.replicas is None else a.replicas, a.status,
                names.index(a.binding) if a.binding in names else -1, a.simulations, *a.metrics.values()]

    def answers(self, table: np.ndarray, config_of: Callable[[int], Config]) -> list[Answer]:
        """The answers of a table of rows (any shape ending in the columns), in C order;
        ``config_of(i)``: the i-th candidate's config. Why a candidate cannot run is not a
        number: the check that refused it says it again."""
        names = [str(t) for t in self.targets]
        out = []
        for i, row in enumerate(table.reshape(-1, len(self.columns))):
            status = int(row[1])
            binding = names[int(row[2])] if row[2] >= 0 else ""
            if status == CANNOT_RUN:
                try:
                    checks.check(config_of(i))
                except ConfigError as exc:
                    binding = str(exc)
            metrics = dict(zip(METRICS, row[4:].tolist()))
            out.append(Answer(status, int(row[0]) if status == MET else None, binding, metrics, int(row[3])))
        return out

    def __call__(self, configs: list[Config], stop: threading.Event | None = None) -> np.ndarray:
        rows = [self.row(search(config, self.targets, self.max_replicas, stop)) for config in configs]
        return np.array(rows, dtype=float).reshape(len(configs), len(self.columns))


def ranking(answers: list[Answer]) -> np.ndarray:
    """Indices of ``answers`` cheapest first: by USD per hour, then GPUs, then TTFT p99; a
    candidate without a price after those with one, and one that never meets the targets after
    those (then one that cannot run)."""
    def column(name: str) -> np.ndarray:
        return np.array([a.metrics[name] for a in answers], dtype=float)

    status = np.array([a.status for a in answers])
    usd, gpus, ttft = column("usd_per_hour"), column("gpus"), column("ttft_p99_s")
    return np.lexsort((np.nan_to_num(ttft, nan=np.inf), np.nan_to_num(gpus, nan=np.inf),
                       np.nan_to_num(usd, nan=np.inf), np.isnan(usd), status))
