"""The serving model: kernels against the second oracle, the lesson as its special case, the
behaviour a planner relies on, presets, and configurations that can never run."""

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from fastsim import Config, ConfigError, cost, kernels, simulate
from fastsim.cli import app
from fastsim.simulation import measure
from fastsim.traffic import generate

from . import oracle_serving


def oracle_engine(c: Config) -> oracle_serving.Engine:
    """The oracle's engine, with DESIGN.md's formulas written out again (not fastsim.cost's)."""
    hw, m, e, cal, w = c.hardware, c.model, c.engine, c.calibration, c.workload
    bw = hw.mem_bandwidth_tb_s * 1e12 * cal.bandwidth_efficiency * e.tp
    k = [cal.step_overhead_ms / 1e3, m.weight_gb * 1e9 / bw, m.kv_bytes_per_token / bw, 0.0, 0.0, 0.0, 0.0]
    if hw.peak_tflops is not None and m.params_b is not None:
        flops = hw.peak_tflops * 1e12 * cal.compute_efficiency * e.tp
        k[3] = 2e9 * m.params_b / flops
        if m.n_layers is not None and m.attn_dim is not None:
            k[4] = 4 * m.n_layers * m.attn_dim / flops
    if e.tp > 1:
        k[5] = 2 * m.n_layers * hw.link_latency_us * 1e-6
        k[6] = 2 * m.n_layers * 2 * (e.tp - 1) / e.tp * m.hidden * 2 / (hw.link_gb_s * 1e9)
    gb = e.kv_cache_gb if e.kv_cache_gb is not None else (
        None if hw.mem_gb is None else e.tp * (hw.mem_gb * e.gpu_memory_utilization - e.reserved_gb) - m.weight_gb)
    blocks = None if gb is None else math.floor(gb * 1e9 / (e.block_tokens * m.kv_bytes_per_token))
    return oracle_serving.Engine(
        policy=e.policy, limit=e.limit, window_s=e.window_ms / 1000 if e.policy == "dynamic" else math.inf,
        budget=math.inf if e.max_batched_tokens is None else e.max_batched_tokens, blocks=blocks,
        block_tokens=e.block_tokens, alloc=e.kv_alloc,
        prefix_blocks=0 if blocks is None else w.prefix_tokens // e.block_tokens,
        max_output=w.output.value if w.output.dist == "fixed" else w.output.max, k=tuple(k),
        api_s=cal.api_overhead_ms / 1000,
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
        "workload.output.mu": draw(st.floats(0.0, 3.5)),
        "workload.output.max": o_max,
        "workload.output.value": draw(st.integers(1, o_max)),
        "hardware.peak_tflops": draw(st.sampled_from([None, 1.0, 50.0, 989.0])),
        "model.params_b": draw(st.sampled_from([None, 8.0, 70.0])),
        "model.n_layers": 32,
        "model.attn_dim": 4096,
        "model.hidden": 4096,
        "engine.tp": draw(st.sampled_from([1, 1, 2, 4])),
        "hardware.link_gb_s": 450.0,
        "hardware.link_latency_us": draw(st.sampled_from([0.0, 5.0])),
        "calibration.step_overhead_ms": draw(st.sampled_from([0.0, 0.0, 1.5])),
        "calibration.api_overhead_ms": draw(st.sampled_from([0.0, 0.0, 20.0])),
        "calibration.compute_efficiency": draw(st.sampled_from([1.0, 0.5])),
        "calibration.bandwidth_efficiency": draw(st.sampled_from([1.0, 0.8])),
    }
    if v["workload.rng"] == "numpy":  # prompts from a distribution, other arrival processes
        v["workload.arrival"] = draw(st.sampled_from(["poisson", "gamma", "constant"]))
        v["workload.burstiness"] = draw(st.sampled_from([0.2, 1.0, 5.0]))
        v["workload.output.dist"] = draw(st.sampled_from(["fixed", "lognormal", "uniform"]))
        v["workload.prompt.dist"] = draw(st.sampled_from(["fixed", "lognormal", "uniform"]))
        v["workload.prompt.mu"] = draw(st.floats(2.0, 5.5))
        v["workload.prompt.min"] = draw(st.integers(1, prompt))
        v["workload.prompt.max"] = prompt
    limit = max_batch if v["engine.max_concurrent"] is None else min(max_batch, v["engine.max_concurrent"])
    if draw(st.booleans()):
        v["engine.max_batched_tokens"] = draw(st.integers(limit, 400))
    if draw(st.integers(0, 9)) < 7:  # a KV cache from just enough for the longest request to 3x
        tokens = draw(st.integers(prompt + o_max, 3 * (prompt + o_max)))
        v["engine.kv_cache_gb"] = math.ceil(tokens / bt) * bt * 131072 / 1e9 * (1 + 1e-12)
    if draw(st.booleans()):
        shortest = v.get("workload.prompt.min", prompt) if v.get("workload.prompt.dist", "fixed") != "fixed" else prompt
        v["workload.prefix_tokens"] = draw(st.integers(0, max(0, shortest - 1)))
    return Config().with_values(v)


