"""Fleets: replicas behind routers and prefill/decode disaggregation, against the fleet oracle
(written from the rules of docs/model/), one replica as the single engine, and what a planner relies on."""

import math

import numpy as np
import pytest
from hypothesis import assume, event, given, settings

from fastsim import Config, ConfigError, simulate
from fastsim.analysis.simulation import measure
from fastsim.engine import checks, fleet
from fastsim.engine import traffic as traffic_of
from fastsim.engine.traffic import generate, routes

from ..strategies import close, dirty_scratch, fleet_configs, fleet_oracle


def lesson_quantile(values, p):
    xs = sorted(values)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else math.nan


def same(a, b):
    return a == b or (math.isnan(a) and math.isnan(b))


def same_metrics(a, b):
    return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)


def runnable(config):
    try:
        checks.check(config)
    except ConfigError:
        return False
    return True


def run_both(config):
    traffic = generate(config.workload)
    f = config.fleet
    n = len(traffic)
    draws = routes(config.workload, n, f.replicas, 0) if f.router == "random" else None
    pre_draws = routes(config.workload, n, f.prefill_replicas, 1) if f.router == "random" and f.prefill_replicas else None
    return traffic, fleet.run(config, traffic, dirty_scratch()), fleet_oracle(config, traffic, draws, pre_draws)


@settings(max_examples=300)
@given(fleet_configs())
def test_fleets_match_the_fleet_oracle(config):
    assume(runnable(config))
    traffic, fast, slow = run_both(config)
    f = config.fleet
    event(f"{f.router}, {'disaggregated' if f.prefill_replicas else 'colocated'}, "
          f"{'preempts' if fast.preemptions else 'no preemption'}")
    assert close(fast.first_token_s, slow["first_token"])
    assert close(fast.done_s, slow["done"])
    assert (fast.steps, fast.busy_slot_steps, fast.max_queue, fast.preemptions) == (
        slow["steps"], slow["busy"], slow["max_queue"], slow["preemptions"])
    single = config.fleet.replicas == 1 and not config.fleet.prefill_replicas
    if not single:
        assert fast.replica.tolist() == [-1 if r is None else r for r in slow["replica"]]
    if config.fleet.prefill_replicas:
        assert fast.prefill_replica.tolist() == slow["prefill_replica"]
    used = [u for u in slow["kv_used_by_replica"] if u is not None]
    assert fast.kv_block_steps == sum(sum(u) for u in used)
    m = measure(config, traffic, fast)
    for p, name in ((0.5, "itl_p50_s"), (0.99, "itl_p99_s")):
        assert close(m[name], lesson_quantile(slow["gaps"], p)), name


def coupled_round_robin(config, traffic):
    """The pool kernel on a round-robin fleet (which fleet.run runs replica by replica)."""
    from fastsim.engine import fleet as fleet_driver
    from fastsim.engine.kernels import Plan

    p = Plan.of(config)
    n = len(traffic)
    out = fleet_driver._served_pool(p, "round_robin", config.fleet.replicas, traffic.arrival_s, traffic.prompt_tokens,
                                    traffic.output_tokens, np.empty(n, np.int64), None)
    return (out.first_token_s + p.api_s, out.done_s + p.api_s, out.replica,
            (out.steps, out.busy_slot_steps, out.max_queue, out.preemptions))


@settings(max_examples=100)
@given(fleet_configs())
def test_the_pool_kernel_on_a_static_router_is_its_replicas_apart(config):
    assume(config.engine.policy == "continuous" and not config.fleet.prefill_replicas and runnable(config))
    config = config.with_values({"fleet.router": "round_robin"})
    traffic = generate(config.workload)
    apart = fleet.run(config, traffic)
    first, done, replica, (steps, busy, queue, preemptions, *_) = coupled_round_robin(config, traffic)
    assert close(first, apart.first_token_s) and close(done, apart.done_s)  # the pool steps every bare step
    assert (steps, busy, queue, preemptions) == (apart.steps, apart.busy_slot_steps, apart.max_queue, apart.preemptions)
    if config.fleet.replicas > 1:
        assert replica.tolist() == apart.replica.tolist()


