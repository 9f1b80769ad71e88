"""The Python API: load a config, run a scenario, a sweep, a capacity search or a plan, fit a
calibration, compare and draw results, and get (or write) labelled datasets. The command line
calls only this module: beside the functions, it names what the command line shows (presets, the
keys' reference, the summaries' rows, the metrics catalog)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ._atomic import atomic_path, check_writable
from .analysis import frontier as frontier_of
from .analysis.capacity import RATE, CapacitySearch
from .analysis.plan import MAX_REPLICAS, REPLICAS, PlanSearch
from .analysis.plan import for_demand as plan_demand  # noqa: F401
from .analysis import simulation
from .analysis.simulation import Result
from .analysis.targets import Target, targets_from
from .engine import checks
from .model.loading import read_config
from .model.schema import Config, ConfigError
from .sweep import io, memory
from .sweep.checkpoint import Checkpoint
from .sweep.files import output_lock
from .sweep.grid import Grid, build_grid
from .sweep.backends import check_scheduler, in_worker
from .sweep.runner import Progress, Task, run_grid

# What the command line shows, named here so that it imports nothing else of the package.
from .analysis.catalog import METRICS  # noqa: F401
from .analysis.compare import compare, describe_change  # noqa: F401
from .analysis.measured import describe as describe_run  # noqa: F401
from .analysis.simulation import drift  # noqa: F401
from .analysis.plot import figure as plot  # noqa: F401
from . import bench as _bench
from .bench import BenchCheckFailed, cold_start, import_costs, sweep_overhead  # noqa: F401
from .model.keys import config_keys, default_text, reference_markdown  # noqa: F401
from .model.loading import parse_override  # noqa: F401
from .model.fleet import prefix_cache  # noqa: F401
from .model.hf_config import Approximation, read as model_shape  # noqa: F401
from .model.presets import DATASHEETS, HARDWARE, MODELS, NETWORK, PRICE_SOURCES  # noqa: F401
from .model.schema import LARGEST_POOL  # noqa: F401
from .sweep.checkpoint import ResumeWarning  # noqa: F401
from .sweep.memory import parse_size  # noqa: F401
from .sweep.summary import (capacity_rows, describe, frontier_rows, next_steps, plan_entries, plan_rows, summarize,  # noqa: F401
                            unsteady)

if TYPE_CHECKING:
    import xarray as xr

    from .engine.traffic import Traffic

__all__ = ["Result", "calibrate", "capacity", "capacity_to_file", "check_memory", "checkpoint_path", "load_config",
           "plan", "plan_to_file", "simulate", "sweep", "sweep_to_file", "targets", "write_requests"]


def load_config(path: str | Path, overrides: dict[str, Any] | None = None, plan: bool = False) -> Config:
    """Read a YAML config (following ``extends:``), apply dotted-key ``overrides`` (a key
    ``sweep.<dotted.key>`` sets one sweep axis), validate it and check that its base scenario can
    run; every problem is a :class:`ConfigError` naming the key. ``plan``: the config is a plan's,
    whose prefill pool may be ``auto`` (the plan sizes it)."""
    config = read_config(path, overrides)
    checks.check(config, plan)
    return config


def simulate(config: Config, traffic: Traffic | None = None, checked: bool = False, with_itl: bool = True
             ) -> Result:
    """Run one scenario: ``config``'s base values (its ``sweep:`` grid is ignored); see
    :func:`fastsim.analysis.simulation.simulate`. Called on the main thread, the run goes on a
    worker thread that it waits for (:func:`fastsim.sweep.backends.in_worker`): Ctrl-C takes
    effect at once, and never lands in compiled code."""
    return in_worker(simulation.simulate, config, traffic, checked, with_itl)


def bench(*args, **kwargs) -> list:
    """:func:`fastsim.bench.bench`, off the main thread as :func:`simulate`."""
    return in_worker(_bench.bench, *args, **kwargs)


def traffic_costs(*args, **kwargs) -> dict[str, float]:
    """:func:`fastsim.bench.traffic_costs`, off the main thread as :func:`simulate`."""
    return in_worker(_bench.traffic_costs, *args, **kwargs)


def check_memory(config: Config, limit: int | None = None) -> None:
    """Refuse (a :class:`ConfigError` naming the key that drives the size) a run of ``config``
    that needs more memory than ``limit`` bytes (default: what the machine has available)."""
    memory.check(config, limit=limit)


def write_requests(result: Result, out: str | Path) -> Path:
    """Write a run's per-request results (arrival, lengths, first and last token times, replicas)
    as netCDF to ``out``, atomically (a full disk is an ``OSError``; check the path first with
    :func:`check_writable`)."""
    return io.requests_layout(result).write(out)


def _fits(grid: Grid, workers: int | None, scheduler: str | None, max_memory: int | None, points: int) -> Grid:
    """Check that the grid's largest point fits in memory on every local worker, beside a table
    of ``points`` points, and that ``scheduler`` is one; returns the grid."""
    if scheduler is not None:
        check_scheduler(scheduler)
    local = scheduler is None or scheduler == "local"
    memory.check(memory.largest(grid), (workers or os.cpu_count() or 1) if local else 0, points, max_memory)
    return grid


def _grid(config: Config, workers: int | None, scheduler: str | None, max_memory: int | None) -> Grid:
    """Validate the grid, and check that it fits in memory (:func:`_fits`)."""
    grid = build_grid(config)
    return _fits(grid, workers, scheduler, max_memory, grid.size)


def sweep(
    config: Config,
    workers: int | None = None,
    scheduler: str | None = None,
    on_progress: Progress | None = None,
    max_memory: int | None = None,
) -> xr.Dataset:
    """Run every point of ``config.sweep`` and return them as an xarray Dataset.

    One dimension per axis (named by the key's last component), one variable per metric.
    ``workers``: threads on this machine (default: all cores; the kernels release the GIL), or
    forked processes for many points of under 2,000 requests (Linux; see :mod:`.sweep.runner`).
    ``scheduler``: a Dask scheduler address (``tcp://host:8786``) or ``"local"`` to start a
    local Dask cluster. ``max_memory``: bytes the sweep may use (default: what is available).
    """
    grid = _grid(config, workers, scheduler, max_memory)
    return io.sweep_layout(grid, run_grid(grid, workers, scheduler, on_progress=on_progress)).to_dataset()


def checkpoint_path(out: Path) -> Path:
    """Where a run writing ``out`` records its finished points."""
    return out.with_name(out.name + ".partial")


def _to_file(grid: Grid, task: Task | None, out: Path, workers: int | None, scheduler: str | None, resume: bool,
             on_progress: Progress | None, read: Callable[[np.ndarray], Any], layout: Callable[[Any], io.Layout]
             ) -> Any:
    """Run ``task`` on every point of ``grid`` under a lock on ``out``, checkpointed beside it,
    write ``layout(results)`` to ``out`` and drop the checkpoint, where ``results`` is
    ``read(table)``; returns them."""
    check_writable(out, "--out")
    partial = checkpoint_path(out)
    with output_lock(out):
        if partial.exists() and not partial.is_file():
            raise ConfigError(f"{partial}: not a file (this run's checkpoint goes there); remove it")
        if partial.exists() and not resume:
            raise ConfigError(f"{partial}: an interrupted run left this; pass --resume to continue it, or delete it")
        try:
            table = run_grid(grid, workers, scheduler, checkpoint=partial, resume=resume, on_progress=on_progress,
                             task=task)
        except BaseException:
            if Checkpoint.is_empty(partial):  # nothing finished: nothing to resume
                partial.unlink(missing_ok=True)
            raise
        results = read(table)
        layout(results).write(out)
        partial.unlink()
    return results


def sweep_to_file(
    config: Config,
    out: str | Path,
    workers: int | None = None,
    scheduler: str | None = None,
    resume: bool = False,
    on_progress: Progress | None = None,
    max_memory: int | None = None,
) -> tuple[Grid, np.ndarray]:
    """Run the grid like :func:`sweep`, writing netCDF to ``out`` atomically, resumable after any
    crash; returns the grid and its metrics table (shape (*axes, len(METRICS))).

    Finished points are recorded in ``<out>.partial`` as they arrive; ``resume=True`` runs only
    the points missing from it. The record is deleted once ``out`` is written. While it runs,
    the sweep holds a lock on ``out``: a second sweep on the same output is refused.
    """
    out = Path(out)
    grid = _grid(config, workers, scheduler, max_memory)
    table = _to_file(grid, None, out, workers, scheduler, resume, on_progress, lambda t: t,
                     lambda t: io.sweep_layout(grid, t))
    return grid, table


def frontier_to_file(
    config: Config,
    out: str | Path,
    concurrency: list[int] | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
    resume: bool = False,
    on_progress: Progress | None = None,
    max_memory: int | None = None,
) -> tuple[Grid, np.ndarray, np.ndarray]:
    """Run every candidate of ``config``'s grid under closed-loop clients at each of
    ``concurrency`` (:func:`fastsim.analysis.frontier.grid_config`), write the sweep with its
    frontier (``on_frontier``) as netCDF to ``out`` (atomically, resumable as
    :func:`sweep_to_file`); returns the grid, its metrics table and which points are on the
    frontier."""
    out = Path(out)
    grid = _grid(frontier_of.grid_config(config, concurrency), workers, scheduler, max_memory)
    table = _to_file(grid, None, out, workers, scheduler, resume, on_progress, lambda t: t,
                     lambda t: io.frontier_layout(grid, t, frontier_of.on_frontier(t)))
    return grid, table, frontier_of.on_frontier(table)


def capacity_settings(config: Config) -> Grid:
    """The settings a capacity search answers: ``config``'s grid with its rate axis removed."""
    if config.workload.concurrency is not None or "workload.concurrency" in config.sweep:
        raise ConfigError("workload.concurrency: capacity searches workload.rate, which closed-loop clients do not "
                          "have; sweep workload.concurrency instead (fastsim sweep), or set workload.concurrency: null")
    return build_grid(config.model_copy(update={"sweep": {k: v for k, v in config.sweep.items() if k != RATE}}))


def targets(config: Config, texts: list[str] | None = None, attainment: float | None = None,
            what: str = "capacity") -> list[Target]:
    """The targets a capacity search or a plan holds to: each of ``texts`` (``'ttft_p99_s<=0.5'``),
    plus the config's SLO met by ``attainment`` (default 0.9) of requests when ``attainment`` is
    given or no text is. A target that cannot be read is a :class:`ConfigError`."""
    return targets_from(config, texts, attainment, what)


def capacity(
    config: Config,
    target: list[str] | None = None,
    attainment: float | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
    on_progress: Progress | None = None,
    max_memory: int | None = None,
) -> xr.Dataset:
    """The highest ``workload.rate`` at which every target holds (to 1 %), for every setting of
    ``config``'s grid with its rate axis removed, as a Dataset: ``max_rate_rps``, ``binding`` (the
    target that fails just above it) and every metric at that rate. Targets as :func:`targets`
    (default: the config's SLO met by 90 % of requests)."""
    goals = targets(config, target, attainment)
    grid = _fits(capacity_settings(config), workers, scheduler, max_memory, 0)
    task = CapacitySearch(goals)
    answers = task.answers(run_grid(grid, workers, scheduler, on_progress=on_progress, task=task))
    return io.capacity_layout(grid, answers, goals).to_dataset()


def capacity_to_file(
    config: Config,
    targets: list[Target],
    out: str | Path,
    workers: int | None = None,
    scheduler: str | None = None,
    resume: bool = False,
    on_progress: Progress | None = None,
    max_memory: int | None = None,
) -> tuple[Grid, np.ndarray]:
    """Search every setting's capacity (:func:`fastsim.analysis.capacity.search`) and write it as
    netCDF to ``out`` (atomically; checkpointed and resumable as :func:`sweep_to_file`); returns
    the settings' grid and their answers (:class:`~fastsim.analysis.capacity.Answer`, C order)."""
    out = Path(out)
    grid = _fits(capacity_settings(config), workers, scheduler, max_memory, 0)
    task = CapacitySearch(targets)
    answers = _to_file(grid, task, out, workers, scheduler, resume, on_progress, task.answers,
                       lambda a: io.capacity_layout(grid, a, targets))
    return grid, answers


def plan_candidates(config: Config) -> Grid:
    """The candidates a plan ranks: every point of ``config``'s grid, which may not list
    ``fleet.replicas`` (that is what the plan chooses). A point that cannot run (70 GB of weights
    on one small GPU) stays a candidate, answered "cannot run" with the reason."""
    if REPLICAS in config.sweep:
        raise ConfigError(f"sweep: {REPLICAS} is what fastsim plan chooses; take it out of the grid "
                          "(the candidates are every other axis)")
    return build_grid(config, check=False)  # a candidate that cannot run is an answer, not an error


def plan(
    config: Config,
    target: list[str] | None = None,
    attainment: float | None = None,
    max_replicas: int = MAX_REPLICAS,
    workers: int | None = None,
    scheduler: str | None = None,
    on_progress: Progress | None = None,
    max_memory: int | None = None,
) -> xr.Dataset:
    """For every candidate of ``config``'s grid (any axis but ``fleet.replicas``), the fewest
    replicas, up to ``max_replicas``, whose fleet meets every target at the workload's traffic,
    as a Dataset over the candidates: ``replicas`` (NaN: none), ``rank`` (1: cheapest by USD per
    hour, then GPUs, then TTFT p99), ``binding`` and every metric at the answer. Targets as
    :func:`targets`."""
    goals = targets(config, target, attainment, "plan")
    grid = _fits(plan_candidates(config), workers, scheduler, max_memory, 0)
    task = PlanSearch(goals, max_replicas)
    answers = task.answers(run_grid(grid, workers, scheduler, on_progress=on_progress, task=task), grid.config)
    return io.plan_layout(grid, answers, goals, max_replicas).to_dataset()


def plan_to_file(
    config: Config,
    targets: list[Target],
    out: str | Path,
    max_replicas: int = MAX_REPLICAS,
    workers: int | None = None,
    scheduler: str | None = None,
    resume: bool = False,
    on_progress: Progress | None = None,
    max_memory: int | None = None,
) -> tuple[Grid, np.ndarray]:
    """For every candidate of ``config``'s grid, the fewest replicas that meet the targets
    (:func:`fastsim.analysis.plan.search`), written as netCDF to ``out`` (atomically; checkpointed
    and resumable as :func:`sweep_to_file`); returns the candidates' grid and their answers
    (:class:`~fastsim.analysis.plan.Answer`, C order; rank them with :func:`fastsim.analysis.plan.ranking`)."""
    out = Path(out)
    task = PlanSearch(targets, max_replicas)
    grid = _fits(plan_candidates(config), workers, scheduler, max_memory, 0)
    answers = _to_file(grid, task, out, workers, scheduler, resume, on_progress, lambda t: task.answers(t, grid.config),
                       lambda a: io.plan_layout(grid, a, targets, max_replicas))
    return grid, answers


def calibrate(config: Config, measured: list[str | Path], fit: list[str] | None = None, out: str | Path | None = None,
              on_read: Callable[[list], None] | None = None, on_evaluation: Callable[[int], None] | None = None):
    """Fit ``config``'s calibration (the keys ``fit``, default every one; the jitter's only when
    some run measured a tail) to the runs of the
    ``measured`` files (:mod:`fastsim.analysis.measured`); write the fitted ``calibration:``
    section to ``out`` (YAML, atomically) when given. ``on_read(runs)`` is told the runs read,
    before the fit starts, and ``on_evaluation(count)`` each evaluation's count as it ends (every
    run simulated once). Returns the :class:`~fastsim.analysis.calibrate.Fit`."""
    from .analysis import calibrate as fitting
    from .analysis.measured import read

    fitting.fit_keys(fit)  # a bad --fit is named before the files are read
    if out is not None:
        check_writable(out, "--out")

    def calibrated():  # simulations: off the main thread, as simulate()
        runs = read([Path(m) for m in measured], config)
        keys = fitting.fit_keys(fit, runs)
        if on_read is not None:
            on_read(runs)
        return fitting.fit(runs, keys, on_evaluation)

    result = in_worker(calibrated)
    if out is not None:
        with atomic_path(Path(out)) as tmp:
            tmp.write_text(fitting.calibration_yaml(result))
    return result
