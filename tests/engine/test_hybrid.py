"""Hybrid-attention KV (docs/model/deployed.md, "Hybrid attention"): local and linear-attention
layers hold a fixed number of blocks a request, against the oracles on random configs, and the
capacity a planner reads for the models that have them."""

import json
import math

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from fastsim import Config, simulate
from fastsim.engine import fleet, kernels
from fastsim.engine.traffic import generate
from fastsim.model import cost
from fastsim.model.presets import MODELS

from ..oracles import serving as oracle_serving
from ..strategies import close, dirty_scratch, fleet_configs, oracle_engine, serving_configs, sized
from .test_fleet import run_both, runnable
from .test_prefix import agree


@st.composite
def hybrid(draw, base):
    """A config of ``base`` whose model has local (sliding or chunked) or linear-attention layers,
    its KV cache (when limited) resized to just fit the longest request and its fixed blocks."""
    config = draw(base).with_values({"model.sparse_topk": None})
    kind = draw(st.sampled_from(["sliding", "chunked", "linear"]))
    if kind == "linear":
        v = {"model.window_layers": 0, "model.linear_layers": draw(st.integers(1, 31)),
             "model.linear_state_bytes": draw(st.sampled_from([1e4, 1e5, 3e6]))}
    else:
        v = {"model.linear_layers": 0, "model.window_layers": draw(st.integers(1, 31)),
             "model.window_tokens": draw(st.integers(1, 64)), "model.window_kind": kind}
    config = config.with_values(v)
    if config.engine.kv_cache_gb is not None:
        w = config.workload
        config = sized(config, w.prompt.largest + w.max_output)
    return config


@settings(max_examples=150, deadline=None)
@given(hybrid(serving_configs()))
def test_hybrid_engines_match_the_serving_oracle(config):
    traffic = generate(config.workload)
    fast = kernels.run(config, traffic, scratch=dirty_scratch())
    slow = oracle_serving.simulate(traffic.arrival_s.tolist(), traffic.prompt_tokens.tolist(),
                                   traffic.output_tokens.tolist(), oracle_engine(config))
    event(f"{config.engine.policy}, {'preempts' if fast.preemptions else 'no preemption'}")
    assert close(fast.first_token_s, slow["first_token"]) and close(fast.done_s, slow["done"])
    assert (fast.steps, fast.busy_slot_steps, fast.max_queue, fast.preemptions) == (
        slow["steps"], slow["busy"], slow["max_queue"], slow["preemptions"])
    if slow["kv_used"] is not None:
        assert fast.kv_block_steps == sum(slow["kv_used"])


@settings(max_examples=100, deadline=None)
@given(hybrid(fleet_configs()))
def test_hybrid_fleets_match_the_fleet_oracle(config):
    """Pools, load-aware routers and a prefill pool whose link carries a hybrid model's KV."""
    if not runnable(config):
        return
    traffic, fast, slow = run_both(config)
    event(f"{config.fleet.router}, {'disaggregated' if config.fleet.prefill_replicas else 'colocated'}")
    assert close(fast.first_token_s, slow["first_token"]) and close(fast.done_s, slow["done"])
    assert (fast.steps, fast.preemptions) == (slow["steps"], slow["preemptions"])


