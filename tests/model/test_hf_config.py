"""Models imported from their Hugging Face config.json (docs/model/deployed.md): every shipped
preset imports; shapes are the files'; sizes agree with a derivation written here again, and
totals with the counts the model makers publish; precisions come from the quantization configs;
what is approximated is said; the KV cache per GPU follows vLLM's sharding."""

import json
import math
import warnings

import pytest
from typer.testing import CliRunner

from fastsim import Config
from fastsim.cli import app
from fastsim.model import hf_config
from fastsim.model.cost import kv_blocks, kv_bytes_per_gpu
from fastsim.model.presets import MODELS


def shape(name: str) -> hf_config.Shape:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hf_config.Approximation)
        return hf_config.read(MODELS[name])


def test_every_shipped_preset_imports_and_validates():
    assert len(MODELS) >= 30
    for name in MODELS:
        m = Config().with_values({"model.preset": name}).model
        assert m.weight_gb > 0 and m.kv_bytes_per_token > 0 and m.params_b > 0 and m.vocab > 0, name
        assert (m.experts > 0) == (m.experts_per_token > 0) == (m.moe_layers > 0), name


# Published (total, active) parameters, billions. Vendors count "active" three ways: with the
# embedding table (Qwen, Mistral, DeepSeek), without it (OpenAI: the LM head only) or without
# either (MiniMax); an import must match one of them.
PUBLISHED = {"deepseek-v3": (671, 37), "qwen3-30b-a3b": (30.5, 3.3), "qwen3-235b-a22b": (235, 22),
             "gpt-oss-120b": (117, 5.1), "mixtral-8x7b": (46.7, 12.9), "minimax-m2.5-nvfp4": (229, 10),
             "kimi-k2.5": (1040, 32), "glm-5": (744, 40), "qwen3.5-397b-a17b": (397, 17)}


@pytest.mark.parametrize("name", PUBLISHED)
def test_totals_are_the_published_counts(name):
    s = shape(name)
    total, active = PUBLISHED[name]
    assert abs(s.total / 1e9 / total - 1) < 0.03
    with_embedding = s.active_with_head + s.vocab * s.hidden
    assert min(abs(count / 1e9 / active - 1) for count in (s.active, s.active_with_head, with_embedding)) < 0.03


def test_shapes_are_the_files():
    q = Config().with_values({"model.preset": "qwen3-30b-a3b"}).model
    assert (q.n_layers, q.hidden, q.heads, q.kv_heads, q.head_dim, q.vocab) == (48, 2048, 32, 4, 128, 151936)
    assert (q.experts, q.experts_per_token, q.moe_layers, q.attn_dim) == (128, 8, 48, 4096)
    d = Config().with_values({"model.preset": "deepseek-v3"}).model
    assert (d.n_layers, d.kv_lora_rank, d.qk_rope_head_dim, d.experts, d.experts_per_token, d.moe_layers) == \
        (61, 512, 64, 256, 8, 58)  # the first 3 layers are dense
    assert d.attn_dim == 128 * (2 * 512 + 64) // 2 and d.kv_bytes_per_token == 61 * (512 + 64) * 2
    assert (d.dtype, d.kv_dtype) == ("fp8", "bf16")


