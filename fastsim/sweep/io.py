"""Labelled output: sweep grids and per-request results as xarray Datasets and netCDF4 files.

One layout (dimensions, coordinates, variables, attributes) describes each output; it becomes an
xarray Dataset for the Python API, or is written straight to netCDF4 with the netCDF4 library
(a sweep from the CLI never pays for importing xarray, and Dask with it). Files are written
whole to a temporary name beside the target and renamed into place, so a reader never sees a
half-written file. Opened with xarray, a written file equals the in-memory Dataset.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import yaml
from pydantic import BaseModel

from .._version import __version__
from ..analysis import capacity, plan
from ..analysis.catalog import ANSWERS
from ..analysis.metrics import INTEGER_METRICS, METRICS
from ..analysis.simulation import Result
from ..model import fleet as pools
from ..model.keys import units
from ..model.schema import Config, dim_name
from .._atomic import atomic_path, disk_error
from .grid import Grid, axis_label

if TYPE_CHECKING:
    import xarray as xr



@dataclass(frozen=True)
class Layout:
    """An output's structure: {name: (dims, values, attrs)} for coordinates and data."""

    coords: dict[str, tuple[tuple[str, ...], np.ndarray, dict[str, str]]]
    data: dict[str, tuple[tuple[str, ...], np.ndarray, dict[str, str]]]
    attrs: dict[str, Any]

    def to_dataset(self) -> xr.Dataset:
        import xarray as xr

        return xr.Dataset(
            {k: xr.Variable(*v) for k, v in self.data.items()},
            {k: xr.Variable(*v) for k, v in self.coords.items()},
            attrs=self.attrs,
        )

    def write(self, path: str | Path) -> Path:
        """Write as netCDF4 (data compressed: zlib 4 + shuffle) to ``path`` atomically."""
        import netCDF4

        path = Path(path)
        try:
            with atomic_path(path) as tmp, netCDF4.Dataset(tmp, "w", format="NETCDF4") as nc:
                for name, (_, values, _) in self.coords.items():
                    nc.createDimension(name, values.size)
                for name, (dims, values, attrs) in (*self.coords.items(), *self.data.items()):
                    if values.dtype == bool:  # netCDF has no booleans: int8 that xarray reads back as bool
                        values, attrs = values.astype("i1"), {**attrs, "dtype": "bool"}
                    kind = str if values.dtype.kind in "UO" else values.dtype
                    compress = name in self.data and values.ndim > 0
                    var = nc.createVariable(name, kind, dims, zlib=compress, complevel=4, shuffle=compress)
                    var.setncatts(attrs)
                    var[...] = values.astype(object) if kind is str else values
                nc.setncatts(self.attrs)
        except RuntimeError as exc:  # the netCDF library's own errors: a full disk is an "HDF error"
            raise disk_error(path, exc) from None
        return path


def _provenance(config: Config) -> dict[str, str]:
    import numba

    return {
        "fastsim_version": __version__,
        "numpy_version": np.__version__,
        "numba_version": numba.__version__,
        "config": _config_text(config),
    }


def _config_text(config: Config) -> str:
    """The resolved config as YAML (libyaml's emitter when present). A sweep may list a million
    axis values, ~10 us each through the emitter: an axis of integers (seeds, counts) is written
    directly as one flow sequence, which reads back the same."""
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    raw = config.model_dump()
    sweep = raw.pop("sweep")
    lines = [yaml.dump(raw, Dumper=dumper, sort_keys=False).rstrip("\n"), "sweep:" if sweep else "sweep: {}"]
    for key, values in sweep.items():
        if all(type(v) is int for v in values):
            lines.append(f"  {json.dumps(key)}: [{', '.join(map(str, values))}]")
        else:
            lines += ["  " + line for line in yaml.dump({key: values}, Dumper=dumper).splitlines()]
    return "\n".join(lines) + "\n"


def _coordinate(values: Sequence[Any]) -> np.ndarray:
    """A coordinate array; a numeric axis holding null gets NaN there (netCDF has no None); an
    axis of whole sections is labelled (:func:`.grid.axis_label`)."""
    if any(isinstance(v, BaseModel) for v in values):
        return np.array([axis_label(v) for v in values])
    if any(v is None for v in values) and all(v is None or isinstance(v, (int, float)) for v in values):
        return np.array([np.nan if v is None else v for v in values], dtype=float)
    return np.asarray(values)


