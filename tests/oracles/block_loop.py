"""A second compiled reference for the serving loop's prefix cache (fastsim.engine.kernels.serve,
its KV roles in fastsim.engine.kernels._kv): the continuous-batching step loop with vLLM's
automatic prefix cache written directly, and with sessions whose next turn arrives after the turn
before it is done (docs/model/prefix-cache.md): one engine, or replicas behind any router
(``prefix_aware`` among them). Fast enough for H100-scale runs the pure-Python oracle
(tests/oracles/prefix.py) cannot make, so the tests compare the serving loop with it at scale.

A direct loop, step by step over the running requests: the cache is per block (:mod:`._cache`),
so a step's work grows with the blocks it allocates, fills and frees. Replicas advance in time
order (the one whose clock is earliest steps next), and every arrival, a recorded or drawn one or
a session's released turn, is routed at its instant after every step that started before it
(ties: the lower request index), so a turn released by a completion is routed in order even
when another replica is ahead. With prefix caching off it runs sessions with paged blocks
counted as :mod:`.continuous` counts them (nothing hits).

With a prefill pool (sessions behind it: a turn waits on the decode pool), replicas 0..P-1 are the
prefill replicas, which cache what they compute and end each request at its first token; its KV
then crosses that replica's link (first come, first served; ties: the lower index) and arrives at
the decode replicas P.., routed then (prefix-aware routing is least_kv there: nothing is cached),
with c = p computed and g = 1; their blocks are only counted.

State is struct of arrays: per request the rows of ``req``, per replica the columns of ``st``,
per block the cache's arrays, a binary heap of released turns (time, request).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fastsim._jit import jit
from fastsim.engine import content as shares
from fastsim.engine import link
from fastsim.engine.fleet import _joined, _with_hits
from fastsim.engine.kernels import Scratch, outcome, with_room
from fastsim.engine.kernels import _cache
from fastsim.engine.kernels._arrivals import next_arrival, pop, push, turn_after
from fastsim.engine.kernels._cache import REF, allocate, fill, hit, release, unqueue
from fastsim.engine.kernels._calendar import extend_run, totals
from fastsim.engine.kernels._running import cdiv, join_queue, link_tail, unlink
from fastsim.engine.router import LEAST_KV, PREFIX_AWARE, RANDOM, choose
from fastsim.model.cost import step_time
from fastsim.model.routers import ROUTERS

# Per-request rows of ``req``.
(G, C, HITS, TOP, OWN, SLACK, SLOT, RPREV, RNEXT, WNEXT, LAST_STEP, CACHED, REQ_ROWS) = range(13)
# Per-replica columns of ``st``.
(RHEAD, RTAIL, RUNNING, WHEAD, WTAIL, NWAIT, FREE, STEPS, BUSY, MAX_QUEUE, PREEMPTIONS, KV_SUM, KV_PEAK, RUN_KV,
 RUN_PAIRS, RUN_NW, RUN_M, RUN_S, N_STATE) = range(19)


HELD_MOST = 1 << 22  # entries of the running requests' hit blocks at most (32 MB)


@dataclass(frozen=True)
class PrefillPool:
    """Prefill replicas in front of the replicas, which then only decode: their step-time
    coefficients, token budget and KV blocks, each request's KV transfer time (s) and the random
    router's prefill replica per routed request."""

    replicas: int
    k: np.ndarray
    budget: int
    blocks: int
    link_s: np.ndarray
    routes: np.ndarray