def test_sizes_agree_with_a_derivation_written_again():
    """Llama-3.1-8B and DeepSeek-V3 counted here from their files' fields, by hand."""
    cfg = json.load(open(MODELS["llama-3.1-8b"]))
    h, inter, layers, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * 128
    linear = layers * (2 * h * h + 2 * h * kv + 3 * h * inter)
    m = Config().with_values({"model.preset": "llama-3.1-8b"}).model
    assert m.weight_gb == pytest.approx((linear + 2 * vocab * h) * 2 / 1e9, rel=0.02)
    assert m.params_b == pytest.approx(linear / 1e9, rel=0.02)
    assert m.kv_bytes_per_token == 2 * layers * kv * 2

    cfg = json.load(open(MODELS["deepseek-v3"]))
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    attention = (h * 1536 + 1536 * heads * 192 + h * 576 + 512 * heads * 256 + heads * 128 * h)
    expert = 3 * h * cfg["moe_intermediate_size"]
    linear = 61 * attention + 3 * 3 * h * cfg["intermediate_size"] + 58 * 257 * expert
    d = Config().with_values({"model.preset": "deepseek-v3"}).model
    assert d.weight_gb == pytest.approx((linear * 1 + 2 * cfg["vocab_size"] * h * 2) / 1e9, rel=0.02)  # fp8
    assert d.expert_gb == pytest.approx(expert / 1e9, rel=1e-9)
    assert d.params_b == pytest.approx((61 * attention + 9 * h * cfg["intermediate_size"] + 58 * 9 * expert) / 1e9,
                                       rel=0.02)


@pytest.mark.parametrize("name, dtype, kv_dtype", [
    ("qwen3-32b-fp8", "fp8", "bf16"), ("gpt-oss-120b", "mxfp4", "bf16"), ("qwen3-235b-a22b-nvfp4", "fp4", "fp8"),
    ("minimax-m2.5-nvfp4", "fp4", "fp8"), ("kimi-k2.5", "int4", "bf16"), ("kimi-k2.5-nvfp4", "fp4", "fp8"),
    ("llama-3.1-70b-fp8", "fp8", "fp8"), ("llama-4-scout-fp8", "fp8", "bf16"), ("qwen3.5-122b-a10b-nvfp4", "fp4", "fp8"),
    ("qwen3-32b", "bf16", "bf16")])
def test_the_quantization_config_sets_the_precision(name, dtype, kv_dtype):
    assert (shape(name).dtype, shape(name).kv_dtype) == (dtype, kv_dtype)


def test_a_precision_set_on_a_preset_resizes_it():
    bf16 = Config().with_values({"model.preset": "qwen3-32b"}).model
    fp8 = Config().with_values({"model.preset": "qwen3-32b", "model.dtype": "fp8", "model.kv_dtype": "fp8"}).model
    embeddings = 2 * bf16.vocab * bf16.hidden * 2 / 1e9  # stay bf16
    assert fp8.weight_gb - embeddings == pytest.approx((bf16.weight_gb - embeddings) / 2, rel=1e-3)
    assert fp8.kv_bytes_per_token == bf16.kv_bytes_per_token / 2
    fp4 = Config().with_values({"model.preset": "qwen3-30b-a3b", "model.dtype": "fp4"}).model
    assert fp4.expert_gb == pytest.approx(3 * 2048 * 768 * 0.5625 / 1e9)
    explicit = Config().with_values({"model.preset": "qwen3-32b", "model.dtype": "fp8", "model.weight_gb": 40}).model
    assert explicit.weight_gb == 40  # explicit keys win


def test_what_a_checkpoint_leaves_unquantised_stays_bf16():
    """gpt-oss keeps attention bf16 beside MXFP4 experts; Kimi-K2.5's INT4 covers the routed
    experts only (attention, shared experts and the dense first layer stay bf16)."""
    s = shape("gpt-oss-120b")
    attention = s.n_layers * (2 * s.hidden * s.heads * s.head_dim + 2 * s.hidden * s.kv_heads * s.head_dim)
    assert s.kept == attention
    assert s.fields()["weight_gb"] == pytest.approx(
        ((s.linear - attention) * 0.53125 + (attention + s.plain) * 2) / 1e9, rel=1e-12)
    k = shape("kimi-k2.5")
    routed = k.moe_layers * k.experts * k.expert
    assert k.kept == k.linear - routed  # everything but the routed experts
    assert k.fields()["expert_gb"] == pytest.approx(k.expert * (0.5 + 2 / 32) / 1e9)
    assert shape("deepseek-v3").kept == 0  # block fp8 everywhere