H100 = {"hardware.preset": "h100-sxm", "model.preset": "llama-3.1-8b", "engine.max_batch": 256,
        "engine.max_batched_tokens": 8192, "calibration.compute_efficiency": 0.85,
        "calibration.bandwidth_efficiency": 0.85, "calibration.step_overhead_ms": 1.5,
        "calibration.api_overhead_ms": 25}


def test_one_replica_is_the_single_engine_to_the_bit(root):
    from fastsim import load_config

    for path in ("configs/reference.yaml", "configs/h100.yaml"):
        base = load_config(root / path, {"workload.n_requests": 3000})
        one = simulate(base.with_values({"fleet.replicas": 1, "fleet.router": "least_kv", "fleet.prefill_tp": 2}))
        plain = simulate(base)
        assert same_metrics(one.metrics, plain.metrics)
        assert one.done_s.tolist() == plain.done_s.tolist() and one.replica is None


def test_the_pool_kernel_with_one_replica_is_the_single_engine():
    config = Config().with_values({**H100, "workload.rate": 30, "workload.n_requests": 3000})
    traffic = generate(config.workload)
    first, done, _, (steps, busy, queue, preemptions, *_) = coupled_round_robin(config, traffic)
    one = fleet.run(config, traffic)
    assert close(first, one.first_token_s) and close(done, one.done_s)
    assert (steps, busy, queue) == (one.steps, one.busy_slot_steps, one.max_queue)


def test_a_prefill_pool_of_zero_is_colocated():
    base = Config().with_values({**H100, "workload.rate": 60, "workload.n_requests": 2000, "fleet.replicas": 2})
    with_keys = base.with_values({"fleet.prefill_replicas": 0, "fleet.prefill_tp": 2, "fleet.prefill_hardware": "b200",
                                  "fleet.kv_link_gb_s": 1.0})
    assert same_metrics(simulate(with_keys).metrics, simulate(base).metrics)


# What a planner relies on
def test_least_outstanding_cuts_ttft_p99_near_saturation_on_a_real_trace(root):
    """4 H100s near saturation on Azure's conversation trace (64 sequences a replica): joining the
    replica with the fewest outstanding requests shortens the queues that round robin lets grow."""
    from fastsim import load_config

    base = {"fleet.replicas": 4, "workload.rate": 72, "engine.max_batch": 64, "engine.max_batched_tokens": 2048}
    rr, lo, kv = (simulate(load_config(root / "configs/azure-conv.yaml", {**base, "fleet.router": router})).metrics
                  for router in ("round_robin", "least_outstanding", "least_kv"))
    assert lo["ttft_p99_s"] < 0.9 * rr["ttft_p99_s"]
    assert lo["e2e_mean_s"] <= rr["e2e_mean_s"] * 1.02
    # as docs/model/fleets.md says: 0.31 s, 0.19 s, 0.74 s (a queued request holds no KV blocks: least_kv herds)
    assert [round(m["ttft_p99_s"], 2) for m in (rr, lo, kv)] == [0.31, 0.19, 0.74]


