"""``fastsim bench``: how fast the simulator itself runs, measured honestly.

For each policy and arrival rate, on the lesson's traffic shape drawn with numpy, and for the
serving model's continuous batching (configs/h100.yaml's scenario) from light to moderate
load: the first call (JIT compile, or load from Numba's cache) is timed apart, then the kernel is
timed over several repeats (best kept) on the same arrays, and its results are checked before any
figure is reported.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import numpy as np

from .analysis.simulation import measure
from .engine import fleet, kernels
from .engine import traffic as traffic_of
from .engine.traffic import generate
from .model import hf_config
from .model.presets import MODELS
from .model.schema import POLICIES, Config


@dataclass(frozen=True)
class BenchRow:
    model: str  # lesson | serving (configs/h100.yaml) | a fleet of it
    policy: str  # the batching policy, or a fleet's router, or closed-loop clients
    rate: float | None  # None: closed-loop clients
    n_requests: int
    first_call_s: float  # JIT compile or cache load, on a tiny input
    traffic_s: float
    kernel_s: float  # best of the repeats
    metrics_s: float
    steps: int

    @property
    def kernel_rps(self) -> float:
        """Simulated requests per second of the kernel alone."""
        return self.n_requests / self.kernel_s

    @property
    def end_to_end_rps(self) -> float:
        """Simulated requests per second including traffic generation and metrics."""
        return self.n_requests / (self.traffic_s + self.kernel_s + self.metrics_s)


class BenchCheckFailed(RuntimeError):
    """A benchmarked run produced results that violate the model's invariants."""


def _check(config: Config, out: kernels.Outcome, output: np.ndarray, arrival: np.ndarray) -> None:
    where = f"{config.engine.policy} at rate {config.workload.rate}"
    if not np.isfinite(out.done_s).all():
        raise BenchCheckFailed(f"{where}: some requests never finished")
    if not ((arrival <= out.first_token_s) & (out.first_token_s <= out.done_s)).all():
        raise BenchCheckFailed(f"{where}: a request finished before it started")
    if out.spec_counts is None and out.busy_slot_steps != int(output.sum()):
        raise BenchCheckFailed(f"{where}: busy slot-steps != output tokens")
    # speculation: a slot-step per verification and per prefill that emits (at least one a request)
    if out.spec_counts is not None and not (out.spec_counts.sum() + output.size <= out.busy_slot_steps <= output.sum()):
        raise BenchCheckFailed(f"{where}: busy slot-steps are not one a verification and one a prefill")