def test_int4_runs_weight_only_and_mxfp4_on_fp4_tensor_cores():
    from fastsim.model.cost import peak_tflops

    b200 = {"hardware.preset": "b200"}
    assert peak_tflops(Config().with_values({**b200, "model.preset": "kimi-k2.5"})) == 2250.0
    assert peak_tflops(Config().with_values({**b200, "model.preset": "gpt-oss-120b"})) == 9000.0
    assert peak_tflops(Config().with_values({"hardware.preset": "h100-sxm", "model.preset": "gpt-oss-120b"})) == 989.0


def test_sparse_attention_keeps_its_indexer_keys():
    """DeepSeek-V3.2 and GLM-5 cache the indexer's fp8 key (128 values and a 4-byte scale) per
    token and layer beside the latent KV; the indexer's weights are counted."""
    g = Config().with_values({"model.preset": "glm-5"}).model
    assert g.kv_bytes_per_token == 78 * ((512 + 64) * 2 + 132)
    assert (g.n_layers, g.experts, g.experts_per_token, g.moe_layers) == (78, 256, 8, 75)
    assert shape("deepseek-v3.2").total - shape("deepseek-v3").total == 61 * (
        1536 * 64 * 128 + 7168 * 128 + 7168 * 64 + 2 * 128)


@pytest.mark.parametrize("name, what", [("mistral-7b", "sliding-window attention in every layer (4096 tokens)")])
def test_what_is_not_full_attention_is_said_once_on_stderr(tmp_path, root, name, what):
    folder = tmp_path / name  # a copy: the notice comes with a file's first import in a process
    folder.mkdir()
    (folder / "config.json").write_bytes(open(MODELS[name], "rb").read())
    from fastsim.cli import common

    with warnings.catch_warnings():  # as the command line shows them (pytest records warnings instead)
        warnings.simplefilter("default", hf_config.Approximation)
        warnings.showwarning = common._show_warning
        result = CliRunner().invoke(app, ["run", str(root / "configs/h100.yaml"), "--set",
                                          f"model.config_json={folder}/config.json", "--set", "workload.n_requests=20",
                                          "--set", "hardware.preset=b200", "--set", "engine.tp=8",
                                          "--set", "model.dtype=fp8"])  # (GLM-5 in bf16 needs more than 8 B200s)
    assert result.exit_code == 0, result.output
    notices = [line for line in result.stderr.splitlines() if line.startswith("notice: ")]
    assert len(notices) == 1 and what in notices[0] and "imported as full attention" in notices[0]


@pytest.mark.parametrize("name, window, tokens, kind, linear, state", [
    ("gpt-oss-120b", 18, 128, "sliding", 0, 0),  # half its layers a 128-token window (layer_types)
    ("gpt-oss-20b", 12, 128, "sliding", 0, 0),
    ("llama-4-scout", 36, 8192, "chunked", 0, 0),  # chunked in 3 layers of 4 (the rotary ones)
    # 3 of 4 layers Gated DeltaNet: a conv state of (2 x 16 x 128 + 32 x 128) x 3 bf16 values and a
    # recurrent state of 32 x 128 x 128, bf16 (Qwen3-Next) or float32 (Qwen3.5, its mamba_ssm_dtype)
    ("qwen3-next-80b-a3b", 0, None, "sliding", 36, 8192 * 3 * 2 + 32 * 128 * 128 * 2),
    ("qwen3.5-397b-a17b", 0, None, "sliding", 45, (4096 + 64 * 128) * 3 * 2 + 64 * 128 * 128 * 4),
])
def test_hybrid_attention_imports_its_layer_kinds_without_a_notice(name, window, tokens, kind, linear, state):
    assert not hf_config.read(MODELS[name]).notices  # what they hold is modelled
    got = hf_config.read(MODELS[name]).fields()
    assert (got["window_layers"], got["window_tokens"], got["window_kind"]) == (window, tokens, kind)
    assert (got["linear_layers"], got["linear_state_bytes"]) == (linear, state)


