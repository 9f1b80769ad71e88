"""The serving model's continuous-batching step loop: one source for one engine and for a pool of
replicas behind a load-aware router (docs/model/serving.md, docs/model/fleets.md). With every
serving-model addition off the lesson's own kernels (:mod:`.lesson`) run instead.

One engine takes each request at the first step that starts at or after its arrival (async
scheduling, ``lookahead``: one step later, if a step was running). A pool takes its requests in
its order (arrival-sorted, ties in index order): before routing request q, arriving at t, every
replica runs each step that starts before t, so the router sees its outstanding requests and KV
blocks as of then; q joins the chosen replica's waiting queue and an idle replica wakes at t. A
replica between two routing instants and one engine between two arrivals run the same
statements, told apart by ``code`` (a router, or :data:`fastsim.engine.router.ONE_ENGINE`).

The work per step does not depend on the batch size:

- Running requests are *decoders* (need one token a step) plus at most one *partial* row, the
  newest admission, whose prompt (or recompute) did not fit in the last step's budget: a row is
  partial only when the budget ran out on it, and then nothing newer was admitted. Since the
  budget is at least the running limit (checked with the config, as in vLLM), every decoder gets
  its token every step, so decoders are kept as sums: D of them holding SC computed tokens in
  all read C = SC + D KV tokens and form A = SC + D query-key pairs a step, and their token
  counts are derived from the step they became decoders.
- Their completions come from a calendar per replica (doubly linked: a preempted request leaves
  it in O(1)), their new blocks from counters by phase (one every ``block_tokens`` steps).
- Preemption victims are the tail of the admission-ordered running list. When the free blocks
  cannot cover this step's needs, the step walks the running list oldest first and preempts
  from the tail exactly as the rules say; otherwise no one is preempted and the sums suffice.
- While nobody can be admitted, finish or run out of blocks, a fast path runs bare steps: the
  first ``STEPPED`` one by one, the rest in closed form (:mod:`._bare`; every count exact, times
  rounded once per run), up to the next routing instant, arrival that would be admitted (async:
  the step after it came), completion, or step whose blocks do not fit.

State is struct of arrays, indexed in place (a row view per replica per routing instant cost
~8 %): per request the rows of ``work``; per replica its scalars (columns of ``st``, in locals
while it runs), its calendar (buckets from ``rep * stride``), its decoders by block phase
(``bcount[rep]``) and its open step run (written to ``runs`` when the next does not continue it).
"""

from __future__ import annotations

import numpy as np

from ..._jit import jit, largest
from ...model.cost import step_time, step_time_with, weights_time
from ..router import choose
from ._bare import blocks_last, blocks_taken, mark, next_filled, occupancy, timed
from ._calendar import RING_MAX, extend_run, totals
from ._running import cal_file, cal_remove, cdiv, fresh, join_queue, link_tail, own_hit, unlink

WORK_ROWS = 13  # the kernel's per-request state: rows of ``work``
STEPPED = 16  # bare steps taken one by one before the rest of a run goes in closed form
SHORTEST = 12  # ... if that many are left at least

# Per-replica scalars, columns of ``st``.
(RHEAD, RTAIL, RUNNING, CURSOR, N_DEC, SUM_C, PARTIAL, PTOP, NPRE, QFIRST, QLAST, NWAIT, STEPS, BUSY, MAX_QUEUE,
 PREEMPTIONS, KV_SUM, KV_PEAK, FREE, RUN_KV, RUN_PAIRS, RUN_NW, RUN_M, RUN_S, NET, N_STATE) = range(26)
PAGED, RESERVE, REHIT = range(3)  # KV allocation: paged; reserved at admission; paged under a prefix cache


