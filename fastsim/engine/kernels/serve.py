"""The serving model's continuous-batching step loop: one source for one engine and every pool of
replicas behind any router, with the KV cache as counters or as vLLM's prefix cache, with sessions
and a prefill pool in front, and for replicas of data-parallel ranks that step together
(:mod:`._lockstep`) (docs/model/serving.md, docs/model/fleets.md, docs/model/prefix-cache.md,
docs/model/deployed.md). With every serving-model addition off the lesson's own kernels
(:mod:`.lesson`) run instead. What it is given, and the shapes it is compiled for, are
:mod:`._shape`'s; the KV cache's roles :mod:`._kv`'s.

Arrivals, given or released by the run (:mod:`._arrivals`), are taken in time order. One engine
takes each at the first step that starts at or after it (async scheduling, ``lookahead``: one step
later, if a step was running). A pool routes each at its instant, after every replica ran each
step that starts before it (the router sees their requests and KV blocks as of then); an idle
replica wakes at it. Where the run releases arrivals, replicas advance in time order, each up to
the others' clocks plus the least time a release of theirs can take (:func:`._route.earliest`).

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
- When the free blocks cannot cover a step's needs, the running list is walked oldest first,
  preempting from its tail exactly as the rules say (:mod:`._preempt`); otherwise no one is
  preempted and the sums suffice.
- Under speculative decoding (:mod:`._speculative`) a decoder verifies ``ks`` tokens beyond its
  own and emits a drawn number: every step walks the decoders for their blocks and tokens.
- Else, while nobody can be admitted, finish or run out of blocks, a fast path runs bare steps,
  the longer runs' last steps in closed form (:func:`._bare.bare_run`).

State is struct of arrays, indexed in place: per request the rows of ``work``; per replica its
scalars (columns of ``st``, in locals while it runs), its calendar, its decoders by block phase
(``bcount[rep]``) and its open step run. Hot-path helpers take arrays one by one, inlined, or are
called apart where they run rarely (an array taken out of a tuple, or given to an inlined helper
that branches, is reference-counted at each use: measured several times the helper's own work).
"""

from __future__ import annotations

import numpy as np

from ..._jit import jit, unmanaged
from ...model.cost import step_time
from . import _kv as roles
from ._arrivals import arrive, next_arrival, released_by, send, take_next
from ._bare import bare_run, mark, may_admit
from ._calendar import extend_run, totals
from ._preempt import preempt_for
from ._route import earliest, route
from ._running import cal_file, cal_remove, cdiv, due_in_order, join_queue, link_tail, unlink
from ._shape import *  # noqa: F403 (the rows of work, the columns of st)
from ._shape import alone, load, lockstep, releases, save, start
from ._speculative import first_slots, verify
from ._lockstep import keep_step, kept_step, next_rank


