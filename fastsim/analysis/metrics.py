"""Throughput and latency metrics of one simulated scenario, from plain NumPy arrays.

All times are seconds from t=0. The p-quantile of n values is the sorted value at index
``floor(p * n)`` clipped to ``n - 1`` (the lesson's rule); only those order statistics are selected
(a histogram pass, then a partition of the few values near each), never a full sort.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .._jit import jit
from . import itl

if TYPE_CHECKING:
    from ..engine.kernels import Outcome

# name -> (units, long_name); the order is the order of tables and dataset variables.
METRICS: dict[str, tuple[str, str]] = {
    "throughput_tok_s": ("tokens/s", "output tokens per second until the last completion"),
    "request_rate_rps": ("requests/s", "completed requests per second until the last completion"),
    "slot_use": ("1", "busy slot-steps / (steps * max_batch)"),
    "mean_batch": ("sequences", "mean unfinished sequences per step"),
    "ttft_p50_s": ("s", "time to first token, median"),
    "ttft_p90_s": ("s", "time to first token, 90th percentile"),
    "ttft_p99_s": ("s", "time to first token, 99th percentile"),
    "ttft_mean_s": ("s", "time to first token, mean"),
    "e2e_p50_s": ("s", "end-to-end latency, median"),
    "e2e_p90_s": ("s", "end-to-end latency, 90th percentile"),
    "e2e_p99_s": ("s", "end-to-end latency, 99th percentile"),
    "e2e_mean_s": ("s", "end-to-end latency, mean"),
    "tpot_p50_s": ("s", "time per output token after the first, median"),
    "tpot_p99_s": ("s", "time per output token after the first, 99th percentile"),
    "max_queue": ("requests", "most requests left waiting after an admission decision"),
    "steps": ("steps", "engine steps run"),
    "span_s": ("s", "time of the last completion"),
    "preemptions": ("requests", "preemptions (a running request evicted to recompute later)"),
    "kv_peak_use": ("1", "KV cache blocks in use / blocks, peak over steps"),
    "kv_mean_use": ("1", "KV cache blocks in use / blocks, mean over steps"),
    "itl_p50_s": ("s", "inter-token latency (every gap between a request's tokens), median"),
    "itl_p99_s": ("s", "inter-token latency (every gap between a request's tokens), 99th percentile"),
    "goodput_rps": ("requests/s", "requests that met every SLO, per second until the last completion"),
    "slo_attainment": ("1", "fraction of requests that met every SLO"),
    "gpus": ("GPUs", "GPUs of the fleet (replicas x tp, plus prefill replicas x their tp)"),
    "usd_per_hour": ("USD/hour", "on-demand price of the fleet's GPUs per hour"),
    "usd_per_mtok": ("USD/1e6 tokens", "price per million output tokens at the simulated throughput"),
}

INTEGER_METRICS = frozenset({"max_queue", "steps", "preemptions", "gpus"})


BINS = 4096
SORT_BELOW = 4096
LATENCY_PS = (0.5, 0.9, 0.99)  # TTFT's and e2e's quantiles
TPOT_PS = (0.5, 0.99)


@jit
def _bin_counts(values, lo, scale, bins):
    """How many ``values`` fall in each of ``bins`` equal bins from ``lo`` (``scale`` bins a unit)."""
    hist = np.zeros(bins, np.int64)
    for v in values:
        hist[min(int((v - lo) * scale), bins - 1)] += 1
    return hist


@jit
def _gather(values, lo, scale, bins, target, count):
    """The ``count`` values in bin ``target`` (binned as :func:`_bin_counts` does)."""
    out = np.empty(count)
    t = 0
    for v in values:
        if min(int((v - lo) * scale), bins - 1) == target:
            out[t] = v
            t += 1
    return out


def _order_statistics(values: np.ndarray, ranks: list[int]) -> list[float]:
    """The values of 0-based ``ranks`` in ``values`` (left as they are). One pass histograms
    the values over equal bins between their extremes; the few bins that hold a wanted rank are
    gathered and partitioned (a selection, not a sort): a few milliseconds for 1e6 latencies."""
    lo, hi = float(values.min()), float(values.max())
    if not hi > lo:  # all equal (or NaN)
        return [lo if hi == lo else float("nan")] * len(ranks)
    scale = BINS / (hi - lo)
    cum = np.cumsum(_bin_counts(values, lo, scale, BINS))
    out, gathered = [], {}
    for rank in ranks:
        b = int(np.searchsorted(cum, rank, side="right"))
        below = int(cum[b - 1]) if b else 0
        if b not in gathered:
            gathered[b] = _gather(values, lo, scale, BINS, b, int(cum[b]) - below)
        out.append(float(np.partition(gathered[b], rank - below)[rank - below]))
    return out


def _select(values: np.ndarray, ps: tuple[float, ...]) -> list[float]:
    """The lesson's quantiles of ``values`` (NaN when empty)."""
    n = values.size
    if n == 0:
        return [float("nan")] * len(ps)
    idx = [min(n - 1, int(p * n)) for p in ps]
    if n <= SORT_BELOW:  # a small run: sorting is cheaper than a histogram of BINS bins
        ordered = np.sort(values)
        return [float(ordered[i]) for i in idx]
    return _order_statistics(values, idx)