@pytest.mark.parametrize("name, heads", [("deepseek-v3.2", 64), ("glm-5", 32)])
def test_sparse_attention_imports_its_indexer_and_top_k(name, heads):
    shape = hf_config.read(MODELS[name])
    assert not shape.notices
    got = shape.fields()
    assert (got["sparse_topk"], got["index_heads"], got["index_head_dim"]) == (2048, heads, 128)


def test_an_unknown_architecture_names_the_file_and_the_supported_ones(tmp_path, root):
    path = tmp_path / "config.json"
    path.write_text('{"architectures": ["Qwen9ForCausalLM"], "hidden_size": 8}')
    result = CliRunner().invoke(app, ["run", str(root / "configs/h100.yaml"), "--set", f"model.config_json={path}"])
    assert result.exit_code == 2
    assert f"model.config_json: {path}: architecture 'Qwen9ForCausalLM' is not supported (supported: " \
           "LlamaForCausalLM" in result.stderr


def test_a_window_beyond_the_context_names_the_field(tmp_path, root):
    raw = json.load(open(MODELS["gpt-oss-20b"]))
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**raw, "sliding_window": 200000}))
    result = CliRunner().invoke(app, ["run", str(root / "configs/h100.yaml"), "--set", f"model.config_json={path}"])
    assert result.exit_code == 2
    assert "'sliding_window' (200000) exceeds max_position_embeddings (131072)" in result.stderr


def test_config_json_is_relative_to_its_file_and_replaces_the_preset(tmp_path, root):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "config.json").write_bytes(open(MODELS["qwen3-8b"], "rb").read())
    (tmp_path / "mine.yaml").write_text(f"extends: {root / 'configs/h100.yaml'}\nmodel:\n  config_json: models/config.json\n")
    from fastsim import load_config

    c = load_config(tmp_path / "mine.yaml")  # h100.yaml names a preset: this file's config.json replaces it
    assert c.model.preset is None and c.model.n_layers == 36
    back = load_config(tmp_path / "mine.yaml", {"model.preset": "llama-3.1-8b"})
    assert back.model.config_json is None and back.model.n_layers == 32
    same = Config().with_values({"model.preset": "qwen3-8b"}).model
    assert c.model.model_dump(exclude={"preset", "config_json"}) == same.model_dump(exclude={"preset", "config_json"})


def test_the_kv_cache_per_gpu_follows_vllms_sharding():
    """Llama-3.1-70B (8 KV heads) at tp 4, 8 and 16; DeepSeek-V3's latent at tp 8; an FP8 cache."""
    base = Config().with_values({"hardware.preset": "h100-sxm", "model.preset": "llama-3.1-70b"})
    head = 80 * 2 * 128 * 2  # one KV head of every layer, bf16
    for tp, heads_per_gpu in ((4, 2), (8, 1), (16, 1)):
        c = base.with_values({"engine.tp": tp})
        assert kv_bytes_per_gpu(c) == heads_per_gpu * head
        tokens = math.floor((80 * 0.9 - 2 - c.model.weight_gb / tp) * 1e9 / (heads_per_gpu * head))
        assert kv_blocks(c) == tokens // 16
    d = Config().with_values({"hardware.preset": "h200", "model.preset": "deepseek-v3", "engine.tp": 8})
    latent = 61 * (512 + 64) * 2
    assert kv_bytes_per_gpu(d) == latent  # whole on every GPU
    assert kv_blocks(d) == math.floor((141 * 0.9 - 2 - d.model.weight_gb / 8) * 1e9 / latent) // 16
    fp8 = base.with_values({"engine.tp": 8, "model.kv_dtype": "fp8"})
    assert kv_bytes_per_gpu(fp8) == head / 2
    assert kv_blocks(fp8) == math.floor((80 * 0.9 - 2 - fp8.model.weight_gb / 8) * 1e9 / (head / 2)) // 16
