"""fastsim: fast, exact simulation of LLM serving engines and fleets.

The package is built in one-way layers, each importing only those below it:
``model`` (the config schema, presets, step cost: data and formulas) -> ``engine`` (traffic,
traces, the checks that a scenario can run, the Numba kernels, routers, fleets) -> ``analysis``
(metrics, inter-token latencies, one scenario end to end, capacity, plan, compare, plot) ->
``sweep`` (grids, running them, checkpoints, memory estimates, output files, summaries) ->
``api`` -> ``cli``.

The API's names load on first use (``fastsim.simulate``, ``from fastsim import sweep``), with
NumPy and Numba: the command line starts without them, so that a Ctrl-C from its first instant
ends it with exit code 130 (:func:`fastsim.cli.main`).
"""

from ._version import __version__
from . import sweep  # the subpackage, loaded first (a later first import would bind the name to it) ...
del sweep  # ... which is the API's function, loaded with the others

__all__ = ["Config", "ConfigError", "Result", "calibrate", "capacity", "load_config", "plan", "simulate", "sweep",
           "__version__"]


def __getattr__(name: str):
    """Load the API (and with it every layer) at the first use of a name not loaded yet."""
    if not name.startswith("__"):
        import importlib

        api = importlib.import_module(".api", __name__)  # (from . import api would ask this for the name)
        globals().update({n: getattr(api, n) for n in __all__ if n != "__version__"})
        if name in globals():
            return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