def layer_groups_count(name: str, prompt: int, output: int) -> tuple[int, int]:
    """(requests of ``prompt`` + ``output`` tokens one H100 holds, blocks each), counted from the
    model's config.json alone as vLLM's hybrid allocator lays it out: groups of the fewest layers
    of a kind, 16-token blocks of a group's layers, a sliding window's (window - 1) tokens and the
    newest's block per window group."""
    raw = json.load(open(MODELS[name]))
    types = raw["layer_types"]
    full, local = types.count("full_attention"), types.count("sliding_attention")
    size = max(full, local) if max(full, local) < 1.5 * min(full, local) else min(full, local)
    layer_token = 2 * raw["num_key_value_heads"] * raw["head_dim"] * 2  # K and V, bf16
    config = Config().with_values({"model.preset": name, "hardware.preset": "h100-sxm"})
    free_gb = 80 * 0.9 - 2.0 - config.model.weight_gb  # vLLM's default utilisation, fastsim's reserve
    tokens = math.floor(free_gb * 1e9 / (size * math.ceil(full / size) * layer_token))
    blocks = tokens // 16
    window = -(-(raw["sliding_window"] - 1) // 16) + 1
    each = -(-(prompt + output) // 16) + math.ceil(local / size) * window
    return blocks // each, each


@pytest.mark.parametrize("name", ["gpt-oss-120b", "gpt-oss-20b"])
def test_gpt_oss_holds_what_its_layer_groups_give_for_8k_requests(name):
    want, each = layer_groups_count(name, 8192, 1024)
    config = Config().with_values({"model.preset": name, "hardware.preset": "h100-sxm"})
    assert cost.kv_blocks(config) // (-(-9216 // 16) + cost.fixed_blocks(config)) == want
    as_full = config.with_values({"model.window_layers": 0})  # the import before: every layer full attention
    assert cost.kv_blocks(as_full) // (9216 // 16) < 0.55 * want  # about half
    # the engine admits at most so many 9,216-token prompts in one step (all but the first here at once)
    run = simulate(config.with_values({
        "workload.n_requests": want + 5, "workload.rate": 1e9, "workload.arrival": "constant",
        "workload.prompt.value": 9216, "workload.output.dist": "fixed", "workload.output.value": 1,
        "workload.output.max": 1, "engine.max_batched_tokens": None, "engine.max_batch": 1024,
        "engine.prefix_caching": False, "engine.async_scheduling": False}))
    _, together = np.unique(run.first_token_s, return_counts=True)
    assert together.max() == want


def test_a_hybrid_model_serves_more_concurrent_long_requests_and_faster_than_as_full():
    base = {"model.preset": "gpt-oss-120b", "hardware.preset": "h100-sxm", "workload.n_requests": 400,
            "workload.concurrency": 64, "workload.rate": None, "workload.prompt.value": 8192,
            "workload.output.dist": "fixed", "workload.output.value": 1024, "workload.output.max": 1024, "engine.prefix_caching": False}
    hybrid_run = simulate(Config().with_values(base)).metrics
    full_run = simulate(Config().with_values({**base, "model.window_layers": 0})).metrics
    assert hybrid_run["mean_batch"] > 1.6 * full_run["mean_batch"]
    assert hybrid_run["throughput_tok_s"] > 1.3 * full_run["throughput_tok_s"]


def test_a_preempted_request_of_a_window_model_finds_its_blocks_all_or_none():
    """The prefix cache over requests that share nothing: re-hits happen, whole."""
    config = Config().with_values({
        "model.n_layers": 4, "model.window_layers": 2, "model.window_tokens": 8, "model.params_b": 8.0,
        "model.attn_dim": 4096, "model.hidden": 4096, "hardware.peak_tflops": 50.0, "engine.block_tokens": 4,
        "engine.max_batch": 8, "engine.prefix_caching": True, "workload.n_requests": 60, "workload.rate": 500.0,
        "workload.prompt.value": 24, "workload.output.dist": "fixed", "workload.output.value": 40,
        "workload.output.max": 40, "engine.async_scheduling": False})
    config = sized(config, 200)
    traffic = generate(config.workload)
    assert fleet.run(config, traffic).preemptions > 0
    agree(config, traffic)  # the prefix oracle's blocks, window blocks among them


def test_sparse_attention_decodes_long_contexts_at_top_k_cost():
    """DeepSeek-V3.2 on 8 H200s: a decode step at 128k tokens of context reads every token's
    indexer key but attends to 2,048 latents, so it costs a small part of dense attention's."""
    config = Config().with_values({"model.preset": "deepseek-v3.2", "hardware.preset": "h200", "engine.tp": 8})
    dense = config.with_values({"model.sparse_topk": None})
    sparse_k, dense_k = cost.coefficients(config), cost.coefficients(dense)

    def step(k, context):  # 64 decoders
        return cost.step_time(k, 64, 64 * context, 64 * context, 64)
    assert step(sparse_k, 128_000) < 0.3 * step(dense_k, 128_000)
    assert step(sparse_k, 2048) == pytest.approx(step(dense_k, 2048), rel=0.05)  # top-k covers the context
    assert cost.kv_blocks(config) == cost.kv_blocks(dense)  # every token's KV held either way
