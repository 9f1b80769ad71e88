"""Preloaded by the sweep's forkserver: import fastsim and load every kernel once, so each worker
forked from it starts warm instead of paying for imports and Numba's start-up itself."""

from .grid import warm_up

warm_up()