def dims(grid: Grid) -> tuple[str, ...]:
    """The dataset dimension of each axis (:func:`fastsim.model.schema.dim_name`)."""
    return tuple(dim_name(key) for key in grid.keys)


def sweep_layout(grid: Grid, table: np.ndarray) -> Layout:
    """Label a grid of metrics: ``table`` has shape (*axis lengths, len(METRICS)), C order."""
    dims_ = dims(grid)
    coords = {}
    for dim, key, values in zip(dims_, grid.keys, grid.axes):
        attrs = {"config_key": key}
        if units(key):
            attrs["units"] = units(key)
        coords[dim] = ((dim,), _coordinate(values), attrs)
    data = {}
    for k, (name, metric) in enumerate(METRICS.items()):
        values = table[..., k]
        if name in INTEGER_METRICS and np.isfinite(values).all():  # a capacity search can find no rate
            values = values.astype(np.int64)
        data[name] = (dims_, values, {"units": metric.units, "long_name": metric.long_name})
    data[PREFIX_CACHE] = (dims_, prefix_cache_in_effect(grid), {
        "units": "1", "long_name": "the point ran with a prefix cache: engine.prefix_caching on continuous batching "
                                   "(static and dynamic batching have none, whatever the key says)"})
    return Layout(coords, data, _provenance(grid.base))


PREFIX_CACHE = "prefix_cache_in_effect"


def frontier_layout(grid: Grid, table: np.ndarray, on: np.ndarray) -> Layout:
    """A sweep's layout (:func:`sweep_layout`) with ``on_frontier``: the points no other point
    beats on both interactivity and throughput per GPU (:mod:`fastsim.analysis.frontier`)."""
    layout = sweep_layout(grid, table)
    layout.data["on_frontier"] = (dims(grid), on, {
        "units": "1", "long_name": "on the throughput-interactivity frontier: no point has both more "
                                   "interactivity_tok_s and more tok_s_per_gpu"})
    return layout


def prefix_cache_in_effect(grid: Grid) -> np.ndarray:
    """Whether each point of ``grid`` runs with a prefix cache (:func:`fastsim.model.fleet.prefix_cache`),
    shape ``grid.shape``: read once per combination of the engine's axes, which decide it."""
    values = np.zeros([n if key.startswith("engine") else 1 for key, n in zip(grid.keys, grid.shape)], dtype=bool)
    for idx in grid.combinations(("engine",)):
        values[idx] = pools.prefix_cache(grid.config_at(idx))
    return np.broadcast_to(values, grid.shape).copy()


def requests_layout(result: Result) -> Layout:
    """Per-request results along a ``request`` dimension, metrics as global attributes; a
    fleet's adds the replica that served each request (and its prefill replica)."""
    with np.errstate(invalid="ignore", divide="ignore"):  # (one token: no TPOT)
        tpot = np.where(result.output_tokens > 1, (result.done_s - result.first_token_s)
                        / (result.output_tokens - 1), np.nan)
    fields = {
        "arrival_s": (result.arrival_s, "s", "arrival time"),
        "prompt_tokens": (result.prompt_tokens, "tokens", "prompt length"),
        "output_tokens": (result.output_tokens, "tokens", "output length"),
        "first_token_s": (result.first_token_s, "s", "time of the first token, as the client sees it"),
        "done_s": (result.done_s, "s", "time of the last token, as the client sees it"),
        "ttft_s": (result.first_token_s - result.arrival_s, "s", "time to first token"),
        "e2e_s": (result.done_s - result.arrival_s, "s", "end-to-end latency"),
        "tpot_s": (tpot, "s", "time per output token after the first: (done - first token) / (output - 1); NaN "
                              "for one token"),
        "measured": (np.arange(result.arrival_s.size) >= result.warmup, "1",
                     "the request is measured (not a warm-up one: workload.warmup)"),
    }
    if result.replica is not None:
        fields["replica"] = (result.replica, "1", "the replica that served the request (decoded it, when "
                                                  "disaggregated; -1: done at its prefill)")
    if result.prefill_replica is not None:
        fields["prefill_replica"] = (result.prefill_replica, "1", "the prefill replica that ran its prompt")
    if result.cached_tokens is not None:
        fields["cached_tokens"] = (result.cached_tokens, "tokens", "prompt tokens found in the prefix cache at "
                                                                   "its first admission")
    if result.session is not None:
        fields["session"] = (result.session, "1", "its session (-1: none)")
        fields["turn"] = (result.turn, "1", "its turn in the session (1, 2, ...; 0: none)")
        fields["system_prompt"] = (result.system_prompt, "1", "its system prompt (-1: none)")
    data = {name: (("request",), v, {"units": u, "long_name": ln}) for name, (v, u, ln) in fields.items()}
    coords = {"request": (("request",), np.arange(result.arrival_s.size), {})}
    attrs = {**_provenance(result.config), **{f"metric_{k}": v for k, v in result.metrics.items()}}
    return Layout(coords, data, attrs)


