"""``fastsim calibrate``: fit the step-cost model to measured runs, and show how well it fits."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from .common import ConfigArg, SetOpt, command, err, fail, load, out, print_grouped, user_errors


@command
def calibrate(
    config: ConfigArg,
    measured: Annotated[list[Path], typer.Argument(help="Measured runs: CSV files (config keys and metric columns) "
                                                        "or vllm bench serve --save-result JSON files.",
                                                   show_default=False)],
    set_: SetOpt = None,
    fit: Annotated[Optional[str], typer.Option("--fit", help="Calibration keys to fit, comma-separated (default: "
                                                             "every one).", metavar="KEY,...")] = None,
    out_path: Annotated[Optional[Path], typer.Option("--out", help="YAML to write the fitted calibration: section "
                                                                   "to (default: results/<config name>-calibration.yaml).")
                        ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the fit as JSON.")] = False,
) -> None:
    """Fit the calibration (efficiencies, overheads and, given measured tails, the engine's jitter) to
    measured runs by least squares on log errors; print each run's error before and after, and
    write the fitted calibration: section."""
    from ..api import calibrate as run_calibrate
    from ..api import describe_run

    destination = out_path or Path("results") / f"{config.stem}-calibration.yaml"
    started = time.perf_counter()
    with user_errors():
        cfg = load(config, set_)

        def on_read(runs: list) -> None:
            if not as_json:
                err.print(f"fitting {fit or 'every calibration key'} to {len(runs)} run(s) of {len(measured)} file(s) ...")

        with err.status("fitting ...") as status:  # (a spinner on a terminal, else silent)
            def on_evaluation(count: int) -> None:
                status.update(f"fitting: {count:,} evaluations, {time.perf_counter() - started:.0f} s")

            try:
                result = run_calibrate(cfg, measured, fit.split(",") if fit else None, destination, on_read,
                                       on_evaluation)
            except OSError as exc:
                raise fail(f"{destination}: {exc.strerror or exc}") from None
    err.print(f"wrote {destination} ({len(result.runs)} runs, {result.evaluations} evaluations in "
              f"{time.perf_counter() - started:.1f} s)")
    for warning in result.warnings:
        err.print(f"warning: {warning}")
    before, after = result.errors(result.predicted_before), result.errors(result.predicted_after)
    if as_json:
        typer.echo(json.dumps({
            "calibration": {k.removeprefix("calibration."): v for k, v in result.after.items()},
            "before": {k.removeprefix("calibration."): v for k, v in result.before.items()},
            "cost": result.cost,
            "runs": [{"source": run.source, "settings": run.settings, "measured": run.metrics, "before": b, "after": a,
                      "overloaded": over}
                     for run, b, a, over in zip(result.runs, result.predicted_before, result.predicted_after,
                                                 result.overloaded)],
            "median_abs_error": {name: statistics.median(abs(e) for e in errors) for name, errors in after.items()},
            "warnings": result.warnings,
        }))
        return
    out.print("calibration (before -> after):")
    for k, v in result.after.items():
        out.print(f"  {k.removeprefix('calibration.'):<22} {result.before[k]:>10.4g} -> {v:.4g}")
    runs = [(f"{run.source}: {describe_run(run)}{' (overloaded)' if over else ''}",
             [[name, f"{value:.4g}", f"{b[name]:.4g}", f"{b[name] / value - 1:+.1%}", f"{a[name]:.4g}",
               f"{a[name] / value - 1:+.1%}"] for name, value in run.metrics.items()])
            for run, b, a, over in zip(result.runs, result.predicted_before, result.predicted_after, result.overloaded)]
    print_grouped(["metric", "measured", "before", "error", "after", "error"], runs)
    out.print("median |error| (before -> after):")
    for name, errors in after.items():
        out.print(f"  {name:<22} {statistics.median(abs(e) for e in before[name]):>10.1%} -> "
                  f"{statistics.median(abs(e) for e in errors):.1%}")
