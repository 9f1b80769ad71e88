"""``fastsim run``, ``sweep``, ``bench`` and ``presets``: parse, call the API, print."""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer

from .common import (ConfigArg, MaxMemoryOpt, QuietOpt, ResumeOpt, SchedulerOpt, SetOpt, WorkersOpt, command, err,
                     fail, load, max_memory, notices, out, print_table, run_to_file, user_errors)

OutOpt = Annotated[Optional[Path], typer.Option("--out", help="netCDF output (default: results/<config name>.nc).")]


@command
def run(
    config: ConfigArg,
    set_: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object of the metrics.")] = False,
    requests_out: Annotated[
        Optional[Path], typer.Option("--requests-out", help="Write per-request results as netCDF.", metavar="PATH.nc")
    ] = None,
    max_memory_: MaxMemoryOpt = None,
) -> None:
    """Simulate one scenario (the config's base values; its sweep grid is ignored)."""
    from ..api import METRICS, check_memory, check_writable, describe, drift, simulate, write_requests

    with user_errors():
        cfg = load(config, set_)
        check_memory(cfg, max_memory(max_memory_))
        if requests_out is not None:
            check_writable(requests_out, "--requests-out")
        try:
            result = simulate(cfg)  # on a worker thread: Ctrl-C takes effect at once
        except KeyboardInterrupt:
            raise fail("interrupted", 130) from None
    if requests_out is not None:
        try:
            write_requests(result, requests_out)
        except OSError as exc:
            raise fail(f"--requests-out {requests_out}: {exc.strerror or exc}") from None
    if as_json:
        clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in result.metrics.items()}
        if result.acceptance:  # speculative decoding: per position, the share of verifications accepting it
            clean["acceptance_per_position"] = result.acceptance
        typer.echo(json.dumps(clean))
    else:
        rows = [[k, f"{v:.6g}", METRICS[k].units] for k, v in result.metrics.items()]
        if result.acceptance:
            rows.append(["acceptance_per_position", " ".join(f"{a:.3g}" for a in result.acceptance), "1"])
        print_table(describe(cfg, result.arrival_s.size), ["metric", "value", "units"], rows)
        moving = drift(result)
        if moving:
            err.print(f"notice: not steady: {moving}: these figures describe a run still changing, not the engine's "
                      "steady state; run more requests, or leave the start out with workload.warmup")
        if result.overloaded:
            err.print("notice: overloaded: the engine falls behind the arrivals (the last fifth of the requests wait "
                      "far longer for a first token than the first): its latencies grow with workload.n_requests")
    notices(cfg)


@command
def sweep(
    config: ConfigArg,
    set_: SetOpt = None,
    out_path: OutOpt = None,
    workers: WorkersOpt = None,
    scheduler: SchedulerOpt = None,
    resume: ResumeOpt = False,
    quiet: QuietOpt = False,
    max_memory_: MaxMemoryOpt = None,
) -> None:
    """Run the config's sweep grid into one labelled netCDF dataset, then print a summary."""
    from ..api import next_steps, summarize, sweep_to_file, unsteady

    with user_errors():
        cfg = load(config, set_)
        limit = max_memory(max_memory_)
    target = out_path or Path("results") / f"{config.stem}.nc"
    started = time.perf_counter()
    grid, table = run_to_file("sweep", quiet, target, lambda on_progress: sweep_to_file(
        cfg, target, workers=workers, scheduler=scheduler, resume=resume, on_progress=on_progress, max_memory=limit))
    n_points = table.size // table.shape[-1]
    err.print(f"wrote {target} ({n_points} point{'s' * (n_points != 1)} in {time.perf_counter() - started:.1f} s)")
    title, headers, rows, labels = summarize(grid, table)
    print_table(title, headers, rows, left=labels)
    note = unsteady(table)
    if note:
        err.print(note, soft_wrap=True)
    notices(cfg)
    err.print(next_steps(config, target, cfg), soft_wrap=True)


