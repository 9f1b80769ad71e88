"""The cost model: what one engine step takes and how much KV cache an engine has.

Step time over the rows a step schedules (row i has ``c_i`` tokens computed before the step and
gets ``n_i`` more): N = sum n_i tokens computed, C = sum (c_i + n_i) KV tokens read,
A = sum n_i (2 c_i + n_i + 1) / 2 query-key pairs of attention, S the rows that emit a token, and

    step = overhead + max(t_weights - t_experts q^N + t_kv C + t_row S,  t_token N + t_pair A + t_sample S)
           + (t_link + t_link_token N)

where the overhead is ``calibration.step_overhead_ms`` plus ``calibration.layer_overhead_us`` per
layer (the fixed latencies of each layer's kernels, the same on every tensor-parallel GPU),

the roofline of memory (weights and KV read; of a mixture of experts' routed experts, the share
q^N = (1 - k/E)^N that no token of the step picks is not read) against compute (2 FLOPs per
parameter per token at the dtype's peak, 4 attn_dim FLOPs per query-key pair per layer, and the
LM head's 2 hidden vocab FLOPs per sampled row), plus two all-reduces per layer under tensor
parallelism (expert parallelism: a MoE layer's second becomes a dispatch and a combine).

A hybrid-attention model (:mod:`.kv_groups`) reads C and forms A in its full-attention layers
only; each sampled row reads a window's KV in each local layer and its state (read and written)
in each linear-attention layer (``t_row``), and each token computed forms a window's pairs in
each local layer (in ``t_token``). Sparse attention (:func:`_sparse`) reads C's indexer keys and
scores A's pairs in its indexer, and reads and attends to top-k latents per row and token.

With attention data parallelism (``engine.dp`` ranks of tp GPUs, experts over all dp x tp of
them) the ranks step in lock-step: each rank's GPUs read their own dense weights, their share
1/dp of the routed experts (less those no token of any rank picks) and their own requests' KV,
and compute their own tokens through the dense layers and their share of every rank's tokens
through the experts; a step takes the overhead plus the slowest rank's roofline and exchange
(:func:`rank_time`, :func:`group_step_time`). The
coefficients are folded once per run (:func:`coefficients`); the lesson's model is every
coefficient zero but the first two, and then a step costs exactly ``t_weights + t_kv C``, the
same floating-point operations as the lesson.
"""

from __future__ import annotations

import math

import numpy as np

from .._jit import inline
from .fields import LARGEST, ConfigError
from . import kv_groups, speculative
from .hf_config import WEIGHT_BYTES
from .schema import Config

# Indices into the coefficient vector a kernel gets.
(OVERHEAD, T_WEIGHTS, T_KV, T_TOKEN, T_PAIR, T_LINK, T_LINK_TOKEN, T_SAMPLE, T_EXPERTS,
 UNPICKED, T_EXPERT_TOKEN, RANKS, T_ROW) = range(13)
N_COEFFICIENTS = 13
LOW = (1 << 32) - 1  # a data-parallel step's record packs every rank's tokens above its sampled rows


def peak_tflops(config: Config) -> float | None:
    """The dense peak the linear layers run at: the GPU's peak for the model's dtype, or its bf16
    peak where it has none for that dtype (weights dequantised, as vLLM's weight-only kernels; int4
    is weight-only everywhere)."""
    hw = config.hardware
    own = {"fp8": hw.peak_tflops_fp8, "fp4": hw.peak_tflops_fp4, "mxfp4": hw.peak_tflops_fp4}.get(config.model.dtype)
    return own if own is not None and hw.peak_tflops is not None else hw.peak_tflops


