"""What a workload says about shared content (docs/model/prefix-cache.md): system prompts shared
by groups of requests, and multi-turn sessions whose every turn re-sends the conversation so far.
Inert sections; the traffic layer draws from them (:mod:`fastsim.engine.content`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .fields import Finite, Int, Section, doc
from .lengths import DIST, MU, SIGMA, Prompt, _Lengths


class SystemPrompts(Section):
    count: Int = Field(1, ge=1, le=1_000_000, **doc("system prompts (groups of requests that share one)", "prompts"))
    tokens: Int = Field(..., ge=1, **doc("each system prompt's length: the first tokens of its requests", "tokens"))
    popularity: Literal["uniform", "zipf"] = Field("uniform", **doc(
        "how requests pick a system prompt: uniform, or zipf (the g-th most popular with weight 1 / g^zipf_s)"))
    zipf_s: float = Field(1.0, ge=0, le=10, **Finite, **doc("zipf popularity's exponent"))


class Turns(_Lengths):
    dist: Literal["fixed", "lognormal", "uniform"] = Field("uniform", **doc(DIST))
    value: Int = Field(4, ge=1, **doc("fixed: every session's turns", "turns"))
    mu: float = Field(1.0, **Finite, **doc(MU, "ln(turns)"))
    sigma: float = Field(0.5, ge=0, **Finite, **doc(SIGMA, "ln(turns)"))
    min: Int = Field(2, ge=1, **doc("lognormal and uniform: the fewest turns", "turns"))
    max: Int = Field(10, ge=1, le=100_000, **doc("lognormal and uniform: the most turns", "turns"))


class Think(Section):
    dist: Literal["fixed", "exponential", "lognormal"] = Field("exponential", **doc(
        "fixed (value), exponential (mean) or lognormal (mu, sigma of the log of seconds)"))
    value: float = Field(10.0, ge=0, **Finite, **doc("fixed: every think time", "s"))
    mean: float = Field(10.0, ge=0, **Finite, **doc("exponential: the mean think time", "s"))
    mu: float = Field(1.0, **Finite, **doc("lognormal: mean of the log of the think time", "ln(s)"))
    sigma: float = Field(1.0, ge=0, **Finite, **doc("lognormal: standard deviation of the log", "ln(s)"))


class Sessions(Section):
    turns: Turns = Turns()
    followup: Prompt | None = Field(None, **doc(
        "new tokens each later turn adds after the conversation so far (null: drawn like workload.prompt)"))
    think_s: Think = Think()
    max_context: Int | None = Field(None, ge=1, **doc(
        "a session ends before a turn whose prompt + output would pass this (null: the KV cache)", "tokens"))

    @model_validator(mode="after")
    def _some_turns(self) -> Sessions:
        if self.turns.largest < 1:
            raise ValueError("turns: every session has at least one turn")
        return self
