"""The prefix cache's blocks (docs/model/prefix-cache.md), shared by the caching kernel's
replicas: one row of ``blk`` per physical block (replica r's are ``r * blocks .. (r + 1) *
blocks - 1``; a block's fields side by side, so a block costs one cache miss, not five) and one
open-addressing table per replica from content key to the block that holds it (``tab`` rows:
key, block).

- ``blk[b, KEY]``: the content block b holds (-1: none: never full, a partial block, or a
  content another block held first); ``blk[b, REF]``: requests holding it.
- The free queue: blocks with REF 0, doubly linked (QPREV, QNEXT), head and tail per replica in
  ``ends``; allocation takes the head (forgetting its content), release appends.
- BELOW: a request's own blocks (those it allocated) form a stack through it, newest on top;
  the blocks it hit are kept in its running slot (:func:`release`), or, when the slots would
  take too much memory, found again by their content, which cannot change while held.

Content keys: ``node * stride + j`` for block j of a tree node (a request or a system prompt), or
``(nodes + id) * stride + j`` for a hash-id trace's hash id (:func:`key_at`).
"""

from __future__ import annotations

import numpy as np

from ..._jit import inline, jit

EMPTY = -1
KEY, REF, QPREV, QNEXT, BELOW, FIELDS = range(6)
MIX = -7046029254386353131  # 0x9E3779B97F4A7C15 as int64: Fibonacci hashing


