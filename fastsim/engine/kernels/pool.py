"""The pool kernel: several replicas of one serving engine advanced together in time order,
each request routed at its instant by a router that looks at their state (DESIGN.md, "The
fleet model"). Continuous batching in the serving model only.

Requests come in the pool's order (arrival-sorted; ties in index order). Before routing request
j, arriving at t, every replica runs each step that starts before t, so the router sees its
outstanding requests and KV blocks "as of every step that started before t"; then j joins the
chosen replica's waiting queue, and an idle replica wakes at t. Between two routing instants a
replica does what the one-engine kernel (:func:`.serving.continuous`) does between two
arrivals, step for step, with the same floating-point operations: its loop body is that
kernel's, with the waiting queue a list per replica instead of an index range and arrivals
arriving by routing instead of by time. (The two bodies are kept apart on purpose: shared as
Numba-inlined helpers, the one-engine kernel measured 1.5 to 2.6 times slower.)

State is struct of arrays with a replica dimension: per request (each in one replica) the
serving kernel's arrays plus ``qnext`` (the waiting queues, one FIFO list per replica after its
stack of preempted requests); per replica its scalars (``st``, ``now_r``), its calendar (the
``ring`` buckets of ``bucket`` from ``rep * ring``), its decoders by block phase (``bcount``)
and its open step run (extended while steps continue it, written to ``runs`` when one does not,
so a replica's runs are those the one engine records). These arrays are indexed in place: a row
view per replica at every routing instant cost ~8 % of the kernel's time (least_outstanding).
"""

from __future__ import annotations

import numpy as np

from ..._jit import inline, jit, largest
from ...model.cost import step_time
from ..router import choose
from ._calendar import LOW, RING_MAX, record
from ._running import cal_file, cal_remove, cdiv, fresh, unlink

# Per-replica scalars, columns of ``st``.
(RHEAD, RTAIL, RUNNING, CURSOR, N_DEC, SUM_C, PARTIAL, PTOP, NPRE, QFIRST, QLAST, NWAIT, STEPS, BUSY, MAX_QUEUE,
 PREEMPTIONS, KV_SUM, KV_PEAK, FREE, RUN_KV, RUN_PAIRS, RUN_NW, RUN_M, N_STATE) = range(24)


@inline
def _extend(runs, nruns, run_kv, run_pairs, run_nw, run_m, n_tok, kv_tok, pairs, m, w):
    """A replica's run of ``m`` steps (as :func:`._calendar.record` takes one) extends its open
    run when it continues it; else the open run is written to ``runs`` and this one opens.
    Returns (nruns, and the open run: kv, pairs, N << 32 | w, m)."""
    if m <= 0 or w <= 0:
        return nruns, run_kv, run_pairs, run_nw, run_m
    nw = (n_tok << 32) | w
    if run_m > 0 and run_nw == nw and run_kv + run_m * w == kv_tok and run_pairs + run_m * w == pairs:
        return nruns, run_kv, run_pairs, run_nw, run_m + m
    nruns = record(runs, nruns, run_nw >> 32, run_kv, run_pairs, run_m, run_nw & LOW)
    return nruns, kv_tok, pairs, nw, m


WORK_ROWS = 13  # the kernel's per-request state: rows of ``work``


