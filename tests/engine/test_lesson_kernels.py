"""The fast kernels against the pure-Python oracle, invariants, and queueing theory."""

import dataclasses
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsim import Config
from fastsim.engine import kernels
from fastsim.model import cost
from fastsim.model.schema import POLICIES
from fastsim.engine.traffic import generate

from ..oracles import lesson as oracle
from ..strategies import close, dirty_scratch


@st.composite
def configs(draw) -> Config:
    lo = draw(st.integers(1, 6))
    dist = draw(st.sampled_from(["lognormal", "fixed"]))
    mu = draw(st.floats(0.0, 4.0))
    values = {
        "hardware.mem_bandwidth_tb_s": draw(st.floats(0.5, 5.0)),
        "model.weight_gb": draw(st.sampled_from([0.0, 1.0, 15.008])),
        "model.kv_bytes_per_token": draw(st.sampled_from([0.0, 4096.0, 131072.0, 1e6])),
        "engine.policy": draw(st.sampled_from(list(POLICIES))),
        "engine.max_batch": draw(st.integers(1, 8)),
        "engine.max_concurrent": draw(st.none() | st.integers(1, 8)),
        "engine.window_ms": draw(st.sampled_from([0.0, 1.0, 5.0, 50.0, 500.0])),
        "workload.n_requests": draw(st.integers(1, 60)),
        "workload.rate": draw(st.floats(0.5, 2000.0)),
        "workload.seed": draw(st.integers(0, 2**32)),
        "workload.rng": draw(st.sampled_from(["stdlib", "numpy"])),
        "workload.prompt.value": draw(st.integers(0, 2000)),
        "workload.output.dist": dist,
        "workload.output.mu": mu,
        "workload.output.sigma": draw(st.floats(0.0, 1.5)),
        "workload.output.min": lo,
        "workload.output.max": draw(st.integers(max(lo, math.ceil(math.exp(mu))), 80)),  # a median within max
        "workload.output.value": draw(st.integers(1, 30)),
    }
    if values["workload.rng"] == "numpy":  # the stdlib stream is the lesson's shapes only
        values["workload.arrival"] = draw(st.sampled_from(["poisson", "gamma", "constant"]))
        values["workload.burstiness"] = draw(st.sampled_from([0.2, 1.0, 5.0]))
        values["workload.prompt.dist"] = draw(st.sampled_from(["fixed", "lognormal", "uniform"]))
        values["workload.prompt.min"] = draw(st.integers(0, 100))
        values["workload.prompt.max"] = draw(st.integers(100, 3000))
        values["workload.prompt.mu"] = draw(st.floats(2.0, math.log(values["workload.prompt.max"])))
        values["workload.output.dist"] = draw(st.sampled_from(["fixed", "lognormal", "uniform"]))
    return Config().with_values(values)


def lesson_step_time(config: Config) -> tuple[float, float]:
    """The lesson's step time, ``t_weight + t_kv * ctx``: (t_weight, t_kv) in seconds."""
    k = cost.coefficients(config)
    return float(k[cost.T_WEIGHTS]), float(k[cost.T_KV])


def run_both(config: Config):
    traffic = generate(config.workload)
    fast = kernels.run(config, traffic, scratch=dirty_scratch())
    t_weight, t_kv = lesson_step_time(config)
    e = config.engine
    window = e.window_ms / 1000 if e.policy == "dynamic" else math.inf
    slow = oracle.simulate(
        traffic.arrival_s.tolist(),
        traffic.prompt_tokens.tolist(),
        traffic.output_tokens.tolist(),
        e.policy,
        e.limit,
        window,
        t_weight,
        t_kv,
    )
    return traffic, fast, slow


@settings(max_examples=1000)
@given(configs())
def test_kernels_match_oracle_exactly(config):
    _, fast, (first_token, done, steps, busy, max_queue) = run_both(config)
    assert fast.first_token_s.tolist() == first_token
    assert fast.done_s.tolist() == done
    assert (fast.steps, fast.busy_slot_steps, fast.max_queue) == (steps, busy, max_queue)


