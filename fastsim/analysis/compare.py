"""Compare two fastsim datasets (sweeps, capacity searches or plans) point by point, for regressions.

Each metric has a direction: throughput, goodput, attainment and capacity should not fall;
latencies, queues, preemptions, GPUs, replicas and prices should not rise. A point regresses when its metric moved the
wrong way by more than ``rtol`` (relative to the baseline); improvements are reported and never
fail, unless ``drift``: then any change beyond ``rtol`` fails, either way (a regression check of the
simulator itself, where a prediction that moved is a change to explain, better or worse).
Modelled on asv's ``compare --factor`` and pytest-benchmark's ``--benchmark-compare-fail``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..model.schema import ConfigError

from .catalog import direction


@dataclass
class MetricReport:
    direction: int
    worst_change: float = 0.0  # relative, signed: negative is worse
    worst_at: dict[str, Any] = field(default_factory=dict)
    worst_values: tuple[float, float] = (math.nan, math.nan)  # baseline, candidate at worst_at
    regressions: int = 0
    improvements: int = 0


@dataclass
class Report:
    rtol: float
    metrics: dict[str, MetricReport]
    regressed_points: list[dict[str, Any]]  # metric, at, baseline, candidate, change (with drift: any way)
    drift: bool = False

    @property
    def regressed(self) -> bool:
        return bool(self.regressed_points)

    @property
    def identical(self) -> bool:
        """No compared metric changed at any point."""
        return all(r.worst_change == 0 and not r.improvements for r in self.metrics.values())

    def as_json(self) -> dict[str, Any]:
        return {
            "rtol": self.rtol,
            "drift": self.drift,
            "regressed": self.regressed,
            "metrics": {
                name: {"direction": "higher is better" if r.direction > 0 else "lower is better",
                       "worst_change": _finite(r.worst_change), "worst_at": r.worst_at,
                       "regressions": r.regressions, "improvements": r.improvements}
                for name, r in self.metrics.items()
            },
            "regressions": [{**p, **{k: _finite(p[k]) for k in ("baseline", "candidate", "change")}}
                            for p in self.regressed_points],
        }


def _finite(x: float) -> float | str | None:
    return None if math.isnan(x) else (x if math.isfinite(x) else ("inf" if x > 0 else "-inf"))


def open_dataset(path: Path):
    """A fastsim dataset, loaded; ConfigError when the file is missing or is not one."""
    import xarray as xr

    try:
        ds = xr.open_dataset(path).load()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except Exception as exc:  # netCDF4/HDF5 raise several kinds for a file that is not netCDF
        raise ConfigError(f"{path}: not a netCDF dataset ({type(exc).__name__})") from None
    if "fastsim_version" not in ds.attrs:
        raise ConfigError(f"{path}: not a fastsim dataset (no fastsim_version attribute)")
    if "request" in ds.dims:
        raise ConfigError(f"{path}: per-request results (fastsim run --requests-out), not a sweep, capacity or "
                          "plan dataset")
    return ds


def _plain(value: Any) -> Any:
    value = value.item() if hasattr(value, "item") else value
    return None if isinstance(value, float) and math.isnan(value) else value


def compare(baseline: Path, candidate: Path, rtol: float = 0.05, metrics: list[str] | None = None,
            drift: bool = False) -> Report:
    """Compare ``candidate`` with ``baseline`` (``drift``: a change either way fails); ConfigError
    when they cannot be compared."""
    base, cand = open_dataset(baseline), open_dataset(candidate)
    if list(base.indexes) != list(cand.indexes):
        raise ConfigError(f"axes differ: baseline {tuple(base.indexes)} vs candidate {tuple(cand.indexes)}")
    for dim in base.indexes:
        a, b = base[dim].values, cand[dim].values
        same = a.shape == b.shape and all(x == y or (x != x and y != y) for x, y in zip(a.tolist(), b.tolist()))
        if not same:
            raise ConfigError(f"coordinate {dim} differs: baseline {a.tolist()} vs candidate {b.tolist()}")
    names = metrics or [v for v in base.data_vars if direction(v) != 0]
    for name in names:
        for label, ds, path in (("baseline", base, baseline), ("candidate", cand, candidate)):
            if name not in ds.data_vars:
                raise ConfigError(f"metric {name!r} is not in the {label} ({path})")
            kind = ds[name].dtype.kind
            if kind not in "biuf":  # text read as numbers would compare as if nothing were wrong
                what = "text" if kind in "OSU" else f"{ds[name].dtype} values"
                raise ConfigError(f"metric {name!r} of the {label} ({path}) holds {what}, not numbers")
        if direction(name) == 0:
            raise ConfigError(f"metric {name!r} has no better direction to compare")
    report = Report(rtol, {}, [], drift)
    for name in names:
        sign = direction(name)
        a = base[name].transpose(*base.indexes).values.astype(float)
        b = cand[name].transpose(*base.indexes).values.astype(float)
        with np.errstate(divide="ignore", invalid="ignore"):
            change = np.where(a == b, 0.0, (b - a) / np.abs(a)) * sign + 0.0  # > 0 better, < 0 worse
        change = np.where(np.isnan(a) & np.isnan(b), 0.0, change)
        change = np.where(np.isfinite(a) & np.isnan(b), -np.inf, change)  # became undefined: worse
        change = np.where(np.isnan(a) & np.isfinite(b), 0.0, change)
        r = MetricReport(sign)
        worse, better = change < -rtol, change > rtol
        r.regressions = int(worse.sum())
        r.improvements = int(better.sum())
        failed = worse | better if drift else worse
        flat = int(np.argmin(change)) if change.size else 0
        if change.size:
            r.worst_change = float(change.flat[flat])
            idx = np.unravel_index(flat, change.shape) if change.ndim else ()
            r.worst_at = {d: _plain(base[d].values[i]) for d, i in zip(base.indexes, idx)}
            r.worst_values = (float(a.flat[flat]), float(b.flat[flat]))
        for idx in zip(*np.nonzero(failed)) if change.ndim else ([()] if failed else []):
            at = {d: _plain(base[d].values[i]) for d, i in zip(base.indexes, idx)}
            report.regressed_points.append({"metric": name, "at": at, "baseline": float(a[idx]),
                                            "candidate": float(b[idx]), "change": float(change[idx])})
        report.metrics[name] = r
    return report


def describe_change(baseline: float, candidate: float, direction: int) -> str:
    """A change as a reader says it: its sign the way the value moved, then better or worse
    (``+12.5% worse`` for a latency that rose); a rise past 10x as a factor; a baseline of 0 or
    NaN said as such."""
    if baseline == candidate or (math.isnan(baseline) and math.isnan(candidate)):
        return "unchanged"
    if math.isnan(candidate):
        return "became undefined (worse)"
    if math.isnan(baseline):
        return f"was undefined, now {candidate:.4g}"
    verdict = "better" if (candidate - baseline) * direction > 0 else "worse"
    if baseline == 0:
        return f"from 0 to {candidate:.4g} ({verdict})"
    change = (candidate - baseline) / abs(baseline)
    if abs(change) >= 10:
        return f"{candidate / baseline:,.1f}x ({verdict})"
    return f"{change:+.1%} ({verdict})"
