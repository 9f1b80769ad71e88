"""Human-readable summaries of a sweep Dataset: plain rows of strings for the CLI to print.

A small grid is shown whole, one row per point, with the lesson's columns and TPOT p99. A large one is shown
compactly: per policy, the point with the best throughput. With a ``seed`` axis, every figure is
the mean across seeds with the half-width of its 95 % confidence interval (Student's t).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import xarray as xr

FULL_TABLE_MAX_ROWS = 40

# (metric, header, scale, format)
COLUMNS = [
    ("throughput_tok_s", "tok/s", 1, "{:.0f}"),
    ("slot_use", "slot use", 100, "{:.0f}%"),
    ("ttft_p50_s", "TTFT p50", 1, "{:.2f}s"),
    ("ttft_p99_s", "TTFT p99", 1, "{:.2f}s"),
    ("e2e_p50_s", "e2e p50", 1, "{:.1f}s"),
    ("e2e_p99_s", "e2e p99", 1, "{:.1f}s"),
    ("tpot_p99_s", "TPOT p99", 1000, "{:.1f}ms"),
]

# Two-sided 95 % Student t quantiles for 1..30 degrees of freedom; beyond, the normal 1.96.
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042]


def t95(dof: int) -> float:
    return _T95[dof - 1] if dof <= len(_T95) else 1.96


def mean_ci(values: np.ndarray) -> tuple[float, float]:
    """Mean and 95 % confidence half-width of independent replications (NaN half-width if one)."""
    values = np.asarray(values, dtype=float)
    n = values.size
    mean = float(values.mean())
    if n < 2:
        return mean, math.nan
    return mean, t95(n - 1) * float(values.std(ddof=1)) / math.sqrt(n)


def _fmt(ds: xr.Dataset, column: tuple, seeds: bool) -> str:
    name, _, scale, fmt = column
    values = ds[name].values * scale
    if not seeds:  # a single value (or a seed axis of length 1)
        return fmt.format(float(np.mean(values)))
    mean, half = mean_ci(values)
    return fmt.format(mean) if math.isnan(half) else f"{fmt.format(mean)} ± {fmt.format(half)}"


def _label(value) -> str:
    if isinstance(value, (float, np.floating)):
        return "null" if math.isnan(value) else f"{value:g}"  # NaN stands for null on an axis
    return str(value)


def summarize(ds: xr.Dataset) -> tuple[str, list[str], list[list[str]]]:
    """(title, column headers, rows) describing a sweep Dataset."""
    seeds = "seed" in ds.dims and ds.sizes["seed"] > 1
    dims = [d for d in ds[next(iter(ds.data_vars))].dims if d != "seed"]
    n_rows = math.prod(ds.sizes[d] for d in dims)
    suffix = f" (mean ± 95% CI over {ds.sizes['seed']} seeds)" if seeds else ""
    headers = [h for _, h, _, _ in COLUMNS]
    if n_rows <= FULL_TABLE_MAX_ROWS:
        rows = []
        for combo in itertools.product(*(range(ds.sizes[d]) for d in dims)):
            point = ds.isel(dict(zip(dims, combo)))
            labels = [_label(point[d].item()) for d in dims]
            rows.append(labels + [_fmt(point, c, seeds) for c in COLUMNS])
        return f"{n_rows} grid point{'s' * (n_rows != 1)}{suffix}", dims + headers, rows
    # Compact: per policy (or overall), the point with the best mean throughput.
    thr = ds.throughput_tok_s.mean("seed") if "seed" in ds.dims else ds.throughput_tok_s
    groups = list(ds.policy.values) if "policy" in dims else [None]
    rest = [d for d in dims if d != "policy"]
    rows = []
    for policy in groups:
        sub = thr if policy is None else thr.sel(policy=policy)
        best = dict(zip(rest, np.unravel_index(int(np.nanargmax(sub.values)), sub.shape)))
        point = (ds if policy is None else ds.sel(policy=policy)).isel(best)
        labels = [_label(point[d].item()) for d in rest]
        rows.append([str(policy or "all")] + labels + [_fmt(point, c, seeds) for c in COLUMNS])
    title = f"{n_rows} grid points: best throughput per policy{suffix}"
    return title, ["policy"] + rest + headers, rows
