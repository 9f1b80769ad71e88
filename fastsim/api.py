"""The Python API for sweeps: run a config's grid and get (or write) a labelled Dataset."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from . import io
from .config import Config, ConfigError
from .grid import run_grid

if TYPE_CHECKING:
    import xarray as xr


def sweep(
    config: Config,
    workers: int | None = None,
    scheduler: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> xr.Dataset:
    """Run every point of ``config.sweep`` and return them as an xarray Dataset.

    One dimension per axis (named by the key's last component), one variable per metric.
    ``workers``: threads on this machine (default: all cores; the kernels release the GIL).
    ``scheduler``: a Dask scheduler address (``tcp://host:8786``) or ``"local"`` to start a
    local Dask cluster.
    """
    return io.sweep_dataset(config, run_grid(config, workers, scheduler, on_progress=on_progress))


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
) -> np.ndarray:
    """Run the grid like :func:`sweep`, writing netCDF to ``out`` atomically, resumable after any
    crash; returns the metrics table (shape (*axes, len(METRICS))).

    Finished points are recorded in ``<out>.partial`` as they arrive; ``resume=True`` runs only
    the points missing from it. The record is deleted once ``out`` is written.
    """
    out = Path(out)
    partial = checkpoint_path(out)
    if partial.exists() and not resume:
        raise ConfigError(f"{partial}: an interrupted sweep left this; pass --resume to continue it, or delete it")
    out.parent.mkdir(parents=True, exist_ok=True)
    table = run_grid(config, workers, scheduler, checkpoint=partial, resume=resume, on_progress=on_progress)
    io.sweep_layout(config, table).write(out)
    partial.unlink()
    return table
