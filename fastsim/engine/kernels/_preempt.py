"""The serving loop's slow path (:mod:`.serve`): a step whose running requests need more KV blocks
than are free (docs/model/serving.md, "A step under continuous batching"). Called only then,
apart from the loop, whose hot path stays small.
"""

from __future__ import annotations

from ..._jit import jit
from . import _kv as roles
from ._running import cal_remove, cdiv, unlink


@jit
def preempt_for(kv, cache, rep, hitting, bt, per, span, blocks, steps, now, prompt, g, c, held, dbase,
                phase, last_t, pnext, rprev, rnext, bucket, cnext, cprev, bcount, rhead, rtail, running, partial,
                pneed, n_dec, sum_c, free, aux, ptop, npre_q, nwait, preemptions):
    """Replica ``rep``'s running requests, oldest first, each given the blocks its tokens of this
    step need (a decoder one at a block's start, the partial row ``pneed``; :func:`._kv.grow`),
    the newest preempted while they are short: it frees its blocks (cdiv(its tokens, bt) - ``per``
    of them; decoders' token counts brought up to date) and goes to the front of the queue with
    nothing computed; if that was the request itself, the walk stops. Returns the state it
    changed: (rhead, rtail, running, partial, n_dec, sum_c, free, aux, ptop, npre_q, nwait,
    preemptions, whether it preempted)."""
    preempted = False
    j = rhead
    while j >= 0:
        cj = -1  # a decoder's tokens computed before the step
        if j == partial:
            need = pneed
        else:
            cj = prompt[j] + g[j] + (steps - dbase[j]) - 1
            if span > 0:  # speculation: its verification's slots, ``phase`` of its ``held`` blocks
                need = phase[j]
            else:
                need = 1 if cj % bt == 0 else 0
        gone = False
        while need > free:
            v = rtail  # preempt the newest: it frees its blocks and recomputes later
            rhead, rtail = unlink(rprev, rnext, rhead, rtail, v)
            running -= 1
            extra = 0  # blocks beyond its tokens' (a decoder's slots under speculation)
            if v == partial:
                top, kept = held[v], c[v]
                partial = -1
            else:
                g[v] += steps - dbase[v]
                kept = prompt[v] + g[v] - 1
                top = held[v] - phase[v] if span > 0 else cdiv(kept, bt) - per  # (its slots not taken yet)
                extra = top - (cdiv(kept, bt) - per)
                n_dec -= 1
                sum_c -= kept
                if span == 0:
                    bcount[rep, phase[v]] -= 1
                    cal_remove(bucket, cnext, cprev, v)
                last_t[v] = now  # a decoder emitted at the step just run
            # where its blocks join the free queue (:func:`._kv.own_hit`): after the free ones and its slots
            # beyond its tokens (speculation's), which it frees first
            dbase[v], phase[v] = blocks + aux + extra, kept
            free, aux = roles.free(kv, cache, rep, v, top, kept, free, aux, hitting, bt)
            held[v] = 0
            c[v] = 0
            pnext[v] = ptop
            ptop = v
            npre_q += 1
            nwait += 1
            preemptions += 1
            preempted = True
            if v == j:
                gone = True
                break
        if gone:
            break
        free, aux = roles.allocate(kv, rep, need, free, aux)
        roles.grow(kv, rep, j, need, cj, hitting, bt)
        if j == partial:
            held[j] += need
        j = rnext[j]
    return rhead, rtail, running, partial, n_dec, sum_c, free, aux, ptop, npre_q, nwait, preemptions, preempted
