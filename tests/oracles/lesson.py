"""A deliberately simple pure-Python simulator of the lesson's model (docs/model/lesson.md): the test oracle.

It follows the written rules literally, with Python lists for the queue and the running batch and
a full scan of every running sequence each step. It is slow and obviously correct; the fast kernels
must agree with it exactly.
"""

from __future__ import annotations

import math


def simulate(arrival, prompt, output, policy, limit, window_s, t_weight, t_kv):
    """Returns (first_token, done, steps, busy_slot_steps, max_queue)."""
    n = len(arrival)
    generated = [0] * n
    first_token = [None] * n
    done = [None] * n
    now, steps, busy, max_queue = 0.0, 0, 0, 0
    nxt_arrival = 0
    queue: list[int] = []
    running: list[int] = []
    while nxt_arrival < n or queue or running:
        # 1. arrivals join the queue
        while nxt_arrival < n and arrival[nxt_arrival] <= now:
            queue.append(nxt_arrival)
            nxt_arrival += 1
        no_more = nxt_arrival == n
        # 2. admission
        if policy == "continuous":
            while queue and len(running) < limit:
                running.append(queue.pop(0))
        elif not running and queue:
            full = len(queue) >= limit
            waited = policy == "dynamic" and now >= arrival[queue[0]] + window_s
            if full or no_more or waited:
                running, queue = queue[:limit], queue[limit:]
        max_queue = max(max_queue, len(queue))
        # 3. idle: jump to the next event
        if not running:
            events = [] if no_more else [arrival[nxt_arrival]]
            if policy == "dynamic" and queue:
                events.append(arrival[queue[0]] + window_s)
            now = max(now, min(events))
            continue
        # 4. one step; finished members of a static/dynamic batch still cost their KV read
        ctx = sum(prompt[r] + generated[r] for r in running)
        now += t_weight + t_kv * ctx
        steps += 1
        # 5. every unfinished member emits a token
        for r in running:
            if done[r] is None:
                busy += 1
                generated[r] += 1
                if generated[r] == 1:
                    first_token[r] = now
                if generated[r] == output[r]:
                    done[r] = now
        # 6. departures
        if policy == "continuous":
            running = [r for r in running if done[r] is None]
        elif all(done[r] is not None for r in running):
            running = []
    return first_token, done, steps, busy, max_queue


def quantile(values, p):
    xs = sorted(values)
    return xs[min(len(xs) - 1, math.floor(p * len(xs)))] if xs else math.nan
