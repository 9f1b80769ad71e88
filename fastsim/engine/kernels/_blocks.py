"""The KV cache manager's roles (:mod:`._kv`) for the prefix cache kept block by block
(:mod:`._cache`, docs/model/prefix-cache.md, "How it is computed"): content shared any way (a
trace's records: a request may run beside what it shares, or share part of a run of blocks).
Every block a running request holds is known, so the serving loop walks the running requests at
every step (:func:`_walks_blocks`), giving each the block its token starts (:func:`_grow_blocks`)
and the content its token completes; it never runs bare steps. On a replica that caches nothing
(a decode pool's), blocks are only counted, as :class:`._kv.Counters` count them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..._jit import jit
from . import _cache


class Blocks(NamedTuple):
    """KV as vLLM's prefix cache block by block (:mod:`._cache`): the caching replicas' blocks,
    free queues' ends and tables; per request its own blocks' stack (``top``), how many it owns
    and hit, and its cached tokens at its first admission; the content (each request's prompt, the
    content tree, a hash-id trace's ids, tokens per hash id, the key stride) and scratch for a
    request's chain of owners and the blocks it hits."""

    blk: np.ndarray
    ends: np.ndarray
    tab: np.ndarray
    top: np.ndarray
    own: np.ndarray
    hits: np.ndarray
    cached: np.ndarray
    prompt: np.ndarray
    parent: np.ndarray
    shared: np.ndarray
    hash_start: np.ndarray
    hash_ids: np.ndarray
    hash_block: int
    stride: int
    size: int  # table slots per replica (a power of two)
    cnode: np.ndarray
    clo: np.ndarray
    found: np.ndarray
    slot: np.ndarray  # (every -1: a request's hits are found again by their content at its release)
    held: np.ndarray
    slots: np.ndarray


@jit
def _hit_blocks(kv, rep, i, g_i, bt):
    """(blocks of request ``i``'s prompt and ``g_i`` emitted tokens cached on ``rep``, of them
    free); their blocks in ``kv.found``."""
    return _cache.hit(i, g_i, rep * kv.size, kv.size - 1, bt, kv.prompt, kv.parent, kv.shared, kv.hash_start,
                      kv.hash_ids, kv.hash_block, kv.stride, kv.tab, kv.blk, kv.cnode, kv.clo, kv.found)


@jit
def _admit_taking(kv, rep, i, c0, take_n, h, new, bt):
    """Request ``i`` takes the ``h`` blocks it hit (in ``kv.found``) and ``new`` blocks, and
    computes tokens c0..c0 + take_n: the blocks they fill get their content."""
    blk = kv.blk
    for jj in range(h):
        b = kv.found[jj]
        if blk[b, _cache.REF] == 0:
            _cache.unqueue(blk, kv.ends, rep, b)
        blk[b, _cache.REF] += 1
    kv.hits[i] = h
    tb, mask = rep * kv.size, kv.size - 1
    _cache.allocate(i, new, True, rep, kv.top, kv.own, blk, kv.ends, kv.tab, tb, mask)
    _fill_blocks(kv, rep, i, c0, c0 + take_n, bt)


@jit
def _fill_blocks(kv, rep, i, c_old, c_new, bt):
    _cache.fill(i, c_old, c_new, bt, kv.prompt, kv.parent, kv.shared, kv.hash_start, kv.hash_ids, kv.hash_block,
                kv.stride, kv.hits, kv.top, kv.own, kv.blk, kv.tab, rep * kv.size, kv.size - 1, kv.cnode, kv.clo)


@jit
def _grow_blocks_apart(kv, rep, j, count, cj, bt):
    _cache.allocate(j, count, True, rep, kv.top, kv.own, kv.blk, kv.ends, kv.tab, rep * kv.size, kv.size - 1)
    if cj >= 0 and (cj + 1) % bt == 0:  # a decoder's token fills its block
        _fill_blocks(kv, rep, j, cj, cj + 1, bt)


@jit
def _release_blocks(kv, rep, v, bt):
    """Request ``v`` lets go of its blocks, last to first; returns how many joined the free queue."""
    return _cache.release(v, rep, bt, kv.prompt, kv.parent, kv.shared, kv.hash_start, kv.hash_ids, kv.hash_block,
                          kv.stride, kv.hits, kv.top, kv.own, kv.blk, kv.ends, kv.tab, rep * kv.size, kv.size - 1,
                          kv.cnode, kv.clo, kv.slot, kv.held, kv.slots)


def _computed_blocks(kv, cache, rep, i, p_i, g_i, c_i, pre, free, aux, hitting, blocks, bt, kept_i, start_i, cached):
    h = free_hits = 0
    if hitting:
        h, free_hits = _hit_blocks(kv, rep, i, g_i, bt)
    return max(h * bt, c_i, cached), h, free_hits, -1, -1, False, aux


def _cached_blocks_blocks(kv, cache, rep, i, p_i, aux, bt):
    return _hit_blocks(kv, rep, i, 0, bt)[0], aux


def _allocate_blocks(kv, rep, count, free, aux):
    return free - count, aux


def _admit_blocks(kv, cache, rep, i, c0, take_n, h, new, free_hits, s_g, s_p, pre, free, aux, hitting, bt):
    if hitting:
        _admit_taking(kv, rep, i, c0, take_n, h, new, bt)
    if kv.cached[i] < 0:
        kv.cached[i] = c0
    return free - free_hits - new, aux


def _filled_blocks(kv, cache, rep, i, c_old, c_new, hitting, bt):
    if hitting:
        _fill_blocks(kv, rep, i, c_old, c_new, bt)


def _grow_blocks(kv, rep, j, count, cj, hitting, bt):
    if hitting and (count > 0 or (cj >= 0 and (cj + 1) % bt == 0)):  # (a call passes kv's arrays: only when it
        _grow_blocks_apart(kv, rep, j, count, cj, bt)  # has work)


def _free_blocks(kv, cache, rep, v, top, kept, free, aux, hitting, bt):
    if hitting:
        return free + _release_blocks(kv, rep, v, bt), aux
    return free + top, aux


def _walks_blocks(kv, hitting):
    return hitting


def _ordered_blocks(kv):
    return True


def _rehits_blocks(kv, pre):
    return True


def start(c, prompt: np.ndarray, output: np.ndarray, bt: int, replicas: int, blocks: int) -> Blocks:
    """The cache of ``replicas`` caching replicas of ``blocks`` blocks each, every block free,
    over content ``c`` (:class:`fastsim.engine.content.Content`)."""
    n = prompt.size
    blk, ends, tab = _cache.start(replicas, blocks)
    stride = _cache.stride_of(prompt, output, bt)
    depth = _cache.depth(c.parent) + 2
    minus = np.full(n, -1, np.int64)
    return Blocks(blk, ends, tab, minus.copy(), np.zeros(n, np.int64), np.zeros(n, np.int64), minus.copy(), prompt,
                  c.parent, c.shared, c.hash_start, c.hash_ids, c.hash_block, stride, tab.shape[0] // max(replicas, 1),
                  np.empty(depth, np.int64), np.empty(depth, np.int64), np.empty(stride, np.int64), minus,
                  np.empty(0, np.int64), np.zeros(1, np.int64))
