"""The serving loop's prefix cache against the prefix oracle (tests/oracles/prefix.py), written from
docs/model/prefix-cache.md: system prompts, sessions, hash-id and conversation traces, small
caches that evict and preempt, one engine and every router; and, at H100 scale, its two forms
(runs of blocks, block by block) against the compiled block loop (tests/oracles/block_loop.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsim import Config, load_config, simulate
from fastsim.analysis.simulation import measure
from fastsim.engine import content as shares
from fastsim.engine import fleet
from fastsim.bench import SERVING, SESSIONS
from fastsim.engine.kernels import Plan
from fastsim.engine.traffic import Traffic, of, routes
from fastsim.model import cost

from ..oracles import block_loop
from ..oracles import prefix as oracle_prefix
from ..strategies import close, oracle_engine, sized

ROUTERS = ["round_robin", "random", "least_outstanding", "least_kv", "prefix_aware"]


@st.composite
def prefix_configs(draw) -> Config:
    """A continuous engine with a small paged KV cache, prefix caching on or off, system prompts
    and/or sessions, one engine or replicas behind any router."""
    bt = draw(st.sampled_from([1, 1, 2, 4, 16]))
    prompt = draw(st.integers(8, 120))
    o_max = draw(st.integers(1, 30))
    limit = draw(st.integers(1, 8))
    caching = draw(st.booleans())
    v = {
        "engine.max_batch": limit,
        "engine.block_tokens": bt,
        "engine.prefix_caching": caching,
        "workload.n_requests": draw(st.integers(1, 40)),
        "workload.rate": draw(st.floats(1.0, 2000.0)),
        "workload.seed": draw(st.integers(0, 2**32)),
        "workload.prompt.dist": draw(st.sampled_from(["fixed", "uniform"])),
        "workload.prompt.value": prompt,
        "workload.prompt.min": draw(st.integers(2, prompt)),
        "workload.prompt.max": prompt,
        "workload.output.dist": draw(st.sampled_from(["fixed", "uniform", "lognormal"])),
        "workload.output.value": draw(st.integers(1, o_max)),
        "workload.output.max": o_max,
        "workload.output.mu": draw(st.floats(0.0, math.log(o_max))),
        "hardware.peak_tflops": draw(st.sampled_from([None, 50.0])),
        "model.params_b": 8.0,
        "model.n_layers": 32,
        "model.attn_dim": 4096,
        "model.hidden": 4096,
        "calibration.step_overhead_ms": draw(st.sampled_from([0.0, 1.5])),
        "calibration.api_overhead_ms": draw(st.sampled_from([0.0, 20.0])),
        "engine.async_scheduling": draw(st.booleans()),
    }
    if draw(st.booleans()):
        v["engine.max_batched_tokens"] = draw(st.integers(limit, 200))
    shortest = v["workload.prompt.min"] if v["workload.prompt.dist"] != "fixed" else prompt
    if draw(st.booleans()):
        v["workload.system_prompts"] = {"count": draw(st.integers(1, 4)), "tokens": draw(st.integers(1, shortest - 1)),
                                        "popularity": draw(st.sampled_from(["uniform", "zipf"]))}
    elif caching and draw(st.booleans()):
        v["workload.prefix_tokens"] = draw(st.integers(1, shortest - 1))
    longest = prompt + o_max
    if draw(st.booleans()):
        cap = draw(st.integers(longest, 4 * longest))
        v["workload.sessions"] = {"turns": {"dist": "uniform", "min": 1, "max": draw(st.integers(1, 6))},
                                  "followup": {"dist": "uniform", "min": 1, "max": draw(st.integers(1, 40))},
                                  "think_s": draw(st.sampled_from([{"dist": "fixed", "value": 0.0},
                                                                   {"dist": "exponential", "mean": 0.05}])),
                                  "max_context": cap}
        longest = cap
    shared = "workload.system_prompts" in v or "workload.prefix_tokens" in v or "workload.sessions" in v
    if not shared and draw(st.integers(0, 2)) == 0:  # local-attention layers: a window's blocks a request
        v.update({"model.window_layers": draw(st.integers(1, 31)), "model.window_tokens": draw(st.integers(1, 48)),
                  "model.window_kind": draw(st.sampled_from(["sliding", "chunked"]))})
    replicas = draw(st.integers(1, 3))
    router = draw(st.sampled_from(ROUTERS if caching else ROUTERS[:4]))
    v.update({"fleet.replicas": replicas, "fleet.router": router, "fleet.prefix_weight": draw(st.sampled_from(
        [0.0, 1.0, 3.5]))})
    if not caching and v.get("workload.sessions") is None:
        v["engine.prefix_caching"] = True  # the plain continuous kernel runs the rest
    return sized(Config().with_values(v), draw(st.integers(longest, 3 * longest)))  # from just enough for the longest


def _engine(config: Config, prefill: bool = False):
    engine = oracle_engine(config, prefill)
    engine.prefix_blocks = 0
    # Sessions release a turn at a step's end (plus the API overhead and a think time that may be
    # 0), so arrivals tie with other replicas' step boundaries exactly; the kernels' own step time
    # (checked against the physical formula by the serving oracle) keeps those ties bit-identical.
    k = cost.coefficients(fleet.pools.prefill_config(config) if prefill else config)
    engine.cost = lambda N, C, A, S: cost.step_time(k, N, C, A, S)
    return engine


def oracle(config: Config, traffic: Traffic) -> dict:
    n = len(traffic)
    c = traffic.content if traffic.content is not None else shares.none(n)
    f = config.fleet
    draws = routes(config.workload, n, f.replicas, 0).tolist() if f.router == "random" else None
    prefill = None
    if f.prefill_replicas:
        m = config.model
        layer = m.kv_bytes_per_token / m.n_layers  # a prompt's KV: every token's in its full-attention layers,
        full = m.n_layers - m.window_layers - m.linear_layers  # the window's last in the local ones, states
        link_s = [f.kv_link_latency_ms * 1e-3 + (p * layer * full + min(p, m.window_tokens or 0) * layer
                                                 * m.window_layers + m.linear_layers * m.linear_state_bytes)
                  / (f.kv_link_gb_s * 1e9) for p in traffic.prompt_tokens.tolist()]
        pre_draws = routes(config.workload, n, f.prefill_replicas, 1).tolist() if f.router == "random" else None
        prefill = oracle_prefix.Prefill(f.prefill_replicas, _engine(config, prefill=True), link_s, pre_draws)
    return oracle_prefix.simulate(traffic.arrival_s.tolist(), traffic.prompt_tokens.tolist(),
                                  traffic.output_tokens.tolist(), c, _engine(config),
                                  caching=config.engine.prefix_caching, replicas=f.replicas, router=f.router,
                                  weight=f.prefix_weight, routes=draws, prefill=prefill)


def agree(config: Config, traffic: Traffic) -> None:
    fast = fleet.run(config, traffic)
    slow = oracle(config, traffic)
    arrival = traffic.arrival_s if fast.arrival_s is None else fast.arrival_s
    assert close(arrival, slow["arrival"])
    assert close(fast.first_token_s, slow["first_token"])
    assert close(fast.done_s, slow["done"])
    replica = [None if r < 0 else r for r in fast.replica.tolist()] if fast.replica is not None else [0] * len(traffic)
    assert replica == slow["replica"]
    if config.fleet.prefill_replicas:
        assert fast.prefill_replica.tolist() == slow["prefill_replica"]
    assert (fast.steps, fast.busy_slot_steps, fast.max_queue, fast.preemptions) == (
        slow["steps"], slow["busy"], slow["max_queue"], slow["preemptions"])
    if config.engine.prefix_caching:
        assert fast.cached_tokens.tolist() == slow["cached"]
        assert fast.prefix_hit_rate == sum(slow["cached"]) / float(traffic.prompt_tokens.sum())
    assert fast.kv_block_steps == sum(slow["kv_used"])
    m = measure(config, traffic, fast)
    gaps = sorted(slow["gaps"])
    for p, name in ((0.5, "itl_p50_s"), (0.99, "itl_p99_s")):
        want = gaps[min(len(gaps) - 1, int(p * len(gaps)))] if gaps else math.nan
        assert close(m[name], want), name


@settings(max_examples=300, deadline=None)
@given(prefix_configs())
def test_the_kernel_matches_the_prefix_oracle(config):
    agree(config, of(config))


def test_a_turn_released_at_a_step_end_joins_as_the_oracle_says():
    """Think 0 and no API overhead: a turn arrives exactly as the step it follows ends, the start
    of a bare (decode-only) step it rides under async scheduling; it is admitted at the next step,
    whose batch was chosen after it came (the chat kernel once rebuilt the ridden step's start
    from its end and length, an ulp early, and admitted it a step late)."""
    config = Config().with_values({
        "engine.max_batch": 5, "engine.block_tokens": 1, "engine.prefix_caching": True,
        "engine.async_scheduling": True, "engine.kv_cache_gb": 0.024, "model.params_b": 8.0,
        "model.n_layers": 32, "model.attn_dim": 4096, "model.hidden": 4096, "workload.n_requests": 18,
        "workload.seed": 0, "workload.rate": 951.0, "workload.prompt.value": 31, "workload.prompt.max": 31,
        "workload.output.dist": "uniform", "workload.output.max": 17,
        "workload.system_prompts": {"count": 1, "tokens": 1},
        "workload.sessions": {"turns": {"dist": "uniform", "min": 1, "max": 5},
                              "followup": {"dist": "uniform", "min": 1, "max": 1},
                              "think_s": {"dist": "fixed", "value": 0.0}, "max_context": 97}})
    agree(config, of(config))


@settings(max_examples=150, deadline=None)
@given(prefix_configs())
def test_one_engine_over_chat_traffic_matches_the_prefix_oracle(config):
    """One engine over system prompts and sessions (the cache as runs of blocks, decode in closed
    form): the oracle's answer."""
    config = config.with_values({"fleet.replicas": 1, "fleet.router": "round_robin", "engine.prefix_caching": True})
    agree(config, of(config))


