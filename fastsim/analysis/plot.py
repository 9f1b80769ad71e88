"""Figures of sweep, capacity and plan datasets with matplotlib (the optional ``plot`` extra).

A frontier dataset (:mod:`.frontier`) is drawn as the benchmark chart, throughput per GPU
against interactivity, one line per candidate. Otherwise one panel per metric (rows) and per
value of a ``col`` axis (columns), one line per value of a ``hue`` axis, against an ``x`` axis. Left unset, they come from the dataset's axes in its order:
x is ``rate`` (or the first axis), hue the next axis with several values, col the one after; an
axis beyond those must be selected with ``--sel``, and the error names it. Labels are each
variable's long name with its units, the selected values go in the title, a metric spanning more
than two decades gets a log scale, and a latency with an SLO bound gets it as a dashed line. A
plan is drawn as the price per hour of each candidate, cheapest first, labelled with its replicas.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import yaml

from .._atomic import atomic_path, check_writable
from ..model.schema import ConfigError
from . import frontier
from .catalog import METRICS
from .compare import open_dataset

SWEEP_Y = ("throughput_tok_s", "ttft_p99_s")
CAPACITY_Y = ("max_rate_rps",)
PLAN_Y = "usd_per_hour"
PLAN_BARS = 25  # candidates a plan figure shows, cheapest first


def _value(coord: np.ndarray, text: str, axis: str):
    """The coordinate value of ``axis`` written as ``text`` (a number or a name)."""
    for v in coord.tolist():
        if str(v) == text:
            return v
        try:
            if float(v) == float(text):
                return v
        except (TypeError, ValueError):
            pass
    raise ConfigError(f"--sel {axis}={text}: not a value of {axis} (values: {', '.join(map(str, coord.tolist()))})")


def _label(da) -> str:
    """A variable's long name (else its name) with its units."""
    name = da.attrs.get("long_name") or str(da.name)
    units = da.attrs.get("units")
    return f"{name} ({units})" if units and units != "1" else name


def _axis_label(ds, axis: str) -> str:
    key = ds[axis].attrs.get("config_key", axis)
    units = ds[axis].attrs.get("units")
    return f"{key} ({units})" if units else key


def _writable(out: Path, fig) -> Path:
    """``out``, checked before drawing: a format matplotlib writes, in a directory that can be."""
    formats = fig.canvas.get_supported_filetypes()
    kind = out.suffix.lower().lstrip(".")
    if kind not in formats:
        raise ConfigError(f"--out {out}: unknown figure format {out.suffix or '(none)'!r} "
                          f"(one of: {', '.join('.' + f for f in sorted(formats))})")
    check_writable(out, "--out")
    return out


def _defaults(ds, x: str | None, hue: str | None, col: str | None) -> tuple[str, str | None, str | None]:
    """x, hue and col: as given, else from the axes with several values in the dataset's order."""
    several = [d for d in ds.dims if ds.sizes[d] > 1]
    free = [d for d in ("rate", *several, *ds.dims) if d in ds.dims and d not in (hue, col)]
    x = x or (free or [None])[0]
    rest = [d for d in several if d not in (x, hue, col)]
    if hue is None and rest:
        hue = rest.pop(0)
    if col is None and rest:
        col = rest.pop(0)
    if rest:
        picks = " ".join(f"--sel {d}=VALUE" for d in rest)
        raise ConfigError(f"axes {', '.join(repr(d) for d in rest)} have several values beyond x ({x}), hue ({hue}) "
                          f"and col ({col}): pick one of each with {picks}")
    return x, hue, col


def _slo_bound(config: dict, metric: str) -> float | None:
    slo = config.get("slo") or {}
    key = METRICS[metric].slo if metric in METRICS else None
    return float(slo[key]) if key and slo.get(key) is not None else None


