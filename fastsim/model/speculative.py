"""Speculative decoding (docs/model/deployed.md, "Speculative decoding"): the ``engine.speculative``
section, and what it adds to a step and to memory.

Each step a decoding request verifies the ``tokens`` (k) tokens its draft proposed: it computes
k + 1 tokens (the last sampled and the k proposed) and emits 1 + the accepted ones, the draft
tokens accepted from the first until one is rejected. ``acceptance`` gives, per position, the
probability that the token there is accepted given that those before it were. The draft costs:

- ``mtp`` (a model's multi-token-prediction layers) and ``eagle`` (a one-layer head): each of
  the k draft passes runs one layer (``draft_layers``) beside the model's ``n_layers``;
- ``draft`` (a smaller model, ``draft_model``): each pass runs it, its share of the model's
  work its active parameters' share of the model's;
- ``ngram`` (prompt lookup): nothing.

A pass is charged that share of the step's roofline and per-layer overhead (:func:`draft_share`):
k passes make a step (1 + k x share) times as long, but for the fixed step overhead. The draft's
layers keep their own KV (:func:`draft_kv_share`) and weights (:func:`draft_weight_gb`) in the
GPUs' memory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from . import hf_config
from .fields import Finite, Int, Section, doc
from .presets import MODELS

LOOKAHEAD = {"mtp": True, "eagle": True, "draft": True, "ngram": False}
"""Methods whose draft runs ahead of the verified tokens: vLLM gives a running request slots for k
more tokens than it computes (``num_lookahead_tokens``)."""


class Speculative(Section):
    method: Literal["mtp", "eagle", "ngram", "draft"] = Field(..., **doc(
        "how tokens are proposed: mtp (the model's multi-token-prediction layers), eagle (a one-layer head), "
        "ngram (prompt lookup: free) or draft (a smaller model, speculative.draft_model)"))
    tokens: Int = Field(..., ge=1, le=16, **doc("tokens proposed and verified per step and request (k)", "tokens"))
    acceptance: float | list[float] = Field(..., **doc(
        "per position, the probability that a proposed token is accepted given the ones before it were (a "
        "list of at most k; positions past its end take its last value; one number: every position)",
        "probability"))
    draft_layers: Int | None = Field(None, ge=1, **doc(
        "mtp and eagle: layers one draft pass runs (null: mtp the model's model.mtp_layers, eagle 1)", "layers"))
    draft_model: str | None = Field(None, **doc(
        "draft: the draft model, a model preset or a Hugging Face config.json (its active parameters set the "
        "draft's cost, its weights and KV share the GPUs' memory)"))

    @field_validator("acceptance", mode="before")
    @classmethod
    def _probabilities(cls, value):
        values = value if isinstance(value, list) else [value]
        if not values:
            raise ValueError("a probability or a list of them, one per position (got an empty list)")
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ValueError(f"a probability from 0 to 1 per position (got {v!r})")
        return [float(v) for v in values] if isinstance(value, list) else float(value)

    @field_validator("draft_model")
    @classmethod
    def _known_model(cls, name: str | None) -> str | None:
        if name is None or name in MODELS:
            return name
        path = Path(name).expanduser()
        if path.suffix != ".json":
            raise ValueError(f"a model preset or a config.json (got {name!r}; presets: {', '.join(MODELS)})")
        path = str(path.resolve())
        hf_config.read(path)  # its errors name the file and the field
        return path

    @model_validator(mode="after")
    def _consistent(self) -> Speculative:
        if isinstance(self.acceptance, list) and len(self.acceptance) > self.tokens:
            raise ValueError(f"acceptance lists {len(self.acceptance)} positions, more than the "
                             f"engine.speculative.tokens proposed ({self.tokens})")
        if (self.method == "draft") != (self.draft_model is not None):
            raise ValueError(f"engine.speculative.draft_model names the draft model of method draft, and only of it "
                             f"(method {self.method}, draft_model {self.draft_model})")
        if self.draft_layers is not None and self.method not in ("mtp", "eagle"):
            raise ValueError(f"engine.speculative.draft_layers is an mtp or eagle draft's (method {self.method})")
        return self

    def per_position(self) -> list[float]:
        """The acceptance of each of the k positions."""
        values = self.acceptance if isinstance(self.acceptance, list) else [self.acceptance]
        return [values[min(j, len(values) - 1)] for j in range(self.tokens)]

    def mean_accepted_length(self) -> float:
        """Tokens a verification emits on average, unbounded by the output's end: 1 + the sum over
        positions of the chance that every position up to it is accepted."""
        total, reach = 1.0, 1.0
        for p in self.per_position():
            reach *= p
            total += reach
        return total

    @property
    def span(self) -> int:
        """KV slots a decoding request holds beyond its computed tokens in a step: the k + 1 it
        verifies, and k more where the draft runs ahead (:data:`LOOKAHEAD`)."""
        return 1 + self.tokens + (self.tokens if LOOKAHEAD[self.method] else 0)


def draft_shape(spec: Speculative) -> hf_config.Shape:
    """The draft model's shape (method draft)."""
    return hf_config.read(MODELS.get(spec.draft_model, spec.draft_model))


def draft_layers(spec: Speculative, model) -> int:
    """Layers one mtp or eagle draft pass runs (0 for the others)."""
    if spec.method == "mtp":
        return spec.draft_layers or model.mtp_layers
    return (spec.draft_layers or 1) if spec.method == "eagle" else 0


def draft_share(spec: Speculative | None, model) -> float:
    """One draft pass's share of a step's work (0: speculation off, or ngram)."""
    if spec is None or spec.method == "ngram":
        return 0.0
    if spec.method == "draft":
        if model.params_b:  # its active parameters against the model's
            return draft_shape(spec).active / (model.params_b * 1e9)
        return draft_weight_gb(spec, model) / model.weight_gb if model.weight_gb else 0.0  # (compute free: weights)
    return draft_layers(spec, model) / model.n_layers if model.n_layers else 0.0


def draft_weight_gb(spec: Speculative | None, model) -> float:
    """The draft's weights, kept beside the model's (0 for ngram): an mtp or eagle layer as one
    of the model's average layers, a draft model at its own dtype."""
    if spec is None or spec.method == "ngram":
        return 0.0
    if spec.method == "draft":
        return draft_shape(spec).fields()["weight_gb"]
    return model.weight_gb * draft_layers(spec, model) / model.n_layers if model.n_layers else 0.0


def draft_kv_share(spec: Speculative | None, model) -> float:
    """The draft's KV of a token, as a share of the model's: an mtp or eagle layer holds one of the
    model's layers' KV (a full-attention layer's), a draft model its own."""
    if spec is None or spec.method == "ngram" or not model.kv_bytes_per_token:
        return 0.0
    if spec.method == "draft":
        return draft_shape(spec).fields()["kv_bytes_per_token"] / model.kv_bytes_per_token
    return draft_layers(spec, model) / model.n_layers if model.n_layers else 0.0
