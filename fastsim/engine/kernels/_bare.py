"""Runs of bare steps, the longer ones' last steps in closed form, for the serving loop
(:mod:`.serve`: one engine, or each replica of a pool).

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
from ...model.cost import step_time_with, weights_time
from . import _kv as roles
from ._arrivals import arrive
from ._calendar import extend_run
from ._running import cdiv
from ...model.cost import (OVERHEAD, T_EXPERTS, T_KV, T_LINK, T_LINK_TOKEN, T_PAIR, T_ROW, T_SAMPLE, T_TOKEN,
                           T_WEIGHTS, UNPICKED)

STEPPED = 16  # bare steps taken one by one before the rest of a run goes in closed form
SHORTEST = 12  # ... if that many are left at least
ALL = np.int64(-1)
ONE = np.int64(1)


@inline
def may_admit(kv, i, preempted, limited, left, prompt, g, c, cached, reserve, o_max, bt, per, free):
    """Whether the head of the waiting queue, request ``i`` (``preempted``: the front of the
    preempted ones), may be admitted in the next step (``left``: its budget after the decoders'
    tokens): then bare steps cannot run. Where its hit changes as blocks are taken (a cache that
    keeps the order of releases, or re-hits a preempted request's blocks), or the cache is
    unlimited, or no budget is left, say so: the loop goes step by step. A request holds
    cdiv(its tokens, bt) - ``per`` blocks."""
    if roles.ordered(kv) or not limited or left <= 0 or roles.rehits(kv, preempted):
        return True
    ci = max(c[i], cached)
    take = min(prompt[i] + g[i] - ci, left)
    need = cdiv(prompt[i] + o_max, bt) - per if reserve else cdiv(ci + take, bt) - per
    return need <= free


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
    fixed = k[OVERHEAD] + (k[T_LINK] + k[T_LINK_TOKEN] * n)
    mem0 = k[T_WEIGHTS] + k[T_KV] * kv0 + k[T_ROW] * n
    if k[T_EXPERTS] != 0.0:  # the routed experts no decoder picks are not read (as :func:`step_time`)
        mem0 -= k[T_EXPERTS] * math.exp(k[UNPICKED] * d)
    mem_slope = k[T_KV] * n
    cmp0 = k[T_TOKEN] * n + k[T_PAIR] * kv0 + k[T_SAMPLE] * n
    cmp_slope = k[T_PAIR] * n
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


@inline
def bare_run(k, kv, rep, bt, limit, lookahead, alone, releasing, paged, blocks, bound, bucket, occ, bcount, base, ring,
             arrival, heap_t, heap_i, qnext, began_r, runs, running, now, queue, state, record):
    """Bare steps of replica ``rep`` of the serving loop (:mod:`.serve`, inlined there): only its
    ``n_dec`` decoders run and nobody can be admitted, from ``now`` up to the first step that
    starts at or after ``bound`` (a routing instant), an arrival that would be admitted (one
    engine, ``alone``: with async scheduling, the step after it came; ``releasing``: arrivals
    from ``arrival`` and the heap, else from ``arrival[head]`` on), a completion or a step whose
    new blocks do not fit. The first ``STEPPED`` one by one, the rest in closed form. The run is
    recorded (its replica's open run extended) and the start of its last step kept. ``queue``:
    (t_next, q_next, sp, head, nheap, qfirst, qlast, nwait); ``state``: (n_dec, sum_c, steps,
    busy, cursor, free, aux, kv_sum, kv_peak, max_queue); ``record``: (nruns, and the open run:
    kv, pairs, nw, m, s). Returns (now, queue, state, record) after the run (an inlined helper
    takes fewer than 32 arguments)."""
    t_next, q_next, sp, head, nheap, qfirst, qlast, nwait = queue
    n_dec, sum_c, steps, busy, cursor, free, aux, kv_sum, kv_peak, max_queue = state
    nruns, run_kv, run_pairs, run_nw, run_m, run_s = record
    n = arrival.size
    kv0 = sum_c + n_dec
    steps0 = steps
    open_slot = running < limit and nwait == 0  # an arrival would be admitted
    phase_now = steps % bt
    used = blocks - free if blocks >= 0 else 0  # only grows here: its peak is its last value
    far, last, ride, rode = steps + STEPPED, False, now, -1  # past far, closed form; last, ride: below
    weights = weights_time(k, n_dec)
    while True:
        while now < bound:
            if alone and t_next <= now:
                if open_slot and (last or not lookahead):
                    break
                last, ride, rode = open_slot, now, steps  # (async: this step's batch predates it)
                if releasing:  # they only lengthen the queue
                    t_next, q_next, sp, nheap, qfirst, qlast, nwait = arrive(
                        now, t_next, q_next, sp, nheap, qfirst, qlast, nwait, arrival, heap_t, heap_i, qnext)
                else:
                    while head < n and arrival[head] <= now:
                        head += 1
                        nwait += 1
                    t_next = arrival[head] if head < n else np.inf
            elif last:
                break
            nxt = cursor + 1 if cursor + 1 < ring else 0
            if bucket[base + nxt] >= 0:
                break
            if paged:
                need = bcount[rep, phase_now]
                if need > free:
                    break
                free, aux = roles.allocate(kv, rep, need, free, aux)
                used += need
                phase_now = phase_now + 1 if phase_now + 1 < bt else 0
            kv_sum += used
            now += step_time_with(k, weights, n_dec, sum_c + n_dec, sum_c + n_dec, n_dec)
            steps += 1
            busy += n_dec
            sum_c += n_dec
            cursor = nxt
            if steps == far:
                break
        if steps != far or last:
            break
        # the rest in closed form up to the next event (as the steps above)
        m = next_filled(occ, bucket, base, cursor + 1 if cursor + 1 < ring else 0, ring)
        if paged and free < n_dec * m:  # (a step takes at most D blocks)
            m = min(m, blocks_last(bcount, rep, phase_now, bt, n_dec, free))
        stop = t_next if alone and open_slot else bound
        m, now = timed(k, n_dec, sum_c + n_dec, now, stop, SHORTEST, m)
        if m < 0:  # too short: step on
            far = -1
            continue
        kv_sum += m * used
        if paged:
            taken, taken_sum = blocks_taken(bcount, rep, phase_now, bt, n_dec, m)
            kv_sum += taken_sum
            free, aux = roles.allocate(kv, rep, taken, free, aux)
            used += taken
        steps += m
        busy += m * n_dec
        sum_c += m * n_dec
        cursor = cursor + m if cursor + m < ring else cursor + m - ring
        if not lookahead:
            break
        phase_now, far = (phase_now + m) % bt, -1  # async: step on, for an arrival's one more step
    kv_peak, max_queue = max(kv_peak, used), max(max_queue, nwait)  # (a bare run admits no one)
    nruns, run_kv, run_pairs, run_nw, run_m, run_s = extend_run(
        runs, nruns, run_kv, run_pairs, run_nw, run_m, run_s, n_dec, kv0, kv0, steps - steps0, n_dec, n_dec)
    if lookahead and steps > steps0:  # the last bare step's start (exact where an arrival rode it)
        began_r[rep] = ride if last and steps > rode else now - step_time_with(k, weights, n_dec, sum_c, sum_c, n_dec)
    return (now, (t_next, q_next, sp, head, nheap, qfirst, qlast, nwait),
            (n_dec, sum_c, steps, busy, cursor, free, aux, kv_sum, kv_peak, max_queue),
            (nruns, run_kv, run_pairs, run_nw, run_m, run_s))
