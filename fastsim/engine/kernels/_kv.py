"""The KV cache manager's roles in the serving loop (:mod:`.serve`), compiled apart for each kind of
KV state, so that the loop's source is one (docs/model/serving.md, "The KV cache";
docs/model/prefix-cache.md):

- *counters* (:class:`Counters`): paged blocks counted (or reserved at admission, or unlimited),
  with a pinned shared prefix; under a prefix cache over requests that share nothing (REHIT), a
  preempted request finds again those of its own blocks the free queue has not reached;
- *runs* (:class:`Runs`): vLLM's prefix cache over system prompts and sessions' turns, kept as runs
  of blocks (:mod:`._segments`), one cache per replica, in the array ``cache`` (empty with
  counters) that every role that reads it takes after the state;
- *blocks* (:class:`Blocks`): vLLM's prefix cache block by block (:mod:`._cache`), for content
  shared any way (a trace's records: a request may run beside what it shares, or share part of
  a block run): every block a running request holds is known, so the loop walks the running
  requests at every step (:func:`walks`) and never runs bare steps.

Each role is a function of the KV state first; an ``@overload`` picks the version by the state's
type when the loop is compiled (as :mod:`._calendar` picks a run layout), so a loop over counters
carries none of the cache's code. The roles, named after vLLM's KV cache manager's:

- :func:`computed` (``get_computed_blocks``): at admission, the tokens a request starts with and
  the blocks it hits; :func:`cached_blocks`: a new request's hit on a replica, for routing;
- :func:`allocate` (``allocate_slots``): blocks taken from the free queue (decoders' new blocks, a
  chunk's); :func:`admit`: an admission's hits and new blocks committed;
- :func:`filled`: a row's chunk filled blocks (a system prompt's cached extent grows; blocks get
  their content); :func:`grow`: the blocks a running request was given in a step's walk, and a
  decoder's block its token fills (blocks);
- :func:`free` (``free``, and preemption): a request lets go of its blocks.

The per-replica KV scalars are ``free`` (blocks in the free queue) and ``aux``: for REHIT the
allocations made from the queue's head beyond those ``free`` started with (:func:`own_hit`); for
runs the blocks allocated but not yet taken from the queue's head (settled before the queue is
read). The runs' roles call the cache's operations apart, each behind a wrapper that is inlined:
an inlined helper that branches counts references to the arrays it is given at every call, and a
call costs some nanoseconds for each array it passes (hence one array).
"""

from __future__ import annotations

from typing import NamedTuple

from numba.extending import overload

from ..._jit import inline, jit
from . import _segments as segments
from ._blocks import (Blocks, _admit_blocks, _allocate_blocks, _cached_blocks_blocks, _computed_blocks,
                      _filled_blocks, _free_blocks, _grow_blocks, _ordered_blocks, _rehits_blocks, _walks_blocks)
from ._running import own_hit
from ._segments import A, CACHED, F, GHELD, GROUP, GSEG, HI, HOLDERS, OWNER, PARENT, SID

PAGED, RESERVE, REHIT, WHOLE = range(4)  # counters: paged; reserved at admission; paged under a prefix cache; and
# so for a model with local-attention layers, whose preempted request finds its blocks again all or none


class Counters(NamedTuple):
    """KV as counters: how blocks are held (PAGED, RESERVE, REHIT or WHOLE), the longest output (a
    reservation's), and the blocks each running request holds beyond its tokens' on the
    replicas that cache (WHOLE: a re-hit takes them back too)."""

    mode: int
    o_max: int
    fixed: int = 0


class Runs(NamedTuple):
    """KV as vLLM's prefix cache over system prompts and sessions, as runs of blocks: the cache's
    array's :class:`._segments.Layout`, and the blocks of a system prompt."""

    rows: int
    ends: int
    groups: int
    per_replica: int
    requests: int
    gend: int


@jit
def stopped(ngaps):
    """What the serving loop returns when the runs' bookkeeping cannot follow (the driver then runs
    the cache block by block: :class:`._kv.Blocks`): no counts, ``ngaps`` gaps, stopped."""
    none = (0, 0, 0, 0, 0, 0)
    return none, none, 0, ngaps, True


def _by_kv(role, counters, runs, blocks):
    """Make ``role`` (a module-level function: a closure could not be inlined into a helper that
    is itself inlined) the version for the KV state's type, chosen when the caller is compiled."""

    @overload(role, inline="always", strict=False)
    def _typed(kv, *args):
        kind = getattr(kv, "instance_class", None)
        return runs if kind is Runs else blocks if kind is Blocks else counters


# ---- counters ----

def _computed_counters(kv, cache, rep, i, p_i, g_i, c_i, pre, free, aux, hitting, blocks, bt,
                       kept_i, start_i, cached):
    c0 = (own_hit(kept_i, start_i, blocks + aux - free, bt, kv.mode == WHOLE) if kv.mode >= REHIT and pre
          else max(c_i, cached))
    return c0, 0, 0, -1, -1, False, aux


def _cached_blocks_counters(kv, cache, rep, i, p_i, aux, bt):
    return 0, aux


