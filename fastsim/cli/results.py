"""``fastsim compare`` and ``fastsim plot``: what a dataset says, against another or as a figure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from .common import command, err, out, print_table, user_errors


@command
def compare(
    baseline: Annotated[Path, typer.Argument(help="The reference dataset (.nc).", show_default=False)],
    candidate: Annotated[Path, typer.Argument(help="The dataset to check (.nc).", show_default=False)],
    rtol: Annotated[float, typer.Option(help="Relative change allowed in the worse direction.", min=0)] = 0.05,
    metric: Annotated[
        Optional[list[str]], typer.Option("--metric", help="Compare only these metrics (repeatable).")
    ] = None,
    drift: Annotated[bool, typer.Option("--drift", help="Fail on a change beyond --rtol either way, better or "
                                                        "worse (a check that the model has not moved).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Compare two sweep, capacity or plan datasets point by point. Exit 0: nothing got worse
    beyond --rtol (with --drift: nothing changed); 1: a regression (the points are listed); 2: the
    datasets cannot be compared."""
    from ..api import compare as run_compare
    from ..api import describe_change

    with user_errors():
        report = run_compare(baseline, candidate, rtol, metric, drift)
    if as_json:
        typer.echo(json.dumps(report.as_json()))
    elif report.identical:
        out.print(f"{candidate} and {baseline}: no change in any of the {len(report.metrics)} metrics compared",
                  soft_wrap=True)
    else:
        def where(at: dict) -> str:
            return ", ".join(f"{k}={v}" for k, v in at.items()) or "-"

        moved = {name: r for name, r in report.metrics.items() if r.worst_change != 0 or r.improvements}
        rows = [[name, describe_change(*r.worst_values, r.direction), where(r.worst_at), str(r.regressions),
                 str(r.improvements)] for name, r in moved.items()]
        print_table(f"{candidate} against {baseline} (rtol {rtol:g}); per metric, the change at its worst point",
                    ["metric", "worst change", "at", "regressed", "improved"], rows)
        same = [name for name in report.metrics if name not in moved]
        if same:
            out.print(f"unchanged: {', '.join(same)}", soft_wrap=True)
        if report.regressed:
            shown = report.regressed_points[:20]
            more = ", the first 20" if len(shown) < len(report.regressed_points) else ""
            what = "changed" if drift else "regressed"
            print_table(f"{len(report.regressed_points)} {what} point(s){more}",
                        ["metric", "at", "baseline", "candidate", "change"],
                        [[p["metric"], where(p["at"]), f"{p['baseline']:.6g}", f"{p['candidate']:.6g}",
                          describe_change(p["baseline"], p["candidate"], report.metrics[p["metric"]].direction)]
                         for p in shown])
    if report.regressed:
        raise typer.Exit(1)


@command
def plot(
    result: Annotated[Path, typer.Argument(help="A sweep, capacity or plan dataset (.nc).", show_default=False)],
    x: Annotated[Optional[str], typer.Option("--x", help="Axis along x (default: rate, or the first).")] = None,
    y: Annotated[
        Optional[list[str]], typer.Option("--y", help="Metric to plot (repeatable; default: throughput and TTFT p99; "
                                                      "max_rate_rps for capacity; USD/hour for a plan).")
    ] = None,
    hue: Annotated[Optional[str], typer.Option(help="Axis drawn as one line per value (default: the next axis).")] = None,
    col: Annotated[Optional[str], typer.Option(help="Axis drawn as one panel per value (default: the one after).")] = None,
    sel: Annotated[
        Optional[list[str]], typer.Option("--sel", help="Fix an axis to one value: AXIS=VALUE (repeatable).")
    ] = None,
    out_path: Annotated[Optional[Path], typer.Option("--out", help="Figure to write, .png/.pdf/.svg (default: a PNG "
                                                                    "beside RESULT).")] = None,
) -> None:
    """Draw a dataset: metrics against an axis, lines by --hue, panels by --col (each chosen from
    the dataset's axes when not given); a plan as the price of each candidate."""
    from ..api import plot

    destination = out_path or result.with_suffix(".png")
    with user_errors():
        written = plot(result, destination, x, y, hue, col, sel)
    err.print(f"wrote {written}")
