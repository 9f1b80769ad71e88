"""The jitter model (docs/model/serving.md, "Jitter"): each replica's stalls, a Poisson process
of log-normal pauses; a request waits for those of its replica that begin between its arrival
and its first token, and between its first and its last token. Checked against a plain loop
written from that rule, and the process against its definition."""

import math

import numpy as np
import pytest

from fastsim import Config, simulate
from fastsim.engine import stalls

JITTER = {"calibration.stall_rate_hz": 4.0, "calibration.stall_median_ms": 8.0, "calibration.stall_sigma": 0.9}


def by_hand(starts, cum, arrival, first, done):
    """The rule, literally: the stalls that start in each window, summed one by one."""
    lengths = np.diff(cum)
    ttft = [sum(lengths[(starts >= a) & (starts < f)]) for a, f in zip(arrival, first)]
    rest = [sum(lengths[(starts >= f) & (starts < d)]) for f, d in zip(first, done)]
    return np.array(ttft), np.array(rest)


def test_the_stalls_are_a_poisson_process_of_log_normal_pauses():
    config = Config().with_values(JITTER)
    starts, cum, _, _ = stalls._timeline(config, 0, 0, 20_000.0)
    expected = 4.0 * 20_000
    assert abs(starts.size - expected) < 4 * math.sqrt(expected)
    assert np.all(np.diff(starts) > 0) and starts[-1] < 20_000
    gaps = np.diff(starts)
    assert gaps.mean() == pytest.approx(1 / 4.0, rel=0.02) and gaps.std() == pytest.approx(1 / 4.0, rel=0.03)
    logs = np.log(np.diff(cum) * 1e3 / 8.0)
    assert abs(np.median(logs)) < 0.02 and logs.std() == pytest.approx(0.9, rel=0.03)


FREQUENT = {**JITTER, "calibration.stall_rate_hz": 40.0}  # many stalls a window


def requests(rng, span: float, n: int, ttft: float):
    """n requests' (arrival, first token, done) times: Poisson-like arrivals, exponential waits for
    a first token of mean ``ttft``, log-normal answers."""
    arrival = np.sort(rng.uniform(0, span, n))
    first = arrival + rng.exponential(ttft, n)
    return arrival, first, first + rng.lognormal(0, 1, n)


def test_each_request_waits_for_the_stalls_in_its_windows():
    rng = np.random.default_rng(3)
    config = Config().with_values(FREQUENT)
    arrival, first, done = requests(rng, 50, 2000, 0.2)
    got_first, got_done = first.copy(), done.copy()
    stalls.apply(config, arrival, got_first, got_done, None)
    starts, cum, _, _ = stalls._timeline(config, 0, 0, float(done.max()) + 1.0)
    ttft, rest = by_hand(starts, cum, arrival, first, done)
    assert np.allclose(got_first - first, ttft, rtol=0, atol=1e-12)
    assert np.allclose(got_done - done, ttft + rest, rtol=0, atol=1e-12)
    assert (ttft > 0).mean() == pytest.approx(8 / 9, abs=0.03)  # 1 - E[exp(-40 W)] for W ~ Exp(mean 0.2 s)


def test_replicas_stall_apart_and_a_prefill_pool_holds_the_first_tokens():
    rng = np.random.default_rng(4)
    config = Config().with_values(FREQUENT)
    arrival, first, done = requests(rng, 20, 600, 0.3)
    replica = rng.integers(0, 3, arrival.size).astype(np.int32)
    prefill = rng.integers(0, 2, arrival.size).astype(np.int32)
    span = float(done.max()) + 1.0
    for pre in (None, prefill):
        got_first, got_done = first.copy(), done.copy()
        stalls.apply(config, arrival, got_first, got_done, replica, pre)
        for r in range(3):
            ids = replica == r
            starts, cum, _, _ = stalls._timeline(config, r, 0, span)
            ttft, rest = by_hand(starts, cum, arrival[ids], first[ids], done[ids])
            if pre is None:
                assert np.allclose(got_first[ids] - first[ids], ttft, rtol=0, atol=1e-12)
            else:
                p_ttft = np.zeros(ids.sum())
                for p in range(2):  # the first token waits on its prefill replica's stalls
                    mine = pre[ids] == p
                    starts_p, cum_p, _, _ = stalls._timeline(config, p, 1, span)
                    p_ttft[mine] = by_hand(starts_p, cum_p, arrival[ids][mine], first[ids][mine], first[ids][mine])[0]
                assert np.allclose(got_first[ids] - first[ids], p_ttft, rtol=0, atol=1e-12)
                ttft = p_ttft
            assert np.allclose(got_done[ids] - done[ids], ttft + rest, rtol=0, atol=1e-12)


def test_jitter_is_a_function_of_the_seed_and_off_changes_nothing(root):
    from fastsim import load_config

    base = load_config(root / "configs/h100.yaml", {"workload.n_requests": 2000, "workload.rate": 8})
    off = simulate(base.with_values({"calibration.stall_rate_hz": 0}))
    on, again = (simulate(base) for _ in range(2))
    assert np.array_equal(on.done_s, again.done_s)
    other = simulate(base.with_values({"workload.seed": 8}))
    assert not np.array_equal(other.done_s, on.done_s)
    assert np.all(on.first_token_s >= off.first_token_s) and np.all(on.done_s - on.first_token_s >= off.done_s -
                                                                   off.first_token_s - 1e-12)
    assert on.metrics["e2e_p99_s"] > off.metrics["e2e_p99_s"]
    fleet = simulate(base.with_values({"fleet.replicas": 2, "workload.rate": 16}))
    assert np.all(fleet.first_token_s <= fleet.done_s)
