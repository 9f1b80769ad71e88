"""The cost model: what one engine step takes, how much KV cache there is, and which
combinations of keys can never run (checked before any run, naming the keys and the numbers).

Step time over the rows a step schedules (row i has ``c_i`` tokens computed before the step and
gets ``n_i`` more): N = sum n_i tokens computed, C = sum (c_i + n_i) KV tokens read,
A = sum n_i (2 c_i + n_i + 1) / 2 query-key pairs of attention, and

    step = overhead + max(t_weights + t_kv C,  t_token N + t_pair A) + (t_link + t_link_token N)

the roofline of memory (weights and KV read) against compute (2 FLOPs per parameter per token,
4 attn_dim FLOPs per query-key pair per layer), plus two all-reduces per layer under tensor
parallelism. The coefficients are folded once per run (:func:`coefficients`); the lesson's
model is every coefficient zero but the first two, and then a step costs exactly
``t_weights + t_kv C``, the same floating-point operations as the lesson.
"""

from __future__ import annotations

import math

import numpy as np

from ._jit import inline
from .config import Config, ConfigError
from .presets import MODEL_SHAPES

# Indices into the coefficient vector a kernel gets.
OVERHEAD, T_WEIGHTS, T_KV, T_TOKEN, T_PAIR, T_LINK, T_LINK_TOKEN = range(7)


def coefficients(config: Config) -> np.ndarray:
    """The step-time coefficients of ``config`` (seconds, per token or per pair), float64 (7,)."""
    hw, m, e, cal = config.hardware, config.model, config.engine, config.calibration
    bandwidth = hw.mem_bandwidth_tb_s * 1e12 * cal.bandwidth_efficiency * e.tp  # bytes/s, all GPUs
    k = np.zeros(7)
    k[OVERHEAD] = cal.step_overhead_ms / 1e3
    k[T_WEIGHTS] = m.weight_gb * 1e9 / bandwidth
    k[T_KV] = m.kv_bytes_per_token / bandwidth
    if hw.peak_tflops is not None and m.params_b is not None:
        flops = hw.peak_tflops * 1e12 * cal.compute_efficiency * e.tp  # FLOP/s, all GPUs
        k[T_TOKEN] = 2e9 * m.params_b / flops
        if m.n_layers is not None and m.attn_dim is not None:
            k[T_PAIR] = 4 * m.n_layers * m.attn_dim / flops
    if e.tp > 1:  # two all-reduces per layer of N x hidden BF16 values (ring: 2 (tp-1)/tp of it moves)
        k[T_LINK] = 2 * m.n_layers * hw.link_latency_us * 1e-6
        k[T_LINK_TOKEN] = 2 * m.n_layers * 2 * (e.tp - 1) / e.tp * m.hidden * 2 / (hw.link_gb_s * 1e9)
    return k


@inline
def step_time(k, n_tokens, kv_tokens, pairs):
    """Seconds one step takes (see the module docstring); ``k`` from :func:`coefficients`."""
    memory = k[1] + k[2] * kv_tokens
    compute = k[3] * n_tokens + k[4] * pairs
    return k[0] + max(memory, compute) + (k[5] + k[6] * n_tokens)


def is_lesson(config: Config, k: np.ndarray | None = None) -> bool:
    """True when every serving-model addition is off: the lesson's kernels run it exactly.
    ``k``: the config's coefficients, when already folded."""
    k = coefficients(config) if k is None else k
    return (
        not k[[OVERHEAD, T_TOKEN, T_PAIR, T_LINK, T_LINK_TOKEN]].any()
        and kv_blocks(config) is None
        and config.engine.max_batched_tokens is None
        and config.workload.prefix_tokens == 0
        and config.calibration.api_overhead_ms == 0
    )