@jit
def continuous(arrival, prompt, output, replicas, code, routes, limit, k, budget, blocks, bt, kv_mode, pb, o_max,
               lookahead, token_1, first_token, done, replica, runs, gaps, work):
    """Continuous batching on one engine, or on ``replicas`` replicas behind router ``code``.

    Parameters
    ----------
    arrival : float64 (n,)    when each request arrives (s), non-decreasing
    prompt, output : int64 (n,)    prompt and output lengths (tokens; output >= 1)
    replicas : int    replicas (1 for one engine)
    code : int    the router (:data:`fastsim.model.routers.ROUTERS`' code), or ``ONE_ENGINE``
    routes : int64 (n,)    the random router's replica per request (else unused, may be empty)
    limit : int    most requests running at once on a replica
    k : float64 (10,)    step-time coefficients (:func:`fastsim.model.cost.coefficients`)
    budget : int    tokens computed per step at most (>= limit)
    blocks : int    KV cache blocks of a replica, or -1 for unlimited (a router that counts
        blocks is given so many that they never bind)
    bt : int    tokens per block
    kv_mode : int    PAGED; RESERVE: ceil((prompt + o_max) / bt) blocks at admission; REHIT:
        paged under a prefix cache over requests that share nothing (no pinned prefix), where a
        preempted request finds again those of its blocks not yet evicted (:func:`._running.own_hit`)
    pb : int    blocks pinned by the shared prefix (every admission starts with pb * bt tokens)
    o_max : int    the longest output the workload can produce
    lookahead : bool    async scheduling: while anything runs, the head is admitted only if it
        arrived by the start of the step before (a preempted one always)
    token_1 : float64 (n,) or (0,)    a decode replica's requests: each arrives with its
        prompt's KV (c = p) and its first token emitted at ``token_1[i]`` (g = 1); empty:
        requests arrive with nothing computed
    first_token, done : float64 (n,)    filled with the (engine) times of each request's first
        and last token (a decode replica leaves ``first_token`` alone)
    replica : int64 (n,)    filled with the replica each request was routed to (one engine:
        unused, may be empty)
    runs : int64 (capacity, 5)    step runs (:mod:`._calendar`): the kernel returns how many it
        needed
    gaps : float64 (capacity,)    irregular inter-token gaps: the kernel returns how many it needed
    work : int64 (WORK_ROWS, n + 1)    room for the per-request state and its lists' spare slots
        (:mod:`._running`), contents left over (a caller's scratch: memory reused, not fresh
        from the system)

    Returns
    -------
    (steps, busy slot-steps, max_queue of any replica, preemptions, sum over replica-steps of KV
     blocks in use, peak KV blocks in use on any replica, number of runs, number of gaps)
    """
    n = arrival.size
    routed = code >= 0
    timed_end = 0 if routed else n  # one engine: requests [0, head) have arrived
    cached = pb * bt
    reserve = kv_mode == RESERVE
    rehit = kv_mode == REHIT
    limited = blocks >= 0
    paged = limited and not reserve
    g = work[0]  # tokens emitted (decoders: as of step dbase)
    c = work[1]  # tokens computed (non-decoders)
    held = work[2]  # blocks held beyond the prefix (reserve; paged non-decoders)
    dbase = work[3]  # decoders: the step count when they became decoders (set then)
    phase = work[4]  # decoders: they need a new block at steps == phase (mod bt) (set then)
    # (a request preempted under REHIT keeps in these two its blocks' place in the free queue and their tokens: own_hit)
    last_t = work[5].view(np.float64)  # time of the last token (set when a later gap reads it)
    rprev = work[6]  # each replica's running list, in admission order
    rnext = work[7]
    cnext = work[8]  # the completion calendars' lists
    cprev = work[9]
    due = work[10]
    pnext = work[11]  # each replica's stack of preempted requests: the front of its queue
    qnext = work[12]  # each replica's waiting queue (after its preempted ones)
    fresh(work, prompt, token_1)  # a decode replica's prompts arrive computed, their first token emitted
    if not routed:
        for i in range(n):  # one engine: its queue is arrival order
            qnext[i] = i + 1 if i + 1 < n else -1
    ring = min(largest(output) + 1, RING_MAX)
    stride = (ring + 63) & ~63  # replica r's calendar: buckets [r * stride, r * stride + ring)
    bucket = np.full(replicas * stride + 1, -1, np.int64)  # and a spare slot (:mod:`._running`)
    occ = occupancy(replicas * stride)  # which buckets may have a member (:mod:`._bare`)
    bcount = np.zeros((replicas, bt), np.int64)  # decoders by block phase
    st = np.zeros((replicas, N_STATE), np.int64)
    for rep in range(replicas):  # loops, not slice assignments or reductions: each of those adds
        # about a second to the compile a new user's first run waits for
        st[rep, RHEAD] = st[rep, RTAIL] = st[rep, PARTIAL] = st[rep, PTOP] = st[rep, QLAST] = -1
        st[rep, QFIRST] = -1 if routed else 0
        st[rep, FREE] = blocks - pb if limited else 0
    now_r, began_r = np.zeros(replicas), np.full(replicas, -np.inf)  # each replica's clock; its last step's start
    outstanding = np.zeros(replicas, np.int64)  # routed to each replica, not yet done
    used_blocks = np.full(replicas, pb if limited else 0, np.int64)  # KV blocks in use on each replica
    rows_i = np.empty(min(limit, n) + 1, np.int64)  # a step's prefill rows (at most every request)
    rows_c = np.empty(rows_i.size, np.int64)
    rows_n = np.empty(rows_i.size, np.int64)
    head = 0
    nruns = 0
    ngaps = 0
    q = 0
    while True:
        until = arrival[q] if routed and q < n else np.inf
        for rep in range(replicas):  # run every step that starts before ``until``
            now = now_r[rep]
            if now >= until or (st[rep, RUNNING] == 0 and st[rep, NWAIT] == 0 and head == timed_end):
                continue
            base = rep * stride
            rhead, rtail, running = st[rep, RHEAD], st[rep, RTAIL], st[rep, RUNNING]
            cursor, n_dec, sum_c = st[rep, CURSOR], st[rep, N_DEC], st[rep, SUM_C]
            partial, ptop, npre = st[rep, PARTIAL], st[rep, PTOP], st[rep, NPRE]
            qfirst, qlast, nwait = st[rep, QFIRST], st[rep, QLAST], st[rep, NWAIT]
            steps, busy, max_queue, preemptions = st[rep, STEPS], st[rep, BUSY], st[rep, MAX_QUEUE], st[rep, PREEMPTIONS]
            kv_sum, kv_peak, free, net = st[rep, KV_SUM], st[rep, KV_PEAK], st[rep, FREE], st[rep, NET]
            run_kv, run_pairs, run_nw, run_m = st[rep, RUN_KV], st[rep, RUN_PAIRS], st[rep, RUN_NW], st[rep, RUN_M]
            run_s = st[rep, RUN_S]
            finished = 0
            while now < until:
                while head < timed_end and arrival[head] <= now:
                    head += 1
                    nwait += 1
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
                                freed, kept = held[v], c[v]
                                partial = -1
                            else:
                                g[v] += steps - dbase[v]
                                kept = prompt[v] + g[v] - 1
                                freed = cdiv(kept, bt) - pb
                                n_dec -= 1
                                sum_c -= kept
                                bcount[rep, phase[v]] -= 1
                                cal_remove(bucket, cnext, cprev, v)
                                last_t[v] = now  # a decoder emitted at the step just run
                            free += freed
                            if rehit:  # where its blocks join the free queue, and what they hold
                                dbase[v], phase[v] = blocks + net, kept
                                net += freed
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
                sampled = n_dec  # rows that emit a token: every decoder, and prefills that complete
                if partial >= 0:
                    rows_i[0] = partial
                    rows_c[0] = c[partial]
                    rows_n[0] = ptake
                    nrows = 1
                    left -= ptake
                    sampled += ptake == prompt[partial] + g[partial] - c[partial]
                # 2. admission, only when nobody was preempted; the head of the queue blocks it
                if not preempted:
                    seen = began_r[rep] if lookahead and running > 0 else now  # arrivals the batch can hold
                    while running < limit and left > 0 and nwait > 0:
                        i = ptop if npre > 0 else qfirst
                        if npre == 0 and arrival[i] > seen:
                            break
                        ci = max(c[i], cached)  # a warm prefix, or a prompt whose KV arrived whole
                        if rehit and npre > 0:
                            ci = own_hit(phase[i], dbase[i], blocks + net - free, bt)
                        todo = prompt[i] + g[i] - ci
                        take = min(todo, left)
                        if limited:
                            need = cdiv(prompt[i] + o_max, bt) - pb if reserve else cdiv(ci + take, bt) - pb
                            if need > free:
                                break
                            free -= need
                            held[i] = need
                        if npre > 0:
                            ptop = pnext[i]
                            npre -= 1
                            if rehit:  # its hits leave the free queue
                                net -= ci // bt
                        else:
                            qfirst = qnext[i]
                            if qfirst < 0:
                                qlast = -1
                        nwait -= 1
                        c[i] = ci
                        rhead, rtail = link_tail(rprev, rnext, rhead, rtail, i)
                        running += 1
                        rows_i[nrows] = i
                        rows_c[nrows] = ci
                        rows_n[nrows] = take
                        nrows += 1
                        left -= take
                        sampled += take == todo
                max_queue = max(max_queue, nwait)
                if nrows == 0 and n_dec == 0:
                    if running == 0 and nwait == 0:
                        if head == timed_end:
                            break  # idle until a request is routed here (or none is left)
                        now = arrival[head]  # one engine, idle: jump to the next arrival
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
                d = step_time(k, n_tok, kv_tok, pairs, sampled)
                nruns, run_kv, run_pairs, run_nw, run_m, run_s = extend_run(
                    runs, nruns, run_kv, run_pairs, run_nw, run_m, run_s, n_tok, kv_tok, pairs, 1, n_dec, sampled)
                began_r[rep] = now
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
                        if rehit:
                            net += held[i]
                        held[i] = 0
                    else:  # a decoder from now on
                        dbase[i] = steps
                        n_dec += 1
                        sum_c += c[i]
                        phase[i] = (steps - c[i]) % bt
                        bcount[rep, phase[i]] += 1
                        mark(occ, cal_file(bucket, base, ring, cnext, cprev, due, cursor, steps, i, output[i] - g[i]))
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
                            if rehit:
                                net += cdiv(ci, bt)
                        elif limited:
                            free += held[i]
                            held[i] = 0
                        rhead, rtail = unlink(rprev, rnext, rhead, rtail, i)
                        running -= 1
                    i = nx
                # 4. fast path: only decoders, nobody to admit, until the next routing instant, an arrival
                # that would be admitted, a completion or a step whose new blocks do not fit
                if partial >= 0 or n_dec == 0 or preempted:
                    continue
                if nwait > 0 and running < limit:
                    i = ptop if npre > 0 else qfirst
                    if not limited or budget - n_dec <= 0 or (rehit and npre > 0):
                        continue  # (a preempted head's hit shrinks as blocks are taken: step by step)
                    ci = max(c[i], cached)
                    take = min(prompt[i] + g[i] - ci, budget - n_dec)
                    need = cdiv(prompt[i] + o_max, bt) - pb if reserve else cdiv(ci + take, bt) - pb
                    if need <= free:
                        continue  # the head can be admitted
                kv0 = sum_c + n_dec
                steps0 = steps
                open_slot = running < limit and nwait == 0  # an arrival would be admitted
                phase_now = steps % bt
                used = blocks - free if limited else 0  # only grows here: its peak is its last value
                far, last, ride, rode = steps + STEPPED, False, now, -1  # past far, closed form; last, ride: below
                weights = weights_time(k, n_dec)
                while True:
                    while now < until:
                        if head < timed_end and arrival[head] <= now:
                            if open_slot and (last or not lookahead):
                                break
                            last, ride, rode = open_slot, now, steps  # (async: this step's batch predates it)
                            while head < timed_end and arrival[head] <= now:  # they only lengthen the queue
                                head += 1
                                nwait += 1
                        elif last:
                            break
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
                        now += step_time_with(k, weights, n_dec, sum_c + n_dec, sum_c + n_dec, n_dec)
                        steps += 1
                        busy += n_dec
                        sum_c += n_dec
                        cursor = nxt
                        if steps == far:
                            break
                    if steps != far or last:
                        break
                    # the rest in closed form (:mod:`._bare`) up to the next event (as the steps above)
                    m = next_filled(occ, bucket, base, cursor + 1 if cursor + 1 < ring else 0, ring)
                    if paged and free < n_dec * m:  # (a step takes at most D blocks)
                        m = min(m, blocks_last(bcount, rep, phase_now, bt, n_dec, free))
                    stop = arrival[head] if open_slot and head < timed_end else until
                    m, now = timed(k, n_dec, sum_c + n_dec, now, stop, SHORTEST, m)
                    if m < 0:  # too short: step on
                        far = -1
                        continue
                    kv_sum += m * used
                    if paged:
                        taken, taken_sum = blocks_taken(bcount, rep, phase_now, bt, n_dec, m)
                        kv_sum += taken_sum
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
                if lookahead and steps > steps0:  # the last bare step's start (exact where an arrival rode it)
                    began_r[rep] = ride if last and steps > rode else (
                        now - step_time_with(k, weights, n_dec, sum_c, sum_c, n_dec))
            now_r[rep] = now
            st[rep, RHEAD], st[rep, RTAIL], st[rep, RUNNING] = rhead, rtail, running
            st[rep, CURSOR], st[rep, N_DEC], st[rep, SUM_C] = cursor, n_dec, sum_c
            st[rep, PARTIAL], st[rep, PTOP], st[rep, NPRE] = partial, ptop, npre
            st[rep, QFIRST], st[rep, QLAST], st[rep, NWAIT] = qfirst, qlast, nwait
            st[rep, STEPS], st[rep, BUSY], st[rep, MAX_QUEUE], st[rep, PREEMPTIONS] = steps, busy, max_queue, preemptions
            st[rep, KV_SUM], st[rep, KV_PEAK], st[rep, FREE], st[rep, NET] = kv_sum, kv_peak, free, net
            st[rep, RUN_KV], st[rep, RUN_PAIRS], st[rep, RUN_NW], st[rep, RUN_M] = run_kv, run_pairs, run_nw, run_m
            st[rep, RUN_S] = run_s
            outstanding[rep] -= finished
            used_blocks[rep] = blocks - free if limited else 0
        if not routed or q == n:
            break
        rep = choose(code, q, routes, outstanding, used_blocks)
        replica[q] = rep
        outstanding[rep] += 1
        if st[rep, RUNNING] == 0 and st[rep, NWAIT] == 0:
            now_r[rep] = max(now_r[rep], arrival[q])  # an idle replica wakes when a request reaches it
        join_queue(st, qnext, rep, q, QFIRST, QLAST, NWAIT)
        q += 1
    steps, busy, max_queue, preemptions, kv_sum, kv_peak, nruns = totals(st, runs, nruns, STEPS, RUN_KV)
    return steps, busy, max_queue, preemptions, kv_sum, kv_peak, nruns, ngaps