def coefficients(config: Config) -> np.ndarray:
    """The step-time coefficients of ``config`` (seconds, per token, pair or sampled row; the
    expected unread experts' share), float64 (N_COEFFICIENTS,)."""
    hw, m, e, cal = config.hardware, config.model, config.engine, config.calibration
    bandwidth = hw.mem_bandwidth_tb_s * 1e12 * cal.bandwidth_efficiency * e.tp  # bytes/s, all GPUs
    k = np.zeros(N_COEFFICIENTS)
    k[RANKS] = e.dp
    # a fixed time per step, and per layer of it (kernel latencies: every GPU runs each layer)
    k[OVERHEAD] = (cal.step_overhead_ms / 1e3 + cal.layer_overhead_us * 1e-6 * (m.n_layers or 0)
                   + cal.moe_layer_overhead_us * 1e-6 * m.moe_layers)
    k[T_WEIGHTS] = m.weight_gb * 1e9 / bandwidth
    if m.experts:  # routed experts no token of a step picks are not read: (1 - k/E)^N of them
        k[T_EXPERTS] = m.moe_layers * m.experts * m.expert_gb * 1e9 / bandwidth
        # ln(1 - k/E): the share unread is exp(N ln(1 - k/E)), one call (an integer power inlines a
        # loop into every kernel that slowed steps without experts too); -inf when every expert is picked
        k[UNPICKED] = math.log1p(-m.experts_per_token / m.experts) if m.experts_per_token < m.experts else -math.inf
    # each GPU reads the KV of the heads it holds (:func:`kv_bytes_per_gpu`)
    k[T_KV] = m.kv_bytes_per_token / bandwidth if not replicated(config) else kv_bytes_per_gpu(config) / (bandwidth / e.tp)
    k[T_KV] *= _full_share(config)  # (1.0 but for a hybrid-attention model: its full-attention layers')
    if m.hybrid:  # a sampled row's window of KV in each local layer, its state (read
        # and written) in each linear one
        k[T_ROW] = row_bytes_per_gpu(config) / (bandwidth / e.tp)
    if hw.peak_tflops is not None and m.params_b is not None:
        flops = hw.peak_tflops * 1e12 * cal.compute_efficiency * e.tp  # FLOP/s, all GPUs, bf16
        k[T_TOKEN] = 2e9 * m.params_b / (peak_tflops(config) * 1e12 * cal.compute_efficiency * e.tp)
        if m.n_layers is not None and m.attn_dim is not None:
            k[T_PAIR] = 4 * (m.n_layers - m.window_layers - m.linear_layers) * m.attn_dim / flops
            if m.window_layers:  # each token's pairs with a window in each local layer
                k[T_TOKEN] += 4 * m.window_layers * m.attn_dim * kv_groups.reach(m.window_tokens, m.window_kind) / flops
        if m.vocab is not None:  # the LM head, where a token is sampled
            k[T_SAMPLE] = 2 * m.hidden * m.vocab / flops
    if m.sparse_topk is not None:
        _sparse(config, k, bandwidth)
    span = domains(config)
    if e.tp > 1 and span > 1:  # over several scale-up domains: hierarchical collectives
        g = e.tp // span  # GPUs of the group in each domain
        link = m.hidden * 2 / (hw.link_gb_s * 1e9)  # one token's BF16 activations over the link, and
        net = m.hidden * 2 / (hw.scaleout_gb_s * 1e9)  # over the network
        # reduce-scatter and all-gather within each domain, an all-reduce of 1/g of it between domains
        all_reduce = 2 * (g - 1) / g * link + 2 * (span - 1) / span * net / g
        latency = (hw.link_latency_us + 2 * (span - 1) * hw.scaleout_latency_us) * 1e-6  # a ring over domains
        if e.expert_parallel:  # k copies of each token, those to other domains over the network, at once
            dispatch = m.experts_per_token * max((g - 1) / e.tp * link, (e.tp - g) / e.tp * net)
            k[T_LINK] = (2 * m.n_layers + m.moe_layers) * latency
            k[T_LINK_TOKEN] = (2 * m.n_layers - m.moe_layers) * all_reduce + m.moe_layers * 2 * dispatch
        else:
            k[T_LINK] = 2 * m.n_layers * latency
            k[T_LINK_TOKEN] = 2 * m.n_layers * all_reduce
    elif e.tp > 1:  # per layer two all-reduces of N x hidden BF16 values (ring: 2 (tp-1)/tp of it moves)
        per_value = m.hidden * 2 / (hw.link_gb_s * 1e9)
        if e.expert_parallel:  # a MoE layer's MLP all-reduce becomes a dispatch and a combine of k copies
            k[T_LINK] = (2 * m.n_layers + m.moe_layers) * hw.link_latency_us * 1e-6
            k[T_LINK_TOKEN] = ((2 * m.n_layers - m.moe_layers) * 2 * (e.tp - 1) / e.tp * per_value
                               + m.moe_layers * 2 * (e.tp - 1) / e.tp * m.experts_per_token * per_value)
        else:
            k[T_LINK] = 2 * m.n_layers * hw.link_latency_us * 1e-6
            k[T_LINK_TOKEN] = 2 * m.n_layers * 2 * (e.tp - 1) / e.tp * m.hidden * 2 / (hw.link_gb_s * 1e9)
    if e.dp > 1:
        _data_parallel(config, k)
    if e.speculative is not None:  # k draft passes, each a share of the step (:mod:`.speculative`)
        scale = 1 + e.speculative.tokens * speculative.draft_share(e.speculative, m)
        fixed = cal.step_overhead_ms / 1e3
        k[OVERHEAD] = fixed + (k[OVERHEAD] - fixed) * scale
        for c in (T_WEIGHTS, T_KV, T_TOKEN, T_PAIR, T_LINK, T_LINK_TOKEN, T_SAMPLE, T_EXPERTS, T_EXPERT_TOKEN, T_ROW):
            k[c] *= scale
    return k


