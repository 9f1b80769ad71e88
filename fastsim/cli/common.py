"""What every command shares: the app, its consoles, the options, one-line errors, tables that
fit the terminal, progress bars, and what an interrupted run kept."""

from __future__ import annotations

import contextlib
import inspect
import sys
import warnings
from pathlib import Path
from typing import Annotated, Callable, Iterator, Optional

import typer
import typer.core
import typer.exceptions
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from ..api import (METRICS, Approximation, Config, ConfigError, ResumeWarning, checkpoint_path, load_config,
                   parse_override, parse_size, prefix_cache)


class _OneLineErrors(typer.core.TyperGroup):
    """Usage errors (an unknown option, a value out of range, a missing argument) as one line
    on stderr with exit code 2, like every other bad input, instead of click's boxed usage."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.exceptions.TyperException as exc:  # click's errors (typer vendors click)
            ctx = getattr(exc, "ctx", None)
            command = ctx.command_path if ctx is not None else "fastsim"
            cause = exc.__cause__  # typer checks a value with pydantic: the value it refused
            got = f" (got {cause.errors()[0]['input']!r})" if hasattr(cause, "errors") and cause.errors() else ""
            typer.echo(f"error: {' '.join(exc.format_message().split())}{got} (see {command} --help)", err=True)
            sys.exit(getattr(exc, "exit_code", 2))
        except typer.Abort:
            typer.echo("error: aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=_OneLineErrors,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    help="Simulate LLM serving engines and fleets: throughput, latency and cost, fast and exact.",
)
# A terminal keeps its own width (tables are split to fit it); piped output is wide. Notices on
# stderr wrap at word boundaries on a terminal, and not at all elsewhere (a log keeps each whole).
out = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False, soft_wrap=not sys.stderr.isatty())


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """fastsim's own warnings (a damaged checkpoint's records rerun) as one line on stderr."""
    if issubclass(category, ResumeWarning):
        err.print(f"warning: {message}")
    elif issubclass(category, Approximation):
        err.print(f"notice: {message}")
    else:
        _python_show_warning(message, category, filename, lineno, file, line)


_python_show_warning = warnings.showwarning
warnings.showwarning = _show_warning
warnings.simplefilter("always", ResumeWarning)  # each resume says so, not only a process's first


def command(fn: Callable) -> Callable:
    """Register ``fn`` as a command. Its docstring's paragraphs become the help with their line
    breaks removed, so the help wraps at word boundaries at the terminal's width."""
    paragraphs = inspect.cleandoc(fn.__doc__ or "").split("\n\n")
    return app.command(help="\n\n".join(" ".join(p.split()) for p in paragraphs))(fn)

ConfigArg = Annotated[Path, typer.Argument(help="Scenario YAML (see configs/).", show_default=False)]
SetOpt = Annotated[
    Optional[list[str]],
    typer.Option("--set", help="Override a config key: dotted.key=value (repeatable).", metavar="KEY=VALUE"),
]
MaxMemoryOpt = Annotated[
    Optional[str],
    typer.Option("--max-memory", help="Refuse work needing more memory than this (8GB, 500MB; default: what is "
                                      "available).", metavar="SIZE"),
]
WorkersOpt = Annotated[Optional[int], typer.Option(
    help="Workers on this machine: threads, or forked processes for many small points (default: all cores).", min=1)]
