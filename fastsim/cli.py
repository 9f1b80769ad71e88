"""The ``fastsim`` command: parses arguments, calls the Python API, prints. Nothing else."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from .model.loading import parse_override
from .model.schema import Config, ConfigError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    help="Simulate LLM-serving batching policies: throughput and latency, fast and exact.",
)
# Wide when piped (rich would wrap tables at 80 columns); a terminal keeps its own width.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False)

ConfigArg = Annotated[Path, typer.Argument(help="Scenario YAML (see configs/).", show_default=False)]
SetOpt = Annotated[
    Optional[list[str]],
    typer.Option("--set", help="Override a config key: dotted.key=value (repeatable).", metavar="KEY=VALUE"),
]


MaxMemoryOpt = Annotated[
    Optional[str],
    typer.Option("--max-memory", help="Refuse work needing more memory than this (8GB, 500MB; default: what is available).",
                 metavar="SIZE"),
]


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


@contextlib.contextmanager
def _user_errors():
    """Bad input, and memory that ran out anyway, end as one line on stderr with exit code 2."""
    try:
        yield
    except ConfigError as exc:
        raise _fail(str(exc)) from None
    except MemoryError:
        raise _fail("out of memory: make the run smaller (workload.n_requests) or use fewer --workers") from None


def _load(path: Path, sets: list[str] | None) -> Config:
    from .api import load_config

    return load_config(path, dict(parse_override(s) for s in sets or []))


def _max_memory(text: str | None) -> int | None:
    from .sweep.memory import parse_size

    return None if text is None else parse_size(text)


def _print_table(title: str, headers: list[str], rows: list[list[str]], left: int = 1) -> None:
    """Print a title line and a borderless table; the first ``left`` columns are labels."""
    table = Table(box=None, header_style="bold")
    for j, h in enumerate(headers):
        table.add_column(h, justify="left" if j < left else "right")
    for row in rows:
        table.add_row(*row)
    out.print(title, soft_wrap=True)
    out.print(table)


class _RateColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        return Text(f"{task.speed:,.0f}/s" if task.speed else "", style="progress.data.speed")


@app.command()
def run(
    config: ConfigArg,
    set_: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object of the metrics.")] = False,
    requests_out: Annotated[
        Optional[Path], typer.Option("--requests-out", help="Write per-request results as netCDF.", metavar="PATH.nc")
    ] = None,
    max_memory: MaxMemoryOpt = None,
) -> None:
    """Simulate one scenario (the config's base values; its sweep grid is ignored)."""
    from .analysis.metrics import METRICS
    from .api import simulate
    from .sweep import memory

    with _user_errors():
        cfg = _load(config, set_)
        memory.check(cfg, limit=_max_memory(max_memory))
        result = simulate(cfg)
    if requests_out is not None:
        from .sweep.io import requests_layout

        try:
            requests_layout(result).write(requests_out)
        except OSError as exc:
            raise _fail(f"--requests-out {requests_out}: {exc.strerror or exc}") from None
    if as_json:
        clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in result.metrics.items()}
        typer.echo(json.dumps(clean))
        return
    from .sweep.summary import describe

    title = describe(cfg, result.arrival_s.size)
    rows = [[k, f"{v:.6g}", METRICS[k][0]] for k, v in result.metrics.items()]
    _print_table(title, ["metric", "value", "units"], rows)


@app.command()
def sweep(
    config: ConfigArg,
    set_: SetOpt = None,
    out_path: Annotated[
        Optional[Path], typer.Option("--out", help="netCDF output (default: results/<config name>.nc).")
    ] = None,
    workers: Annotated[
        Optional[int], typer.Option(help="Worker threads on this machine (default: all cores).", min=1)
    ] = None,
    scheduler: Annotated[
        Optional[str], typer.Option(help="Dask scheduler address (tcp://host:8786), or 'local'.")
    ] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue an interrupted sweep.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    max_memory: MaxMemoryOpt = None,
) -> None:
    """Run the config's sweep grid into one labelled netCDF dataset, then print a summary."""
    from .api import sweep_to_file
    from .sweep.summary import summarize

    with _user_errors():
        cfg = _load(config, set_)
        limit = _max_memory(max_memory)
    target = out_path or Path("results") / f"{config.stem}.nc"
    progress, on_progress = _progress("sweep", quiet)
    started = time.perf_counter()
    try:
        with _user_errors():
            grid, table = sweep_to_file(
                cfg, target, workers=workers, scheduler=scheduler, resume=resume, on_progress=on_progress,
                max_memory=limit,
            )
    except KeyboardInterrupt:
        raise _fail(f"interrupted{_kept(target)}", 130) from None
    except OSError as exc:
        raise _fail(f"{target}: {exc.strerror or exc}") from None
    finally:
        progress.stop()
    elapsed = time.perf_counter() - started
    n_points = table.size // table.shape[-1]
    err.print(f"wrote {target} ({n_points} point{'s' * (n_points != 1)} in {elapsed:.1f} s)")
    title, headers, rows, labels = summarize(grid, table)
    _print_table(title, headers, rows, left=labels)


