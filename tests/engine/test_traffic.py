"""Traffic: the stdlib stream reproduces the lesson's draws; numpy draws share common numbers."""

import math
import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastsim import Config, ConfigError
from fastsim.engine import checks
from fastsim.engine.traffic import generate


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
                              "workload.output.mu": 3.5, "workload.output.min": 3, "workload.output.max": 50}).workload
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


@pytest.mark.parametrize("arrival,burstiness,cv", [("poisson", 1.0, 1.0), ("gamma", 0.25, 2.0), ("gamma", 4.0, 0.5),
                                                   ("constant", 1.0, 0.0)])
def test_arrival_processes_have_the_right_rate_and_variability(arrival, burstiness, cv):
    w = Config().with_values({"workload.arrival": arrival, "workload.burstiness": burstiness,
                              "workload.n_requests": 400_000, "workload.rate": 25}).workload
    tr = generate(w)
    gaps = np.diff(tr.arrival_s, prepend=0.0)
    assert len(tr) / tr.arrival_s[-1] == pytest.approx(25, rel=0.01)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, abs=0.02)
    if arrival == "constant":
        assert tr.arrival_s[0] == 1 / 25 and np.allclose(gaps, 1 / 25)


@pytest.mark.parametrize("which", ["prompt", "output"])
def test_length_distributions_have_the_right_moments_and_bounds(which):
    n = 200_000
    base = Config().with_values({"workload.n_requests": n})
    uni = generate(base.with_values({f"workload.{which}.dist": "uniform", f"workload.{which}.min": 10,
                                     f"workload.{which}.max": 30}).workload)
    x = getattr(uni, f"{which}_tokens")
    assert x.min() == 10 and x.max() == 30 and x.mean() == pytest.approx(20, abs=0.1)
    assert np.bincount(x)[10:31].min() > n / 21 * 0.9  # every value, about equally often
    logn = generate(base.with_values({f"workload.{which}.dist": "lognormal", f"workload.{which}.mu": 6.0,
                                      f"workload.{which}.sigma": 0.5, f"workload.{which}.min": 50,
                                      f"workload.{which}.max": 4000}).workload)
    y = getattr(logn, f"{which}_tokens")
    assert y.min() >= 50 and y.max() <= 4000
    assert np.median(y) == pytest.approx(math.exp(6.0), rel=0.02)
    fixed = generate(base.with_values({f"workload.{which}.dist": "fixed", f"workload.{which}.value": 77}).workload)
    assert (getattr(fixed, f"{which}_tokens") == 77).all()


def test_distributions_do_not_move_each_other():
    base = Config().with_values({"workload.n_requests": 1000})
    a = generate(base.workload)
    b = generate(base.with_values({"workload.prompt.dist": "lognormal", "workload.output.dist": "uniform"}).workload)
    c = generate(base.with_values({"workload.arrival": "gamma", "workload.burstiness": 0.3}).workload)
    assert (a.arrival_s == b.arrival_s).all() and (a.output_tokens == c.output_tokens).all()
    assert (a.prompt_tokens == c.prompt_tokens).all()


def test_stdlib_stream_is_only_the_lessons():
    for key, value in (("workload.arrival", "gamma"), ("workload.prompt.dist", "uniform"),
                       ("workload.output.dist", "uniform")):
        with pytest.raises(ConfigError, match=f"{key}: .* needs workload.rng: numpy"):
            checks.check(Config().with_values({"workload.rng": "stdlib", key: value}))


def test_burstier_arrivals_raise_ttft_p99():
    from fastsim import simulate

    base = {"workload.n_requests": 20_000, "workload.rate": 30, "workload.arrival": "gamma"}
    smooth = simulate(Config().with_values({**base, "workload.burstiness": 4.0})).metrics
    poisson = simulate(Config().with_values({**base, "workload.burstiness": 1.0})).metrics
    bursty = simulate(Config().with_values({**base, "workload.burstiness": 0.2})).metrics
    assert smooth["ttft_p99_s"] < poisson["ttft_p99_s"] < bursty["ttft_p99_s"]


def test_range_ratio_draws_uniform_lengths_as_benchmark_clients_do():
    """value 1024, range_ratio 0.8: the integers ceil(819.2) = 820 .. 1024, each about as often."""
    w = Config().with_values({"workload.prompt.value": 1024, "workload.prompt.range_ratio": 0.8,
                              "workload.n_requests": 200_000}).workload
    assert (w.prompt.dist, w.prompt.min, w.prompt.max) == ("uniform", 820, 1024)
    prompt = generate(w).prompt_tokens
    assert prompt.min() == 820 and prompt.max() == 1024 and abs(prompt.mean() - 922) < 1
    over = Config().with_values({"workload.prompt": {"dist": "fixed", "value": 512, "min": 1}}).with_values(
        {"workload.prompt.range_ratio": 0.5})  # a ratio set over a config's lengths replaces dist, min and max
    assert (over.workload.prompt.dist, over.workload.prompt.min, over.workload.prompt.max) == ("uniform", 256, 512)


def test_closed_loop_clients_are_an_open_loop_s_requests_sent_as_requests_complete():
    """The same lengths (and system prompts) as the open loop of the seed; the first C given at
    0 (or spread over the ramp), the rest set by the run; think times from their own stream."""
    values = {"workload.n_requests": 100, "workload.system_prompts": {"count": 3, "tokens": 20}}
    open_loop = generate(Config().with_values(values).workload)
    closed = Config().with_values({**values, "workload.concurrency": 8, "workload.rate": None, "workload.ramp_s": 4.0,
                                   "workload.think_s": {"dist": "fixed", "value": 0.5}})
    t = generate(closed.workload)
    assert (t.prompt_tokens == open_loop.prompt_tokens).all() and (t.output_tokens == open_loop.output_tokens).all()
    assert (t.content.system_prompt == open_loop.content.system_prompt).all() and t.content.clients == 8
    assert t.arrival_s[:8].tolist() == [k * 0.5 for k in range(8)] and np.isnan(t.arrival_s[8:]).all()
    assert np.isnan(t.content.think_s[:8]).all() and (t.content.think_s[8:] == 0.5).all()
