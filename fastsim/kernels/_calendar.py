"""Helpers the kernels share: the bounded completion calendar and the record of step runs
from which inter-token latencies are computed.

Completion calendar: a request whose last token comes at step ``due`` (the value of the step
counter after that step) is filed in bucket ``due % ring``; each step visits its own bucket and
takes the members due then. ``ring`` is capped at ``RING_MAX``, so its memory never grows with
the longest output: a request due ``ring`` or more steps ahead stays filed through whole turns.

Step runs (``runs``, int64 (capacity, 4)): each row is a run of ``m`` consecutive steps, with
columns (C, A, N << 32 | w, m): the first step computes N tokens, reads C KV tokens and forms A
query-key pairs; each further step reads w more tokens and forms w more pairs with the same N
(the w requests that emit a token one step after their previous one are the ones whose context
grows); and in each step those ``w`` requests see a gap of exactly that step's duration.
Inter-token latencies are those step durations, ``w`` times each (recomputed from the step-time
formula), plus the irregular gaps of requests that skipped steps (recorded as values).
"""

from __future__ import annotations

import numpy as np

from .._jit import inline

RING_MAX = 1 << 16  # calendar buckets at most (512 KiB)
RUN_COLUMNS = 4


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
def due_now(bucket, link, due, cursor, steps):
    """Unlink and return the members of bucket ``cursor`` due at step ``steps``, as a linked
    list (-1 ends it); members due in a later turn of the ring stay filed."""
    first = -1
    keep = -1
    i = bucket[cursor]
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


def new_runs(capacity: int) -> np.ndarray:
    return np.empty((capacity, RUN_COLUMNS), np.int64)


@inline
def record(runs, count, n_tokens, kv_tokens, pairs, m, w):
    """Append a run of ``m`` steps (see the module docstring), extending the last run when this
    one continues it; returns the new count of runs. Past the array's capacity it only counts
    (the driver then runs the kernel again with room for them all: the array is never
    reallocated inside a kernel's loop)."""
    if m <= 0 or w <= 0:
        return count
    if count > runs.shape[0]:
        return count + 1
    nw = (n_tokens << 32) | w
    if count > 0:  # element access only: a row view would cost reference counting
        p = count - 1
        if runs[p, 2] == nw and runs[p, 0] + runs[p, 3] * w == kv_tokens and runs[p, 1] + runs[p, 3] * w == pairs:
            runs[p, 3] += m
            return count
    if count == runs.shape[0]:
        return count + 1
    runs[count, 0] = kv_tokens
    runs[count, 1] = pairs
    runs[count, 2] = nw
    runs[count, 3] = m
    return count + 1
