"""A deliberately simple pure-Python simulator of DESIGN.md's serving model: the second oracle.

Python lists for the waiting queue and the running batch, per-request token counters, a full
scan of every scheduled row each step and every token's gap stored. It follows the written rules
literally (token accounting, running first with preemption of the newest, admission only when
nobody was preempted, reservations, the shared prefix, the step-time formula) and is slow and
obviously correct; the fast kernels and metrics must agree with it exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Engine:
    policy: str  # static | dynamic | continuous
    limit: int
    window_s: float  # dynamic only (inf otherwise)
    budget: float  # tokens per step (inf: unlimited)
    blocks: int | None  # KV cache blocks (None: unlimited)
    block_tokens: int
    alloc: str  # paged | reserve
    prefix_blocks: int  # pinned by the shared prefix
    max_output: int  # the longest output the workload can produce
    k: tuple  # (overhead, t_weights, t_kv, t_token, t_pair, t_link, t_link_token)
    api_s: float


def step_time(k, n_tokens, kv_tokens, pairs):
    # the same formula and operation order as DESIGN (written out again, not imported)
    memory = k[1] + k[2] * kv_tokens
    compute = k[3] * n_tokens + k[4] * pairs
    return k[0] + max(memory, compute) + (k[5] + k[6] * n_tokens)


def simulate(arrival, prompt, output, e: Engine):
    """Returns a dict: first_token, done (lists), steps, busy, max_queue, preemptions,
    kv_used (blocks in use during each step, or None), gaps (every inter-token gap)."""
    n = len(arrival)
    bt = e.block_tokens
    cached = e.prefix_blocks * bt  # tokens every admission starts with
    g = [0] * n  # tokens emitted
    c = [0] * n  # tokens whose KV exists
    held = [0] * n  # blocks a request holds (beyond the pinned prefix)
    last_emit = [None] * n  # step of the last token
    last_emit_time = [0.0] * n
    first_token = [None] * n
    done = [None] * n
    free = None if e.blocks is None else e.blocks - e.prefix_blocks
    now, steps, busy, max_queue, preemptions = 0.0, 0, 0, 0, 0
    kv_used, gaps = [], []
    nxt = 0
    waiting: list[int] = []
    running: list[int] = []

    def reservation(i):
        return math.ceil((prompt[i] + e.max_output) / bt) - e.prefix_blocks

    def paged_need(i, n_new):  # blocks beyond those held, for c + n_new computed tokens
        return math.ceil((c[i] + n_new) / bt) - e.prefix_blocks - held[i]

    while nxt < n or waiting or running:
        while nxt < n and arrival[nxt] <= now:
            waiting.append(nxt)
            nxt += 1
        no_more = nxt == n
        rows = []  # (request, c before, n tokens, emits a token)
        if e.policy == "continuous":
            budget = e.budget
            preempted = False
            pos = 0
            while pos < len(running) and budget > 0:
                i = running[pos]
                take = min(prompt[i] + g[i] - c[i], budget)
                if free is not None and e.alloc == "paged":
                    while paged_need(i, take) > free:
                        victim = running.pop()  # the newest admission
                        free += held[victim]
                        held[victim] = 0
                        c[victim] = 0
                        waiting.insert(0, victim)
                        preemptions += 1
                        preempted = True
                        if victim == i:
                            break
                    if i not in running:
                        break
                    need = paged_need(i, take)
                    free -= need
                    held[i] += need
                rows.append((i, c[i], take))
                budget -= take
                pos += 1
            if not preempted:
                while waiting and len(running) < e.limit and budget > 0:
                    i = waiting[0]
                    c[i] = cached
                    take = min(prompt[i] + g[i] - c[i], budget)
                    if free is not None:
                        need = reservation(i) if e.alloc == "reserve" else paged_need(i, take)
                        if need > free:
                            break  # the head blocks the queue
                        free -= need
                        held[i] = need
                    running.append(waiting.pop(0))
                    rows.append((i, c[i], take))
                    budget -= take
        else:
            if not running and waiting:
                fit = len(waiting)
                if free is not None:
                    fit, room = 0, free
                    for i in waiting:
                        if reservation(i) > room:
                            break
                        room -= reservation(i)
                        fit += 1
                take = min(e.limit, len(waiting), fit)
                full = len(waiting) >= e.limit or fit < min(e.limit, len(waiting))
                waited = e.policy == "dynamic" and now >= arrival[waiting[0]] + e.window_s
                if full or no_more or waited:
                    running, waiting = waiting[:take], waiting[take:]
                    for i in running:
                        c[i] = cached
                        if free is not None:
                            held[i] = reservation(i)
                            free -= held[i]
            for i in running:
                if done[i] is None:
                    rows.append((i, c[i], prompt[i] + g[i] - c[i]))
                else:  # padding: the finished row's KV is still read
                    rows.append((i, prompt[i] + output[i] - 1, 1))
        max_queue = max(max_queue, len(waiting))
        if not rows:
            if e.policy == "continuous":
                if not waiting:  # idle: jump to the next arrival
                    now = arrival[nxt]
                continue  # else a request preempted itself: it is admitted next iteration
            events = [arrival[nxt]] if nxt < n else []
            if e.policy == "dynamic" and waiting:
                events.append(arrival[waiting[0]] + e.window_s)
            now = max(now, min(events))
            continue
        N = sum(t for _, _, t in rows)
        C = sum(c0 + t for _, c0, t in rows)
        A = sum(t * (2 * c0 + t + 1) // 2 for _, c0, t in rows)
        d = step_time(e.k, N, C, A)
        now += d
        steps += 1
        if free is not None:
            kv_used.append(e.blocks - free)
        for i, c0, t in rows:
            if done[i] is not None:
                continue
            c[i] = c0 + t
            if c[i] == prompt[i] + g[i]:
                g[i] += 1
                busy += 1
                if last_emit[i] is not None:
                    gaps.append(d if last_emit[i] == steps - 1 else now - last_emit_time[i])
                last_emit[i] = steps
                last_emit_time[i] = now
                if g[i] == 1:
                    first_token[i] = now + e.api_s
                if g[i] == output[i]:
                    done[i] = now + e.api_s
                    if e.policy == "continuous":
                        running.remove(i)
                        if free is not None:
                            free += held[i]
                            held[i] = 0
        if e.policy != "continuous" and all(done[i] is not None for i in running):
            if free is not None:
                free += sum(held[i] for i in running)
                for i in running:
                    held[i] = 0
            running = []
    return dict(first_token=first_token, done=done, steps=steps, busy=busy, max_queue=max_queue,
                preemptions=preemptions, kv_used=kv_used if e.blocks is not None else None, gaps=gaps)

