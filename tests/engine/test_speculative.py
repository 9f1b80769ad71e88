"""Speculative decoding (docs/model/deployed.md, "Speculative decoding"): the oracles hold it on
random configs (tests/engine/test_serving.py, test_fleet.py, test_dp.py draw it); here what a
planner relies on: the drawn acceptance, what a verification costs, and that speculation off is
the model it was."""

import math

import numpy as np
import pytest

from fastsim import Config, simulate
from fastsim.engine import kernels
from fastsim.engine.kernels._speculative import draw_py, seed_of
from fastsim.engine.traffic import generate
from fastsim.model import cost

from ..oracles import serving as oracle_serving

H100 = {"hardware.preset": "h100-sxm", "model.preset": "llama-3.1-8b", "engine.max_batch": 64,
        "engine.max_batched_tokens": 8192}


def test_the_kernels_draw_what_the_docs_write():
    """The kernel's hash of (seed, request, tokens emitted, position), against the oracle's, written
    from the docs."""
    seed = seed_of(7)
    for i, g, j in [(0, 1, 0), (5, 17, 2), (123456, 999, 7), (2**40, 3, 1)]:
        assert draw_py(seed, i, g, j) == oracle_serving.draw(oracle_serving.spec_seed(7), i, g, j)


@pytest.mark.parametrize("k, a", [(1, 0.6), (3, 0.7), (2, 0.9), (4, 0.5)])
def test_mean_accepted_length_is_the_geometric_sum(k, a):
    """At acceptance a at every position, a verification emits (1 - a^(k+1)) / (1 - a) tokens on
    average: over 100,000 requests, within 1 %."""
    config = Config().with_values({**H100, "workload.n_requests": 100_000, "workload.rate": 200.0,
                                   "workload.prompt.value": 64, "workload.output": {"dist": "fixed", "value": 40},
                                   "engine.speculative": {"method": "ngram", "tokens": k, "acceptance": a}})
    r = simulate(config)
    want = (1 - a ** (k + 1)) / (1 - a)
    assert r.metrics["accepted_length"] == pytest.approx(want, rel=0.01)
    assert config.engine.speculative.mean_accepted_length() == pytest.approx(want)
    # per position the share accepted: a, a^2, ... (each given those before it)
    assert r.acceptance == pytest.approx([a ** (j + 1) for j in range(k)], rel=0.02)


@pytest.mark.parametrize("method", ["mtp", "eagle", "ngram"])
@pytest.mark.parametrize("rate", [2.0, 30.0])
def test_acceptance_zero_is_never_faster_than_no_speculation(method, rate):
    values = {**H100, "model.preset": "deepseek-v2-lite", "workload.n_requests": 3000, "workload.rate": rate}
    off = simulate(Config().with_values(values)).metrics
    spec = {"method": method, "tokens": 2, "acceptance": 0.0, **({"draft_layers": 1} if method == "mtp" else {})}
    on = simulate(Config().with_values({**values, "engine.speculative": spec})).metrics
    assert on["accepted_length"] == 1.0
    for name in ("tpot_mean_s", "e2e_mean_s", "ttft_mean_s"):
        assert on[name] >= off[name] * (1 - 1e-12), name
    assert on["throughput_tok_s"] <= off["throughput_tok_s"] * (1 + 1e-12)


def test_full_acceptance_at_concurrency_one_is_a_verification_step_per_four_tokens():
    """A memory-bound decode alone, k = 3, every token accepted: TPOT is one verification step / 4
    (within 5 %)."""
    values = {**H100, "workload.concurrency": 1, "workload.rate": None, "workload.n_requests": 20,
              "workload.prompt.value": 1000, "workload.output": {"dist": "fixed", "value": 401},
              "engine.speculative": {"method": "ngram", "tokens": 3, "acceptance": 1.0}}
    c = Config().with_values(values)
    m = simulate(c).metrics
    k = cost.coefficients(c)
    step = cost.step_time(k, 4, 1204, 4 * 1200 + 10, 4)  # 4 tokens over a 1,000 to 1,400-token context
    assert m["tpot_mean_s"] == pytest.approx(step / 4, rel=0.05)
    assert m["accepted_length"] == 4.0


def test_speculation_off_changes_nothing():
    """No ``engine.speculative`` and ``null`` are one model, to the bit."""
    c = Config().with_values({**H100, "workload.n_requests": 2000, "workload.rate": 20.0})
    traffic = generate(c.workload)
    a = kernels.run(c, traffic)
    b = kernels.run(c.with_values({"engine.speculative": None}), traffic)
    assert np.array_equal(a.done_s, b.done_s) and a.steps == b.steps and a.spec_counts is None


def test_an_mtp_layer_is_read_from_the_config_json_and_holds_memory():
    c = Config().with_values({"model.preset": "deepseek-r1", "hardware.preset": "h200", "engine.tp": 8})
    assert c.model.mtp_layers == 1
    spec = c.with_values({"engine.speculative": {"method": "mtp", "tokens": 2, "acceptance": 0.8}})
    # the MTP layer's weights and KV: fewer blocks, each a layer's KV more
    layer = 1 / c.model.n_layers
    weights = c.model.weight_gb * layer
    free_gpu = c.hardware.mem_gb * c.engine.gpu_memory_utilization - c.engine.reserved_gb
    want = math.floor((free_gpu - (c.model.weight_gb + weights) / 8) * 1e9
                      / (c.model.kv_bytes_per_token * (1 + layer))) // c.engine.block_tokens
    assert cost.kv_blocks(spec) == want
    # a step is 1 + 2 / 61 times as long, but for the fixed overhead
    k0, k1 = cost.coefficients(c), cost.coefficients(spec)
    fixed = c.calibration.step_overhead_ms / 1e3
    d0 = cost.step_time(k0, 192, 64_000, 64_000, 64)
    assert cost.step_time(k1, 192, 64_000, 64_000, 64) - fixed == pytest.approx((d0 - fixed) * (1 + 2 * layer))


def test_a_fleet_draws_each_request_alike_on_any_router():
    """A request's draws are its own: the same acceptance counts whichever replica serves it, as
    long as each runs to its end."""
    values = {**H100, "workload.n_requests": 3000, "workload.rate": 40.0, "fleet.replicas": 3,
              "engine.speculative": {"method": "ngram", "tokens": 3, "acceptance": [0.9, 0.7, 0.5]}}
    rates = [simulate(Config().with_values({**values, "fleet.router": router})).acceptance
             for router in ("round_robin", "least_outstanding")]
    assert rates[0] == rates[1]
