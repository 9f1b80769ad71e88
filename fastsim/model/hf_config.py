"""Reading a Hugging Face ``config.json``: a model's shape, its parameters counted by kind, and
the ``model:`` fields they give at a precision (docs/model/deployed.md).

Parameters are counted from the file alone, by architecture family: attention (standard, or
DeepSeek's multi-head latent attention), dense MLPs, routed and shared experts, routers, norms,
biases, the embedding and the LM head. Linear layers of the transformer take the model's dtype;
embeddings, norms, routers, biases and the LM head stay bf16. A ``quantization_config`` block
(or a ``hf_quant_config.json`` beside the file) gives the dtype and, where it says so, the KV
cache's. Nothing is fetched; a file is read once per process.
"""

from __future__ import annotations

import functools
import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WEIGHT_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5625, "mxfp4": 0.53125, "int4": 0.5625}
"""Bytes a weight: fp4 (NVFP4) is 4 bits and an 8-bit scale per 16 weights, mxfp4 4 bits and an
8-bit scale per 32, int4 4 bits and a bf16 scale per 32."""
KV_BYTES = {"bf16": 2.0, "fp8": 1.0}


class Approximation(UserWarning):
    """What importing a model approximates (shown once per model and process)."""


class ModelFileError(ValueError):
    """A config.json that cannot be read as a model; the message names the file and the field."""


@dataclass(frozen=True)
class Shape:
    """A model as its config.json describes it (counts in parameters, not bytes)."""

    architecture: str
    n_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    linear: int  # linear weights of the transformer layers, every expert (stored at the dtype)
    plain: int  # embeddings, LM head (untied), norms, routers, biases (stored bf16)
    active: int  # parameters each computed token multiplies through, without embeddings and LM head
    kv_lora_rank: int = 0  # MLA: the latent KV (0: standard attention)
    qk_rope_head_dim: int = 0
    experts: int = 0  # routed experts per MoE layer (0: dense)
    experts_per_token: int = 0
    moe_layers: int = 0
    expert: int = 0  # parameters of one routed expert of one layer
    dtype: str = "bf16"  # from the quantization config
    kv_dtype: str = "bf16"
    kept: int = 0  # of ``linear``, the weights the checkpoint leaves bf16 (its quantization's ignore list)
    index_head_dim: int = 0  # DeepSeek sparse attention: the indexer's key per token and layer (0: none),
    index_heads: int = 0  # its query heads, and the tokens each query attends
    index_topk: int = 0
    window_layers: int = 0  # local attention (:mod:`.kv_groups`): layers, their window or chunk, which
    window_tokens: int | None = None
    window_kind: str = "sliding"
    linear_layers: int = 0  # linear attention: layers, one request's state in one of them (bytes)
    linear_state: int = 0
    mtp_layers: int = 0  # multi-token-prediction layers (a speculative decoding draft)
    notices: tuple[str, ...] = field(default=(), compare=False)  # what the import approximates

    @property
    def family(self) -> str:
        """The architecture without its class suffix (Llama, Qwen3Moe, DeepseekV3...)."""
        return self.architecture.removesuffix("ForCausalLM").removesuffix("ForConditionalGeneration")

    @property
    def total(self) -> int:
        """Every parameter stored."""
        return self.linear + self.plain

    @property
    def active_with_head(self) -> int:
        """Parameters each token multiplies through, the LM head included (the embedding is a lookup)."""
        return self.active + self.vocab * self.hidden

    def fields(self, dtype: str | None = None, kv_dtype: str | None = None) -> dict[str, Any]:
        """The ``model:`` fields at ``dtype`` and ``kv_dtype`` (None: the file's)."""
        dtype, kv_dtype = dtype or self.dtype, kv_dtype or self.kv_dtype
        mla = self.kv_lora_rank > 0
        kv_values = self.kv_lora_rank + self.qk_rope_head_dim if mla else 2 * self.kv_heads * self.head_dim
        # the sparse-attention indexer's keys: fp8 with a 4-byte scale per 128 values, whatever the KV dtype
        index = self.index_head_dim + 4 * -(-self.index_head_dim // 128)
        return dict(
            dtype=dtype, kv_dtype=kv_dtype,
            weight_gb=((self.linear - self.kept) * WEIGHT_BYTES[dtype]
                       + (self.kept + self.plain) * WEIGHT_BYTES["bf16"]) / 1e9,
            kv_bytes_per_token=float(self.n_layers * (kv_values * KV_BYTES[kv_dtype] + index)),
            params_b=self.active / 1e9, vocab=self.vocab, hidden=self.hidden, n_layers=self.n_layers,
            heads=self.heads, kv_heads=self.kv_heads, head_dim=self.head_dim,
            kv_lora_rank=self.kv_lora_rank, qk_rope_head_dim=self.qk_rope_head_dim,
            attn_dim=self.heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim) // 2 if mla
            else self.heads * self.head_dim,
            experts=self.experts, experts_per_token=self.experts_per_token, moe_layers=self.moe_layers,
            expert_gb=self.expert * WEIGHT_BYTES[dtype] / 1e9,
            window_layers=self.window_layers, window_tokens=self.window_tokens, window_kind=self.window_kind,
            linear_layers=self.linear_layers, linear_state_bytes=float(self.linear_state),
            sparse_topk=self.index_topk or None, index_heads=self.index_heads, index_head_dim=self.index_head_dim,
            mtp_layers=self.mtp_layers,
        )

    @property
    def full_layers(self) -> int:
        """Layers with full attention (KV for every token)."""
        return self.n_layers - self.window_layers - self.linear_layers


