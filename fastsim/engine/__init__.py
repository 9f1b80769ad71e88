"""The engine layer: what happens to requests. Traffic and recorded traces (the one place
randomness is drawn), the checks that a scenario can run at all, the Numba kernels of one engine
and of a pool of replicas, routers, KV links and the fleet driver. Imports only :mod:`fastsim.model`."""