def test_both_load_aware_routers_cut_ttft_p99_when_the_kv_cache_binds(root):
    """4 H100s near saturation with 8 GB of KV cache each (what a larger model leaves): requests
    queue for blocks, the replicas whose caches are full are the ones with queues, and both
    least_outstanding and least_kv avoid them (round robin preempts and queues instead). With the
    prefix cache a preempted request finds its own blocks again: preemption costs little, and so
    does round robin."""
    from fastsim import load_config

    base = {"fleet.replicas": 4, "workload.rate": 52, "engine.max_batch": 256, "engine.max_batched_tokens": 2048,
            "engine.kv_cache_gb": 8}
    got = {(cache, router): simulate(load_config(root / "configs/azure-conv.yaml", {
        **base, "fleet.router": router, "engine.prefix_caching": cache})).metrics
        for cache in (False, True) for router in ("round_robin", "least_outstanding", "least_kv")}
    rr, lo, kv = (got[False, router] for router in ("round_robin", "least_outstanding", "least_kv"))
    for m in (lo, kv):
        assert m["ttft_p99_s"] < 0.9 * rr["ttft_p99_s"]
        assert m["e2e_mean_s"] <= rr["e2e_mean_s"] * 1.02
        assert m["preemptions"] < rr["preemptions"]
    # as docs/model/fleets.md says: 0.46 s, 0.15 s, 0.24 s; cached, 0.15 s, 0.15 s, 0.23 s
    assert [round(m["ttft_p99_s"], 2) for m in (rr, lo, kv)] == [0.46, 0.15, 0.24]
    assert [(round(got[True, r]["ttft_p99_s"], 2), got[True, r]["preemptions"])
            for r in ("round_robin", "least_outstanding", "least_kv")] == [(0.15, 46), (0.15, 8), (0.23, 9)]


LONG_PROMPTS = {**H100, "workload.prompt.value": 8000, "workload.output.dist": "fixed", "workload.output.value": 200,
                "workload.n_requests": 3000, "workload.rate": 4}


def test_disaggregation_keeps_decoding_free_of_long_prefills():
    colocated = simulate(Config().with_values({**LONG_PROMPTS, "fleet.replicas": 2})).metrics
    split = simulate(Config().with_values({**LONG_PROMPTS, "fleet.prefill_replicas": 1})).metrics
    assert split["itl_p99_s"] < 0.7 * colocated["itl_p99_s"]
    assert split["gpus"] == colocated["gpus"] == 2 and split["usd_per_hour"] == colocated["usd_per_hour"]


def test_a_slower_kv_link_leaves_ttft_alone_and_raises_e2e():
    fast = simulate(Config().with_values({**LONG_PROMPTS, "fleet.prefill_replicas": 1}))
    slow = simulate(Config().with_values({**LONG_PROMPTS, "fleet.prefill_replicas": 1, "fleet.kv_link_gb_s": 5}))
    assert slow.first_token_s.tolist() == fast.first_token_s.tolist()
    assert slow.metrics["e2e_mean_s"] > fast.metrics["e2e_mean_s"] + 0.2  # 8000 tokens x 128 KiB at 5 GB/s: 0.21 s
    latency = simulate(Config().with_values({**LONG_PROMPTS, "fleet.prefill_replicas": 1,
                                             "fleet.kv_link_latency_ms": 100}))
    assert latency.first_token_s.tolist() == fast.first_token_s.tolist()
    assert latency.metrics["e2e_mean_s"] >= fast.metrics["e2e_mean_s"] + 0.1 - 1e-9


def test_every_request_is_served_once_by_a_replica_of_the_right_pool():
    r = simulate(Config().with_values({**H100, "workload.rate": 80, "workload.n_requests": 4000, "fleet.replicas": 3,
                                       "fleet.prefill_replicas": 2, "fleet.router": "least_outstanding"}))
    one_token = r.output_tokens == 1
    assert set(r.replica[~one_token]) == {0, 1, 2} and (r.replica[one_token] == -1).all()
    assert set(r.prefill_replica) == {0, 1}
    assert (r.arrival_s <= r.first_token_s).all() and (r.first_token_s <= r.done_s).all()
    assert (r.done_s[~one_token] > r.first_token_s[~one_token]).all()


