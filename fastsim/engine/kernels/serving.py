"""The serving model's continuous-batching kernel for one engine (DESIGN.md): prefill and
decode compute, a token budget with chunked prefill, paged KV blocks with preemption by
recompute, reservation, a shared prefix, tensor parallelism in the step cost. With every
addition off it gives the lesson's results to the bit; it is only used when an addition is on.

It keeps the work per step independent of the batch size:

- Running requests are *decoders* (need one token a step) plus at most one *partial* row, the
  newest admission, whose prompt (or recompute) did not fit in the last step's budget: a row is
  partial only when the budget ran out on it, and then nothing newer was admitted. Since the
  budget is at least the running limit (checked with the config, as in vLLM), every decoder gets
  its token every step, so decoders are kept as sums: D of them holding SC computed tokens in
  all read C = SC + D KV tokens and form A = SC + D query-key pairs a step, and their token
  counts are derived from the step they became decoders.
- Their completions come from a calendar (doubly linked, so a preempted request leaves it in
  O(1)), their block boundaries from a ring of ``block_tokens`` counters: a decoder needs a new
  block every ``block_tokens`` steps, at a fixed phase.
- Preemption victims are the tail of the admission-ordered running list. When the free blocks
  cannot cover this step's needs, the step walks the running list oldest first and preempts
  from the tail exactly as the rules say; otherwise no one is preempted and the sums suffice.
- While nobody can be admitted, finish or run out of blocks, a fast path runs bare steps: the
  first ``STEPPED`` one by one, the rest of a longer run at once, in closed form (:mod:`._bare`;
  every count exact, times rounded once per run instead of once per step).
"""

from __future__ import annotations

import numpy as np

from ..._jit import jit, largest
from ...model.cost import step_time
from ._bare import blocks_last, blocks_taken, mark, next_filled, occupancy, timed
from ._calendar import RING_MAX, record
from ._running import cal_file, cal_remove, cdiv, fresh, unlink


WORK_ROWS = 12  # the kernel's per-request state: rows of ``work``
STEPPED = 16  # bare steps taken one by one before the rest of a run goes in closed form
SHORTEST = 12  # ... if that many are left at least


