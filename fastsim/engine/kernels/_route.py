"""Which replica of the serving loop's pool (:mod:`.serve`) runs next, and where a request goes:
the router's replica (the prefix-aware router's score: docs/model/fleets.md,
docs/model/prefix-cache.md) and, where replicas are data-parallel ranks, the replica's rank
(docs/model/deployed.md, "Attention data parallelism")."""

from __future__ import annotations

import numpy as np

from ..._jit import inline, jit
from ..router import LEAST_KV, PREFIX_AWARE, RANDOM, choose
from . import _kv as roles
from ._running import cdiv
from ._shape import AUX, NWAIT, RUNNING, lockstep


@inline
def earliest(st, now_r, until, npre, pre_slack, dec_slack, dp=1):
    """Where the run releases arrivals: the replica with work and the earliest clock before
    ``until`` (ties: the lower index; -1: none), and how far it may run: up to ``until`` and to
    each other replica's clock with work plus its pool's slack, the least time in which an arrival
    that replica releases can come (so every arrival is routed after every step that started
    before it, and before any that did not). With ``dp`` > 1 replicas are that many lock-step
    ranks: the others are those of other replicas."""
    rep = -1
    for r in range(now_r.size):
        if (st[r, RUNNING] > 0 or st[r, NWAIT] > 0) and now_r[r] < until and (rep < 0 or now_r[r] < now_r[rep]):
            rep = r
    bound = until
    if rep >= 0:
        for r in range(now_r.size):
            if r // dp != rep // dp and (st[r, RUNNING] > 0 or st[r, NWAIT] > 0):
                bound = min(bound, now_r[r] + (pre_slack if r < npre else dec_slack))
    return rep, bound


@jit
def prefix_aware(kv, cache, q, p_q, bt, weight, replicas, st, outstanding, used):
    """prefix_aware's replica for request ``q`` (prompt ``p_q``) among the first ``replicas``: the
    fewest prompt blocks it would miss (weighted) plus blocks in use; ties: the fewest
    outstanding requests, then the lower index. (Each replica's KV scalar in ``st`` is settled.)"""
    to = 0
    best = np.inf
    for r in range(replicas):
        h, st[r, AUX] = roles.cached_blocks(kv, cache, r, q, p_q, st[r, AUX], bt)
        score = (cdiv(p_q, bt) - h) * weight + used[r]
        if r == 0 or score < best or (score == best and outstanding[r] < outstanding[to]):
            to = r
            best = score
    return to


@inline
def destination(kv, cache, q, p_q, bt, code, weight, routes, decode_routes, decoding, npre, replicas, st, outstanding,
                used, routed, routed_decode, replica, pre_replica):
    """Route request ``q`` (prompt ``p_q``): to a decode replica when its prompt's KV reaches the
    decode pool (``decoding``: that pool caches nothing, so prefix-aware is least_kv there), else
    to one of the first pool (the prefill pool's ``npre``, or every replica); its replica is
    recorded. Returns (the replica's index in the loop, the requests routed to each pool)."""
    if decoding:
        to = npre + choose(LEAST_KV if code == PREFIX_AWARE else code, q if code == RANDOM else routed_decode,
                           decode_routes, outstanding, used, npre, replicas)
        replica[q] = to - npre
        return to, routed, routed_decode + 1
    first_pool = npre if npre > 0 else replicas
    if code == PREFIX_AWARE:
        to = prefix_aware(kv, cache, q, p_q, bt, weight, first_pool, st, outstanding, used)
    else:
        to = choose(code, routed, routes, outstanding, used, 0, first_pool)
    if npre > 0:
        pre_replica[q] = to
    else:
        replica[q] = to
    return to, routed + 1, routed_decode


@inline
def working(st, base, dp):
    """Whether a rank of the replica whose ranks start at ``base`` has requests."""
    for r in range(base, base + dp):
        if st[r, RUNNING] > 0 or st[r, NWAIT] > 0:
            return True
    return False


@inline
def wake(st, now_r, to, t, dp):
    """A request reaches rank ``to`` at ``t``: an idle replica's ranks wake then."""
    base = to - to % dp
    if not working(st, base, dp):
        for r in range(base, base + dp):
            now_r[r] = max(now_r[r], t)


@inline
def balance(st, base, dp):
    """The rank of the replica whose ranks start at ``base`` a request goes to: the least
    4 x waiting + running (vLLM's data-parallel load balancer's score), ties the lower rank."""
    to = base
    best = 4 * st[base, NWAIT] + st[base, RUNNING]
    for r in range(base + 1, base + dp):
        score = 4 * st[r, NWAIT] + st[r, RUNNING]
        if score < best:
            to, best = r, score
    return to


@inline
def sums(st, outstanding, used, dp, gout, gused):
    """Each replica's outstanding requests and KV blocks in use, over its ranks (for the router
    among replicas)."""
    for g in range(gout.size):
        gout[g] = 0
        gused[g] = 0
        for r in range(g * dp, g * dp + dp):
            gout[g] += outstanding[r]
            gused[g] += used[r]


@inline
def rank_for(code, routed, routes, st, outstanding, used, dp, gout, gused, q, replica):
    """The rank request ``q`` goes to: its replica by the router ``code`` (from the replicas'
    sums over their ranks; recorded in ``replica``), then the replica's rank by :func:`balance`.
    Returns (the rank, the requests routed)."""
    g = 0
    if gout.size > 1:
        sums(st, outstanding, used, dp, gout, gused)
        g = choose(code, routed, routes, gout, gused, 0, gout.size)
    replica[q] = g
    return balance(st, g * dp, dp), routed + 1


@inline
def route(kv, cache, routing, routes, decode_routes, q, t, p_q, bt, decoding, npre, replicas, st, now_r, outstanding,
          used, routed, routed_decode, replica, pre_replica, gout, gused):
    """Send request ``q`` (prompt ``p_q``), arriving at ``t``, to its replica (:func:`destination`),
    or its replica's rank (:func:`rank_for`); an idle replica wakes then. Returns (where it went,
    the requests routed to each pool)."""
    if lockstep(routing):
        to, routed = rank_for(routing.code, routed, routes, st, outstanding, used, routing.dp, gout, gused, q, replica)
        wake(st, now_r, to, t, routing.dp)
    else:
        to, routed, routed_decode = destination(kv, cache, q, p_q, bt, routing.code, routing.weight, routes,
                                                decode_routes, decoding, npre, replicas, st, outstanding, used, routed,
                                                routed_decode, replica, pre_replica)
        if st[to, RUNNING] == 0 and st[to, NWAIT] == 0:
            now_r[to] = max(now_r[to], t)  # an idle replica wakes when a request reaches it
    outstanding[to] += 1
    return to, routed, routed_decode