def _best_of(repeats: int, fn):
    """(fastest wall time, last result) of ``repeats`` calls."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


# configs/h100.yaml's scenario (its base values; tests/test_cli.py keeps the two in step)
SERVING = {
    "hardware.preset": "h100-sxm",
    "model.preset": "llama-3.1-8b",
    "engine.max_batch": 256,
    "engine.max_batched_tokens": 8192,
    "engine.prefix_caching": True,
    "engine.async_scheduling": True,
    "calibration.compute_efficiency": 0.997946,
    "calibration.bandwidth_efficiency": 0.792838,
    "calibration.step_overhead_ms": 0.300063,
    "calibration.layer_overhead_us": 9.679034,
    "calibration.moe_layer_overhead_us": 57.8769,
    "calibration.api_overhead_ms": 6.740596,
    "calibration.stall_rate_hz": 0.751957,
    "calibration.stall_median_ms": 28.298289,
    "calibration.stall_sigma": 0.937697,
    "calibration.fitted_to": "vLLM v0.15.1 on H100 SXM (configs/calibration/vllm-0.15-h100.csv, 4 runs)",
    "slo.ttft_s": 0.5,
    "slo.tpot_s": 0.05,
}
SERVING_RATES = (2.0, 8.0, 24.0)  # light to moderate load (saturation is near 45/s): where most steps are bare
# A mixture of experts on the same engine: Qwen3-30B-A3B (128 experts, 8 a token) on one H100.
MOE = ("moe (qwen3-30b-a3b)", {"model.preset": "qwen3-30b-a3b"}, 24.0)
# The same on four H100s as four attention data-parallel ranks, the experts over all four, at four times the load.
MOE_DP = ("moe, dp 4 (qwen3-30b-a3b)", {"model.preset": "qwen3-30b-a3b", "engine.dp": 4,
                                        "engine.expert_parallel": True}, 96.0)
# A hybrid-attention model on one H100: gpt-oss-120b, half its layers a 128-token sliding window.
HYBRID = ("hybrid KV (gpt-oss-120b)", {"model.preset": "gpt-oss-120b"}, 8.0)
# Speculative decoding: DeepSeek-R1 on 8 H200s (tp 8), its MTP layer proposing 2 tokens a step at acceptance 0.8.
SPECULATIVE = ("mtp 2 (deepseek-r1, 8 x h200)", {
    "model.preset": "deepseek-r1", "hardware.preset": "h200", "engine.tp": 8,
    "engine.speculative": {"method": "mtp", "tokens": 2, "acceptance": 0.8}}, 24.0)
# Fleets of it: 8 GPUs at 12 requests/s each, as 8 replicas behind two routers or as 2 prefill + 6 decode.
# Chat sessions with vLLM's prefix cache on the same engine and workload: 8 system prompts of 500
# tokens, sessions of 2-10 turns (each re-sending the conversation and a new 1,000-token message),
# 10 s of thinking; 1 session a second (~5.7 requests/s, TTFT p99 ~0.16 s).
SESSIONS = ("sessions, prefix cache (h100)", {
    "workload.system_prompts": {"count": 8, "tokens": 500},
    "workload.sessions": {"turns": {"dist": "uniform", "min": 2, "max": 10}}}, 1.0)
# Closed-loop clients on the same engine, as `vllm bench serve --max-concurrency 256` runs them.
CLOSED = ("closed loop (h100)", {"workload.concurrency": 256, "workload.rate": None}, None)
FLEET_RATE = 96.0
FLEETS = (
    ("fleet (8 x h100)", {"fleet.replicas": 8}),
    ("fleet (8 x h100)", {"fleet.replicas": 8, "fleet.router": "least_outstanding"}),
    ("fleet (2P + 6D h100)", {"fleet.replicas": 6, "fleet.prefill_replicas": 2}),
)
# configs/chat-fleet.yaml's workload and fleet (its base values, without its warm-up: speed, not
# steady state; tests/test_cli.py keeps the two in step): 4 replicas behind each router, and the
# same sessions on 2 prefill + 2 decode replicas.
CHAT = {
    "engine.prefix_caching": True,
    "fleet.replicas": 4,
    "fleet.router": "prefix_aware",
    "fleet.prefix_weight": 64,
    "workload.rate": 10.0,
    "workload.prompt": {"dist": "lognormal", "mu": 7.3, "sigma": 0.5, "min": 1001, "max": 8000},
    "workload.output": {"dist": "lognormal", "mu": 5.0, "sigma": 0.9, "min": 1, "max": 1500},
    "workload.system_prompts": {"count": 8, "tokens": 1000, "popularity": "zipf"},
    "workload.sessions": {"turns": {"dist": "uniform", "min": 2, "max": 10},
                          "followup": {"dist": "lognormal", "mu": 5.0, "sigma": 0.8, "min": 1, "max": 2000},
                          "think_s": {"dist": "exponential", "mean": 10}},
    "slo.ttft_s": 0.5,
    "slo.tpot_s": 0.05,
}
CHAT_FLEETS = (
    ("chat fleet (4 x h100)", {"fleet.router": "prefix_aware"}),
    ("chat fleet (4 x h100)", {"fleet.router": "round_robin"}),
    ("chat fleet (4 x h100)", {"fleet.router": "least_outstanding"}),
    ("chat fleet (2P + 2D h100)", {"fleet.router": "prefix_aware", "fleet.replicas": 2, "fleet.prefill_replicas": 2}),
)


def _case(model: str, config: Config, repeats: int, n_requests: int, rows: list, traffic_cache: dict) -> None:
    workload = config.workload
    key = repr(traffic_of.key(config))
    if key not in traffic_cache:
        traffic_cache.clear()  # one traffic draw kept at a time
        traffic_cache[key] = _best_of(repeats, lambda: traffic_of.of(config))
    traffic_s, traffic = traffic_cache[key]
    tiny = traffic_of.of(config.at({"workload.n_requests": 10}))
    first_call_s, _ = _best_of(1, lambda: fleet.run(config, tiny))
    scratch = kernels.Scratch()  # as fastsim.simulate keeps one per thread
    kernel_s, out = _best_of(repeats, lambda: fleet.run(config, traffic, scratch))
    _check(config, out, traffic.output_tokens, out.arrivals(traffic.arrival_s))
    metrics_s, _ = _best_of(repeats, lambda: measure(config, traffic, out))
    f = config.fleet
    label = config.engine.policy if f.replicas == 1 and not f.prefill_replicas else f.router
    if workload.concurrency is not None:
        label = f"{workload.concurrency} clients"
    rows.append(BenchRow(model, label, workload.rate, n_requests, first_call_s, traffic_s, kernel_s, metrics_s,
                         out.steps))


def bench(
    n_requests: int = 1_000_000,
    rates: tuple[float, ...] = (8.0, 40.0),
    policies: tuple[str, ...] = POLICIES,
    repeats: int = 5,
    serving_rates: tuple[float, ...] = SERVING_RATES,
    fleets: bool = True,
) -> list[BenchRow]:
    """Time every policy at every rate on the lesson's model, then continuous batching on the
    serving model (configs/h100.yaml's scenario), a mixture of experts, sessions and closed-loop
    clients on it, then fleets of it (:data:`FLEETS`), then
    configs/chat-fleet.yaml's sessions behind each router (:data:`CHAT_FLEETS`); raises
    :class:`BenchCheckFailed` on a wrong result. Each stage (traffic, simulation, metrics) is
    timed ``repeats`` times, the fastest kept.
    """
    rows: list[BenchRow] = []
    cache: dict = {}
    for rate in rates:
        base = Config().with_values({"workload.rng": "numpy", "workload.rate": rate, "workload.n_requests": n_requests})
        for policy in policies:
            _case("lesson", base.with_values({"engine.policy": policy}), repeats, n_requests, rows, cache)
    for rate in serving_rates:
        config = Config().with_values({**SERVING, "workload.rate": rate, "workload.n_requests": n_requests})
        _case("serving (h100)", config, repeats, n_requests, rows, cache)
    for model, values, rate in (MOE, MOE_DP, HYBRID, SPECULATIVE, SESSIONS, CLOSED):
        _case(model, Config().with_values({**SERVING, **values, "workload.rate": rate,
                                           "workload.n_requests": n_requests}), repeats, n_requests, rows, cache)
    if fleets:
        for model, values in FLEETS:
            config = Config().with_values({**SERVING, **values, "workload.rate": FLEET_RATE,
                                           "workload.n_requests": n_requests})
            _case(model, config, repeats, n_requests, rows, cache)
        for model, values in CHAT_FLEETS:
            config = Config().with_values({**SERVING, **CHAT, **values, "workload.n_requests": n_requests})
            _case(model, config, repeats, n_requests, rows, cache)
    return rows


TRAFFIC_SHAPES = {
    "lesson shape (Poisson, fixed prompts, lognormal outputs)": {},
    "lognormal prompts, gamma arrivals (burstiness 0.5)": {
        "workload.prompt.dist": "lognormal", "workload.arrival": "gamma", "workload.burstiness": 0.5},
}


def import_costs(repeats: int = 5) -> dict[str, float]:
    """Seconds to import each shipped model preset: read and parse its config.json, count its
    parameters and validate the config that names it (the fastest of ``repeats``, each from the
    file: the process's cache cleared)."""
    costs = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hf_config.Approximation)
        for name in MODELS:
            best = float("inf")
            for _ in range(repeats):
                hf_config.read.cache_clear()
                t0 = time.perf_counter()
                Config().with_values({"model.preset": name})
                best = min(best, time.perf_counter() - t0)
            costs[name] = best
    return costs


def traffic_costs(n_requests: int = 1_000_000, repeats: int = 3) -> dict[str, float]:
    """Seconds per request to generate traffic of each shape (numpy stream, best of ``repeats``)."""
    out = {}
    for name, values in TRAFFIC_SHAPES.items():
        workload = Config().with_values({**values, "workload.n_requests": n_requests}).workload
        seconds, traffic = _best_of(repeats, lambda: generate(workload))
        if len(traffic) != n_requests:
            raise BenchCheckFailed(f"traffic ({name}): {len(traffic)} requests, expected {n_requests}")
        out[name] = seconds / n_requests
    return out


@dataclass(frozen=True)
class SweepOverhead:
    points: int
    setup_s: float  # validating the grid and cutting it into blocks
    run_s: float  # running every point of 10 requests in one thread

    @property
    def setup_us_per_point(self) -> float:
        return self.setup_s / self.points * 1e6

    @property
    def run_us_per_point(self) -> float:
        return self.run_s / self.points * 1e6


def sweep_overhead(points: int = 20_000) -> SweepOverhead:
    """What a sweep costs per point beyond simulating it: a grid of ``points`` points (seeds x
    rates) of 10 requests each, so the simulation itself is a small share of the time."""
    from .sweep.grid import build_grid
    from .sweep.runner import make_blocks, run_grid

    rates = [1.0, 2.0, 4.0, 8.0]
    config = Config().with_values({"workload.n_requests": 10}).model_copy(
        update={"sweep": {"workload.seed": list(range(points // len(rates))), "workload.rate": rates}}
    )
    t0 = time.perf_counter()
    grid = build_grid(config)
    make_blocks(grid, np.arange(grid.size), 1)
    setup_s = time.perf_counter() - t0
    run_s, table = _best_of(1, lambda: run_grid(grid, workers=1))
    if np.isnan(table).all(axis=-1).any():
        raise BenchCheckFailed("sweep overhead: a point was not run")
    return SweepOverhead(grid.size, setup_s, run_s)


@dataclass(frozen=True)
class ColdStart:
    compiling_s: float  # a fresh process, an empty Numba cache: imports, compiles, one small run
    cached_s: float  # the same again: the kernels load from the cache


COLD_RUN = """
import fastsim
from fastsim.bench import SERVING
config = fastsim.Config().with_values({**SERVING, "workload.n_requests": 2000})
assert fastsim.simulate(config).metrics["steps"] > 0
"""


def cold_start() -> ColdStart:
    """What a new user's first run costs: a fresh process on configs/h100.yaml's scenario (2,000
    requests) with an empty Numba cache, then again with the cache it filled (what every later
    run costs)."""
    import os
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix="fastsim-bench-cache-") as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", COLD_RUN], env=env, check=True)
            times.append(time.perf_counter() - t0)
    return ColdStart(*times)
