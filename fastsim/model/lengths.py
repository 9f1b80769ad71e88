"""Token-length distributions (a workload's prompts and outputs).

``fixed`` is ``value``; ``uniform`` the integers ``min``..``max`` (or, given ``value`` and a
``range_ratio`` r as benchmark clients take them, ceil(r x value)..value); ``lognormal`` is
int(exp(N(mu, sigma))) clamped to ``min``..``max``, where ``mu`` and ``sigma`` are the mean and
standard deviation of the *log* of the length. People describe lengths in tokens, so a lognormal
may instead be given by its ``median`` (tokens: mu = ln median) and its ``p90`` (tokens: the
unclamped 90th percentile, sigma = ln(p90 / median) / z, z = 1.2816 the standard normal's 90th
percentile) or ``sigma``. A median beyond ``max`` (a ``mu`` of 1500 meant as tokens is a median
of e^1500) is refused, naming the median it implies.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from .fields import Finite, Int, Section, doc

Z90 = 1.2815515655446004  # the standard normal's 90th percentile
DIST = "fixed (value), lognormal (median and p90, or mu and sigma; clamped to min..max) or uniform (min..max)"
MU = "lognormal: mean of the log of the length"
SIGMA = "lognormal: standard deviation of the log of the length"


class _Lengths(Section):
    dist: Literal["fixed", "lognormal", "uniform"]
    range_ratio: float | None = Field(None, gt=0, le=1, **Finite, **doc(
        "with value: uniform between range_ratio x value and value, as vLLM bench's --random-range-ratio "
        "(sets dist uniform, min and max; null: not used)", "fraction"))
    median: float | None = Field(None, gt=0, **Finite, **doc("lognormal: the median length (sets mu = ln median)",
                                                              "tokens"))
    p90: float | None = Field(None, gt=0, **Finite, **doc(
        "lognormal: the unclamped 90th percentile (sets sigma = ln(p90 / median) / 1.2816)", "tokens"))

    @model_validator(mode="before")
    @classmethod
    def _range(cls, data):
        """``value`` and ``range_ratio`` r: the integers ceil(r x value)..value, drawn uniformly."""
        if isinstance(data, dict) and data.get("range_ratio") is not None:
            r, value = data["range_ratio"], data.get("value", cls.model_fields["value"].default)
            if isinstance(r, (int, float)) and isinstance(value, int) and 0 < r <= 1:
                low = max(math.ceil(r * value - 1e-9), 1 if cls is Output else 0)
                data = {**data, "dist": "uniform", "min": low, "max": value}  # (over a config's dist, min, max)
        return data

    @model_validator(mode="after")
    def _consistent(self) -> _Lengths:
        if self.range_ratio is not None and self.dist != "uniform":
            raise ValueError("range_ratio needs value (it draws uniform lengths from range_ratio x value to value)")
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        if self.dist != "lognormal":
            if self.median is not None or self.p90 is not None:
                raise ValueError(f"median and p90 describe dist lognormal (dist is {self.dist})")
            return self
        if self.median is not None:
            self._derive("mu", math.log(self.median), "median")
        if self.p90 is not None:
            median = math.exp(self.mu)
            if self.p90 <= median:
                raise ValueError(f"p90 ({self.p90:g}) must exceed the median ({median:.6g} tokens)")
            self._derive("sigma", math.log(self.p90 / median) / Z90, "p90")
        if self.mu > math.log(self.max) + 1e-9:  # the median beyond max, past rounding (e^ln(3) > 3)
            if self.median is not None:
                raise ValueError(f"median ({self.median:g}) is beyond max ({self.max})")
            median = f"{math.exp(self.mu):.6g}" if self.mu < 709 else f"e^{self.mu:g}"
            raise ValueError(f"mu ({self.mu:g}) is the log of the length: a median of {median} tokens, beyond "
                             f"max ({self.max}); to give the median in tokens, write median: {self.mu:g}")
        return self

    def _derive(self, name: str, value: float, source: str) -> None:
        """Set ``name`` from ``source``; both given is an error unless they agree (a resolved
        config written out holds both)."""
        if name in self.model_fields_set and not math.isclose(getattr(self, name), value, rel_tol=1e-12):
            raise ValueError(f"give {name} or {source}, not both ({name} {getattr(self, name):g} and {source} "
                             f"{getattr(self, source):g} disagree)")
        object.__setattr__(self, name, value)  # frozen model: derived once, while validating

    @property
    def smallest(self) -> int:
        return self.value if self.dist == "fixed" else self.min

    @property
    def largest(self) -> int:
        return self.value if self.dist == "fixed" else self.max


class Prompt(_Lengths):
    dist: Literal["fixed", "lognormal", "uniform"] = Field("fixed", **doc(DIST))
    value: Int = Field(1000, ge=0, **doc("fixed: every length", "tokens"))
    mu: float = Field(6.9, **Finite, **doc(MU, "ln(tokens)"))
    sigma: float = Field(1.0, ge=0, **Finite, **doc(SIGMA, "ln(tokens)"))
    min: Int = Field(1, ge=0, **doc("lognormal and uniform: the shortest length", "tokens"))
    max: Int = Field(8192, ge=0, **doc("lognormal and uniform: the longest length", "tokens"))


class Output(_Lengths):
    dist: Literal["fixed", "lognormal", "uniform"] = Field("lognormal", **doc(DIST))
    mu: float = Field(4.5, **Finite, **doc(MU, "ln(tokens)"))
    sigma: float = Field(1.0, ge=0, **Finite, **doc(SIGMA, "ln(tokens)"))
    min: Int = Field(1, ge=1, **doc("lognormal and uniform: the shortest length", "tokens"))
    max: Int = Field(2000, ge=1, **doc("lognormal and uniform: the longest length", "tokens"))
    value: Int = Field(148, ge=1, **doc("fixed: every length", "tokens"))
