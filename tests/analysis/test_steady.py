"""Warm-ups and the steady-state check (docs/outputs.md, "Steady state"; docs/traffic.md,
"Warm-up"): what is measured, and when a run says that what it measured still drifts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from typer.testing import CliRunner

from fastsim import Config, simulate
from fastsim.analysis import metrics, steady
from fastsim.analysis.simulation import drift
from fastsim.bench import SERVING
from fastsim.cli import app
from fastsim.engine import traffic as traffic_of

H100 = {**SERVING, "workload.n_requests": 3000}
SESSIONS = {"workload.system_prompts": {"count": 4, "tokens": 500},
            "workload.sessions": {"turns": {"dist": "uniform", "min": 2, "max": 6}}}


def stats_of(first_ttft: float, second_ttft: float, n: int = 1000) -> tuple[np.ndarray, int]:
    arrival = np.arange(n, dtype=float)
    ttft = np.where(np.arange(n) < n // 2, first_ttft, second_ttft) * np.random.default_rng(1).uniform(0.9, 1.1, n)
    none = metrics.NO_CACHE
    return metrics.halves(arrival, arrival + ttft, none, none, arrival, arrival + ttft, np.inf)


def test_a_light_load_is_steady_a_growing_queue_is_not_and_a_short_run_cannot_tell():
    light = simulate(Config().with_values({**H100, "workload.rate": 8.0}))
    assert light.metrics["steady"] == 1 and drift(light) is None
    over = simulate(Config().with_values({**H100, "workload.rate": 80.0}))
    assert over.metrics["steady"] == 0 and "TTFT p50" in drift(over) and "falls behind" in drift(over)
    short = simulate(Config().with_values({**H100, "workload.rate": 80.0, "workload.n_requests": steady.SMALLEST - 1}))
    assert math.isnan(short.metrics["steady"]) and drift(short) is None


@pytest.mark.parametrize("second, verdict", [(1.0, 1.0), (1.15, 1.0), (1.3, 0.0), (0.7, 0.0)])
def test_the_halves_ttft_must_move_by_a_fifth(second, verdict):
    stats, n = stats_of(1.0, second)
    assert steady.judge(stats, n, False) == verdict


def test_a_millisecond_is_no_drift():
    stats, n = stats_of(1e-4, 5e-4)  # five times as long, but under a millisecond apart
    assert steady.judge(stats, n, False) == 1.0


def test_hit_rates_drift_only_beyond_five_points_and_the_tenths_spread():
    stats = np.zeros((2, steady.COLUMNS))
    stats[:, 1], stats[:, 4] = 1.0, 1.0  # TTFT quantiles equal
    stats[:, steady.BACKLOG] = (0, 1000)
    stats[0, steady.HITS:steady.HITS + 3] = (0.70, 0.70, 1e-4)  # hit rate, tenths' mean and variance
    stats[1, steady.HITS:steady.HITS + 3] = (0.78, 0.78, 1e-4)
    assert steady.judge(stats, 1000, True) == 0.0  # 8 points, the tenths 0.01 apart: drift
    stats[1, steady.HITS + 2] = stats[0, steady.HITS + 2] = 0.01  # tenths 0.1 apart: a swing
    assert steady.judge(stats, 1000, True) == 1.0
    stats[1, steady.HITS:steady.HITS + 3] = (0.74, 0.74, 1e-6)  # 4 points: under the bound
    stats[0, steady.HITS + 2] = 1e-6
    assert steady.judge(stats, 1000, True) == 1.0
    assert steady.judge(stats, 1000, False) == 1.0  # (no cache: hits are not read)


def test_a_backlog_that_grows_is_not_steady_though_each_wait_hardly_moves():
    """Under sessions' closed loop a fleet can fall behind while each turn's wait, cut short by
    the turn before it, barely moves: the backlog's growth over the second half tells it."""
    stats, n = stats_of(1.0, 1.0)
    assert steady.judge(stats, n, False) == 1.0
    stats[0, steady.BACKLOG], stats[1, steady.BACKLOG] = 60, 5000  # 60 more, 1.2 % of the arrivals
    assert steady.judge(stats, n, False) == 1.0
    stats[0, steady.BACKLOG] = 120  # 2.4 %
    assert steady.judge(stats, n, False) == 0.0 and "falls behind" in steady.describe(stats, n, False)
    stats[0, steady.BACKLOG], stats[1, steady.BACKLOG] = 40, 1000  # 4 %, but 40 requests
    assert steady.judge(stats, n, False) == 1.0