@inline
def chain(r, bt, parent, shared, cnode, clo):
    """Request ``r``'s owners of content, from itself up the tree: ``cnode[k]`` owns its blocks
    j in [clo[k], clo[k - 1]) (clo[-1]: no end). Block j of a node is its parent's while
    (j + 1) bt <= shared, that is j < shared // bt, so clo[k] = min(shared[n_0..n_k] // bt), and
    the chain ends where that reaches 0 or a node has no parent. Returns its length."""
    m = 0
    node = r
    lo = 1 << 62
    while True:
        cnode[m] = node
        if parent[node] < 0:
            clo[m] = 0
            return m + 1
        lo = min(lo, shared[node] // bt)
        clo[m] = lo
        m += 1
        if lo == 0:
            return m
        node = parent[node]


@inline
def key_at(r, j, k, bt, prompt, hash_start, hash_ids, hash_block, nodes, stride, cnode, clo):
    """(the content key of block ``j`` of request ``r``, the chain index owning it), searching
    the chain (:func:`chain`) from index ``k``: callers walk j up or down, so each search is a
    step or two. A hash-id trace's request names its blocks by its ids instead."""
    if hash_start.size > 0:
        if (j + 1) * bt <= prompt[r]:
            i = ((j + 1) * bt - 1) // hash_block
            return (nodes + hash_ids[hash_start[r] + i]) * stride + j, k
        return r * stride + j, k
    while j < clo[k]:
        k += 1
    while k > 0 and j >= clo[k - 1]:
        k -= 1
    return cnode[k] * stride + j, k


@inline
def _slot(key, mask):
    h = key * MIX
    return (h ^ (h >> 29)) & mask


@inline
def find(tab, base, mask, key):
    """The block holding content ``key`` in the table at ``base``, or -1."""
    i = _slot(key, mask)
    while True:
        k = tab[base + i, 0]
        if k == key:
            return tab[base + i, 1]
        if k == EMPTY:
            return -1
        i = (i + 1) & mask


@inline
def put(tab, base, mask, key, block):
    i = _slot(key, mask)
    while tab[base + i, 0] != EMPTY:
        i = (i + 1) & mask
    tab[base + i, 0] = key
    tab[base + i, 1] = block


@inline
def drop(tab, base, mask, key):
    """Remove ``key`` (present) by backward shifting, so that lookups need no tombstones."""
    i = _slot(key, mask)
    while tab[base + i, 0] != key:
        i = (i + 1) & mask
    j = i
    while True:
        j = (j + 1) & mask
        k = tab[base + j, 0]
        if k == EMPTY:
            break
        home = _slot(k, mask)
        if (i <= j and (home <= i or home > j)) or (i > j and home <= i and home > j):
            tab[base + i, 0] = k
            tab[base + i, 1] = tab[base + j, 1]
            i = j
    tab[base + i, 0] = EMPTY


def table_size(blocks: int) -> int:
    """Slots of one replica's table: a power of two, at least twice its blocks."""
    size = 16
    while size < 2 * blocks:
        size *= 2
    return size


@inline
def unqueue(blk, ends, rep, b):
    p, nx = blk[b, QPREV], blk[b, QNEXT]
    if p >= 0:
        blk[p, QNEXT] = nx
    else:
        ends[rep, 0] = nx
    if nx >= 0:
        blk[nx, QPREV] = p
    else:
        ends[rep, 1] = p


@inline
def enqueue(blk, ends, rep, b):
    t = ends[rep, 1]
    blk[b, QPREV] = t
    blk[b, QNEXT] = -1
    if t >= 0:
        blk[t, QNEXT] = b
    else:
        ends[rep, 0] = b
    ends[rep, 1] = b


def start(replicas: int, blocks: int) -> tuple[np.ndarray, ...]:
    """Every replica's blocks free, in index order, without content: (blk, ends, tab)."""
    total = replicas * blocks
    blk = np.full((total, FIELDS), -1, np.int64)
    idx = np.arange(total, dtype=np.int64)
    blk[:, REF] = 0
    blk[:, QPREV], blk[:, QNEXT] = idx - 1, idx + 1
    blk[::blocks, QPREV] = -1
    blk[blocks - 1::blocks, QNEXT] = -1
    ends = np.stack([np.arange(replicas) * blocks, np.arange(replicas) * blocks + blocks - 1], axis=1).astype(np.int64)
    return blk, ends, np.full((replicas * table_size(blocks), 2), EMPTY, np.int64)


@inline
def hit(i, g, tb, mask, bt, prompt, parent, shared, hash_start, hash_ids, hash_block, stride, tab, blk,
         cnode, clo, found):
    """Request ``i``'s hit in the table at ``tb`` with ``g`` tokens emitted: the longest run of
    its blocks 0.. whose content is cached, leaving one token to compute. Returns (h, how many
    of those blocks are free); their blocks are ``found[:h]``."""
    cap = (prompt[i] + g - 1) // bt
    if cap <= 0:
        return 0, 0
    if hash_start.size == 0:
        chain(i, bt, parent, shared, cnode, clo)
    k = 0
    h = 0
    free_hits = 0
    while h < cap:
        key, k = key_at(i, h, k, bt, prompt, hash_start, hash_ids, hash_block, parent.size, stride, cnode, clo)
        b = find(tab, tb, mask, key)
        if b < 0:
            break
        found[h] = b
        free_hits += blk[b, REF] == 0
        h += 1
    return h, free_hits


@inline
def allocate(i, count, caching, rep, top, own, blk, ends, tab, tb, mask):
    """Give request ``i`` ``count`` blocks: the free queue's head each (forgetting its content),
    on top of its stack; without a cache only counted."""
    if not caching:
        own[i] += count
        return
    for _ in range(count):
        b = ends[rep, 0]
        unqueue(blk, ends, rep, b)
        if blk[b, KEY] >= 0:
            drop(tab, tb, mask, blk[b, KEY])
            blk[b, KEY] = -1
        blk[b, REF] = 1
        blk[b, BELOW] = top[i]
        top[i] = b
        own[i] += 1


@inline
def fill(i, c0, c1, bt, prompt, parent, shared, hash_start, hash_ids, hash_block, stride, hits, top, own, blk, tab, tb,
          mask, cnode, clo):
    """Blocks of request ``i`` that computing tokens c0..c1 fills get their content, unless
    another block holds it."""
    lo, hi = c0 // bt, c1 // bt
    if hi <= lo:
        return
    j = hits[i] + own[i] - 1  # the block on top of its stack
    b = top[i]
    while j >= hi:
        b = blk[b, BELOW]
        j -= 1
    if hash_start.size == 0:
        chain(i, bt, parent, shared, cnode, clo)
    k = 0
    while j >= lo:
        kk, k = key_at(i, j, k, bt, prompt, hash_start, hash_ids, hash_block, parent.size, stride, cnode, clo)
        if find(tab, tb, mask, kk) < 0:
            put(tab, tb, mask, kk, b)
            blk[b, KEY] = kk
        b = blk[b, BELOW]
        j -= 1


@inline
def release(i, rep, bt, prompt, parent, shared, hash_start, hash_ids, hash_block, stride, hits, top, own, blk, ends, tab,
             tb, mask, cnode, clo, slot, held, slots):
    """Request ``i`` lets go of its blocks, last to first; those no one else holds join the
    free queue's tail, keeping their content. Returns how many did. (Without a cache, ``top``
    is -1: its blocks were only counted.) The blocks it hit are in ``held`` from ``slot[i] *
    stride`` (a running request's slot, given back to the stack ``slots``), or found again by
    their content."""
    freed = 0 if top[i] >= 0 else own[i]
    b = top[i]
    while b >= 0:
        nx = blk[b, BELOW]
        blk[b, REF] -= 1
        if blk[b, REF] == 0:
            enqueue(blk, ends, rep, b)
            freed += 1
        b = nx
    s = slot[i]
    if s < 0 and hits[i] > 0 and hash_start.size == 0:
        chain(i, bt, parent, shared, cnode, clo)
    k = 0
    for j in range(hits[i] - 1, -1, -1):
        if s >= 0:
            b = held[s * stride + j]
        else:
            kk, k = key_at(i, j, k, bt, prompt, hash_start, hash_ids, hash_block, parent.size, stride, cnode, clo)
            b = find(tab, tb, mask, kk)
        blk[b, REF] -= 1
        if blk[b, REF] == 0:
            enqueue(blk, ends, rep, b)
            freed += 1
    if s >= 0:
        slots[0] += 1
        slots[slots[0]] = s
        slot[i] = -1
    top[i] = -1
    own[i] = 0
    hits[i] = 0
    return freed


def stride_of(prompt: np.ndarray, output: np.ndarray, bt: int) -> int:
    """The key stride: a power of two above any request's block count."""
    most = int((prompt + output).max()) // bt + 2 if prompt.size else 2
    return 1 << most.bit_length()


@jit
def depth(parent):
    """The content tree's depth: the longest chain of parents (parents come first)."""
    depth = np.zeros(parent.size, np.int64)
    most = 0
    for i in range(parent.size):
        if parent[i] >= 0:
            depth[i] = depth[parent[i]] + 1 if parent[i] < i else 1
            most = max(most, depth[i])
    return most
