"""Traffic generation: the one place where randomness is drawn.

A :class:`Traffic` is struct-of-arrays request state (arrival time, prompt and output lengths),
sorted by arrival. Two generators:

- ``rng: stdlib`` draws per request ``expovariate(rate)`` then ``gauss(mu, sigma)`` from
  ``random.Random(seed)``, accumulating arrivals in milliseconds, which reproduces the lesson's
  stream exactly. It is a Python loop: fine for thousands of requests.
- ``rng: numpy`` draws vectorised from ``numpy.random.Generator``: arrivals and lengths come from
  two independent child streams of ``SeedSequence(seed)``, as standard exponentials (or gammas of
  shape ``burstiness``; or none, for constant arrivals every 1/rate) and normals that are then
  scaled. So the same seed gives the same underlying numbers at every rate, length
  distribution or request count (common random numbers for paired comparisons).

Both draw the normal variate even for ``dist: fixed``, so changing the length distribution never
shifts the arrival stream.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from .config import Workload


@dataclass(frozen=True)
class Traffic:
    arrival_s: np.ndarray  # float64 (n,), non-decreasing, seconds from t=0
    prompt_tokens: np.ndarray  # int64 (n,)
    output_tokens: np.ndarray  # int64 (n,), >= 1

    def __len__(self) -> int:
        return self.arrival_s.size


def generate(w: Workload) -> Traffic:
    """Draw ``w.n_requests`` requests as described by the workload section."""
    if w.rng == "stdlib":
        arrival, normal = _stdlib_draws(w)
    else:
        arrival, normal = _numpy_draws(w)
    o = w.output
    if o.dist == "fixed":
        output = np.full(w.n_requests, o.value, dtype=np.int64)
    else:
        # int(exp(.)) truncates; clip in float first so huge draws cannot overflow int64.
        output = np.clip(np.exp(normal), o.min, o.max).astype(np.int64)
    prompt = np.full(w.n_requests, w.prompt_tokens, dtype=np.int64)
    return Traffic(arrival, prompt, output)


def _stdlib_draws(w: Workload) -> tuple[np.ndarray, np.ndarray]:
    rng = random.Random(w.seed)
    o = w.output
    arrival_ms = np.empty(w.n_requests)
    normal = np.empty(w.n_requests)
    t = 0.0
    for i in range(w.n_requests):
        t += rng.expovariate(w.rate) * 1000
        arrival_ms[i] = t
        normal[i] = rng.gauss(o.mu, o.sigma)
    return arrival_ms / 1000, normal


def _numpy_draws(w: Workload) -> tuple[np.ndarray, np.ndarray]:
    arrivals_ss, lengths_ss = np.random.SeedSequence(w.seed).spawn(2)
    if w.arrival == "constant":
        arrival = np.arange(1, w.n_requests + 1) / w.rate
    else:
        rng = np.random.default_rng(arrivals_ss)
        if w.arrival == "gamma":  # mean 1/rate, coefficient of variation 1/sqrt(burstiness)
            gaps = rng.standard_gamma(w.burstiness, w.n_requests)
            gaps /= w.burstiness * w.rate
        else:
            gaps = rng.standard_exponential(w.n_requests)
            gaps /= w.rate
        arrival = np.cumsum(gaps)
    normal = np.random.default_rng(lengths_ss).standard_normal(w.n_requests)
    normal *= w.output.sigma
    normal += w.output.mu
    return arrival, normal