class _Reader:
    """Fields of one config.json, with errors that name the file and the field."""

    def __init__(self, path: Path, raw: dict, architecture: str):
        self.path, self.raw, self.architecture = path, raw, architecture
        self.kind = READ_AS.get(architecture, architecture)  # the family whose fields it has

    def get(self, key: str, default: Any = None) -> Any:
        value = self.raw.get(key)
        return default if value is None else value

    def int(self, key: str, default: int | None = None) -> int:
        value = self.raw.get(key)
        if value is None:
            if default is not None:
                return default
            raise ModelFileError(f"{self.path}: field {key!r} missing (the {self.architecture} architecture needs it)")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ModelFileError(f"{self.path}: field {key!r} must be a whole number >= 0 (got {value!r})")
        return value


def _attention(r: _Reader) -> tuple[int, int, int, int, int]:
    """(heads, kv_heads, head_dim, linear, plain) of one standard attention layer."""
    hidden, heads = r.int("hidden_size"), r.int("num_attention_heads")
    kv = r.int("num_key_value_heads", heads)
    for name, value in (("num_attention_heads", heads), ("num_key_value_heads", kv), ("hidden_size", hidden)):
        if value == 0:
            raise ModelFileError(f"{r.path}: field {name!r} must be at least 1")
    hd = r.int("head_dim", hidden // heads)
    linear = 2 * hidden * heads * hd + 2 * hidden * kv * hd  # q, o; k, v
    plain = 0
    if r.get("attention_bias", False):
        plain += (heads + 2 * kv) * hd + hidden
    if r.kind.startswith("Qwen2"):  # q, k, v biases
        plain += (heads + 2 * kv) * hd
    if r.kind.startswith("Qwen3"):  # q and k norms
        plain += 2 * hd
    if r.kind.startswith("MiniMaxM2"):  # q and k norms over every head
        plain += (heads + kv) * hd
    if r.kind.startswith("GptOss"):  # a sink per head
        plain += heads
    if r.kind.startswith(HYBRID):  # an output gate per query head (in q_proj)
        linear += hidden * heads * hd
    return heads, kv, hd, linear, plain


def _linear_state(r: _Reader) -> int:
    """Bytes of one request's state in one Gated DeltaNet layer: its convolution's last kernel - 1
    inputs (bf16) and its recurrent state, value heads x key x value dimensions (at the file's
    ``mamba_ssm_dtype``, bf16 where it names none), as vLLM holds them."""
    nk, dk = r.int("linear_num_key_heads"), r.int("linear_key_head_dim")
    nv, dv = r.int("linear_num_value_heads"), r.int("linear_value_head_dim")
    ssm = 4 if str(r.get("mamba_ssm_dtype", "")).lower() in ("float32", "fp32") else 2
    return (2 * nk * dk + nv * dv) * (r.int("linear_conv_kernel_dim", 4) - 1) * 2 + nv * dk * dv * ssm


def _local(r: _Reader, n: int) -> tuple[int, int | None, str]:
    """(layers, window tokens, kind) of a model's local attention: sliding-window layers its
    ``layer_types`` name (gpt-oss, Gemma) or its pattern gives (Gemma 3: all but every
    ``sliding_window_pattern``-th; Gemma 2: every other), or Llama 4's chunked layers (those with
    rotary embeddings: all but every fourth unless ``no_rope_layers`` lists them); none where
    every layer is local (such a model is taken as full attention, with a notice)."""
    types = r.get("layer_types")
    window = r.get("sliding_window")
    if isinstance(types, list) and len(types) == n and "sliding_attention" in types and window:
        return types.count("sliding_attention"), r.int("sliding_window"), "sliding"
    if r.kind.startswith("Gemma3") and window and r.get("sliding_window_pattern"):
        return n - n // max(r.int("sliding_window_pattern"), 1), r.int("sliding_window"), "sliding"
    if r.kind.startswith("Gemma2") and window:
        return (n + 1) // 2, r.int("sliding_window"), "sliding"
    if r.kind.startswith("Llama4") and r.get("attention_chunk_size"):
        listed = r.get("no_rope_layers") or []
        chunked = sum(1 for x in listed if x) if len(listed) == n else n - n // 4
        return chunked, r.int("attention_chunk_size"), "chunked"
    return 0, None, "sliding"


def _linear_attention(r: _Reader) -> tuple[int, int]:
    """(linear, plain) of one Gated DeltaNet layer (Qwen3-Next, Qwen3.5)."""
    hidden = r.int("hidden_size")
    nk, dk = r.int("linear_num_key_heads"), r.int("linear_key_head_dim")
    nv, dv = r.int("linear_num_value_heads"), r.int("linear_value_head_dim")
    linear = hidden * (2 * nk * dk + 2 * nv * dv) + hidden * 2 * nv + nv * dv * hidden  # qkvz, b and a, out
    return linear, (2 * nk * dk + nv * dv) * r.int("linear_conv_kernel_dim", 4) + 2 * nv + dv


def _full_layers(r: _Reader, n: int) -> list[bool]:
    """Which layers of a hybrid model have full attention (the others linear attention)."""
    types = r.get("layer_types")
    if isinstance(types, list) and len(types) == n:
        return [t == "full_attention" for t in types]
    interval = max(r.int("full_attention_interval", 4), 1)
    return [(i + 1) % interval == 0 for i in range(n)]


def _mla(r: _Reader) -> tuple[int, int, int, int, int, int, int]:
    """(heads, kv_heads, head_dim, kv_lora_rank, qk_rope_head_dim, linear, plain) of one
    multi-head latent attention layer (DeepSeek-V2/V3)."""
    hidden, heads = r.int("hidden_size"), r.int("num_attention_heads")
    lora, rope, nope, v = r.int("kv_lora_rank"), r.int("qk_rope_head_dim"), r.int("qk_nope_head_dim"), r.int("v_head_dim")
    q_lora = r.int("q_lora_rank", 0)
    q = hidden * q_lora + q_lora * heads * (nope + rope) if q_lora else hidden * heads * (nope + rope)
    linear = q + hidden * (lora + rope) + lora * heads * (nope + v) + heads * v * hidden
    plain = q_lora + lora
    if r.get("index_topk"):  # DeepSeek sparse attention's indexer: queries from the q latent, one key, head weights
        nh, hd = r.int("index_n_heads"), r.int("index_head_dim")
        linear += (q_lora or hidden) * nh * hd + hidden * hd + hidden * nh
        plain += 2 * hd  # the key's norm
    return heads, r.int("num_key_value_heads", heads), nope + rope, lora, rope, linear, plain


def _moe(r: _Reader) -> tuple[list[bool], int, int, int, int, int]:
    """Per layer whether it routes, and (experts, k, one expert, shared experts, router) of a
    MoE layer."""
    a, n, hidden = r.kind, r.int("num_hidden_layers"), r.int("hidden_size")
    if a.startswith(("Mixtral", "MiniMaxM2")):
        e, k, inter = r.int("num_local_experts"), r.int("num_experts_per_tok"), r.int("intermediate_size")
        bias = e if a.startswith("MiniMaxM2") and r.get("use_routing_bias", False) else 0
        return [True] * n, e, k, 3 * hidden * inter, 0, hidden * e + bias
    if a.startswith(("Qwen2Moe", "Qwen3Moe", *HYBRID)):
        e, k, inter = r.int("num_experts"), r.int("num_experts_per_tok"), r.int("moe_intermediate_size")
        step, dense = r.int("decoder_sparse_step", 1), set(r.get("mlp_only_layers", []))
        routes = [i not in dense and e > 0 and (i + 1) % max(step, 1) == 0 for i in range(n)]
        shared = r.int("shared_expert_intermediate_size", 0)
        return routes, e, k, 3 * hidden * inter, 3 * hidden * shared + (hidden if shared else 0), hidden * e
    if a.startswith("Deepseek"):
        e, k, inter = r.int("n_routed_experts"), r.int("num_experts_per_tok"), r.int("moe_intermediate_size")
        first, freq = r.int("first_k_dense_replace", 0), max(r.int("moe_layer_freq", 1), 1)
        routes = [i >= first and i % freq == 0 for i in range(n)]
        bias = e if r.get("topk_method") == "noaux_tc" else 0  # the score-correction bias
        return routes, e, k, 3 * hidden * inter, 3 * hidden * inter * r.int("n_shared_experts", 0), hidden * e + bias
    if a.startswith("GptOss"):
        e, inter = r.int("num_local_experts"), r.int("intermediate_size")
        k = r.int("num_experts_per_tok", r.int("experts_per_token", 0) or None)
        return [True] * n, e, k, 3 * hidden * inter, 0, hidden * e + e
    if a.startswith("Llama4"):
        e, k, inter = r.int("num_local_experts"), r.int("num_experts_per_tok"), r.int("intermediate_size")
        step = max(r.int("interleave_moe_layer_step", 1), 1)
        listed = r.get("moe_layers")
        routes = [i in set(listed) for i in range(n)] if listed is not None else [(i + 1) % step == 0 for i in range(n)]
        return routes, e, k, 3 * hidden * inter, 3 * hidden * inter, hidden * e
    return [False] * n, 0, 0, 0, 0, 0


def _dense_mlp(r: _Reader) -> int:
    key = "intermediate_size_mlp" if r.kind.startswith("Llama4") else "intermediate_size"
    return 3 * r.int("hidden_size") * r.int(key)


HYBRID = ("Qwen3Next", "Qwen3_5")  # linear attention in 3 layers of 4 (Gated DeltaNet)
DENSE = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "GemmaForCausalLM",
         "Gemma2ForCausalLM", "Gemma3ForCausalLM")