def steps_of(runs: np.ndarray) -> dict:
    """Each step (N, C, A, w, S) the step runs hold, and how many times."""
    steps: dict = {}
    for kv, pairs, nw, m, s in runs.tolist():
        w = nw & 0xFFFFFFFF
        for j in range(m):
            key = (nw >> 32, kv + j * w, pairs + j * w, w, s)
            steps[key] = steps.get(key, 0) + 1
    return steps


def tree_of(traffic):
    """The chat tree the serving loop's cache holds (:func:`fastsim.engine.content.chat_tree`)."""
    from fastsim.engine.content import chat_tree

    return chat_tree(traffic.content, traffic.prompt_tokens, traffic.output_tokens)


def at_scale(seed: int, n: int) -> tuple:
    """The bench's chat sessions at H100 scale, with caches from tight (thousands of preemptions)
    to roomy, on one engine or replicas behind any router: (config, traffic, plan, draws)."""
    rng = np.random.default_rng(seed)
    config = Config().with_values({
        **SERVING, **SESSIONS[1], "workload.n_requests": n, "workload.seed": seed,
        "workload.rate": float(rng.choice([0.5, 1.0, 3.0])), "engine.kv_cache_gb": float(rng.choice([2.0, 4.0, 20.0])),
        "engine.max_batched_tokens": int(rng.choice([2048, 8192])),
        "workload.sessions": {"turns": {"dist": "uniform", "min": 2, "max": 10}, "max_context": 12000}})
    replicas = int(rng.choice([1, 1, 2, 4]))
    router = str(rng.choice(ROUTERS))
    config = config.with_values({"fleet.replicas": replicas, "fleet.router": router,
                                 "workload.rate": config.workload.rate * replicas})
    traffic = of(config)
    return config, traffic, Plan.of(config, None), routes(config.workload, len(traffic), replicas, 0)


