"""Metrics: the lesson's quantile rule, definitions checked against plain Python, Little's law."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsim import Config, simulate
from fastsim.analysis.metrics import METRICS, _sum, quantiles

from ..oracles import lesson as oracle


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=300))
def test_quantiles_follow_the_lesson_rule(xs):
    ps = (0.5, 0.9, 0.99)
    assert quantiles(np.array(xs), ps) == [oracle.quantile(xs, p) for p in ps]


@given(st.integers(0, 5000), st.integers(0, 2**32))
def test_compiled_sums_are_numpys_to_the_bit(n, seed):
    """A small run's means (compiled) and a large run's (NumPy) add the same way."""
    values = np.random.default_rng(seed).lognormal(0.0, 3.0, n)
    assert _sum(values) == values.sum()
    assert _sum(values[: n // 3]) == values[: n // 3].sum()


@settings(max_examples=30, deadline=None)
@given(st.integers(4097, 30_000), st.integers(0, 2**32), st.sampled_from(["lognormal", "ties", "equal"]))
def test_quantiles_of_large_arrays_are_selected_exactly(n, seed, shape):
    """Past SORT_BELOW values, a histogram then a selection: still the sorted value at floor(p n)."""
    rng = np.random.default_rng(seed)
    values = {"lognormal": rng.lognormal(0.0, 2.0, n), "ties": rng.integers(0, 5, n).astype(float),
              "equal": np.full(n, 0.25)}[shape]
    ps = (0.0, 0.5, 0.9, 0.99, 0.999999)
    ordered = np.sort(values)
    assert quantiles(values, ps) == [float(ordered[min(n - 1, int(p * n))]) for p in ps]


def test_quantiles_of_nothing_are_nan():
    assert all(math.isnan(q) for q in quantiles(np.array([]), (0.5, 0.99)))


def test_every_metric_has_units_and_a_name():
    r = simulate(Config().with_values({"workload.n_requests": 500}))
    assert list(r.metrics) == list(METRICS)
    assert all(m.units and m.long_name and m.header for m in METRICS.values())


def test_definitions():
    r = simulate(Config().with_values({"workload.n_requests": 3000, "workload.rate": 20, "engine.policy": "dynamic"}))
    m, out = r.metrics, r.output_tokens
    span = r.done_s.max()
    assert m["span_s"] == span
    assert m["throughput_tok_s"] == out.sum() / span
    assert m["request_rate_rps"] == len(out) / span
    assert m["mean_batch"] == out.sum() / m["steps"]  # busy slot-steps = output tokens
    assert m["slot_use"] == out.sum() / (m["steps"] * 64)
    multi = out > 1
    tpot = ((r.done_s - r.first_token_s)[multi] / (out[multi] - 1)).tolist()
    assert m["tpot_p99_s"] == oracle.quantile(tpot, 0.99)
    assert m["e2e_mean_s"] == np.mean(r.done_s - r.arrival_s)
    assert m["ttft_p90_s"] == oracle.quantile((r.first_token_s - r.arrival_s).tolist(), 0.9)


def test_littles_law():
    """Time-average number in the system (integrated from arrival/departure events) equals
    completion rate x mean time in system."""
    r = simulate(Config().with_values({"workload.n_requests": 20_000, "workload.rate": 30}))
    times = np.concatenate([r.arrival_s, r.done_s])
    steps = np.concatenate([np.ones_like(r.arrival_s), -np.ones_like(r.done_s)])
    order = np.argsort(times, kind="stable")
    in_system = np.cumsum(steps[order])
    area = np.sum(in_system[:-1] * np.diff(times[order]))
    L = area / r.metrics["span_s"]
    assert math.isclose(L, r.metrics["request_rate_rps"] * r.metrics["e2e_mean_s"], rel_tol=1e-9)


def test_tpot_nan_when_every_output_is_one_token():
    r = simulate(Config().with_values({"workload.output.dist": "fixed", "workload.output.value": 1,
                                       "workload.n_requests": 50}))
    assert math.isnan(r.metrics["tpot_p50_s"]) and r.metrics["ttft_p50_s"] == r.metrics["e2e_p50_s"]


def test_a_run_without_itl_has_every_other_metric_as_with_it():
    """``with_itl=False`` (what a fit that measured no ITL asks for) leaves the ITL quantiles NaN
    and every other metric as it is, in a small run (one compiled call) and a large one."""
    for n in (500, 8_000):
        config = Config().with_values({"workload.n_requests": n, "workload.rate": 30})
        full, lean = simulate(config).metrics, simulate(config, with_itl=False).metrics
        assert math.isnan(lean["itl_p50_s"]) and math.isnan(lean["itl_p99_s"]) and full["itl_p99_s"] > 0
        rest = [k for k in full if not k.startswith("itl_")]
        assert np.array_equal([lean[k] for k in rest], [full[k] for k in rest], equal_nan=True)