def run_both(config):
    traffic = generate(config.workload)
    fast = kernels.run(config, traffic)
    slow = oracle_serving.simulate(traffic.arrival_s.tolist(), traffic.prompt_tokens.tolist(),
                                   traffic.output_tokens.tolist(), oracle_engine(config))
    return traffic, fast, slow


def lesson_quantile(values, p):
    xs = sorted(values)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else math.nan


def same(a, b):
    return a == b or (math.isnan(a) and math.isnan(b))


@settings(max_examples=400)
@given(serving_configs())
def test_kernels_match_the_serving_oracle_exactly(config):
    traffic, fast, slow = run_both(config)
    assert fast.first_token_s.tolist() == slow["first_token"]
    assert fast.done_s.tolist() == slow["done"]
    assert (fast.steps, fast.busy_slot_steps, fast.max_queue, fast.preemptions) == (
        slow["steps"], slow["busy"], slow["max_queue"], slow["preemptions"])
    m = measure(config, traffic, fast)
    if slow["kv_used"] is None:
        assert math.isnan(m["kv_peak_use"]) and math.isnan(m["kv_mean_use"])
    else:
        assert (fast.kv_block_steps, fast.kv_peak_blocks) == (sum(slow["kv_used"]), max(slow["kv_used"]))
    for p, name in ((0.5, "itl_p50_s"), (0.99, "itl_p99_s")):
        assert same(m[name], lesson_quantile(slow["gaps"], p)), name


@settings(max_examples=200)
@given(serving_configs())
def test_serving_invariants(config):
    traffic, out, _ = run_both(config)
    assert np.isfinite(out.done_s).all()  # every request finishes, once
    assert (traffic.arrival_s <= out.first_token_s).all() and (out.first_token_s <= out.done_s).all()
    assert out.busy_slot_steps == traffic.output_tokens.sum()  # tokens conserved
    if out.kv_blocks >= 0:
        assert out.kv_peak_blocks <= out.kv_blocks


LESSON_CASES = [
    {"engine.policy": p, "workload.rate": r, "engine.max_concurrent": c, "workload.n_requests": 400}
    for p in ("static", "dynamic", "continuous") for r in (8, 40, 300) for c in (None, 5)
]


@pytest.mark.parametrize("values", LESSON_CASES)
def test_serving_kernels_are_the_lesson_when_every_addition_is_off(values):
    config = Config().with_values(values)
    traffic = generate(config.workload)
    plan = kernels.Plan.of(config)
    assert plan.lesson
    lesson = kernels.run(config, traffic, plan)
    serving = kernels.run(config, traffic, dataclasses.replace(plan, lesson=False))
    assert serving.first_token_s.tolist() == lesson.first_token_s.tolist()
    assert serving.done_s.tolist() == lesson.done_s.tolist()
    assert (serving.steps, serving.busy_slot_steps, serving.max_queue) == (lesson.steps, lesson.busy_slot_steps,
                                                                          lesson.max_queue)
    assert measure(config, traffic, serving) == pytest.approx(measure(config, traffic, lesson), nan_ok=True, rel=0)


def test_lesson_itl_matches_the_oracle():
    for policy in ("static", "continuous"):
        config = Config().with_values({"engine.policy": policy, "workload.n_requests": 300, "workload.rate": 20})
        traffic, fast, slow = run_both(config)
        m = measure(config, traffic, fast)
        assert m["itl_p50_s"] == lesson_quantile(slow["gaps"], 0.5)
        assert m["itl_p99_s"] == lesson_quantile(slow["gaps"], 0.99)


