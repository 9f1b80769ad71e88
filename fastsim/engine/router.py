"""Routers: which replica of a pool each request goes to (docs/model/fleets.md).

Requests are routed in the pool's order (arrival order; for a decode pool, KV-arrival order).
``round_robin`` and ``random`` decide from the request alone, so their replicas can run apart
(:func:`assign`); ``least_outstanding`` and ``least_kv`` look at the replicas' state at the
request's instant, so the pool kernel advances every replica to it first and asks
:func:`choose`.
"""

from __future__ import annotations

import numpy as np

from .._jit import inline
from ..model.routers import ROUTERS

ROUND_ROBIN = ROUTERS["round_robin"].code  # the codes :func:`choose` tells apart (Numba reads them as constants)
RANDOM = ROUTERS["random"].code
LEAST_OUTSTANDING = ROUTERS["least_outstanding"].code
LEAST_KV = ROUTERS["least_kv"].code
PREFIX_AWARE = ROUTERS["prefix_aware"].code  # scored by the serving loop itself (:func:`.kernels._route.prefix_aware`)
ONE_ENGINE = -1  # no router: the serving loop's one engine takes its requests as they arrive


def assign(router: str, replicas: int, routes: np.ndarray) -> np.ndarray:
    """The replica of each request (in the pool's order) under a static router; ``routes``:
    the random router's draws, a uniform replica per request."""
    if ROUTERS[router].draws:
        return routes.astype(np.int64)
    return np.arange(routes.size, dtype=np.int64) % replicas


@inline
def choose(code, j, routes, outstanding, used, lo, hi):
    """The replica in ``lo .. hi - 1`` (a pool's, of a fleet's replicas) for the pool's ``j``-th
    request, less ``lo``: by the router ``code``, from each replica's ``outstanding`` requests
    (routed to it, not yet done) and KV blocks ``used``, ties to the lowest index."""
    if code == ROUND_ROBIN:
        return j % (hi - lo)
    if code == RANDOM:
        return routes[j]
    best = lo
    for r in range(lo + 1, hi):
        if code == LEAST_KV:
            if used[r] < used[best] or (used[r] == used[best] and outstanding[r] < outstanding[best]):
                best = r
        elif outstanding[r] < outstanding[best]:
            best = r
    return best - lo
