"""Fitting the step-cost model's calibration to measured runs.

The free values are keys of the ``calibration:`` section (by default all of them), each bounded
to a physical range. Every measured run is simulated with the same values (one calibration for
every run, never one per run), and the fit minimises the squared log ratios of simulated to
measured metrics over every metric of every run: least squares on log errors, made robust beyond about
10 %, so that one measurement the model cannot reproduce (a mean set by a few stalls, whose 99th
percentile is many times the mean) does not pull every other run off. Robust in two stages: first
soft L1 (a larger error counts linearly, not squared), whose cost still slopes towards the basin
from a far start; then, from there, Cauchy's (a larger error counts ever less: log(1 + e^2)),
under which such a run no longer trades the others' errors for its own.

The search starts from the config's own calibration and refines it. The simulated metrics are
not smooth in the values (an event that moves past another one step changes a mean in a small
jump), which stalls gradient methods on finite differences, so it searches without derivatives
(scipy's bounded Powell method). Deterministic: the same files and config give the same fit, and
so does a simulator whose times differ by rounding (see DIGITS).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..engine import traffic as traffic_of
from ..engine.traffic import Traffic
from ..model.schema import Calibration, ConfigError
from .measured import Measured
from .simulation import simulate

# key: (low, high, scale): the physical range of each value, and its typical size (the fit
# moves every value in units of its scale)
BOUNDS: dict[str, tuple[float, float, float]] = {
    "compute_efficiency": (0.05, 1.0, 0.1),
    "bandwidth_efficiency": (0.05, 1.0, 0.1),
    "step_overhead_ms": (0.0, 50.0, 1.0),
    "layer_overhead_us": (0.0, 500.0, 10.0),
    "moe_layer_overhead_us": (0.0, 500.0, 10.0),
    "api_overhead_ms": (0.0, 500.0, 10.0),
    "stall_rate_hz": (0.0, 100.0, 1.0),
    "stall_median_ms": (0.0, 500.0, 1.0),
    "stall_sigma": (0.0, 3.0, 0.25),
}
assert set(BOUNDS) == set(Calibration.model_fields) - {"fitted_to"}
JITTER = ("stall_rate_hz", "stall_median_ms", "stall_sigma")  # fitted by default when tails were measured
JITTER_START = {"stall_rate_hz": 1.0, "stall_median_ms": 5.0, "stall_sigma": 1.0}  # a start for them if off
TAILS = re.compile(r"_p(9\d|99)_s$")  # a measured 90th-99th percentile
MISS = 5.0  # the residual of a metric the simulation cannot give (NaN), a factor of e**5 off
ROUNDS = 4  # rounds of search at most, each from where the last stopped
# Residuals are rounded to this many significant digits: the search compares costs that differ
# in their last digits (the objective is flat and piecewise), so without it a rounding-level
# change anywhere in the simulation (1e-13 of a time) sent it to another local minimum.
DIGITS = 6
ROBUST = 0.1  # log errors up to about this size (10 %) count squared; larger ones linearly (soft L1),
# then ever less (Cauchy)
LOSSES = ("soft_l1", "cauchy")  # the search's stages
KEEP = 0.01  # a fit replaces the start only if its cost is lower by more than this share (1 %: the
# cost is rough at that level, jumping as events cross steps, and flat along ridges)
FAR = 0.5  # a run whose error after the fit is beyond this (50 %) is one the model does not reproduce


@dataclass(frozen=True)
class Fit:
    keys: list[str]  # the dotted keys fitted, calibration.*
    before: dict[str, float]  # their values in the config
    after: dict[str, float]  # fitted
    runs: list[Measured]
    predicted_before: list[dict[str, float]]  # per run, the metrics it measured, simulated
    predicted_after: list[dict[str, float]]
    cost: float  # the robust sum of squared log errors after the fit (see ROBUST)
    evaluations: int
    overloaded: list[bool]  # per run, whether the fitted engine falls behind its arrivals
    @property
    def warnings(self) -> list[str]:
        """What makes this fit doubtful, a line each: fewer measurements than fitted values, a
        value that ended at its bound, a run the fitted model still misses by more than 50 %."""
        out = []
        measurements = sum(len(run.metrics) for run in self.runs)
        if measurements < len(self.keys):
            out.append(f"{measurements} measurement{'s' * (measurements != 1)} for {len(self.keys)} fitted values: "
                       "the fit is underdetermined; fit fewer (--fit) or measure more runs")
        for key, value in self.after.items():
            low, high, _ = BOUNDS[key.removeprefix("calibration.")]
            if (value <= low or value >= high) and self.before[key] != value:
                out.append(f"{key} ended at its bound ({value:g}): the data asks for a value outside its "
                           f"physical range [{low:g}, {high:g}], or for a term the model lacks")
        for run, over in zip(self.runs, self.overloaded):
            if over:
                out.append(f"{run.source}: overloaded: the fitted engine falls behind the arrivals at this rate, so its "
                           "latencies grow with the run's length (and so may the measured ones)")
        for run, got in zip(self.runs, self.predicted_after):
            for name, measured in run.metrics.items():
                error = got[name] / measured - 1
                if not abs(error) <= FAR:
                    out.append(f"{run.source}: {name} is {error:+.0%} off after the fit (measured {measured:.4g}, "
                               f"simulated {got[name]:.4g}): the model does not reproduce this run")
        return out

    def errors(self, predicted: list[dict[str, float]]) -> dict[str, list[float]]:
        """Per metric, the relative error of every run that measured it (simulated / measured - 1)."""
        out: dict[str, list[float]] = {}
        for run, got in zip(self.runs, predicted):
            for name, value in run.metrics.items():
                out.setdefault(name, []).append(got[name] / value - 1)
        return out


def fit_keys(names: list[str] | None, runs: list[Measured] = ()) -> list[str]:
    """The calibration keys to fit (dotted or bare names; default every one, the jitter's only
    when some run measured a tail, the MoE layers' overhead only when some run's model routes to
    experts: the runs say nothing about the others)."""
    if not names:
        tails = any(TAILS.search(name) for run in runs for name in run.metrics)
        moe = any(run.config.model.experts for run in runs)
        return [f"calibration.{k}" for k in BOUNDS
                if (tails or k not in JITTER) and (moe or k != "moe_layer_overhead_us")]
    keys = []
    for name in names:
        bare = name.strip().removeprefix("calibration.")
        if bare not in BOUNDS:
            raise ConfigError(f"--fit {name}: not a calibration key (valid: {', '.join(BOUNDS)})")
        keys.append(f"calibration.{bare}")
    return keys


class _Runs:
    """The measured runs, their traffic drawn once, simulated with given calibration values."""

    def __init__(self, runs: list[Measured], on_evaluation: Callable[[int], None] | None = None):
        self.runs = runs
        self.on_evaluation = on_evaluation  # told the count after each evaluation (progress)
        self.traffic: list[Traffic] = [run.traffic or traffic_of.of(run.config) for run in runs]
        self.itl = [any(name.startswith("itl_") for name in run.metrics) for run in runs]  # (the costliest metric)
        self.evaluations = 0

    def results(self, values: dict[str, float]) -> list:
        """Every run simulated with ``values`` (its ITL quantiles only if it measured them)."""
        self.evaluations += 1
        results = [simulate(run.config.at(values), traffic, checked=True, with_itl=itl)
                   for run, traffic, itl in zip(self.runs, self.traffic, self.itl)]
        if self.on_evaluation is not None:
            self.on_evaluation(self.evaluations)
        return results

    def predict(self, values: dict[str, float], results: list | None = None) -> list[dict[str, float]]:
        """Per run, the metrics it measured, simulated with ``values`` (or read from their ``results``)."""
        results = self.results(values) if results is None else results
        return [{name: result.metrics[name] for name in run.metrics} for run, result in zip(self.runs, results)]

    def residuals(self, values: dict[str, float], predicted: list[dict[str, float]] | None = None) -> np.ndarray:
        """Log errors of every measured metric, simulated with ``values`` (or read from ``predicted``)."""
        res = []
        for run, got in zip(self.runs, self.predict(values) if predicted is None else predicted):
            for name, measured in run.metrics.items():
                value = got[name]
                res.append(math.log(value / measured) if value > 0 and math.isfinite(value) else MISS)
        return np.array([float(f"{r:.{DIGITS}g}") for r in res])


def _search(sims: _Runs, fixed: dict[str, float], keys: list[str], start: dict[str, float],
            loss: str = "soft_l1") -> tuple[dict, float]:
    """(values of ``keys``, cost): the local search from ``start``, the other values ``fixed``,
    under ``loss`` (one of LOSSES)."""
    from scipy.optimize import least_squares, minimize

    names = [k.removeprefix("calibration.") for k in keys]
    lo = np.array([BOUNDS[n][0] for n in names])
    hi = np.array([BOUNDS[n][1] for n in names])
    scale = np.array([BOUNDS[n][2] for n in names])

    def values(u: np.ndarray) -> dict[str, float]:
        return {**fixed, **{k: float(v) for k, v in zip(keys, np.clip(u * scale, lo, hi))}}

    def cost(u: np.ndarray) -> float:
        return _cost(sims.residuals(values(u)), loss)

    best = np.clip(np.array([start[k] for k in keys]), lo, hi) / scale
    best_cost = cost(best)
    bounds = (lo / scale, hi / scale)
    for _ in range(ROUNDS):  # Powell, then trust-region steps over coarse differences, while they help
        start_cost = best_cost
        result = minimize(cost, best, method="Powell", bounds=list(zip(*bounds)),
                          options={"xtol": 1e-3, "ftol": 1e-6, "maxfev": 60 * len(keys) + 60})
        if result.fun < best_cost:
            best, best_cost = result.x, float(result.fun)
        squares = least_squares(lambda u: sims.residuals(values(u)), best, bounds=bounds, loss=loss,
                                f_scale=ROBUST, diff_step=0.05, max_nfev=20 * len(keys))
        squares_cost = cost(squares.x)
        if squares_cost < best_cost:
            best, best_cost = squares.x, squares_cost
        if not best_cost < start_cost * (1 - 1e-3):
            break
    return values(best), best_cost


def _cost(residuals: np.ndarray, loss: str = "cauchy") -> float:
    """The robust sum of squared log errors (beyond ROBUST, soft L1's or Cauchy's): as scipy's
    least_squares weighs them with ``f_scale`` ROBUST."""
    z = (residuals / ROBUST) ** 2
    return float((ROBUST ** 2 * (2 * (np.sqrt(1 + z) - 1) if loss == "soft_l1" else np.log1p(z))).sum())


# Starts for the jitter's values (rate, median ms, sigma): their cost has several basins (many
# short stalls or a few long ones give like tails), so the search starts from each of these and
# from where it stands, and goes on from the best few.
JITTER_GRID = [(rate, median, sigma) for rate in (1.0, 3.0, 10.0) for median in (3.0, 10.0, 30.0)
               for sigma in (0.5, 1.0)]


def fit(runs: list[Measured], keys: list[str], on_evaluation: Callable[[int], None] | None = None) -> Fit:
    """The calibration that best predicts ``runs`` (see the module docstring). With the jitter's
    values among ``keys``, twice: the engine's values with the jitter fixed, then the jitter's
    from the best three of a grid of starts with the engine's fixed; then all of them together.
    ``on_evaluation(count)`` is told each evaluation's count as it ends (every run simulated once)."""
    if not runs:
        raise ConfigError("calibrate needs at least one measured run")
    start = runs[0].config.calibration
    before = {k: float(getattr(start, k.removeprefix("calibration."))) for k in keys}
    sims = _Runs(runs, on_evaluation)
    current = dict(before)
    jitter = [k for k in keys if k.removeprefix("calibration.") in JITTER]
    engine = [k for k in keys if k not in jitter]
    if jitter and not start.stall_rate_hz:  # jitter off: the search starts from a few small stalls a second
        current.update({k: JITTER_START[k.removeprefix("calibration.")] for k in jitter})
    names = [k.removeprefix("calibration.") for k in jitter]
    for _ in range(2 if jitter else 0):
        if engine:
            current, _ = _search(sims, current, engine, current)
        grid = [dict(zip(JITTER, point)) for point in JITTER_GRID]
        starts = [current] + [{**current, **{k: point[n] for k, n in zip(jitter, names)}} for point in grid]
        ranked = sorted(starts, key=lambda v: _cost(sims.residuals(v), "soft_l1"))[:3]
        current = min((_search(sims, current, jitter, v) for v in ranked), key=lambda found: found[1])[0]
    for loss in LOSSES:
        current, cost = _search(sims, {}, keys, current, loss)
    started = sims.results(before)
    predicted_before = sims.predict(before, started)
    kept = _cost(sims.residuals(before, predicted_before))  # the start stays unless the search beats it (KEEP):
    after, cost = (before, kept) if kept <= cost * (1 + KEEP) else (current, cost)  # else a refit wanders the ridges
    fitted = started if after is before else sims.results(after)
    return Fit(keys, before, after, runs, predicted_before, sims.predict(after, fitted), cost, sims.evaluations,
               [result.overloaded for result in fitted])


def calibration_yaml(fit: Fit) -> str:
    """The fitted values as a YAML ``calibration:`` section (the config's other values kept)."""
    import yaml

    section = {**fit.runs[0].config.calibration.model_dump(), **{k.removeprefix("calibration."): round(v, 6)
                                                                  for k, v in fit.after.items()}}
    if section["fitted_to"] is None:  # what it was fitted to, unless the config says (engine and version)
        files = sorted({run.source.split(" row ")[0] for run in fit.runs})
        section["fitted_to"] = f"{', '.join(files)} ({len(fit.runs)} runs)"
    header = ("# fitted by fastsim calibrate: robust least squares on log errors over "
              f"{sum(len(r.metrics) for r in fit.runs)} measurements of {len(fit.runs)} runs\n")
    return header + yaml.safe_dump({"calibration": section}, sort_keys=False)
