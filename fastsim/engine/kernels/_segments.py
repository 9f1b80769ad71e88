"""The prefix cache as runs of blocks (docs/model/prefix-cache.md), for requests that share only
system prompts and their own sessions' turns: one cache per replica, all in one array.

A request's blocks are its *path*: positions 0, 1, ... (its system prompt's first, then the turns
before it, then its own). When it lets go of them, those no one else holds join its replica's free
queue's tail from last to first: one *segment* of its path, positions [a, b), whose [a, f) hold
content and [f, b) none (a partial last block, or blocks not yet filled). Allocation takes the
queue's head, so it eats the first segment from b down; a hit takes a prefix of a path, so it eats
a segment from a up. Either way a segment stays one run, and the queue is a list of segments,
oldest first: each operation costs O(1) per segment, not per block.

What a request can hit on a replica is its system prompt (G's blocks [0, hi) are cached there:
held by the running requests that hold it, or free in the segment of the last one that let go)
and, above it, the path of its nearest earlier turn that ran there (the segment of its last
release: no one else shares it, since a session's turns run one after another, and a later turn
that ran there took all it held), or after a preemption its own. A system prompt's blocks are
evicted only after every path above them (they sit in the same segment below the path, or in a
newer one), so a partly cached system prompt leaves no path to extend.

Layout: rows of one int64 array ``cache`` (FIELDS wide), in four regions (:class:`Layout`):
replica r's segments (OWNER: the request whose path it is, -1 when unused; A, F, B; PREV, NEXT in
its queue, as rows; STACK: its unused rows, a stack), each replica's queue (HEAD, TAIL, and
UNUSED: the stack's size), each replica's system prompts (HI, HOLDERS: running requests that hold
its blocks, GSEG: the segment holding them free, or -1) and each request (GROUP: its system
prompt, or -1; PARENT: a later turn's turn before, or -1; GHELD: it holds its system prompt's
blocks; SID: the segment of its last release, where its path can be hit; CACHED: its hit at its
first admission, tokens, -1 before). One array, not several: a compiled call costs some
nanoseconds for every array it is given, and these run at every admission and release.

The operations a kernel calls a few times an event (take, evict, release) are compiled apart, not
inlined: the same speed (measured), and seconds less for the kernel's first compile.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..._jit import inline, jit

OWNER, A, F, B, PREV, NEXT, STACK, FIELDS = range(8)  # a segment's row
HEAD, TAIL, UNUSED = range(3)  # a replica's queue's row
HI, HOLDERS, GSEG = range(3)  # a system prompt's row (on a replica)
GROUP, PARENT, GHELD, SID, CACHED = range(5)  # a request's row

NOBODY = -2  # the owner of the blocks free at the start: without content, nobody's path


class Layout(NamedTuple):
    """Where each region of the cache's array starts: segment rows per replica (each replica's
    ``rows`` from ``rep * rows``), then ``ends`` (a row per replica), ``groups`` (``per_replica``
    rows per replica, one per system prompt) and ``requests`` (a row per request)."""

    rows: int
    ends: int
    groups: int
    per_replica: int
    requests: int


def start(blocks: int, groups: int, replicas: int, group: np.ndarray, parent: np.ndarray
          ) -> tuple[np.ndarray, Layout]:
    """Every replica's blocks free without content (one segment each, room for a segment per
    block: each holds one at least), system prompts with nothing cached, each request's ``group``
    and ``parent`` with nothing held or hit yet: (the array, its layout)."""
    rows = blocks + 1
    groups = max(groups, 1)
    ends = replicas * rows
    layout = Layout(rows, ends, ends + replicas, groups, ends + replicas + replicas * groups)
    cache = np.full((layout.requests + group.size, FIELDS), -1, np.int64)
    for r in range(replicas):
        first = r * rows
        cache[first, OWNER], cache[first, A], cache[first, F], cache[first, B] = NOBODY, 0, 0, blocks
        cache[first:first + rows - 1, STACK] = np.arange(first + rows - 1, first, -1)  # popped from the top: first + 1, ...
        cache[ends + r, HEAD], cache[ends + r, TAIL], cache[ends + r, UNUSED] = first, first, rows - 1
    cache[layout.groups:layout.requests, :3] = (0, 0, -1)  # HI, HOLDERS, GSEG
    req = cache[layout.requests:]
    req[:, GROUP], req[:, PARENT], req[:, GHELD] = group, parent, 0
    return cache, layout


@inline
def append(cache, at, rep, owner, a, f, b):
    """A segment [a, b) of ``owner``'s path (content [a, f)) joins replica ``rep``'s queue's tail
    (its queue's row ``at.ends + rep``); returns its row."""
    e = at.ends + rep
    cache[e, UNUSED] -= 1
    s = cache[rep * at.rows + cache[e, UNUSED], STACK]
    cache[s, OWNER], cache[s, A], cache[s, F], cache[s, B] = owner, a, f, b
    t = cache[e, TAIL]
    cache[s, PREV], cache[s, NEXT] = t, -1
    if t >= 0:
        cache[t, NEXT] = s
    else:
        cache[e, HEAD] = s
    cache[e, TAIL] = s
    return s


@inline
def _drop(cache, at, rep, s):
    e = at.ends + rep
    p, nx = cache[s, PREV], cache[s, NEXT]
    if p >= 0:
        cache[p, NEXT] = nx
    else:
        cache[e, HEAD] = nx
    if nx >= 0:
        cache[nx, PREV] = p
    else:
        cache[e, TAIL] = p
    cache[s, OWNER] = -1
    cache[rep * at.rows + cache[e, UNUSED], STACK] = s
    cache[e, UNUSED] += 1


@jit
def take(cache, at, rep, s, upto):
    """A hit takes segment ``s``'s positions below ``upto`` (content) out of the queue."""
    cache[s, A] = upto
    if upto >= cache[s, B]:
        _drop(cache, at, rep, s)


@jit
def evict(cache, at, rep, count):
    """Allocate ``count`` blocks from replica ``rep``'s queue's head (there are so many): each
    forgets its content, the first segment's deepest positions first; a system prompt whose blocks
    go loses them from its cached extent."""
    gbase = at.groups + rep * at.per_replica
    while count > 0:
        s = cache[at.ends + rep, HEAD]
        n = min(count, cache[s, B] - cache[s, A])
        b = cache[s, B] - n
        owner = cache[s, OWNER]
        g = cache[at.requests + owner, GROUP] if owner >= 0 else -1
        if g >= 0 and cache[gbase + g, GSEG] == s and b < cache[gbase + g, HI]:
            cache[gbase + g, HI] = b
            if b == 0:
                cache[gbase + g, GSEG] = -1
        cache[s, B] = b
        cache[s, F] = min(cache[s, F], b)
        if b == cache[s, A]:
            _drop(cache, at, rep, s)
        count -= n


@jit
def release(cache, at, rep, v, top, f, gend, keep):
    """Request ``v`` lets go of the ``top`` blocks of its path on replica ``rep``, content in the
    first ``f``: those nobody else holds join the queue as its segment (its system prompt's stay
    while other requests hold it). ``keep``: its segment is recorded as where its path can be hit
    (not on a replica that caches nothing). Returns how many blocks joined the queue."""
    u = 0
    rv = at.requests + v
    g = cache[rv, GROUP]
    grow = at.groups + rep * at.per_replica + g
    last = False  # the last holder of its system prompt: its blocks join the queue in this segment
    if cache[rv, GHELD] != 0:
        cache[rv, GHELD] = 0
        cache[grow, HOLDERS] -= 1
        if cache[grow, HOLDERS] > 0:
            u = min(gend, top)
        else:
            last = cache[grow, HI] > 0
    if keep:
        cache[rv, SID] = -1
    if top > u:
        s = append(cache, at, rep, v, u, max(u, min(f, top)), top)
        if keep:
            cache[rv, SID] = s
        if last:
            cache[grow, GSEG] = s
    return top - u
