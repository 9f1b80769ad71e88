"""Which replica of the serving loop's pool (:mod:`.serve`) runs next, and where the prefix-aware
router sends a request (docs/model/fleets.md, docs/model/prefix-cache.md)."""

from __future__ import annotations

import numpy as np

from ..._jit import inline, jit
from ..router import LEAST_KV, PREFIX_AWARE, RANDOM, choose
from . import _kv as roles
from ._running import cdiv
from ._shape import AUX, NWAIT, RUNNING


@inline
def earliest(st, now_r, until, npre, pre_slack, dec_slack):
    """Where the run releases arrivals: the replica with work and the earliest clock before
    ``until`` (ties: the lower index; -1: none), and how far it may run: up to ``until`` and to
    each other replica's clock with work plus its pool's slack, the least time in which an arrival
    that replica releases can come (so every arrival is routed after every step that started
    before it, and before any that did not)."""
    rep = -1
    for r in range(now_r.size):
        if (st[r, RUNNING] > 0 or st[r, NWAIT] > 0) and now_r[r] < until and (rep < 0 or now_r[r] < now_r[rep]):
            rep = r
    bound = until
    if rep >= 0:
        for r in range(now_r.size):
            if r != rep and (st[r, RUNNING] > 0 or st[r, NWAIT] > 0):
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
