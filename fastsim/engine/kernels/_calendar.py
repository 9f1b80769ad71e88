"""Helpers the kernels share: the bounded completion calendar and the record of step runs
from which inter-token latencies are computed.

Completion calendar: a request whose last token comes at step ``due`` (the value of the step
counter after that step) is filed in bucket ``due % ring``; each step visits its own bucket and
takes the members due then. ``ring`` is capped at ``RING_MAX``, so its memory never grows with
the longest output: a request due ``ring`` or more steps ahead stays filed through whole turns.
Only when some output is that long (the ring ``wraps``) does a visit check each member's due
step: the check is a random read per completion, which measured 10-15 % of the lesson's
continuous kernel.

Step runs: each is a run of ``m`` consecutive steps. Its first step computes N tokens, reads C
KV tokens and forms A query-key pairs; each further step reads w more tokens and forms w more
pairs with the same N (the w requests that emit a token one step after their previous one are the
ones whose context grows); and in each step those ``w`` requests see a gap of exactly that step's
duration. Inter-token latencies are those step durations, ``w`` times each (recomputed from the
step-time formula), plus the irregular gaps of requests that skipped steps (recorded as values).
Two layouts:

- full (the serving model): int64 (r, 5), rows (C, A, N << 32 | w, m, S), S the rows that emit
  a token in each step (the LM head's work: w plus any prefill that completes);
- compact (the lesson model, where N is 0 and A is C): ``COMPACT_RUN`` (r,), records
  (kv = C, wm = w << 32 | m): half the bytes to write and to read back, which is most of what
  recording costs a kernel.

:func:`run_w`, :func:`run_m` and :func:`run_step` read either, :func:`run_copy` copies a run
between two arrays of one layout; Numba compiles them to the one layout a caller's array has (a
branch on the layout at run time made the ITL pass 2.5 times slower).
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import overload

from ..._jit import inline

RING_MAX = 1 << 16  # calendar buckets at most (512 KiB)
FULL_COLUMNS = 5
COMPACT_RUN = np.dtype([("kv", np.int64), ("wm", np.int64)], align=True)
LOW = 0xFFFFFFFF  # the low 32 bits


@inline
def file(bucket, link, due, cursor, steps, i, steps_left):
    """File request ``i`` in the completion calendar: it finishes ``steps_left`` steps after
    step ``steps``, whose bucket is ``cursor``."""
    due[i] = steps + steps_left
    if steps_left >= bucket.size:
        steps_left %= bucket.size
    b = cursor + steps_left
    b = b - bucket.size if b >= bucket.size else b
    link[i] = bucket[b]
    bucket[b] = i


@inline
def due_now(bucket, link, due, cursor, steps, wraps):
    """Unlink and return the members of bucket ``cursor`` due at step ``steps``, as a linked
    list (-1 ends it); members due in a later turn of the ring stay filed. Unless the ring
    ``wraps`` (some request is due a whole ring or more ahead), every member is due now."""
    first = bucket[cursor]
    if not wraps:
        bucket[cursor] = -1
        return first
    keep = -1
    i = first
    first = -1
    while i >= 0:
        nxt = link[i]
        if due[i] == steps:
            link[i] = first
            first = i
        else:
            link[i] = keep
            keep = i
        i = nxt
    bucket[cursor] = keep
    return first


@inline
def batch_step_end(now, d, steps, ctx, busy, active, first_step, batch_lo, qhead, first_token, done, bucket, link,
                   due, cursor, ring, wraps):
    """A static or dynamic batch's step of ``d`` seconds ends: the clock, the step count, the
    batch's context and busy slots advance; on its first step the batch (requests ``batch_lo``
    to ``qhead``) gets its first token; the calendar's cursor moves on and the requests due
    complete. Returns (now, steps, ctx, busy, active, cursor)."""
    now += d
    steps += 1
    ctx += active
    busy += active
    if first_step:
        for i in range(batch_lo, qhead):
            first_token[i] = now
    cursor = cursor + 1 if cursor + 1 < ring else 0
    i = due_now(bucket, link, due, cursor, steps, wraps)
    while i >= 0:
        done[i] = now
        active -= 1
        i = link[i]
    return now, steps, ctx, busy, active, cursor


def run_lengths(runs: np.ndarray) -> np.ndarray:
    """m of every run."""
    return runs["wm"] & LOW if runs.dtype == COMPACT_RUN else runs[:, 3]


# Element access only: a row view of the full layout would cost reference counting.
def _w_compact(runs, r):
    return runs[r]["wm"] >> 32


def _w_full(runs, r):
    return runs[r, 2] & LOW


def _m_compact(runs, r):
    return runs[r]["wm"] & LOW


def _m_full(runs, r):
    return runs[r, 3]


def _step_compact(runs, r, j):
    w = runs[r]["wm"] >> 32
    kv = runs[r]["kv"] + j * w
    return 0, kv, kv, w


def _step_full(runs, r, j):
    extra = j * (runs[r, 2] & LOW)
    return runs[r, 2] >> 32, runs[r, 0] + extra, runs[r, 1] + extra, runs[r, 4]


def _copy_compact(dst, i, t, src, r):
    dst[i, t] = src[r]


def _copy_full(dst, i, t, src, r):
    for col in range(FULL_COLUMNS):
        dst[i, t, col] = src[r, col]


def _by_layout(compact, full):
    """An accessor of (runs, ...) for either layout, chosen by the first argument's type; in a
    kernel, Numba compiles only the one the array's type is."""

    def accessor(runs, r, *j):
        return (compact if runs.dtype == COMPACT_RUN else full)(runs, r, *j)

    @overload(accessor, inline="always", strict=False)  # strict: the signatures would have to match
    def _typed(runs, r, *j):
        return compact if isinstance(runs.dtype, types.Record) else full

    return accessor