@settings(max_examples=150)
@given(configs())
def test_invariants(config):
    traffic, out, _ = run_both(config)
    # every request completes exactly once, in order: arrival <= first token <= done
    assert np.isfinite(out.done_s).all()
    assert (traffic.arrival_s <= out.first_token_s).all()
    assert (out.first_token_s <= out.done_s).all()
    # tokens are conserved: every busy slot-step produced exactly one output token
    assert out.busy_slot_steps == traffic.output_tokens.sum()
    # a one-token request finishes on its first step
    single = traffic.output_tokens == 1
    assert (out.first_token_s[single] == out.done_s[single]).all()
    # no step runs more sequences than the limit
    assert out.busy_slot_steps <= out.steps * config.engine.limit


def test_uncapped_and_capped_runs_differ_only_through_the_limit():
    base = Config().with_values({"workload.n_requests": 2000, "workload.rate": 40})
    capped = kernels.run(base.with_values({"engine.max_concurrent": 16}), generate(base.workload))
    narrow = kernels.run(base.with_values({"engine.max_batch": 16}), generate(base.workload))
    assert capped.done_s.tolist() == narrow.done_s.tolist()


def test_continuous_single_slot_is_an_mg1_queue():
    """max_batch 1 with no KV cost: service time = output * weight-read step, FIFO, Poisson
    arrivals. The mean wait must match Pollaczek-Khinchine: W = lam E[S^2] / (2 (1 - rho))."""
    step = 1e-3  # seconds per token
    config = Config().with_values(
        {
            "engine.policy": "continuous",
            "engine.max_batch": 1,
            "model.kv_bytes_per_token": 0.0,
            "model.weight_gb": step * 1e3,  # bytes / (1e12 B/s) = 1 ms
            "hardware.mem_bandwidth_tb_s": 1.0,
            "workload.n_requests": 200_000,
            "workload.output.mu": 3.0,
            "workload.output.sigma": 0.5,
            "workload.output.min": 1,
            "workload.output.max": 200,
            "workload.seed": 11,
        }
    )
    # the output distribution's moments, from a large independent sample
    ref = generate(config.workload.model_copy(update={"n_requests": 2_000_000, "seed": 99})).output_tokens
    s1, s2 = step * ref.mean(), step**2 * (ref.astype(float) ** 2).mean()
    lam = 0.5 / s1  # 50 % load
    traffic = generate(config.with_values({"workload.rate": lam}).workload)
    out = kernels.run(config.with_values({"workload.rate": lam}), traffic)
    wait = out.first_token_s - step - traffic.arrival_s  # admission time - arrival
    expected = lam * s2 / (2 * (1 - lam * s1))
    # batch means over 20 blocks give the sampling error of a correlated series
    blocks = wait.reshape(20, -1).mean(axis=1)
    stderr = blocks.std(ddof=1) / math.sqrt(len(blocks))
    assert abs(wait.mean() - expected) < 4 * stderr + 0.01 * expected, (wait.mean(), expected, stderr)
    assert stderr < 0.05 * expected  # the test has power


def test_outputs_longer_than_the_calendar_ring():
    """Requests due a whole turn (or several) of the bounded calendar ahead finish on time, in
    the lesson's kernels and in the serving model's (forced onto the same config)."""
    from fastsim.engine.traffic import Traffic

    ring = kernels.RING_MAX
    output = np.array([ring + 5, 3, ring, 2 * ring + 1, ring - 1, 1], dtype=np.int64)
    traffic = Traffic(np.arange(1, 7) * 1e-3, np.full(6, 10, dtype=np.int64), output)
    for policy in POLICIES:
        config = Config().with_values({"engine.policy": policy, "engine.max_batch": 3,
                                       "workload.n_requests": 6, "engine.window_ms": 2.0})
        fast = kernels.run(config, traffic)
        t_weight, t_kv = lesson_step_time(config)
        window = 2e-3 if policy == "dynamic" else math.inf
        first, done, steps, busy, _ = oracle.simulate(traffic.arrival_s.tolist(), [10] * 6, output.tolist(),
                                                      policy, 3, window, t_weight, t_kv)
        assert fast.done_s.tolist() == done and fast.first_token_s.tolist() == first
        assert (fast.steps, fast.busy_slot_steps) == (steps, busy)
        serving = kernels.run(config, traffic, dataclasses.replace(kernels.Plan.of(config), lesson=False))
        assert close(serving.done_s, done) and close(serving.first_token_s, first)
