"""Fitting the step-cost model's calibration to measured runs.

The free values are keys of the ``calibration:`` section (by default all of them), each bounded
to a physical range. Every measured run is simulated with the same values (one calibration for
every run, never one per run), and the fit minimises the squared log ratios of simulated to
measured metrics over every metric of every run: least squares on log errors, made robust (soft
L1) beyond about 10 %: a larger error counts linearly, not squared, so that one measurement the
model cannot reproduce (a mean set by a few stalls, whose 99th percentile is many times the mean)
does not pull every other run off.

The search starts from the config's own calibration and refines it. The simulated metrics are
not smooth in the values (an event that moves past another one step changes a mean in a small
jump), which stalls gradient methods on finite differences, so it searches without derivatives
(scipy's bounded Powell method). Deterministic: the same files and config give the same fit, and
so does a simulator whose times differ by rounding (see DIGITS).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..engine.traffic import Traffic, generate
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
    "api_overhead_ms": (0.0, 500.0, 10.0),
}
assert set(BOUNDS) == set(Calibration.model_fields)
MISS = 5.0  # the residual of a metric the simulation cannot give (NaN), a factor of e**5 off
ROUNDS = 4  # rounds of search at most, each from where the last stopped
# Residuals are rounded to this many significant digits: the search compares costs that differ
# in their last digits (the objective is flat and piecewise), so without it a rounding-level
# change anywhere in the simulation (1e-13 of a time) sent it to another local minimum.
DIGITS = 6
ROBUST = 0.1  # soft L1: log errors up to about this size (10 %) count squared, larger ones linearly
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


def fit_keys(names: list[str] | None) -> list[str]:
    """The calibration keys to fit (dotted or bare names; default every one)."""
    if not names:
        return [f"calibration.{k}" for k in BOUNDS]
    keys = []
    for name in names:
        bare = name.strip().removeprefix("calibration.")
        if bare not in BOUNDS:
            raise ConfigError(f"--fit {name}: not a calibration key (valid: {', '.join(BOUNDS)})")
        keys.append(f"calibration.{bare}")
    return keys


class _Runs:
    """The measured runs, their traffic drawn once, simulated with given calibration values."""

    def __init__(self, runs: list[Measured]):
        self.runs = runs
        self.traffic: list[Traffic] = [run.traffic or generate(run.config.workload) for run in runs]
        self.evaluations = 0

    def predict(self, values: dict[str, float]) -> list[dict[str, float]]:
        self.evaluations += 1
        out = []
        for run, traffic in zip(self.runs, self.traffic):
            metrics = simulate(run.config.at(values), traffic, checked=True).metrics
            out.append({name: metrics[name] for name in run.metrics})
        return out

    def residuals(self, values: dict[str, float]) -> np.ndarray:
        res = []
        for run, got in zip(self.runs, self.predict(values)):
            for name, measured in run.metrics.items():
                value = got[name]
                res.append(math.log(value / measured) if value > 0 and math.isfinite(value) else MISS)
        return np.array([float(f"{r:.{DIGITS}g}") for r in res])


def fit(runs: list[Measured], keys: list[str]) -> Fit:
    """The calibration that best predicts ``runs`` (see the module docstring)."""
    from scipy.optimize import least_squares, minimize

    if not runs:
        raise ConfigError("calibrate needs at least one measured run")
    names = [k.removeprefix("calibration.") for k in keys]
    lo = np.array([BOUNDS[n][0] for n in names])
    hi = np.array([BOUNDS[n][1] for n in names])
    scale = np.array([BOUNDS[n][2] for n in names])
    start = runs[0].config.calibration
    before = {k: float(getattr(start, n)) for k, n in zip(keys, names)}
    sims = _Runs(runs)

    def values(u: np.ndarray) -> dict[str, float]:
        return {k: float(v) for k, v in zip(keys, np.clip(u * scale, lo, hi))}

    def cost(u: np.ndarray) -> float:
        r = sims.residuals(values(u))
        return float((2 * ROBUST ** 2 * (np.sqrt(1 + (r / ROBUST) ** 2) - 1)).sum())

    best = np.clip(np.array(list(before.values())), lo, hi) / scale
    best_cost = cost(best)
    bounds = (lo / scale, hi / scale)
    for _ in range(ROUNDS):  # Powell, then trust-region steps over coarse differences, while they help
        start_cost = best_cost
        result = minimize(cost, best, method="Powell", bounds=list(zip(*bounds)),
                          options={"xtol": 1e-3, "ftol": 1e-6, "maxfev": 60 * len(keys) + 60})
        if result.fun < best_cost:
            best, best_cost = result.x, float(result.fun)
        squares = least_squares(lambda u: sims.residuals(values(u)), best, bounds=bounds, loss="soft_l1",
                                f_scale=ROBUST, diff_step=0.05, max_nfev=20 * len(keys))
        squares_cost = cost(squares.x)
        if squares_cost < best_cost:
            best, best_cost = squares.x, squares_cost
        if not best_cost < start_cost * (1 - 1e-3):
            break
    after = values(best)
    return Fit(keys, before, after, runs, sims.predict(before), sims.predict(after), best_cost, sims.evaluations)


def calibration_yaml(fit: Fit) -> str:
    """The fitted values as a YAML ``calibration:`` section (the config's other values kept)."""
    import yaml

    section = {**fit.runs[0].config.calibration.model_dump(), **{k.removeprefix("calibration."): round(v, 6)
                                                                  for k, v in fit.after.items()}}
    header = ("# fitted by fastsim calibrate: robust least squares on log errors over "
              f"{sum(len(r.metrics) for r in fit.runs)} measurements of {len(fit.runs)} runs\n")
    return header + yaml.safe_dump({"calibration": section}, sort_keys=False)