def test_the_turns_that_come_as_a_fleet_drains_are_left_out_of_the_check():
    """After the last session starts, its turns meet an emptying fleet: checked with them, a
    fleet falling behind looks as if it caught up."""
    config = Config().with_values({**H100, **SESSIONS, "engine.prefix_caching": False, "workload.rate": 4.0,
                                   "workload.n_requests": 6000, "workload.warmup": "60 s"})
    r = simulate(config)
    m = slice(r.warmup, None)
    assert r.arrival_s[m].max() > r.arrival_end  # turns arrive after the last session started
    everything = metrics.halves(r.arrival_s[m], r.first_token_s[m], metrics.NO_CACHE, metrics.NO_CACHE, r.arrival_s,
                                r.done_s, np.inf)[1]
    checked = metrics.halves(r.arrival_s[m], r.first_token_s[m], metrics.NO_CACHE, metrics.NO_CACHE, r.arrival_s,
                             r.done_s, r.arrival_end)[1]
    assert checked < everything == 6000 and r.metrics["steady"] == 0


@pytest.mark.parametrize("extra", [{}, SESSIONS, {"fleet.replicas": 2, "fleet.router": "least_kv"}],
                         ids=["open loop", "sessions", "fleet"])
@pytest.mark.parametrize("warmup", [500, "20 s"])
def test_a_warmup_runs_first_and_only_the_rest_is_measured(extra, warmup):
    config = Config().with_values({**H100, **extra, "workload.rate": 6.0, "workload.n_requests": 1500,
                                   "workload.warmup": warmup})
    t = traffic_of.of(config)
    plain = traffic_of.of(config.with_values({"workload.warmup": 0, "workload.n_requests": len(t)}))
    assert np.array_equal(np.nan_to_num(t.arrival_s), np.nan_to_num(plain.arrival_s))  # the same draws, longer
    assert np.array_equal(t.output_tokens, plain.output_tokens) and len(t) - t.warmup == 1500
    if isinstance(warmup, str) and not extra:
        assert t.arrival_s[t.warmup - 1] < 20 <= t.arrival_s[t.warmup]
    r = simulate(config)
    whole = simulate(config.with_values({"workload.warmup": 0, "workload.n_requests": len(t)}))
    assert np.array_equal(r.done_s, whole.done_s)  # the warm-up runs as the first requests of one run
    m = slice(t.warmup, None)
    ttft = np.sort(r.first_token_s[m] - r.arrival_s[m])
    assert r.metrics["ttft_p50_s"] == ttft[int(0.5 * ttft.size)]  # only the measured requests
    assert math.isclose(r.metrics["span_s"], r.done_s[m].max() - r.arrival_s[m].min())
    tokens = r.output_tokens[m].sum()
    assert math.isclose(r.metrics["throughput_tok_s"], tokens / r.metrics["span_s"])


def test_run_says_what_drifts_and_a_sweep_counts_its_drifting_points(root, tmp_path):
    ran = CliRunner().invoke(app, ["run", str(root / "configs/h100.yaml"), "--set", "workload.rate=80",
                                   "--set", "workload.n_requests=2000"])
    assert ran.exit_code == 0 and "notice: not steady: TTFT p50" in ran.stderr
    swept = CliRunner().invoke(app, ["sweep", str(root / "configs/h100.yaml"), "--quiet", "--out", tmp_path / "s.nc",
                                     "--set", "sweep={workload.rate: [8, 80]}", "--set", "workload.n_requests=2000"])
    assert swept.exit_code == 0 and "notice: not steady: 1 of 2 points" in swept.stderr