def kv_capacity_gb(config: Config) -> float | None:
    """GB of KV cache across the tensor-parallel group; None: unlimited."""
    hw, m, e = config.hardware, config.model, config.engine
    if e.kv_cache_gb is not None:
        return e.kv_cache_gb
    if hw.mem_gb is None:
        return None
    return e.tp * (hw.mem_gb * e.gpu_memory_utilization - e.reserved_gb) - m.weight_gb


def kv_blocks(config: Config) -> int | None:
    """Blocks of ``engine.block_tokens`` tokens the KV cache holds; None: unlimited."""
    capacity = kv_capacity_gb(config)
    per_block = config.engine.block_tokens * config.model.kv_bytes_per_token
    if capacity is None or per_block == 0:
        return None
    return max(0, math.floor(capacity * 1e9 / per_block))


def prefix_blocks(config: Config) -> int:
    """Blocks the shared prefix pins (whole blocks only: a warm prefix cache)."""
    return config.workload.prefix_tokens // config.engine.block_tokens


def check(config: Config) -> None:
    """Refuse configurations that can never run; errors name the keys and the numbers."""
    hw, m, e, w = config.hardware, config.model, config.engine, config.workload
    if e.max_batched_tokens is not None and e.policy == "continuous" and e.max_batched_tokens < e.limit:
        raise ConfigError(
            f"engine.max_batched_tokens ({e.max_batched_tokens}) must be at least the running limit, "
            f"min(engine.max_batch, engine.max_concurrent) ({e.limit}), as in vLLM"
        )
    if w.trace is None and w.prefix_tokens and w.prefix_tokens >= w.prompt.smallest:
        raise ConfigError(
            f"workload.prefix_tokens ({w.prefix_tokens}) must be shorter than every prompt "
            f"(the shortest workload.prompt is {w.prompt.smallest})"
        )
    if e.tp > 1:
        shape = MODEL_SHAPES.get(m.preset) if m.preset else None
        if shape is not None and shape.kv_heads % e.tp:
            raise ConfigError(f"engine.tp ({e.tp}) must divide the {shape.kv_heads} KV heads of model.preset {m.preset}")
        missing = [k for k, v in (("hardware.link_gb_s", hw.link_gb_s), ("model.n_layers", m.n_layers),
                                  ("model.hidden", m.hidden)) if v is None]
        if missing:
            raise ConfigError(f"engine.tp ({e.tp}) > 1 needs {' and '.join(missing)} for the all-reduce cost")
    capacity = kv_capacity_gb(config)
    if capacity is not None and capacity <= 0:
        raise ConfigError(
            f"model.weight_gb ({m.weight_gb:g}) does not fit: engine.tp ({e.tp}) x (hardware.mem_gb ({hw.mem_gb:g}) "
            f"x engine.gpu_memory_utilization ({e.gpu_memory_utilization:g}) - engine.reserved_gb ({e.reserved_gb:g})) "
            f"= {e.tp * (hw.mem_gb * e.gpu_memory_utilization - e.reserved_gb):g} GB"
        )
    if w.trace is None:
        check_longest(config, w.prompt.largest, w.max_output, f"workload.prompt {w.prompt.largest} + output")


def check_longest(config: Config, prompt: int, output: int, what: str) -> None:
    """Refuse a workload whose longest request (``prompt`` + ``output`` tokens, described by
    ``what``) cannot fit in the KV cache: it could never finish."""
    e = config.engine
    blocks = kv_blocks(config)
    if blocks is not None and prompt + output > blocks * e.block_tokens:
        raise ConfigError(
            f"workload: the longest request ({what} {output} = {prompt + output} tokens) does not fit in "
            f"the KV cache ({blocks} blocks of engine.block_tokens {e.block_tokens} = {blocks * e.block_tokens} "
            f"tokens, {kv_capacity_gb(config):.3g} GB)"
        )


# Key prefixes :func:`check` reads: a sweep checks every combination of the axes under them.
CHECKED_KEYS = ("hardware.", "model.", "engine.", "workload.prompt.", "workload.output.", "workload.prefix_tokens",
                "workload.trace")