run_w = _by_layout(_w_compact, _w_full)  # w of run r
run_m = _by_layout(_m_compact, _m_full)  # m of run r
run_step = _by_layout(_step_compact, _step_full)  # (N, C, A, S) of step j of run r
run_copy = _by_layout(_copy_compact, _copy_full)  # (dst, i, t, src, r): dst[i, t] = run r of src (one layout)


@inline
def record(runs, count, n_tokens, kv_tokens, pairs, m, w, s):
    """Append a run of ``m`` steps to full-layout ``runs``, extending the last run when this one
    continues it; returns the new count of runs. Past the array's capacity it only counts (the
    driver then runs the kernel again with room for them all: the array is never reallocated
    inside a kernel's loop)."""
    if m <= 0 or w <= 0:
        return count
    if count > runs.shape[0]:
        return count + 1
    nw = (n_tokens << 32) | w
    if count > 0:
        p = count - 1
        if (runs[p, 2] == nw and runs[p, 4] == s and runs[p, 0] + runs[p, 3] * w == kv_tokens
                and runs[p, 1] + runs[p, 3] * w == pairs):
            runs[p, 3] += m
            return count
    if count == runs.shape[0]:
        return count + 1
    runs[count, 0] = kv_tokens
    runs[count, 1] = pairs
    runs[count, 2] = nw
    runs[count, 3] = m
    runs[count, 4] = s
    return count + 1


@inline
def record_compact(runs, count, kv_tokens, m, w):
    """:func:`record` for compact-layout ``runs`` (N = 0, A = C). A run longer than 2**32 - 1
    steps takes several rows."""
    if m <= 0 or w <= 0:
        return count
    if count > runs.shape[0]:
        return count + 1
    if count > 0:
        last = runs[count - 1]
        if last["wm"] >> 32 == w and last["kv"] + (last["wm"] & LOW) * w == kv_tokens and (last["wm"] & LOW) + m <= LOW:
            last["wm"] += m
            return count
    while True:  # one row, or several for a run of more than 2**32 - 1 steps (never in practice)
        part = min(m, LOW)
        if count < runs.shape[0]:
            row = runs[count]
            row["kv"] = kv_tokens
            row["wm"] = (w << 32) | part
        count += 1
        m -= part
        if m == 0:
            return count
        kv_tokens += part * w


@inline
def extend_run(runs, nruns, run_kv, run_pairs, run_nw, run_m, run_s, n_tok, kv_tok, pairs, m, w, s):
    """A replica's run of ``m`` steps (as :func:`record` takes one) extends its open run (kept by
    the caller, so that replicas' runs do not interleave) when it continues it; else the open run
    is written to ``runs`` and this one opens.
    Returns (nruns, and the open run: kv, pairs, N << 32 | w, m, S)."""
    if m <= 0 or w <= 0:
        return nruns, run_kv, run_pairs, run_nw, run_m, run_s
    nw = (n_tok << 32) | w
    if run_m > 0 and run_nw == nw and run_s == s and run_kv + run_m * w == kv_tok and run_pairs + run_m * w == pairs:
        return nruns, run_kv, run_pairs, run_nw, run_m + m, run_s
    nruns = record(runs, nruns, run_nw >> 32, run_kv, run_pairs, run_m, run_nw & LOW, run_s)
    return nruns, kv_tok, pairs, nw, m, s


@inline
def totals(st, runs, nruns, counts, open_run):
    """A pool kernel's end: each replica's open step run written out, then the totals over
    replicas. ``st``: per-replica scalars, whose columns from ``counts`` are steps, busy
    slot-steps, max_queue, preemptions, KV block-steps and peak KV blocks, and from ``open_run``
    the open run (kv, pairs, N << 32 | w, m, S). Returns what the kernel returns: (steps, busy,
    max_queue, preemptions, KV block-steps, peak KV blocks, runs)."""
    steps = busy = max_queue = preemptions = kv_sum = kv_peak = 0
    for r in range(st.shape[0]):
        nw = st[r, open_run + 2]
        nruns = record(runs, nruns, nw >> 32, st[r, open_run], st[r, open_run + 1], st[r, open_run + 3], nw & LOW,
                       st[r, open_run + 4])
        steps += st[r, counts]
        busy += st[r, counts + 1]
        max_queue = max(max_queue, st[r, counts + 2])
        preemptions += st[r, counts + 3]
        kv_sum += st[r, counts + 4]
        kv_peak = max(kv_peak, st[r, counts + 5])
    return steps, busy, max_queue, preemptions, kv_sum, kv_peak, nruns