MOE = ("MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV2ForCausalLM",
       "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "GptOssForCausalLM", "Llama4ForConditionalGeneration",
       "Llama4ForCausalLM", "Qwen3NextForCausalLM", "Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM",
       "MiniMaxM2ForCausalLM", "KimiK25ForConditionalGeneration", "GlmMoeDsaForCausalLM")
ARCHITECTURES = DENSE + MOE
"""The ``architectures`` a config.json may name."""
READ_AS = {"KimiK25ForConditionalGeneration": "DeepseekV3ForCausalLM",  # its text tower is DeepSeek-V3's
           "GlmMoeDsaForCausalLM": "DeepseekV32ForCausalLM"}  # MLA, DeepSeek's MoE and its sparse attention
"""Architectures read with another's fields."""


def _quantization(path: Path, raw: dict, text: dict) -> tuple[str, str, tuple[str, ...]]:
    """(dtype, kv_dtype, the modules it leaves unquantised) the file's quantization says (bf16
    where it says nothing); a multimodal file may give it in its text tower."""
    q = raw.get("quantization_config", text.get("quantization_config"))
    beside = path.with_name("hf_quant_config.json")
    if q is None and beside.is_file():
        q = _read(beside).get("quantization", {})
        q = {"quant_method": "modelopt", **q}
    if q is None:
        return "bf16", "bf16", ()
    if not isinstance(q, dict):
        raise ModelFileError(f"{path}: field 'quantization_config' must be a mapping")
    method = str(q.get("quant_method", "")).lower()
    kv = "fp8" if str(q.get("kv_cache_quant_algo", "")).upper() == "FP8" or q.get("kv_cache_scheme") else "bf16"
    ignored = q.get("ignore") or q.get("modules_to_not_convert") or q.get("exclude_modules") or []
    ignored = tuple(str(m) for m in ignored) if isinstance(ignored, list) else ()
    if method in ("fp8", "fbgemm_fp8"):
        return "fp8", kv, ignored
    if method == "mxfp4":
        return "mxfp4", kv, ignored
    if method == "modelopt":  # in hf_quant_config.json, or inline
        algo = str(q.get("quant_algo", "")).upper()
        if algo in ("FP8", "NVFP4"):
            return ("fp8" if algo == "FP8" else "fp4"), kv, ignored
        raise ModelFileError(f"{path}: quant_algo {algo!r} is not supported (FP8, NVFP4)")
    if method == "compressed-tensors":
        kinds = {(g["weights"].get("type"), g["weights"].get("num_bits")) for g in q.get("config_groups", {}).values()
                 if isinstance(g, dict) and isinstance(g.get("weights"), dict)}
        named = {("float", 8): "fp8", ("float", 4): "fp4", ("int", 4): "int4"}
        if len(kinds) == 1 and next(iter(kinds)) in named:
            return named[next(iter(kinds))], kv, ignored
        raise ModelFileError(f"{path}: compressed-tensors weights other than float 8 or 4 bits or int 4 bits "
                             "are not supported")
    raise ModelFileError(f"{path}: field 'quantization_config.quant_method' {method!r} is not supported "
                         "(fp8, mxfp4, modelopt FP8/NVFP4, compressed-tensors float or int4)")