@jit
def continuous(arrival, prompt, output, limit, k, budget, blocks, bt, reserve, pb, o_max, token_1,
                first_token, done, runs, gaps, work):
    """Continuous batching in the serving model.

    Parameters
    ----------
    arrival : float64 (n,)    arrival times (s), non-decreasing
    prompt, output : int64 (n,)    prompt and output lengths (tokens; output >= 1)
    limit : int    most requests running at once
    k : float64 (7,)    step-time coefficients (:func:`fastsim.cost.coefficients`)
    budget : int    tokens computed per step at most (>= limit)
    blocks : int    KV cache blocks, or -1 for unlimited
    bt : int    tokens per block
    reserve : bool    reserve ceil((prompt + o_max) / bt) blocks at admission (else paged)
    pb : int    blocks pinned by the shared prefix (every admission starts with pb * bt tokens)
    o_max : int    the longest output the workload can produce
    token_1 : float64 (n,) or (0,)    a decode replica's requests (DESIGN.md, disaggregation): each
        arrives with its prompt's KV (c = p) and its first token emitted at ``token_1[i]`` (g = 1);
        empty: requests arrive with nothing computed
    first_token, done : float64 (n,)    filled with the (engine) times of each request's first and
        last token (a decode replica leaves ``first_token`` alone)
    runs : int64 (capacity, 4)    step runs (:mod:`._calendar`): the kernel returns how many it
        needed
    gaps : float64 (capacity,)    irregular inter-token gaps: the kernel returns how many it needed
    work : int64 (WORK_ROWS, n + 1)    room for the per-request state and its lists' spare slots
        (:mod:`._running`), contents left over (a caller's scratch: memory reused, not fresh
        from the system)

    Returns
    -------
    (steps, busy slot-steps, max_queue, preemptions, sum over steps of KV blocks in use,
     peak KV blocks in use, number of runs, number of gaps)
    """
    n = arrival.size
    cached = pb * bt
    limited = blocks >= 0
    paged = limited and not reserve
    free = blocks - pb if limited else 0
    g = work[0]  # tokens emitted (decoders: as of step dbase)
    c = work[1]  # tokens computed (non-decoders)
    held = work[2]  # blocks held beyond the prefix (reserve; paged non-decoders)
    dbase = work[3]  # decoders: the step count when they became decoders (set then)
    phase = work[4]  # decoders: they need a new block at steps == phase (mod bt) (set then)
    last_t = work[5].view(np.float64)  # time of the last token (set when a later gap reads it)
    rprev = work[6]  # running list, in admission order
    rnext = work[7]
    cnext = work[8]  # the completion calendar's lists
    cprev = work[9]
    due = work[10]
    pstack = work[11]  # preempted requests: the front of the waiting queue, last on top
    fresh(work, prompt, token_1)  # a decode replica's prompts arrive computed, their first token emitted
    rhead = -1
    rtail = -1
    running = 0
    ring = min(largest(output) + 1, RING_MAX)
    bucket = np.full(ring + 1, -1, np.int64)  # and a spare slot (:mod:`._running`)
    occ = occupancy(ring)  # which buckets may have a member (:mod:`._bare`)
    cursor = 0  # == steps % ring
    bcount = np.zeros(bt, np.int64)  # decoders by block phase
    n_dec = 0  # D
    sum_c = 0  # SC: tokens computed by the decoders
    partial = -1
    ptop = 0
    head = 0
    qhead = 0
    rows_i = np.empty(min(limit, arrival.size) + 1, np.int64)  # this step's prefill rows (at most every request)
    rows_c = np.empty(rows_i.size, np.int64)
    rows_n = np.empty(rows_i.size, np.int64)
    now = 0.0
    steps = 0
    busy = 0
    max_queue = 0
    preemptions = 0
    kv_sum = 0
    kv_peak = 0
    nruns = 0
    ngaps = 0
    finished = 0
    while finished < n:
        while head < n and arrival[head] <= now:
            head += 1
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
        if paged and bcount[steps % bt] + pneed > free:
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
                        bcount[phase[v]] -= 1
                        cal_remove(bucket, cnext, cprev, v)
                        last_t[v] = now  # a decoder emitted at the step just run
                    held[v] = 0
                    c[v] = 0
                    pstack[ptop] = v
                    ptop += 1
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
            free -= bcount[steps % bt] + pneed
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
            while running < limit and left > 0 and (ptop > 0 or qhead < head):
                i = pstack[ptop - 1] if ptop > 0 else qhead
                ci = max(c[i], cached)  # a warm prefix, or a prompt whose KV arrived whole
                take = min(prompt[i] + g[i] - ci, left)
                if limited:
                    need = cdiv(prompt[i] + o_max, bt) - pb if reserve else cdiv(ci + take, bt) - pb
                    if need > free:
                        break
                    free -= need
                    held[i] = need
                if ptop > 0:
                    ptop -= 1
                else:
                    qhead += 1
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
        max_queue = max(max_queue, ptop + head - qhead)
        if nrows == 0 and n_dec == 0:
            if running == 0 and ptop == 0 and qhead == head:
                now = arrival[head]  # idle: jump to the next arrival
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
        nruns = record(runs, nruns, n_tok, kv_tok, pairs, 1, n_dec)
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
                bcount[phase[i]] += 1
                mark(occ, cal_file(bucket, 0, ring, cnext, cprev, due, cursor, steps, i, output[i] - g[i]))
        # decoders due now finish
        i = bucket[cursor]
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
                bcount[phase[i]] -= 1
                if paged:
                    free += cdiv(ci, bt) - pb
                elif limited:
                    free += held[i]
                    held[i] = 0
                rhead, rtail = unlink(rprev, rnext, rhead, rtail, i)
                running -= 1
            i = nx
        # 4. fast path: only decoders, nobody to admit, until an arrival, a completion or a
        # step whose new blocks do not fit
        if partial >= 0 or n_dec == 0 or preempted:
            continue
        waiting = ptop + head - qhead
        if waiting > 0 and running < limit:
            i = pstack[ptop - 1] if ptop > 0 else qhead
            if not limited or budget - n_dec <= 0:
                continue
            ci = max(c[i], cached)
            take = min(prompt[i] + g[i] - ci, budget - n_dec)
            need = cdiv(prompt[i] + o_max, bt) - pb if reserve else cdiv(ci + take, bt) - pb
            if need <= free:
                continue  # the head can be admitted
        kv0 = sum_c + n_dec
        steps0 = steps
        open_slot = running < limit and ptop + head - qhead == 0  # an arrival would be admitted
        phase_now = steps % bt
        used = blocks - free if limited else 0  # only grows here: its peak is its last value
        far = steps + STEPPED  # past it, the rest of a long run in closed form
        while True:
            while True:
                if head < n and arrival[head] <= now:
                    if open_slot:
                        break
                    while head < n and arrival[head] <= now:  # they only lengthen the queue
                        head += 1
                nxt = cursor + 1 if cursor + 1 < ring else 0
                if bucket[nxt] >= 0:
                    break
                if paged:
                    need = bcount[phase_now]
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
                if steps == far:
                    break
            if steps != far:
                break
            # the rest in closed form (:mod:`._bare`): up to the next completion, the blocks' end,
            # an arrival that would be admitted
            m = next_filled(occ, bucket, cursor + 1 if cursor + 1 < ring else 0, ring)
            if paged and free < n_dec * m:  # (a step takes at most D blocks)
                m = min(m, blocks_last(bcount, phase_now, bt, n_dec, free))
            until = arrival[head] if open_slot and head < n else np.inf
            m, now = timed(k, n_dec, sum_c + n_dec, now, until, SHORTEST, m)
            if m < 0:  # too short: step on
                far = -1
                continue
            kv_sum += m * used
            if paged:
                taken, taken_sum = blocks_taken(bcount, phase_now, bt, n_dec, m)
                kv_sum += taken_sum
                free -= taken
                used += taken
            steps += m
            busy += m * n_dec
            sum_c += m * n_dec
            cursor = cursor + m if cursor + m < ring else cursor + m - ring
            break
        kv_peak = max(kv_peak, used)
        m = steps - steps0
        if m > 0:
            nruns = record(runs, nruns, n_dec, kv0, kv0, m, n_dec)
    return steps, busy, max_queue, preemptions, kv_sum, kv_peak, nruns, ngaps


