"""Test helpers: configs drawn at random (hypothesis) and the oracles' engines built from a
config with the docs' formulas written out again."""

import dataclasses
import math

import numpy as np
from hypothesis import strategies as st

from fastsim import Config
from fastsim.engine.kernels import Scratch
from fastsim.model.schema import Hardware
from fastsim.model.speculative import draft_kv_share

from .oracles import dp as oracle_dp
from .oracles import fleet as oracle_fleet
from .oracles import serving as oracle_serving


# The serving kernels sum long runs of bare steps in closed form, rounding once per run where the
# oracles round once per step: times agree to this relative tolerance, every count exactly
# (docs/model/serving.md, "Bare steps in closed form").
REL = 1e-9


def close(got, want) -> bool:
    """Times (or latencies) that agree to :data:`REL`, NaN where the other is NaN."""
    return bool(np.allclose(np.asarray(got, float), np.asarray(want, float), rtol=REL, atol=0, equal_nan=True))


def dirty_scratch() -> Scratch:
    """A kernel scratch whose state room is full of garbage (a kernel must initialise what it
    reads: a caller's scratch holds the last run's state)."""
    scratch = Scratch()
    scratch.state = np.full(1 << 18, -(1 << 40) - 7, np.int64)
    return scratch


def hybrid(c: Config, kv_gpu: float, tp: int) -> tuple[int, int, int, float, float]:
    """A hybrid-attention model's KV, the docs' rules written out again: (blocks a running request
    holds beyond its tokens', full-attention layers, layers one block spans, bytes one GPU reads
    per sampled row beyond the full layers' KV, query-key pairs per computed token over the
    local layers). ``kv_gpu``: every layer's KV of one token on one GPU; ``tp`` GPUs."""
    m, bt = c.model, c.engine.block_tokens
    n = m.n_layers or 0
    local, linear = m.window_layers, m.linear_layers
    if not (local or linear):
        return 0, n, n, 0.0, 0.0
    full = n - local - linear
    kinds = [x for x in (full, local, linear) if x]
    size = max(kinds) if max(kinds) < 1.5 * min(kinds) else min(kinds)  # layers per group

    def groups(layers):
        return -(-layers // size)
    layer = kv_gpu / n
    chunked = m.window_kind == "chunked"
    held = 0
    if local:  # a window group: the window's tokens before the newest and the newest's block; a chunk's blocks
        held += groups(local) * (-(-m.window_tokens // bt) if chunked else -(-(m.window_tokens - 1) // bt) + 1)
    if linear:  # a state in whole blocks of one layer's KV
        held += groups(linear) * math.ceil(m.linear_state_bytes / tp / (layer * bt))
    reach = m.window_tokens / 2 if chunked else float(m.window_tokens or 0)
    row = local * reach * layer + 2 * linear * m.linear_state_bytes / tp
    return -(-held // groups(full)), full, size * groups(full), row, local * reach


def kv_per_gpu(c: Config, tp: int) -> float:
    """KV bytes of one token one GPU of ``tp`` holds: the KV heads split over the tp GPUs, each
    GPU holding ceil(kv_heads / tp) of them (replicated when tp exceeds them); MLA's latent whole
    on every GPU; without kv_heads, an even split."""
    m = c.model
    if m.kv_lora_rank:
        return m.kv_bytes_per_token
    return (m.kv_bytes_per_token * math.ceil(m.kv_heads / tp) / m.kv_heads if m.kv_heads is not None
            else m.kv_bytes_per_token / tp)


def sized(c: Config, tokens: int) -> Config:
    """``c`` with a KV cache (``engine.kv_cache_gb``) of just enough blocks for a request of
    ``tokens`` tokens, and those a hybrid-attention model's request holds beyond them."""
    m, e = c.model, c.engine
    kv_gpu = kv_per_gpu(c, e.tp)
    fixed, _, page, _, _ = hybrid(c, kv_gpu, e.tp)
    n = m.n_layers or 1
    if e.speculative is not None:  # its last verification's slots beyond its last token
        tokens += max(e.speculative.span - 2, 0)
    blocks = -(-tokens // e.block_tokens) + fixed
    share = (page / n if fixed else 1) + draft_kv_share(e.speculative, m)  # (a draft's layers' KV too)
    return c.with_values({"engine.kv_cache_gb": blocks * e.block_tokens * e.tp * kv_gpu * share
                          / 1e9 * (1 + 1e-12)})


def oracle_engine(c: Config, prefill: bool = False) -> oracle_serving.Engine:
    """The oracle's engine, with the docs' formulas written out again (not fastsim's). With
    ``prefill``, a prefill replica's: ``fleet.prefill_hardware`` (a preset), ``prefill_tp`` and
    ``prefill_max_batched_tokens`` (default the engine's), every request of output 1; a decode
    replica (a prefill pool exists, not ``prefill``) pins no prefix."""
    hw, m, e, cal, w, f = c.hardware, c.model, c.engine, c.calibration, c.workload, c.fleet
    if prefill:
        if f.prefill_hardware is not None:
            hw = Hardware.model_validate({"preset": f.prefill_hardware})
        e = e.model_copy(update={"tp": f.prefill_tp or e.tp,
                                 "max_batched_tokens": f.prefill_max_batched_tokens or e.max_batched_tokens})
    overhead = (cal.step_overhead_ms / 1e3 + (cal.layer_overhead_us * 1e-6 * m.n_layers if m.n_layers else 0.0)
                + cal.moe_layer_overhead_us * 1e-6 * m.moe_layers)
    mla = m.kv_lora_rank > 0
    kv_gpu = kv_per_gpu(c, e.tp)  # and its memory holding whole tokens
    peak = {"bf16": hw.peak_tflops, "fp8": hw.peak_tflops_fp8, "fp4": hw.peak_tflops_fp4, "mxfp4": hw.peak_tflops_fp4,
            "int4": None}[m.dtype] or hw.peak_tflops  # (int4 is weight-only: the bf16 peak)
    free = hw.peak_tflops is None or m.params_b is None
    comm_fixed = comm_token = 0.0
    nodes = 1 if hw.scaleup_gpus is None or e.tp <= hw.scaleup_gpus else e.tp // hw.scaleup_gpus
    if nodes > 1:  # tp spans scale-up domains: within each a reduce-scatter and an all-gather over the link,
        # between them a ring all-reduce of a domain's share over the network; an exchange sends each
        # token's k copies to the other GPUs, over the link and the network at once
        inside = e.tp // nodes
        token = m.hidden * 2  # bytes of one token's activations
        all_reduce = (2 * (inside - 1) / inside * token / (hw.link_gb_s * 1e9)
                      + 2 * (nodes - 1) / nodes * (token / inside) / (hw.scaleout_gb_s * 1e9))
        hop = hw.link_latency_us * 1e-6 + 2 * (nodes - 1) * hw.scaleout_latency_us * 1e-6
        if e.expert_parallel:
            copies = m.experts_per_token * token
            dispatch = max(copies * (inside - 1) / e.tp / (hw.link_gb_s * 1e9),
                           copies * (e.tp - inside) / e.tp / (hw.scaleout_gb_s * 1e9))
            comm_fixed = (2 * m.n_layers + m.moe_layers) * hop
            comm_token = (2 * m.n_layers - m.moe_layers) * all_reduce + m.moe_layers * 2 * dispatch
        else:
            comm_fixed = 2 * m.n_layers * hop
            comm_token = 2 * m.n_layers * all_reduce
    elif e.tp > 1:
        all_reduce = 2 * (e.tp - 1) / e.tp * m.hidden * 2 / (hw.link_gb_s * 1e9)
        if e.expert_parallel:  # each MoE layer: one all-reduce, a dispatch and a combine
            dispatch = (e.tp - 1) / e.tp * m.experts_per_token * m.hidden * 2 / (hw.link_gb_s * 1e9)
            comm_fixed = (2 * m.n_layers + m.moe_layers) * hw.link_latency_us * 1e-6
            comm_token = (2 * m.n_layers - m.moe_layers) * all_reduce + m.moe_layers * 2 * dispatch
        else:
            comm_fixed = 2 * m.n_layers * hw.link_latency_us * 1e-6
            comm_token = 2 * m.n_layers * all_reduce
    fixed, full, page, row, window_pairs = hybrid(c, kv_gpu, e.tp)
    hybrid_model = bool(m.window_layers or m.linear_layers)
    share, read_share = (page / m.n_layers, full / m.n_layers) if hybrid_model else (1.0, 1)
    index_pair_flops, index_flops = 0.0, None
    if m.sparse_topk is not None:  # sparse attention: every token's indexer key read and scored, top-k latents
        index = m.index_head_dim + 4 * math.ceil(m.index_head_dim / 128)  # attended (the latent whole on each GPU)
        latent = m.kv_bytes_per_token / m.n_layers - index
        read_share = index / (index + latent)
        row += m.n_layers * m.sparse_topk * latent
        window_pairs, full = m.n_layers * m.sparse_topk, 0
        index_pair_flops = m.n_layers * 2 * m.index_heads * m.index_head_dim
        index_flops = None if free else (hw.peak_tflops_fp8 or hw.peak_tflops) * 1e12 * cal.compute_efficiency
    cost = oracle_serving.StepCost(
        overhead_s=overhead, weight_bytes=m.weight_gb * 1e9,
        expert_bytes=m.moe_layers * m.experts * m.expert_gb * 1e9 if m.experts else 0.0,
        k_over_e=m.experts_per_token / m.experts if m.experts else 0.0, kv_gpu=kv_gpu * read_share, tp=e.tp,
        gpu_bytes_s=hw.mem_bandwidth_tb_s * 1e12 * cal.bandwidth_efficiency,
        params_b=None if free else m.params_b,
        dtype_flops=None if free else peak * 1e12 * cal.compute_efficiency,
        bf16_flops=None if free else hw.peak_tflops * 1e12 * cal.compute_efficiency,
        n_layers=full, attn_dim=m.attn_dim or 0, hidden=m.hidden or 0, vocab=m.vocab,
        comm_fixed_s=comm_fixed, comm_s_per_token=comm_token, row_gpu=row, window_pairs=window_pairs,
        index_pair_flops=index_pair_flops, index_flops=index_flops)
    spec = e.speculative
    draft_weights = draft_kv = 0.0
    if spec is not None:  # k draft passes, each one layer of the model (mtp, eagle) or a draft model's share
        if spec.method in ("mtp", "eagle"):
            layers = spec.draft_layers or (m.mtp_layers if spec.method == "mtp" else 1)
            pass_share = draft_kv = layers / m.n_layers
            draft_weights = m.weight_gb * pass_share
        elif spec.method == "draft":
            from fastsim.model import hf_config, presets
            shape = hf_config.read(presets.MODELS.get(spec.draft_model, spec.draft_model))
            pass_share = shape.active / (m.params_b * 1e9)
            fields = shape.fields()
            draft_weights, draft_kv = fields["weight_gb"], fields["kv_bytes_per_token"] / m.kv_bytes_per_token
        else:
            pass_share = 0.0
        cost = dataclasses.replace(cost, draft_scale=1 + spec.tokens * pass_share, fixed_s=cal.step_overhead_ms / 1e3)
    share += draft_kv  # (a draft's layers hold KV too)
    weights = m.weight_gb + draft_weights
    gb = e.kv_cache_gb if e.kv_cache_gb is not None else (
        None if hw.mem_gb is None else e.tp * (hw.mem_gb * e.gpu_memory_utilization - e.reserved_gb) - weights)
    # (a hybrid model's blocks span its full-attention groups' layers: ``share`` of every layer's KV)
    blocks = None if gb is None else math.floor(gb * 1e9 / (e.block_tokens * m.kv_bytes_per_token * share))
    if (m.kv_heads is not None or mla) and gb is not None:  # heads known: tokens one GPU holds, then whole blocks
        tokens = e.kv_cache_gb * 1e9 / (e.tp * kv_gpu * share) if e.kv_cache_gb is not None else (
            (hw.mem_gb * e.gpu_memory_utilization - e.reserved_gb - weights / e.tp) * 1e9 / (kv_gpu * share))
        blocks = math.floor(math.floor(tokens) / e.block_tokens)
    return oracle_serving.Engine(
        policy=e.policy, limit=e.limit, window_s=e.window_ms / 1000 if e.policy == "dynamic" else math.inf,
        budget=math.inf if e.max_batched_tokens is None else e.max_batched_tokens, blocks=blocks,
        block_tokens=e.block_tokens, alloc=e.kv_alloc,
        prefix_blocks=0 if f.prefill_replicas and not prefill else w.prefix_tokens // e.block_tokens,
        max_output=1 if prefill else (w.output.value if w.output.dist == "fixed" else w.output.max), cost=cost,
        api_s=cal.api_overhead_ms / 1000, lookahead=e.async_scheduling and e.policy == "continuous",
        fixed_blocks=fixed if blocks is not None else 0,
        **(dict(spec_tokens=spec.tokens, spec_span=1 + spec.tokens + (spec.tokens if spec.method != "ngram" else 0),
                spec_accept=tuple(spec.per_position()), spec_seed=oracle_serving.spec_seed(w.seed)) if spec else {}),
    )


@st.composite
def serving_configs(draw) -> Config:
    policy = draw(st.sampled_from(["static", "dynamic", "continuous"]))
    max_batch = draw(st.integers(1, 8))
    prompt = draw(st.integers(1, 300))
    o_max = draw(st.integers(1, 40))
    bt = draw(st.sampled_from([1, 2, 4, 16]))
    v = {
        "engine.policy": policy,
        "engine.max_batch": max_batch,
        "engine.max_concurrent": draw(st.none() | st.integers(1, 8)),
        "engine.window_ms": draw(st.sampled_from([0.0, 1.0, 50.0])),
        "engine.block_tokens": bt,
        "engine.kv_alloc": draw(st.sampled_from(["paged", "reserve"])),
        "workload.n_requests": draw(st.integers(1, 50)),
        "workload.rate": draw(st.floats(1.0, 3000.0)),
        "workload.seed": draw(st.integers(0, 2**32)),
        "workload.rng": draw(st.sampled_from(["stdlib", "numpy"])),
        "workload.prompt.value": prompt,
        "workload.output.dist": draw(st.sampled_from(["lognormal", "fixed"])),
        "workload.output.mu": draw(st.floats(0.0, min(3.5, math.log(o_max)))),  # a median within max
        "workload.output.max": o_max,
        "workload.output.value": draw(st.integers(1, o_max)),
        "hardware.peak_tflops": draw(st.sampled_from([None, 1.0, 50.0, 989.0])),
        "model.params_b": draw(st.sampled_from([None, 8.0, 70.0])),
        "model.n_layers": 32,
        "model.attn_dim": 4096,
        "model.hidden": 4096,
        "engine.tp": draw(st.sampled_from([1, 1, 2, 4, 8])),
        "model.kv_heads": draw(st.sampled_from([None, 2, 8])),  # with tp 4 or 8 over 2 heads: replicated
        "hardware.link_gb_s": 450.0,
        "hardware.link_latency_us": draw(st.sampled_from([0.0, 5.0])),
        # a tp group over several scale-up domains, joined by a network
        "hardware.scaleup_gpus": draw(st.sampled_from([None, None, 2, 4])),
        "hardware.scaleout_gb_s": 50.0,
        "hardware.scaleout_latency_us": draw(st.sampled_from([0.0, 10.0])),
        "calibration.step_overhead_ms": draw(st.sampled_from([0.0, 0.0, 1.5])),
        "calibration.layer_overhead_us": draw(st.sampled_from([0.0, 0.0, 30.0])),
        "calibration.api_overhead_ms": draw(st.sampled_from([0.0, 0.0, 20.0])),
        "calibration.compute_efficiency": draw(st.sampled_from([1.0, 0.5])),
        "calibration.bandwidth_efficiency": draw(st.sampled_from([1.0, 0.8])),
        # models as deployed: the LM head per sampled token, precisions and their peaks, MLA
        "model.vocab": draw(st.sampled_from([None, None, 32000, 151936])),
        "model.dtype": draw(st.sampled_from(["bf16", "fp8", "fp4", "mxfp4", "int4"])),
        "hardware.peak_tflops_fp8": draw(st.sampled_from([None, 1979.0])),
        "hardware.peak_tflops_fp4": draw(st.sampled_from([None, 9000.0])),
        "model.kv_lora_rank": draw(st.sampled_from([0, 0, 0, 512])),
        "engine.async_scheduling": draw(st.booleans()),
    }
    if draw(st.booleans()):  # a mixture of experts: E routed, k picked, in some layers, maybe spread over tp
        experts = draw(st.sampled_from([2, 8, 128]))
        moe_layers = draw(st.integers(1, 32))
        v.update({"model.experts": experts, "model.experts_per_token": draw(st.integers(1, min(experts, 8))),
                  "model.moe_layers": moe_layers, "engine.expert_parallel": draw(st.booleans()),
                  "model.expert_gb": 15.008 * draw(st.sampled_from([0.3, 0.9])) / (moe_layers * experts),
                  "calibration.moe_layer_overhead_us": draw(st.sampled_from([0.0, 60.0]))})
    if v["workload.rng"] == "numpy":  # prompts from a distribution, other arrival processes
        v["workload.arrival"] = draw(st.sampled_from(["poisson", "gamma", "constant"]))
        v["workload.burstiness"] = draw(st.sampled_from([0.2, 1.0, 5.0]))
        v["workload.output.dist"] = draw(st.sampled_from(["fixed", "lognormal", "uniform"]))
        v["workload.prompt.dist"] = draw(st.sampled_from(["fixed", "lognormal", "uniform"]))
        v["workload.prompt.mu"] = draw(st.floats(min(2.0, math.log(prompt)), min(5.5, math.log(prompt))))
        v["workload.prompt.min"] = draw(st.integers(1, prompt))
        v["workload.prompt.max"] = prompt
    limit = max_batch if v["engine.max_concurrent"] is None else min(max_batch, v["engine.max_concurrent"])
    if draw(st.booleans()):
        v["engine.max_batched_tokens"] = draw(st.integers(limit, 400))
    if v["model.kv_lora_rank"] and draw(st.booleans()):  # DeepSeek's sparse attention over the latent cache
        v.update({"model.sparse_topk": draw(st.integers(1, 300)), "model.index_heads": draw(st.sampled_from([8, 64])),
                  "model.index_head_dim": draw(st.sampled_from([64, 128]))})
    elif draw(st.integers(0, 3)) == 0:  # hybrid attention: local (sliding or chunked) or linear-attention layers
        kind = draw(st.sampled_from(["sliding", "chunked", "linear"]))
        if kind == "linear":
            v.update({"model.linear_layers": draw(st.integers(1, 31)),
                      "model.linear_state_bytes": draw(st.sampled_from([1e4, 1e5, 3e6]))})
        else:
            v.update({"model.window_layers": draw(st.integers(1, 31)), "model.window_tokens": draw(st.integers(1, 64)),
                      "model.window_kind": kind})
    if draw(st.integers(0, 3)) == 0:  # speculative decoding (continuous batching, paged KV, a budget for it)
        k = draw(st.integers(1, 4))
        v.update({"engine.policy": "continuous", "engine.kv_alloc": "paged", "engine.speculative": {
            "method": draw(st.sampled_from(["mtp", "eagle", "ngram"])), "tokens": k,
            "acceptance": draw(st.sampled_from([0.0, 1.0, 0.7]) | st.lists(st.sampled_from([0.3, 0.9, 1.0]),
                                                                              min_size=1, max_size=k))}})
        if v["engine.speculative"]["method"] == "mtp":
            v["engine.speculative"]["draft_layers"] = draw(st.integers(1, 2))
        if "engine.max_batched_tokens" in v:
            v["engine.max_batched_tokens"] = max(v["engine.max_batched_tokens"], limit * (1 + k))
    if draw(st.booleans()):
        shortest = v.get("workload.prompt.min", prompt) if v.get("workload.prompt.dist", "fixed") != "fixed" else prompt
        v["workload.prefix_tokens"] = draw(st.integers(0, max(0, shortest - 1)))
    config = Config().with_values(v)
    if draw(st.integers(0, 9)) < 7:  # a KV cache from just enough for the longest request to 3x
        config = sized(config, draw(st.integers(prompt + o_max, 3 * (prompt + o_max))))
    return config




@st.composite
def fleet_configs(draw) -> Config:
    """A serving config (:func:`serving_configs`) behind a random fleet: replicas, router (static
    ones for static and dynamic batching), and for continuous batching maybe a prefill pool with
    its own tp, hardware, budget and a fast or slow KV link."""
    base = draw(serving_configs())
    continuous = draw(st.integers(0, 3)) > 0 or base.engine.policy == "continuous"
    routers = ["round_robin", "random", "least_outstanding", "least_kv"] if continuous else ["round_robin", "random"]
    replicas = draw(st.integers(1, 4))
    v = {"fleet.replicas": replicas, "fleet.router": draw(st.sampled_from(routers)),
         "workload.rate": base.workload.rate * replicas}  # each replica as loaded as one engine
    if continuous:
        v["engine.policy"] = "continuous"
        if draw(st.integers(0, 2)) == 0:  # short prompts, long outputs, a cache for one or two: preemption
            prompt, output, bt = draw(st.integers(1, 24)), draw(st.integers(8, 40)), base.engine.block_tokens
            tokens = (prompt + output) * draw(st.sampled_from([1, 2]))
            v.update({"workload.prompt.dist": "fixed", "workload.prompt.value": prompt, "workload.prefix_tokens": 0,
                      "workload.output.dist": "fixed", "workload.output.value": output, "workload.output.max": output,
                      "engine.kv_alloc": "paged", "workload.rate": 3000.0, "engine.max_batch": draw(st.integers(2, 8)),
                      "engine.max_concurrent": None, "engine.max_batched_tokens": None})
            base = sized(base.with_values(v), tokens)
    if continuous and draw(st.booleans()):
        v["fleet.prefill_replicas"] = draw(st.integers(1, 3))
        v["fleet.prefill_tp"] = draw(st.sampled_from([None, 1, 2]))
        v["fleet.prefill_hardware"] = draw(st.sampled_from([None, "h100-sxm", "b200", "l40s"]))
        if draw(st.booleans()):
            v["fleet.prefill_max_batched_tokens"] = draw(st.integers(base.engine.limit, 600))
        v["fleet.kv_link_gb_s"] = draw(st.sampled_from([50.0, 0.05]))
        v["fleet.kv_link_latency_ms"] = draw(st.sampled_from([0.0, 2.0]))
    return base.with_values(v)


def fleet_oracle(config: Config, traffic, routes=None, prefill_routes=None) -> dict:
    """The fleet oracle on ``traffic``, its engines built from ``config`` (the random router's
    draws come with the traffic: they are the simulator's input, like arrivals)."""
    f, m = config.fleet, config.model
    layer = m.kv_bytes_per_token / m.n_layers if m.n_layers else 0.0
    full = m.n_layers - m.window_layers - m.linear_layers if m.n_layers else 0
    fleet = oracle_fleet.Fleet(
        replicas=f.replicas, router=f.router, prefill_replicas=f.prefill_replicas,
        prefill=oracle_engine(config, prefill=True) if f.prefill_replicas else None,
        link_latency_s=f.kv_link_latency_ms * 1e-3, link_bytes_per_s=f.kv_link_gb_s * 1e9,
        kv_bytes_per_token=layer * full if m.n_layers else m.kv_bytes_per_token,
        window_bytes_per_token=layer * m.window_layers, window_tokens=m.window_tokens or 0,
        state_bytes=m.linear_layers * m.linear_state_bytes)
    return oracle_fleet.simulate_fleet(traffic.arrival_s.tolist(), traffic.prompt_tokens.tolist(),
                                       traffic.output_tokens.tolist(), oracle_engine(config), fleet,
                                       None if routes is None else routes.tolist(),
                                       None if prefill_routes is None else prefill_routes.tolist())


@st.composite
def dp_configs(draw) -> Config:
    """A continuous-batching mixture of experts (:func:`serving_configs`) on replicas of
    ``engine.dp`` lock-step ranks, experts over all of them, behind a router."""
    base = draw(serving_configs())
    experts = draw(st.sampled_from([2, 8, 128]))
    moe_layers = draw(st.integers(1, 32))
    dp = draw(st.integers(2, 4))
    v = {"engine.policy": "continuous", "engine.dp": dp, "engine.expert_parallel": True,
         "model.experts": experts, "model.experts_per_token": draw(st.integers(1, min(experts, 8))),
         "model.moe_layers": moe_layers,
         "model.expert_gb": 15.008 * draw(st.sampled_from([0.3, 0.9])) / (moe_layers * experts),
         "workload.rate": base.workload.rate * dp}
    replicas = draw(st.sampled_from([1, 1, 2, 3]))
    if replicas > 1:
        v.update({"fleet.replicas": replicas, "workload.rate": v["workload.rate"] * replicas,
                  "fleet.router": draw(st.sampled_from(["round_robin", "random", "least_outstanding", "least_kv"]))})
    if draw(st.booleans()):  # the exchange beyond a scale-up domain: over the network
        v["hardware.scaleup_gpus"] = draw(st.sampled_from([None, base.engine.tp]))
    if (v.get("hardware.scaleup_gpus", base.hardware.scaleup_gpus) or 0) and base.engine.tp * dp > (
            v.get("hardware.scaleup_gpus", base.hardware.scaleup_gpus)):
        g = v.get("hardware.scaleup_gpus", base.hardware.scaleup_gpus)
        if (base.engine.tp * dp) % g:
            v["hardware.scaleup_gpus"] = None
    return base.with_values(v)


def dp_oracle(c: Config) -> tuple[oracle_serving.Engine, "oracle_dp.RankCost"]:
    """The lock-step oracle's rank engine and cost for ``c``, the docs' formulas written out
    again: a rank's GPUs hold the dense weights and 1/dp of the routed experts (its KV cache
    from what that leaves); per layer all-reduces within the rank's tp GPUs (every attention's,
    dense layers' MLPs'), and per MoE layer a dispatch and a combine of k copies of each of the
    rank's tokens over all dp x tp GPUs."""
    hw, m, e, cal = c.hardware, c.model, c.engine, c.calibration
    routed = m.moe_layers * m.experts * m.expert_gb
    rank_gb = m.weight_gb - routed + routed / e.dp
    engine = oracle_engine(c)
    base = engine.cost
    _, _, page, _, _ = hybrid(c, kv_per_gpu(c, e.tp), e.tp)
    share = page / m.n_layers if m.window_layers or m.linear_layers else 1  # a block's layers (hybrid attention)
    token = m.hidden * 2
    comm_fixed = comm_token = 0.0
    reduces = 2 * m.n_layers - m.moe_layers
    if e.tp > 1:
        nodes = 1 if hw.scaleup_gpus is None or e.tp <= hw.scaleup_gpus else e.tp // hw.scaleup_gpus
        inside = e.tp // nodes
        all_reduce = 2 * (inside - 1) / inside * token / (hw.link_gb_s * 1e9)
        if nodes > 1:
            all_reduce += 2 * (nodes - 1) / nodes * (token / inside) / (hw.scaleout_gb_s * 1e9)
        comm_fixed = reduces * (hw.link_latency_us + 2 * (nodes - 1) * hw.scaleout_latency_us) * 1e-6
        comm_token = reduces * all_reduce
    group = e.dp * e.tp
    nodes = 1 if hw.scaleup_gpus is None or group <= hw.scaleup_gpus else group // hw.scaleup_gpus
    inside = group // nodes
    copies = m.experts_per_token * token
    exchange = copies * (inside - 1) / group / (hw.link_gb_s * 1e9)
    if nodes > 1:
        exchange = max(exchange, copies * (group - inside) / group / (hw.scaleout_gb_s * 1e9))
    comm_fixed += 2 * m.moe_layers * (hw.link_latency_us + 2 * (nodes - 1) * hw.scaleout_latency_us) * 1e-6
    comm_token += 2 * m.moe_layers * exchange
    bytes_per = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5625, "mxfp4": 0.53125, "int4": 0.5625}[m.dtype]
    cost = oracle_dp.RankCost(
        overhead_s=base.overhead_s, dense_bytes=(m.weight_gb - routed) * 1e9, expert_bytes=routed * 1e9,
        k_over_e=m.experts_per_token / m.experts, kv_gpu=base.kv_gpu, tp=e.tp, dp=e.dp, gpu_bytes_s=base.gpu_bytes_s,
        params_b=base.params_b, expert_params_b=m.moe_layers * m.experts_per_token * m.expert_gb / bytes_per,
        dtype_flops=base.dtype_flops, bf16_flops=base.bf16_flops, n_layers=base.n_layers, attn_dim=base.attn_dim,
        hidden=base.hidden, vocab=base.vocab, comm_fixed_s=comm_fixed, comm_s_per_token=comm_token,
        row_gpu=base.row_gpu, window_pairs=base.window_pairs, index_pair_flops=base.index_pair_flops,
        index_flops=base.index_flops, draft_scale=base.draft_scale, fixed_s=base.fixed_s)
    if e.speculative is not None:  # a draft's layers: their weights on every rank, their KV in each block
        layers = e.speculative.draft_layers or (m.mtp_layers if e.speculative.method == "mtp" else 1)
        share += layers / m.n_layers if e.speculative.method in ("mtp", "eagle") else 0.0
        rank_gb += m.weight_gb * layers / m.n_layers if e.speculative.method in ("mtp", "eagle") else 0.0
    if e.kv_cache_gb is None and hw.mem_gb is not None:  # the rank's memory after its weights
        gb = e.tp * (hw.mem_gb * e.gpu_memory_utilization - e.reserved_gb) - rank_gb
        blocks = math.floor(gb * 1e9 / (e.block_tokens * m.kv_bytes_per_token * share))
        if m.kv_heads is not None or m.kv_lora_rank:
            tokens = ((hw.mem_gb * e.gpu_memory_utilization - e.reserved_gb - rank_gb / e.tp) * 1e9
                      / (kv_per_gpu(c, e.tp) * share))
            blocks = math.floor(math.floor(tokens) / e.block_tokens)
        engine = dataclasses.replace(engine, blocks=blocks)
    return dataclasses.replace(engine, cost=None), cost
