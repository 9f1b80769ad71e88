"""Traffic generation: the one place where randomness is drawn (or a recorded trace replayed).

A :class:`Traffic` is struct-of-arrays request state (arrival time, prompt and output lengths),
sorted by arrival. Sources:

- ``rng: stdlib`` draws per request ``expovariate(rate)`` then ``gauss(mu, sigma)`` from
  ``random.Random(seed)``, accumulating arrivals in milliseconds, which reproduces the lesson's
  stream exactly (Poisson arrivals, fixed prompts, its output lengths). It draws the normal even
  for ``dist: fixed``, so the arrivals never shift. A Python loop: fine for thousands.
- ``rng: numpy`` draws vectorised from ``numpy.random.Generator``, from three independent child
  streams of ``SeedSequence(seed)`` (made in microseconds by :mod:`.streams`): arrivals
  (exponential or gamma gaps, or none for constant arrivals), output lengths, prompt lengths. So
  the same seed gives the same underlying numbers at every rate, length distribution or request
  count (common random numbers for paired comparisons), and changing one distribution never
  moves another.
- the random router's choices (:func:`routes`) come from two more child streams of the same
  seed, one per pool.
- ``concurrency``: closed-loop clients send those requests (:func:`.content.clients`): the first
  ``concurrency`` at t=0 (or spread over ``ramp_s``), each later one when a request is done.
- ``trace``: the first n_requests of a recorded trace (:mod:`fastsim.engine.trace`), its arrival times
  rescaled to ``rate`` unless that is null.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import numpy as np

from .._jit import jit
from ..model import fleet as pools
from ..model.cost import kv_blocks
from ..model.schema import Config, Workload
from . import content as shares
from .content import Content
from .streams import stream


@dataclass(frozen=True)
class Traffic:
    arrival_s: np.ndarray  # float64 (n,), non-decreasing, seconds from t=0
    prompt_tokens: np.ndarray  # int64 (n,)
    output_tokens: np.ndarray  # int64 (n,), >= 1
    content: Content | None = None  # what requests share (None: nothing, and every arrival given)
    warmup: int = 0  # the first requests run, but left out of the metrics (``workload.warmup``)

    def __len__(self) -> int:
        return self.arrival_s.size

    def tokens(self) -> tuple[float, float]:
        """Output and prompt tokens in all (floats: a sum of int64 counts could overflow)."""
        return float(self.output_tokens.sum(dtype=np.float64)), float(self.prompt_tokens.sum(dtype=np.float64))


def of(config: Config) -> Traffic:
    """The traffic of ``config``'s workload as its engine sees it: a shared prefix becomes a
    system prompt under prefix caching, and sessions end at the KV cache's size unless told."""
    return generate(*key(config))


def key(config: Config) -> tuple:
    """What :func:`of` draws from: configs with equal keys share their traffic."""
    e, w = config.engine, config.workload
    caching = pools.prefix_cache(config)
    if w.sessions is None:
        return w, caching and bool(w.prefix_tokens), None
    blocks = kv_blocks(config)
    return w, caching, None if blocks is None else blocks * e.block_tokens


def generate(w: Workload, caching: bool = False, kv_tokens: int | None = None) -> Traffic:
    """Draw (or replay) the requests the workload section describes: its warm-up first, then
    ``n_requests``. ``caching``: the engine caches by content (a shared prefix is then a system
    prompt); ``kv_tokens``: the context a session may reach unless ``max_context`` says."""
    kind, amount = w.warmup_window
    if not amount:
        return _drawn(w, caching, kv_tokens)
    if kind == "requests":
        warm = int(amount)
    else:  # every request arriving before it (with sessions, every turn of a session starting before it)
        warm = 0
        while True:  # (a longer draw keeps its first requests: each count of them is the same)
            t = _drawn(w.model_copy(update={"n_requests": None if w.n_requests is None else w.n_requests + warm,
                                             "warmup": 0}), caching, kv_tokens)
            starts = t.arrival_s if t.content is None or not t.content.closed_loop else _session_starts(t)
            before = int(np.searchsorted(starts, amount, side="left"))
            if before == warm or w.n_requests is None:
                return replace(t, warmup=before)
            warm = before
    n = None if w.n_requests is None else w.n_requests + warm
    return replace(_drawn(w.model_copy(update={"n_requests": n, "warmup": 0}), caching, kv_tokens), warmup=warm)


def _session_starts(t: Traffic) -> np.ndarray:
    """When each request's session started (requests are laid out by session, in start order)."""
    first = np.flatnonzero(t.content.turn <= 1)
    return t.arrival_s[first][np.searchsorted(first, np.arange(len(t)), side="right") - 1]