SchedulerOpt = Annotated[Optional[str], typer.Option(help="Dask scheduler address (tcp://host:8786), or 'local'.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]
ResumeOpt = Annotated[bool, typer.Option("--resume", help="Continue an interrupted run from its checkpoint.")]
TargetOpt = Annotated[
    Optional[list[str]],
    typer.Option("--target", metavar="'METRIC<=VALUE'",
                 help="A bound that must hold, quoted (the shell reads < and >): 'METRIC<=VALUE' or "
                      "'METRIC>=VALUE' (repeatable). Metrics: " + ", ".join(METRICS) + "."),
]
AttainmentOpt = Annotated[
    Optional[float],
    typer.Option(help="With the config's slo: the fraction of requests that must meet it (default 0.9 when no "
                      "--target is given).", min=0, max=1),
]


def fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Bad input, and memory that ran out anyway, end as one line on stderr with exit code 2."""
    try:
        yield
    except ConfigError as exc:
        raise fail(str(exc)) from None
    except MemoryError:
        raise fail("out of memory: make the run smaller (workload.n_requests) or use fewer --workers") from None


def load(path: Path, sets: list[str] | None, plan: bool = False) -> Config:
    """The config a command runs (checked; ``plan``: a plan's, see :func:`fastsim.api.load_config`);
    from here on, a kernel compile is announced."""
    _announce_compiles()
    return load_config(path, dict(parse_override(s) for s in sets or []), plan)


def notices(config: Config) -> None:
    """What a command that ran ``config`` says last on stderr about keys that had no effect (after
    its work: a refusal stays one line)."""
    if config.engine.prefix_caching and not prefix_cache(config):
        err.print(f"notice: engine.prefix_caching has no effect on {config.engine.policy} batching (static and "
                  "dynamic batching have no prefix cache)")


_compile_notice: list = []  # the one registered listener, once registered


def _announce_compiles() -> None:
    """Say once on stderr when Numba starts compiling (an empty or stale cache), never when it
    only loads compiled kernels from its cache."""
    if _compile_notice:
        return
    from numba.core import event

    class Notice(event.Listener):
        said = False

        def on_start(self, ev: event.Event) -> None:
            if not self.said:
                self.said = True
                err.print("compiling kernels, first run only (they are cached for the next) ...")

        def on_end(self, ev: event.Event) -> None:
            pass

    _compile_notice.append(Notice())
    event.register("numba:compile", _compile_notice[0])


def max_memory(text: str | None) -> int | None:
    return None if text is None else parse_size(text)


def print_table(title: str, headers: list[str], rows: list[list[str]], left: int = 1) -> None:
    """Print a title line and a borderless table; the first ``left`` columns are labels. A table
    wider than the console is split into several, each repeating the labels, so no cell is cut."""
    widths = [max([len(h), *(len(r[j]) for r in rows)]) + 2 for j, h in enumerate(headers)]
    room = out.width - sum(widths[:left]) - 1
    parts: list[list[int]] = [[]]
    used = 0
    for j in range(left, len(headers)):
        if parts[-1] and used + widths[j] > room:
            parts.append([])
            used = 0
        parts[-1].append(j)
        used += widths[j]
    out.print(title, soft_wrap=True)
    for n, part in enumerate(parts):
        table = Table(box=None, header_style="bold")
        for j in [*range(left), *part]:
            table.add_column(headers[j], justify="left" if j < left else "right", no_wrap=True)
        for row in rows:
            table.add_row(*(row[j] for j in [*range(left), *part]))
        if n:
            out.print()
        out.print(table, soft_wrap=len(part) == 1)


def print_grouped(headers: list[str], groups: list[tuple[str, list[list[str]]]]) -> None:
    """Print groups of rows, each under a line of its own (what the rows share, said once), in
    one set of columns: the first a label, the others right-aligned, the headers once on top."""
    widths = [max([len(h), *(len(r[j]) for _, rows in groups for r in rows)]) for j, h in enumerate(headers)]
    for n, (heading, rows) in enumerate(groups):
        out.print(heading)  # wraps at words on a narrow terminal, like the notes
        table = Table(box=None, header_style="bold", show_header=n == 0, pad_edge=True)
        for j, h in enumerate(headers):
            table.add_column(h, justify="left" if j == 0 else "right", no_wrap=True, min_width=widths[j])
        for row in rows:
            table.add_row(*row)
        out.print(table)


class _RateColumn(ProgressColumn):
    """Points a second since the bar started (points resumed from a checkpoint are not speed)."""

    def render(self, task: Task) -> Text:
        done = task.fields["done"] - task.fields["resumed"]
        return Text(f"{done / task.elapsed:,.0f}/s" if done and task.elapsed else "", style="progress.data.speed")


def progress(label: str, quiet: bool, unit: str = "points") -> tuple[Progress, Callable[[int, int, float], None]]:
    """A progress bar on stderr that appears with the first report (after any set-up error). It
    counts points, and fills (and estimates the time left) by the work they stand for."""
    bar = Progress(
        TextColumn(label),
        BarColumn(),
        TextColumn("{task.fields[done]}/{task.fields[points]} " + unit),
        _RateColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=err,
        disable=quiet,
    )
    task = bar.add_task(label, total=None, done=0, points=0, resumed=0)

    def on_progress(done: int, total: int, work: float) -> None:
        if bar.tasks[0].total is None:  # first call: work resumed from a checkpoint is not speed
            bar.start()
            bar.reset(task, total=1.0, completed=work, done=done, points=total, resumed=done)
        else:
            bar.update(task, completed=work, done=done)

    return bar, on_progress


def kept(out_path: Path) -> str:
    """What an interrupted run kept, for its last line."""
    partial = checkpoint_path(out_path)
    return f"; finished points are kept in {partial}: rerun with --resume" if partial.exists() else "; nothing was kept"


def run_to_file(label: str, quiet: bool, destination: Path,
                work: Callable[[Callable[[int, int, float], None]], object], unit: str = "points"):
    """Run ``work(on_progress)`` (which writes ``destination``) with a progress bar; Ctrl-C ends
    with exit code 130 and what was kept, a file system error with exit code 2."""
    bar, on_progress = progress(label, quiet, unit)
    try:
        with user_errors():
            return work(on_progress)
    except KeyboardInterrupt:
        raise fail(f"interrupted{kept(destination)}", 130) from None
    except OSError as exc:
        raise fail(f"{destination}: {exc.strerror or exc}{kept(destination)}") from None
    finally:
        if bar.live.is_started:  # (stopped unstarted, it prints an empty line after the error)
            bar.stop()
