"""Whether a run's measured window is a steady state (docs/outputs.md, "Steady state").

A figure of a run describes the engine only if what it measures does not drift across the run: a
queue that grows without end, a prefix cache still filling up. The measured requests (after any
warm-up) that arrived while the arrival process ran (a session's turns after the last session
started come as the fleet drains, and are left out of this check), in arrival order, are split
into two halves, and the run is *not steady* when

- their medians, or their 90th percentiles, of time to first token differ by more than ``DRIFT``
  (20 %) of the first half's and by more than ``FLOOR_S`` (1 ms), and the two halves' 99 %
  confidence intervals of it (the order statistics at ranks q n -+ 2.576 sqrt(q (1 - q) n) of
  each half, distribution-free) do not overlap (a queue growing on some replicas moves the upper
  quantile first); or
- under a prefix cache, their hit rates (cached prompt tokens / prompt tokens) differ by more than
  ``HIT_DRIFT`` (5 points), and by more than 5.04 standard errors (0.1 % two-sided, 8 degrees of
  freedom) as the window's ten tenths tell them: the mean hit rate of the first five tenths
  against the last five's, each tenth's from its own requests (batch means, which a cache's slow
  swings over minutes do not fool as a test of every request alone would); or
- the backlog (the run's requests that have arrived and are not done, warm-up ones included)
  grows across the second half by more than ``FALLS_BEHIND`` (2 %) of the requests that arrive
  in it, and by more than ``BACKLOG_FLOOR`` (50) requests: the fleet falls behind its arrivals
  (a closed loop's queue can grow while each request's wait, cut short by the loop, hardly moves).

Fewer than ``SMALLEST`` measured requests tell nothing either way (NaN). Steady is 1, not 0.
The halves' statistics are :mod:`.metrics`' (it selects order statistics); the rules are here.
"""

from __future__ import annotations

import math

import numpy as np

from .._jit import jit

SMALLEST = 200  # measured requests below which a run is too short to tell
DRIFT = 0.2  # relative change of the halves' TTFT medians ...
FLOOR_S = 1e-3  # ... and absolute, beyond which they differ
HIT_DRIFT = 0.05  # change of the halves' hit rates beyond which they differ
FALLS_BEHIND = 0.02  # backlog growth over the second half, as a share of its arrivals ...
BACKLOG_FLOOR = 50  # ... and in requests, beyond which the fleet falls behind
BATCHES = 10  # tenths of the window whose hit rates are compared, five against five
T_CRIT = 5.041  # Student t, 8 degrees of freedom, 0.1 % two-sided
QUANTILES = (0.5, 0.9)  # of TTFT, compared between the halves
Z99 = 2.576  # a quantile's 99 % interval: ranks q n -+ Z99 sqrt(q (1 - q) n)


@jit
def interval_ranks(n):
    """The 0-based ranks, among ``n`` values, of each of QUANTILES and of its 99 % confidence
    interval's ends (distribution-free): (low, rank, high) for each, in one tuple."""
    out = np.empty(3 * len(QUANTILES), np.int64)
    for t in range(len(QUANTILES)):
        q = QUANTILES[t]
        spread = Z99 * math.sqrt(q * (1 - q) * n)
        out[3 * t] = max(0, int(math.floor(q * n - spread)))
        out[3 * t + 1] = min(n - 1, int(q * n))
        out[3 * t + 2] = min(n - 1, int(math.ceil(q * n + spread)))
    return out


@jit
def _moved(stats, t):
    """Whether the halves' TTFT quantile ``t`` (of QUANTILES) differs (the module's rule)."""
    a, b = stats[0, 3 * t + 1], stats[1, 3 * t + 1]
    return abs(b - a) > max(DRIFT * abs(a), FLOOR_S) and (stats[1, 3 * t] > stats[0, 3 * t + 2]
                                                          or stats[0, 3 * t] > stats[1, 3 * t + 2])


HITS = 3 * len(QUANTILES)  # the hit statistics' first column
BACKLOG = HITS + 3  # the backlog's growth over the second half (row 0) and its arrivals (row 1)
COLUMNS = BACKLOG + 1


@jit
def _hits_moved(stats):
    """Whether the halves' hit rates differ (the module's rule)."""
    a, b = stats[0, HITS + 1], stats[1, HITS + 1]  # the means of each half's tenths' hit rates
    se = math.sqrt((stats[0, HITS + 2] + stats[1, HITS + 2]) / 2 * (2 / (BATCHES // 2)))
    return abs(stats[1, HITS] - stats[0, HITS]) > HIT_DRIFT and abs(b - a) > T_CRIT * se


@jit
def judge(stats, n, cached):
    """1.0 when the ``n`` requests checked of the measured window are steady, 0.0 when they drift,
    NaN when they are too few to tell, from their halves' ``stats`` (2, COLUMNS): each half's
    TTFT quantiles (interval low, value, high, for each of QUANTILES), hit rate, mean of its
    tenths' hit rates and their variance (``cached``: under a prefix cache), and the backlog's
    growth over the second half and the arrivals in it."""
    if n < SMALLEST:
        return np.nan
    for t in range(len(QUANTILES)):
        if _moved(stats, t):
            return 0.0
    return 0.0 if (cached and _hits_moved(stats)) or _behind(stats) else 1.0


@jit
def _behind(stats):
    """Whether the backlog grows (the module's rule)."""
    return stats[0, BACKLOG] > max(FALLS_BEHIND * stats[1, BACKLOG], BACKLOG_FLOOR)


def describe(stats: np.ndarray, n: int, cached: bool) -> str | None:
    """What drifts across the measured window, in one line (None: steady, or too short to tell)."""
    if judge(stats, n, cached) != 0.0:
        return None
    said = []
    for t, q in enumerate(QUANTILES):
        if _moved(stats, t):
            said.append(f"TTFT p{q * 100:.0f} {stats[0, 3 * t + 1]:.3g} s in the measured window's first half, "
                        f"{stats[1, 3 * t + 1]:.3g} s in its second")
    if cached and _hits_moved(stats):
        said.append(f"prefix-cache hit rate {stats[0, HITS]:.1%} then {stats[1, HITS]:.1%}")
    if _behind(stats):
        said.append(f"{stats[0, BACKLOG]:.0f} more requests waiting or running at its end than at its middle (the "
                    "fleet falls behind its arrivals)")
    return "; ".join(said)