def _sparse(config: Config, k: np.ndarray, bandwidth: float) -> None:
    """``k`` for DeepSeek's sparse attention: every layer holds each token's latent and indexer
    key, but a query attends to ``sparse_topk`` latents only. A step reads every token's key
    (``T_KV``'s share of the bytes) and scores each query-key pair in the indexer (2 index_heads
    index_head_dim FLOPs, at the FP8 peak where the GPU has one: ``T_PAIR``); each sampled row
    reads top-k latents (``T_ROW``), each token computed forms top-k pairs of attention
    (``T_TOKEN``)."""
    hw, m, e, cal = config.hardware, config.model, config.engine, config.calibration
    index = m.index_head_dim + 4 * -(-m.index_head_dim // 128)  # fp8 and a 4-byte scale per 128 values
    latent = m.kv_bytes_per_token / m.n_layers - index  # one layer's latent of a token
    k[T_KV] *= index / (index + latent)
    k[T_ROW] += m.n_layers * m.sparse_topk * latent / (bandwidth / e.tp)  # (the latent is whole on every GPU)
    if k[T_PAIR]:
        peak = hw.peak_tflops_fp8 if hw.peak_tflops_fp8 is not None else hw.peak_tflops
        k[T_PAIR] = m.n_layers * 2 * m.index_heads * m.index_head_dim / (peak * 1e12 * cal.compute_efficiency * e.tp)
        k[T_TOKEN] += 4 * m.n_layers * m.attn_dim * m.sparse_topk / (hw.peak_tflops * 1e12 * cal.compute_efficiency
                                                                      * e.tp)


def _data_parallel(config: Config, k: np.ndarray) -> None:
    """``k`` as one rank of ``engine.dp`` reads it (the module docstring): the routed experts'
    weights and compute a 1/dp share over every rank's tokens (``T_EXPERTS``, ``T_EXPERT_TOKEN``),
    the rest over the rank's own; per layer the tensor-parallel all-reduces within the rank (the
    attention's, and the MLP's of dense layers) and a dispatch and a combine of k copies of each
    of the rank's tokens over all dp x tp GPUs (hierarchical beyond a scale-up domain)."""
    hw, m, e, cal = config.hardware, config.model, config.engine, config.calibration
    dp = e.dp
    routed = k[T_EXPERTS]
    k[T_WEIGHTS] -= routed * (1 - 1 / dp)
    k[T_EXPERTS] = routed / dp
    if k[T_TOKEN]:  # the routed experts' share of the active parameters
        expert_params = m.moe_layers * m.experts_per_token * m.expert_gb / WEIGHT_BYTES[m.dtype]  # billions
        experts = 2e9 * expert_params / (peak_tflops(config) * 1e12 * cal.compute_efficiency * e.tp)
        k[T_TOKEN] -= experts
        k[T_EXPERT_TOKEN] = experts / dp
    n, moe = m.n_layers, m.moe_layers
    link = m.hidden * 2 / (hw.link_gb_s * 1e9)  # one token's BF16 activations
    reduces = 2 * n - moe  # all-reduces within the rank: every attention's, dense layers' MLPs'
    latency = token = 0.0
    if e.tp > 1:
        span = domains(config)
        g = e.tp // span
        net = m.hidden * 2 / (hw.scaleout_gb_s * 1e9) if span > 1 else 0.0
        latency = reduces * (hw.link_latency_us + 2 * (span - 1) * hw.scaleout_latency_us) * 1e-6
        token = reduces * (2 * (g - 1) / g * link + (2 * (span - 1) / span * net / g if span > 1 else 0.0))
    group = dp * e.tp
    span = exchange_domains(config)
    g = group // span
    net = m.hidden * 2 / (hw.scaleout_gb_s * 1e9) if span > 1 else 0.0
    k[T_LINK] = latency + 2 * moe * (hw.link_latency_us + 2 * (span - 1) * hw.scaleout_latency_us) * 1e-6
    k[T_LINK_TOKEN] = token + moe * 2 * m.experts_per_token * max((g - 1) / group * link, (group - g) / group * net)


# The keys each coefficient is made of, for an error that names them.
COEFFICIENT_KEYS = {
    OVERHEAD: "calibration.step_overhead_ms, calibration.layer_overhead_us, calibration.moe_layer_overhead_us",
    T_WEIGHTS: "model.weight_gb, hardware.mem_bandwidth_tb_s",
    T_KV: "model.kv_bytes_per_token, hardware.mem_bandwidth_tb_s",
    T_TOKEN: "model.params_b, hardware.peak_tflops",
    T_PAIR: "model.n_layers, model.attn_dim, hardware.peak_tflops",
    T_LINK: "hardware.link_latency_us, hardware.scaleout_latency_us",
    T_LINK_TOKEN: "model.hidden, hardware.link_gb_s, hardware.scaleout_gb_s",
    T_SAMPLE: "model.vocab, model.hidden, hardware.peak_tflops",
    T_EXPERTS: "model.expert_gb, model.experts, hardware.mem_bandwidth_tb_s",
    UNPICKED: "model.experts_per_token, model.experts",
    T_EXPERT_TOKEN: "model.expert_gb, model.experts_per_token, hardware.peak_tflops",
    RANKS: "engine.dp",
    T_ROW: "model.window_tokens, model.linear_state_bytes, model.sparse_topk, hardware.mem_bandwidth_tb_s",
}


@inline
def weights_time(k, n_tokens):
    """Seconds to read the weights a step of ``n_tokens`` tokens uses: all of them, less a
    mixture of experts' routed experts that no token picks."""
    if k[T_EXPERTS] != 0.0:
        return k[T_WEIGHTS] - k[T_EXPERTS] * math.exp(k[UNPICKED] * n_tokens)
    return k[T_WEIGHTS]


@inline
def step_time_with(k, weights, n_tokens, kv_tokens, pairs, sampled):
    """:func:`step_time` given :func:`weights_time` (a loop over steps of one N computes it once:
    the power in every step of a bare loop cost a third of the kernel's time)."""
    memory = weights + k[T_KV] * kv_tokens + k[T_ROW] * sampled
    compute = k[T_TOKEN] * n_tokens + k[T_PAIR] * pairs + k[T_SAMPLE] * sampled
    return k[OVERHEAD] + max(memory, compute) + (k[T_LINK] + k[T_LINK_TOKEN] * n_tokens)


@inline
def step_time(k, n_tokens, kv_tokens, pairs, sampled):
    """Seconds one step takes (see the module docstring); ``k`` from :func:`coefficients`;
    ``sampled``: the rows that emit a token (the LM head runs on them)."""
    return step_time_with(k, weights_time(k, n_tokens), n_tokens, kv_tokens, pairs, sampled)


@inline
def rank_time(k, n_all, n_tokens, kv_tokens, pairs, sampled):
    """Seconds one data-parallel rank's part of a lock-step step takes beyond the overhead: its
    roofline (its dense weights and share of the experts the ``n_all`` tokens of every rank pick,
    its KV; its own tokens through the dense layers, its share of all of them through the
    experts) and its exchange."""
    memory = weights_time(k, n_all) + k[T_KV] * kv_tokens + k[T_ROW] * sampled
    compute = k[T_TOKEN] * n_tokens + k[T_EXPERT_TOKEN] * n_all + k[T_PAIR] * pairs + k[T_SAMPLE] * sampled
    return max(memory, compute) + (k[T_LINK] + k[T_LINK_TOKEN] * n_tokens)


@inline
def group_step_time(k, n_tokens, kv_tokens, pairs, packed):
    """A lock-step step's seconds as a step run records it: the slowest rank's tokens, KV,
    pairs and ``packed`` = its sampled rows | every rank's tokens << 32."""
    return k[OVERHEAD] + rank_time(k, packed >> 32, n_tokens, kv_tokens, pairs, packed & LOW)


@inline
def run_time(k, n_tokens, kv_tokens, pairs, sampled):
    """A recorded step's seconds: :func:`step_time`, or :func:`group_step_time` where ranks step
    together (``k[RANKS]`` > 1)."""
    if k[RANKS] > 1.0:
        return group_step_time(k, n_tokens, kv_tokens, pairs, sampled)
    return step_time(k, n_tokens, kv_tokens, pairs, sampled)


def frozen(k: np.ndarray) -> tuple:
    """The coefficients as a tuple of floats, as the serving loop's pools hold them (values, not
    an array: choosing between two pools' costs a compiled loop nothing)."""
    return tuple(float(x) for x in k)


@inline
def frozen_in_loop(k):
    """:func:`frozen` in compiled code."""
    return (k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7], k[8], k[9], k[10], k[11], k[12])


