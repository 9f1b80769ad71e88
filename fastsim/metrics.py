"""Throughput and latency metrics of one simulated scenario, from plain NumPy arrays.

All times are seconds from t=0. The p-quantile of n values is the sorted value at index
``floor(p * n)`` clipped to ``n - 1`` (the lesson's rule); only those order statistics are selected
(``np.partition``), never a full sort.
"""

from __future__ import annotations

import numpy as np

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


def quantiles(values: np.ndarray, ps: tuple[float, ...]) -> list[float]:
    """The lesson's quantiles of ``values`` (NaN for an empty array)."""
    n = values.size
    if n == 0:
        return [float("nan")] * len(ps)
    idx = [min(n - 1, int(p * n)) for p in ps]
    part = np.partition(values, sorted(set(idx)))
    return [float(part[i]) for i in idx]


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
    ttft = first_token - arrival
    e2e = done - arrival
    multi = output > 1
    tpot = (done[multi] - first_token[multi]) / (output[multi] - 1)
    ttft_q = quantiles(ttft, (0.5, 0.9, 0.99))
    e2e_q = quantiles(e2e, (0.5, 0.9, 0.99))
    tpot_q = quantiles(tpot, (0.5, 0.99))
    return {
        "throughput_tok_s": float(output.sum()) / span,
        "request_rate_rps": arrival.size / span,
        "slot_use": busy_slot_steps / (steps * max_batch),
        "mean_batch": busy_slot_steps / steps,
        "ttft_p50_s": ttft_q[0],
        "ttft_p90_s": ttft_q[1],
        "ttft_p99_s": ttft_q[2],
        "ttft_mean_s": float(ttft.mean()),
        "e2e_p50_s": e2e_q[0],
        "e2e_p90_s": e2e_q[1],
        "e2e_p99_s": e2e_q[2],
        "e2e_mean_s": float(e2e.mean()),
        "tpot_p50_s": tpot_q[0],
        "tpot_p99_s": tpot_q[1],
        "max_queue": max_queue,
        "steps": steps,
        "span_s": span,
    }