def same_run(fast, loop) -> None:
    """Every time to 1e-9, every count exact."""
    assert close(fast.first_token_s, loop.first_token_s) and close(fast.done_s, loop.done_s)
    assert close(fast.arrival_s, loop.arrival_s) and (fast.cached_tokens == loop.cached_tokens).all()
    for name in ("steps", "busy_slot_steps", "max_queue", "preemptions", "kv_block_steps", "prefix_hit_rate"):
        assert getattr(fast, name) == getattr(loop, name), name
    assert steps_of(fast.runs) == steps_of(loop.runs)  # (the two loops record them in other rows)
    assert close(np.sort(fast.gaps_s), np.sort(loop.gaps_s))


@pytest.mark.parametrize("seed", range(12))
def test_the_serving_loop_equals_the_block_loop_at_scale(seed):
    """The serving loop (the cache as runs of blocks) against the compiled block loop (itself
    the oracle's) on chat sessions at H100 scale."""
    config, traffic, plan, draws = at_scale(seed, 1000)
    same_run(fleet._shared(config, plan, traffic, tree_of(traffic), draws, None),
             block_loop.blockwise(config, plan, traffic, traffic.output_tokens, draws))


@pytest.mark.parametrize("seed", [2, 3, 6, 20])
def test_the_serving_loop_block_by_block_equals_the_block_loop_at_scale(seed):
    """The serving loop with the cache block by block (as a trace's recorded sharing runs),
    against the compiled block loop on the same chat sessions (these seeds preempt: 347, 355,
    75, 378 times)."""
    config, traffic, plan, draws = at_scale(seed, 600)
    same_run(fleet._shared(config, plan, traffic, None, draws, None),
             block_loop.blockwise(config, plan, traffic, traffic.output_tokens, draws))