def _left_bf16(ignored: tuple[str, ...]) -> tuple[bool, bool, bool, bool]:
    """Whether a quantization's ignore list leaves (full attention, linear attention, shared
    experts, dense MLPs) bf16: checkpoints that do leave a kind out name it in every layer."""
    return (any("self_attn" in m for m in ignored), any("linear_attn" in m for m in ignored),
            any("shared_expert" in m for m in ignored),
            any(re.search(r"mlp\\?\.\(?(gate|up|down)[|_]", m) and "expert" not in m for m in ignored))


def _mtp_layers(r: _Reader) -> int:
    """Multi-token-prediction layers: DeepSeek's and GLM's ``num_nextn_predict_layers``, Qwen3.5's
    ``mtp_num_hidden_layers``, MiniMax's modules of ``mtp_transformer_layers`` when ``use_mtp``."""
    if r.get("use_mtp"):
        return r.int("num_mtp_modules", 1) * r.int("mtp_transformer_layers", 1)
    return r.int("num_nextn_predict_layers", 0) or r.int("mtp_num_hidden_layers", 0)


def _notices(r: _Reader, name: str, local: int) -> tuple[str, ...]:
    """What the import approximates: a model local in every layer is taken as full attention."""
    notices = []
    if not local and r.get("sliding_window") and r.get("use_sliding_window", True) is not False:
        notices.append(f"{name}: sliding-window attention in every layer ({r.get('sliding_window')} tokens) imported "
                       "as full attention (KV cache and attention cost overstated for long contexts)")
    return tuple(notices)


