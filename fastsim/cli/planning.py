"""``fastsim capacity`` and ``fastsim plan``: the planner's questions, parsed and printed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..api import LARGEST_POOL

from .common import (AttainmentOpt, ConfigArg, MaxMemoryOpt, QuietOpt, ResumeOpt, SchedulerOpt, SetOpt, TargetOpt,
                     WorkersOpt, command, err, load, max_memory, notices, out, print_grouped, print_table,
                     run_to_file, user_errors)


@command
def capacity(
    config: ConfigArg,
    set_: SetOpt = None,
    target: TargetOpt = None,
    attainment: AttainmentOpt = None,
    out_path: Annotated[
        Optional[Path], typer.Option("--out", help="netCDF output (default: results/<config name>-capacity.nc).")
    ] = None,
    workers: WorkersOpt = None,
    scheduler: SchedulerOpt = None,
    resume: ResumeOpt = False,
    quiet: QuietOpt = False,
    max_memory_: MaxMemoryOpt = None,
) -> None:
    """The highest request rate each setting of the grid (its rate axis removed) sustains while
    every target holds; default target: the config's slo met by 90 % of requests."""
    from ..api import capacity_rows, capacity_to_file, targets

    with user_errors():
        cfg = load(config, set_)
        goals = targets(cfg, target, attainment)
        limit = max_memory(max_memory_)
    destination = out_path or Path("results") / f"{config.stem}-capacity.nc"
    started = time.perf_counter()
    grid, answers = run_to_file("capacity", quiet, destination, lambda on_progress: capacity_to_file(
        cfg, goals, destination, workers, scheduler, resume, on_progress, limit), unit="settings")
    err.print(f"wrote {destination} ({grid.size} settings, {sum(a.simulations for a in answers)} simulations in "
              f"{time.perf_counter() - started:.1f} s)")
    title, headers, rows, labels = capacity_rows(grid, answers, goals)
    print_table(title, headers, rows, left=labels)
    notices(cfg)


@command
def plan(
    config: ConfigArg,
    set_: SetOpt = None,
    target: TargetOpt = None,
    attainment: AttainmentOpt = None,
    max_replicas: Annotated[int, typer.Option(help="The most replicas a candidate may take.", min=1,
                                                    max=LARGEST_POOL)] = 64,
    as_json: Annotated[bool, typer.Option("--json", help="Print the ranked candidates as JSON.")] = False,
    output_tok_s: Annotated[Optional[float], typer.Option(
        "--output-tok-s", help="Demand in output tokens a second: sets workload.rate to it over the workload's "
                               "mean output.")] = None,
    every: Annotated[bool, typer.Option("--all", help="List every candidate (default: the best per GPU and "
                                                      "model, or the top ten).")] = False,
    out_path: Annotated[
        Optional[Path], typer.Option("--out", help="netCDF output (default: results/<config name>-plan.nc).")
    ] = None,
    workers: WorkersOpt = None,
    scheduler: SchedulerOpt = None,
    resume: ResumeOpt = False,
    quiet: QuietOpt = False,
    max_memory_: MaxMemoryOpt = None,
) -> None:
    """The cheapest fleet that meets the targets: for every candidate of the grid (any axis but
    fleet.replicas), the fewest replicas meeting them at the workload's traffic, ranked by USD
    per hour, then GPUs, then TTFT p99. Default target: the config's slo met by 90 % of requests."""
    from ..api import plan_demand, plan_entries, plan_rows, plan_to_file, targets

    with user_errors():
        cfg = load(config, set_, plan=True)
        if output_tok_s is not None:
            cfg, mean = plan_demand(cfg, output_tok_s)
            err.print(f"{output_tok_s:,g} output tokens/s: workload.rate {cfg.workload.rate:.4g}/s at a mean output of "
                      f"{mean:.1f} tokens")
        goals = targets(cfg, target, attainment, "plan")
        limit = max_memory(max_memory_)
    destination = out_path or Path("results") / f"{config.stem}-plan.nc"
    started = time.perf_counter()
    grid, answers = run_to_file("plan", quiet or as_json, destination, lambda on_progress: plan_to_file(
        cfg, goals, destination, max_replicas, workers, scheduler, resume, on_progress, limit), unit="candidates")
    simulations = sum(a.simulations for a in answers)
    err.print(f"wrote {destination} ({grid.size} candidates, {simulations} simulations in "
              f"{time.perf_counter() - started:.1f} s)")
    if as_json:
        typer.echo(json.dumps(plan_entries(grid, answers)))
    else:
        title, headers, groups, notes = plan_rows(grid, answers, goals, max_replicas, every)
        out.print(title)
        print_grouped(headers, groups)
        for note in notes:
            out.print(note)
    notices(cfg)


@command
def frontier(
    config: ConfigArg,
    set_: SetOpt = None,
    concurrency: Annotated[
        Optional[str], typer.Option(help="Clients, comma-separated (default: the config's workload.concurrency "
                                         "axis, else 1,2,4,...,1024).")
    ] = None,
    out_path: Annotated[
        Optional[Path], typer.Option("--out", help="netCDF output (default: results/<config name>-frontier.nc).")
    ] = None,
    workers: WorkersOpt = None,
    scheduler: SchedulerOpt = None,
    resume: ResumeOpt = False,
    quiet: QuietOpt = False,
    max_memory_: MaxMemoryOpt = None,
) -> None:
    """Throughput per GPU against interactivity: every candidate of the grid (any axis but the
    load) under closed-loop clients at each concurrency, the frontier marked."""
    from ..api import ConfigError, frontier_rows, frontier_to_file

    with user_errors():
        cfg = load(config, set_)
        limit = max_memory(max_memory_)
        clients = None
        if concurrency is not None:
            try:
                clients = [int(c) for c in concurrency.split(",")]
            except ValueError:
                raise ConfigError(f"--concurrency {concurrency!r}: whole numbers of clients, comma-separated") from None
    destination = out_path or Path("results") / f"{config.stem}-frontier.nc"
    started = time.perf_counter()
    grid, table, on = run_to_file("frontier", quiet, destination, lambda on_progress: frontier_to_file(
        cfg, destination, clients, workers, scheduler, resume, on_progress, limit))
    err.print(f"wrote {destination} ({on.size} points in {time.perf_counter() - started:.1f} s)")
    title, headers, rows, labels = frontier_rows(grid, table, on)
    print_table(title, headers, rows, left=labels)
    notices(cfg)