def run(arrival, prompt, output, parent, shared, hash_start, hash_ids, hash_block, think, replicas, code, routes,
        weight, limit, k, budget, blocks, bt, caching, lookahead, api_s, runs, gaps,
        prefill: PrefillPool | None = None):
    """Allocate the state and run :func:`cached_pool` (``routes``: the random router's replica per
    routed request; behind a ``prefill`` pool, per request). Returns (first token, done, arrival,
    replica, prefill replica, cached tokens, the prefill pool's counters and the others' as
    :class:`~fastsim.engine.kernels.Counters` takes them, their gaps counted with the others')."""
    n = arrival.size
    first, done, arrived = np.empty(n), np.empty(n), arrival.copy()
    replica = np.full(n, -1, np.int64)
    pre_replica = np.full(n, -1, np.int64)
    req = np.zeros((REQ_ROWS, n + 1), np.int64)  # a spare slot in each row (:mod:`._running`)
    req[TOP] = req[SLOT] = req[RPREV] = req[RNEXT] = req[WNEXT] = req[CACHED] = -1
    req[LAST_STEP] = -2
    pre = prefill or PrefillPool(0, k, budget, blocks, np.empty(0), np.empty(0, np.int64))
    cached_replicas = pre.replicas or replicas  # the replicas whose blocks are cached by content
    cache = _cache.start(cached_replicas, pre.blocks)
    stride = _cache.stride_of(prompt, output, bt)
    depth = _cache.depth(parent) + 2
    # the blocks each running request hit, by slot, so that releasing them needs no lookup (if that is
    # at most HELD_MOST entries: else they are looked up again)
    count = min(limit * cached_replicas, n)
    count = count if count * stride <= HELD_MOST else 0
    slots = np.arange(-1, count, dtype=np.int64)
    slots[0] = count  # a stack of free slots: its size, then the slots
    scratch = (np.empty(depth, np.int64), np.empty(depth, np.int64), np.empty(stride, np.int64),
               np.empty(count * stride, np.int64), slots)
    *counters, ngaps = cached_pool(
        arrived, prompt, output, parent, shared, hash_start, hash_ids, hash_block, think, replicas, code, routes, weight,
        limit, k, budget, blocks, bt, caching, lookahead, api_s, pre.replicas, pre.k, pre.budget, pre.blocks,
        pre.link_s, pre.routes, stride, req, *cache, *scratch, first, done, replica, pre_replica, runs, gaps)
    pre_counters, counters = counters[:7], counters[7:]
    return (first, done, arrived, replica, pre_replica, req[CACHED, :n].copy(), (*pre_counters, 0),
            (*counters, ngaps))


