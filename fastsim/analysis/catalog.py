"""Every metric fastsim reports, declared once: its units, long name, which way is better,
whether it counts whole things, the SLO key that bounds it, and how a table shows it. The metrics
code, capacity and plan searches, compare, summary tables, plot and the datasets all read it.
"""

from __future__ import annotations

from dataclasses import dataclass

HIGHER, LOWER, NEITHER = 1, -1, 0


@dataclass(frozen=True)
class Metric:
    units: str
    long_name: str
    better: int = NEITHER  # HIGHER or LOWER is better; NEITHER is not compared by default
    integer: bool = False  # counts whole things (stored as int64 when every value is finite)
    slo: str | None = None  # the ``slo`` key that bounds it, drawn as a dashed line
    header: str = ""  # a table's column header
    scale: float = 1.0  # a table shows value * scale ...
    fmt: str = "{:.3g}"  # ... formatted so


def _latency(what: str, stat: str, slo: str, header: str) -> Metric:
    return Metric("s", f"{what}, {stat}", LOWER, slo=slo, header=header, fmt="{:.2f}s")


# The metrics of one simulated scenario; their order is the order of tables and dataset variables.
METRICS: dict[str, Metric] = {
    "throughput_tok_s": Metric("tokens/s", "output tokens per second until the last completion", HIGHER,
                               header="tok/s", fmt="{:.0f}"),
    "input_tok_s": Metric("tokens/s", "prompt tokens per second until the last completion", HIGHER,
                          header="in tok/s", fmt="{:.0f}"),
    "total_tok_s": Metric("tokens/s", "prompt and output tokens per second until the last completion", HIGHER,
                          header="all tok/s", fmt="{:.0f}"),
    "tok_s_per_gpu": Metric("tokens/s/GPU", "output tokens per second per GPU of the fleet", HIGHER,
                            header="tok/s/GPU", fmt="{:.0f}"),
    "request_rate_rps": Metric("requests/s", "completed requests per second until the last completion", HIGHER,
                               header="req/s", fmt="{:.1f}"),
    "slot_use": Metric("1", "busy slot-steps / (steps * max_batch)", header="slot use", scale=100, fmt="{:.0f}%"),
    "mean_batch": Metric("sequences", "mean unfinished sequences per step", header="batch", fmt="{:.1f}"),
    "concurrency_mean": Metric("requests", "mean requests in flight (sent, not done) over the measured window",
                               header="in flight", fmt="{:.1f}"),
    "ttft_p50_s": _latency("time to first token", "median", "ttft_s", "TTFT p50"),
    "ttft_p90_s": _latency("time to first token", "90th percentile", "ttft_s", "TTFT p90"),
    "ttft_p99_s": _latency("time to first token", "99th percentile", "ttft_s", "TTFT p99"),
    "ttft_mean_s": _latency("time to first token", "mean", "ttft_s", "TTFT mean"),
    "e2e_p50_s": Metric("s", "end-to-end latency, median", LOWER, slo="e2e_s", header="e2e p50", fmt="{:.1f}s"),
    "e2e_p90_s": Metric("s", "end-to-end latency, 90th percentile", LOWER, slo="e2e_s", header="e2e p90",
                        fmt="{:.1f}s"),
    "e2e_p99_s": Metric("s", "end-to-end latency, 99th percentile", LOWER, slo="e2e_s", header="e2e p99",
                        fmt="{:.1f}s"),
    "e2e_mean_s": Metric("s", "end-to-end latency, mean", LOWER, slo="e2e_s", header="e2e mean", fmt="{:.1f}s"),
    "tpot_p50_s": Metric("s", "time per output token after the first, median", LOWER, slo="tpot_s",
                         header="TPOT p50", scale=1000, fmt="{:.1f}ms"),
    "tpot_p90_s": Metric("s", "time per output token after the first, 90th percentile", LOWER, slo="tpot_s",
                         header="TPOT p90", scale=1000, fmt="{:.1f}ms"),
    "tpot_p99_s": Metric("s", "time per output token after the first, 99th percentile", LOWER, slo="tpot_s",
                         header="TPOT p99", scale=1000, fmt="{:.1f}ms"),
    "tpot_mean_s": Metric("s", "time per output token after the first, mean over requests", LOWER, slo="tpot_s",
                          header="TPOT mean", scale=1000, fmt="{:.1f}ms"),
    "interactivity_tok_s": Metric("tokens/s/user", "output tokens per second a user sees: 1 / mean TPOT", HIGHER,
                                  header="tok/s/user", fmt="{:.1f}"),
    "interactivity_mean_tok_s": Metric("tokens/s/user", "output tokens per second a user sees: the mean over "
                                       "requests of 1 / TPOT", HIGHER, header="mean tok/s/user", fmt="{:.1f}"),
    "max_queue": Metric("requests", "most requests left waiting after an admission decision", LOWER, integer=True,
                        header="queue", fmt="{:.0f}"),
    "steps": Metric("steps", "engine steps run", integer=True, header="steps", fmt="{:.0f}"),
    "span_s": Metric("s", "measured window: time from its start (t=0, or the first measured arrival after a "
                     "warm-up) to the last completion", header="span", fmt="{:.1f}s"),
    "preemptions": Metric("requests", "preemptions (a running request evicted to recompute later)", LOWER,
                          integer=True, header="preempt", fmt="{:.0f}"),
    "kv_peak_use": Metric("1", "KV cache blocks in use / blocks, peak over steps", header="KV peak", scale=100,
                          fmt="{:.0f}%"),
    "kv_mean_use": Metric("1", "KV cache blocks in use / blocks, mean over steps", header="KV mean", scale=100,
                          fmt="{:.0f}%"),
    "itl_p50_s": Metric("s", "inter-token latency (every gap between a request's tokens), median", LOWER,
                        header="ITL p50", scale=1000, fmt="{:.1f}ms"),
    "itl_p90_s": Metric("s", "inter-token latency (every gap between a request's tokens), 90th percentile", LOWER,
                        header="ITL p90", scale=1000, fmt="{:.1f}ms"),
    "itl_p99_s": Metric("s", "inter-token latency (every gap between a request's tokens), 99th percentile", LOWER,
                        header="ITL p99", scale=1000, fmt="{:.1f}ms"),
    "itl_mean_s": Metric("s", "inter-token latency, mean over the measured requests' gaps", LOWER,
                         header="ITL mean", scale=1000, fmt="{:.1f}ms"),
    "goodput_rps": Metric("requests/s", "requests that met every SLO, per second until the last completion", HIGHER,
                          header="goodput", fmt="{:.1f}"),
    "slo_attainment": Metric("1", "fraction of requests that met every SLO", HIGHER, header="SLO met", scale=100,
                             fmt="{:.1f}%"),
    "gpus": Metric("GPUs", "GPUs of the fleet (replicas x tp, plus prefill replicas x their tp)", LOWER, integer=True,
                   header="GPUs", fmt="{:.0f}"),
    "usd_per_hour": Metric("USD/hour", "on-demand price of the fleet's GPUs per hour", LOWER, header="$/hour",
                           fmt="{:.2f}"),
    "usd_per_mtok": Metric("USD/1e6 tokens", "price per million output tokens at the simulated throughput", LOWER,
                           header="$/Mtok", fmt="{:.2f}"),
    "prefix_hit_rate": Metric("1", "prompt tokens found in the prefix cache at first admission / prompt tokens "
                              "(NaN: no prefix caching)", HIGHER, header="hit rate", scale=100, fmt="{:.1f}%"),
    "steady": Metric("1", "the measured window is a steady state (1), drifts between its halves (0: its TTFT "
                     "median or hit rate moves), or is too short to tell (NaN)", HIGHER, header="steady",
                     fmt="{:.0f}"),
    "accepted_length": Metric("tokens", "speculative decoding: tokens a verification emits on average, 1 + the "
                              "draft tokens accepted (NaN: no speculation)", HIGHER, header="accepted",
                              fmt="{:.2f}"),
}

# What a capacity search and a plan find, beside the metrics at the answer.
ANSWERS: dict[str, Metric] = {
    "max_rate_rps": Metric("requests/s", "highest request rate meeting every target (to 1 %)", HIGHER,
                           header="max rate", fmt="{:.3g}"),
    "replicas": Metric("replicas", "fewest replicas meeting every target", LOWER, integer=True, header="replicas",
                       fmt="{:.0f}"),
}


def direction(name: str) -> int:
    """+1 when higher is better, -1 when lower is, 0 when neither (or not a metric)."""
    metric = METRICS.get(name) or ANSWERS.get(name)
    return metric.better if metric else NEITHER


def integer_metrics() -> frozenset[str]:
    return frozenset(name for name, m in METRICS.items() if m.integer)
