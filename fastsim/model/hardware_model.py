"""The two config sections a name fills: the GPU (``hardware``, from a datasheet preset) and the
model (``model``, from a Hugging Face config.json: a preset shipped in the package, or a file the
user names). Every field the config does not set explicitly takes the preset's value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from . import hf_config
from .fields import Finite, Int, Section, doc
from .presets import HARDWARE, MODELS



class _Preset(Section):
    """A section that a named preset (``fastsim presets`` lists them) can fill."""

    section: ClassVar[str]
    registry: ClassVar[dict[str, Any]]
    preset: str | None = Field(None, **doc("a named preset that fills every field of the section the config does not "
                                          "set (`fastsim presets` lists them)"))

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, name: str | None) -> str | None:
        if name is not None and name not in cls.registry:
            raise ValueError(f"unknown {cls.section} preset {name!r} (valid: {', '.join(cls.registry)})")
        return name

    def _filled(self) -> dict[str, Any]:
        """The values the preset gives (none without one)."""
        return {} if self.preset is None else self.registry[self.preset]

    @model_validator(mode="after")
    def _fill_from_preset(self) -> _Preset:
        for name, value in self._filled().items():
            if name not in self.model_fields_set:
                object.__setattr__(self, name, value)  # frozen model: filled once, while validating
        self._check()
        return self

    def _check(self) -> None:
        """Fields checked together, once filled."""


class Hardware(_Preset):
    section: ClassVar[str] = "hardware"
    registry: ClassVar[dict[str, Any]] = HARDWARE
    mem_bandwidth_tb_s: float = Field(3.35, gt=0, **Finite, **doc("memory bandwidth of one GPU", "TB/s"))
    peak_tflops: float | None = Field(None, gt=0, **Finite, **doc(
        "dense BF16 peak of one GPU (null: compute is free, as in the lesson)", "TFLOP/s"))
    peak_tflops_fp8: float | None = Field(None, gt=0, **Finite, **doc(
        "dense FP8 peak of one GPU (null: FP8 weights run dequantised at the BF16 peak)", "TFLOP/s"))
    peak_tflops_fp4: float | None = Field(None, gt=0, **Finite, **doc(
        "dense FP4 peak of one GPU (null: FP4 weights run dequantised at the BF16 peak)", "TFLOP/s"))
    mem_gb: float | None = Field(None, gt=0, **Finite, **doc(
        "memory of one GPU (null: the KV cache is unlimited unless engine.kv_cache_gb is set)", "GB"))
    link_gb_s: float | None = Field(None, gt=0, **Finite, **doc(
        "tensor-parallel link bandwidth per direction, per GPU", "GB/s"))
    link_latency_us: float = Field(0.0, ge=0, **Finite, **doc("latency of one all-reduce on the tensor-parallel link",
                                                                "us"))
    scaleup_gpus: Int | None = Field(None, ge=1, **doc(
        "GPUs the tensor-parallel link joins (one NVLink or Infinity Fabric domain: 8 on HGX-class boards, 72 on "
        "GB200 NVL72; null: any number); a group beyond it spans domains over hardware.scaleout_gb_s", "GPUs"))
    scaleout_gb_s: float | None = Field(None, gt=0, **Finite, **doc(
        "network bandwidth per GPU and direction between scale-up domains (null: none; a group cannot span them)",
        "GB/s"))
    scaleout_latency_us: float = Field(0.0, ge=0, **Finite, **doc(
        "latency each step between domains adds to a collective (a ring over N domains takes 2 (N - 1) steps)", "us"))
    usd_per_gpu_hour: float | None = Field(None, ge=0, **Finite, **doc(
        "on-demand price of one GPU-hour (a preset carries one, with its source; null: unknown, cost is NaN)",
        "USD/GPU-hour"))


class Model(_Preset):
    section: ClassVar[str] = "model"
    registry: ClassVar[dict[str, Any]] = MODELS
    config_json: str | None = Field(None, **doc(
        "a Hugging Face config.json that fills every model field the config does not set, like a preset "
        "(relative to the config file that names it; replaces model.preset)"))
    dtype: Literal["bf16", "fp8", "fp4", "mxfp4", "int4"] = Field("bf16", **doc(
        "the linear layers' weights: bf16 (2 bytes), fp8 (1), fp4 (NVFP4, 0.5625: 4 bits and an 8-bit scale per "
        "16), mxfp4 (0.53125: an 8-bit scale per 32) or int4 (0.5625: a bf16 scale per 32, weight-only); "
        "embeddings, norms, routers and the LM head stay bf16"))
    kv_dtype: Literal["bf16", "fp8"] = Field("bf16", **doc("the KV cache's values: bf16 (2 bytes) or fp8 (1)"))
    weight_gb: float = Field(15.008, ge=0, **Finite, **doc("weights, all of them at their dtypes", "GB"))
    kv_bytes_per_token: float = Field(131072.0, ge=0, **Finite, **doc(
        "KV cache of one token, all layers (a hybrid-attention model's as if every layer held full attention's: "
        "its local and linear-attention layers hold less, model.window_layers, model.linear_layers)", "bytes/token"))
    params_b: float | None = Field(None, gt=0, **Finite, **doc(
        "parameters each computed token multiplies through, without embeddings and LM head when model.vocab is "
        "set; a mixture of experts' active ones (null: compute is free)", "billions"))
    vocab: Int | None = Field(None, ge=1, **doc(
        "vocabulary: the LM head costs 2 hidden vocab FLOPs per sampled token (null: inside params_b)", "tokens"))
    n_layers: Int | None = Field(None, ge=1, **doc("transformer layers (attention cost, per-layer overhead, "
                                                   "all-reduces)", "layers"))
    hidden: Int | None = Field(None, ge=1, **doc("hidden size (the all-reduces' payload, the LM head)"))
    heads: Int | None = Field(None, ge=1, **doc("attention (query) heads"))
    kv_heads: Int | None = Field(None, ge=1, **doc(
        "KV heads: tensor parallelism splits them over its GPUs and replicates them when tp exceeds them "
        "(null: KV split evenly over tp)"))
    head_dim: Int | None = Field(None, ge=1, **doc("dimension of one attention head"))
    attn_dim: Int | None = Field(None, ge=1, **doc(
        "query-key work per token pair and layer: heads x head_dim (MLA: heads (2 kv_lora_rank + "
        "qk_rope_head_dim) / 2)"))
    kv_lora_rank: Int = Field(0, ge=0, **doc(
        "multi-head latent attention's KV rank (0: standard attention); its latent is held whole on every GPU"))
    qk_rope_head_dim: Int = Field(0, ge=0, **doc("multi-head latent attention's rotary key dimension"))
    experts: Int = Field(0, ge=0, **doc("routed experts per MoE layer (0: a dense model)", "experts"))
    experts_per_token: Int = Field(0, ge=0, **doc("routed experts each token picks (k)", "experts"))
    moe_layers: Int = Field(0, ge=0, **doc("layers that route to experts (the others are dense)", "layers"))
    expert_gb: float = Field(0.0, ge=0, **Finite, **doc("one routed expert of one layer, at dtype", "GB"))
    window_layers: Int = Field(0, ge=0, **doc(
        "layers whose attention is local: a sliding window of model.window_tokens tokens, or chunks of them "
        "(model.window_kind); each holds and reads at most a window of a request's KV, as vLLM's hybrid KV cache "
        "manager (0: none)", "layers"))
    window_tokens: Int | None = Field(None, ge=1, **doc("the local layers' window (or chunk)", "tokens"))
    window_kind: Literal["sliding", "chunked"] = Field("sliding", **doc(
        "sliding: a token attends to the window before it; chunked: to the tokens of its chunk before it"))
    linear_layers: Int = Field(0, ge=0, **doc(
        "linear-attention layers: a fixed state per running request in place of KV (0: none)", "layers"))
    linear_state_bytes: float = Field(0.0, ge=0, **Finite, **doc(
        "one request's state in one linear-attention layer, every head", "bytes"))
    sparse_topk: Int | None = Field(None, ge=1, **doc(
        "sparse attention (DeepSeek's, with multi-head latent attention): the tokens each query attends in every "
        "layer, which an indexer picks from all of them (null: dense attention)", "tokens"))
    index_heads: Int = Field(0, ge=0, **doc("the sparse-attention indexer's query heads"))
    index_head_dim: Int = Field(0, ge=0, **doc(
        "the indexer's key per token and layer (held in fp8 with a 4-byte scale per 128 values, inside "
        "model.kv_bytes_per_token)"))

    mtp_layers: Int = Field(0, ge=0, **doc(
        "multi-token-prediction layers the checkpoint ships (speculative decoding's mtp draft; 0: none)", "layers"))

    @field_validator("config_json")
    @classmethod
    def _readable(cls, path: str | None) -> str | None:
        if path is None:
            return None
        path = str(Path(path).expanduser().resolve())
        hf_config.read(path)  # its errors name the file and the field
        return path

    @model_validator(mode="before")
    @classmethod
    def _one_source(cls, raw: Any) -> Any:
        if isinstance(raw, dict) and raw.get("preset") is not None and raw.get("config_json") is not None:
            raise ValueError(f"model.preset ({raw['preset']}) and model.config_json ({raw['config_json']}) name the "
                             "same thing: set one")
        return raw

    def _filled(self) -> dict[str, Any]:
        source = self.config_json or (self.registry[self.preset] if self.preset else None)
        if source is None:
            return {}
        explicit = self.model_fields_set
        return hf_config.read(source).fields(self.dtype if "dtype" in explicit else None,
                                             self.kv_dtype if "kv_dtype" in explicit else None)

    def _check(self) -> None:
        if self.experts and not 1 <= self.experts_per_token <= self.experts:
            raise ValueError(f"model.experts_per_token ({self.experts_per_token}) must be from 1 to model.experts "
                             f"({self.experts})")
        if self.experts and (self.moe_layers < 1 or self.n_layers is not None and self.moe_layers > self.n_layers):
            raise ValueError(f"model.moe_layers ({self.moe_layers}) must be from 1 to model.n_layers ({self.n_layers}) "
                             "when model.experts is set")
        if self.experts and self.moe_layers * self.experts * self.expert_gb > self.weight_gb * (1 + 1e-9):
            raise ValueError(f"the routed experts (model.moe_layers x model.experts x model.expert_gb = "
                             f"{self.moe_layers * self.experts * self.expert_gb:g} GB) exceed model.weight_gb "
                             f"({self.weight_gb:g})")
        if self.hybrid:
            self._check_hybrid()
        if self.sparse_topk is not None and not (self.kv_lora_rank and self.index_heads and self.index_head_dim
                                                 and self.n_layers):
            raise ValueError("model.sparse_topk needs model.kv_lora_rank, model.index_heads, model.index_head_dim and "
                             "model.n_layers (DeepSeek's sparse attention over a latent cache)")
        if self.sparse_topk is not None and self.hybrid:
            raise ValueError("model.sparse_topk: sparse attention in every layer, not with model.window_layers or "
                             "model.linear_layers")
        if self.vocab is not None and self.hidden is None:
            raise ValueError("model.vocab needs model.hidden (the LM head is hidden x vocab)")

    @property
    def hybrid(self) -> bool:
        """Whether some layers hold less than full attention's KV (local or linear-attention layers)."""
        return bool(self.window_layers or self.linear_layers)

    def _check_hybrid(self) -> None:
        """Local and linear-attention layers: counted within the layers, with what they hold."""
        if self.n_layers is None:
            raise ValueError("model.window_layers and model.linear_layers need model.n_layers")
        if self.window_layers + self.linear_layers >= self.n_layers:
            raise ValueError(f"model.window_layers ({self.window_layers}) + model.linear_layers ({self.linear_layers}) "
                             f"must leave at least one full-attention layer of model.n_layers ({self.n_layers}); a "
                             "model that is local everywhere is taken as full attention (set both to 0)")
        if self.window_layers and self.window_tokens is None:
            raise ValueError(f"model.window_layers ({self.window_layers}) needs model.window_tokens")
        if self.linear_layers and self.linear_state_bytes <= 0:
            raise ValueError(f"model.linear_layers ({self.linear_layers}) needs model.linear_state_bytes > 0")
