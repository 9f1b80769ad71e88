"""fastsim: fast, exact simulation of LLM serving engines and fleets.

The package is built in one-way layers, each importing only those below it:
``model`` (the config schema, presets, step cost: data and formulas) -> ``engine`` (traffic,
traces, the checks that a scenario can run, the Numba kernels, routers, fleets) -> ``analysis``
(metrics, inter-token latencies, one scenario end to end, capacity, plan, compare, plot) ->
``sweep`` (grids, running them, checkpoints, memory estimates, output files, summaries) ->
``api`` -> ``cli``.
"""

from ._version import __version__
from .api import calibrate, capacity, load_config, plan, simulate, sweep
from .model.schema import Config, ConfigError
from .analysis.simulation import Result

__all__ = ["Config", "ConfigError", "Result", "calibrate", "capacity", "load_config", "plan", "simulate", "sweep",
           "__version__"]