@jit
def serve(arrival, prompt, output, pre, dec, rules, routing, kv, cache, first_token, done, replica, pre_replica, runs,
          gaps, work):
    """Continuous batching on one engine, or on a pool of replicas behind a router, optionally
    behind a prefill pool (``pre``: 0 replicas for none; ``dec``: the others; ``rules``,
    ``routing``: :mod:`._shape`'s). ``arrival``: when each request arrives (non-decreasing where
    given; NaN for a session's later turn, set here when it is released); ``prompt``, ``output``:
    lengths (output >= 1). ``kv``: :class:`._kv.Counters` or :class:`._kv.Runs`, ``cache`` the
    runs' array (:func:`._segments.start`; empty with counters). Filled: ``first_token`` and
    ``done`` (engine times; a decode pool run alone leaves ``first_token``), each request's
    ``replica`` and ``pre_replica`` (unused where there is no pool, or no prefill pool), ``runs``
    and ``gaps`` (:mod:`._calendar`: as many as fit; the kernel returns how many it needed).
    ``work``: int64 (WORK_ROWS, n + 1), room for the per-request state and its lists' spare slots
    (:mod:`._running`), contents left over (a caller's scratch).

    Returns the prefill pool's (steps, busy slot-steps, max_queue, preemptions, sum over
    replica-steps of KV blocks in use, peak KV blocks in use on any replica), the same of the
    others, the number of runs and of gaps, and whether the cache's bookkeeping stopped
    (:func:`._kv.computed`).
    """
    n = arrival.size
    npre = pre.replicas
    replicas = npre + dec.replicas
    # every array as a view Numba does not reference-count (:func:`fastsim._jit.unmanaged`): the
    # caller holds the arguments, ``kept`` what the loop allocates
    arrival, prompt, output, first_token, done = (unmanaged(arrival), unmanaged(prompt), unmanaged(output),
                                                  unmanaged(first_token), unmanaged(done))
    replica, pre_replica, runs, gaps, work = (unmanaged(replica), unmanaged(pre_replica), unmanaged(runs),
                                              unmanaged(gaps), unmanaged(work))
    cache, think, link_s, token_1 = unmanaged(cache), unmanaged(routing.think), unmanaged(routing.link_s), unmanaged(
        routing.token_1)
    routes, decode_routes = unmanaged(routing.routes), unmanaged(routing.decode_routes)
    sessions = think.size > 0  # (or closed-loop clients: ``clients`` of them)
    clients = routing.clients
    starts = unmanaged(routing.next_start)
    taken = 0  # the next request no client has taken (past the first ``clients``): one engine's; a pool's
    for _ in range(clients):
        if taken < n:
            taken = starts[taken]
    sending = taken
    given = arrival[:sending if clients > 0 else n]  # the arrivals given (clients': their first requests')
    pre_k, dec_k = pre.k, dec.k
    limit, bt, pb, reserve, o_max, lookahead, api_s, spec = rules
    ks, span = spec.tokens, spec.span  # speculative decoding: tokens a decoder verifies beyond its own (0: off)
    cached = pb * bt  # tokens every admission starts with (a pinned prefix)
    g = work[G]  # tokens emitted (decoders: as of step dbase)
    c = work[C]  # tokens computed (non-decoders)
    held = work[HELD]  # blocks held beyond the pinned prefix (reserve; paged non-decoders; speculating decoders)
    dbase = work[DBASE]  # decoders: the step count when they became decoders (set then)
    phase = work[PHASE]  # decoders: a new block at steps == phase (mod bt) (set then; speculating: blocks pending)
    last_t = work[LAST_T].view(np.float64)  # time of the last token (set when a later gap reads it)
    rprev = work[RPREV]  # each replica's running list, in admission order
    rnext = work[RNEXT]
    cnext = work[CNEXT]  # the completion calendars' lists
    cprev = work[CPREV]
    due = work[DUE]
    pnext = work[PNEXT]  # each replica's stack of preempted requests: the front of its queue
    qnext = work[QNEXT]  # each replica's waiting queue (after its preempted ones)
    joined = work[JOINED].view(np.float64)  # when it joined its replica's queue (routed, releasing runs)
    seq = work[SEQ]  # when it was admitted, in its replica's count (running-list order)
    kept = start(prompt, output, token_1, work, replicas, npre, pre.blocks, dec.blocks, pb, bt, limit, releases(routing),
                 alone(routing) and not releases(routing), lockstep(routing))
    ring, stride = kept[0], kept[1]
    bucket, occ, bcount, st = unmanaged(kept[2]), unmanaged(kept[3]), unmanaged(kept[4]), unmanaged(kept[5])
    now_r, began_r = unmanaged(kept[6]), unmanaged(kept[7])  # each replica's clock; its last step's start
    outstanding, used_blocks = unmanaged(kept[8]), unmanaged(kept[9])  # requests routed there, not done; KV blocks used
    rows_i, rows_c, rows_n = unmanaged(kept[10]), unmanaged(kept[11]), unmanaged(kept[12])  # a step's prefill rows
    dues = unmanaged(kept[13])  # a step's completing decoders
    heap_t, heap_i = unmanaged(kept[14]), unmanaged(kept[15])  # released arrivals: a binary heap on (time, request)
    nheap = 0
    sent = unmanaged(kept[16])  # its prompt's KV is on its way to the decode pool
    link_free, ended = unmanaged(kept[17]), unmanaged(kept[18])  # each link's free time; a step's prompts to send
    nruns = ngaps = 0
    sp = head = 0  # the next given arrival; one engine over given arrivals: the next to join its queue
    routed = routed_decode = 0
    t_next, q_next, sp = next_arrival(given, sp, heap_t, heap_i, nheap)
    cur, stage, sub, gbound, group_d = -1, 0, 0, 0.0, 0.0  # data-parallel ranks: the replica running, its pass
    groups = replicas // routing.dp if lockstep(routing) else 0
    gout, gused = np.zeros(groups, np.int64), np.zeros(groups, np.int64)  # its ranks' sums, for the router
    while True:
        until = np.inf if alone(routing) else t_next
        turn = 0  # the next replica in turn (where no arrival is released: each runs up to ``until``)
        while True:
            if lockstep(routing):  # a replica's ranks, in two passes a step (:mod:`._lockstep`)
                rep, stage, sub, turn, cur, gbound, group_d, nruns = next_rank(
                    dec_k, st, now_r, runs, nruns, until, routing.dp, releases(routing), dec.slack, turn, cur, gbound,
                    stage, sub, group_d)
                if rep < 0:
                    break
                bound = np.inf
            elif releases(routing) and not alone(routing):  # the earliest replica with work, up to where no
                rep, bound = earliest(st, now_r, until, npre, pre.slack, dec.slack)  # release of the others reaches
                if rep < 0:
                    break
            else:
                if turn == replicas:
                    break
                rep = turn
                turn += 1
                bound = until
                if not alone(routing) and (now_r[rep] >= until or (st[rep, RUNNING] == 0 and st[rep, NWAIT] == 0)):
                    continue
            prefilling = releases(routing) and rep < npre  # (a prefill pool in front: its arrivals are released)
            k = pre_k if prefilling else dec_k
            budget = pre.budget if prefilling else dec.budget
            blocks = pre.blocks if prefilling else dec.blocks
            per = pb - (pre.fixed if prefilling else dec.fixed)  # a request holds cdiv(its tokens, bt) - per blocks
            limited = blocks >= 0
            paged = limited and not reserve
            hitting = npre == 0 or prefilling  # a decode replica behind a prefill pool caches nothing
            now = now_r[rep]
            base = rep * stride
            ro = rep * (rows_i.size // replicas) if lockstep(routing) else 0  # its rows, where ranks step together
            (rhead, rtail, running, cursor, n_dec, sum_c, partial, ptop, npre_q, qfirst, qlast, nwait, steps, busy,
             max_queue, preemptions, kv_sum, kv_peak, free, aux, run_kv, run_pairs, run_nw, run_m, run_s,
             admitted) = load(st, rep)
            finished = 0
            while now < bound:
                if alone(routing) and t_next <= now:  # arrivals join the queue
                    if releases(routing):
                        t_next, q_next, sp, nheap, qfirst, qlast, nwait = arrive(
                            now, t_next, q_next, sp, nheap, qfirst, qlast, nwait, given, heap_t, heap_i, qnext)
                    else:
                        while head < n and arrival[head] <= now:
                            head += 1
                            nwait += 1
                        t_next = arrival[head] if head < n else np.inf
                if not lockstep(routing) or stage == 0:  # (a lock-step rank's second pass runs the step)
                    left = budget - n_dec * (1 + ks)  # decoders first: 1 + ks tokens each, within the budget
                    nrows = 0
                    preempted = False
                    # 1. running requests: decoders' new blocks, then the partial row (the tail)
                    ptake = 0
                    pneed = 0
                    if partial >= 0:
                        ptake = min(prompt[partial] + g[partial] - c[partial], left)
                        if paged:
                            pneed = cdiv(c[partial] + ptake, bt) - per - held[partial]
                    if paged and (roles.walks(kv, hitting) or bcount[rep, steps % bt] + pneed > free):  # too few blocks
                        # for everyone (or a cache that knows each block: every request given its own)
                        (rhead, rtail, running, partial, n_dec, sum_c, free, aux, ptop, npre_q, nwait, preemptions,
                         preempted) = preempt_for(
                            kv, cache, rep, hitting, bt, per, span, blocks, steps, now, prompt, g, c, held, dbase,
                            phase, last_t, pnext, rprev, rnext, bucket, cnext, cprev, bcount, rhead, rtail, running, partial,
                            pneed, n_dec, sum_c, free, aux, ptop, npre_q, nwait, preemptions)
                        left = budget - n_dec * (1 + ks)
                    elif paged:
                        free, aux = roles.allocate(kv, rep, bcount[rep, steps % bt] + pneed, free, aux)
                        if partial >= 0:
                            held[partial] += pneed
                    sampled = n_dec * (1 + ks)  # rows sampled: every decoder's (each verified), prefills that complete
                    if partial >= 0:
                        rows_i[ro] = partial
                        rows_c[ro] = c[partial]
                        rows_n[ro] = ptake
                        nrows = 1
                        left -= ptake
                        sampled += ptake == prompt[partial] + g[partial] - c[partial]
                        roles.filled(kv, cache, rep, partial, c[partial], c[partial] + ptake, hitting, bt)
                    # 2. admission, only when nobody was preempted; the head of the queue blocks it
                    if not preempted:
                        seen = began_r[rep] if lookahead and running > 0 else now  # arrivals the batch can hold
                        while running < limit and left > 0 and nwait > 0:
                            i = ptop if npre_q > 0 else qfirst
                            if npre_q == 0 and (joined[i] if releases(routing) and not alone(routing)
                                                else arrival[i]) > seen:
                                break
                            c0, h, free_hits, s_g, s_p, stop, aux = roles.computed(
                                kv, cache, rep, i, prompt[i], g[i], c[i], npre_q > 0, free, aux,
                                hitting, blocks, bt, phase[i], dbase[i], cached)
                            if stop:
                                return roles.stopped(ngaps)
                            todo = prompt[i] + g[i] - c0
                            take = min(todo, left)
                            new = 0
                            if limited:
                                new = cdiv(prompt[i] + o_max, bt) - per if reserve else cdiv(c0 + take, bt) - per - h
                                if new + free_hits > free:
                                    break
                            free, aux = roles.admit(kv, cache, rep, i, c0, take, h, new, free_hits,
                                                    s_g, s_p, npre_q > 0, free, aux, hitting, bt)
                            held[i] = h + new
                            if npre_q > 0:
                                ptop = pnext[i]
                                npre_q -= 1
                            else:
                                qfirst = qnext[i]
                                if qfirst < 0:
                                    qlast = -1
                            nwait -= 1
                            c[i] = c0
                            if roles.ordered(kv):
                                seq[i] = admitted
                                admitted += 1
                            rhead, rtail = link_tail(rprev, rnext, rhead, rtail, i)
                            running += 1
                            rows_i[ro + nrows] = i
                            rows_c[ro + nrows] = c0
                            rows_n[ro + nrows] = take
                            nrows += 1
                            left -= take
                            sampled += take == todo
                    max_queue = max(max_queue, nwait)
                    if nrows == 0 and n_dec == 0:
                        if lockstep(routing):
                            break  # nothing to run: the rank waits the replica's step out
                        if running == 0 and nwait == 0:
                            if not alone(routing) or t_next == np.inf:
                                break  # idle until a request is routed here (or none is left)
                            now = t_next  # one engine, idle: jump to the next arrival
                        continue  # else the only runner preempted itself: it is admitted next iteration
                    n_tok = n_dec * (1 + ks)
                    kv_tok = sum_c + n_tok
                    pairs = (1 + ks) * sum_c + n_tok * (2 + ks) // 2
                    for r in range(ro, ro + nrows):
                        n_tok += rows_n[r]
                        kv_tok += rows_c[r] + rows_n[r]
                        pairs += rows_n[r] * (2 * rows_c[r] + rows_n[r] + 1) // 2
                    if limited:
                        used = blocks - free
                        kv_sum += used
                        kv_peak = max(kv_peak, used)
                    if lockstep(routing):  # the replica's step time waits for every rank's rows
                        keep_step(st, rep, n_tok, kv_tok, pairs, sampled, nrows, n_dec)
                        break
                else:
                    n_tok, kv_tok, pairs, sampled, nrows = kept_step(st, rep)
                    preempted = False
                # 3. the step (a lock-step replica's: recorded once, :func:`._lockstep.step_of`)
                if lockstep(routing):
                    d = group_d
                else:
                    d = step_time(k, n_tok, kv_tok, pairs, sampled)
                    nruns, run_kv, run_pairs, run_nw, run_m, run_s = extend_run(
                        runs, nruns, run_kv, run_pairs, run_nw, run_m, run_s, n_tok, kv_tok, pairs, 1, n_dec, sampled)
                began_r[rep] = now
                now += d
                steps += 1
                busy += n_dec
                cursor = cursor + 1 if cursor + 1 < ring else 0
                # the decoders due now finish: walked in their bucket, or where a cache's free queue keeps the
                # order of releases, in running order (admitted before any prefill row, which come after); under
                # speculation each verified its draft, and those that finish are listed
                released = nheap  # (the heap grows: arrivals released)
                i = bucket[base + cursor]
                ndue = b = 0
                emitted = n_dec  # (its next step's blocks: bcount's slot for it)
                if ks > 0:
                    ndue, emitted, bcount[rep, steps % bt] = verify(spec, rhead, n_dec, rnext, prompt, output, g, dbase,
                                                                    held, phase, steps, dues, bt, per)
                elif roles.ordered(kv):
                    ndue = due_in_order(bucket, cnext, cprev, due, seq, dues, i, steps)
                sum_c += emitted
                while True:
                    if roles.ordered(kv) or ks > 0:
                        if b == ndue:
                            break
                        i = dues[b]
                        b += 1
                    else:
                        while i >= 0 and due[i] != steps:
                            i = cnext[i]
                        if i < 0:
                            break
                        nx = cnext[i]
                        cal_remove(bucket, cnext, cprev, i)
                    done[i] = now
                    finished += 1
                    g[i] = output[i]
                    ci = prompt[i] + output[i] - 1
                    n_dec -= 1
                    sum_c -= ci
                    if ks == 0:
                        bcount[rep, phase[i]] -= 1
                    if limited:
                        free, aux = roles.free(kv, cache, rep, i, cdiv(ci, bt) - per if paged and ks == 0 else held[i],
                                               ci, free, aux, hitting, bt)
                    held[i] = 0
                    rhead, rtail = unlink(rprev, rnext, rhead, rtail, i)
                    running -= 1
                    if releases(routing) and sessions:
                        nheap, taken = released_by(i, now, api_s, think, arrival, heap_t, heap_i, nheap, clients,
                                                   taken, alone(routing), starts)
                    if not (roles.ordered(kv) or ks > 0):
                        i = nx
                # prefill rows: a row that reaches p + g computed tokens emits one
                partial = -1
                nsent = 0
                for r in range(ro, ro + nrows):
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
                    if g[i] == (1 if prefilling else output[i]):
                        finished += 1
                        rhead, rtail = unlink(rprev, rnext, rhead, rtail, i)
                        running -= 1
                        if limited:
                            free, aux = roles.free(kv, cache, rep, i, held[i], c[i], free, aux,
                                                   hitting, bt)
                        held[i] = 0
                        if prefilling and g[i] < output[i]:  # its KV crosses the link to the decode pool
                            last_t[i] = now
                            ended[nsent] = i
                            nsent += 1
                            continue
                        done[i] = now
                        if releases(routing) and sessions:
                            nheap, taken = released_by(i, now, api_s, think, arrival, heap_t, heap_i, nheap,
                                                       clients, taken, alone(routing), starts)
                    else:  # a decoder from now on
                        dbase[i] = steps
                        n_dec += 1
                        sum_c += c[i]
                        if ks > 0:  # (its verifications say when it finishes, and take its slots)
                            bcount[rep, steps % bt] += first_slots(spec, c[i], held, phase, i, bt, per)
                        else:
                            phase[i] = (steps - c[i]) % bt
                            bcount[rep, phase[i]] += 1
                            mark(occ, cal_file(bucket, base, ring, cnext, cprev, due, cursor, steps, i,
                                               output[i] - g[i]))
                if releases(routing):
                    if nsent > 0:
                        nheap = send(ended, nsent, now, link_free, rep, link_s, sent, heap_t, heap_i, nheap)
                    if nheap > released:
                        if alone(routing):
                            t_next, q_next, sp = next_arrival(given, sp, heap_t, heap_i, nheap)
                        else:  # a released arrival is routed at its instant
                            bound = min(bound, heap_t[0])
                            until = min(until, heap_t[0])
                # 4. fast path: only decoders, nobody to admit, until the next routing instant, an arrival
                # that would be admitted, a completion or a step whose new blocks do not fit
                if lockstep(routing):
                    break  # (one step: the replica's ranks step together)
                if partial >= 0 or n_dec == 0 or preempted or ks > 0 or roles.walks(kv, hitting) or (
                        nwait > 0 and running < limit and may_admit(
                            kv, ptop if npre_q > 0 else qfirst, npre_q > 0, limited, budget - n_dec, prompt, g, c,
                            cached, reserve, o_max, bt, per, free)):
                    continue
                now, queue, state, record = bare_run(
                    k, kv, rep, bt, limit, lookahead, alone(routing), releases(routing), paged, blocks, bound, bucket,
                    occ, bcount, base, ring, given, heap_t, heap_i, qnext, began_r, runs, running, now,
                    (t_next, q_next, sp, head, nheap, qfirst, qlast, nwait),
                    (n_dec, sum_c, steps, busy, cursor, free, aux, kv_sum, kv_peak, max_queue),
                    (nruns, run_kv, run_pairs, run_nw, run_m, run_s))
                t_next, q_next, sp, head, nheap, qfirst, qlast, nwait = queue
                n_dec, sum_c, steps, busy, cursor, free, aux, kv_sum, kv_peak, max_queue = state
                nruns, run_kv, run_pairs, run_nw, run_m, run_s = record
            now_r[rep] = now
            save(st, rep, (rhead, rtail, running, cursor, n_dec, sum_c, partial, ptop, npre_q, qfirst, qlast, nwait,
                           steps, busy, max_queue, preemptions, kv_sum, kv_peak, free, aux, run_kv, run_pairs, run_nw,
                           run_m, run_s, admitted))
            outstanding[rep] -= finished
            used_blocks[rep] = blocks - free if limited else 0
        if alone(routing):
            break
        # route the next arrival: a given one, a released turn, or a prompt's KV reaching the decode pool
        if releases(routing):
            t_next, q, sp, nheap, sending = take_next(given, sp, heap_t, heap_i, nheap, think, arrival, sending, starts)
            if q < 0:
                break
            if q >= n:  # a closed-loop client was free: it took the next request, if any was left
                t_next, q_next, sp = next_arrival(given, sp, heap_t, heap_i, nheap)
                continue
        else:
            if sp == n:
                break
            q = sp
            sp += 1
        to, routed, routed_decode = route(kv, cache, routing, routes, decode_routes, q, t_next, prompt[q], bt,
                                          releases(routing) and npre > 0 and sent[q], npre, replicas, st, now_r,
                                          outstanding, used_blocks, routed, routed_decode, replica, pre_replica, gout,
                                          gused)
        if releases(routing):
            joined[q] = t_next
        join_queue(st, qnext, to, q, QFIRST, QLAST, NWAIT)
        if releases(routing):
            t_next, q_next, sp = next_arrival(given, sp, heap_t, heap_i, nheap)
        else:
            t_next = arrival[sp] if sp < n else np.inf
    pre_counts = totals(st[:npre], runs, nruns, STEPS, RUN_KV)
    counts = totals(st[npre:], runs, pre_counts[-1], STEPS, RUN_KV)
    return pre_counts[:-1], counts[:-1], counts[-1], ngaps, len(kept) < 0  # (False, once ``kept`` is no longer needed)