# Behaviour a planner relies on, on the realistic H100 scenario.
H100 = {"hardware.preset": "h100-sxm", "model.preset": "llama-3.1-8b", "engine.max_batched_tokens": 8192,
        "engine.max_batch": 256, "workload.n_requests": 3000}


def test_a_small_kv_cache_preempts_and_still_finishes_everything():
    config = Config().with_values({**H100, "engine.kv_cache_gb": 2.0, "workload.rate": 60,
                                   "workload.output.dist": "fixed", "workload.output.value": 600})
    r = simulate(config)
    assert r.metrics["preemptions"] > 50
    assert np.isfinite(r.done_s).all() and (r.first_token_s <= r.done_s).all()
    assert r.metrics["kv_peak_use"] <= 1 and r.metrics["kv_peak_use"] > 0.95
    roomy = simulate(config.with_values({"engine.kv_cache_gb": 80.0}))  # 256 x 1600 tokens fit
    assert roomy.metrics["preemptions"] == 0


def test_chunked_prefill_lowers_itl_p99():
    base = {**H100, "workload.prompt.value": 4000, "workload.rate": 6}
    chunked = simulate(Config().with_values({**base, "engine.max_batched_tokens": 512}))
    whole = simulate(Config().with_values({**base, "engine.max_batched_tokens": None}))
    assert chunked.metrics["itl_p99_s"] < 0.7 * whole.metrics["itl_p99_s"]


def test_paged_allocation_admits_more_sequences_than_reservation():
    base = {**H100, "engine.kv_cache_gb": 6.0, "workload.rate": 60}
    paged = simulate(Config().with_values({**base, "engine.kv_alloc": "paged"}))
    reserve = simulate(Config().with_values({**base, "engine.kv_alloc": "reserve"}))
    assert paged.metrics["mean_batch"] > 1.5 * reserve.metrics["mean_batch"]
    assert reserve.metrics["preemptions"] == 0
    assert paged.metrics["throughput_tok_s"] > reserve.metrics["throughput_tok_s"]


def test_light_load_ttft_approaches_one_prefill():
    config = Config().with_values({**H100, "workload.rate": 0.05, "workload.n_requests": 200})
    r = simulate(config)
    k = cost.coefficients(config)
    p = config.workload.prompt.value
    prefill = cost_step = k[0] + max(k[1] + k[2] * p, k[3] * p + k[4] * p * (p + 1) / 2)
    assert cost_step > k[1] + k[2] * p  # a 1000-token prefill is compute-bound on an H100
    assert r.metrics["ttft_p50_s"] == pytest.approx(prefill, rel=0.05)


@pytest.mark.parametrize("rate", [5, 30, 200])
def test_throughput_never_exceeds_the_rooflines(rate):
    config = Config().with_values({**H100, "workload.rate": rate})
    r = simulate(config)
    k = cost.coefficients(config)
    tokens = int(r.prompt_tokens.sum() + r.output_tokens.sum())  # computed at least once each
    span = r.metrics["span_s"]
    assert tokens * k[cost.T_TOKEN] <= span  # compute roofline
    assert r.metrics["steps"] * k[cost.T_WEIGHTS] <= span  # every step reads the weights
    assert r.metrics["throughput_tok_s"] <= r.metrics["steps"] * config.engine.limit / span


# Presets
def test_presets_fill_unset_fields_and_explicit_keys_win():
    c = Config().with_values({"hardware.preset": "h200", "hardware.mem_gb": 100})
    assert (c.hardware.mem_bandwidth_tb_s, c.hardware.mem_gb, c.hardware.peak_tflops) == (4.8, 100.0, 989.0)
    m = Config().with_values({"model.preset": "llama-3.1-70b"}).model
    assert (m.weight_gb, m.kv_bytes_per_token, m.n_layers, m.hidden) == (141.1, 327680.0, 80, 8192)
    moe = Config().with_values({"model.preset": "mixtral-8x7b"}).model
    assert moe.params_b == 12.9 and moe.weight_gb == 93.4  # active parameters, all weights
    assert Config().with_values({"model.preset": "llama-3.1-8b"}).model.kv_bytes_per_token == 131072  # the lesson's


def test_unknown_preset_lists_the_valid_ones(root):
    result = CliRunner().invoke(app, ["run", str(root / "configs/reference.yaml"), "--set", "hardware.preset=h1000"])
    assert result.exit_code == 2
    assert "hardware.preset: unknown hardware preset 'h1000' (valid: h100-sxm, h200, a100-80gb" in result.stderr


