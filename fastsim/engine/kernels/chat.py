"""One engine with vLLM's prefix cache over chat traffic: system prompts and multi-turn sessions
(docs/model/prefix-cache.md), at the speed of the serving model's continuous kernel.

The step loop is :mod:`.continuous`'s for one engine (decoders kept as sums, completions from a
calendar, block boundaries by phase, runs of bare steps in closed form), with the cache kept as
runs of blocks (:mod:`._segments`) instead of blocks one by one: a session's turn hits its system
prompt and its previous turn's path, allocations evict whole runs from the queue's head, and a
release appends one run. Arrivals are the drawn ones and the turns sessions release (a heap),
taken in time order (ties: the lower index).

Exact for the traffic it takes (no trace; system prompts and sessions). Two states would break
the bookkeeping; the scheduling rules keep both from arising, the kernel checks and stops (the
driver then runs :mod:`.prefix`'s loop): a request admitted while another still computes its
system prompt (a chunk either completes it or takes the step's whole budget), and a hit cut short
of a cached run by the one-token rule (a turn's prompt is longer than all it shares).

The phases follow :mod:`.continuous`'s one-engine path where the cache plays no part; they are
written out apart because the cache's operations sit inside each phase.
"""

from __future__ import annotations

import numpy as np

from ..._jit import inline, jit, largest
from ...model.cost import step_time, step_time_with, weights_time
from . import _segments
from ._bare import blocks_last, blocks_taken, mark, next_filled, occupancy, timed
from ._calendar import RING_MAX, extend_run, record
from ._arrivals import next_arrival, pop, turn_after
from ._running import cal_file, cal_remove, cdiv, link_tail, unlink
from ._segments import GSEG, HI, HOLDERS, alive, release, settle, take

WORK_ROWS = 16
STEPPED = 16  # as :mod:`.continuous`
SHORTEST = 12


def run(arrival, prompt, output, parent, group, think, gend, groups, limit, k, budget, blocks, bt, lookahead, api_s,
        runs, gaps, work):
    """Allocate the cache and run :func:`chat`. Returns (first token, done, arrival, cached
    tokens, counters as :class:`~fastsim.engine.kernels.Counters` takes them), or None when the
    kernel stopped (see the module)."""
    n = arrival.size
    first, done, arrived = np.empty(n), np.empty(n), arrival.copy()
    cached = np.full(n, -1, np.int64)
    *counters, stopped = chat(arrived, prompt, output, parent, group, think, gend, limit, k, budget, blocks, bt,
                              lookahead, api_s, *_segments.start(blocks, groups), first, done, cached, runs, gaps, work)
    return None if stopped else (first, done, arrived, cached, counters)


