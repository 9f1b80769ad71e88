"""The Python API for sweeps: run a config's grid and get (or write) a labelled Dataset."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from . import io, memory
from .config import Config, ConfigError
from .files import output_lock
from .grid import Grid, build_grid, run_grid

if TYPE_CHECKING:
    import xarray as xr


def _fits(grid: Grid, workers: int | None, scheduler: str | None, max_memory: int | None, points: int) -> Grid:
    """Check that the grid's largest point fits in memory on every local worker, beside a table
    of ``points`` points; returns the grid."""
    largest = grid.base.at({"workload.n_requests": grid.max_requests, "workload.trace": None})
    local = scheduler is None or scheduler == "local"
    memory.check(largest, (workers or os.cpu_count() or 1) if local else 0, points, max_memory)
    return grid


def _grid(config: Config, workers: int | None, scheduler: str | None, max_memory: int | None) -> Grid:
    """Validate the grid, and check that it fits in memory (:func:`_fits`)."""
    grid = build_grid(config)
    return _fits(grid, workers, scheduler, max_memory, grid.size)


def sweep(
    config: Config,
    workers: int | None = None,
    scheduler: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    max_memory: int | None = None,
) -> xr.Dataset:
    """Run every point of ``config.sweep`` and return them as an xarray Dataset.

    One dimension per axis (named by the key's last component), one variable per metric.
    ``workers``: threads on this machine (default: all cores; the kernels release the GIL).
    ``scheduler``: a Dask scheduler address (``tcp://host:8786``) or ``"local"`` to start a
    local Dask cluster. ``max_memory``: bytes the sweep may use (default: what is available).
    """
    grid = _grid(config, workers, scheduler, max_memory)
    return io.sweep_dataset(grid, run_grid(grid, workers, scheduler, on_progress=on_progress))


def checkpoint_path(out: Path) -> Path:
    """Where a sweep writing ``out`` records its finished points."""
    return out.with_name(out.name + ".partial")


def sweep_to_file(
    config: Config,
    out: str | Path,
    workers: int | None = None,
    scheduler: str | None = None,
    resume: bool = False,
    on_progress: Callable[[int, int], None] | None = None,
    max_memory: int | None = None,
) -> tuple[Grid, np.ndarray]:
    """Run the grid like :func:`sweep`, writing netCDF to ``out`` atomically, resumable after any
    crash; returns the grid and its metrics table (shape (*axes, len(METRICS))).

    Finished points are recorded in ``<out>.partial`` as they arrive; ``resume=True`` runs only
    the points missing from it. The record is deleted once ``out`` is written. While it runs,
    the sweep holds a lock on ``out``: a second sweep on the same output is refused.
    """
    out = Path(out)
    partial = checkpoint_path(out)
    grid = _grid(config, workers, scheduler, max_memory)
    with output_lock(out):
        if partial.exists() and not resume:
            raise ConfigError(f"{partial}: an interrupted sweep left this; pass --resume to continue it, or delete it")
        table = run_grid(grid, workers, scheduler, checkpoint=partial, resume=resume, on_progress=on_progress)
        io.sweep_layout(grid, table).write(out)
        partial.unlink()
    return grid, table


def capacity_to_file(
    config: Config,
    targets: list,
    out: str | Path,
    workers: int | None = None,
    scheduler: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    max_memory: int | None = None,
):
    """Search every setting's capacity (:func:`fastsim.capacity.run`) and write it as netCDF to
    ``out`` (atomically); returns the :class:`~fastsim.capacity.Capacity`."""
    from . import capacity

    grid = _fits(capacity.settings(config), workers, scheduler, max_memory, 0)
    result = capacity.run(grid, targets, workers, scheduler, on_progress)
    io.capacity_layout(result, targets).write(out)
    return result