@pytest.mark.parametrize("router", ROUTERS)
def test_replicas_over_system_prompts_run_on_the_serving_loop(router):
    """Replicas over system prompts behind every router, on the serving loop: the block-by-block
    loop's answer (a tight cache that preempts)."""
    config = Config().with_values({**SERVING, "workload.system_prompts": {"count": 8, "tokens": 500},
                                   "workload.rate": 60.0, "workload.n_requests": 4000, "fleet.replicas": 4,
                                   "fleet.router": router, "engine.kv_cache_gb": 2.0})
    traffic = of(config)
    draws = routes(config.workload, len(traffic), 4, 0) if router == "random" else np.empty(len(traffic), np.int64)
    plan = Plan.of(config, None)
    fast = fleet._shared(config, plan, traffic, tree_of(traffic), draws, None)
    loop = block_loop.blockwise(config, plan, traffic, traffic.output_tokens, draws)
    assert fast.preemptions == loop.preemptions > 0 and (fast.replica == loop.replica).all()
    assert close(fast.first_token_s, loop.first_token_s) and close(fast.done_s, loop.done_s)
    assert (fast.cached_tokens == loop.cached_tokens).all() and fast.kv_block_steps == loop.kv_block_steps


def test_a_run_whose_runs_of_blocks_stop_goes_on_block_by_block(monkeypatch):
    """Where the serving loop's runs of blocks stop (two requests filling one system prompt: the
    rules keep that from happening, the loop checks), the same loop with the cache block by block
    gives the answer: the runs' own."""
    from fastsim.engine.kernels import serve as serving

    config = Config().with_values({**SERVING, **SESSIONS[1], "workload.n_requests": 300})
    traffic = of(config)
    want = fleet.run(config, traffic)
    kinds = []

    def stopping(*args):
        kinds.append(type(args[7]).__name__)
        if kinds[-1] == "Runs":
            return (0,) * 6, (0,) * 6, 0, 0, True
        return serving.serve(*args)

    monkeypatch.setattr(fleet, "serve", stopping)
    got = fleet.run(config, traffic)
    assert kinds == ["Runs", "Blocks"]
    assert close(got.done_s, want.done_s) and got.steps == want.steps
    assert (got.cached_tokens == want.cached_tokens).all()