def figure(path: Path, out: Path, x: str | None = None, ys: list[str] | None = None, hue: str | None = None,
           col: str | None = None, sel: list[str] | None = None) -> Path:
    """Draw ``path``'s dataset to ``out``; errors name the axis, metric or file at fault."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("fastsim plot needs matplotlib: pip install 'fastsim[plot]'") from None
    ds = open_dataset(path)
    ys_given = bool(ys)
    config = yaml.safe_load(ds.attrs.get("config", "")) or {}
    out = Path(out)
    fixed = []
    for item in sel or []:
        axis, _, text = item.partition("=")
        if axis not in ds.dims:
            raise ConfigError(f"--sel {item}: {axis!r} is not an axis of {path} (axes: {', '.join(ds.dims)})")
        value = _value(ds[axis].values, text, axis)
        ds = ds.sel({axis: value})
        fixed.append(f"{axis} {value}")
    plan = ds.attrs.get("kind") == "plan"
    default_y = [PLAN_Y] if plan else list(CAPACITY_Y if "max_rate_rps" in ds.data_vars else SWEEP_Y)
    ys = list(ys or default_y)
    for y in ys:
        if y not in ds.data_vars:
            raise ConfigError(f"--y {y}: not a metric of {path} (metrics: {', '.join(ds.data_vars)})")
    roles: dict[str, str] = {}
    for role, axis in (("--x", x), ("--hue", hue), ("--col", col)):
        if axis is not None and axis not in ds.dims:
            raise ConfigError(f"{role} {axis}: not an axis of {path} (axes: {', '.join(ds.dims) or 'none'})")
        if axis is not None and axis in roles:
            raise ConfigError(f"{role} {axis}: already drawn as {roles[axis]}; give each axis one role")
        if axis is not None:
            roles[axis] = role
    for y in ys:
        if ds[y].dtype.kind not in "fiub":
            raise ConfigError(f"--y {y}: not a number to plot ({ds[y].attrs.get('long_name', 'text')}); "
                              f"numeric metrics: {', '.join(v for v in ds.data_vars if ds[v].dtype.kind in 'fiub')}")
    if plan:
        fig = _plan_figure(plt, ds, ys)
    elif "on_frontier" in ds.data_vars and not (ys_given or x or hue or col):
        fig = _frontier_figure(plt, ds)
    else:
        x, hue, col = _defaults(ds, x, hue, col)
        if x is None:
            raise ConfigError(f"{path}: no axis to draw against (a single point)")
        ds = ds.squeeze([d for d, n in ds.sizes.items() if d not in (x, hue, col) and n == 1])
        fig = _line_figure(plt, ds, ys, x, hue, col, config)
    _writable(out, fig)
    title = config.get("description") or Path(path).stem
    if fixed:
        title += " (" + ", ".join(fixed) + ")"
    fig.suptitle(textwrap.fill(title, int(fig.get_size_inches()[0] * 11)), fontsize="medium")
    fig.tight_layout()
    try:
        with atomic_path(out) as tmp:
            fig.savefig(tmp, dpi=110, format=out.suffix.lower().lstrip("."))
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot write ({exc.strerror or exc}); nothing was written") from None
    finally:
        plt.close(fig)
    return out


def _line_figure(plt, ds, ys: list[str], x: str, hue: str | None, col: str | None, config: dict):
    cols = ds[col].values.tolist() if col else [None]
    fig, axes = plt.subplots(len(ys), len(cols), figsize=(max(6.0, 4.5 * len(cols) + 1.5), 3.4 * len(ys) + 0.6),
                             squeeze=False, sharey="row")
    for r, y in enumerate(ys):
        bound = _slo_bound(config, y)
        for c, cv in enumerate(cols):
            ax = axes[r][c]
            panel = ds[y] if col is None else ds[y].sel({col: cv})
            for hv in (panel[hue].values.tolist() if hue else [None]):
                line = panel if hue is None else panel.sel({hue: hv})
                ax.plot(line[x].values, line.transpose(x).values, marker="o", markersize=3,
                        label=None if hue is None else f"{hue} {hv}")
            values = np.asarray(panel.values, dtype=float)
            positive = values[np.isfinite(values) & (values > 0)]
            fraction = panel.attrs.get("units") == "1"  # attainment, use: 0 must show, on a linear axis
            if not fraction and positive.size and positive.max() / positive.min() > 100:
                ax.set_yscale("log")
            if bound is not None:
                ax.axhline(bound, color="grey", linestyle="--", linewidth=1, label=f"SLO {bound:g} s")
            ax.set_xlabel(_axis_label(ds, x))
            if c == 0:
                ax.set_ylabel(textwrap.fill(_label(ds[y]), 32))
            if col is not None:
                ax.set_title(f"{_axis_label(ds, col)} = {cv}", fontsize="medium")
            if hue is not None or bound is not None:
                ax.legend(fontsize="small")
            ax.grid(True, alpha=0.3)
    return fig


def _frontier_figure(plt, ds):
    """The benchmark chart of a frontier dataset: output tokens/s per GPU against tokens/s per
    user, one line per candidate through its concurrencies, the frontier drawn over them."""
    clients = "concurrency"
    others = [d for d in ds.dims if d != clients]
    flat = ds.stack(candidate=others) if others else ds.expand_dims("candidate")
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for c in range(flat.sizes["candidate"]):
        point = flat.isel(candidate=c)
        name = ", ".join(f"{d}={point[d].values.item()}" for d in others) or "the config"
        ax.plot(point[frontier.X].values, point[frontier.Y].values, marker="o", markersize=3, linewidth=1,
                alpha=0.8, label=name)
    on = ds["on_frontier"].values.astype(bool)
    x, y = ds[frontier.X].values[on], ds[frontier.Y].values[on]
    order = np.argsort(x)
    ax.plot(x[order], y[order], color="black", linewidth=2.5, alpha=0.35, label="frontier")
    ax.set_xlabel(_label(ds[frontier.X]))
    ax.set_ylabel(_label(ds[frontier.Y]))
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small", ncol=2 if flat.sizes["candidate"] > 8 else 1)
    return fig


def _plan_figure(plt, ds, ys: list[str]):
    """One horizontal bar per candidate and metric, cheapest first (by rank), labelled with the
    candidate's settings and its answer: the candidates that meet the targets, at most
    ``PLAN_BARS`` of them; the title says how many are left out and why."""
    flat = ds.stack(candidate=list(ds.dims)) if ds.dims else ds.expand_dims("candidate")
    met = np.isfinite(flat["replicas"].values.astype(float))
    order = [int(i) for i in np.argsort(flat["rank"].values, kind="stable") if met[i]]
    shown = order[:PLAN_BARS] or [int(i) for i in np.argsort(flat["rank"].values, kind="stable")[:PLAN_BARS]]
    names = []
    for i in shown:
        point = flat.isel(candidate=i)
        settings = ", ".join(f"{d}={point[d].values.item()}" for d in ds.dims) or "the config"
        replicas = float(point["replicas"])
        answer = (f"{replicas:.0f} replica{'' if replicas == 1 else 's'}" if not math.isnan(replicas) else
                  "cannot run" if str(point["binding"].values).startswith("cannot run") else "never met")
        names.append(f"{settings}: {answer}")
    left = [f"{len(order) - len(shown)} more that meet the targets"] if len(order) > len(shown) else []
    if met.size > len(order):
        left.append(f"{met.size - len(order)} that never meet them or cannot run")
    width = 3.0 + 0.075 * max(len(n) for n in names) + 4.5 * len(ys)
    fig, axes = plt.subplots(1, len(ys), figsize=(width, 0.28 * len(names) + 1.6), squeeze=False, sharey=True)
    for c, y in enumerate(ys):
        ax = axes[0][c]
        values = flat[y].values[shown].astype(float)
        ax.barh(range(len(names)), np.nan_to_num(values), color="tab:blue")
        ax.set_yticks(range(len(names)), labels=names, fontsize="small")
        ax.invert_yaxis()
        ax.set_xlabel(_label(ds[y]))
        ax.grid(True, axis="x", alpha=0.3)
    note = f"{len(shown)} of {met.size} candidates, cheapest first" + (f"; not shown: {', '.join(left)}" if left else "")
    axes[0][0].set_title(note, fontsize="small", loc="left")
    return fig
