"""The ``fastsim`` command: parses arguments, calls the Python API, prints. Nothing else.

Commands by what they do: :mod:`.simulate` (run, sweep, bench, presets), :mod:`.planning`
(capacity, plan, frontier), :mod:`.calibration` (calibrate), :mod:`.results` (compare, plot);
:mod:`.common` holds what they share."""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["app", "main"]


def _app():
    from . import calibration, planning, results, simulate  # noqa: F401  (each registers its commands)
    from .common import app

    return app


def __getattr__(name: str):
    if name == "app":  # the Typer app, its commands registered (loaded on first use, as the API)
        return _app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """The console script. A Ctrl-C ends it with exit code 130 from its first instant: while the
    package loads (NumPy, Numba), during a command (which says what it kept), or as it prints.
    Ends with ``os._exit`` once output is flushed: every file is closed by then, work still
    running on a worker thread (a kernel a Ctrl-C cut short) ends with the process, and tearing
    down the interpreter with Numba and xarray loaded costs about 0.5 s."""
    try:
        _app()()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:  # before a command started, or after it ended
        sys.stderr.write("error: interrupted\n")
        code = 130
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # nothing cuts the end short
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
