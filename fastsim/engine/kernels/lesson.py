"""The lesson model's kernels (docs/model/lesson.md): every serving-model addition off, the fastest path.

Each kernel is a deterministic function of struct-of-arrays request state; the waiting queue is
the index range ``[qhead, head)`` of the arrival-sorted arrays (requests ``< qhead`` have been
admitted, requests ``>= head`` have not arrived yet). A step costs ``t_weight + t_kv * ctx``.

Two things keep the work per step independent of the batch size:

- ``ctx`` (the KV tokens read by the next step) is a running sum: admission adds the prompt, each
  step adds one token per unfinished member, a departure subtracts what the request held.
- Completions come from the bounded calendar of :mod:`._calendar`, tracked by a wrapping
  ``cursor`` (no integer division in the loop).

And most iterations change nothing but the clock: while nobody can be admitted and nobody
finishes, a tight fast path runs bare steps (2 to 3 ns each here) until the next event. Each
general step and each fast-path run is recorded as a step run for the inter-token latencies, in
the compact layout (the lesson's cost reads C only).
"""

from __future__ import annotations

import numpy as np

from ..._jit import inline, jit, largest
from ._calendar import RING_MAX, batch_step_end, due_now, file, record_compact


@inline
def _steps_until_completion(bucket, cursor, now, ctx, active, t_weight, t_kv):
    """Fast path while nobody can be admitted: run bare steps, stopping before a step that has
    completions. Arrivals meanwhile only lengthen the queue; the next general iteration counts
    them (and records the queue) as if they had been counted step by step.

    Returns the updated (cursor, now, ctx) and the number of steps run.
    """
    m = 0
    while True:
        nxt = cursor + 1 if cursor + 1 < bucket.size else 0
        if bucket[nxt] >= 0:
            return cursor, now, ctx, m
        now += t_weight + t_kv * ctx
        ctx += active
        m += 1
        cursor = nxt


WORK_ROWS = 2  # the kernels' per-request state (the calendar's links and due steps): rows of ``work``


@jit
def continuous(arrival, prompt, output, limit, t_weight, t_kv, first_token, done, runs, work):
    """Continuous (iteration-level) batching.

    Parameters
    ----------
    arrival : float64 (n,)    arrival times in seconds, non-decreasing
    prompt, output : int64 (n,)    prompt and output lengths in tokens (output >= 1)
    limit : int    most sequences running at once
    t_weight, t_kv : float    step time = t_weight + t_kv * ctx seconds
    first_token, done : float64 (n,)    filled with the end times of each request's first and
        last token steps
    runs : COMPACT_RUN (capacity,)    step runs (see :mod:`._calendar`): the kernel returns how
        many it needed
    work : int64 (WORK_ROWS, n + 1)    room for the per-request state, contents left over (a
        caller's scratch: memory reused, not fresh from the system)

    Returns
    -------
    (steps, busy_slot_steps, max_queue, number of runs)
    """
    n = arrival.size
    longest = largest(output)
    ring = min(longest + 1, RING_MAX)
    wraps = longest >= ring
    bucket = np.full(ring, -1, np.int64)  # head of a linked list of requests finishing there
    link = work[0]
    due = work[1]  # the step that emits each request's last token
    cursor = 0  # == steps % ring
    now = 0.0
    head = 0
    qhead = 0
    running = 0
    ctx = 0
    steps = 0
    busy = 0
    max_queue = 0
    nruns = 0
    while qhead < n or running > 0:
        while head < n and arrival[head] <= now:
            head += 1
        admitted = qhead
        take = min(limit - running, head - qhead)
        for i in range(qhead, qhead + take):
            file(bucket, link, due, cursor, steps, i, output[i])
            ctx += prompt[i]
        qhead += take
        running += take
        max_queue = max(max_queue, head - qhead)
        if running == 0:  # idle and nothing queued: jump to the next arrival
            now = arrival[head]
            continue
        d = t_weight + t_kv * ctx
        nruns = record_compact(runs, nruns, ctx, 1, running - (qhead - admitted))
        now += d
        steps += 1
        ctx += running
        busy += running
        for i in range(admitted, qhead):
            first_token[i] = now
        cursor = cursor + 1 if cursor + 1 < ring else 0
        i = due_now(bucket, link, due, cursor, steps, wraps)
        while i >= 0:
            done[i] = now
            ctx -= prompt[i] + output[i]
            running -= 1
            i = link[i]
        # Fast path: run the next iterations in which nobody is admitted and nobody finishes as
        # bare steps, stopping before a step with completions.
        ctx0 = ctx
        m = 0
        if running == limit:  # full: arrivals only lengthen the queue
            cursor, now, ctx, m = _steps_until_completion(bucket, cursor, now, ctx, running, t_weight, t_kv)
        elif running > 0 and qhead == head:  # free slots, empty queue: until the next arrival
            next_arrival = arrival[head] if head < n else np.inf
            while now < next_arrival:
                nxt = cursor + 1 if cursor + 1 < ring else 0
                if bucket[nxt] >= 0:
                    break
                now += t_weight + t_kv * ctx
                ctx += running
                m += 1
                cursor = nxt
        if m > 0:
            steps += m
            busy += m * running
            nruns = record_compact(runs, nruns, ctx0, m, running)
    return steps, busy, max_queue, nruns


