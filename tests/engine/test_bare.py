"""Runs of bare steps in closed form (fastsim.engine.kernels._bare): each piece against the step
by step loop it replaces, and the serving kernel against the oracle on traffic made of long runs
(sparse arrivals, long outputs, caches that run out in the middle of a run, a roofline that
changes side)."""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsim import Config
from fastsim.engine import kernels
from fastsim.engine.kernels import _bare
from fastsim.engine.traffic import Traffic, generate
from fastsim.model import cost

from ..oracles import serving as oracle_serving
from ..strategies import close, dirty_scratch, oracle_engine


@settings(max_examples=300)
@given(st.integers(1, 300), st.integers(0, 2), st.data())
def test_next_filled_is_the_first_member_round_the_ring(ring, rep, data):
    """On replica ``rep``'s ring of a pool whose replicas' rings are 64-bucket aligned, the
    others' members in the way."""
    stride = (ring + 63) & ~63
    base = rep * stride
    filled = data.draw(st.sets(st.integers(0, ring - 1), max_size=6))
    stale = data.draw(st.sets(st.integers(0, ring - 1), max_size=6))
    others = data.draw(st.sets(st.integers(0, 3 * stride - 1).filter(lambda b: not base <= b < base + stride),
                               max_size=6))
    start = data.draw(st.integers(0, ring - 1))
    bucket = np.full(3 * stride + 1, -1, np.int64)
    occ = _bare.occupancy(3 * stride)
    for b in filled | stale:
        _bare.mark(occ, base + b)
    for b in others:
        _bare.mark(occ, b)
        bucket[b] = 5
    for b in filled:
        bucket[base + b] = 7
    want = next((d for d in range(ring) if bucket[base + (start + d) % ring] >= 0), ring)
    assert _bare.next_filled(occ, bucket, base, start, ring) == want
    assert _bare.next_filled(occ, bucket, base, start, ring) == want  # stale bits cleared, nothing else
    assert all(occ[b >> 6] >> (b & 63) & 1 for b in {base + b for b in filled} | others)


@settings(max_examples=300)
@given(st.integers(1, 40), st.data())
def test_blocks_in_closed_form_are_the_steps_one_by_one(bt, data):
    bcount = np.array(data.draw(st.lists(st.integers(0, 3), min_size=bt, max_size=bt)), np.int64)
    bcount[data.draw(st.integers(0, bt - 1))] += 1  # D > 0
    d = int(bcount.sum())
    phase = data.draw(st.integers(0, bt - 1))
    free = data.draw(st.integers(0, 4 * d))
    # step by step: a step takes bcount[phase] blocks, the phase advancing; fits: steps before
    # one whose blocks do not fit
    sums, fits, p = [(0, 0)], None, phase
    for step in range(6 * bt):
        taken = sums[-1][0] + bcount[p]
        if fits is None and taken > free:
            fits = step
        sums.append((taken, sums[-1][1] + taken))
        p = (p + 1) % bt
    rows = np.stack([bcount + 1, bcount])  # replica 1's counters, replica 0's in the way
    assert _bare.blocks_last(rows, 1, phase, bt, d, free) == fits
    for m in range(6 * bt + 1):
        assert _bare.blocks_taken(rows, 1, phase, bt, d, m) == sums[m]


@settings(max_examples=300)
@given(st.data())
def test_timed_runs_are_the_steps_one_by_one(data):
    k = np.array([data.draw(st.sampled_from([0.0, 1e-3])), data.draw(st.floats(1e-4, 1e-2)),
                  data.draw(st.floats(1e-9, 1e-6)), data.draw(st.sampled_from([0.0, 1e-5, 1e-3])),
                  data.draw(st.sampled_from([0.0, 1e-9, 1e-6])), data.draw(st.sampled_from([0.0, 1e-5])),
                  data.draw(st.sampled_from([0.0, 1e-7])), data.draw(st.sampled_from([0.0, 1e-5])),
                  data.draw(st.sampled_from([0.0, 1e-3])), data.draw(st.sampled_from([0.0, 0.5, 0.95]))])
    d = data.draw(st.integers(1, 64))
    kv0 = data.draw(st.integers(d, 200_000))
    now = data.draw(st.floats(0, 1e5))
    m = data.draw(st.integers(0, 3000))
    until = now + data.draw(st.just(math.inf) | st.floats(1e-9, 60))
    def step(j):  # a bare step: C = A, every row samples
        return cost.step_time.py_func(k, d, kv0 + j * d, kv0 + j * d, d)

    steps, times = 0, [now]
    while steps < m and times[-1] < until:
        times.append(times[-1] + step(steps))
        steps += 1
    got, after = _bare.timed(k, d, kv0, now, until, 0, m)
    if got != steps:  # only in a tie: the step between them starts at ``until`` to the last digits (the closed
        # form sums the steps in another order)
        assert abs(got - steps) == 1 and math.isclose(times[min(got, steps)], until, rel_tol=1e-12)
        times.append(times[-1] + step(steps))
    assert math.isclose(after, times[got], rel_tol=1e-12)
    short, same = _bare.timed(k, d, kv0, now, until, m + 1, m)
    assert (short, same) == (-1, now)  # fewer than ``shortest`` steps: the kernel steps on


