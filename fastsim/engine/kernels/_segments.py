"""The prefix cache as runs of blocks, for the chat kernel (:mod:`.chat`): one engine whose requests
share only system prompts and their own sessions' turns (docs/model/prefix-cache.md).

A request's blocks are its *path*: positions 0, 1, ... (its system prompt's first, then the turns
before it, then its own). When it lets go of them, those no one else holds join the free queue's
tail from last to first: one *segment* of its path, positions [a, b), whose [a, f) hold content
and [f, b) none (a partial last block, or blocks not yet filled). Allocation takes the queue's head,
so it eats the first segment from b down; a hit takes a prefix of a path, so it eats a segment
from a up. Either way a segment stays one run, and the queue is a list of segments, oldest first:
each operation costs O(1) per segment, not per block.

What another request can hit is its system prompt (G's blocks [0, hi) are cached: held by the
requests that hold it, or free in the segment of the last one that let go) and its previous
turn's path (the segment of its release: nobody else shares it, since a session's turns run one
after another), or after a preemption its own.

The operations a kernel calls a few times an event (take, evict, release) are compiled apart, not
inlined: the same speed (measured), and three seconds less for the chat kernel's first compile.

Segments: rows of ``seg`` (OWNER: the request whose path it is, -1 when unused; A, F, B; PREV,
NEXT in the queue), the queue's ends and a stack of unused rows in ``ends`` (HEAD, TAIL, UNUSED:
how many, the rows in ``unused``). System prompts: rows of ``gst`` (HI, HOLDERS: running requests
that hold its blocks, GSEG: the segment holding them free, or -1).
"""

from __future__ import annotations

import numpy as np

from ..._jit import inline, jit

OWNER, A, F, B, PREV, NEXT, SEG_FIELDS = range(7)
HEAD, TAIL, UNUSED = range(3)
HI, HOLDERS, GSEG = range(3)


NOBODY = -2  # the owner of the blocks free at the start: without content, nobody's path


def start(blocks: int, groups: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every block free without content (one segment), room for a segment per block (each holds
    one at least), and system prompts with nothing cached: (seg, ends, unused, gst)."""
    rows = blocks + 1
    seg = np.full((rows, SEG_FIELDS), -1, np.int64)
    seg[0, OWNER], seg[0, A], seg[0, F], seg[0, B] = NOBODY, 0, 0, blocks
    gst = np.zeros((max(groups, 1), 3), np.int64)
    gst[:, GSEG] = -1
    unused = np.arange(rows - 1, 0, -1, dtype=np.int64)  # popped from the end: 1, 2, ...
    return seg, np.array([0, 0, rows - 1], np.int64), np.append(unused, 0), gst


@inline
def alive(seg, s, owner):
    """Segment ``s`` is still ``owner``'s (rows are reused)."""
    return s >= 0 and seg[s, OWNER] == owner


@inline
def append(seg, ends, unused, owner, a, f, b):
    """A segment [a, b) of ``owner``'s path (content [a, f)) joins the queue's tail; returns its
    row."""
    ends[UNUSED] -= 1
    s = unused[ends[UNUSED]]
    seg[s, OWNER], seg[s, A], seg[s, F], seg[s, B] = owner, a, f, b
    t = ends[TAIL]
    seg[s, PREV], seg[s, NEXT] = t, -1
    if t >= 0:
        seg[t, NEXT] = s
    else:
        ends[HEAD] = s
    ends[TAIL] = s
    return s


@inline
def _drop(seg, ends, unused, s):
    p, nx = seg[s, PREV], seg[s, NEXT]
    if p >= 0:
        seg[p, NEXT] = nx
    else:
        ends[HEAD] = nx
    if nx >= 0:
        seg[nx, PREV] = p
    else:
        ends[TAIL] = p
    seg[s, OWNER] = -1
    unused[ends[UNUSED]] = s
    ends[UNUSED] += 1


@jit
def take(seg, ends, unused, s, upto):
    """A hit takes segment ``s``'s positions below ``upto`` (content) out of the queue."""
    seg[s, A] = upto
    if upto >= seg[s, B]:
        _drop(seg, ends, unused, s)


@jit
def evict(seg, ends, unused, gst, grp, count):
    """Allocate ``count`` blocks from the queue's head (there are so many): each forgets its
    content, the first segment's deepest positions first; a system prompt whose blocks go loses
    them from its cached extent."""
    while count > 0:
        s = ends[HEAD]
        n = min(count, seg[s, B] - seg[s, A])
        b = seg[s, B] - n
        g = grp[seg[s, OWNER]] if seg[s, OWNER] >= 0 else -1
        if g >= 0 and gst[g, GSEG] == s and b < gst[g, HI]:
            gst[g, HI] = b
            if b == 0:
                gst[g, GSEG] = -1
        seg[s, B] = b
        seg[s, F] = min(seg[s, F], b)
        if b == seg[s, A]:
            _drop(seg, ends, unused, s)
        count -= n


@inline
def settle(seg, ends, unused, gst, grp, owed):
    """The ``owed`` blocks allocated since the queue was last read leave its head (a kernel
    settles them before a hit reads the queue or a release appends to it: taken in the order they
    were allocated, so evictions are as if made one by one); returns 0."""
    if owed > 0:
        evict(seg, ends, unused, gst, grp, owed)
    return 0


@jit
def release(seg, ends, unused, gst, grp, gheld, sid, v, top, f, gend):
    """Request ``v`` lets go of the ``top`` blocks of its path, content in the first ``f``: those
    nobody else holds join the queue as its segment (its system prompt's stay while other
    requests hold it). Returns how many did."""
    u = 0
    g = grp[v]
    last = False  # the last holder of its system prompt: its blocks join the queue in this segment
    if gheld[v] != 0:
        gheld[v] = 0
        gst[g, HOLDERS] -= 1
        if gst[g, HOLDERS] > 0:
            u = min(gend, top)
        else:
            last = gst[g, HI] > 0
    sid[v] = -1
    if top > u:
        s = append(seg, ends, unused, v, u, max(u, min(f, top)), top)
        sid[v] = s
        if last:
            gst[g, GSEG] = s
    return top - u