@jit
def cached_pool(arrival, prompt, output, parent, shared, hash_start, hash_ids, hash_block, think, replicas, code,
                routes, weight, limit, k, budget, blocks, bt, caching, lookahead, api_s, npre, k_pre, budget_pre,
                blocks_pre, link_s, pre_routes, stride, req, blk, ends, tab, cnode, clo, found, held, slots,
                first_token, done, replica, pre_replica, runs, gaps):
    """Continuous batching with a prefix cache on ``replicas`` replicas of ``blocks`` blocks,
    behind ``npre`` prefill replicas (0: none).

    Parameters
    ----------
    arrival : float64 (n,)    arrival times; NaN for a session's later turn (set here when it is
        released: the turn before's done time + ``api_s`` + ``think``)
    prompt, output : int64 (n,)
    parent, shared : int64 (n + G,)    the content tree (:mod:`fastsim.engine.content`)
    hash_start, hash_ids : int64    a hash-id trace's ids per request (empty: the tree)
    think : float64 (n,)    a later turn's think time (s), NaN otherwise
    code : int    the router; ``routes`` the random router's draws (per routed request, or behind
        a prefill pool per request); ``weight`` prefix_aware's
    caching : bool    blocks are cached by content (else only counted; on decode replicas always)
    lookahead : bool    async scheduling (as :func:`fastsim.engine.kernels.serve.serve`'s)
    npre, k_pre, budget_pre, blocks_pre    the prefill replicas, their step-time coefficients,
        token budget and KV blocks (:class:`PrefillPool`; unused without them)
    link_s : float64 (n,)    each request's KV transfer time; ``pre_routes`` the prefill pool's draws
    req : int64 (REQ_ROWS, n + 1)    per-request state, initialised by :func:`run`
    blk, ends, tab    the cache (:func:`fastsim.engine.kernels._cache.start`)
    cnode, clo, found    scratch: a request's chain of owners (:func:`._cache.chain`), its hits' blocks
    held, slots    the blocks running requests hit, ``stride`` per slot, and the stack of free slots
    first_token, done : float64 (n,)    filled (engine times)
    replica, pre_replica : int64 (n,)    filled with each request's (decode) replica and prefill
        replica, where it has one (else left)
    runs, gaps    as :func:`fastsim.engine.kernels.serve.serve`'s

    Returns the prefill replicas' (steps, busy, max_queue, preemptions, KV block-steps, peak KV
    blocks, runs), the others' and the gaps.
    """
    n = arrival.size
    first_pool = npre if npre > 0 else replicas  # the replicas arrivals are routed to
    replicas += npre
    size = tab.shape[0] // first_pool
    mask = size - 1
    g, c, hits, top, own = req[G], req[C], req[HITS], req[TOP], req[OWN]
    slot = req[SLOT]
    slack = req[SLACK]  # room in the blocks a running request holds beyond what is scheduled: no division a step
    rprev, rnext, wnext, last_step, cached = req[RPREV], req[RNEXT], req[WNEXT], req[LAST_STEP], req[CACHED]
    last_t = np.zeros(n)
    st = np.zeros((replicas, N_STATE), np.int64)
    for r in range(replicas):
        st[r, RHEAD] = st[r, RTAIL] = st[r, WHEAD] = st[r, WTAIL] = -1
        st[r, FREE] = blocks_pre if r < npre else blocks
    now_r = np.zeros(replicas)
    began_r = np.full(replicas, -np.inf)  # when each replica's last step started
    joined = np.empty(n)  # when each request joined its replica's queue
    outstanding = np.zeros(replicas, np.int64)  # routed to each replica, not yet done
    in_use = np.zeros(replicas, np.int64)  # KV blocks in use on each, at a routing instant
    heap_t = np.empty(n)  # released turns and KV arrivals: a binary heap on (time, request)
    heap_i = np.empty(n, np.int64)
    nheap = 0
    sent = np.zeros(n, np.bool_)  # its KV is on its way to the decode pool
    link_free = np.zeros(max(npre, 1))
    ended = np.empty(limit + 1, np.int64)  # a prefill step's prompts to send, by index
    rows_i = np.empty(limit + 1, np.int64)
    rows_c = np.empty(limit + 1, np.int64)
    rows_n = np.empty(limit + 1, np.int64)
    nruns = ngaps = 0
    sp = 0  # the next request whose arrival was given
    routed = routed_decode = 0
    while True:
        t_next, q, sp = next_arrival(arrival, sp, heap_t, heap_i, nheap)
        rep = -1
        for r in range(replicas):
            if (st[r, RUNNING] > 0 or st[r, NWAIT] > 0) and (rep < 0 or now_r[r] < now_r[rep]):
                rep = r
        if rep >= 0 and now_r[rep] < t_next:
            # one step of replica ``rep``
            prefilling = rep < npre
            kr = k_pre if prefilling else k
            cache_r = caching and (npre == 0 or prefilling)
            blocks_r = blocks_pre if prefilling else blocks
            tb = rep * size
            free = st[rep, FREE]
            left = budget_pre if prefilling else budget
            nrows = 0
            preempted = False
            j = st[rep, RHEAD]
            while j >= 0 and left > 0:  # 1. running requests, oldest first
                take = min(prompt[j] + g[j] - c[j], left)
                need = (1 if slack[j] == 0 else 0) if take == 1 else cdiv(take - slack[j], bt) if take > slack[j] else 0
                gone = False
                while need > free:  # preempt the newest
                    v = st[rep, RTAIL]
                    st[rep, RHEAD], st[rep, RTAIL] = unlink(rprev, rnext, st[rep, RHEAD], st[rep, RTAIL], v)
                    st[rep, RUNNING] -= 1
                    free += release(v, rep, bt, prompt, parent, shared, hash_start, hash_ids, hash_block, stride,
                                     hits, top, own, blk, ends, tab, tb, mask, cnode, clo, slot, held, slots)
                    c[v] = 0
                    wnext[v] = st[rep, WHEAD]
                    st[rep, WHEAD] = v
                    if st[rep, WTAIL] < 0:
                        st[rep, WTAIL] = v
                    st[rep, NWAIT] += 1
                    st[rep, PREEMPTIONS] += 1
                    preempted = True
                    if v == j:
                        gone = True
                        break
                if gone:
                    break
                allocate(j, need, cache_r, rep, top, own, blk, ends, tab, tb, mask)
                free -= need
                slack[j] += need * bt - take
                if cache_r and (take > 1 or slack[j] == 0):  # a block filled
                    fill(j, c[j], c[j] + take, bt, prompt, parent, shared, hash_start, hash_ids, hash_block, stride,
                          hits, top, own, blk, tab, tb, mask, cnode, clo)
                rows_i[nrows], rows_c[nrows], rows_n[nrows] = j, c[j], take
                nrows += 1
                left -= take
                j = rnext[j]
            if not preempted:  # 2. admission from the front of the queue
                seen = began_r[rep] if lookahead and st[rep, RUNNING] > 0 else now_r[rep]
                while st[rep, RUNNING] < limit and left > 0 and st[rep, NWAIT] > 0:
                    i = st[rep, WHEAD]
                    if joined[i] > seen:
                        break  # (async scheduling: it came after this step's batch was chosen)
                    h = free_hits = 0
                    if cache_r:
                        h, free_hits = hit(i, g[i], tb, mask, bt, prompt, parent, shared, hash_start, hash_ids,
                                            hash_block, stride, tab, blk, cnode, clo, found)
                    c0 = max(h * bt, c[i])  # (a decode replica's request arrives with its prompt computed)
                    take = min(prompt[i] + g[i] - c0, left)
                    new = cdiv(c0 + take, bt) - h
                    if new + free_hits > free:
                        break  # the head blocks the queue
                    sl = -1
                    if h > 0 and slots[0] > 0:  # a slot keeps the blocks it hits for its release
                        sl = slots[slots[0]]
                        slots[0] -= 1
                        slot[i] = sl
                    for jj in range(h):
                        b = found[jj]
                        if blk[b, REF] == 0:
                            unqueue(blk, ends, rep, b)
                        blk[b, REF] += 1
                        if sl >= 0:
                            held[sl * stride + jj] = b
                    free -= free_hits
                    hits[i] = h
                    allocate(i, new, cache_r, rep, top, own, blk, ends, tab, tb, mask)
                    free -= new
                    slack[i] = (h + new) * bt - c0 - take
                    if cached[i] < 0:
                        cached[i] = c0
                    c[i] = c0
                    if cache_r:
                        fill(i, c0, c0 + take, bt, prompt, parent, shared, hash_start, hash_ids, hash_block, stride,
                              hits, top, own, blk, tab, tb, mask, cnode, clo)
                    st[rep, WHEAD] = wnext[i]
                    if wnext[i] < 0:
                        st[rep, WTAIL] = -1
                    st[rep, NWAIT] -= 1
                    st[rep, RHEAD], st[rep, RTAIL] = link_tail(rprev, rnext, st[rep, RHEAD], st[rep, RTAIL], i)
                    st[rep, RUNNING] += 1
                    rows_i[nrows], rows_c[nrows], rows_n[nrows] = i, c0, take
                    nrows += 1
                    left -= take
            st[rep, MAX_QUEUE] = max(st[rep, MAX_QUEUE], st[rep, NWAIT])
            st[rep, FREE] = free
            if nrows == 0:
                continue  # the only runner preempted itself: it is admitted next time
            # 3. the step
            n_tok = kv_tok = pairs = sampled = 0
            for r in range(nrows):
                i = rows_i[r]
                n_tok += rows_n[r]
                kv_tok += rows_c[r] + rows_n[r]
                pairs += rows_n[r] * (2 * rows_c[r] + rows_n[r] + 1) // 2
                sampled += rows_c[r] + rows_n[r] == prompt[i] + g[i]
            used = blocks_r - free
            st[rep, KV_SUM] += used
            st[rep, KV_PEAK] = max(st[rep, KV_PEAK], used)
            began_r[rep] = now_r[rep]
            now = now_r[rep] + step_time(kr, n_tok, kv_tok, pairs, sampled)
            now_r[rep] = now
            steps = st[rep, STEPS] + 1
            st[rep, STEPS] = steps
            w = nsent = 0
            for r in range(nrows):
                i = rows_i[r]
                c[i] = rows_c[r] + rows_n[r]
                if c[i] < prompt[i] + g[i]:
                    continue
                g[i] += 1
                st[rep, BUSY] += 1
                if g[i] == 1:
                    first_token[i] = now
                elif last_step[i] == steps - 1:
                    w += 1
                else:
                    if ngaps < gaps.size:
                        gaps[ngaps] = now - last_t[i]
                    ngaps += 1
                last_step[i] = steps
                last_t[i] = now
                if g[i] < (1 if prefilling else output[i]):
                    continue
                pv, nx = rprev[i], rnext[i]  # unlinked here, not by _running.unlink, whose two stores
                # into ``st`` per completion measured ~8 % of the sessions row
                if pv >= 0:
                    rnext[pv] = nx
                else:
                    st[rep, RHEAD] = nx
                if nx >= 0:
                    rprev[nx] = pv
                else:
                    st[rep, RTAIL] = pv
                st[rep, RUNNING] -= 1
                outstanding[rep] -= 1
                st[rep, FREE] += release(i, rep, bt, prompt, parent, shared, hash_start, hash_ids, hash_block, stride,
                                          hits, top, own, blk, ends, tab, tb, mask, cnode, clo, slot, held, slots)
                if g[i] < output[i]:  # a prompt done on a prefill replica: its KV is sent
                    ended[nsent] = i
                    nsent += 1
                    continue
                done[i] = now
                nheap, _ = turn_after(i, now, api_s, think, arrival, heap_t, heap_i, nheap, 0, 0, False, False,
                                      0)  # (sessions: no clients)
            for a in range(1, nsent):  # the link takes them in order of index
                i = ended[a]
                b = a
                while b > 0 and ended[b - 1] > i:
                    ended[b] = ended[b - 1]
                    b -= 1
                ended[b] = i
            for a in range(nsent):
                i = ended[a]
                link_free[rep] = max(now, link_free[rep]) + link_s[i]
                sent[i] = True
                nheap = push(heap_t, heap_i, nheap, link_free[rep], i)
            nruns, st[rep, RUN_KV], st[rep, RUN_PAIRS], st[rep, RUN_NW], st[rep, RUN_M], st[rep, RUN_S] = extend_run(
                runs, nruns, st[rep, RUN_KV], st[rep, RUN_PAIRS], st[rep, RUN_NW], st[rep, RUN_M], st[rep, RUN_S],
                n_tok, kv_tok, pairs, 1, w, sampled)
            continue
        if q < 0:
            break
        # route the arrival at t_next
        if q == sp:
            sp += 1
        else:
            nheap = pop(heap_t, heap_i, nheap)
        for r in range(replicas):
            in_use[r] = (blocks_pre if r < npre else blocks) - st[r, FREE]
        if sent[q]:  # its KV reached the decode pool, which caches nothing: prefix-aware is least_kv there
            to = npre + choose(LEAST_KV if code == PREFIX_AWARE else code, q if code == RANDOM else routed_decode,
                               routes, outstanding, in_use, npre, replicas)
            routed_decode += 1
            last_t[q] = first_token[q]
            last_step[q] = -2
        elif code != PREFIX_AWARE:
            to = choose(code, routed, pre_routes if npre > 0 else routes, outstanding, in_use, 0, first_pool)
        else:  # the fewest blocks missed (weighted) plus blocks in use; ties as least_kv's
            to = 0
            best = np.inf
            for r in range(first_pool):
                miss = cdiv(prompt[q], bt) - hit(q, 0, r * size, mask, bt, prompt, parent, shared, hash_start,
                                                  hash_ids, hash_block, stride, tab, blk, cnode, clo, found)[0]
                score = miss * weight + in_use[r]
                if r == 0 or score < best or (score == best and outstanding[r] < outstanding[to]):
                    to = r
                    best = score
        if sent[q] or npre == 0:
            replica[q] = to - npre
        if not sent[q]:
            routed += 1
            if npre > 0:
                pre_replica[q] = to
        outstanding[to] += 1
        if st[to, RUNNING] == 0 and st[to, NWAIT] == 0:
            now_r[to] = max(now_r[to], t_next)
        joined[q] = t_next
        join_queue(st, wnext, to, q, WHEAD, WTAIL, NWAIT)
    pre = totals(st[:npre], runs, nruns, STEPS, RUN_KV)
    steps, busy, max_queue, preemptions, kv_sum, kv_peak, nruns = totals(st[npre:], runs, pre[-1], STEPS, RUN_KV)
    return (pre[0], pre[1], pre[2], pre[3], pre[4], pre[5], 0, steps, busy, max_queue, preemptions, kv_sum, kv_peak,
            nruns, ngaps)