@st.composite
def recorded(draw):
    """A config and traffic with recorded content: hash ids (the Mooncake format) or a
    conversation's parent links, on a small cache."""
    n = draw(st.integers(1, 30))
    bt = draw(st.sampled_from([1, 1, 2, 4]))
    hb = draw(st.sampled_from([1, 3, 4, 8]))
    prompt = np.array(draw(st.lists(st.integers(1, 60), min_size=n, max_size=n)), np.int64)
    output = np.array(draw(st.lists(st.integers(1, 12), min_size=n, max_size=n)), np.int64)
    arrival = np.cumsum(draw(st.lists(st.sampled_from([0.0, 0.001, 0.01, 0.2]), min_size=n, max_size=n)))
    c = shares.none(n)
    if draw(st.booleans()):  # hash ids: a random prefix tree of ids, some prompts repeated whole
        ids, start = [], [0]
        for r in range(n):
            other = draw(st.integers(0, max(r - 1, 0)))
            if r and draw(st.integers(0, 3)) == 0:  # the same prompt again: cached whole, its last block recomputed
                prompt[r] = prompt[other]
            count = -(-int(prompt[r]) // hb)
            common = draw(st.integers(0, count)) if r else 0
            mine = ids[start[other]:start[other + 1]][:common] if r else []
            mine = mine + [1000 + r * 100 + i for i in range(len(mine), count)]
            ids += mine
            start.append(len(ids))
        c = shares.Content(c.parent, c.shared, np.array(start, np.int64), np.array(ids, np.int64), hb, c.session,
                           c.turn, c.system_prompt, c.think_s)
    else:  # a conversation: a parent among the earlier rows, its prompt + output shared
        parent = np.array([draw(st.integers(-1, r - 1)) for r in range(n)], np.int64)
        for r in range(n):  # some children re-send the conversation and nothing new
            if parent[r] >= 0 and draw(st.integers(0, 3)) == 0:
                prompt[r] = prompt[parent[r]] + output[parent[r]]
        shared = np.where(parent >= 0, np.minimum((prompt + output)[np.maximum(parent, 0)], prompt), 0)
        c = shares.Content(parent, shared, c.hash_start, c.hash_ids, 1, c.session, c.turn, c.system_prompt, c.think_s)
    longest = int((prompt + output).max())
    tokens = draw(st.integers(longest, 2 * longest))
    router = draw(st.sampled_from(ROUTERS))
    config = Config().with_values({
        "engine.max_batch": draw(st.integers(1, 6)), "engine.block_tokens": bt, "engine.prefix_caching": True,
        "engine.kv_cache_gb": math.ceil(tokens / bt) * bt * 131072 / 1e9 * (1 + 1e-12),
        "fleet.replicas": draw(st.integers(1, 3)), "fleet.router": router, "model.params_b": 8.0,
        "hardware.peak_tflops": 50.0, "model.n_layers": 32, "model.attn_dim": 4096, "model.hidden": 4096,
        "workload.n_requests": n, "engine.async_scheduling": draw(st.booleans())})
    return config, Traffic(arrival, prompt, output, c)


@settings(max_examples=200, deadline=None)
@given(recorded())
def test_recorded_content_matches_the_oracle(case):
    agree(*case)


def test_a_recorded_child_beside_its_parent_is_not_a_session_turn():
    """A conversation trace's row may share all of the row before it and still arrive while that
    one runs (its time is recorded): it hits what the parent has computed so far, which only the
    block-by-block loop follows (hypothesis found this; the chat kernel had taken it for a turn)."""
    config = Config().with_values({
        "hardware.peak_tflops": 50.0, "model.params_b": 8.0, "model.n_layers": 32, "model.attn_dim": 4096,
        "model.hidden": 4096, "engine.max_batch": 2, "engine.block_tokens": 1, "engine.prefix_caching": True,
        "engine.kv_cache_gb": 5 * 131072 / 1e9 * (1 + 1e-12), "workload.n_requests": 2})
    none = shares.none(2)
    content = shares.Content(np.array([-1, 0]), np.array([0, 4]), none.hash_start, none.hash_ids, 1, none.session,
                             none.turn, none.system_prompt, none.think_s)
    traffic = Traffic(np.zeros(2), np.array([2, 4]), np.array([2, 1]), content)
    assert shares.chat_tree(content, traffic.prompt_tokens, traffic.output_tokens) is None
    agree(config, traffic)


def test_sessions_follow_the_rules():
    """Turn k+1's prompt is turn k's prompt + output + a follow-up; it shares all of turn k;
    turn 1 shares its system prompt; turns count toward n_requests; think times follow done."""
    config = Config().with_values({
        "hardware.preset": "h100-sxm", "model.preset": "llama-3.1-8b", "engine.prefix_caching": True,
        "workload.n_requests": 400, "workload.prompt.dist": "uniform", "workload.prompt.min": 100,
        "workload.prompt.max": 300, "workload.system_prompts": {"count": 3, "tokens": 50},
        "workload.sessions": {"turns": {"dist": "uniform", "min": 2, "max": 6},
                              "think_s": {"dist": "fixed", "value": 2.0}}})
    t = of(config)
    c = t.content
    n = len(t)
    assert n == 400
    later = np.flatnonzero(c.turn > 1)
    assert (c.session[later] == c.session[later - 1]).all() and (c.turn[later] == c.turn[later - 1] + 1).all()
    before = t.prompt_tokens[later - 1] + t.output_tokens[later - 1]
    assert (t.prompt_tokens[later] > before).all() and (c.shared[later] == before).all()
    assert (c.parent[later] == later - 1).all()
    first = np.flatnonzero(c.turn == 1)
    assert (c.parent[first] == n + c.system_prompt[first]).all() and (c.shared[first] == 50).all()
    assert np.isnan(t.arrival_s[later]).all() and (np.diff(t.arrival_s[first]) >= 0).all()
    r = simulate(config)
    assert (r.arrival_s[later] == r.done_s[later - 1] + 2.0).all()
    assert r.metrics["prefix_hit_rate"] > 0.5
    assert (r.cached_tokens[later] >= before // 16 * 16 - 16).all()  # every earlier turn still cached


@settings(max_examples=150, deadline=None)
@given(prefix_configs(), st.integers(1, 2), st.sampled_from([None, 4, 400]), st.sampled_from([0.0, 2.0]))
def test_a_prefill_pool_caches_what_it_computes(config, prefill, prefill_budget, latency_ms):
    """Disaggregated: the prefill replicas run the cache on every prompt as a one-token request,
    their links carry the KV to decode replicas that cache nothing; a session's next turn waits for
    its last token on the decode replica. Everything is the oracle's: times, both replicas, cached
    tokens, counters."""
    values = {"fleet.prefill_replicas": prefill, "fleet.kv_link_latency_ms": latency_ms, "fleet.kv_link_gb_s": 0.5}
    if prefill_budget is not None:
        values["fleet.prefill_max_batched_tokens"] = max(prefill_budget, config.engine.max_batch)
    config = config.with_values(values)
    agree(config, of(config))


@pytest.mark.parametrize("sessions", [False, True])
def test_decode_replicas_behind_prefix_aware_routing_go_by_kv_blocks(sessions):
    """Decode replicas cache nothing, so every one would miss the whole prompt: prefix-aware
    routing is least_kv's there (it was least_outstanding's). A case where the two differ."""
    v = {"engine.max_batch": 4, "engine.prefix_caching": True, "workload.n_requests": 60, "workload.rate": 200.0,
         "workload.prompt.dist": "uniform", "workload.prompt.min": 20, "workload.prompt.max": 80,
         "workload.output.dist": "uniform", "workload.output.min": 1, "workload.output.max": 30,
         "workload.system_prompts": {"count": 3, "tokens": 16}, "engine.block_tokens": 4,
         "model.params_b": 8.0, "model.n_layers": 32, "model.attn_dim": 4096, "model.hidden": 4096,
         "engine.kv_cache_gb": 400 * 131072 / 1e9 * (1 + 1e-12),
         "fleet.replicas": 3, "fleet.prefill_replicas": 2, "fleet.router": "prefix_aware"}
    if sessions:
        v["workload.sessions"] = {"turns": {"dist": "uniform", "min": 1, "max": 4},
                                  "think_s": {"dist": "fixed", "value": 0.0}, "max_context": 400}
    config = Config().with_values(v)
    agree(config, of(config))


def test_the_chat_fleet_figures_of_the_docs(root):
    """docs/model/prefix-cache.md's table (configs/chat-fleet.yaml on 4 replicas, after a warm-up):
    prefix-aware routing hits more and keeps TTFT below round robin's, both steady; without the
    cache the fleet falls behind, and says so."""
    base = load_config(root / "configs/chat-fleet.yaml")
    got = {}
    for cache, router in [(False, "round_robin"), (True, "round_robin"), (True, "prefix_aware")]:
        got[cache, router] = simulate(base.with_values({"engine.prefix_caching": cache, "fleet.router": router})).metrics
    rr, pa, off = got[True, "round_robin"], got[True, "prefix_aware"], got[False, "round_robin"]
    assert pa["prefix_hit_rate"] > rr["prefix_hit_rate"] and pa["ttft_p99_s"] < rr["ttft_p99_s"]
    table = [(off, math.nan, 24.7, 38.2, 0.062, 0), (rr, 0.410, 0.0763, 0.224, 1.0, 1), (pa, 0.738, 0.0540, 0.195, 1.0, 1)]
    for m, hit, p50, p99, slo, steady in table:
        assert math.isnan(hit) and math.isnan(m["prefix_hit_rate"]) or round(m["prefix_hit_rate"], 3) == hit
        assert math.isclose(m["ttft_p50_s"], p50, rel_tol=0.01) and math.isclose(m["ttft_p99_s"], p99, rel_tol=0.01)
        assert round(m["slo_attainment"], 3) == slo and m["steady"] == steady


def test_a_warm_chat_fleet_of_20000_turns_is_its_long_run(root):
    """The issue that made warm-ups: the chat fleet's first 20,000 turns from an empty fleet are
    not its long run (a cache filling, queues growing at 13 sessions a second) and must say so;
    warmed up, 20,000 turns agree with 200,000 within 10 % on TTFT p50 and hit rate."""
    base = load_config(root / "configs/chat-fleet.yaml", {"fleet.router": "prefix_aware"})
    cold = simulate(base.with_values({"workload.warmup": 0, "workload.rate": 13})).metrics
    assert cold["steady"] == 0
    short, long = (simulate(base.with_values({"workload.n_requests": n})).metrics for n in (20_000, 200_000))
    assert short["steady"] == long["steady"] == 1
    for name in ("ttft_p50_s", "prefix_hit_rate"):
        assert math.isclose(short[name], long[name], rel_tol=0.1), name


def test_the_chat_fleet_behind_a_prefill_pool_of_the_docs(root):
    """docs/model/prefix-cache.md's second table: configs/chat-fleet.yaml on 3 prefill and 3 decode
    replicas; at weight 64 prefix-aware routing sends nearly every prompt to one prefill replica."""
    base = load_config(root / "configs/chat-fleet.yaml").with_values({"fleet.prefill_replicas": 3,
                                                                      "fleet.replicas": 3})
    table = [("least_outstanding", 64, 0.411, 0.186, 0.0311, 24, 1.0),
             ("prefix_aware", 64, 0.327, 165, 0.0146, 0, 0.004), ("prefix_aware", 1, 0.586, 0.156, 0.0306, 17, 1.0)]
    for router, weight, hit, ttft, tpot, preemptions, slo in table:
        r = simulate(base.with_values({"fleet.router": router, "fleet.prefix_weight": weight}))
        m = r.metrics
        assert round(m["prefix_hit_rate"], 3) == hit and round(m["slo_attainment"], 3) == slo
        assert math.isclose(m["ttft_p99_s"], ttft, rel_tol=0.01) and math.isclose(m["tpot_p99_s"], tpot, rel_tol=0.01)
        assert m["preemptions"] == preemptions
        if weight == 64 and router == "prefix_aware":  # all but a few dozen prompts (warm-up's too) to one replica
            assert np.bincount(r.prefill_replica).max() > 0.999 * len(r.prefill_replica)


def test_the_sample_traces_replay_with_their_hit_rates(root):
    """configs/chat-traces.yaml's figures in docs/model/prefix-cache.md: the same conversations
    as hash ids (system prompts visible) and as parent links (only the conversation)."""
    base = load_config(root / "configs/chat-traces.yaml")
    traces = root / "configs/traces"
    want = {"chat-sample.jsonl": (0.741, 0.08), "chat-sample.csv": (0.37, 0.26)}
    for name, (hit, p99) in want.items():
        on = simulate(base.with_values({"workload.trace": str(traces / name), "workload.rate": 8})).metrics
        assert round(on["prefix_hit_rate"], 3) == hit and round(on["ttft_p99_s"], 2) == p99
        off = simulate(base.with_values({"workload.trace": str(traces / name), "workload.rate": 8,
                                         "engine.prefix_caching": False})).metrics
        assert round(off["ttft_p99_s"], 2) == 0.27 and math.isnan(off["prefix_hit_rate"])


def test_requests_out_carries_cached_tokens_sessions_and_system_prompts(root, tmp_path):
    import xarray as xr
    from typer.testing import CliRunner

    from fastsim.cli import app

    out = tmp_path / "requests.nc"
    result = CliRunner().invoke(app, ["run", str(root / "configs/chat-fleet.yaml"), "--set", "workload.n_requests=300",
                                      "--requests-out", str(out)])
    assert result.exit_code == 0, result.output
    with xr.open_dataset(out) as ds:
        assert {"cached_tokens", "session", "turn", "system_prompt", "replica"} <= set(ds.data_vars)
        measured = ds.measured.values  # (the sessions starting in the config's 15-minute warm-up are not)
        later = (ds.turn.values > 1) & measured
        assert (ds.cached_tokens.values[later] > 0).all() and (ds.system_prompt.values >= 0).all()
        assert ds.session.values[0] == 0 and ds.turn.values[0] == 1
        assert 0 < measured.sum() == 300 < measured.size and not measured[0]
        assert ds.attrs["metric_prefix_hit_rate"] == (ds.cached_tokens.values[measured].sum()
                                                      / ds.prompt_tokens.values[measured].sum())


@settings(max_examples=100, deadline=None)
@given(prefix_configs())
def test_without_shared_content_the_cache_matters_only_after_a_preemption(config):
    """Requests that share nothing run on the fast kernels when nobody is preempted, and on the
    cache's loop otherwise: either way the oracle's answer."""
    config = config.with_values({"workload.system_prompts": None, "workload.sessions": None,
                                 "workload.prefix_tokens": 0, "engine.prefix_caching": True})
    agree(config, of(config))


def test_sessions_end_before_their_context_and_count_turns_to_n_requests():
    config = Config().with_values({
        "hardware.preset": "h100-sxm", "model.preset": "llama-3.1-8b", "engine.prefix_caching": True,
        "workload.n_requests": 997, "workload.prompt.value": 500, "workload.output.max": 400,
        "workload.system_prompts": {"count": 5, "tokens": 100, "popularity": "zipf", "zipf_s": 1.5},
        "workload.sessions": {"turns": {"dist": "fixed", "value": 8}, "max_context": 3000}})
    t = of(config)
    c = t.content
    assert len(t) == 997 and (t.prompt_tokens + t.output_tokens <= 3000).all()
    ends = np.flatnonzero(np.diff(c.session) != 0)  # the last turn of every session but the last
    cut = ends[c.turn[ends] < 8]
    # the turn it did not take: all of the last one, a follow-up (fixed, like the prompt: 500), and
    # the output drawn for that request index (the next session's first turn took it instead)
    assert cut.size and (t.prompt_tokens[cut] + t.output_tokens[cut] + 500 + t.output_tokens[cut + 1] > 3000).all()
    kept = np.flatnonzero(c.turn > 1)
    assert (t.prompt_tokens[kept] == t.prompt_tokens[kept - 1] + t.output_tokens[kept - 1] + 500).all()
    counts = np.bincount(c.system_prompt[c.turn == 1], minlength=5)
    assert counts[0] == counts.max() and (np.diff(counts) <= 0).sum() >= 3  # Zipf: the first is the most popular


def test_a_sweep_over_whole_system_prompt_sections_labels_them(root, tmp_path):
    import xarray as xr
    from typer.testing import CliRunner

    from fastsim.cli import app

    out = tmp_path / "prompts.nc"
    result = CliRunner().invoke(app, [
        "sweep", str(root / "configs/chat-fleet.yaml"), "--out", str(out), "--quiet",
        "--set", "workload.n_requests=300", "--set", "sweep.fleet.router=[prefix_aware]",
        "--set", "sweep.workload.system_prompts=[{count: 2, tokens: 500}, {count: 8, tokens: 500, popularity: zipf}]"])
    assert result.exit_code == 0, result.output
    with xr.open_dataset(out) as ds:
        assert ds.system_prompts.values.tolist() == ['{"count":2,"tokens":500}',
                                                     '{"count":8,"tokens":500,"popularity":"zipf"}']
        assert (ds.prefix_hit_rate > 0).all()


def test_a_sweep_sets_keys_inside_the_sessions_and_system_prompts(root, tmp_path):
    """Keys inside a section that is null by default are sweep axes like any other: a point is
    `fastsim run` with them set, and a section is swept whole or by its keys, not both."""
    import xarray as xr
    from typer.testing import CliRunner

    from fastsim.cli import app

    out = tmp_path / "keys.nc"
    study = root / "configs/chat-fleet.yaml"
    result = CliRunner().invoke(app, [
        "sweep", str(study), "--out", str(out), "--quiet", "--set", "workload.n_requests=1500",
        "--set", 'sweep={"workload.sessions.think_s.mean": [5, 20], "workload.system_prompts.count": [2, 8]}'])
    assert result.exit_code == 0, result.output
    with xr.open_dataset(out) as ds:
        assert dict(ds.sizes) == {"think_s_mean": 2, "count": 2}
        got = ds.sel(think_s_mean=20, count=8)
        want = simulate(load_config(study, {"workload.n_requests": 1500, "workload.sessions.think_s.mean": 20,
                                            "workload.system_prompts.count": 8})).metrics
        assert float(got.ttft_p99_s) == want["ttft_p99_s"] and float(got.prefix_hit_rate) == want["prefix_hit_rate"]
    both = CliRunner().invoke(app, ["sweep", str(study), "--out", str(out), "--set",
                                    'sweep={"workload.sessions": [null], "workload.sessions.turns.max": [3]}'])
    assert both.exit_code == 2 and "a section is swept whole or by its keys, not both" in both.stderr


@pytest.mark.parametrize("policy", ["static", "dynamic"])
@pytest.mark.parametrize("shares", [{}, {"workload.prefix_tokens": 200},
                                    {"workload.system_prompts": {"count": 4, "tokens": 300}},
                                    {"fleet.replicas": 2, "fleet.router": "random"}],
                         ids=["nothing", "prefix", "system-prompts", "replicas"])
def test_static_and_dynamic_batching_run_without_the_prefix_cache_they_do_not_have(root, policy, shares):
    """engine.prefix_caching on a policy without a prefix cache (configs/h100.yaml's, say) runs,
    to the bit, as with it off: no hit rate, a shared prefix pinned as without a cache."""
    def run(caching: bool):
        return simulate(load_config(root / "configs/h100.yaml", {
            "engine.policy": policy, "engine.prefix_caching": caching, "workload.n_requests": 2000, **shares}))

    on, off = run(True), run(False)
    assert on.metrics.keys() == off.metrics.keys() and math.isnan(on.metrics["prefix_hit_rate"])
    assert all(a == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(on.metrics.values(), off.metrics.values()))
    assert np.array_equal(on.first_token_s, off.first_token_s) and np.array_equal(on.done_s, off.done_s)
    assert on.config.engine.prefix_caching  # the result keeps the config as given


@st.composite
def client_configs(draw) -> Config:
    """:func:`prefix_configs` with closed-loop clients, sending independent requests or, half the
    time, its sessions (a client runs one session's turns, then takes the next session), and
    sometimes a prefill pool in front, or a ramp, or think times."""
    config = draw(prefix_configs())
    sessions = config.workload.sessions if draw(st.booleans()) else None
    values = {"workload.sessions": sessions and sessions.model_dump(), "workload.rate": None,
              "workload.concurrency": draw(st.integers(1, 12)),
              "workload.ramp_s": draw(st.sampled_from([0.0, 0.0, 0.05])),
              "workload.think_s": draw(st.sampled_from([None, {"dist": "fixed", "value": 0.0},
                                                        {"dist": "exponential", "mean": 0.02}]))}
    if draw(st.booleans()):
        values.update({"fleet.prefill_replicas": draw(st.integers(1, 2)), "fleet.kv_link_latency_ms": 0.5,
                       "fleet.kv_link_gb_s": 0.5})
    return config.with_values(values)


@settings(max_examples=80, deadline=None)
@given(client_configs())
def test_closed_loop_clients_match_the_prefix_oracle(config):
    """C clients, each sending its next request when its last is done (plus think time; over
    sessions its session's next turn, or the next session), on one engine, replicas behind any
    router or a prefill pool in front, with or without the prefix cache: the oracle's times,
    replicas, cached tokens and counters; never more than C requests in flight."""
    agree(config, of(config))
    fast = fleet.run(config, of(config))
    arrival, done = fast.arrival_s, fast.done_s
    order = np.lexsort((np.r_[np.ones(arrival.size), -np.ones(done.size)], np.r_[arrival, done]))
    in_flight = np.cumsum(np.r_[np.ones(arrival.size), -np.ones(done.size)][order])
    assert in_flight.max() <= config.workload.concurrency
