"""Throughput and latency metrics of one simulated scenario, from plain NumPy arrays.

All times are seconds from t=0. The p-quantile of n values is the sorted value at index
``floor(p * n)`` clipped to ``n - 1`` (the lesson's rule); only those order statistics are selected
(partitioning), never a full sort.
"""

from __future__ import annotations

import numpy as np

from ._jit import jit

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
}

INTEGER_METRICS = frozenset({"max_queue", "steps"})


def _select(work: np.ndarray, ps: tuple[float, ...]) -> list[float]:
    """The lesson's quantiles of ``work``, which is reordered in place.

    One single-index partition per order statistic, largest first, each on the part below the
    previous one: several times faster than one ``np.partition`` call with several indices.
    """
    n = work.size
    if n == 0:
        return [float("nan")] * len(ps)
    idx = [min(n - 1, int(p * n)) for p in ps]
    end = n
    for k in sorted(set(idx), reverse=True):
        work[:end].partition(k)  # work[:k] now holds the k smallest values of work[:end]
        end = k
    return [float(work[i]) for i in idx]


def quantiles(values: np.ndarray, ps: tuple[float, ...]) -> list[float]:
    """The lesson's quantiles of ``values`` (NaN for an empty array)."""
    return _select(np.array(values, dtype=float), ps)


@jit
def _latencies(arrival, output, first_token, done):
    """Per-request TTFT and e2e (n,), and TPOT for the m requests with output > 1 (m,)."""
    n = arrival.size
    ttft = np.empty(n)
    e2e = np.empty(n)
    tpot = np.empty(n)
    m = 0
    for i in range(n):
        ttft[i] = first_token[i] - arrival[i]
        e2e[i] = done[i] - arrival[i]
        if output[i] > 1:
            tpot[m] = (done[i] - first_token[i]) / (output[i] - 1)
            m += 1
    return ttft, e2e, tpot[:m]


def compute(
    arrival: np.ndarray,
    output: np.ndarray,
    first_token: np.ndarray,
    done: np.ndarray,
    steps: int,
    busy_slot_steps: int,
    max_queue: int,
    max_batch: int,
) -> dict[str, float]:
    """Every metric of :data:`METRICS` for one run (requests must all have finished)."""
    span = float(done.max())
    ttft, e2e, tpot = _latencies(arrival, output, first_token, done)
    ttft_mean, e2e_mean = float(ttft.mean()), float(e2e.mean())  # before _select reorders them
    ttft_q = _select(ttft, (0.5, 0.9, 0.99))
    e2e_q = _select(e2e, (0.5, 0.9, 0.99))
    tpot_q = _select(tpot, (0.5, 0.99))
    return {
        "throughput_tok_s": float(output.sum()) / span,
        "request_rate_rps": arrival.size / span,
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
        "max_queue": max_queue,
        "steps": steps,
        "span_s": span,
    }
