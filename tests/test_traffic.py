"""Traffic: the stdlib stream reproduces the lesson's draws; numpy draws share common numbers."""

import math
import random

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from fastsim import Config
from fastsim.traffic import generate


def lesson_stream(rate, n, seed=7, mu=4.5, sigma=1.0, lo=1, hi=2000):
    """The lesson's draws written out plainly: ms gaps, then a normal, per request."""
    rng, t, arrivals, lengths = random.Random(seed), 0.0, [], []
    for _ in range(n):
        t += rng.expovariate(rate) * 1000
        arrivals.append(t / 1000)
        lengths.append(min(max(int(math.exp(rng.gauss(mu, sigma))), lo), hi))
    return arrivals, lengths


def test_stdlib_stream_is_the_lessons():
    for rate in (8.0, 40.0):
        w = Config().with_values({"workload.rng": "stdlib", "workload.rate": rate}).workload
        tr = generate(w)
        arrivals, lengths = lesson_stream(rate, 3000)
        assert tr.arrival_s.tolist() == arrivals
        assert tr.output_tokens.tolist() == lengths
        assert (tr.prompt_tokens == 1000).all()
    # the lesson's own summary line: median 92, mean 148, max 2000
    out = np.sort(tr.output_tokens)
    assert (out[1500], round(out.mean()), out[-1]) == (92, 148, 2000)


@given(st.sampled_from(["stdlib", "numpy"]), st.integers(1, 200), st.integers(0, 10**6))
def test_shapes_and_bounds(rng, n, seed):
    w = Config().with_values({"workload.rng": rng, "workload.n_requests": n, "workload.seed": seed,
                              "workload.output.min": 3, "workload.output.max": 50}).workload
    tr = generate(w)
    assert len(tr) == n and (np.diff(tr.arrival_s) >= 0).all() and (tr.arrival_s > 0).all()
    assert tr.output_tokens.min() >= 3 and tr.output_tokens.max() <= 50


def test_numpy_common_random_numbers():
    base = Config().with_values({"workload.n_requests": 1000}).workload
    a = generate(base)
    b = generate(base.model_copy(update={"rate": base.rate * 2}))
    np.testing.assert_allclose(b.arrival_s, a.arrival_s / 2, rtol=1e-12)  # same gaps, scaled
    assert (a.output_tokens == b.output_tokens).all()
    fixed = generate(base.model_copy(update={"output": base.output.model_copy(update={"dist": "fixed"})}))
    assert (fixed.arrival_s == a.arrival_s).all() and (fixed.output_tokens == 148).all()
    longer = generate(base.model_copy(update={"n_requests": 2000}))
    assert (longer.arrival_s[:1000] == a.arrival_s).all()
    other = generate(base.model_copy(update={"seed": base.seed + 1}))
    assert not (other.arrival_s == a.arrival_s).all()


def test_numpy_poisson_rate_and_lognormal_median():
    w = Config().with_values({"workload.n_requests": 200_000, "workload.rate": 40}).workload
    tr = generate(w)
    assert abs(len(tr) / tr.arrival_s[-1] - 40) < 0.5
    assert abs(np.median(tr.output_tokens) - math.exp(4.5)) < 2