LONG_RUNS = {"hardware.preset": "h100-sxm", "model.preset": "llama-3.1-8b", "engine.max_batched_tokens": 2048,
             "workload.prompt.value": 200, "workload.output.dist": "lognormal", "workload.output.mu": 5.0,
             "workload.output.sigma": 0.8, "workload.output.max": 400, "calibration.step_overhead_ms": 1.0}


@st.composite
def long_run_configs(draw) -> Config:
    v = {**LONG_RUNS,
         "engine.max_batch": draw(st.integers(1, 6)),
         "engine.block_tokens": draw(st.sampled_from([1, 4, 16])),
         "engine.kv_alloc": draw(st.sampled_from(["paged", "paged", "reserve"])),
         "workload.n_requests": draw(st.integers(1, 25)),
         "workload.rate": draw(st.sampled_from([0.2, 1.0, 5.0, 20.0])),
         "workload.seed": draw(st.integers(0, 2**32)),
         "workload.rng": "numpy",
         "workload.prefix_tokens": draw(st.sampled_from([0, 64])),
         "calibration.compute_efficiency": draw(st.sampled_from([1.0, 0.01])),  # 0.01: compute-bound
         "engine.async_scheduling": draw(st.booleans())}
    if draw(st.booleans()):  # from just enough for the longest request to a few of them
        tokens = draw(st.integers(600, 2400))
        v["engine.kv_cache_gb"] = math.ceil(tokens / v["engine.block_tokens"]) * v["engine.block_tokens"] * \
            131072 / 1e9 * (1 + 1e-12)
    return Config().with_values(v)


def against_the_oracle(config, traffic=None):
    traffic = generate(config.workload) if traffic is None else traffic
    fast = kernels.run(config, traffic, scratch=dirty_scratch())
    slow = oracle_serving.simulate(traffic.arrival_s.tolist(), traffic.prompt_tokens.tolist(),
                                   traffic.output_tokens.tolist(), oracle_engine(config))
    assert close(fast.first_token_s, slow["first_token"]) and close(fast.done_s, slow["done"])
    assert (fast.steps, fast.busy_slot_steps, fast.max_queue, fast.preemptions) == (
        slow["steps"], slow["busy"], slow["max_queue"], slow["preemptions"])
    if slow["kv_used"] is not None:
        assert fast.kv_block_steps == sum(slow["kv_used"])
    return fast


@settings(max_examples=120, deadline=None)
@given(long_run_configs())
def test_long_bare_runs_match_the_oracle(config):
    against_the_oracle(config)


def test_a_cache_that_runs_out_in_the_middle_of_a_long_run():
    """Two long requests whose blocks outgrow the cache while both only decode: the run stops at
    the step whose blocks do not fit, and the newest is preempted there, as step by step."""
    config = Config().with_values({**LONG_RUNS, "workload.output.dist": "fixed", "workload.output.value": 400,
                                   "engine.block_tokens": 16, "workload.n_requests": 2, "workload.rate": 100.0,
                                   "engine.kv_cache_gb": 66 * 16 * 131072 / 1e9 * (1 + 1e-12)})
    assert against_the_oracle(config).preemptions >= 1


def test_a_roofline_that_changes_side_in_the_middle_of_a_run():
    """One long decode whose steps start compute-bound (tiny weights, a slow GPU) and turn
    memory-bound as its context grows: the run's time is two arithmetic series."""
    config = Config().with_values({"hardware.peak_tflops": 1.0, "model.params_b": 0.0012, "model.n_layers": 1,
                                   "model.attn_dim": 1, "model.hidden": 1, "model.weight_gb": 0.001,
                                   "model.kv_bytes_per_token": 1000, "engine.max_batched_tokens": 8192,
                                   "workload.prompt.value": 6000, "workload.output.dist": "fixed",
                                   "workload.output.value": 2000, "workload.n_requests": 1})
    k = cost.coefficients(config)
    first, last = 6001, 7999  # KV tokens the first and the last decode step read
    assert k[3] + k[4] * first > k[1] + k[2] * first and k[3] + k[4] * last < k[1] + k[2] * last
    traffic = Traffic(np.zeros(1), np.array([6000], np.int64), np.array([2000], np.int64))
    against_the_oracle(config, traffic)
