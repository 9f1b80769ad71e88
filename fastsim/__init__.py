"""fastsim: fast, exact simulation of LLM-serving batching policies."""

from .config import Config, ConfigError, load_config
from .simulation import Result, simulate


def sweep(config, workers=None, scheduler=None, on_progress=None):
    """Run every point of ``config.sweep``; returns an xarray Dataset (see :func:`fastsim.api.sweep`)."""
    from .api import sweep as _sweep

    return _sweep(config, workers, scheduler, on_progress)

__version__ = "0.1.0"
__all__ = ["Config", "ConfigError", "Result", "load_config", "simulate", "sweep", "__version__"]
