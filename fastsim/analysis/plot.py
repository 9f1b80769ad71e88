"""Figures of sweep and capacity datasets with matplotlib (the optional ``plot`` extra).

One panel per metric (rows) and per value of a ``col`` axis (columns), one line per value of a
``hue`` axis, against an ``x`` axis. Every other axis must be selected down to one value; axes are
labelled with the dataset's units, and a metric spanning more than two decades gets a log scale.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from ..model.schema import ConfigError

SWEEP_Y = ("throughput_tok_s", "ttft_p99_s")
CAPACITY_Y = ("max_rate_rps",)


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
    units = da.attrs.get("units")
    return f"{da.name} ({units})" if units and units != "1" else str(da.name)


def figure(path: Path, out: Path, x: str | None = None, ys: list[str] | None = None, hue: str | None = None,
           col: str | None = None, sel: list[str] | None = None) -> Path:
    """Draw ``path``'s dataset to the PNG ``out``; errors name the axis or metric at fault."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .compare import _open

    ds = _open(path)
    capacity = "max_rate_rps" in ds.data_vars
    ys = list(ys or (CAPACITY_Y if capacity else SWEEP_Y))
    for y in ys:
        if y not in ds.data_vars:
            raise ConfigError(f"--y {y}: not a metric of {path} (metrics: {', '.join(ds.data_vars)})")
    for item in sel or []:
        axis, _, text = item.partition("=")
        if axis not in ds.dims:
            raise ConfigError(f"--sel {item}: {axis!r} is not an axis of {path} (axes: {', '.join(ds.dims)})")
        ds = ds.sel({axis: _value(ds[axis].values, text, axis)})
    x = x or ("rate" if "rate" in ds.dims else next(iter(ds.dims), None))
    if x is None or x not in ds.dims:
        raise ConfigError(f"--x {x}: not an axis of {path} (axes: {', '.join(ds.dims) or 'none'})")
    for role, axis in (("--hue", hue), ("--col", col)):
        if axis is not None and axis not in ds.dims:
            raise ConfigError(f"{role} {axis}: not an axis of {path} (axes: {', '.join(ds.dims)})")
    for axis, size in ds.sizes.items():
        if axis not in (x, hue, col) and size > 1:
            raise ConfigError(f"axis {axis!r} has {size} values: pick one with --sel {axis}=VALUE, "
                              f"or plot it with --hue {axis} or --col {axis}")
    ds = ds.squeeze([d for d, n in ds.sizes.items() if d not in (x, hue, col) and n == 1])
    cols = ds[col].values.tolist() if col else [None]
    fig, axes = plt.subplots(len(ys), len(cols), figsize=(max(6.0, 4.5 * len(cols) + 1), 3.2 * len(ys) + 0.4), squeeze=False)
    for r, y in enumerate(ys):
        for c, cv in enumerate(cols):
            ax = axes[r][c]
            panel = ds[y] if col is None else ds[y].sel({col: cv})
            for hv in (panel[hue].values.tolist() if hue else [None]):
                line = panel if hue is None else panel.sel({hue: hv})
                ax.plot(line[x].values, line.transpose(x).values, marker="o", markersize=3,
                        label=None if hue is None else f"{hue} {hv}")
            values = np.asarray(panel.values, dtype=float)
            positive = values[np.isfinite(values) & (values > 0)]
            if positive.size and positive.max() / positive.min() > 100:
                ax.set_yscale("log")
            ax.set_xlabel(_label(ds[x]))
            ax.set_ylabel(_label(ds[y]))
            if col is not None:
                ax.set_title(f"{col} {cv}")
            if hue is not None:
                ax.legend(fontsize="small")
            ax.grid(True, alpha=0.3)
    import yaml

    description = (yaml.safe_load(ds.attrs.get("config", "")) or {}).get("description")
    width = fig.get_size_inches()[0]
    fig.suptitle(textwrap.fill(description or Path(path).stem, int(width * 11)), fontsize="medium")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