def is_lesson(config: Config, k: np.ndarray | None = None) -> bool:
    """True when every serving-model addition is off: the lesson's kernels run it exactly.
    ``k``: the config's coefficients, when already folded."""
    k = coefficients(config) if k is None else k
    return (
        not k[[OVERHEAD, T_TOKEN, T_PAIR, T_LINK, T_LINK_TOKEN, T_SAMPLE, T_EXPERTS, T_ROW]].any()
        and kv_blocks(config) is None
        and config.engine.max_batched_tokens is None
        and config.workload.prefix_tokens == 0
        and config.calibration.api_overhead_ms == 0
        and not (config.engine.async_scheduling and config.engine.policy == "continuous")
        and config.engine.dp == 1
        and config.engine.speculative is None
    )


def domains(config: Config) -> int:
    """The scale-up domains (``hardware.scaleup_gpus`` GPUs each) a replica's tensor-parallel
    group spans: 1 within one (checked elsewhere: a group beyond one fills whole domains, over a
    network)."""
    g = config.hardware.scaleup_gpus
    return 1 if g is None or config.engine.tp <= g else config.engine.tp // g


def exchange_domains(config: Config) -> int:
    """The scale-up domains the dp x tp GPUs of a data-parallel replica's expert exchange span
    (1 within one)."""
    g, group = config.hardware.scaleup_gpus, config.engine.dp * config.engine.tp
    return 1 if g is None or group <= g else group // g


