"""A deliberately simple pure-Python simulator of the fleet model (docs/model/fleets.md): the third oracle.

Replicas are the serving oracle's engines (:class:`.serving.Replica`); a router sends
each request, in arrival order, to one of them. Before a request arriving at t is routed, every
replica runs each step that starts before t, so the router sees the outstanding requests and KV
blocks "as of every step that started before t". Static and dynamic fleets route statically
(round robin, random), so each replica simply runs its own requests alone. With a prefill pool,
prompts run on prefill replicas (output 1), cross each prefill replica's KV link first come first
served, and decode replicas take them, routed in order of KV arrival, with c = p and g = 1.
"""

from __future__ import annotations

import dataclasses
import math

from .serving import Engine, Replica, simulate


@dataclasses.dataclass
class Fleet:
    replicas: int
    router: str  # round_robin | random | least_outstanding | least_kv
    prefill_replicas: int = 0
    prefill: Engine | None = None  # the prefill replicas' engine
    link_latency_s: float = 0.0
    link_bytes_per_s: float = 50e9
    kv_bytes_per_token: float = 0.0  # a prompt's KV crossing the link: its full-attention layers' per token,
    window_bytes_per_token: float = 0.0  # its local layers' for the window's last tokens,
    window_tokens: int = 0
    state_bytes: float = 0.0  # and its linear-attention layers' states


def _choose(router, k, i, reps, routes):
    if router == "round_robin":
        return k % len(reps)
    if router == "random":
        return routes[i]
    if router == "least_outstanding":
        return min(range(len(reps)), key=lambda r: (reps[r].outstanding(), r))
    return min(range(len(reps)), key=lambda r: (reps[r].blocks_in_use(), reps[r].outstanding(), r))


def _advance(rep: Replica, until: float) -> None:
    """Run every step of ``rep`` that starts before ``until`` (continuous batching)."""
    while rep.has_work() and rep.now < until:
        rep.iterate(no_more=False)  # False only when a request preempted itself: go round again


def pool(e: Engine, router: str, n_replicas: int, arrival, prompt, output, ids, routes, token_1_at=None):
    """Requests ``ids`` (in routing order; ``arrival[i]`` is when request i reaches the pool) on
    ``n_replicas`` replicas of ``e``. Returns (replicas, {request: replica})."""
    if e.policy != "continuous":  # static routing: each replica alone on its own requests
        assert router in ("round_robin", "random")
        mine = [[] for _ in range(n_replicas)]
        for k, i in enumerate(ids):
            mine[_choose(router, k, i, [None] * n_replicas, routes)].append(i)
        reps, where = [], {}
        for r, sub in enumerate(mine):
            rep = Replica(e, arrival, prompt, output)
            if sub:
                one = simulate([arrival[i] for i in sub], [prompt[i] for i in sub], [output[i] for i in sub],
                               dataclasses.replace(e, api_s=0.0))
                for j, i in enumerate(sub):
                    rep.first_token[i], rep.done[i] = one["first_token"][j], one["done"][j]
                    where[i] = r
                rep.steps, rep.busy, rep.max_queue, rep.preemptions = (one["steps"], one["busy"], one["max_queue"],
                                                                      one["preemptions"])
                rep.kv_used, rep.gaps = one["kv_used"] or [], one["gaps"]
            reps.append(rep)
        return reps, where
    track = e if e.blocks is not None or router != "least_kv" else dataclasses.replace(e, blocks=10**15)
    reps = [Replica(track, arrival, prompt, output) for _ in range(n_replicas)]
    where = {}
    for k, i in enumerate(ids):
        t = arrival[i]
        for rep in reps:
            _advance(rep, t)
        r = _choose(router, k, i, reps, routes)
        rep = reps[r]
        if not rep.has_work():
            rep.now = max(rep.now, t)  # an idle replica wakes when a request reaches it
        rep.join(i, None if token_1_at is None else token_1_at[i])
        where[i] = r
    for rep in reps:
        _advance(rep, math.inf)
    return reps, where


def simulate_fleet(arrival, prompt, output, e: Engine, f: Fleet, routes=None, prefill_routes=None):
    """Returns a dict as :func:`oracle_serving.simulate`'s (pooled over the fleet: steps, busy,
    preemptions summed, max_queue the largest, gaps and kv_used of every replica), plus
    ``replica`` and ``prefill_replica`` (per request; None where there is none) and
    ``kv_used_by_replica``."""
    n = len(arrival)
    ids = list(range(n))
    first, done = [None] * n, [None] * n
    prefill_of = [None] * n
    reps = []
    if f.prefill_replicas == 0:
        decode_ids, reached, token_1 = ids, arrival, None
    else:
        pre, prefill_where = pool(f.prefill, f.router, f.prefill_replicas, arrival, prompt, [1] * n, ids,
                                  prefill_routes)
        reps += pre
        ended = {i: pre[prefill_where[i]].done[i] for i in ids}  # prefill end: the first token (engine time)
        reached = [None] * n  # KV arrival at the decode pool
        for r in range(f.prefill_replicas):
            link_free = 0.0
            for i in sorted((i for i in ids if prefill_where[i] == r and output[i] > 1), key=lambda i: (ended[i], i)):
                start = max(ended[i], link_free)
                sent = (prompt[i] * f.kv_bytes_per_token + min(prompt[i], f.window_tokens) * f.window_bytes_per_token
                        + f.state_bytes)
                link_free = start + (f.link_latency_s + sent / f.link_bytes_per_s)
                reached[i] = link_free
        for i in ids:
            prefill_of[i] = prefill_where[i]
            first[i] = ended[i] + e.api_s
            if output[i] == 1:
                done[i] = ended[i] + e.api_s
        decode_ids = sorted((i for i in ids if output[i] > 1), key=lambda i: (reached[i], i))
        token_1 = ended
    dec, where = pool(e, f.router, f.replicas, reached, prompt, output, decode_ids, routes, token_1)
    reps += dec
    replica = [where.get(i) for i in ids]
    for i in decode_ids:
        rep = dec[where[i]]
        if token_1 is None:
            first[i] = rep.first_token[i] + e.api_s
        done[i] = rep.done[i] + e.api_s
    return dict(first_token=first, done=done, steps=sum(r.steps for r in reps), busy=sum(r.busy for r in reps),
                max_queue=max(r.max_queue for r in reps), preemptions=sum(r.preemptions for r in reps),
                gaps=[g for r in reps for g in r.gaps], replica=replica, prefill_replica=prefill_of,
                kv_used_by_replica=[r.kv_used if r.e.blocks is not None and r.e.blocks < 10**15 else None for r in reps])
