"""The throughput-interactivity frontier: how benchmarks compare deployments in 2026.

Every candidate deployment of a config's grid (GPU, model, precision, tp, replicas, P/D: every
axis but the load) is run under closed-loop clients at a range of concurrencies
(``workload.concurrency``: the grid's own axis, or 1, 2, 4, ..., 1024). Each point is plotted as
output throughput per GPU (``tok_s_per_gpu``) against the speed one user sees
(``interactivity_tok_s``, 1 / mean TPOT): more clients buy throughput with interactivity. A
point is on the frontier when no point of any candidate is at least as good on both and better
on one; the frontier says, for each interactivity a product needs, which deployment serves it
with the fewest GPUs.
"""

from __future__ import annotations

import numpy as np

from ..model.schema import Config, ConfigError
from .catalog import METRICS

CONCURRENCY = "workload.concurrency"
RATE = "workload.rate"
DEFAULT_CONCURRENCY = tuple(2**k for k in range(11))  # 1 .. 1024 clients
X, Y = "interactivity_tok_s", "tok_s_per_gpu"


def grid_config(config: Config, concurrency: list[int] | None = None) -> Config:
    """``config`` as a frontier runs it: closed-loop clients at ``concurrency`` (else the
    config's concurrency axis, else :data:`DEFAULT_CONCURRENCY`) as the last axis, over every
    other axis of its grid (a rate axis dropped: clients have no rate)."""
    if concurrency is not None and not concurrency:
        raise ConfigError("--concurrency: give at least one number of clients")
    values = list(concurrency or config.sweep.get(CONCURRENCY) or DEFAULT_CONCURRENCY)
    for c in values:
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise ConfigError(f"workload.concurrency: {c!r} is not a positive whole number of clients")
    sweep = {k: v for k, v in config.sweep.items() if k not in (RATE, CONCURRENCY)}
    sweep[CONCURRENCY] = values
    base = config.at({RATE: None, "workload.arrival": "poisson", "workload.burstiness": 1.0,
                      CONCURRENCY: values[0]})
    return base.model_copy(update={"sweep": sweep})


def on_frontier(table: np.ndarray) -> np.ndarray:
    """Which points of a metrics ``table`` (last axis: METRICS) no other point dominates on
    (interactivity, throughput per GPU): none has both at least as high and one higher. A point
    missing either is never on it."""
    names = list(METRICS)
    x = table[..., names.index(X)].ravel()
    y = table[..., names.index(Y)].ravel()
    ok = np.isfinite(x) & np.isfinite(y)
    xs, ys = x[ok], y[ok]
    on = np.zeros(x.size, bool)
    for i in np.flatnonzero(ok):  # (a grid's points: thousands at most)
        on[i] = not np.any((xs >= x[i]) & (ys >= y[i]) & ((xs > x[i]) | (ys > y[i])))
    return on.reshape(table.shape[:-1])
