"""Sweep points run many to a compiled call (fastsim.analysis.batch) give fastsim.simulate's
metrics to the bit: on random serving and lesson configs, across groups that break (another
engine, other objectives, a fleet, a large point) and where the loop hands a point back."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsim import Config, load_config, simulate
from fastsim.analysis import batch
from fastsim.analysis.metrics import METRICS

from ..strategies import serving_configs


def simulated(configs):
    return np.array([list(simulate(c).metrics.values()) for c in configs])


def assert_same(got, expected):
    same = (got == expected) | (np.isnan(got) & np.isnan(expected))
    assert same.all(), [m for m, ok in zip(METRICS, same.all(axis=0)) if not ok]


slos = st.fixed_dictionaries({"slo.ttft_s": st.none() | st.floats(0.001, 5.0),
                              "slo.tpot_s": st.none() | st.floats(0.001, 0.5),
                              "slo.e2e_s": st.none() | st.floats(0.01, 50.0)})


@settings(max_examples=40, deadline=None)
@given(serving_configs(), st.lists(st.integers(0, 2**32), min_size=1, max_size=4), slos)
def test_serving_points_in_one_call_give_simulate_metrics(config, seeds, slo):
    config = config.with_values(slo)
    points = [config.at({"workload.seed": s}) for s in seeds]
    points += [p.at({"workload.rate": p.workload.rate * 2}) for p in points[:2]]
    assert_same(batch.metric_rows(points), simulated(points))


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(["static", "dynamic", "continuous"]), st.integers(1, 300), st.floats(0.5, 60.0),
       st.lists(st.integers(0, 2**32), min_size=1, max_size=4))
def test_lesson_points_in_one_call_give_simulate_metrics(policy, n, rate, seeds):
    config = Config().with_values({"engine.policy": policy, "workload.n_requests": n, "workload.rate": rate})
    points = [config.at({"workload.seed": s}) for s in seeds]
    assert_same(batch.metric_rows(points), simulated(points))


def test_groups_break_where_the_engine_objectives_or_kind_of_point_change(root):
    h100 = load_config(root / "configs/h100.yaml").with_values({"workload.n_requests": 60})
    points = [
        h100, h100.at({"workload.seed": 3}),
        h100.with_values({"engine.max_batch": 8}),  # another engine
        h100.with_values({"slo.ttft_s": 0.05}),  # other objectives
        h100.with_values({"fleet.replicas": 2}),  # a fleet: simulated alone
        h100.with_values({"workload.n_requests": batch.MAX_REQUESTS + 1}),  # too many requests for the loop
        h100.at({"workload.seed": 4}),
    ]
    assert_same(batch.metric_rows(points), simulated(points))


def test_points_the_loop_cannot_finish_are_simulated_alone(root, monkeypatch):
    h100 = load_config(root / "configs/h100.yaml", {"calibration.stall_rate_hz": 0})  # jitter runs alone too
    # too many inter-token gaps to list: 300 requests of 400 tokens at a slow rate, ~120k steps
    long = h100.with_values({"workload.n_requests": 300, "workload.rate": 0.5, "workload.output.dist": "fixed",
                             "workload.output.value": 400})
    small = h100.with_values({"workload.n_requests": 200})
    points = [small, long, small.at({"workload.seed": 1})]
    alone = []
    monkeypatch.setattr(batch, "simulate", lambda c, *a, **k: alone.append(c) or simulate(c, *a, **k))
    assert_same(batch.metric_rows(points), simulated(points))
    assert alone == [long]
    alone.clear()
    monkeypatch.setattr(batch, "RUNS_PER_REQUEST", 0)  # room for 64 step runs only: the runs overflow
    assert_same(batch.metric_rows(points), simulated(points))
    assert alone == points
    alone.clear()
    jitter = [p.at({"calibration.stall_rate_hz": 1.0}) for p in points]
    assert_same(batch.metric_rows(jitter), simulated(jitter))
    assert alone == jitter  # stalls are drawn after the kernel: not in the one-call loop


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 16), st.integers(8, 120), st.integers(1, 30), st.integers(1, 6), st.floats(20.0, 3000.0),
       st.lists(st.integers(0, 2**32), min_size=1, max_size=4))
def test_points_with_a_prefix_cache_in_one_call_give_simulate_metrics(bt, prompt, output, limit, rate, seeds):
    """Prefix caching over requests that share nothing, in caches small enough to preempt: a
    preempted request hits its own blocks again, in the compiled loop as in fastsim.simulate."""
    config = Config().with_values({
        "hardware.preset": "h100-sxm", "model.preset": "llama-3.1-8b", "engine.prefix_caching": True,
        "engine.block_tokens": bt, "engine.max_batch": limit, "engine.max_batched_tokens": 256,
        "engine.kv_cache_gb": (prompt + output + 2 * bt) * (1.5 + limit / 4) * 131072 / 1e9, "workload.n_requests": 60,
        "workload.rate": rate, "workload.prompt.value": prompt, "workload.output.dist": "uniform",
        "workload.output.min": 1, "workload.output.max": output, "workload.rng": "numpy"})
    points = [config.at({"workload.seed": s}) for s in seeds]
    assert_same(batch.metric_rows(points), simulated(points))