@jit
def _small_quantiles(ttft, e2e, tpot):
    """:func:`_select` of the three latencies of a small run (each <= SORT_BELOW values), in
    one call: TTFT's and e2e's at LATENCY_PS, then TPOT's at TPOT_PS."""
    out = np.empty(2 * len(LATENCY_PS) + len(TPOT_PS))
    _selected_into(out, 0, ttft, LATENCY_PS)
    _selected_into(out, len(LATENCY_PS), e2e, LATENCY_PS)
    _selected_into(out, 2 * len(LATENCY_PS), tpot, TPOT_PS)
    return out


@jit
def _selected_into(out, t, values, ps):
    n = values.size
    work = values.copy()
    ones = np.ones(n, np.int64)
    for p in ps:
        out[t] = itl.weighted_select(work, ones, n, min(n - 1, int(p * n))) if n else np.nan
        t += 1


def quantiles(values: np.ndarray, ps: tuple[float, ...]) -> list[float]:
    """The lesson's quantiles of ``values`` (NaN for an empty array)."""
    return _select(np.array(values, dtype=float), ps)


@jit
def _latencies(arrival, output, first_token, done, slo_ttft, slo_tpot, slo_e2e):
    """Per-request TTFT and e2e (n,), TPOT for the m requests with output > 1 (m,), and how many
    requests meet every SLO (each ``inf`` when not set; TPOT is 0 for a one-token output)."""
    n = arrival.size
    ttft = np.empty(n)
    e2e = np.empty(n)
    tpot = np.empty(n)
    m = 0
    good = 0
    for i in range(n):
        ttft[i] = first_token[i] - arrival[i]
        e2e[i] = done[i] - arrival[i]
        per_token = 0.0
        if output[i] > 1:
            per_token = (done[i] - first_token[i]) / (output[i] - 1)
            tpot[m] = per_token
            m += 1
        if ttft[i] <= slo_ttft and per_token <= slo_tpot and e2e[i] <= slo_e2e:
            good += 1
    return ttft, e2e, tpot[:m], good


def compute(arrival: np.ndarray, output: np.ndarray, out: Outcome, max_batch: int,
            slo: tuple[float | None, float | None, float | None] = (None, None, None), gpus: int = 1,
            usd_per_hour: float = float("nan")) -> dict[str, float]:
    """Every metric of :data:`METRICS` for one simulated scenario, an engine's or a fleet's
    (requests must all have finished); ``slo`` is (TTFT, TPOT, e2e) objectives in seconds, None
    where not set; ``gpus`` and ``usd_per_hour`` the fleet's."""
    first_token, done, steps, busy_slot_steps = out.first_token_s, out.done_s, out.steps, out.busy_slot_steps
    span = float(done.max())
    bounds = [np.inf if b is None else b for b in slo]
    ttft, e2e, tpot, good = _latencies(arrival, output, first_token, done, *bounds)
    has_slo = any(b is not None for b in slo)
    n = arrival.size
    ttft_mean, e2e_mean = float(ttft.sum()) / n, float(e2e.sum()) / n  # as mean(), without its overhead
    if n <= SORT_BELOW:  # a small run: the three in one compiled call
        q = _small_quantiles(ttft, e2e, tpot).tolist()
        ttft_q, e2e_q, tpot_q = q[:3], q[3:6], q[6:]
    else:
        ttft_q, e2e_q, tpot_q = _select(ttft, LATENCY_PS), _select(e2e, LATENCY_PS), _select(tpot, TPOT_PS)
    itl_q = itl.quantiles(out.k, out.runs, out.gaps_s, busy_slot_steps - arrival.size, (0.5, 0.99))
    throughput = float(output.sum()) / span
    return {
        "throughput_tok_s": throughput,
        "request_rate_rps": n / span,
        "slot_use": busy_slot_steps / (steps * max_batch),
        "mean_batch": busy_slot_steps / steps,
        "ttft_p50_s": ttft_q[0],
        "ttft_p90_s": ttft_q[1],
        "ttft_p99_s": ttft_q[2],
        "ttft_mean_s": ttft_mean,
        "e2e_p50_s": e2e_q[0],
        "e2e_p90_s": e2e_q[1],
        "e2e_p99_s": e2e_q[2],
        "e2e_mean_s": e2e_mean,
        "tpot_p50_s": tpot_q[0],
        "tpot_p99_s": tpot_q[1],
        "max_queue": out.max_queue,
        "steps": steps,
        "span_s": span,
        "preemptions": out.preemptions,
        "kv_peak_use": out.kv_peak_use,
        "kv_mean_use": out.kv_block_steps / out.kv_capacity_steps if out.kv_capacity_steps > 0 else float("nan"),
        "itl_p50_s": itl_q[0],
        "itl_p99_s": itl_q[1],
        "goodput_rps": good / span if has_slo else float("nan"),
        "slo_attainment": good / n if has_slo else float("nan"),
        "gpus": gpus,
        "usd_per_hour": usd_per_hour,
        "usd_per_mtok": usd_per_hour / (3600e-6 * throughput),
    }
