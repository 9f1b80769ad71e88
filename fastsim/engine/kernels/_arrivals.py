"""Arrivals that depend on the run, for the serving loop (:mod:`.serve`): the given ones (a trace's or the drawn ones; NaN for a session's later
turn, a closed-loop client's request after its first) and those a run releases (a session's next turn, a
client's next request, a prompt's KV reaching the decode pool),
kept in a binary min-heap on (time, request) in two arrays; ties go to the lower request index."""

from __future__ import annotations

import numpy as np

from ..._jit import inline, jit


@inline
def push(heap_t, heap_i, size, t, i):
    """Add (t, i) to the heap of ``size`` entries; returns its new size."""
    j = size
    while j > 0:
        up = (j - 1) >> 1
        if heap_t[up] < t or (heap_t[up] == t and heap_i[up] < i):
            break
        heap_t[j], heap_i[j] = heap_t[up], heap_i[up]
        j = up
    heap_t[j], heap_i[j] = t, i
    return size + 1


@inline
def pop(heap_t, heap_i, size):
    """Remove the first entry (``heap_t[0]``, ``heap_i[0]``); returns the new size."""
    size -= 1
    t, i = heap_t[size], heap_i[size]
    j = 0
    while True:
        child = 2 * j + 1
        if child >= size:
            break
        if child + 1 < size and (heap_t[child + 1] < heap_t[child] or (
                heap_t[child + 1] == heap_t[child] and heap_i[child + 1] < heap_i[child])):
            child += 1
        if heap_t[child] > t or (heap_t[child] == t and heap_i[child] > i):
            break
        heap_t[j], heap_i[j] = heap_t[child], heap_i[child]
        j = child
    if size > 0:
        heap_t[j], heap_i[j] = t, i
    return size


@inline
def next_arrival(arrival, sp, heap_t, heap_i, nheap):
    """(time, request, ``sp``) of the next arrival: the given ones from ``sp`` on (skipping the
    NaN of later turns) or the heap's first; (inf, -1) if none."""
    n = arrival.size
    while sp < n and arrival[sp] != arrival[sp]:
        sp += 1
    t, q = np.inf, -1
    if sp < n:
        t, q = arrival[sp], sp
    if nheap > 0 and (heap_t[0] < t or (heap_t[0] == t and heap_i[0] < q)):
        t, q = heap_t[0], heap_i[0]
    return t, q, sp


@jit
def turn_after(i, now, api_s, think, arrival, heap_t, heap_i, nheap, clients, taken, alone, later, following):
    """Request ``i`` is done at ``now`` (engine time): what it releases, if anything, arrives after
    the API overhead and its think time. In sessions (``clients`` 0) that is its session's next
    turn, ``i + 1``. With closed-loop clients, ``i``'s client sends its session's next turn if it
    has one (``later``), else it is free after the API overhead and takes the next request no
    client has taken (``taken``, a session's first turn; ``following``, the first turn of the
    session after that one: :attr:`fastsim.engine.content.Content.next_start`):
    on ``alone`` engine at once (its completions come in time order); in a pool, whose replicas
    finish out of order, as an entry (time, n + i) of the heap, the request taken when it comes
    (:func:`client_sends`). Returns the heap's size and ``taken``."""
    n = arrival.size
    if clients == 0:
        if i + 1 < n and think[i + 1] == think[i + 1]:
            return client_sends(now + api_s, think, arrival, heap_t, heap_i, nheap, i + 1), taken
        return nheap, taken
    if later:  # its session's next turn, sent by the same client
        return client_sends(now + api_s, think, arrival, heap_t, heap_i, nheap, i + 1), taken
    if not alone:  # (every completion: which clients take the last requests is decided in time order)
        return push(heap_t, heap_i, nheap, now + api_s, n + i), taken
    if taken >= n:
        return nheap, taken
    return client_sends(now + api_s, think, arrival, heap_t, heap_i, nheap, taken), following


@inline
def released_by(i, now, api_s, think, arrival, heap_t, heap_i, nheap, clients, taken, alone, next_start):
    """:func:`turn_after` for the serving loop, which holds ``next_start``
    (:attr:`fastsim.engine.content.Content.next_start`; empty without clients): read here, and
    given to it as two numbers (an array given to that call measured a fifth of a closed loop's
    kernel)."""
    n = arrival.size
    return turn_after(i, now, api_s, think, arrival, heap_t, heap_i, nheap, clients, taken, alone,
                      clients > 0 and next_start[i] > i + 1, next_start[taken] if clients > 0 and taken < n else n)


@inline
def client_sends(t, think, arrival, heap_t, heap_i, nheap, j):
    """A client free at ``t`` sends request ``j`` after its think time. Returns the heap's size."""
    arrival[j] = t + think[j]
    return push(heap_t, heap_i, nheap, arrival[j], j)


@inline
def take_next(given, sp, heap_t, heap_i, nheap, think, arrival, sending, starts):
    """A pool's next arrival taken: (its time, request (-1: none left), ``sp``, the heap's size,
    ``sending``). Where it is a closed-loop client's being free (a request index past the
    given ones), the client sends request ``sending`` (if any is left) after its think time, and
    ``sending`` moves to the next client's first."""
    t, q, sp = next_arrival(given, sp, heap_t, heap_i, nheap)
    if q < 0:
        return t, q, sp, nheap, sending
    if q == sp and sp < given.size:
        sp += 1
    else:
        nheap = pop(heap_t, heap_i, nheap)
    if q >= arrival.size and sending < arrival.size:
        nheap = client_sends(t, think, arrival, heap_t, heap_i, nheap, sending)
        sending = starts[sending]
    return t, q, sp, nheap, sending


@inline
def arrive(now, t_next, q_next, sp, nheap, qfirst, qlast, nwait, arrival, heap_t, heap_i, qnext):
    """One engine whose run releases arrivals: every arrival due by ``now`` (the next is
    ``t_next``, request ``q_next``: from the given ``arrival`` or the heap) joins the waiting
    queue's tail, in time order; returns the next arrival and the updated state."""
    while t_next <= now:
        if q_next == sp and sp < arrival.size:
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


@jit
def send(ended, nsent, now, link_free, rep, link_s, sent, heap_t, heap_i, nheap):
    """A prefill step's ``nsent`` prompts (``ended``) cross replica ``rep``'s link, in order of
    index (first come, first served); each one's KV reaches the decode pool when its transfer
    ends. Returns the heap's size."""
    for a in range(1, nsent):
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
    return nheap