def _metrics(grid: Grid, answers: Sequence) -> np.ndarray:
    """The metrics of each answer (C order of ``grid``) as a sweep's table."""
    return np.array([list(a.metrics.values()) for a in answers], dtype=float).reshape(*grid.shape, len(METRICS))


def capacity_layout(grid: Grid, answers: Sequence[capacity.Answer], targets: list) -> Layout:
    """A capacity search over ``grid``'s settings (its rate axis removed), one answer each in C
    order: ``max_rate_rps``, what bound it, and every metric at that rate."""
    base = sweep_layout(grid, _metrics(grid, answers))
    axes = dims(grid)
    data = {
        "max_rate_rps": (axes, np.array([a.max_rate for a in answers]).reshape(grid.shape),
                         {"units": ANSWERS["max_rate_rps"].units, "long_name": ANSWERS["max_rate_rps"].long_name}),
        "binding": (axes, np.array([a.binding for a in answers], dtype=object).reshape(grid.shape),
                    {"long_name": "the target that fails just above max_rate_rps, or why there is none"}),
        **base.data,
    }
    attrs = {**base.attrs, "targets": "; ".join(str(t) for t in targets),
             "simulations": sum(a.simulations for a in answers)}
    return Layout(base.coords, data, attrs)


def plan_layout(grid: Grid, answers: Sequence[plan.Answer], targets: list, max_replicas: int) -> Layout:
    """A plan over ``grid``'s candidates, one answer each in C order: ``replicas`` (the fewest
    that meet every target; NaN when even ``max_replicas`` fail or the candidate cannot run),
    ``rank`` (1 = cheapest), what binds, and every metric at the answer (``gpus``,
    ``usd_per_hour``, ``usd_per_mtok`` among them)."""
    base = sweep_layout(grid, _metrics(grid, answers))
    rank = np.empty(len(answers), np.int64)
    rank[plan.ranking(answers)] = np.arange(1, len(answers) + 1)
    replicas = np.array([np.nan if a.replicas is None else a.replicas for a in answers])
    axes = dims(grid)
    data = {
        "replicas": (axes, replicas.reshape(grid.shape), {
            "units": ANSWERS["replicas"].units,
            "long_name": f"{ANSWERS['replicas'].long_name} (NaN: none up to {max_replicas})"}),
        "rank": (axes, rank.reshape(grid.shape), {"long_name": "rank by USD/hour, then GPUs, then TTFT p99 (1: best)"}),
        "binding": (axes, np.array([a.says for a in answers], dtype=object).reshape(grid.shape),
                    {"long_name": "the target that fails with one replica fewer, or why there is no answer"}),
        **base.data,
    }
    if any(a.prefill_replicas is not None for a in answers):  # a prefill pool the plan sized
        prefill = np.array([np.nan if a.prefill_replicas is None else a.prefill_replicas for a in answers])
        data = {"replicas": data.pop("replicas"), "prefill_pool": (axes, prefill.reshape(grid.shape), {
            "units": "replicas", "long_name": "prefill replicas the plan chose (fleet.prefill_replicas: auto)"}),
            **data}
    attrs = {**base.attrs, "kind": "plan", "targets": "; ".join(str(t) for t in targets), "max_replicas": max_replicas,
             "simulations": sum(a.simulations for a in answers)}
    return Layout(base.coords, data, attrs)
