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

import dataclasses
import math
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..engine import checks
from ..model import fleet as pools
from ..model.schema import Config, ConfigError
from .metrics import METRICS
from .simulation import simulate
from .targets import Stopped, Target, binding_names, failing

REPLICAS = "fleet.replicas"
MAX_REPLICAS = 64
SECONDS_PER_REQUEST = 12 * 4 * 1.6e-7  # ~12 simulations of a fleet of a few replicas
MET, NEVER_MET, CANNOT_RUN = range(3)  # a candidate's status


def for_demand(config: Config, output_tok_s: float) -> tuple[Config, float]:
    """``config`` at the request rate that carries ``output_tok_s`` output tokens a second: the
    demand over the workload's mean output, that of the requests it draws (a trace's, as
    recorded); returns the config and that mean. A closed loop (clients) has no rate to set."""
    from ..engine.traffic import of as traffic_of

    if not output_tok_s > 0 or not math.isfinite(output_tok_s):
        raise ConfigError(f"--output-tok-s {output_tok_s:g}: a demand above 0 output tokens a second")
    if config.workload.concurrency is not None or "workload.concurrency" in config.sweep:
        raise ConfigError("--output-tok-s sets workload.rate, which closed-loop clients (workload.concurrency) do not "
                          "have")
    if "workload.rate" in config.sweep:
        raise ConfigError("--output-tok-s sets workload.rate: not with a workload.rate axis")
    mean = float(traffic_of(pools.as_run(config)).output_tokens.mean())
    return config.at({"workload.rate": output_tok_s / mean}), mean


@dataclass(frozen=True)
class Answer:
    status: int  # MET, NEVER_MET (up to the limit) or CANNOT_RUN (the candidate fails its checks)
    replicas: int | None  # None unless MET
    binding: str  # the target that fails with one replica fewer ("" when one replica suffices),
    # the one that fails at the limit (NEVER_MET), or why the candidate cannot run
    metrics: dict[str, float]  # at the answer (NaN when none)
    simulations: int
    prefill_replicas: int | None = None  # a prefill pool the plan sized (fleet.prefill_replicas: auto), if MET
    prefill_binding: str = ""  # the target that fails with one prefill replica fewer ("" when one suffices)

    @property
    def says(self) -> str:
        """What binds, as tables and datasets say it."""
        if self.status == CANNOT_RUN:
            return f"cannot run: {self.binding}"
        if self.status == NEVER_MET:
            return f"never met: {self.binding}"
        if self.prefill_replicas is None:
            return self.binding
        return f"decode: {self.binding or 'one replica'}; prefill: {self.prefill_binding or 'one replica'}"


def search(config: Config, targets: list[Target], max_replicas: int = MAX_REPLICAS,
           stop: threading.Event | None = None) -> Answer:
    """The fewest replicas of ``config``'s fleet (at most ``max_replicas``) that meet every
    target. ``stop``: raise :class:`~fastsim.analysis.targets.Stopped` once set (checked
    between simulations)."""
    cache: dict[tuple[int, int | None], dict[str, float]] = {}
    nan = {k: math.nan for k in METRICS}
    try:
        checks.check(config, plan=True)  # whatever the replicas: they do not change what one engine can run
    except ConfigError as exc:
        return Answer(CANNOT_RUN, None, str(exc), nan, 0)

    def measure(replicas: int, prefill: int | None = None) -> dict[str, float]:
        if (replicas, prefill) not in cache:
            if stop is not None and stop.is_set():
                raise Stopped
            cache[replicas, prefill] = simulate(pools.with_pools(config, replicas, prefill), checked=True).metrics
        return cache[replicas, prefill]

    def fails(replicas: int, prefill: int | None = None) -> list[Target]:
        return failing(targets, measure(replicas, prefill))

    if pools.sized_by_plan(config):
        return dataclasses.replace(_both_pools(config, fails, measure, max_replicas), simulations=len(cache))
    good = fewest(lambda r: not fails(r), max_replicas)
    if good is None:
        return Answer(NEVER_MET, None, str(fails(max_replicas)[0]), nan, len(cache))
    binding = str(fails(good - 1)[0]) if good > 1 else ""
    return Answer(MET, good, binding, measure(good), len(cache))