@jit
def chat(arrival, prompt, output, parent, group, think, gend, limit, k, budget, blocks, bt, lookahead, api_s, seg, ends,
         unused, gst, first_token, done, cached, runs, gaps, work):
    """Continuous batching with a prefix cache of ``blocks`` blocks on one engine.

    Parameters
    ----------
    arrival : float64 (n,)    arrival times; NaN for a session's later turn (set here when it is
        released: the turn before's done time + ``api_s`` + ``think``)
    prompt, output : int64 (n,)
    parent : int64 (n,)    a later turn's turn before (its whole path is this one's first), or -1
    group : int64 (n,)    the system prompt, whose first ``gend`` blocks are cached content, or -1
    think : float64 (n,)    a later turn's think time (s), NaN otherwise
    lookahead : bool    async scheduling (as :func:`fastsim.engine.kernels.continuous.continuous`'s)
    seg, ends, unused, gst    the cache (:func:`fastsim.engine.kernels._segments.start`)
    first_token, done : float64 (n,)    filled (engine times); ``cached`` (int64, -1s) each
        request's hit at its first admission (tokens)
    runs, gaps, work    as :func:`fastsim.engine.kernels.continuous.continuous`'s (``work`` of
        ``WORK_ROWS`` rows)

    Returns (steps, busy, max_queue, preemptions, KV block-steps, peak KV blocks, runs, gaps,
    stopped).
    """
    n = arrival.size
    g = work[0]  # tokens emitted (decoders: as of step dbase)
    c = work[1]  # tokens computed (non-decoders)
    held = work[2]  # blocks of its path a non-decoder holds
    dbase = work[3]
    phase = work[4]
    last_t = work[5].view(np.float64)
    rprev = work[6]
    rnext = work[7]
    cnext = work[8]
    cprev = work[9]
    due = work[10]
    pnext = work[11]
    qnext = work[12]
    sid = work[13]  # the segment of its last release
    gheld = work[14]  # holds its system prompt's blocks
    seq = work[15]  # when it was admitted (running-list order)
    for i in range(n):
        g[i] = c[i] = held[i] = gheld[i] = 0
        sid[i] = -1
    ring = min(largest(output) + 1, RING_MAX)
    stride = (ring + 63) & ~63
    bucket = np.full(stride + 1, -1, np.int64)
    occ = occupancy(stride)
    bcount = np.zeros((1, bt), np.int64)
    heap_t = np.empty(n)
    heap_i = np.empty(n, np.int64)
    nheap = 0
    sp = 0
    rows_i = np.empty(min(limit, n) + 1, np.int64)
    rows_c = np.empty(rows_i.size, np.int64)
    rows_n = np.empty(rows_i.size, np.int64)
    dues = np.empty(rows_i.size, np.int64)
    admitted = 0
    rhead = rtail = partial = ptop = qfirst = qlast = -1
    running = cursor = n_dec = sum_c = npre = nwait = 0
    steps = busy = max_queue = preemptions = kv_sum = kv_peak = 0
    run_kv = run_pairs = run_nw = run_m = run_s = 0
    free = blocks
    owed = 0  # blocks allocated but not yet taken from the queue's head: settled before it is read
    nruns = ngaps = 0
    now = 0.0
    began = -np.inf  # when the last step started
    t_next, q_next, sp = next_arrival(arrival, sp, heap_t, heap_i, nheap)
    while True:
        t_next, q_next, sp, nheap, qfirst, qlast, nwait = _arrive(
            now, t_next, q_next, sp, nheap, qfirst, qlast, nwait, arrival, heap_t, heap_i, qnext)
        left = budget - n_dec
        nrows = 0
        preempted = False
        # 1. running requests: decoders' new blocks, then the partial row
        ptake = pneed = 0
        if partial >= 0:
            ptake = min(prompt[partial] + g[partial] - c[partial], left)
            pneed = cdiv(c[partial] + ptake, bt) - held[partial]
        if bcount[0, steps % bt] + pneed > free:
            j = rhead
            while j >= 0:
                if j == partial:
                    need = pneed
                else:
                    cj = prompt[j] + g[j] + (steps - dbase[j]) - 1
                    need = 1 if cj % bt == 0 else 0
                gone = False
                while need > free:
                    v = rtail
                    rhead, rtail = unlink(rprev, rnext, rhead, rtail, v)
                    running -= 1
                    if v == partial:
                        kept = c[v]
                        top = held[v]
                        partial = -1
                    else:
                        g[v] += steps - dbase[v]
                        kept = prompt[v] + g[v] - 1
                        top = cdiv(kept, bt)
                        n_dec -= 1
                        sum_c -= kept
                        bcount[0, phase[v]] -= 1
                        cal_remove(bucket, cnext, cprev, v)
                        last_t[v] = now
                    owed = settle(seg, ends, unused, gst, group, owed)
                    free += release(seg, ends, unused, gst, group, gheld, sid, v, top, kept // bt, gend)
                    held[v] = 0
                    c[v] = 0
                    pnext[v] = ptop
                    ptop = v
                    npre += 1
                    nwait += 1
                    preemptions += 1
                    preempted = True
                    if v == j:
                        gone = True
                        break
                if gone:
                    break
                owed += need
                free -= need
                if j == partial:
                    held[j] += need
                j = rnext[j]
            left = budget - n_dec
        else:
            owed += bcount[0, steps % bt] + pneed
            free -= bcount[0, steps % bt] + pneed
            if partial >= 0:
                held[partial] += pneed
        sampled = n_dec
        if partial >= 0:
            rows_i[0] = partial
            rows_c[0] = c[partial]
            rows_n[0] = ptake
            nrows = 1
            left -= ptake
            sampled += ptake == prompt[partial] + g[partial] - c[partial]
            gi = group[partial]
            if gi >= 0 and gst[gi, HI] < gend:  # it fills its system prompt
                gst[gi, HI] = max(gst[gi, HI], min(gend, (c[partial] + ptake) // bt))
        # 2. admission, only when nobody was preempted; the head of the queue blocks it
        if not preempted:
            seen = began if lookahead and running > 0 else now  # arrivals the batch can hold
            while running < limit and left > 0 and nwait > 0:
                i = ptop if npre > 0 else qfirst
                if npre == 0 and arrival[i] > seen:
                    break
                gi = group[i]
                owed = settle(seg, ends, unused, gst, group, owed)  # the queue as of now: hits read it
                h = free_hits = 0
                s_g = s_p = -1  # the segments it hits: its system prompt's, its path's
                if gi >= 0:
                    h = gst[gi, HI]
                    if h < gend and gst[gi, HOLDERS] > 0:
                        return (steps, busy, max_queue, preemptions, kv_sum, kv_peak, nruns, ngaps, True)
                    if gst[gi, HOLDERS] == 0 and h > 0:
                        s_g = gst[gi, GSEG]
                        free_hits = h
                if gi < 0 or h == gend:
                    s = sid[i] if alive(seg, sid[i], i) else -1
                    if s < 0 and parent[i] >= 0 and alive(seg, sid[parent[i]], parent[i]):
                        s = sid[parent[i]]
                    if s >= 0 and seg[s, _segments.A] <= h < seg[s, _segments.F]:
                        top = min(seg[s, _segments.F], (prompt[i] + g[i] - 1) // bt)
                        if top < seg[s, _segments.F]:  # its last block would be recomputed beside a cached one
                            return (steps, busy, max_queue, preemptions, kv_sum, kv_peak, nruns, ngaps, True)
                        if top > h:
                            free_hits += top - h
                            h = top
                            s_p = s
                c0 = h * bt
                todo = prompt[i] + g[i] - c0
                take_n = min(todo, left)
                new = cdiv(c0 + take_n, bt) - h
                if new + free_hits > free:
                    break
                if gi >= 0 and gend > 0:
                    gheld[i] = 1
                    gst[gi, HOLDERS] += 1
                    if s_g >= 0:
                        gst[gi, GSEG] = -1
                        if s_g != s_p:
                            take(seg, ends, unused, s_g, min(gst[gi, HI], gend))
                if s_p >= 0:
                    take(seg, ends, unused, s_p, h)
                free -= free_hits
                owed += new
                free -= new
                held[i] = h + new
                if cached[i] < 0:
                    cached[i] = c0
                if gi >= 0 and gst[gi, HI] < gend:
                    gst[gi, HI] = max(gst[gi, HI], min(gend, (c0 + take_n) // bt))
                if npre > 0:
                    ptop = pnext[i]
                    npre -= 1
                else:
                    qfirst = qnext[i]
                    if qfirst < 0:
                        qlast = -1
                nwait -= 1
                c[i] = c0
                seq[i] = admitted
                admitted += 1
                rhead, rtail = link_tail(rprev, rnext, rhead, rtail, i)
                running += 1
                rows_i[nrows] = i
                rows_c[nrows] = c0
                rows_n[nrows] = take_n
                nrows += 1
                left -= take_n
                sampled += take_n == todo
        max_queue = max(max_queue, nwait)
        if nrows == 0 and n_dec == 0:
            if running == 0 and nwait == 0:
                if q_next < 0:
                    break
                now = t_next  # idle: jump to the next arrival
            continue
        # 3. the step
        n_tok = n_dec
        kv_tok = sum_c + n_dec
        pairs = sum_c + n_dec
        for r in range(nrows):
            n_tok += rows_n[r]
            kv_tok += rows_c[r] + rows_n[r]
            pairs += rows_n[r] * (2 * rows_c[r] + rows_n[r] + 1) // 2
        used = blocks - free
        kv_sum += used
        kv_peak = max(kv_peak, used)
        d = step_time(k, n_tok, kv_tok, pairs, sampled)
        nruns, run_kv, run_pairs, run_nw, run_m, run_s = extend_run(
            runs, nruns, run_kv, run_pairs, run_nw, run_m, run_s, n_tok, kv_tok, pairs, 1, n_dec, sampled)
        began = now
        now += d
        steps += 1
        busy += n_dec
        sum_c += n_dec
        cursor = cursor + 1 if cursor + 1 < ring else 0
        # completions release their blocks in running order (the queue's order depends on it):
        # the decoders due now (admitted before any prefill row), then the rows
        ndue = 0
        i = bucket[cursor]
        while i >= 0:
            nx = cnext[i]
            if due[i] == steps:
                cal_remove(bucket, cnext, cprev, i)
                b = ndue
                while b > 0 and seq[dues[b - 1]] > seq[i]:
                    dues[b] = dues[b - 1]
                    b -= 1
                dues[b] = i
                ndue += 1
            i = nx
        for b in range(ndue):
            i = dues[b]
            done[i] = now
            g[i] = output[i]
            ci = prompt[i] + output[i] - 1
            n_dec -= 1
            sum_c -= ci
            bcount[0, phase[i]] -= 1
            owed = settle(seg, ends, unused, gst, group, owed)
            free += release(seg, ends, unused, gst, group, gheld, sid, i, cdiv(ci, bt), ci // bt, gend)
            rhead, rtail = unlink(rprev, rnext, rhead, rtail, i)
            running -= 1
            nheap = turn_after(i, now, api_s, think, arrival, heap_t, heap_i, nheap)
        partial = -1
        for r in range(nrows):
            i = rows_i[r]
            c[i] = rows_c[r] + rows_n[r]
            if c[i] < prompt[i] + g[i]:
                partial = i
                continue
            g[i] += 1
            busy += 1
            if g[i] == 1:
                first_token[i] = now
            else:
                if ngaps < gaps.size:
                    gaps[ngaps] = now - last_t[i]
                ngaps += 1
            if g[i] == output[i]:
                done[i] = now
                rhead, rtail = unlink(rprev, rnext, rhead, rtail, i)
                running -= 1
                owed = settle(seg, ends, unused, gst, group, owed)
                free += release(seg, ends, unused, gst, group, gheld, sid, i, held[i], c[i] // bt, gend)
                held[i] = 0
                nheap = turn_after(i, now, api_s, think, arrival, heap_t, heap_i, nheap)
            else:
                dbase[i] = steps
                n_dec += 1
                sum_c += c[i]
                phase[i] = (steps - c[i]) % bt
                bcount[0, phase[i]] += 1
                mark(occ, cal_file(bucket, 0, ring, cnext, cprev, due, cursor, steps, i, output[i] - g[i]))
        t_next, q_next, sp = next_arrival(arrival, sp, heap_t, heap_i, nheap)
        # 4. fast path: only decoders, nobody to admit, until the next arrival that would be
        # admitted, a completion or a step whose new blocks do not fit
        if partial >= 0 or n_dec == 0 or preempted:
            continue
        if nwait > 0 and running < limit:
            continue  # (the head's hit changes as blocks are taken: step by step)
        kv0 = sum_c + n_dec
        steps0 = steps
        open_slot = running < limit and nwait == 0
        phase_now = steps % bt
        used = blocks - free
        far, last = steps + STEPPED, False  # last: an arrival came (async: one more step, then admission)
        ride, rode = now, -1  # (async: the start and number of the step an arrival rides)
        weights = weights_time(k, n_dec)
        while True:
            while True:
                if t_next <= now:
                    if open_slot and (last or not lookahead):
                        break
                    last, ride, rode = open_slot, now, steps  # (async: the step starting now was chosen before it came)
                    t_next, q_next, sp, nheap, qfirst, qlast, nwait = _arrive(  # they only lengthen the queue
                        now, t_next, q_next, sp, nheap, qfirst, qlast, nwait, arrival, heap_t, heap_i, qnext)
                elif last:
                    break
                nxt = cursor + 1 if cursor + 1 < ring else 0
                if bucket[nxt] >= 0:
                    break
                need = bcount[0, phase_now]
                if need > free:
                    break
                owed += need
                free -= need
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
            m = next_filled(occ, bucket, 0, cursor + 1 if cursor + 1 < ring else 0, ring)
            if free < n_dec * m:
                m = min(m, blocks_last(bcount, 0, phase_now, bt, n_dec, free))
            stop = t_next if open_slot else np.inf
            m, now = timed(k, n_dec, sum_c + n_dec, now, stop, SHORTEST, m)
            if m < 0:
                far = -1
                continue
            kv_sum += m * used
            taken, taken_sum = blocks_taken(bcount, 0, phase_now, bt, n_dec, m)
            kv_sum += taken_sum
            owed += taken
            free -= taken
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
        if lookahead and steps > steps0:  # the last bare step's start: exact where an arrival rode it (their tie
            # decides its admission), else from the run's end
            began = ride if last and steps > rode else now - step_time_with(k, weights, n_dec, sum_c, sum_c, n_dec)
    nruns = record(runs, nruns, run_nw >> 32, run_kv, run_pairs, run_m, run_nw & 0xFFFFFFFF, run_s)
    return steps, busy, max_queue, preemptions, kv_sum, kv_peak, nruns, ngaps, False


@inline
def _arrive(now, t_next, q_next, sp, nheap, qfirst, qlast, nwait, arrival, heap_t, heap_i, qnext):
    """Every arrival due by ``now`` (the next is ``t_next``, request ``q_next``) joins the
    waiting queue's tail, in time order; returns the next arrival and the updated state."""
    while t_next <= now:
        if q_next == sp:
            sp += 1
        else:
            nheap = pop(heap_t, heap_i, nheap)
        qnext[q_next] = -1
        qnext[qlast if qlast >= 0 else qnext.size - 1] = q_next
        qfirst = qfirst if qlast >= 0 else q_next
        qlast = q_next
        nwait += 1
        t_next, q_next, sp = next_arrival(arrival, sp, heap_t, heap_i, nheap)
    return t_next, q_next, sp, nheap, qfirst, qlast, nwait
