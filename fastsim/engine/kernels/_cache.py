"""The prefix cache's blocks (docs/model/prefix-cache.md), shared by the caching kernel's
replicas: arrays indexed by physical block (replica r's are ``r * blocks .. (r + 1) * blocks - 1``)
and one open-addressing table per replica from content key to the block that holds it.

- ``key[b]``: the content block b holds (-1: none: never full, a partial block, or a content
  another block held first); ``ref[b]``: requests holding it.
- The free queue: blocks with ``ref`` 0, doubly linked (``qprev``/``qnext``), head and tail per
  replica in ``ends``; allocation takes the head (forgetting its content), release appends.
- ``below[b]``: a request's own blocks (those it allocated) form a stack through it, newest on
  top; the blocks it hit are found again by their content, which cannot change while held.

Content keys: ``node * stride + j`` for block j of a tree node (a request or a system prompt), or
``(nodes + id) * stride + j`` for a hash-id trace's hash id (:func:`key_of`).
"""

from __future__ import annotations

import numpy as np

from ..._jit import inline

EMPTY = -1
MIX = -7046029254386353131  # 0x9E3779B97F4A7C15 as int64: Fibonacci hashing


@inline
def key_of(r, j, bt, prompt, parent, shared, hash_start, hash_ids, hash_block, stride):
    """The content key of block ``j`` of request ``r``."""
    if hash_start.size > 0:
        if (j + 1) * bt <= prompt[r]:
            i = ((j + 1) * bt - 1) // hash_block
            return (parent.size + hash_ids[hash_start[r] + i]) * stride + j
        return r * stride + j
    node = r
    while parent[node] >= 0 and (j + 1) * bt <= shared[node]:
        node = parent[node]
    return node * stride + j


@inline
def _slot(key, mask):
    h = key * MIX
    return (h ^ (h >> 29)) & mask


@inline
def find(tkey, tval, base, mask, key):
    """The block holding content ``key`` in the table at ``base``, or -1."""
    i = _slot(key, mask)
    while True:
        k = tkey[base + i]
        if k == key:
            return tval[base + i]
        if k == EMPTY:
            return -1
        i = (i + 1) & mask


@inline
def put(tkey, tval, base, mask, key, block):
    i = _slot(key, mask)
    while tkey[base + i] != EMPTY:
        i = (i + 1) & mask
    tkey[base + i] = key
    tval[base + i] = block


@inline
def drop(tkey, tval, base, mask, key):
    """Remove ``key`` (present) by backward shifting, so that lookups need no tombstones."""
    i = _slot(key, mask)
    while tkey[base + i] != key:
        i = (i + 1) & mask
    j = i
    while True:
        j = (j + 1) & mask
        k = tkey[base + j]
        if k == EMPTY:
            break
        home = _slot(k, mask)
        if (i <= j and (home <= i or home > j)) or (i > j and home <= i and home > j):
            tkey[base + i] = k
            tval[base + i] = tval[base + j]
            i = j
    tkey[base + i] = EMPTY


def table_size(blocks: int) -> int:
    """Slots of one replica's table: a power of two, at least twice its blocks."""
    size = 16
    while size < 2 * blocks:
        size *= 2
    return size


@inline
def unqueue(qprev, qnext, ends, rep, b):
    p, nx = qprev[b], qnext[b]
    if p >= 0:
        qnext[p] = nx
    else:
        ends[rep, 0] = nx
    if nx >= 0:
        qprev[nx] = p
    else:
        ends[rep, 1] = p


@inline
def enqueue(qprev, qnext, ends, rep, b):
    t = ends[rep, 1]
    qprev[b] = t
    qnext[b] = -1
    if t >= 0:
        qnext[t] = b
    else:
        ends[rep, 0] = b
    ends[rep, 1] = b


def start(replicas: int, blocks: int) -> tuple[np.ndarray, ...]:
    """Every replica's blocks free, in index order, without content: (key, ref, qprev, qnext,
    below, ends, table keys, table values)."""
    total = replicas * blocks
    idx = np.arange(total, dtype=np.int64)
    qprev, qnext = idx - 1, idx + 1
    qprev[::blocks] = -1
    qnext[blocks - 1::blocks] = -1
    ends = np.stack([np.arange(replicas) * blocks, np.arange(replicas) * blocks + blocks - 1], axis=1).astype(np.int64)
    size = table_size(blocks)
    return (np.full(total, -1, np.int64), np.zeros(total, np.int64), qprev, qnext, np.full(total, -1, np.int64),
            ends, np.full(replicas * size, EMPTY, np.int64), np.zeros(replicas * size, np.int64))