def fewest(holds: Callable[[int], bool], most: int, least: int = 1) -> int | None:
    """The fewest n in ``least``..``most`` for which ``holds(n)``, doubling from ``least`` and then
    bisecting (so that n was seen to hold and n - 1 to fail, unless n is ``least``); None when
    even ``most`` fails."""
    bad, good = least - 1, least
    while not holds(good):
        bad = good
        if good == most:
            return None
        good = min(2 * good, most)
    while good - bad > 1:
        mid = (bad + good) // 2
        if holds(mid):
            good = mid
        else:
            bad = mid
    return good


def _both_pools(config: Config, fails, measure, most: int) -> Answer:
    """The cheapest (decode, prefill) replica pair that meets every target, each pool at most
    ``most``: the fewest prefill replicas that meet them with ``most`` decode replicas, then for
    each prefill count from there the fewest decode replicas, while a larger prefill pool can
    still be cheaper (its price with the fewest decode replicas any pool needs, those of the
    largest prefill pool, is below the best found). Pairs are ranked by price per hour, then
    GPUs. The pair meets the targets; the bindings name what fails with one decode, or one
    prefill, replica fewer ("" when there is one, or when one fewer still meets them)."""
    nan = {k: math.nan for k in METRICS}
    first = fewest(lambda p: not fails(most, p), most)
    if first is None:
        return Answer(NEVER_MET, None, str(fails(most, most)[0]), nan, 0)

    def cost(replicas: int, prefill: int) -> tuple[float, int]:
        fleet = pools.with_pools(config, replicas, prefill)
        usd = pools.usd_per_hour(fleet)
        return (usd if math.isfinite(usd) else math.inf, pools.gpus(fleet))

    floor = fewest(lambda r: not fails(r, most), most) or 1  # the fewest decode replicas any prefill pool needs
    best: tuple[int, int] | None = None
    for prefill in range(first, most + 1):
        if best is not None and cost(floor, prefill) >= cost(*best):
            break
        replicas = fewest(lambda r: not fails(r, prefill), most, floor)
        if replicas is not None and (best is None or cost(replicas, prefill) < cost(*best)):
            best = (replicas, prefill)
    if best is None:  # only where more replicas made it worse: no pair below the limits holds
        return Answer(NEVER_MET, None, str(fails(most, first)[0]), nan, 0)
    replicas, prefill = best

    def fewer(r: int, p: int) -> str:
        missed = fails(r, p) if r and p else []
        return str(missed[0]) if missed else ""

    return Answer(MET, replicas, fewer(replicas - 1, prefill), measure(replicas, prefill), 0, prefill,
                  fewer(replicas, prefill - 1))


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
        self.columns = ["replicas", "status", "binding", "simulations", "prefill_replicas", "prefill_binding",
                        *METRICS]
        self.name = f"plan up to {max_replicas} replicas: " + "; ".join(map(str, targets))

    def row(self, a: Answer) -> list[float]:
        names = binding_names(self.targets)

        def index(binding: str) -> int:
            return names.index(binding) if binding in names else -1

        return [math.nan if a.replicas is None else a.replicas, a.status, index(a.binding), a.simulations,
                math.nan if a.prefill_replicas is None else a.prefill_replicas, index(a.prefill_binding),
                *a.metrics.values()]

    def answers(self, table: np.ndarray, config_of: Callable[[int], Config]) -> list[Answer]:
        """The answers of a table of rows (any shape ending in the columns), in C order;
        ``config_of(i)``: the i-th candidate's config. Why a candidate cannot run is not a
        number: the check that refused it says it again."""
        names = binding_names(self.targets)
        out = []
        for i, row in enumerate(table.reshape(-1, len(self.columns))):
            status = int(row[1])
            binding = names[int(row[2])] if row[2] >= 0 else ""
            if status == CANNOT_RUN:
                try:
                    checks.check(config_of(i), plan=True)
                except ConfigError as exc:
                    binding = str(exc)
            metrics = dict(zip(METRICS, row[6:].tolist()))
            prefill = None if math.isnan(row[4]) else int(row[4])
            out.append(Answer(status, int(row[0]) if status == MET else None, binding, metrics, int(row[3]), prefill,
                              names[int(row[5])] if row[5] >= 0 else ""))
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