def blockwise(config, p, traffic, output, draws, scratch=None, prefill=None):
    """The block loop on plan ``p``'s replicas (engine times), as the fleet driver runs the
    serving loop (fastsim.engine.fleet._shared): ``output`` the outputs run, ``draws`` the random
    router's, ``prefill`` (the prefill replicas' plan, their draws) a prefill pool in front."""
    scratch = Scratch() if scratch is None else scratch
    f = config.fleet
    n = len(traffic)
    c = traffic.content if traffic.content is not None else shares.none(n)
    prompt = traffic.prompt_tokens
    pool = None
    if prefill is not None:
        pre_plan, pre_draws = prefill
        pool = PrefillPool(f.prefill_replicas, pre_plan.k, pre_plan.budget, pre_plan.blocks,
                           link.transfer_s(config, prompt), pre_draws.astype(np.int64))
    got = []  # the per-request arrays of the last call

    def call(runs, gaps):
        *got[:], counters = run(
            traffic.arrival_s, prompt, output, c.parent, c.shared, c.hash_start, c.hash_ids, c.hash_block, c.think_s,
            f.replicas, ROUTERS[f.router].code, draws.astype(np.int64), f.prefix_weight, p.limit, p.k, p.budget,
            p.blocks, p.block_tokens, config.engine.prefix_caching, p.lookahead, p.api_s, runs, gaps, pool)
        return counters

    counters, runs, gaps = with_room(n, scratch, False, call)
    first, done, arrived, replica, pre_replica, cached, pre_counters = got
    out = outcome(p, first, done, counters, runs, gaps, replica.astype(np.int32))
    if prefill is not None:
        pre = outcome(prefill[0], first, done, pre_counters, runs[:0], gaps[:0])
        out = _joined(pre, out, first, done, replica.astype(np.int32), pre_replica.astype(np.int32))
    return _with_hits(out, traffic, arrived, cached, config.engine.prefix_caching)