@jit
def batched(arrival, prompt, output, limit, window, t_weight, t_kv, first_token, done, runs, work):
    """Static (``window`` = inf) and dynamic batching: a batch runs until its longest member ends.

    Parameters as :func:`_continuous`, plus ``window`` (seconds): a batch also starts once the
    queue head has waited this long. Finished members keep their rows (and KV reads) until the
    batch ends.
    """
    n = arrival.size
    longest = largest(output)
    ring = min(longest + 1, RING_MAX)
    wraps = longest >= ring
    bucket = np.full(ring, -1, np.int64)
    link = work[0]
    due = work[1]
    cursor = 0  # == steps % ring
    now = 0.0
    head = 0
    qhead = 0
    active = 0  # unfinished members of the running batch; 0 means no batch
    batch_lo = 0
    batch_start = 0
    ctx = 0
    steps = 0
    busy = 0
    max_queue = 0
    nruns = 0
    while qhead < n or active > 0:
        while head < n and arrival[head] <= now:
            head += 1
        waiting = head - qhead
        if active == 0 and waiting > 0:
            if waiting >= limit or head == n or now >= arrival[qhead] + window:
                take = min(limit, waiting)
                ctx = 0
                for i in range(qhead, qhead + take):
                    file(bucket, link, due, cursor, steps, i, output[i])
                    ctx += prompt[i]
                batch_lo = qhead
                batch_start = steps
                qhead += take
                active = take
        max_queue = max(max_queue, head - qhead)
        if active == 0:  # idle: jump to the next arrival or the head's window expiry
            nxt = arrival[head] if head < n else np.inf
            if qhead < head:
                nxt = min(nxt, arrival[qhead] + window)
            now = max(now, nxt)
            continue
        first_step = steps == batch_start
        d = t_weight + t_kv * ctx
        nruns = record_compact(runs, nruns, ctx, 1, 0 if first_step else active)
        now, steps, ctx, busy, active, cursor = batch_step_end(now, d, steps, ctx, busy, active, first_step, batch_lo,
                                                               qhead, first_token, done, bucket, link, due, cursor,
                                                               ring, wraps)
        if active > 0:  # nobody is admitted while a batch runs
            ctx0 = ctx
            cursor, now, ctx, m = _steps_until_completion(bucket, cursor, now, ctx, active, t_weight, t_kv)
            if m > 0:
                steps += m
                busy += m * active
                nruns = record_compact(runs, nruns, ctx0, m, active)
    return steps, busy, max_queue, nruns
