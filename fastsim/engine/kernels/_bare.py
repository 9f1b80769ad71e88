"""Runs of bare steps in closed form, for the serving model's continuous kernel
(:mod:`.continuous`: one engine, or each replica of a pool).

A bare step schedules only the D decoders: N = D tokens, and C = A = SC + D, where SC (the
decoders' computed tokens) grows by D a step. Between two events (an arrival that would be
admitted, a completion, a step whose new KV blocks do not fit) every step is bare, and its
duration is affine in its index j within the run, on each side of the roofline:

    d(j) = overhead + max(mem0 + k_kv D j, cmp0 + k_pair D j) + link(D)

The max switches side at most once, so the time of the first m steps is a sum of two
arithmetic series: the run's length, its end time and its KV bookkeeping come in O(1) (plus
O(block_tokens) for paged blocks), however many steps it has.

Times are rounded once per run instead of once per step: they may differ from step-by-step
addition by rounding (relative 1e-15 per run; docs/model/serving.md, "Bare steps in closed form"); every integer
(steps, tokens, blocks, the step runs that inter-token latencies are computed from) is exact.

The next completion is found in an occupancy bitmap over the completion calendar's buckets: a
set bit may be stale (its bucket emptied since: a completion or a preemption), and is cleared
when a search meets it, so a clear bit always means an empty bucket.
"""

from __future__ import annotations

import math

import numpy as np
from numba.cpython.unsafe.numbers import trailing_zeros

from ..._jit import inline, jit

ALL = np.int64(-1)
ONE = np.int64(1)


@inline
def occupancy(ring):
    """An empty bitmap over ``ring`` calendar buckets."""
    return np.zeros((ring >> 6) + 1, np.int64)


@inline
def mark(occ, b):
    """Bucket ``b`` has a member."""
    occ[b >> 6] |= ONE << (b & 63)


@jit
def next_filled(occ, bucket, base, start, ring):
    """Steps from bucket ``start`` to the first non-empty bucket, round the ring of ``ring``
    buckets from ``bucket[base]`` (``base`` a multiple of 64: a pool's replicas each have one);
    ``ring`` if none. Clears the stale bits it passes."""
    words = (ring + 63) >> 6
    w0 = base >> 6
    w = start >> 6
    word = occ[w0 + w] & (ALL << (start & 63))
    for _ in range(words + 1):  # back to the first word, for its bits before ``start``
        while word != 0:
            b = (w << 6) + trailing_zeros(word)
            if bucket[base + b] >= 0:
                return b - start if b >= start else ring - start + b
            occ[w0 + w] &= ~(ONE << (b & 63))  # stale
            word &= word - 1
        w = w + 1 if w + 1 < words else 0
        word = occ[w0 + w]
    return ring


@jit
def blocks_last(bcount, rep, phase, bt, d, free):
    """Steps whose new blocks fit in ``free``: whole turns of the phases (D blocks each), then
    part of one. ``bcount[rep]``: replica ``rep``'s decoders by block phase."""
    turns = free // d
    room = free - turns * d
    taken = 0
    r = 0
    p = phase
    for _ in range(bt):
        taken += bcount[rep, p]
        r += taken <= room
        p = p + 1 if p + 1 < bt else 0
    return turns * bt + r


@jit
def blocks_taken(bcount, rep, phase, bt, d, m):
    """(blocks taken in ``m`` steps from ``phase``, sum over the steps of the blocks taken up to
    and including each): the decoders of the phase at offset o take theirs at the run's steps o,
    o + bt, ... (c of them), each then held for the rest of the run. Two plain loops over the
    phases, which the compiler vectorises."""
    q = m // bt
    r = m - q * bt
    taken = 0
    running = 0
    for ph in range(phase, bt):
        o = ph - phase
        c = q + (o < r)
        taken += bcount[rep, ph] * c
        running += bcount[rep, ph] * (c * (m - o) - bt * ((c * (c - 1)) >> 1))
    for ph in range(phase):
        o = ph + bt - phase
        c = q + (o < r)
        taken += bcount[rep, ph] * c
        running += bcount[rep, ph] * (c * (m - o) - bt * ((c * (c - 1)) >> 1))
    return taken, running


@inline
def _elapsed(c1, b1, c2, b2, js, m):
    """Seconds of the first ``m`` steps of a run whose step j lasts c1 + b1 j for j < js, else
    c2 + b2 j."""
    m1 = min(m, js)
    t = m1 * c1 + b1 * (m1 * (m1 - 1) // 2)
    if m > js:
        m2 = m - js
        t += m2 * c2 + b2 * (m2 * (js + m - 1) // 2)
    return t


@jit
def timed(k, d, kv0, now, until, shortest, m):
    """(steps, the time after them) of a bare run from ``now`` of at most ``m`` steps with ``d``
    decoders whose first step reads ``kv0`` KV tokens, stopped at the first step that starts at or
    after ``until`` (an arrival that would be admitted; inf: none); (-1, now) when fewer than
    ``shortest`` would be left. ``k``: the step-time coefficients
    (:func:`fastsim.model.cost.coefficients`)."""
    n = float(d)  # the roofline's two sides, each affine in the step's index j
    fixed = k[0] + (k[5] + k[6] * n)
    mem0 = k[1] + k[2] * kv0
    if k[8] != 0.0:  # the routed experts no decoder picks are not read (as :func:`step_time`)
        mem0 -= k[8] * math.exp(k[9] * d)
    mem_slope = k[2] * n
    cmp0 = k[3] * n + k[4] * kv0 + k[7] * n
    cmp_slope = k[4] * n
    if mem0 >= cmp0:
        c1, b1, c2, b2 = fixed + mem0, mem_slope, fixed + cmp0, cmp_slope
    else:
        c1, b1, c2, b2 = fixed + cmp0, cmp_slope, fixed + mem0, mem_slope
    if m < shortest or now + shortest * c1 >= until:
        return -1, now
    js = m  # the first step on the other side of the roofline
    if m > 1 and c2 + b2 * (m - 1) > c1 + b1 * (m - 1):
        js = min(m, np.int64(math.ceil((c1 - c2) / (b2 - b1))))
    if now + _elapsed(c1, b1, c2, b2, js, m) >= until:
        # c1 x + b1 x^2 / 2 = until - now: a first-order guess, then exact by the formula
        inv = 1.0 / c1
        x = (until - now) * inv
        x -= 0.5 * b1 * x * x * inv
        j = min(np.int64(math.ceil(max(x, 0.0))), m)
        while j > 0 and now + _elapsed(c1, b1, c2, b2, js, j - 1) >= until:
            j -= 1
        while j < m and now + _elapsed(c1, b1, c2, b2, js, j) < until:
            j += 1
        m = j
    return m, now + _elapsed(c1, b1, c2, b2, js, m)