def _read(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelFileError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelFileError(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc.reason})") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelFileError(f"{path}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    if not isinstance(raw, dict):
        raise ModelFileError(f"{path}: expected a JSON object")
    return raw


@functools.lru_cache(maxsize=256)
def read(path: str) -> Shape:
    """The shape of the model a config.json describes (read once per process)."""
    p = Path(path)
    raw = _read(p)
    names = raw.get("architectures")
    if not isinstance(names, list) or not names or not isinstance(names[0], str):
        raise ModelFileError(f"{p}: field 'architectures' missing (a list naming one of: {', '.join(ARCHITECTURES)})")
    architecture = names[0]
    if architecture not in ARCHITECTURES:
        raise ModelFileError(f"{p}: architecture {architecture!r} is not supported "
                             f"(supported: {', '.join(ARCHITECTURES)})")
    text = raw.get("text_config") if "ConditionalGeneration" in architecture and "text_config" in raw else raw
    if not isinstance(text, dict):
        raise ModelFileError(f"{p}: field 'text_config' must be a mapping")
    r = _Reader(p, text, architecture)
    n, hidden = r.int("num_hidden_layers"), r.int("hidden_size")
    vocab = r.int("vocab_size")
    lora = rope = 0
    if r.kind.startswith("Deepseek"):
        heads, kv, hd, lora, rope, attention, attention_plain = _mla(r)
    else:
        heads, kv, hd, attention, attention_plain = _attention(r)
    full = _full_layers(r, n) if r.kind.startswith(HYBRID) else [True] * n
    delta, delta_plain = _linear_attention(r) if not all(full) else (0, 0)
    attention_all = sum(attention if f else delta for f in full)
    attention_plain_all = sum(attention_plain if f else delta_plain for f in full)
    routes, experts, k, expert, shared, router = _moe(r)
    if experts and not 0 < k <= experts:
        raise ModelFileError(f"{p}: experts per token must be from 1 to the {experts} experts (got {k})")
    moe_layers = sum(routes)
    dense_mlp = _dense_mlp(r) if moe_layers < n else 0
    tied = r.get("tie_word_embeddings", r.kind.startswith("Gemma"))
    linear = attention_all + (n - moe_layers) * dense_mlp + moe_layers * (experts * expert + shared)
    norms = 2 * hidden * n + hidden
    plain = vocab * hidden * (1 if tied else 2) + attention_plain_all + moe_layers * router + norms
    if r.kind.startswith("GptOss"):  # expert biases: gate_up and down
        plain += moe_layers * experts * (2 * r.int("intermediate_size") + hidden)
    active = attention_all + (n - moe_layers) * dense_mlp + moe_layers * (k * expert + shared + router)
    dtype, kv_dtype, ignored = _quantization(p, raw, text)
    attention_kept, delta_kept, shared_kept, dense_kept = _left_bf16(ignored)
    kept = (attention_kept * sum(full) * attention + delta_kept * (n - sum(full)) * delta
            + shared_kept * moe_layers * shared + dense_kept * (n - moe_layers) * dense_mlp)
    local, window, kind = _local(r, n)
    context = r.int("max_position_embeddings", 0)
    if local and context and window > context:
        raise ModelFileError(f"{p}: field {'sliding_window' if kind == 'sliding' else 'attention_chunk_size'!r} "
                             f"({window}) exceeds max_position_embeddings ({context}): no context reaches it")
    notices = _notices(r, p.parent.name or p.name, local)
    for notice in notices:
        warnings.warn(notice, Approximation, stacklevel=2)
    return Shape(architecture, n, hidden, heads, kv, hd, vocab, linear, plain, active, lora, rope, experts, k,
                 moe_layers, expert, dtype, kv_dtype, kept=kept,
                 index_head_dim=r.int("index_head_dim", 0) if r.get("index_topk") else 0,
                 index_heads=r.int("index_n_heads", 0) if r.get("index_topk") else 0,
                 index_topk=r.int("index_topk", 0),
                 window_layers=local, window_tokens=window, window_kind=kind, linear_layers=n - sum(full),
                 linear_state=_linear_state(r) if not all(full) else 0, mtp_layers=_mtp_layers(r), notices=notices)

