"""Attention data parallelism: replicas of lock-step ranks in the serving loop against the
lock-step oracle, and what a planner relies on."""

import math

import numpy as np
import pytest
from hypothesis import given, settings

from fastsim import Config
from fastsim.analysis.simulation import measure
from fastsim.engine import fleet
from fastsim.engine.traffic import generate, routes
from fastsim.model import cost

from ..oracles import dp as oracle_dp
from ..strategies import close, dirty_scratch, dp_configs, dp_oracle


def run_both(config):
    traffic = generate(config.workload)
    fast = fleet.run(config, traffic, scratch=dirty_scratch())
    engine, rank_cost = dp_oracle(config)
    f = config.fleet
    draws = routes(config.workload, len(traffic), f.replicas, 0).tolist()
    slow = oracle_dp.simulate(traffic.arrival_s.tolist(), traffic.prompt_tokens.tolist(),
                              traffic.output_tokens.tolist(), engine, rank_cost, config.engine.dp, f.replicas, f.router,
                              draws)
    return traffic, fast, slow


def quantile(values, p):
    xs = sorted(values)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else math.nan


@settings(max_examples=150, deadline=None)
@given(dp_configs())
def test_lockstep_ranks_match_the_oracle(config):
    traffic, fast, slow = run_both(config)
    f = config.fleet
    assert close(fast.first_token_s, slow["first_token"])
    assert close(fast.done_s, slow["done"])
    assert (fast.steps, fast.busy_slot_steps, fast.max_queue, fast.preemptions) == (
        slow["steps"], slow["busy"], slow["max_queue"], slow["preemptions"])
    if f.replicas > 1:
        assert fast.replica.tolist() == slow["replica"]
    if dp_oracle(config)[0].blocks is not None:
        assert fast.kv_block_steps == sum(slow["kv_used"])
    m = measure(config, traffic, fast)
    for p, name in ((0.5, "itl_p50_s"), (0.99, "itl_p99_s")):
        assert close(m[name], quantile(slow["gaps"], p)), name


MINIMAX = {"hardware.preset": "b200", "model.preset": "minimax-m2.5-nvfp4", "engine.expert_parallel": True,
           "engine.max_batch": 64, "workload.n_requests": 400, "workload.prompt.value": 1000,
           "workload.output.dist": "fixed", "workload.output.value": 200}


@pytest.mark.parametrize("dp, tp", [(2, 1), (4, 1), (2, 2)])
def test_a_deployed_model_matches_the_oracle_and_its_memory(dp, tp):
    """A real model on real GPUs: each rank's KV cache from what its GPUs keep after the dense
    weights and its share of the experts."""
    config = Config().with_values({**MINIMAX, "engine.dp": dp, "engine.tp": tp, "workload.rate": 30.0})
    traffic, fast, slow = run_both(config)
    assert close(fast.first_token_s, slow["first_token"]) and close(fast.done_s, slow["done"])
    assert cost.kv_blocks(config) == dp_oracle(config)[0].blocks


def test_one_rank_per_replica_is_the_replica_to_the_bit():
    """engine.dp 1 is no data parallelism: the coefficients the step loops read are unchanged."""
    config = Config().with_values({**MINIMAX, "engine.tp": 4, "workload.rate": 10.0})
    k = cost.coefficients(config)
    assert k[cost.RANKS] == 1 and k[cost.T_EXPERT_TOKEN] == 0


@pytest.mark.parametrize("model, more", [("kimi-k2.5-nvfp4", True), ("minimax-m2.5-nvfp4", False)])
def test_data_parallelism_holds_more_kv_where_tensor_parallelism_replicates_it(model, more):
    """Eight ranks of one GPU against tp 8: a latent (MLA) cache, whole on every tp GPU, is held
    once per rank: dp holds several times the tokens; grouped-query KV splits over tp GPUs, and
    every rank's copy of the dense weights leaves dp a little less. The fleet counts dp x tp GPUs."""
    values = {**MINIMAX, "model.preset": model}
    tp = Config().with_values({**values, "engine.tp": 8})
    dp = Config().with_values({**values, "engine.dp": 8})
    assert (8 * cost.kv_blocks(dp) > 5 * cost.kv_blocks(tp)) if more else (
        0.9 * cost.kv_blocks(tp) < 8 * cost.kv_blocks(dp) < cost.kv_blocks(tp))
    from fastsim.model import fleet as pools
    assert pools.gpus(dp) == pools.gpus(tp) == 8


def test_requests_go_to_the_least_loaded_rank():
    """Four requests at once on two idle ranks alternate (4 x waiting + running, ties the lower)."""
    config = Config().with_values({**MINIMAX, "engine.dp": 2, "workload.n_requests": 6, "workload.rate": 1e6})
    traffic, fast, slow = run_both(config)
    assert slow["rank"] == [0, 1, 0, 1, 0, 1]
    assert close(fast.done_s, slow["done"])


@pytest.mark.parametrize("values, key", [
    ({"engine.dp": 2, "engine.expert_parallel": False}, "engine.dp"),
    ({"engine.dp": 2, "model.preset": "llama-3.1-8b", "engine.expert_parallel": False}, "engine.dp"),
    ({"engine.dp": 0}, "engine.dp"),
    ({"engine.dp": 16}, "hardware.scaleout_gb_s"),
    ({"engine.dp": 3, "engine.tp": 4}, "hardware.scaleup_gpus"),
    ({"engine.dp": 2, "fleet.prefill_replicas": 1}, "fleet.prefill_replicas"),
    ({"engine.dp": 2, "engine.policy": "static"}, "engine.policy"),
])
def test_bad_data_parallel_layouts_are_refused(values, key):
    from fastsim.engine import checks
    from fastsim.model.fields import ConfigError
    with pytest.raises((ConfigError, ValueError)) as err:
        checks.check(Config().with_values({**MINIMAX, "hardware.scaleout_gb_s": None, **values}))
    assert key in str(err.value)


def test_closed_loop_clients_on_lockstep_ranks_keep_their_concurrency():
    """Benchmark clients on a data-parallel replica: every request done, the clients' concurrency
    held (a client's next request the moment its last is done)."""
    config = Config().with_values({**MINIMAX, "engine.dp": 4, "workload.concurrency": 32, "workload.rate": None,
                                   "workload.n_requests": 2000})
    from fastsim import simulate
    r = simulate(config)
    assert np.isfinite(r.done_s).all()
    assert 30 < r.metrics["concurrency_mean"] <= 32


def test_sessions_and_the_prefix_cache_on_lockstep_ranks():
    """Chat sessions over system prompts on two replicas of two ranks, each rank its own prefix
    cache: every turn done once, after it arrived, and the ranks' caches hit."""
    config = Config().with_values({**MINIMAX, "engine.dp": 2, "fleet.replicas": 2, "fleet.router": "least_outstanding",
                                   "engine.prefix_caching": True, "workload.rate": 2.0, "workload.n_requests": 600,
                                   "workload.system_prompts": {"count": 4, "tokens": 500},
                                   "workload.sessions": {"turns": {"dist": "uniform", "min": 2, "max": 6}}})
    from fastsim import simulate
    r = simulate(config)
    assert np.isfinite(r.done_s).all() and (r.arrival_s <= r.first_token_s).all()
    assert (r.first_token_s <= r.done_s).all() and set(r.replica.tolist()) == {0, 1}
    assert r.metrics["prefix_hit_rate"] > 0.2
