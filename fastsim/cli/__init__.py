"""The ``fastsim`` command: parses arguments, calls the Python API, prints. Nothing else.

Commands by what they do: :mod:`.simulate` (run, sweep, bench, presets), :mod:`.planning`
(capacity, plan), :mod:`.calibration` (calibrate), :mod:`.results` (compare, plot);
:mod:`.common` holds what they share."""

from __future__ import annotations

import os
import sys

from . import calibration, planning, results, simulate  # noqa: F401  (each registers its commands)
from .common import app

__all__ = ["app", "main"]


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
