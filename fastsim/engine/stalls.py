"""Engine stalls: the variance model (docs/model/serving.md, "Jitter").

A real engine pauses now and then (the scheduler's CPU work, garbage collection, the HTTP
server): at constant arrivals, where queueing adds no spread, those pauses are all the tail
there is. Each replica stalls at the instants of a Poisson process of rate
``calibration.stall_rate_hz``, each stall lasting a log-normal time (median
``calibration.stall_median_ms``, log-spread ``calibration.stall_sigma``). A request is delayed
by the stalls of its replica that begin while it waits for them: its first token by those
between its arrival and its first token, its last token by those between its arrival and its
last token (with a prefill pool, a prefill replica's until the first token, then the decode
replica's). The stalls do not feed back into scheduling (a request arriving during one is not
queued behind it): at the loads a calibration is measured at, that is second order.

Deterministic, and drawn as common random numbers, so that the times move smoothly with the
three values (as a fit needs): each replica's k-th stall comes from its k-th draw (of a
generator seeded from the workload's seed, the replica and its pool) through tables of the unit
exponential's and the standard normal's quantiles (4,096 levels each), scaled by the rate,
median and spread. Off (rate 0, the default), nothing is drawn and every time is as without the model.
"""

from __future__ import annotations

import functools
import math
from statistics import NormalDist

import numpy as np

from .._jit import inline, jit
from ..model.schema import Config, ConfigError
from .kernels._arrivals import pop, push
from .streams import stream

MAX_STALLS = 100_000_000  # a replica's stalls drawn at most (1.6 GB): a run longer than that is refused
CHILD = 8  # the first child stream of the workload seed for the stalls' seeds (traffic and routes use 0-4)
LEVELS = 1 << 12  # quantiles in each table (small: the draws index them at random, from cache)


@functools.cache
def _quantiles() -> tuple[np.ndarray, np.ndarray]:
    """The unit exponential's and the standard normal's quantiles at LEVELS mid-points."""
    mid = (np.arange(LEVELS) + 0.5) / LEVELS
    return -np.log1p(-mid), np.array([NormalDist().inv_cdf(p) for p in mid.tolist()])


MULTIPLIER = np.uint64(2685821657736338717)  # xorshift64*'s


@jit
def _fill(seed, horizon, scale, gap_q, length_q, starts, cum):
    """Stalls into ``starts`` (times: the unit-rate process below ``horizon``, times ``scale``)
    and ``cum`` (cumulative lengths, a leading 0); returns how many, or -1 when the arrays are too
    short. Each stall takes one 64-bit draw of xorshift64* (its top 12 bits the gap's quantile,
    the next 12 the length's): cheap and exactly repeatable."""
    state = np.uint64(seed) | np.uint64(1)
    cum[0] = 0.0
    t = 0.0
    total = 0.0
    for k in range(starts.size):
        state ^= state >> np.uint64(12)
        state ^= state << np.uint64(25)
        state ^= state >> np.uint64(27)
        x = state * MULTIPLIER
        t += gap_q[np.int64(x >> np.uint64(52))]
        if t >= horizon:
            return k
        starts[k] = t * scale
        total += length_q[np.int64((x >> np.uint64(40)) & np.uint64(0xFFF))]
        cum[k + 1] = total
    return -1


def _draw(seed: int, horizon: float, scale: float, gap_q: np.ndarray, length_q: np.ndarray):
    """(start times, cumulative lengths with a leading 0) of a replica's stalls (:func:`_fill`)."""
    room = int(horizon + 10 * math.sqrt(horizon) + 16)
    while True:
        starts, cum = np.empty(room), np.empty(room + 1)
        count = _fill(seed, horizon, scale, gap_q, length_q, starts, cum)
        if count >= 0:
            return starts[:count], cum[: count + 1]
        room *= 2  # (a draw this far past its mean is never seen in practice)


@jit
def _buckets(starts, width, count):
    """index[b]: the first stall starting at or after b x ``width``, for b in [0, count]: a
    search by time then reads one entry and steps over about one stall."""
    index = np.empty(count + 1, np.int64)
    j = 0
    for b in range(count + 1):
        edge = b * width
        while j < starts.size and starts[j] < edge:
            j += 1
        index[b] = j
    return index


@jit
def _first_at(starts, index, per_width, t):
    """The first stall starting at or after ``t``."""
    j = index[min(int(t * per_width), index.size - 1)]
    while j < starts.size and starts[j] < t:
        j += 1
    return j


@inline
def _from(starts, j, index, per_width, t):
    """The first stall starting at or after ``t``, from stall ``j`` (which starts before ``t``,
    or is the first): a few steps forward, else by the buckets."""
    stop = min(j + 8, starts.size)
    while j < stop and starts[j] < t:
        j += 1
    if j == stop and j < starts.size and starts[j] < t:
        return _first_at(starts, index, per_width, t)
    return j