def rank_weight_gb(config: Config) -> float:
    """Weights one rank's tp GPUs hold: all but the routed experts, and 1/dp of those (every
    weight without data parallelism)."""
    m, dp = config.model, config.engine.dp
    draft = speculative.draft_weight_gb(config.engine.speculative, m)
    return draft + (m.weight_gb if dp == 1 else m.weight_gb - m.moe_layers * m.experts * m.expert_gb * (1 - 1 / dp))


def replicated(config: Config) -> bool:
    """True when the KV cache is not split evenly over the tensor-parallel GPUs: tp spans more
    GPUs than the model has KV heads (each GPU then holds a whole head: vLLM replicates them),
    or the model's attention is latent (MLA: every GPU holds the whole latent)."""
    m, tp = config.model, config.engine.tp
    return tp > 1 and (m.kv_lora_rank > 0 or m.kv_heads is not None and tp > m.kv_heads)


def kv_bytes_per_gpu(config: Config) -> float:
    """KV bytes per token one GPU of the tensor-parallel group holds: the KV heads split over the
    tp GPUs (without ``model.kv_heads``, the bytes split evenly), or one whole head each when tp
    exceeds them (ceil(kv_heads / tp) is then 1), or MLA's whole latent."""
    m = config.model
    if m.kv_lora_rank > 0:
        return m.kv_bytes_per_token
    return m.kv_bytes_per_token / m.kv_heads if replicated(config) else m.kv_bytes_per_token / config.engine.tp


def kv_capacity_gb(config: Config) -> float | None:
    """GB of KV cache across the tensor-parallel group (one rank's under data parallelism);
    None: unlimited."""
    hw, m, e = config.hardware, config.model, config.engine
    if e.kv_cache_gb is not None:
        return e.kv_cache_gb
    if hw.mem_gb is None:
        return None
    return e.tp * (hw.mem_gb * e.gpu_memory_utilization - e.reserved_gb) - rank_weight_gb(config)


