"""One scenario end to end: checks -> traffic -> engine (one, or a fleet) -> metrics."""

from __future__ import annotations

import threading
import dataclasses
from dataclasses import dataclass

import numpy as np

from ..engine import checks, fleet
from ..engine.kernels import Outcome, Scratch
from ..engine import traffic as traffic_of
from ..engine.traffic import Traffic
from ..model import fleet as pools
from ..model.schema import Config
from . import metrics, steady

_local = threading.local()  # each thread's Scratch


@dataclass(frozen=True)
class Result:
    """Metrics (keyed by :data:`fastsim.analysis.metrics.METRICS` names) and per-request arrays
    (``replica``: the replica that served each request, ``prefill_replica`` the prefill replica
    when disaggregated; None for one engine)."""

    config: Config
    metrics: dict[str, float]
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    first_token_s: np.ndarray
    done_s: np.ndarray
    replica: np.ndarray | None = None
    prefill_replica: np.ndarray | None = None
    cached_tokens: np.ndarray | None = None  # prefix-cache hit at first admission (None: no prefix cache)
    session: np.ndarray | None = None  # -1 outside sessions (None: no content shared)
    turn: np.ndarray | None = None  # 1, 2, ... within a session; 0 outside
    system_prompt: np.ndarray | None = None  # the request's system prompt, -1 without
    warmup: int = 0  # the first requests (of these arrays) ran as a warm-up, left out of the metrics
    arrival_end: float = np.inf  # the arrival process's last arrival (:func:`given_end`)
    acceptance: list[float] = dataclasses.field(default_factory=list)  # speculative decoding: per position, the
    # share of verifications that accepted the draft's token there (empty: no speculation)

    @property
    def overloaded(self) -> bool:
        """The engine falls behind the arrivals: the requests of the last fifth of the run (by
        arrival) wait, at the median, more than a second and more than 5 times as long for their
        first token as those of the first fifth. Its latencies then grow with the run's length."""
        return overloaded(self.arrival_s, self.first_token_s)


OVERLOAD_RATIO = 5.0  # late / early median TTFT beyond which the queue is growing
OVERLOAD_S = 1.0  # ... and a late median TTFT beyond this


def overloaded(arrival: np.ndarray, first_token: np.ndarray) -> bool:
    """See :attr:`Result.overloaded` (requests in any order: sessions number theirs by session)."""
    fifth = arrival.size // 5
    if fifth < 4:
        return False
    if (np.diff(arrival) < 0).any():
        order = np.argsort(arrival, kind="stable")
        arrival, first_token = arrival[order], first_token[order]
    ttft = first_token - arrival
    early, late = float(np.median(ttft[:fifth])), float(np.median(ttft[-fifth:]))
    return late > OVERLOAD_S and late > OVERLOAD_RATIO * early


def window(traffic: Traffic, out: Outcome) -> tuple[slice, float]:
    """The measured requests (those after the warm-up) and the measured window's start: t=0, or
    after a warm-up the first measured arrival."""
    w = traffic.warmup
    return slice(w, None), float(out.arrivals(traffic.arrival_s)[w:].min()) if w else 0.0


def measure(config: Config, traffic: Traffic, out: Outcome, with_itl: bool = True) -> dict[str, float]:
    """The metrics of an engine's or a fleet's outcome on ``traffic``, over its measured window
    (without ``with_itl``, the ITL quantiles NaN)."""
    slo = config.slo
    m, start = window(traffic, out)
    caching = not np.isnan(out.prefix_hit_rate)
    cached = out.cached_tokens[m] if caching else None
    arrival = out.arrivals(traffic.arrival_s)
    return metrics.compute(arrival[m], traffic.output_tokens[m], out.first_token_s[m], out.done_s[m], out,
                           config.engine.max_batch, (slo.ttft_s, slo.tpot_s, slo.e2e_s), pools.gpus(config),
                           pools.usd_per_hour(config), with_itl, start, cached,
                           traffic.prompt_tokens[m] if caching else None, (arrival, out.done_s, given_end(traffic)),
                           float(traffic.prompt_tokens[m].sum(dtype=np.float64)))


def given_end(traffic: Traffic) -> float:
    """The arrival process's last arrival: the last given one (after it, a session's turns come
    as the fleet drains)."""
    if traffic.content is None or not traffic.content.closed_loop or traffic.content.clients:
        return np.inf  # (closed-loop clients send until every request is sent)
    return float(np.nanmax(traffic.arrival_s))


def drift(result: Result) -> str | None:
    """What drifts across ``result``'s measured window, in one line (None: steady, or too short to
    tell; :mod:`.steady`)."""
    m = slice(result.warmup, None)
    caching = result.cached_tokens is not None
    cached = result.cached_tokens[m] if caching else metrics.NO_CACHE
    prompt = result.prompt_tokens[m] if caching else metrics.NO_CACHE
    stats, checked = metrics.halves(result.arrival_s[m], result.first_token_s[m], cached, prompt, result.arrival_s,
                                    result.done_s, result.arrival_end)
    return steady.describe(stats, checked, caching)


def scratch() -> Scratch:
    """This thread's room for step runs (a fresh one per run costs page faults)."""
    if not hasattr(_local, "scratch"):
        _local.scratch = Scratch()
    return _local.scratch


def simulate(config: Config, traffic: Traffic | None = None, checked: bool = False, with_itl: bool = True) -> Result:
    """Run one scenario: ``config``'s base values (its ``sweep:`` grid is ignored).

    ``traffic`` may be passed to reuse arrays already drawn for ``config.workload``;
    ``checked``: the caller already ran :func:`fastsim.engine.checks.check` on ``config``;
    without ``with_itl``, the ITL quantiles are NaN (a caller that needs none saves their cost).
    """
    if not checked:
        checks.check(config)
    run = pools.as_run(config)  # a prefix cache static or dynamic batching do not have is off
    traffic = traffic_of.of(run) if traffic is None else traffic
    checks.steps_fit(run, *traffic.tokens())
    checks.traffic_fits(run, traffic)
    out = fleet.run(run, traffic, scratch())  # measured before the next run on this thread
    c = traffic.content
    none = (None, None, None)
    return Result(config, measure(config, traffic, out, with_itl), out.arrivals(traffic.arrival_s),
                  traffic.prompt_tokens, traffic.output_tokens, out.first_token_s, out.done_s, out.replica,
                  out.prefill_replica, out.cached_tokens, *((c.session, c.turn, c.system_prompt) if c else none),
                  warmup=traffic.warmup, arrival_end=given_end(traffic),
                  acceptance=metrics.acceptance_rates(out.spec_counts))
