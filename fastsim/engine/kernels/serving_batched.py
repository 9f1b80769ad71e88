"""The serving model's static and dynamic batching kernel (docs/model/lesson.md): the lesson's batch rules
with prefill compute, reservations against a KV cache, a shared prefix and the serving step
cost. Only used when a serving-model addition is on (else :mod:`.lesson` runs).
"""

from __future__ import annotations

import numpy as np

from ..._jit import jit, largest
from ...model.cost import step_time, step_time_with, weights_time
from ._calendar import RING_MAX, batch_step_end, file, record
from ._running import cdiv


WORK_ROWS = 2  # the calendar's links and due steps: rows of ``work``


@jit
def batched(arrival, prompt, output, limit, window, k, blocks, bt, pb, fixed, o_max, first_token, done, runs, work):
    """Static (``window`` = inf) and dynamic batching in the serving model.

    A batch takes whole prompts in its first step (no budget), then one token per row per step;
    finished rows stay as padding (one token's compute, their whole KV read) until the batch
    ends. With a KV limit (``blocks`` >= 0) a batch takes the longest run of queue-head requests
    whose reservations (ceil((prompt + o_max) / bt) - pb blocks each, and a hybrid-attention
    model's ``fixed`` ones) fit, and a batch that memory stops from growing counts as full.
    Parameters as :func:`.serve.serve`.

    Returns
    -------
    (steps, busy slot-steps, max_queue, sum over steps of KV blocks in use, peak, number of runs)
    """
    n = arrival.size
    cached = pb * bt
    longest = largest(output)
    ring = min(longest + 1, RING_MAX)
    wraps = longest >= ring
    bucket = np.full(ring, -1, np.int64)
    link = work[0]
    due = work[1]
    cursor = 0
    now = 0.0
    head = 0
    qhead = 0
    active = 0  # unfinished rows of the running batch; 0 means no batch
    rows = 0
    batch_lo = 0
    batch_start = 0
    used = pb
    ctx = 0
    steps = 0
    busy = 0
    max_queue = 0
    kv_sum = 0
    kv_peak = 0
    nruns = 0
    while qhead < n or active > 0:
        while head < n and arrival[head] <= now:
            head += 1
        waiting = head - qhead
        if active == 0 and waiting > 0:
            fit = waiting
            if blocks >= 0:
                fit = 0
                room = blocks - pb
                while fit < waiting and fit < limit:
                    need = cdiv(prompt[qhead + fit] + o_max, bt) - pb + fixed
                    if need > room:
                        break
                    room -= need
                    fit += 1
            take = min(limit, waiting, fit)
            full = waiting >= limit or fit < min(limit, waiting)
            if full or head == n or now >= arrival[qhead] + window:
                ctx = 0
                for i in range(qhead, qhead + take):
                    file(bucket, link, due, cursor, steps, i, output[i])
                    ctx += prompt[i]
                if blocks >= 0:  # the prefix's blocks and every row's reservation
                    used = pb
                    for i in range(qhead, qhead + take):
                        used += cdiv(prompt[i] + o_max, bt) - pb + fixed
                batch_lo = qhead
                batch_start = steps
                qhead += take
                active = take
                rows = take
        max_queue = max(max_queue, head - qhead)
        if active == 0:  # idle: jump to the next arrival or the head's window expiry
            nxt = arrival[head] if head < n else np.inf
            if qhead < head:
                nxt = min(nxt, arrival[qhead] + window)
            now = max(now, nxt)
            continue
        first_step = steps == batch_start
        if first_step:
            n_tok = 0
            pairs = 0
            for i in range(batch_lo, qhead):
                t = prompt[i] - cached
                n_tok += t
                pairs += t * (2 * cached + t + 1) // 2
        else:
            n_tok = rows
            pairs = ctx
        if blocks >= 0:
            kv_sum += used
            kv_peak = max(kv_peak, used)
        d = step_time(k, n_tok, ctx, pairs, active)  # every row but padding emits a token
        nruns = record(runs, nruns, n_tok, ctx, pairs, 1, 0 if first_step else active, active)
        now, steps, ctx, busy, active, cursor = batch_step_end(now, d, steps, ctx, busy, active, first_step, batch_lo,
                                                               qhead, first_token, done, bucket, link, due, cursor,
                                                               ring, wraps)
        if active > 0:  # nobody is admitted while a batch runs: bare steps until a completion
            ctx0, steps0 = ctx, steps
            weights = weights_time(k, rows)
            while True:
                while head < n and arrival[head] <= now:
                    head += 1
                nxt = cursor + 1 if cursor + 1 < ring else 0
                if bucket[nxt] >= 0:
                    break
                now += step_time_with(k, weights, rows, ctx, ctx, active)
                steps += 1
                ctx += active
                busy += active
                cursor = nxt
            m = steps - steps0
            if blocks >= 0:
                kv_sum += used * m
            if m > 0:
                nruns = record(runs, nruns, rows, ctx0, ctx0, m, active, active)
    return steps, busy, max_queue, kv_sum, kv_peak, nruns
