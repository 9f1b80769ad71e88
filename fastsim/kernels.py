"""Step-loop kernels for the batching policies, and the registry that picks one.

Semantics are DESIGN.md's lesson model. Each kernel is a deterministic function of struct-of-arrays
request state; the waiting queue is the index range ``[qhead, head)`` of the arrival-sorted arrays
(requests ``< qhead`` have been admitted, requests ``>= head`` have not arrived yet).

Two things keep the work per step independent of the batch size:

- ``ctx`` (the KV tokens read by the next step) is a running sum: admission adds the prompt, each
  step adds one token per unfinished member, a departure subtracts what the request held.
- Completions come from a calendar: a request admitted after step ``s`` emits its last token at
  step ``due = s + output``, so it is filed in bucket ``due % ring``; each step visits only its own
  bucket and finishes the members due then. ``ring`` is ``max(output) + 1`` capped at
  ``RING_MAX``, so the calendar's memory never grows with the longest output: a request due
  ``ring`` or more steps ahead waits in its bucket through whole turns of the ring. The bucket of
  the current step is tracked as a wrapping ``cursor`` (no integer division in the loop).

And most iterations change nothing but the clock: while nobody can be admitted and nobody
finishes, a tight fast path runs bare steps (about 4 ns each here) until the next event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ._jit import inline, jit
from .config import Config
from .traffic import Traffic


RING_MAX = 1 << 16  # calendar buckets at most (512 KiB)


@inline
def _file(bucket, link, due, cursor, steps, i, steps_left):
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
def _due_now(bucket, link, due, cursor, steps):
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


@inline
def _steps_until_completion(arrival, head, bucket, cursor, now, steps, ctx, busy, active, t_weight, t_kv):
    """Fast path while nobody can be admitted: run the loop's next iterations as bare steps
    (arrivals only lengthen the queue), stopping before a step that has completions. The next
    general iteration then records the queue.

    Returns the updated (head, cursor, now, steps, ctx, busy).
    """
    n = arrival.size
    while True:
        while head < n and arrival[head] <= now:
            head += 1
        nxt = cursor + 1 if cursor + 1 < bucket.size else 0
        if bucket[nxt] >= 0:
            return head, cursor, now, steps, ctx, busy
        now += t_weight + t_kv * ctx
        steps += 1
        ctx += active
        busy += active
        cursor = nxt


@jit
def _continuous(arrival, prompt, output, limit, t_weight, t_kv, first_token, done):
    """Continuous (iteration-level) batching.

    Parameters
    ----------
    arrival : float64 (n,)    arrival times in seconds, non-decreasing
    prompt, output : int64 (n,)    prompt and output lengths in tokens (output >= 1)
    limit : int    most sequences running at once
    t_weight, t_kv : float    step time = t_weight + t_kv * ctx seconds
    first_token, done : float64 (n,)    filled with the end times of each request's first and
        last token steps

    Returns
    -------
    (steps, busy_slot_steps, max_queue)
    """
    n = arrival.size
    ring = min(output.max() + 1, RING_MAX)
    bucket = np.full(ring, -1, np.int64)  # head of a linked list of requests finishing there
    link = np.empty(n, np.int64)
    due = np.empty(n, np.int64)  # the step that emits each request's last token
    cursor = 0  # == steps % ring
    now = 0.0
    head = 0
    qhead = 0
    running = 0
    ctx = 0
    steps = 0
    busy = 0
    max_queue = 0
    while qhead < n or running > 0:
        while head < n and arrival[head] <= now:
            head += 1
        admitted = qhead
        take = min(limit - running, head - qhead)
        for i in range(qhead, qhead + take):
            _file(bucket, link, due, cursor, steps, i, output[i])
            ctx += prompt[i]
        qhead += take
        running += take
        max_queue = max(max_queue, head - qhead)
        if running == 0:  # idle and nothing queued: jump to the next arrival
            now = arrival[head]
            continue
        now += t_weight + t_kv * ctx
        steps += 1
        ctx += running
        busy += running
        for i in range(admitted, qhead):
            first_token[i] = now
        cursor = cursor + 1 if cursor + 1 < ring else 0
        i = _due_now(bucket, link, due, cursor, steps)
        while i >= 0:
            done[i] = now
            ctx -= prompt[i] + output[i]
            running -= 1
            i = link[i]
        # Fast path: run the next iterations in which nobody is admitted and nobody finishes as
        # bare steps, stopping before a step with completions.
        if running == limit:  # full: arrivals only lengthen the queue
            head, cursor, now, steps, ctx, busy = _steps_until_completion(
                arrival, head, bucket, cursor, now, steps, ctx, busy, running, t_weight, t_kv
            )
        elif running > 0 and qhead == head:  # free slots, empty queue: until the next arrival
            next_arrival = arrival[head] if head < n else np.inf
            while now < next_arrival:
                nxt = cursor + 1 if cursor + 1 < ring else 0
                if bucket[nxt] >= 0:
                    break
                now += t_weight + t_kv * ctx
                steps += 1
                ctx += running
                busy += running
                cursor = nxt
    return steps, busy, max_queue


@jit
def _batched(arrival, prompt, output, limit, window, t_weight, t_kv, first_token, done):
    """Static (``window`` = inf) and dynamic batching: a batch runs until its longest member ends.

    Parameters as :func:`_continuous`, plus ``window`` (seconds): a batch also starts once the
    queue head has waited this long. Finished members keep their rows (and KV reads) until the
    batch ends.
    """
    n = arrival.size
    ring = min(output.max() + 1, RING_MAX)
    bucket = np.full(ring, -1, np.int64)
    link = np.empty(n, np.int64)
    due = np.empty(n, np.int64)
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
    while qhead < n or active > 0:
        while head < n and arrival[head] <= now:
            head += 1
        waiting = head - qhead
        if active == 0 and waiting > 0:
            if waiting >= limit or head == n or now >= arrival[qhead] + window:
                take = min(limit, waiting)
                ctx = 0
                for i in range(qhead, qhead + take):
                    _file(bucket, link, due, cursor, steps, i, output[i])
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
        now += t_weight + t_kv * ctx
        steps += 1
        ctx += active
        busy += active
        if steps == batch_start + 1:
            for i in range(batch_lo, qhead):
                first_token[i] = now
        cursor = cursor + 1 if cursor + 1 < ring else 0
        i = _due_now(bucket, link, due, cursor, steps)
        while i >= 0:
            done[i] = now
            active -= 1
            i = link[i]
        if active > 0:  # nobody is admitted while a batch runs
            head, cursor, now, steps, ctx, busy = _steps_until_completion(
                arrival, head, bucket, cursor, now, steps, ctx, busy, active, t_weight, t_kv
            )
    return steps, busy, max_queue


@dataclass(frozen=True)
class Outcome:
    """What a kernel produces for one scenario."""

    first_token_s: np.ndarray  # float64 (n,)
    done_s: np.ndarray  # float64 (n,)
    steps: int
    busy_slot_steps: int
    max_queue: int


def _run_continuous(tr: Traffic, limit: int, window_s: float, t_weight: float, t_kv: float, ft, done):
    return _continuous(tr.arrival_s, tr.prompt_tokens, tr.output_tokens, limit, t_weight, t_kv, ft, done)


def _run_static(tr: Traffic, limit: int, window_s: float, t_weight: float, t_kv: float, ft, done):
    return _batched(tr.arrival_s, tr.prompt_tokens, tr.output_tokens, limit, np.inf, t_weight, t_kv, ft, done)


def _run_dynamic(tr: Traffic, limit: int, window_s: float, t_weight: float, t_kv: float, ft, done):
    return _batched(tr.arrival_s, tr.prompt_tokens, tr.output_tokens, limit, window_s, t_weight, t_kv, ft, done)


POLICIES: dict[str, Callable] = {
    "static": _run_static,
    "dynamic": _run_dynamic,
    "continuous": _run_continuous,
}
"""Policy name -> kernel runner; config validation checks ``engine.policy`` against these keys."""


def step_time_coefficients(config: Config) -> tuple[float, float]:
    """(seconds per step for the weights read, seconds per KV token read): the roofline."""
    bandwidth = config.hardware.mem_bandwidth_tb_s * 1e12  # bytes/s
    return config.model.weight_gb * 1e9 / bandwidth, config.model.kv_bytes_per_token / bandwidth


def run(config: Config, traffic: Traffic) -> Outcome:
    """Simulate ``traffic`` on the engine ``config`` describes."""
    n = len(traffic)
    first_token = np.empty(n)
    done = np.empty(n)
    t_weight, t_kv = step_time_coefficients(config)
    e = config.engine
    steps, busy, max_queue = POLICIES[e.policy](traffic, e.limit, e.window_ms / 1000, t_weight, t_kv, first_token, done)
    return Outcome(first_token, done, int(steps), int(busy), int(max_queue))
