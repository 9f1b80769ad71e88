"""Labelled output: xarray Datasets of sweep grids and per-request results, written as netCDF4.

Only this layer knows about xarray. Files are written whole to a temporary name beside the target
and renamed into place, so a reader never sees a half-written file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import xarray as xr
import yaml

from . import __version__
from .config import Config
from .metrics import INTEGER_METRICS, METRICS
from .simulation import Result

# Units of sweep coordinates, by axis name; axes not listed are dimensionless.
AXIS_UNITS = {
    "rate": "requests/s",
    "window_ms": "ms",
    "mem_bandwidth_tb_s": "TB/s",
    "weight_gb": "GB",
    "kv_bytes_per_token": "bytes",
    "prompt_tokens": "tokens",
    "max_batch": "sequences",
    "max_concurrent": "sequences",
    "n_requests": "requests",
    "min": "tokens",
    "max": "tokens",
    "value": "tokens",
}


def _provenance(config: Config) -> dict[str, str]:
    import numba

    return {
        "fastsim_version": __version__,
        "numpy_version": np.__version__,
        "numba_version": numba.__version__,
        "config": yaml.safe_dump(config.model_dump(), sort_keys=False),
    }


def _coordinate(values: Sequence[Any]) -> np.ndarray:
    """A coordinate array; a numeric axis holding null gets NaN there (netCDF has no None)."""
    if any(v is None for v in values) and all(v is None or isinstance(v, (int, float)) for v in values):
        return np.array([np.nan if v is None else v for v in values], dtype=float)
    return np.asarray(values)


def sweep_dataset(config: Config, table: np.ndarray) -> xr.Dataset:
    """Label a grid of metrics: ``table`` has shape (*axis lengths, len(METRICS)), C order."""
    dims = [key.rsplit(".", 1)[-1] for key in config.sweep]
    coords = {}
    for dim, (key, values) in zip(dims, config.sweep.items()):
        attrs = {"config_key": key}
        if dim in AXIS_UNITS:
            attrs["units"] = AXIS_UNITS[dim]
        coords[dim] = xr.Variable(dim, _coordinate(values), attrs)
    data = {}
    for k, (name, (units, long_name)) in enumerate(METRICS.items()):
        values = table[..., k]
        if name in INTEGER_METRICS:
            values = values.astype(np.int64)
        data[name] = xr.Variable(dims, values, {"units": units, "long_name": long_name})
    return xr.Dataset(data, coords, attrs=_provenance(config))


def requests_dataset(result: Result) -> xr.Dataset:
    """Per-request results along a ``request`` dimension, metrics as global attributes."""
    fields = {
        "arrival_s": (result.arrival_s, "s", "arrival time"),
        "prompt_tokens": (result.prompt_tokens, "tokens", "prompt length"),
        "output_tokens": (result.output_tokens, "tokens", "output length"),
        "first_token_s": (result.first_token_s, "s", "end of the step that produced the first token"),
        "done_s": (result.done_s, "s", "end of the step that produced the last token"),
    }
    data = {name: ("request", v, {"units": u, "long_name": ln}) for name, (v, u, ln) in fields.items()}
    ds = xr.Dataset(data, {"request": np.arange(result.arrival_s.size)}, attrs=_provenance(result.config))
    ds.attrs.update({f"metric_{k}": v for k, v in result.metrics.items()})
    return ds


def write_netcdf(ds: xr.Dataset, path: str | Path) -> Path:
    """Write ``ds`` compressed (zlib 4 + shuffle) to ``path`` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    encoding = {name: {"zlib": True, "complevel": 4, "shuffle": True} for name in ds.data_vars}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        ds.to_netcdf(tmp, engine="netcdf4", format="NETCDF4", encoding=encoding)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