def test_random_routing_is_uniform_and_leaves_the_traffic_alone():
    base = Config().with_values({**H100, "workload.rate": 80, "workload.n_requests": 8000, "fleet.replicas": 4})
    rr = simulate(base)
    rnd = simulate(base.with_values({"fleet.router": "random"}))
    assert rnd.arrival_s.tolist() == rr.arrival_s.tolist() and rnd.output_tokens.tolist() == rr.output_tokens.tolist()
    counts = np.bincount(rnd.replica, minlength=4)
    assert (np.abs(counts - 2000) < 4 * np.sqrt(2000)).all() and not (counts == 2000).all()
    assert (rr.replica == np.arange(8000) % 4).all()


def test_fleet_cost_follows_gpus_and_prices():
    from fastsim.model.presets import HARDWARE

    m = simulate(Config().with_values({**H100, "workload.n_requests": 500, "fleet.replicas": 3, "engine.tp": 2,
                                       "fleet.prefill_replicas": 2, "fleet.prefill_hardware": "b200",
                                       "fleet.prefill_tp": 1})).metrics
    price = HARDWARE["h100-sxm"]["usd_per_gpu_hour"] * 6 + HARDWARE["b200"]["usd_per_gpu_hour"] * 2
    assert m["gpus"] == 8 and m["usd_per_hour"] == pytest.approx(price)
    assert m["usd_per_mtok"] == pytest.approx(price / (3600e-6 * m["throughput_tok_s"]))
    override = simulate(Config().with_values({**H100, "workload.n_requests": 500, "hardware.usd_per_gpu_hour": 1.0,
                                              "fleet.replicas": 2})).metrics
    assert override["usd_per_hour"] == 2.0
    lesson = simulate(Config().with_values({"workload.n_requests": 300})).metrics  # no hardware preset: no price
    assert lesson["gpus"] == 1 and math.isnan(lesson["usd_per_hour"]) and math.isnan(lesson["usd_per_mtok"])


BAD_FLEETS = [
    (["fleet.replicas=0"], "fleet.replicas: Input should be greater than or equal to 1"),
    (["fleet.replicas=-2"], "fleet.replicas: Input should be greater than or equal to 1"),
    (["fleet.replicas=1.5"], "fleet.replicas: Input should be a valid integer"),
    (["fleet.replicas=true"], "fleet.replicas: Input should be a valid integer"),
    (["fleet.replicaz=2"], "fleet.replicaz: unknown key (valid here: fleet.replicas, fleet.router"),
    (["fleet.router=fastest"], "fleet.router: must be one of round_robin, random, least_outstanding, least_kv, "
                               "prefix_aware (got 'fastest')"),
    (["fleet.prefill_replicas=-1"], "fleet.prefill_replicas: must be a whole number of replicas from 0 to 1,000,000, or auto"),
    (["fleet.prefill_tp=0"], "fleet.prefill_tp: Input should be greater than or equal to 1"),
    (["fleet.prefill_hardware=h1000"], "fleet.prefill_hardware: unknown hardware preset 'h1000' (valid: h100-sxm"),
    (["fleet.prefill_max_batched_tokens=0"], "fleet.prefill_max_batched_tokens: Input should be greater than or equal"),
    (["fleet.kv_link_gb_s=0"], "fleet.kv_link_gb_s: Input should be greater than 0"),
    (["fleet.kv_link_gb_s=.inf"], "fleet.kv_link_gb_s: Input should be a finite number"),
    (["fleet.kv_link_latency_ms=-1"], "fleet.kv_link_latency_ms: Input should be greater than or equal to 0"),
    (["hardware.usd_per_gpu_hour=-3"], "hardware.usd_per_gpu_hour: Input should be greater than or equal to 0"),
    (["fleet=4"], "fleet: Input should be a valid dictionary"),
    (["fleet.router=least_outstanding", "engine.policy=static", "engine.prefix_caching=false"],
     "fleet.router: least_outstanding needs engine.policy continuous (got static"),
    (["fleet.router=least_kv", "engine.policy=dynamic", "engine.prefix_caching=false"],
     "fleet.router: least_kv needs engine.policy continuous"),
    (["fleet.prefill_replicas=1", "engine.policy=dynamic", "engine.prefix_caching=false"],
     "fleet.prefill_replicas (1) needs engine.policy continuous (got dynamic)"),
    (["fleet.prefill_replicas=1", "fleet.prefill_tp=3"],
     "fleet.prefill_tp (3) must divide the 8 KV heads of model.preset llama-3.1-8b"),
    (["fleet.prefill_replicas=1", "fleet.prefill_max_batched_tokens=32"],
     "the prefill replicas: fleet.prefill_max_batched_tokens (32) must be at least the running limit"),
    (["fleet.prefill_replicas=1", "fleet.prefill_hardware=l40s", "model.preset=llama-3.1-70b", "engine.tp=4",
      "fleet.prefill_tp=2"], "the prefill replicas: model.weight_gb (141.107) does not fit: fleet.prefill_tp (2) x "
                             "(fleet.prefill_hardware l40s's mem_gb (48)"),
    (["sweep.fleet.router=[round_robin, nearest]"], "sweep axis 'fleet.router', value 'nearest': fleet.router: must be "
                                                    "one of round_robin"),
]