def test_presets_command_lists_every_preset():
    result = CliRunner().invoke(app, ["presets"])
    assert result.exit_code == 0
    for name in ("h100-sxm", "h200", "a100-80gb", "b200", "l40s", "mi300x", "llama-3.1-8b", "llama-3.1-70b",
                 "llama-2-7b", "llama-2-70b", "qwen2.5-7b", "mistral-7b", "mixtral-8x7b"):
        assert name in result.stdout


def test_a_preset_axis_sweeps_whole_gpus(tmp_path, root):
    import fastsim

    path = tmp_path / "gpus.yaml"
    path.write_text(f"extends: {root / 'configs/h100.yaml'}\nworkload:\n  n_requests: 500\n"
                    "sweep:\n  hardware.preset: [h100-sxm, h200, b200]\n")
    ds = fastsim.sweep(fastsim.load_config(path), workers=1)
    thr = ds.throughput_tok_s.values
    assert ds.preset.values.tolist() == ["h100-sxm", "h200", "b200"]
    for i, gpu in enumerate(["h100-sxm", "h200", "b200"]):
        one = simulate(fastsim.load_config(path, {"hardware.preset": gpu}))
        assert one.metrics["throughput_tok_s"] == thr[i]


# Configurations that can never run: exit 2, one line naming the keys and the numbers
NEVER = [
    ({"model.preset": "llama-3.1-8b", "engine.tp": 3, "hardware.preset": "h100-sxm"},
     "engine.tp (3) must divide the 8 KV heads of model.preset llama-3.1-8b"),
    ({"model.preset": "llama-3.1-70b", "hardware.preset": "h100-sxm"},
     "model.weight_gb (141.1) does not fit: engine.tp (1) x (hardware.mem_gb (80) x engine.gpu_memory_utilization (0.9) "
     "- engine.reserved_gb (2)) = 70 GB"),
    ({"workload.prefix_tokens": 1000}, "workload.prefix_tokens (1000) must be shorter than every prompt"),
    ({"engine.kv_cache_gb": 0.1}, "the longest request (workload.prompt 1000 + output 2000 = 3000 tokens) "
                                  "does not fit in the KV cache (47 blocks of engine.block_tokens 16 = 752 tokens"),
    ({"calibration.compute_efficiency": 1.5}, "calibration.compute_efficiency: Input should be less than or equal to 1"),
    ({"calibration.bandwidth_efficiency": 0}, "calibration.bandwidth_efficiency: Input should be greater than 0"),
    ({"engine.gpu_memory_utilization": 1.2}, "engine.gpu_memory_utilization: Input should be less than or equal to 1"),
    ({"engine.max_batched_tokens": 32}, "engine.max_batched_tokens (32) must be at least the running limit"),
    ({"engine.tp": 2}, "engine.tp (2) > 1 needs hardware.link_gb_s and model.n_layers and model.hidden"),
    ({"engine.kv_alloc": "lazy"}, "engine.kv_alloc: Input should be 'paged' or 'reserve'"),
]


@pytest.mark.parametrize("values,message", NEVER, ids=[m[:40] for _, m in NEVER])
def test_configurations_that_cannot_run_exit_2(root, values, message):
    args = [a for k, v in values.items() for a in ("--set", f"{k}={'null' if v is None else v}")]
    config = "h100" if "model.preset" in values else "reference"  # the reference sets the model's fields
    result = CliRunner().invoke(app, ["run", str(root / f"configs/{config}.yaml"), *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_bad_combination_in_a_sweep_names_the_point(tmp_path, root):
    path = tmp_path / "tp.yaml"
    path.write_text(f"extends: {root / 'configs/h100.yaml'}\nsweep:\n  engine.tp: [1, 2, 3]\n")
    result = CliRunner().invoke(app, ["sweep", str(path), "--out", str(tmp_path / "x.nc"), "--quiet"])
    assert result.exit_code == 2
    assert "sweep point {'engine.tp': 3}: engine.tp (3) must divide the 8 KV heads" in result.stderr


def test_api_refuses_with_config_error():
    with pytest.raises(ConfigError, match="does not fit in the KV cache"):
        Config().with_values({"engine.kv_cache_gb": 0.1})
