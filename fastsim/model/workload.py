"""The workload section of a config: what traffic a scenario serves (requests drawn or replayed,
open-loop arrivals at a rate or closed-loop clients, lengths, shared content, a warm-up). Inert
and frozen, like every section (:mod:`.schema`); the traffic layer draws from it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, PlainValidator, model_validator

from .fields import Finite, Int, Section, _integral, doc
from .lengths import Output, Prompt
from .prefix import Sessions, SystemPrompts, Think


WARMUP_UNITS = {"ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}


def _seconds(text: str) -> float:
    """A duration: a number and a unit of WARMUP_UNITS (``30 s``, ``2min``); KeyError or
    ValueError if it is not one."""
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    return float(number) * WARMUP_UNITS[text[len(number):]]


def _warmup(value: Any) -> int | str:
    """Requests (a whole number >= 0) or a duration (:func:`_seconds`)."""
    if isinstance(value, str):
        text = value.strip()
        try:
            seconds = _seconds(text)
        except (ValueError, KeyError):
            raise ValueError(f"a number of requests, or a duration with a unit of {', '.join(WARMUP_UNITS)} "
                             f"(e.g. 30 s; got {value!r})") from None
        if not 0 <= seconds < float("inf"):
            raise ValueError(f"a duration of 0 or more (got {value!r})")
        return text
    whole = _integral(value)
    if isinstance(whole, bool) or not isinstance(whole, int) or whole < 0:
        raise ValueError(f"a whole number of requests (0 or more), or a duration such as 30 s (got {value!r})")
    return whole


class Workload(Section):
    n_requests: Int | None = Field(3000, ge=1, **doc(
        "requests simulated and measured, after the warm-up (with a trace: its first n after the warm-up; "
        "null: all of it)", "requests"))
    warmup: Annotated[int | str, PlainValidator(_warmup)] = Field(0, **doc(
        "requests run first and left out of every per-request metric, as benchmark clients do: a number of "
        "requests, or a duration (30 s: those arriving before it; with sessions, the sessions starting "
        "before it)", "requests or time"))
    rate: float | None = Field(8.0, gt=0, **Finite, **doc(
        "mean arrival rate; a trace's arrival times are rescaled to it (null: as recorded)", "requests/s"))
    seed: Int = Field(7, ge=0, **doc("seed of every random stream of the traffic"))
    rng: Literal["stdlib", "numpy"] = Field("numpy", **doc(
        "numpy: fast vectorised streams; stdlib: Python's random, the lesson's exact traffic"))
    prompt: Prompt = Prompt()
    output: Output = Output()
    prefix_tokens: Int = Field(0, ge=0, **doc(
        "a shared prefix every prompt starts with: whole blocks of it pinned and never recomputed; with "
        "engine.prefix_caching, one system prompt cached like any content", "tokens"))
    system_prompts: SystemPrompts | None = Field(None, **doc(
        "system prompts shared by groups of requests (needs engine.prefix_caching to be reused)"))
    sessions: Sessions | None = Field(None, **doc(
        "multi-turn sessions: rate counts sessions (with concurrency, each client runs one at a time), each "
        "turn re-sends the conversation so far"))
    arrival: Literal["poisson", "gamma", "constant"] = Field("poisson", **doc(
        "poisson: exponential gaps; gamma: gamma gaps of shape burstiness; constant: every 1/rate, from 1/rate"))
    burstiness: float = Field(1.0, gt=0, **Finite, **doc(
        "gamma arrivals' shape: 1 is Poisson, below 1 burstier, above 1 smoother (vLLM bench's --burstiness)"))
    trace: str | None = Field(None, **doc(
        "a recorded trace (CSV, or JSON lines with hash_ids) replacing arrivals and lengths; relative to the "
        "config file that names it"))
    trace_hash_block: Int = Field(512, ge=1, **doc("tokens per hash id of a JSON-lines trace", "tokens"))
    concurrency: Int | None = Field(None, ge=1, **doc(
        "closed-loop clients (vLLM bench's --max-concurrency with --request-rate inf): each sends a request, "
        "then the next request once that one is done (plus think_s); replaces rate and arrival (null: open "
        "loop)", "clients"))
    ramp_s: float = Field(0.0, ge=0, **Finite, **doc(
        "closed loop: client k sends its first request at k x ramp_s / concurrency (0: all at t=0)", "s"))
    think_s: Think | None = Field(None, **doc(
        "closed loop: the time a client waits between a request's completion and its next (null: none)"))

    @model_validator(mode="after")
    def _closed_or_open(self) -> Workload:
        if self.concurrency is None:
            for key in ("think_s", "ramp_s"):
                if key in self.model_fields_set and getattr(self, key):
                    raise ValueError(f"{key} describes closed-loop clients: set workload.concurrency too")
            return self
        if self.rate is not None:
            raise ValueError(f"concurrency ({self.concurrency} clients: a closed loop) and rate ({self.rate:g}/s: "
                             f"an open loop) exclude each other: set workload.rate: null")
        if self.arrival != "poisson" or self.burstiness != 1.0:
            raise ValueError(f"concurrency ({self.concurrency} clients: a closed loop) and arrival ({self.arrival}) "
                             f"exclude each other: clients send when their requests are done")
        return self

    @model_validator(mode="after")
    def _warmup_below_measured(self) -> Workload:
        if isinstance(self.warmup, int) and self.n_requests is not None and self.warmup >= self.n_requests:
            raise ValueError(f"workload.warmup ({self.warmup} requests) must be below workload.n_requests "
                             f"({self.n_requests}, the requests measured after it)")
        return self

    @property
    def max_output(self) -> int:
        """The longest output the workload's distribution can produce (not for traces)."""
        return self.output.largest

    @property
    def warmup_window(self) -> tuple[str, float]:
        """The warm-up as (``requests``, count) or (``seconds``, duration)."""
        if isinstance(self.warmup, str):
            return "seconds", _seconds(self.warmup)
        return "requests", float(self.warmup)