@jit
def _delay(starts, cum, width, index, arrival, first, done, ids, first_wait, rest_wait):
    """Delay requests ``ids`` (ascending; empty: every request), in place, by this timeline's
    stalls: with ``first_wait`` those in [arrival, first), their first and last tokens; with
    ``rest_wait`` those in [first, done), their last token. A finger follows the arrivals; each
    window's later ends are found from there."""
    per_width = 1.0 / width
    a = 0
    count = ids.size if ids.size else arrival.size
    for n in range(count):
        i = ids[n] if ids.size else n
        while a < starts.size and starts[a] < arrival[i]:
            a += 1
        f = _from(starts, a, index, per_width, first[i])
        wait = cum[f] - cum[a] if first_wait else 0.0
        if rest_wait:
            wait_rest = cum[_from(starts, f, index, per_width, done[i])] - cum[f]
            done[i] += wait + wait_rest
        else:
            done[i] += wait
        first[i] += wait


def _timeline(config: Config, replica: int, pool: int, span: float):
    """A replica's stalls over [0, span) s: (start times, cumulative lengths with a leading 0,
    a bucket width and the buckets' first stalls, for :func:`_windows`)."""
    cal = config.calibration
    seed = int(stream(config.workload.seed, CHILD + 2 * replica + pool).integers(0, 2**63 - 1))
    exponential, normal = _quantiles()
    starts, cum = _draw(seed, cal.stall_rate_hz * span, 1 / cal.stall_rate_hz, exponential,
                        cal.stall_median_ms / 1e3 * np.exp(cal.stall_sigma * normal))
    count = starts.size + 1  # about one stall a bucket
    width = span / count
    return starts, cum, width, _buckets(starts, width, count)


def apply(config: Config, arrival: np.ndarray, first: np.ndarray, done: np.ndarray, replica: np.ndarray | None,
          prefill_replica: np.ndarray | None = None) -> None:
    """Delay ``first`` and ``done`` (engine times, in place) by the stalls each request waits
    for. ``replica``: each request's (decode) replica (None: one engine); ``prefill_replica``: its
    prefill replica, with a prefill pool."""
    if not config.calibration.stall_rate_hz or not len(arrival):
        return
    ordered = not (np.diff(arrival) < 0).any()  # (sessions and clients number requests as they are taken)
    order = np.arange(arrival.size) if ordered else np.argsort(arrival, kind="stable")
    span = float(done.max()) + 1.0
    rate = config.calibration.stall_rate_hz
    if not rate * span <= MAX_STALLS:
        raise ConfigError(f"calibration.stall_rate_hz ({rate:g}/s) over this run's {span:.3g} s is {rate * span:.3g} "
                          f"stalls a replica, more than fastsim draws ({MAX_STALLS:.0e}): set it to 0 (no jitter) "
                          "for a run this long, or raise workload.rate")
    if replica is None:
        _delay(*_timeline(config, 0, 0, span), arrival, first, done, np.empty(0, np.int64) if ordered else order,
               True, True)
        return
    colocated = prefill_replica is None  # else the first token's wait is on the prefill replica
    for r in np.unique(replica[replica >= 0]):  # (decode windows first: they start at the unstalled first token)
        _delay(*_timeline(config, int(r), 0, span), arrival, first, done, order[replica[order] == r], colocated,
               True)
    if not colocated:
        for r in np.unique(prefill_replica):
            _delay(*_timeline(config, int(r), 1, span), arrival, first, done, order[prefill_replica[order] == r],
                   True, False)


def hold_clients(arrival: np.ndarray, first: np.ndarray, done: np.ndarray, think: np.ndarray, api_s: float,
                 clients: int, next_start: np.ndarray) -> None:
    """Closed-loop clients send their next request when they see their last one done: a stall
    that delays a request's last token delays its client's next request as much. The clients'
    sends are replayed in the order they see completions (ties: the lower request), as the run
    handed requests out: each request after the first ``clients`` is sent the API overhead
    ``api_s`` and its think time after the completion that frees its client (over sessions, a
    session's later turn after the turn before it, its first turn after the last turn of the
    client's session before: ``next_start``, :attr:`.content.Content.next_start`), and its tokens
    move with it (engine times, in place)."""
    _hold(arrival, first, done, think, api_s, clients, next_start)


@jit
def _hold(arrival, first, done, think, api_s, clients, next_start):
    n = arrival.size
    heap_t, heap_i = np.empty(clients), np.empty(clients, np.int64)
    size = 0
    j = 0  # the next session's first turn (without sessions, the next request)
    taken = 0
    while j < n:
        end = next_start[j]
        if taken >= clients:  # a client sees its last request done, thinks, and sends ``j``
            _move(arrival, first, done, j, heap_t[0] + think[j])
            size = pop(heap_t, heap_i, size)
        for r in range(j + 1, end):  # a session's later turns: each after the one before
            _move(arrival, first, done, r, done[r - 1] + api_s + think[r])
        size = push(heap_t, heap_i, size, done[end - 1] + api_s, end - 1)
        taken += 1
        j = end


@inline
def _move(arrival, first, done, j, t):
    """Request ``j`` sent at ``t`` instead: its tokens move with it."""
    first[j] += t - arrival[j]
    done[j] += t - arrival[j]
    arrival[j] = t