@pytest.mark.parametrize("sets,message", BAD_FLEETS, ids=[m[:50] for _, m in BAD_FLEETS])
def test_bad_fleets_exit_2_naming_the_key(root, tmp_path, sets, message):
    from typer.testing import CliRunner

    from fastsim.cli import app

    args = [a for s in sets for a in ("--set", s)]
    command = ["sweep", "--out", str(tmp_path / "x.nc"), "--quiet"] if any(s.startswith("sweep.") for s in sets) else ["run"]
    result = CliRunner().invoke(app, [command[0], str(root / "configs/h100.yaml"), *command[1:], *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_fleet_sweep_has_its_dims_and_consistent_gpus_and_cost(root, tmp_path):
    import xarray as xr

    import fastsim
    from fastsim.model.presets import HARDWARE

    path = tmp_path / "fleet.yaml"
    path.write_text(f"extends: {root / 'configs/h100.yaml'}\nworkload:\n  n_requests: 1500\n  rate: 40\n"
                    "sweep:\n  fleet.replicas: [1, 2, 3]\n  fleet.router: [round_robin, least_outstanding]\n"
                    "  fleet.prefill_replicas: [0, 1]\n")
    ds = fastsim.sweep(fastsim.load_config(path), workers=1)
    assert list(ds.throughput_tok_s.dims) == ["replicas", "router", "prefill_replicas"]
    assert ds.replicas.values.tolist() == [1, 2, 3] and ds.router.values.tolist() == ["round_robin", "least_outstanding"]
    gpus = ds.replicas + ds.prefill_replicas
    assert (ds.gpus == gpus).all() and ds.gpus.dtype.kind == "i"
    assert (abs(ds.usd_per_hour - gpus * HARDWARE["h100-sxm"]["usd_per_gpu_hour"]) < 1e-9).all()
    assert (abs(ds.usd_per_mtok / (ds.usd_per_hour / (3600e-6 * ds.throughput_tok_s)) - 1) < 1e-12).all()
    assert ds.usd_per_hour.attrs["units"] == "USD/hour" and ds.replicas.attrs["units"] == "replicas"
    one = simulate(fastsim.load_config(path, {"fleet.replicas": 2, "fleet.router": "least_outstanding",
                                              "fleet.prefill_replicas": 1}))
    assert one.metrics["ttft_p99_s"] == float(ds.ttft_p99_s.sel(replicas=2, router="least_outstanding",
                                                                 prefill_replicas=1))
    out = tmp_path / "fleet.nc"
    assert fastsim.api.sweep_to_file(fastsim.load_config(path), out, workers=2)
    with xr.open_dataset(out) as written:
        assert (written.gpus.values == ds.gpus.values).all()


def test_requests_out_names_the_replicas(root, tmp_path):
    import xarray as xr
    from typer.testing import CliRunner

    from fastsim.cli import app

    out = tmp_path / "requests.nc"
    result = CliRunner().invoke(app, ["run", str(root / "configs/h100.yaml"), "--set", "workload.n_requests=500",
                                      "--set", "fleet.replicas=2", "--set", "fleet.prefill_replicas=1",
                                      "--requests-out", str(out)])
    assert result.exit_code == 0, result.output
    with xr.open_dataset(out) as ds:
        assert set(ds.replica.values.tolist()) <= {-1, 0, 1} and set(ds.prefill_replica.values.tolist()) == {0}
        assert ds.replica.attrs["long_name"].startswith("the replica that served")
        assert float(ds.attrs["metric_gpus"]) == 3


@pytest.mark.parametrize("values", [
    {},
    {"fleet.replicas": 3, "fleet.router": "least_outstanding"},
    {"fleet.replicas": 2, "fleet.prefill_replicas": 1},
    {"workload.think_s": {"dist": "exponential", "mean": 0.3}, "workload.warmup": 64},
])
def test_closed_loop_clients_keep_c_in_flight_and_little_s_law(values):
    """configs/h100.yaml's engine (stalls on) under 32 clients: never more than 32 requests in
    flight as the clients see them, each client's next request sent as its last is done (plus
    think time), and Little's law: mean in flight = throughput x mean latency (exact without a
    warm-up: every request lies in the window; within 3 % after 64 warm-up requests)."""
    from fastsim import load_config

    from ..conftest import ROOT

    config = load_config(ROOT / "configs/h100.yaml", {"workload.concurrency": 32, "workload.rate": None,
                                                      "workload.n_requests": 3000, **values})
    r = simulate(config)
    arrival, done = r.arrival_s, r.done_s
    ones = np.ones(arrival.size)
    order = np.lexsort((np.r_[ones, -ones], np.r_[arrival, done]))
    in_flight = np.cumsum(np.r_[ones, -ones][order])
    assert in_flight.max() == 32
    think = 0.0 if "workload.think_s" not in values else None
    sends = np.sort(arrival)[32:]
    if think == 0.0:  # every send after the first 32 is a completion's instant
        assert np.isin(sends, done).all()
    m = r.metrics
    little = m["request_rate_rps"] * m["e2e_mean_s"]
    # (after a warm-up, the warm-up's last requests are in flight in the window's first moments)
    assert m["concurrency_mean"] == pytest.approx(little, rel=1e-9 if "workload.warmup" not in values else 0.03)
    assert m["concurrency_mean"] <= 32


@pytest.mark.parametrize("replicas", [1, 2])
def test_closed_loop_clients_over_sessions_run_a_session_each(replicas):
    """configs/chat-fleet.yaml's sessions (stalls on) sent by 12 closed-loop clients: a client runs
    one session's turns, each sent its session's think time after the turn before is done (as the
    client sees it), then takes the next session; never more than 12 requests in flight."""
    from fastsim import load_config

    from ..conftest import ROOT

    config = load_config(ROOT / "configs/chat-fleet.yaml", {
        "workload.concurrency": 12, "workload.rate": None, "workload.n_requests": 600, "workload.warmup": 0,
        "fleet.replicas": replicas, "calibration.stall_rate_hz": 5.0})
    r = simulate(config)
    arrival, done = r.arrival_s, r.done_s  # as the clients see them (the API overhead included)
    ones = np.ones(arrival.size)
    order = np.lexsort((np.r_[ones, -ones], np.r_[arrival, done]))
    assert np.cumsum(np.r_[ones, -ones][order]).max() == 12
    c = traffic_of.of(config).content
    later = np.flatnonzero(c.turn > 1)
    assert later.size > 100  # sessions of several turns
    assert np.allclose(arrival[later], done[later - 1] + c.think_s[later], rtol=0, atol=1e-9)
    assert r.metrics["prefix_hit_rate"] > 0.5  # a session's turns hit its conversation so far
