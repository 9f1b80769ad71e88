"""Presets: they fill the fields a config leaves unset, are listed by `fastsim presets`, and
work as sweep axes."""

import pytest
from typer.testing import CliRunner

from fastsim import Config, simulate
from fastsim.cli import app


def test_presets_fill_unset_fields_and_explicit_keys_win():
    c = Config().with_values({"hardware.preset": "h200", "hardware.mem_gb": 100})
    assert (c.hardware.mem_bandwidth_tb_s, c.hardware.mem_gb, c.hardware.peak_tflops) == (4.8, 100.0, 989.0)
    m = Config().with_values({"model.preset": "llama-3.1-70b"}).model
    assert (m.kv_bytes_per_token, m.n_layers, m.hidden, m.vocab) == (327680.0, 80, 8192, 128256)
    assert abs(m.weight_gb - 141.1) < 0.01  # 70.55 B parameters at 2 bytes
    moe = Config().with_values({"model.preset": "mixtral-8x7b"}).model
    assert abs(moe.params_b + 32000 * 4096 / 1e9 - 12.75) < 0.01  # active parameters (with the LM head)
    assert abs(moe.weight_gb - 93.4) < 0.01  # all weights
    assert (moe.experts, moe.experts_per_token, moe.moe_layers) == (8, 2, 32)
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
    assert ds.hardware.values.tolist() == ["h100-sxm", "h200", "b200"]
    for i, gpu in enumerate(["h100-sxm", "h200", "b200"]):
        one = simulate(fastsim.load_config(path, {"hardware.preset": gpu}))
        assert one.metrics["throughput_tok_s"] == thr[i]


def test_every_gpu_of_the_datasheets_is_a_preset_with_its_source(root):
    """The GPUs planners compare, each with where its figures come from; a GPU without a known
    price costs NaN (never a crash) until hardware.usd_per_gpu_hour is set."""
    import math

    from fastsim.model.presets import DATASHEETS, HARDWARE, PRICE_SOURCES

    assert set(HARDWARE) >= {"h100-sxm", "h100-pcie", "h200", "b200", "b300", "gb200", "a100-80gb", "a100-40gb",
                             "l40s", "l4", "rtx-pro-6000", "mi300x", "mi325x", "mi355x"}
    assert set(DATASHEETS) == set(HARDWARE)
    assert {name for name, v in HARDWARE.items() if v["usd_per_gpu_hour"] is not None} == set(PRICE_SOURCES)
    config = Config().with_values({"hardware.preset": "l4", "model.preset": "llama-3.1-8b",
                                   "workload.n_requests": 200, "workload.rate": 1})
    metrics = simulate(config).metrics
    assert math.isnan(metrics["usd_per_hour"]) and math.isnan(metrics["usd_per_mtok"]) and metrics["gpus"] == 1
    priced = simulate(config.with_values({"hardware.usd_per_gpu_hour": 0.5})).metrics
    assert priced["usd_per_hour"] == 0.5


def test_kv_heads_are_split_over_tp_and_replicated_beyond_them():
    """Llama-3.1-70B has 8 KV heads of 40,960 bytes a token (80 layers x K and V x 128 x 2 bytes):
    at tp 8 each H100 holds one head, and at tp 16 still one (a copy), with half the weights."""
    import math

    from fastsim.model.cost import coefficients, kv_blocks, kv_bytes_per_gpu

    base = Config().with_values({"hardware.preset": "h100-sxm", "model.preset": "llama-3.1-70b"})
    assert base.model.kv_heads == 8
    per_head = 327680 / 8
    for tp in (8, 16):
        c = base.with_values({"engine.tp": tp})
        assert kv_bytes_per_gpu(c) == per_head
        free_gb = 80 * 0.9 - 2 - base.model.weight_gb / tp  # one GPU's memory after its share of the weights
        assert kv_blocks(c) == math.floor(math.floor(free_gb * 1e9 / per_head) / 16)
        assert coefficients(c)[2] == per_head / (3.35e12)  # a step reads one head's KV a token on each GPU
    assert kv_bytes_per_gpu(base.with_values({"engine.tp": 4})) == 327680 / 4


def test_a_tp_that_neither_divides_nor_is_a_multiple_of_the_kv_heads_is_refused(root):
    result = CliRunner().invoke(app, ["run", str(root / "configs/h100.yaml"), "--set", "model.kv_heads=6",
                                      "--set", "engine.tp=4"])
    assert result.exit_code == 2
    assert "engine.tp (4) must divide the 6 KV heads of model.preset llama-3.1-8b, or be a multiple of them" \
        in result.stderr


def test_a_tp_group_beyond_its_scale_up_domain_all_reduces_over_the_network():
    """tp 16 on H100 (two HGX boards joined by 400 Gb/s adapters): within each board a
    reduce-scatter and an all-gather over NVLink, between the two an all-reduce of an eighth of the
    activations over the network, each step between boards 10 us; on GB200 NVL72 the same 16 GPUs
    stay within one NVLink domain, where the cost is the single-domain ring's."""
    from fastsim.model.cost import T_LINK, T_LINK_TOKEN, coefficients

    base = {"model.preset": "llama-3.1-405b", "engine.tp": 16}
    h100 = Config().with_values({**base, "hardware.preset": "h100-sxm"})
    k = coefficients(h100)
    token = 16384 * 2  # bytes of one token's activations
    all_reduce = 2 * 7 / 8 * token / 450e9 + 2 * 1 / 2 * token / 8 / 50e9
    assert k[T_LINK_TOKEN] == pytest.approx(2 * 126 * all_reduce, rel=1e-12)
    assert k[T_LINK] == pytest.approx(2 * 126 * (5e-6 + 2 * 10e-6), rel=1e-12)
    gb200 = coefficients(Config().with_values({**base, "hardware.preset": "gb200"}))
    assert gb200[T_LINK_TOKEN] == pytest.approx(2 * 126 * 2 * 15 / 16 * token / 900e9, rel=1e-12)
    assert gb200[T_LINK] == pytest.approx(2 * 126 * 5e-6, rel=1e-12)
