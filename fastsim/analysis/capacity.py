"""Capacity: the highest request rate at which a setting still meets its targets.

For one setting (a config), the rate is searched: doubled (or halved) from the config's until the
targets fail (or hold), then bisected geometrically until the highest rate that holds and the
lowest that fails are within 1 %. Every simulation of a setting draws the same traffic (one seed:
with the numpy stream, a rate only rescales the same gaps), so the answer is a deterministic
function of the config. :class:`CapacitySearch` is the search as a sweep task: a row of numbers
per setting, so that settings run in parallel and are checkpointed like sweep points, read back
as :class:`Answer` objects.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np

from ..engine import checks
from ..engine.trace import native_rate
from ..model.schema import Config
from .metrics import METRICS
from .simulation import simulate
from .targets import Stopped, Target, binding_names, failing

RATE = "workload.rate"
TOLERANCE = 0.01  # the highest passing and lowest failing rate end within 1 % of each other
DIGITS = 4  # the answer is rounded down to this many significant digits when that rate holds too
MIN_RATE, MAX_RATE = 1e-3, 1e5  # requests/s: the search never leaves these
STATUSES = ("found", "lowest rate fails", "bound not reached")
SECONDS_PER_REQUEST = 20 * 1.6e-7  # a search runs ~10-20 simulations of the setting


@dataclass(frozen=True)
class Answer:
    max_rate: float  # NaN when even the lowest rate fails
    status: str  # "found", "lowest rate fails", "bound not reached"
    binding: str  # the target that fails just above max_rate (or why there is none)
    metrics: dict[str, float]  # at max_rate (NaN when none)
    simulations: int


def search(config: Config, targets: list[Target], stop: threading.Event | None = None) -> Answer:
    """The highest ``workload.rate`` at which ``config`` meets every target (to 1 %). ``stop``:
    raise :class:`~fastsim.analysis.targets.Stopped` once set (checked between simulations)."""
    runs = 0
    cache: dict[float, dict[str, float]] = {}
    checks.check(config)

    def measure(rate: float) -> dict[str, float]:
        nonlocal runs
        if rate not in cache:
            if stop is not None and stop.is_set():
                raise Stopped
            runs += 1
            cache[rate] = simulate(config.at({RATE: rate}), checked=True).metrics
        return cache[rate]

    def fails(rate: float) -> list[Target]:
        return failing(targets, measure(rate))

    start = config.workload.rate
    if start is None:  # a trace at its recorded rate
        start = native_rate(config.workload)
    good, bad = None, None
    rate = min(max(start, MIN_RATE), MAX_RATE)
    if fails(rate):
        bad = rate
        while good is None:
            rate /= 2
            if rate < MIN_RATE:
                nan = {k: math.nan for k in METRICS}
                status = "lowest rate fails"
                return Answer(math.nan, status, binding_of(status, math.nan, str(fails(bad)[0])), nan, runs)
            if fails(rate):
                bad = rate
            else:
                good = rate
    else:
        good = rate
        while bad is None:
            rate *= 2
            if rate > MAX_RATE:
                status = "bound not reached"
                return Answer(good, status, binding_of(status, good, ""), measure(good), runs)
            if fails(rate):
                bad = rate
            else:
                good = rate
    while bad > good * (1 + TOLERANCE):
        mid = math.sqrt(good * bad)
        if fails(mid):
            bad = mid
        else:
            good = mid
    for digits in range(DIGITS, DIGITS + 6):  # a rate a planner can type, the shortest that holds too
        short = round_down(good, digits)  # (load is not monotone to the last digit: each is simulated)
        if short == good:
            break
        if not fails(short):
            good = short
            break
    return Answer(good, "found", str(fails(bad)[0]), measure(good), runs)


def round_down(rate: float, digits: int = DIGITS) -> float:
    """``rate`` rounded down to ``digits`` significant digits."""
    scale = 10.0 ** (digits - 1 - math.floor(math.log10(rate)))
    return math.floor(rate * scale * (1 + 1e-12)) / scale


def rate_text(rate: float) -> str:
    """A found rate as tables print it: exactly the value that was simulated and held (in as few
    digits as say it), so that running it meets the targets."""
    return next((text for d in range(DIGITS, 18) if float(text := f"{rate:.{d}g}") == rate), repr(rate))


def binding_of(status: str, max_rate: float, target: str) -> str:
    """What binds a setting's capacity, as the tables and datasets say it."""
    if status == "lowest rate fails":
        return f"fails at {MIN_RATE:g}/s: {target}"
    if status == "bound not reached":
        return f"holds at {max_rate:g}/s, the search bound"
    return target


class CapacitySearch:
    """:func:`search` as a sweep task. A sweep task's rows are numbers (they are checkpointed as
    such): :meth:`row` writes an :class:`Answer` as one and :meth:`answers` reads them back, the
    one place that knows the columns."""

    seconds_per_request = SECONDS_PER_REQUEST

    def __init__(self, targets: list[Target]):
        self.targets = targets
        self.columns = ["max_rate_rps", "status", "binding", "simulations", *METRICS]
        self.name = "capacity " + "; ".join(map(str, targets))

    def row(self, a: Answer) -> list[float]:
        names = binding_names(self.targets)
        binding = next((j for j, name in enumerate(names) if a.binding.endswith(name)), -1)
        return [a.max_rate, STATUSES.index(a.status), binding, a.simulations, *a.metrics.values()]

    def answers(self, table: np.ndarray) -> list[Answer]:
        """The answers of a table of rows (any shape ending in the columns), in C order."""
        names = binding_names(self.targets)
        out = []
        for row in table.reshape(-1, len(self.columns)):
            status = STATUSES[int(row[1])]
            binding = binding_of(status, float(row[0]), names[int(row[2])] if row[2] >= 0 else "")
            out.append(Answer(float(row[0]), status, binding, dict(zip(METRICS, row[4:].tolist())), int(row[3])))
        return out

    def __call__(self, configs: list[Config], stop: threading.Event | None = None) -> np.ndarray:
        return np.array([self.row(search(config, self.targets, stop)) for config in configs], dtype=float).reshape(
            len(configs), len(self.columns))