def _drawn(w: Workload, caching: bool, kv_tokens: int | None) -> Traffic:
    """:func:`generate` without a warm-up."""
    if w.trace is not None:
        from . import trace

        recorded, n = trace.requests(w)
        return Traffic(trace.arrivals(recorded, n, w.rate), recorded.prompt_tokens[:n].copy(),
                       recorded.output_tokens[:n].copy(), trace.content(recorded, n, w.trace_hash_block))
    if w.concurrency is not None:  # the same requests (or sessions), sent by clients
        t = generate(w.model_copy(update={"concurrency": None, "rate": 1.0}), caching, kv_tokens)
        arrival, content = shares.clients(w, t.content if t.content is not None else shares.none(len(t)))
        return Traffic(arrival, t.prompt_tokens, t.output_tokens, content)
    if w.sessions is not None:
        return _sessions(w, kv_tokens)
    if w.system_prompts is not None or (caching and w.prefix_tokens):
        return shared(w, caching, generate(w.model_copy(update={"system_prompts": None, "prefix_tokens": 0})))
    if w.rng == "stdlib":  # the lesson's stream: fixed prompts, lognormal or fixed outputs
        arrival, normal = _stdlib_draws(w)
        output = _from_normal(w.output, normal) if w.output.dist == "lognormal" else _fixed(w.output, w.n_requests)
        return Traffic(arrival, _fixed(w.prompt, w.n_requests), output)
    return Traffic(_numpy_arrivals(w, 0), _numpy_lengths(w.prompt, w.n_requests, w.seed, 2),
                   _numpy_lengths(w.output, w.n_requests, w.seed, 1))


def shared(w: Workload, caching: bool, t: Traffic) -> Traffic:
    """Requests ``t`` (drawn, or lengths a user measured) with the system prompts they begin
    with when the workload has some (a shared prefix is one under prefix ``caching``)."""
    if w.system_prompts is None and not (caching and w.prefix_tokens):
        return t
    return Traffic(t.arrival_s, t.prompt_tokens, t.output_tokens, shares.with_system_prompts(w, len(t)))


def _sessions(w: Workload, kv_tokens: int | None) -> Traffic:
    n = w.n_requests
    s = w.sessions
    cap = s.max_context if s.max_context is not None else kv_tokens
    followup = _numpy_lengths(s.followup or w.prompt, n, w.seed, shares.FOLLOWUP)
    arrival, prompt, output, content = shares.sessions(
        w, _numpy_arrivals(w, 0), _numpy_lengths(w.prompt, n, w.seed, 2), _numpy_lengths(w.output, n, w.seed, 1),
        _numpy_lengths(s.turns, n, w.seed, shares.TURNS), followup, cap)
    return Traffic(arrival, prompt, output, content)


def routes(w: Workload, n: int, replicas: int, pool: int) -> np.ndarray:
    """The random router's replica for each of ``n`` requests: uniform over ``replicas``, from
    the workload seed's own stream for ``pool`` (0: the replicas, 1: a prefill pool), so that
    arrivals and lengths stay those of every other router."""
    return stream(w.seed, 3 + pool).integers(0, replicas, n, dtype=np.int64)


def _fixed(lengths, n: int) -> np.ndarray:
    return np.full(n, lengths.value, dtype=np.int64)


def _from_normal(lengths, normal: np.ndarray) -> np.ndarray:
    """int(exp(normal)) clamped to min..max; ``normal`` already has the distribution's mu and
    sigma. Clamped in float first, so huge draws cannot overflow int64 (a draw past e^709 is
    inf, which clamps to max like any other length beyond it)."""
    with np.errstate(over="ignore"):
        return _clamped_ints(np.exp(normal), lengths.min, lengths.max)


@jit
def _clamped_ints(values, lo, hi):
    """``np.minimum(np.maximum(values, lo), hi).astype(np.int64)`` in one pass."""
    out = np.empty(values.size, np.int64)
    for i in range(values.size):
        out[i] = int(min(max(values[i], lo), hi))
    return out


@jit
def _scaled(z, scale, shift):
    """``z * scale + shift``, each operation rounded as NumPy's two would be."""
    out = np.empty(z.size)
    for i in range(z.size):
        out[i] = z[i] * scale + shift
    return out


@jit
def _arrival_times(gaps, per):
    """``(gaps / per).cumsum()`` in one pass (the same divisions and additions, in order)."""
    out = np.empty(gaps.size)
    t = 0.0
    for i in range(gaps.size):
        t += gaps[i] / per
        out[i] = t
    return out


def _numpy_lengths(lengths, n: int, seed: int, child: int) -> np.ndarray:
    if lengths.dist == "fixed":
        return _fixed(lengths, n)
    rng = stream(seed, child)
    if lengths.dist == "uniform":
        return rng.integers(lengths.min, lengths.max, n, endpoint=True, dtype=np.int64)
    return _from_normal(lengths, _scaled(rng.standard_normal(n), lengths.sigma, lengths.mu))


def _numpy_arrivals(w: Workload, child: int) -> np.ndarray:
    if w.arrival == "constant":
        return np.arange(1, w.n_requests + 1) / w.rate
    rng = stream(w.seed, child)
    if w.arrival == "gamma":  # mean 1/rate, coefficient of variation 1/sqrt(burstiness)
        return _arrival_times(rng.standard_gamma(w.burstiness, w.n_requests), w.burstiness * w.rate)
    return _arrival_times(rng.standard_exponential(w.n_requests), w.rate)


def _stdlib_draws(w: Workload) -> tuple[np.ndarray, np.ndarray]:
    rng = random.Random(w.seed)
    o = w.output
    arrival_ms = np.empty(w.n_requests)
    normal = np.empty(w.n_requests)
    t = 0.0
    for i in range(w.n_requests):
        t += rng.expovariate(w.rate) * 1000
        arrival_ms[i] = t
        normal[i] = rng.gauss(o.mu, o.sigma)
    return arrival_ms / 1000, normal
