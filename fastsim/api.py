"""The Python API for sweeps: run a config's grid and get (or write) a labelled Dataset."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .config import Config, ConfigError
from .grid import run_grid

if TYPE_CHECKING:
    import xarray as xr


def _load_io() -> Any:
    from . import io

    io.warm_up()
    return io


def _run_and_label(config: Config, **grid_options: Any) -> tuple[xr.Dataset, Any]:
    """Run the grid while a thread imports and warms the xarray layer (about a second of
    first-use costs that would otherwise follow the sweep); returns (dataset, io module)."""
    with ThreadPoolExecutor(1) as helper:
        io_loaded = helper.submit(_load_io)
        table = run_grid(config, **grid_options)
        io = io_loaded.result()
    return io.sweep_dataset(config, table), io


def sweep(
    config: Config,
    workers: int | None = None,
    scheduler: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> xr.Dataset:
    """Run every point of ``config.sweep`` and return them as an xarray Dataset.

    One dimension per axis (named by the key's last component), one variable per metric.
    ``workers``: processes on this machine (default: all cores). ``scheduler``: a Dask scheduler
    address (``tcp://host:8786``) or ``"local"`` to start a local Dask cluster.
    """
    ds, _ = _run_and_label(config, workers=workers, scheduler=scheduler, on_progress=on_progress)
    return ds


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
) -> xr.Dataset:
    """Like :func:`sweep`, writing netCDF to ``out`` atomically, resumable after any crash.

    Finished points are recorded in ``<out>.partial`` as they arrive; ``resume=True`` runs only
    the points missing from it. The record is deleted once ``out`` is written.
    """
    out = Path(out)
    partial = checkpoint_path(out)
    if partial.exists() and not resume:
        raise ConfigError(f"{partial}: an interrupted sweep left this; pass --resume to continue it, or delete it")
    out.parent.mkdir(parents=True, exist_ok=True)
    ds, io = _run_and_label(
        config, workers=workers, scheduler=scheduler, checkpoint=partial, resume=resume, on_progress=on_progress
    )
    io.write_netcdf(ds, out)
    partial.unlink()
    return ds