def _kept(out: Path) -> str:
    """What an interrupted run kept, for its last line."""
    from .api import checkpoint_path

    kept = checkpoint_path(out)
    return f"; finished points are kept in {kept}: rerun with --resume" if kept.exists() else "; nothing was kept"


def _progress(label: str, quiet: bool) -> tuple[Progress, Callable[[int, int], None]]:
    """A progress bar on stderr that appears with the first report (after any set-up error)."""
    progress = Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("points"),
        _RateColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=err,
        disable=quiet,
    )
    task = progress.add_task(label, total=None)

    def on_progress(done: int, total: int) -> None:
        if progress.tasks[0].total is None:  # first call: points resumed from a checkpoint are not speed
            progress.start()
            progress.reset(task, total=total, completed=done)
        else:
            progress.update(task, completed=done)

    return progress, on_progress


@app.command()
def capacity(
    config: ConfigArg,
    set_: SetOpt = None,
    target: Annotated[
        Optional[list[str]],
        typer.Option("--target", help="A bound that must hold: METRIC<=VALUE or METRIC>=VALUE (repeatable).",
                     metavar="METRIC<=VALUE"),
    ] = None,
    attainment: Annotated[
        Optional[float], typer.Option(help="With the config's slo: the fraction of requests that must meet it.",
                                      min=0, max=1)
    ] = None,
    out_path: Annotated[
        Optional[Path], typer.Option("--out", help="netCDF output (default: results/<config name>-capacity.nc).")
    ] = None,
    workers: Annotated[Optional[int], typer.Option(help="Worker threads (default: all cores).", min=1)] = None,
    scheduler: Annotated[Optional[str], typer.Option(help="Dask scheduler address, or 'local'.")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue an interrupted search.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
    max_memory: MaxMemoryOpt = None,
) -> None:
    """The highest request rate each setting of the grid (its rate axis removed) sustains while
    every target holds; default target: the config's slo met by 90 % of requests."""
    from .analysis.targets import targets_from
    from .api import capacity_to_file
    from .sweep.summary import capacity_rows

    with _user_errors():
        cfg = _load(config, set_)
        targets = targets_from(cfg, target, attainment)
        limit = _max_memory(max_memory)
    destination = out_path or Path("results") / f"{config.stem}-capacity.nc"
    progress, on_progress = _progress("capacity", quiet)
    started = time.perf_counter()
    try:
        with _user_errors():
            grid, table = capacity_to_file(cfg, targets, destination, workers, scheduler, resume, on_progress, limit)
    except KeyboardInterrupt:
        raise _fail(f"interrupted{_kept(destination)}", 130) from None
    except OSError as exc:
        raise _fail(f"{destination}: {exc.strerror or exc}") from None
    finally:
        progress.stop()
    err.print(f"wrote {destination} ({grid.size} settings, {int(table[..., 3].sum())} simulations in "
              f"{time.perf_counter() - started:.1f} s)")
    title, headers, rows, labels = capacity_rows(grid, table, targets)
    _print_table(title, headers, rows, left=labels)


@app.command()
def compare(
    baseline: Annotated[Path, typer.Argument(help="The reference dataset (.nc).", show_default=False)],
    candidate: Annotated[Path, typer.Argument(help="The dataset to check (.nc).", show_default=False)],
    rtol: Annotated[float, typer.Option(help="Relative change allowed in the worse direction.", min=0)] = 0.05,
    metric: Annotated[
        Optional[list[str]], typer.Option("--metric", help="Compare only these metrics (repeatable).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Compare two sweep (or capacity) datasets point by point. Exit 0: nothing got worse beyond
    --rtol; 1: a regression (the points are listed); 2: the datasets cannot be compared."""
    from .analysis.compare import compare as run_compare

    with _user_errors():
        report = run_compare(baseline, candidate, rtol, metric)
    if as_json:
        typer.echo(json.dumps(report.as_json()))
    else:
        def where(at: dict) -> str:
            return ", ".join(f"{k}={v}" for k, v in at.items()) or "-"

        rows = [[name, "higher" if r.direction > 0 else "lower", f"{r.worst_change:+.1%}", where(r.worst_at),
                 str(r.regressions), str(r.improvements)] for name, r in report.metrics.items()]
        _print_table(f"{candidate} against {baseline} (rtol {rtol:g}; worst change: negative is worse)",
                     ["metric", "better", "worst change", "at", "regressed", "improved"], rows)
        if report.regressed:
            shown = report.regressed_points[:20]
            _print_table(f"{len(report.regressed_points)} regressed point(s)" + (", the first 20" if len(shown) < len(report.regressed_points) else ""),
                         ["metric", "at", "baseline", "candidate", "change"],
                         [[p["metric"], where(p["at"]), f"{p['baseline']:.6g}", f"{p['candidate']:.6g}",
                           f"{p['change']:+.1%}"] for p in shown])
    if report.regressed:
        raise typer.Exit(1)


@app.command()
def plot(
    result: Annotated[Path, typer.Argument(help="A sweep or capacity dataset (.nc).", show_default=False)],
    x: Annotated[Optional[str], typer.Option("--x", help="Axis along x (default: rate, or the first).")] = None,
    y: Annotated[
        Optional[list[str]], typer.Option("--y", help="Metric to plot (repeatable; default: throughput and TTFT p99, "
                                                      "or max_rate_rps for capacity).")
    ] = None,
    hue: Annotated[Optional[str], typer.Option(help="Axis drawn as one line per value.")] = None,
    col: Annotated[Optional[str], typer.Option(help="Axis drawn as one panel per value.")] = None,
    sel: Annotated[
        Optional[list[str]], typer.Option("--sel", help="Fix an axis to one value: AXIS=VALUE (repeatable).")
    ] = None,
    out_path: Annotated[Optional[Path], typer.Option("--out", help="PNG to write (default: beside RESULT).")] = None,
) -> None:
    """Draw a sweep or capacity dataset: metrics against an axis, lines by --hue, panels by --col."""
    try:
        from .analysis.plot import figure
    except ImportError:
        raise _fail("fastsim plot needs matplotlib: pip install 'fastsim[plot]'") from None
    destination = out_path or result.with_suffix(".png")
    with _user_errors():
        written = figure(result, destination, x, y, hue, col, sel)
    err.print(f"wrote {written}")


@app.command()
def bench(
    n: Annotated[int, typer.Option("--n", help="Requests per run.", min=1)] = 1_000_000,
    repeats: Annotated[int, typer.Option(help="Timed runs per case (best is kept).", min=1)] = 5,
    sweep_points: Annotated[int, typer.Option(help="Points of the sweep-overhead grid.", min=4)] = 20_000,
) -> None:
    """Measure the simulator's own speed: simulated requests/s per policy and rate, one core."""
    from .bench import BenchCheckFailed
    from .bench import bench as run_bench

    err.print(f"benchmarking {n:,} requests per run (numpy traffic), best of {repeats}...")
    try:
        rows = run_bench(n, repeats=repeats)
    except BenchCheckFailed as exc:
        raise _fail(f"results failed their check: {exc}", 1) from None
    _print_table(
        f"fastsim bench: {n:,} requests, one core, pid {os.getpid()}",
        ["model", "policy/router", "rate/s", "steps/req", "first call", "kernel", "kernel req/s", "end-to-end req/s"],
        [
            [
                r.model,
                r.policy,
                f"{r.rate:g}",
                f"{r.steps / r.n_requests:.1f}",
                f"{r.first_call_s * 1e3:.0f} ms",
                f"{r.kernel_s * 1e3:.1f} ms",
                f"{r.kernel_rps / 1e6:.2f} M",
                f"{r.end_to_end_rps / 1e6:.2f} M",
            ]
            for r in rows
        ],
        left=2,
    )
    out.print(
        "first call = JIT compile or cache load (excluded from the rest); "
        "end-to-end adds traffic generation and metrics; every run checked (all done, tokens conserved)."
    )
    from .bench import sweep_overhead, traffic_costs

    for name, seconds in traffic_costs(n, repeats).items():
        out.print(f"traffic generation, {name}: {seconds * 1e9:.0f} ns/request")
    o = sweep_overhead(sweep_points)
    out.print(
        f"sweep overhead: {o.points:,} points of 10 requests, one thread: set-up (validate, block) "
        f"{o.setup_us_per_point:.1f} us/point, running {o.run_us_per_point:.0f} us/point"
    )


@app.command()
def presets() -> None:
    """List the hardware and model presets with the values they fill."""
    from .model.presets import HARDWARE, MODEL_SHAPES, MODELS, PRICE_SOURCES

    hw_fields = ["peak_tflops", "mem_bandwidth_tb_s", "mem_gb", "link_gb_s", "link_latency_us", "usd_per_gpu_hour"]
    _print_table(
        "hardware.preset (dense BF16 TFLOP/s, HBM TB/s, GB, link GB/s per direction, all-reduce latency us, "
        "on-demand USD per GPU-hour)",
        ["preset", *hw_fields],
        [[name, *(f"{values[f]:g}" for f in hw_fields)] for name, values in HARDWARE.items()],
    )
    out.print("prices (hardware.usd_per_gpu_hour overrides them):")
    for name, source in PRICE_SOURCES.items():
        out.print(f"  {name}: {source}", soft_wrap=True)
    out.print()
    model_fields = ["weight_gb", "kv_bytes_per_token", "params_b", "n_layers", "attn_dim", "hidden"]
    _print_table(
        "model.preset (BF16 weights; params_b: active per token; kv_heads: what engine.tp must divide)",
        ["preset", *model_fields, "kv_heads"],
        [[name, *(f"{values[f]:g}" for f in model_fields), str(MODEL_SHAPES[name].kv_heads)]
         for name, values in MODELS.items()],
    )


def main() -> None:
    """The console script. Ends with ``os._exit`` once output is flushed: every file is closed by
    then, and tearing down the interpreter with Numba and xarray loaded costs about 0.5 s."""
    try:
        app()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