@command
def bench(
    n: Annotated[int, typer.Option("--n", help="Requests per run.", min=1, max=10**9)] = 1_000_000,
    repeats: Annotated[int, typer.Option(help="Timed runs per case (best is kept).", min=1, max=1000)] = 5,
    sweep_points: Annotated[int, typer.Option(help="Points of the sweep-overhead grid.", min=4, max=10**7)] = 20_000,
    cold: Annotated[bool, typer.Option(help="Also time a first run from an empty Numba cache (~15 s).")] = True,
) -> None:
    """Measure the simulator's own speed: simulated requests/s per policy, rate and fleet, one core."""
    from ..api import BenchCheckFailed, Config, check_memory, cold_start, import_costs, sweep_overhead, traffic_costs
    from ..api import bench as run_bench

    with user_errors():
        check_memory(Config().at({"workload.n_requests": n}))
    err.print(f"benchmarking {n:,} requests per run (numpy traffic), best of {repeats}...")
    try:
        rows = run_bench(n, repeats=repeats)
    except BenchCheckFailed as exc:
        raise fail(f"results failed their check: {exc}", 1) from None
    print_table(
        f"fastsim bench: {n:,} requests, one core, pid {os.getpid()}",
        ["model", "policy/router", "rate/s", "steps/req", "first call", "kernel", "kernel req/s", "end-to-end req/s"],
        [[r.model, r.policy, "closed" if r.rate is None else f"{r.rate:g}", f"{r.steps / r.n_requests:.1f}", f"{r.first_call_s * 1e3:.0f} ms",
          f"{r.kernel_s * 1e3:.1f} ms", f"{r.kernel_rps / 1e6:.2f} M", f"{r.end_to_end_rps / 1e6:.2f} M"]
         for r in rows],
        left=2,
    )
    out.print("first call = JIT compile or cache load (excluded from the rest); end-to-end adds traffic generation and "
              "metrics; every run checked (all done, tokens conserved).")
    imports = import_costs()
    slowest = max(imports, key=imports.get)
    out.print(f"model import: {len(imports)} shipped config.json presets, median "
              f"{sorted(imports.values())[len(imports) // 2] * 1e3:.1f} ms, slowest {imports[slowest] * 1e3:.1f} ms "
              f"({slowest}); read, counted and validated")
    for name, seconds in traffic_costs(n, repeats).items():
        out.print(f"traffic generation, {name}: {seconds * 1e9:.0f} ns/request")
    o = sweep_overhead(sweep_points)
    out.print(f"sweep overhead: {o.points:,} points of 10 requests, one thread: set-up (validate, block) "
              f"{o.setup_us_per_point:.1f} us/point, running {o.run_us_per_point:.0f} us/point")
    if cold:
        c = cold_start()
        out.print(f"cold start: a fresh process on configs/h100.yaml's scenario (2,000 requests) takes "
                  f"{c.compiling_s:.1f} s with an empty Numba cache (compiling), {c.cached_s:.1f} s once cached")


@command
def presets() -> None:
    """List the hardware and model presets with the values they fill."""
    from ..api import DATASHEETS, HARDWARE, MODELS, NETWORK, PRICE_SOURCES, Approximation, model_shape

    def num(v: float | None) -> str:
        return "n/a" if v is None else f"{v:g}"

    print_table(
        "hardware.preset (dense TFLOP/s by precision, HBM TB/s, GB, link GB/s per direction, GPUs a link joins, "
        "network GB/s per GPU between them, on-demand USD per GPU-hour)",
        ["preset", "bf16", "fp8", "fp4", "TB/s", "GB", "link", "domain", "network", "usd/h"],
        [[name, *(num(v[f]) for f in ("peak_tflops", "peak_tflops_fp8", "peak_tflops_fp4", "mem_bandwidth_tb_s",
                                        "mem_gb", "link_gb_s", "scaleup_gpus", "scaleout_gb_s", "usd_per_gpu_hour"))]
         for name, v in HARDWARE.items()],
    )
    out.print("datasheets:")
    for name, source in DATASHEETS.items():
        out.print(f"  {name}: {source}", soft_wrap=True)
    out.print(f"networks: {NETWORK}", soft_wrap=True)
    out.print("prices (hardware.usd_per_gpu_hour overrides them; n/a: none found, cost is NaN until it is set):")
    for name, source in PRICE_SOURCES.items():
        out.print(f"  {name}: {source}", soft_wrap=True)
    out.print()
    rows = []
    for name, path in MODELS.items():
        with warnings.catch_warnings():  # a listing imports every model: its notices are for a run
            warnings.simplefilter("ignore", Approximation)
            shape = model_shape(path)
        kv = shape.fields()["kv_bytes_per_token"] * shape.full_layers / shape.n_layers  # (its full layers')
        moe = f"{shape.experts_per_token}/{shape.experts}" if shape.experts else "-"
        held = (f"{shape.window_layers} x {shape.window_tokens:,} {shape.window_kind}" if shape.window_layers else
                f"{shape.linear_layers} linear" if shape.linear_layers else "-")
        rows.append([name, shape.family, f"{shape.total / 1e9:.1f}", f"{shape.active_with_head / 1e9:.1f}", moe,
                     shape.dtype, f"{kv:,.0f}", held])
    print_table(
        "model.preset (parameters in billions: stored, and active per token with the LM head; experts: picked of "
        "routed; KV cache bytes per token at the preset's KV dtype, in the full-attention layers; local layers: "
        "how many hold a window (or a chunk) of how many tokens, or linear-attention layers a state)",
        ["preset", "architecture", "total", "active", "experts", "dtype", "kv_bytes", "local"],
        rows,
        left=2,
    )


@command
def keys(
    section: Annotated[Optional[str], typer.Argument(help="Only this section or key (engine, workload.prompt, "
                                                          "...).", show_default=False)] = None,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print every key's reference as a Markdown page "
                                                               "(docs/configuration.md).")] = False,
) -> None:
    """List every config key (what a file, --set and sweep: accept) with its kind, default and units."""
    from ..api import config_keys, default_text, reference_markdown

    from rich.table import Table

    if markdown:
        print(reference_markdown(), end="")
        return
    with user_errors():
        rows = config_keys(section)
    out.print(f"config keys{' of ' + section if section else ''} (null: unset)")
    table = Table(box=None, header_style="bold")
    for name in ("key", "default", "units"):
        table.add_column(name, no_wrap=True)
    table.add_column("kind")  # the one column that wraps, at its words, on a narrow terminal
    for k in rows:
        table.add_row(k.name, default_text(k.default), k.units, k.kind)
    out.print(table)