def _allocate_counters(kv, rep, count, free, aux):
    return free - count, aux


def _admit_counters(kv, cache, rep, i, c0, take_n, h, new, free_hits, s_g, s_p, pre, free, aux,
                    hitting, bt):
    return free - new, aux - (c0 // bt + kv.fixed * (c0 > 0)) * (kv.mode >= REHIT and pre)  # (its hits leave the
    # queue, and WHOLE's fixed blocks with them; a product,
    # not a branch: Numba's inliner warns of a branch's value)


def _filled_counters(kv, cache, rep, i, c_old, c_new, hitting, bt):
    return None


def _grow_counters(kv, rep, j, count, cj, hitting, bt):
    return None


def _walks_counters(kv, hitting):
    return False


def _free_counters(kv, cache, rep, v, top, kept, free, aux, hitting, bt):
    return free + top, aux + top * (kv.mode >= REHIT)  # (a product, as above)


# ---- runs (the prefix cache over system prompts and sessions) ----

@inline
def _settle(kv, cache, rep, aux):
    """The blocks allocated since the queue was last read leave its head (taken in the order
    they were allocated, so evictions are as if made one by one); returns 0."""
    if aux > 0:
        segments.evict(cache, kv, rep, aux)
    return aux - aux


@inline
def _path(kv, cache, rep, i):
    """The segment of replica ``rep`` that holds request ``i``'s path above its system prompt: its
    own last release there (after a preemption), else its nearest earlier turn's that ran there
    (-1: none)."""
    lo = rep * kv.rows
    a = i
    while a >= 0:
        s = cache[kv.requests + a, SID]
        if s >= lo and s < lo + kv.rows and cache[s, OWNER] == a:
            return s
        a = cache[kv.requests + a, PARENT]
    return -1


@jit
def _computed_cache(kv, cache, rep, i, p_i, g_i, c_i, hitting, bt, aux):
    """(tokens it starts with, blocks hit, of them free, its system prompt's segment and its
    path's segment to take, whether the cache's bookkeeping cannot follow, aux)."""
    aux = _settle(kv, cache, rep, aux)  # the queue as of now: hits read it
    h = free_hits = 0
    s_g = s_p = -1
    gi = cache[kv.requests + i, GROUP] if hitting else -1
    if gi >= 0:
        row = kv.groups + rep * kv.per_replica + gi
        h = cache[row, HI]
        if h < kv.gend and cache[row, HOLDERS] > 0:  # another still computes it (the rules keep this from
            return 0, 0, 0, -1, -1, True, aux  # happening: a chunk completes it or takes the step's budget)
        if cache[row, HOLDERS] == 0 and h > 0:
            s_g = cache[row, GSEG]
            free_hits = h
    if hitting and (gi < 0 or h == kv.gend):
        s = _path(kv, cache, rep, i)
        if s >= 0 and cache[s, A] <= h < cache[s, F]:
            top = min(cache[s, F], (p_i + g_i - 1) // bt)
            if top < cache[s, F]:  # its last block would be recomputed beside a cached one
                return 0, 0, 0, -1, -1, True, aux
            if top > h:
                free_hits += top - h
                h = top
                s_p = s
    return max(h * bt, c_i), h, free_hits, s_g, s_p, False, aux


@jit
def _cached_blocks_cache(kv, cache, rep, i, p_i, aux, bt):
    """Blocks of request ``i``'s prompt ``p_i`` cached on replica ``rep`` (as a new request: its
    last token is always computed)."""
    aux = _settle(kv, cache, rep, aux)
    h = 0
    gi = cache[kv.requests + i, GROUP]
    if gi >= 0:
        h = cache[kv.groups + rep * kv.per_replica + gi, HI]
    if gi < 0 or h == kv.gend:
        s = _path(kv, cache, rep, i)
        if s >= 0 and cache[s, A] <= h < cache[s, F]:
            h = max(h, min(cache[s, F], (p_i - 1) // bt))
    return h, aux


@jit
def _filled_cache(kv, cache, rep, i, c_new, hitting, bt):
    """Request ``i``'s computed tokens reach ``c_new``: its system prompt's cached extent grows
    with them while it fills it."""
    gi = cache[kv.requests + i, GROUP] if hitting else -1
    if gi >= 0:
        row = kv.groups + rep * kv.per_replica + gi
        if cache[row, HI] < kv.gend:
            cache[row, HI] = max(cache[row, HI], min(kv.gend, c_new // bt))


@jit
def _admit_cache(kv, cache, rep, i, c0, take_n, h, s_g, s_p, hitting, bt):
    gi = cache[kv.requests + i, GROUP] if hitting else -1
    if gi >= 0 and kv.gend > 0:
        row = kv.groups + rep * kv.per_replica + gi
        cache[kv.requests + i, GHELD] = 1
        cache[row, HOLDERS] += 1
        if s_g >= 0:
            cache[row, GSEG] = -1
            if s_g != s_p:
                segments.take(cache, kv, rep, s_g, min(cache[row, HI], kv.gend))
    if s_p >= 0:
        segments.take(cache, kv, rep, s_p, h)
    if cache[kv.requests + i, CACHED] < 0:
        cache[kv.requests + i, CACHED] = c0
    _filled_cache(kv, cache, rep, i, c0 + take_n, hitting, bt)


@jit
def _free_cache(kv, cache, rep, v, top, kept, aux, hitting, bt):
    """(blocks that joined the free queue, aux)"""
    aux = _settle(kv, cache, rep, aux)
    return segments.release(cache, kv, rep, v, top, kept // bt, kv.gend, hitting), aux


def _computed_runs(kv, cache, rep, i, p_i, g_i, c_i, pre, free, aux, hitting, blocks, bt, kept_i, start_i, cached):
    return _computed_cache(kv, cache, rep, i, p_i, g_i, c_i, hitting, bt, aux)


def _cached_blocks_runs(kv, cache, rep, i, p_i, aux, bt):
    return _cached_blocks_cache(kv, cache, rep, i, p_i, aux, bt)


def _allocate_runs(kv, rep, count, free, aux):
    return free - count, aux + count


def _admit_runs(kv, cache, rep, i, c0, take_n, h, new, free_hits, s_g, s_p, pre, free, aux, hitting, bt):
    _admit_cache(kv, cache, rep, i, c0, take_n, h, s_g, s_p, hitting, bt)
    return free - free_hits - new, aux + new


def _filled_runs(kv, cache, rep, i, c_old, c_new, hitting, bt):
    _filled_cache(kv, cache, rep, i, c_new, hitting, bt)


def _free_runs(kv, cache, rep, v, top, kept, free, aux, hitting, bt):
    gone, aux = _free_cache(kv, cache, rep, v, top, kept, aux, hitting, bt)
    return free + gone, aux


def _walks_runs(kv, hitting):
    return False


def _ordered_counters(kv):
    return False


def _ordered_runs(kv):
    return True


def _rehits_counters(kv, pre):
    return kv.mode >= REHIT and pre


def _rehits_runs(kv, pre):
    return True


# ---- the roles ----

def computed(kv, cache, rep, i, p_i, g_i, c_i, pre, free, aux, hitting, blocks, bt, kept_i, start_i, cached):
    """-> (c0 tokens it starts with, h blocks hit, of them free, s_g, s_p, stop, aux): request ``i``
    at the head of replica ``rep``'s queue, prompt ``p_i``, ``g_i`` tokens emitted, ``c_i``
    computed (``pre``: preempted, with ``kept_i`` tokens when it was, its blocks joining the free
    queue after ``start_i`` allocations: :func:`own_hit`; ``cached``: a pinned prefix's tokens)."""


def cached_blocks(kv, cache, rep, i, p_i, aux, bt):
    """-> (blocks of new request ``i``'s prompt cached on ``rep``, aux)."""


def allocate(kv, rep, count, free, aux):
    """-> (free, aux): ``count`` blocks taken from the free queue."""


def admit(kv, cache, rep, i, c0, take_n, h, new, free_hits, s_g, s_p, pre, free, aux, hitting, bt):
    """-> (free, aux): request ``i`` admitted with its hits and ``new`` blocks."""


def filled(kv, cache, rep, i, c_old, c_new, hitting, bt):
    """A running row's chunk brought it from ``c_old`` to ``c_new`` tokens."""


def grow(kv, rep, j, count, cj, hitting, bt):
    """Running request ``j`` was given ``count`` blocks in a step's walk (:func:`walks`);
    ``cj``: a decoder's tokens computed before the step (-1: the partial row, whose chunk
    :func:`filled` follows)."""


def walks(kv, hitting):
    """-> whether every step walks the running requests, giving each its blocks
    (:func:`grow`), on a replica that caches (``hitting``): bare steps never run."""


def free(kv, cache, rep, v, top, kept, free, aux, hitting, bt):
    """-> (free, aux): request ``v`` lets go of its ``top`` blocks (beyond a pinned prefix),
    ``kept`` tokens computed."""


def ordered(kv):
    """-> whether completions must release their blocks in running order (a cache's free queue
    keeps the order; counters do not)."""


def rehits(kv, pre):
    """-> whether the queue's head (``pre``: preempted) finds blocks cached at admission, which
    change as blocks are taken (bare steps cannot run past it)."""


for _role, _counters, _runs, _blocks in (
        (computed, _computed_counters, _computed_runs, _computed_blocks),
        (cached_blocks, _cached_blocks_counters, _cached_blocks_runs, _cached_blocks_blocks),
        (allocate, _allocate_counters, _allocate_runs, _allocate_blocks),
        (admit, _admit_counters, _admit_runs, _admit_blocks),
        (filled, _filled_counters, _filled_runs, _filled_blocks),
        (grow, _grow_counters, _grow_counters, _grow_blocks),
        (free, _free_counters, _free_runs, _free_blocks),
        (walks, _walks_counters, _walks_runs, _walks_blocks),
        (ordered, _ordered_counters, _ordered_runs, _ordered_blocks),
        (rehits, _rehits_counters, _rehits_runs, _rehits_blocks)):
    _by_kv(_role, _counters, _runs, _blocks)