@jit
def coupled(arrival, prompt, output, replicas, code, routes, limit, k, budget, blocks, bt, reserve, pb, o_max,
            token_1, first_token, done, replica, runs, gaps, work):
    """Continuous batching on ``replicas`` replicas behind router ``code``.

    Parameters
    ----------
    arrival : float64 (n,)    when each request reaches the pool (s), non-decreasing
    prompt, output : int64 (n,)    prompt and output lengths (tokens; output >= 1)
    replicas : int    replicas in the pool
    code : int    the router (:data:`fastsim.engine.router.CODES`)
    routes : int64 (n,)    the random router's replica per request (else unused)
    limit, k, budget, blocks, bt, reserve, pb, o_max, token_1 : as :func:`.serving.continuous`,
        the same for every replica (``blocks`` >= 0 also for an unlimited cache when the router
        counts blocks: then so many that they never bind)
    first_token, done : float64 (n,)    filled with engine times, as :func:`.serving.continuous`
    replica : int64 (n,)    filled with the replica each request was routed to
    runs : int64 (capacity, 4)    step runs of every replica: the kernel returns how many it needed
    gaps : float64 (capacity,)    irregular inter-token gaps: the kernel returns how many it needed
    work : int64 (WORK_ROWS, n + 1)    room for the per-request state, as :func:`.serving.continuous`'s

    Returns
    -------
    (steps, busy slot-steps, max_queue of any replica, preemptions, sum over replica-steps of KV
     blocks in use, peak KV blocks in use on any replica, number of runs, number of gaps)
    """
    n = arrival.size
    cached = pb * bt
    limited = blocks >= 0
    paged = limited and not reserve
    g = work[0]  # tokens emitted (decoders: as of step dbase)
    c = work[1]  # tokens computed (non-decoders)
    held = work[2]
    dbase = work[3]  # set when a request becomes a decoder, as phase
    phase = work[4]
    last_t = work[5].view(np.float64)  # set when a later gap reads it
    rprev = work[6]  # each replica's running list, in admission order
    rnext = work[7]
    cnext = work[8]
    cprev = work[9]
    due = work[10]
    pnext = work[11]  # each replica's stack of preempted requests
    qnext = work[12]  # each replica's waiting queue (after its preempted ones)
    fresh(work, prompt, token_1)  # a decode replica's prompts arrive computed, their first token emitted
    ring = min(largest(output) + 1, RING_MAX)
    bucket = np.full(replicas * ring + 1, -1, np.int64)  # replica r's calendar from r * ring; a spare slot
    bcount = np.zeros((replicas, bt), np.int64)
    st = np.zeros((replicas, N_STATE), np.int64)
    st[:, RHEAD] = st[:, RTAIL] = st[:, PARTIAL] = st[:, PTOP] = st[:, QFIRST] = st[:, QLAST] = -1
    st[:, FREE] = blocks - pb if limited else 0
    now_r = np.zeros(replicas)
    outstanding = np.zeros(replicas, np.int64)  # routed to each replica, not yet done
    used_blocks = np.full(replicas, pb if limited else 0, np.int64)  # KV blocks in use on each replica
    rows_i = np.empty(min(limit, arrival.size) + 1, np.int64)  # a step's prefill rows (at most every request)
    rows_c = np.empty(rows_i.size, np.int64)
    rows_n = np.empty(rows_i.size, np.int64)
    nruns = 0
    ngaps = 0
    for q in range(n + 1):
        until = arrival[q] if q < n else np.inf
        for rep in range(replicas):  # run every step that starts before ``until``
            now = now_r[rep]
            if now >= until or (st[rep, RUNNING] == 0 and st[rep, NWAIT] == 0):
                continue
            base = rep * ring
            rhead, rtail, running = st[rep, RHEAD], st[rep, RTAIL], st[rep, RUNNING]
            cursor, n_dec, sum_c = st[rep, CURSOR], st[rep, N_DEC], st[rep, SUM_C]
            partial, ptop, npre = st[rep, PARTIAL], st[rep, PTOP], st[rep, NPRE]
            qfirst, qlast, nwait = st[rep, QFIRST], st[rep, QLAST], st[rep, NWAIT]
            steps, busy, max_queue, preemptions = st[rep, STEPS], st[rep, BUSY], st[rep, MAX_QUEUE], st[rep, PREEMPTIONS]
            kv_sum, kv_peak, free = st[rep, KV_SUM], st[rep, KV_PEAK], st[rep, FREE]
            run_kv, run_pairs, run_nw, run_m = st[rep, RUN_KV], st[rep, RUN_PAIRS], st[rep, RUN_NW], st[rep, RUN_M]
            finished = 0
            while now < until:
                left = budget - n_dec  # decoders first: one token each, always within the budget
                nrows = 0
                preempted = False
                # 1. running requests: decoders' new blocks, then the partial row (the tail)
                ptake = 0
                pneed = 0
                if partial >= 0:
                    ptake = min(prompt[partial] + g[partial] - c[partial], left)
                    if paged:
                        pneed = cdiv(c[partial] + ptake, bt) - pb - held[partial]
                if paged and bcount[rep, steps % bt] + pneed > free:
                    # not enough blocks for everyone: oldest first, preempting the newest as needed
                    j = rhead
                    while j >= 0:
                        if j == partial:
                            need = pneed
                        else:
                            cj = prompt[j] + g[j] + (steps - dbase[j]) - 1
                            need = 1 if cj % bt == 0 else 0
                        gone = False
                        while need > free:
                            v = rtail  # preempt the newest: it frees its blocks and recomputes later
                            rhead, rtail = unlink(rprev, rnext, rhead, rtail, v)
                            running -= 1
                            if v == partial:
                                free += held[v]
                                partial = -1
                            else:
                                g[v] += steps - dbase[v]
                                cv = prompt[v] + g[v] - 1
                                free += cdiv(cv, bt) - pb
                                n_dec -= 1
                                sum_c -= cv
                                bcount[rep, phase[v]] -= 1
                                cal_remove(bucket, cnext, cprev, v)
                                last_t[v] = now  # a decoder emitted at the step just run
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
                        free -= need
                        if j == partial:
                            held[j] += need
                        j = rnext[j]
                    left = budget - n_dec
                elif paged:
                    free -= bcount[rep, steps % bt] + pneed
                    if partial >= 0:
                        held[partial] += pneed
                if partial >= 0:
                    rows_i[0] = partial
                    rows_c[0] = c[partial]
                    rows_n[0] = ptake
                    nrows = 1
                    left -= ptake
                # 2. admission, only when nobody was preempted; the head of the queue blocks it
                if not preempted:
                    while running < limit and left > 0 and nwait > 0:
                        i = ptop if npre > 0 else qfirst
                        ci = max(c[i], cached)  # a warm prefix, or a prompt whose KV arrived whole
                        take = min(prompt[i] + g[i] - ci, left)
                        if limited:
                            need = cdiv(prompt[i] + o_max, bt) - pb if reserve else cdiv(ci + take, bt) - pb
                            if need > free:
                                break
                            free -= need
                            held[i] = need
                        if npre > 0:
                            ptop = pnext[i]
                            npre -= 1
                        else:
                            qfirst = qnext[i]
                            if qfirst < 0:
                                qlast = -1
                        nwait -= 1
                        c[i] = ci
                        rprev[i] = rtail
                        rnext[i] = -1
                        if rtail >= 0:
                            rnext[rtail] = i
                        else:
                            rhead = i
                        rtail = i
                        running += 1
                        rows_i[nrows] = i
                        rows_c[nrows] = ci
                        rows_n[nrows] = take
                        nrows += 1
                        left -= take
                max_queue = max(max_queue, nwait)
                if nrows == 0 and n_dec == 0:
                    if running == 0 and nwait == 0:
                        break  # idle until a request is routed here
                    continue  # else the only runner preempted itself: it is admitted next iteration
                # 3. the step
                n_tok = n_dec
                kv_tok = sum_c + n_dec
                pairs = sum_c + n_dec
                for r in range(nrows):
                    n_tok += rows_n[r]
                    kv_tok += rows_c[r] + rows_n[r]
                    pairs += rows_n[r] * (2 * rows_c[r] + rows_n[r] + 1) // 2
                if limited:
                    used = blocks - free
                    kv_sum += used
                    kv_peak = max(kv_peak, used)
                d = step_time(k, n_tok, kv_tok, pairs)
                nruns, run_kv, run_pairs, run_nw, run_m = _extend(runs, nruns, run_kv, run_pairs, run_nw, run_m, n_tok,
                                                                  kv_tok, pairs, 1, n_dec)
                now += d
                steps += 1
                busy += n_dec
                sum_c += n_dec
                cursor = cursor + 1 if cursor + 1 < ring else 0
                # prefill rows: a row that reaches p + g computed tokens emits one
                partial = -1
                for r in range(nrows):
                    i = rows_i[r]
                    c[i] = rows_c[r] + rows_n[r]
                    if c[i] < prompt[i] + g[i]:
                        partial = i  # the budget ran out on it
                        continue
                    g[i] += 1
                    busy += 1
                    if g[i] == 1:
                        first_token[i] = now
                    else:  # a preempted request's first token after its recompute
                        if ngaps < gaps.size:  # else only counted: the driver runs again with room
                            gaps[ngaps] = now - last_t[i]
                        ngaps += 1
                    if g[i] == output[i]:
                        done[i] = now
                        finished += 1
                        rhead, rtail = unlink(rprev, rnext, rhead, rtail, i)
                        running -= 1
                        free += held[i]
                        held[i] = 0
                    else:  # a decoder from now on
                        dbase[i] = steps
                        n_dec += 1
                        sum_c += c[i]
                        phase[i] = (steps - c[i]) % bt
                        bcount[rep, phase[i]] += 1
                        cal_file(bucket, base, ring, cnext, cprev, due, cursor, steps, i, output[i] - g[i])
                # decoders due now finish
                i = bucket[base + cursor]
                while i >= 0:
                    nx = cnext[i]
                    if due[i] == steps:
                        cal_remove(bucket, cnext, cprev, i)
                        done[i] = now
                        finished += 1
                        g[i] = output[i]
                        ci = prompt[i] + output[i] - 1
                        n_dec -= 1
                        sum_c -= ci
                        bcount[rep, phase[i]] -= 1
                        if paged:
                            free += cdiv(ci, bt) - pb
                        elif limited:
                            free += held[i]
                            held[i] = 0
                        rhead, rtail = unlink(rprev, rnext, rhead, rtail, i)
                        running -= 1
                    i = nx
                # 4. fast path: only decoders, nobody to admit, until ``until``, a completion or a step
                # whose new blocks do not fit
                if partial >= 0 or n_dec == 0 or preempted:
                    continue
                if nwait > 0 and running < limit:
                    i = ptop if npre > 0 else qfirst
                    if not limited or budget - n_dec <= 0:
                        continue
                    ci = max(c[i], cached)
                    take = min(prompt[i] + g[i] - ci, budget - n_dec)
                    need = cdiv(prompt[i] + o_max, bt) - pb if reserve else cdiv(ci + take, bt) - pb
                    if need <= free:
                        continue  # the head can be admitted
                kv0 = sum_c + n_dec
                steps0 = steps
                phase_now = steps % bt
                used = blocks - free if limited else 0  # only grows here: its peak is its last value
                while now < until:  # requests arrive only when routed, at ``until``
                    nxt = cursor + 1 if cursor + 1 < ring else 0
                    if bucket[base + nxt] >= 0:
                        break
                    if paged:
                        need = bcount[rep, phase_now]
                        if need > free:
                            break
                        free -= need
                        used += need
                        phase_now = phase_now + 1 if phase_now + 1 < bt else 0
                    kv_sum += used
                    now += step_time(k, n_dec, sum_c + n_dec, sum_c + n_dec)
                    steps += 1
                    busy += n_dec
                    sum_c += n_dec
                    cursor = nxt
                kv_peak = max(kv_peak, used)
                nruns, run_kv, run_pairs, run_nw, run_m = _extend(runs, nruns, run_kv, run_pairs, run_nw, run_m, n_dec,
                                                                  kv0, kv0, steps - steps0, n_dec)
            now_r[rep] = now
            st[rep, RHEAD], st[rep, RTAIL], st[rep, RUNNING] = rhead, rtail, running
            st[rep, CURSOR], st[rep, N_DEC], st[rep, SUM_C] = cursor, n_dec, sum_c
            st[rep, PARTIAL], st[rep, PTOP], st[rep, NPRE] = partial, ptop, npre
            st[rep, QFIRST], st[rep, QLAST], st[rep, NWAIT] = qfirst, qlast, nwait
            st[rep, STEPS], st[rep, BUSY], st[rep, MAX_QUEUE], st[rep, PREEMPTIONS] = steps, busy, max_queue, preemptions
            st[rep, KV_SUM], st[rep, KV_PEAK], st[rep, FREE] = kv_sum, kv_peak, free
            st[rep, RUN_KV], st[rep, RUN_PAIRS], st[rep, RUN_NW], st[rep, RUN_M] = run_kv, run_pairs, run_nw, run_m
            outstanding[rep] -= finished
            used_blocks[rep] = blocks - free if limited else 0
        if q == n:
            break
        rep = choose(code, q, routes, outstanding, used_blocks)
        replica[q] = rep
        outstanding[rep] += 1
        if st[rep, RUNNING] == 0 and st[rep, NWAIT] == 0:
            now_r[rep] = max(now_r[rep], arrival[q])  # an idle replica wakes when a request reaches it
        qnext[q] = -1
        if st[rep, QLAST] >= 0:
            qnext[st[rep, QLAST]] = q
        else:
            st[rep, QFIRST] = q
        st[rep, QLAST] = q
        st[rep, NWAIT] += 1
    for r in range(replicas):  # close every open run
        nruns = record(runs, nruns, st[r, RUN_NW] >> 32, st[r, RUN_KV], st[r, RUN_PAIRS], st[r, RUN_M],
                       st[r, RUN_NW] & LOW)
    return (st[:, STEPS].sum(), st[:, BUSY].sum(), st[:, MAX_QUEUE].max(), st[:, PREEMPTIONS].sum(),
            st[:, KV_SUM].sum(), st[:, KV_PEAK].max(), nruns, ngaps)