def kv_blocks(config: Config) -> int | None:
    """Blocks of ``engine.block_tokens`` tokens the KV cache holds; None: unlimited. A hybrid
    model's blocks are its full-attention groups' (:func:`fastsim.model.kv_groups.page_layers`:
    padded to whole groups)."""
    capacity = kv_capacity_gb(config)
    pad = _padding(config) + speculative.draft_kv_share(config.engine.speculative, config.model)  # (a draft's too)
    per_block = config.engine.block_tokens * config.model.kv_bytes_per_token * pad
    if capacity is None or per_block == 0:
        return None
    blocks = capacity * 1e9 / per_block
    if config.model.kv_heads is not None or config.model.kv_lora_rank > 0:  # the tokens one GPU holds, whole blocks
        hw, m, e = config.hardware, config.model, config.engine
        kv_gpu = kv_bytes_per_gpu(config) * pad
        tokens = (e.kv_cache_gb * 1e9 / (e.tp * kv_gpu) if e.kv_cache_gb is not None else
                  (hw.mem_gb * e.gpu_memory_utilization - e.reserved_gb - rank_weight_gb(config) / e.tp) * 1e9
                  / kv_gpu)
        blocks = math.floor(tokens) / e.block_tokens if abs(tokens) <= LARGEST else tokens
    if blocks > LARGEST:  # also infinity: a count no machine holds, whose whole part a kernel cannot take
        raise ConfigError(f"the KV cache of {capacity:.3g} GB holds {blocks:.3g} blocks of engine.block_tokens "
                          f"{config.engine.block_tokens} x model.kv_bytes_per_token {config.model.kv_bytes_per_token:g} "
                          f"bytes, beyond what fastsim counts (2^53); for an unlimited cache set engine.kv_cache_gb "
                          f"and hardware.mem_gb to null")
    return math.floor(blocks) if blocks > 0 else 0  # (none when the weights leave no room: checked elsewhere)


def prefix_blocks(config: Config) -> int:
    """Blocks the shared prefix pins (whole blocks only: a warm prefix cache); none under prefix
    caching, where the prefix is a system prompt cached like any content."""
    return 0 if config.engine.prefix_caching else config.workload.prefix_tokens // config.engine.block_tokens


def _full_share(config: Config) -> float:
    """The share of ``model.kv_bytes_per_token`` (every layer's) the full-attention layers hold."""
    m = config.model
    if not m.hybrid:
        return 1.0
    return (m.n_layers - m.window_layers - m.linear_layers) / m.n_layers


def _padding(config: Config) -> float:
    """The share of ``model.kv_bytes_per_token`` one block's tokens span: the full-attention
    layers', with the padding of vLLM's groups (1 for a model without local or linear layers)."""
    m = config.model
    if not m.hybrid:
        return 1.0
    return kv_groups.page_layers(m.n_layers, m.window_layers, m.linear_layers) / m.n_layers


def _layer_bytes_per_gpu(config: Config) -> float:
    """One layer's KV of one token on one GPU."""
    return kv_bytes_per_gpu(config) / config.model.n_layers


def row_bytes_per_gpu(config: Config) -> float:
    """Bytes one GPU reads for a sampled row beyond its full-attention KV: a window of KV in each
    local layer (:func:`fastsim.model.kv_groups.reach`), and in each linear-attention layer its
    share of the request's state, read and written."""
    m, tp = config.model, config.engine.tp
    window = (m.window_layers * kv_groups.reach(m.window_tokens, m.window_kind) * _layer_bytes_per_gpu(config)
              if m.window_layers else 0.0)
    return window + 2 * m.linear_layers * m.linear_state_bytes / tp


def fixed_blocks(config: Config) -> int:
    """Blocks a running request of a hybrid-attention model holds beyond those its tokens fill
    (:func:`fastsim.model.kv_groups.fixed_blocks`; 0 for any other model, or without KV bytes)."""
    m, e = config.model, config.engine
    if not m.hybrid or m.kv_bytes_per_token == 0:
        return 0
    return kv_groups.fixed_blocks(m.n_layers, m.window_layers, m.window_tokens or 0, m.window_kind, m.linear_layers,
                                  m.linear_state_bytes / e.tp, _layer_bytes_per_gpu(config) * e.block_tokens,
                                  e.block_tokens)


def prompt_kv_bytes(config: Config, prompt: np.ndarray) -> np.ndarray:
    """Bytes of KV a prompt leaves behind (what a prefill replica sends): ``prompt`` tokens x
    ``model.kv_bytes_per_token``; a hybrid-attention model's full-attention layers' share of it,
    the window's last tokens in each local layer and a state in each linear-attention layer."""
    m = config.model
    if not m.hybrid:
        return prompt * m.kv_bytes_per_token
    layer = m.kv_bytes_per_token / m.n_layers
    window = m.window_layers * layer * np.minimum(prompt, m.window_tokens) if m.window_layers else 0.0
    return prompt * m.kv_bytes_per_token * _full_share(config) + window + m.linear_layers * m.linear_state_bytes
