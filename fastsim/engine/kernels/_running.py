"""Helpers of the serving loop (:mod:`.serve`): the admission-ordered running list, the waiting
queues and a doubly linked completion calendar, from which a preempted request leaves in O(1).

Bucket ``b`` of the calendar heads a list of the requests due at steps == b (mod its size);
``cprev`` of a bucket's first member is -2 - b, so a member can unlink itself.

The list helpers have no branches: where a link is missing (-1: the end of a list, or a bucket in
place of a predecessor), they write to a spare slot instead, the last element of the array
(each array has one more element than it has requests or buckets). Numba counts references to
the arrays an inlined helper takes, and LLVM drops the counting only where no branch separates
it from the helper's writes: what was left, atomic increments and decrements at each completion,
measured a fifth of the serving kernel.
"""

from __future__ import annotations

import numpy as np

from ..._jit import inline


@inline
def cdiv(a, b):
    return -(-a // b)


@inline
def cal_file(bucket, base, ring, cnext, cprev, due, cursor, steps, i, steps_left):
    """File request ``i`` (due ``steps_left`` steps after step ``steps``, whose bucket is
    ``cursor``) in the calendar of ``ring`` buckets from ``bucket[base]`` (a pool keeps every
    replica's calendar in one array); ``cprev`` of a bucket's first member is -2 - its index in
    ``bucket``. Returns that index."""
    due[i] = steps + steps_left
    if steps_left >= ring:
        steps_left %= ring
    b = cursor + steps_left
    b = base + (b - ring if b >= ring else b)
    first = bucket[b]
    cnext[i] = first
    cprev[i] = -2 - b
    cprev[first if first >= 0 else cprev.size - 1] = i
    bucket[b] = i
    return b


@inline
def cal_remove(bucket, cnext, cprev, i):
    nxt = cnext[i]
    prv = cprev[i]
    cnext[prv if prv >= 0 else cnext.size - 1] = nxt
    bucket[-2 - prv if prv < 0 else bucket.size - 1] = nxt
    cprev[nxt if nxt >= 0 else cprev.size - 1] = prv


@inline
def due_in_order(bucket, cnext, cprev, due, seq, dues, first, steps):
    """The members of a calendar bucket (from ``first``) due at ``steps``, unlinked and listed in
    ``dues`` in the order of ``seq`` (their admissions); returns how many."""
    ndue = 0
    i = first
    while i >= 0:
        nx = cnext[i]
        if due[i] == steps:
            cal_remove(bucket, cnext, cprev, i)
            j = ndue
            while j > 0 and seq[dues[j - 1]] > seq[i]:
                dues[j] = dues[j - 1]
                j -= 1
            dues[j] = i
            ndue += 1
        i = nx
    return ndue


@inline
def unlink(rprev, rnext, rhead, rtail, i):
    """Remove request ``i`` from the running list; returns the new (head, tail)."""
    nx = rnext[i]
    pv = rprev[i]
    rnext[pv if pv >= 0 else rnext.size - 1] = nx
    rprev[nx if nx >= 0 else rprev.size - 1] = pv
    return (nx if pv < 0 else rhead), (pv if nx < 0 else rtail)


@inline
def link_tail(rprev, rnext, rhead, rtail, i):
    """Request ``i`` joins the running list's tail; returns the new (head, tail)."""
    rprev[i] = rtail
    rnext[i] = -1
    rnext[rtail if rtail >= 0 else rnext.size - 1] = i
    return (rhead if rtail >= 0 else i), i


@inline
def join_queue(st, link, rep, q, first, last, waiting):
    """Request ``q`` joins the tail of replica ``rep``'s waiting queue: a list through ``link``,
    its ends and length in columns ``first``, ``last`` and ``waiting`` of ``st``."""
    link[q] = -1
    if st[rep, last] >= 0:
        link[st[rep, last]] = q
    else:
        st[rep, first] = q
    st[rep, last] = q
    st[rep, waiting] += 1


@inline
def own_hit(kept, start, popped, bt, whole):
    """Tokens a preempted request finds cached at its re-admission, under a prefix cache over
    requests that share nothing (docs/model/prefix-cache.md). Preempted with ``kept`` tokens
    computed, it released cdiv(kept, bt) blocks to the free queue's tail, last to first, the
    full ones (kept // bt) holding its first tokens; ``start``: the allocations from the queue's
    head, counted from the run's start, after which the head reached them (those made then, plus
    the free blocks ahead of them); ``popped``: the allocations made by now. The head evicts its
    blocks deepest first, so what is left is its first blocks. (Only a request preempted later
    is re-admitted before it: no hit takes blocks from ahead of its own, so the count holds.)
    ``whole``: a model with local-attention layers, whose hit needs its window's blocks too,
    freed after the others: once the head reached any of its blocks, nothing is left to hit."""
    m = cdiv(kept, bt)
    evicted = min(max(popped - start, 0), m)
    if whole:
        return kept // bt * bt if evicted == 0 else 0
    return min(kept // bt, m - evicted) * bt
