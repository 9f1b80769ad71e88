"""A deliberately simple pure-Python simulator of vLLM's automatic prefix cache and of sessions
(docs/model/prefix-cache.md): the oracle of the prefix-caching kernel.

Every physical block is a Python object slot (its content key or None, its reference count); the
free queue is a list; a dict maps content to the block that holds it; each request keeps the list
of blocks it holds. Replicas advance step by step in time order, every arrival (a static one or a
session's next turn, released when the turn before is done) routed at its instant after every
step that started before it. With a prefill pool, the prefill replicas cache what they compute
and end each request at its first token; its KV then crosses its prefill replica's link (first
come, first served; ties: the lower index) and joins a decode replica (no cache there: blocks only
counted) with c = p, g = 1; a session's next turn waits for the decode replica's last token.
Closed-loop clients (``content.clients`` C): the first C requests are given (with sessions, the
first C sessions' first turns); a request's completion frees its client at its (client) done
time, an event taken in time order after the arrivals of that instant (ties: the lower request),
when the client sends the next request no client has sent (with sessions, the next session's
first turn), its think time later; a session's turn that has a next turn releases it instead,
to the same client. Literal and slow; the kernel must agree exactly.

A model with local-attention layers (``Engine.fixed_blocks`` > 0 under the cache, over requests
that share nothing) holds that many window blocks from admission to its end or preemption,
allocated after its token blocks and released before them; a preempted request re-hits its
blocks only all together, window blocks included, and none once any of them was evicted (its
recomputed blocks then take the cache's entries from the stale copies still free).
"""

from __future__ import annotations

import dataclasses
import heapq
import math

from .serving import Engine


class Shares:
    """Content identity (the docs' rules, read literally)."""

    def __init__(self, n, prompt, parent, shared, hash_start, hash_ids, hash_block, block_tokens):
        self.n, self.prompt, self.parent, self.shared = n, prompt, parent, shared
        self.hash_start, self.hash_ids, self.hash_block, self.B = hash_start, hash_ids, hash_block, block_tokens

    def key(self, r, j):
        B = self.B
        if len(self.hash_start):
            if (j + 1) * B <= self.prompt[r]:
                i = ((j + 1) * B - 1) // self.hash_block
                return ("hash", self.hash_ids[self.hash_start[r] + i], j)
            return ("own", r, j)
        node = r
        while self.parent[node] >= 0 and (j + 1) * B <= self.shared[node]:
            node = self.parent[node]
        return ("own", node, j)


class CachedReplica:
    def __init__(self, e: Engine, shares: Shares, prompt, output, caching):
        self.e, self.s, self.prompt, self.output, self.caching = e, shares, prompt, output, caching
        B = e.block_tokens
        self.B = B
        self.block_key = [None] * e.blocks
        self.ref = [0] * e.blocks
        self.free = list(range(e.blocks))
        self.where = {}
        self.g, self.c, self.blocks, self.window = {}, {}, {}, {}
        self.last_emit, self.last_emit_time = {}, {}
        self.first_token, self.done, self.cached = {}, {}, {}
        self.now, self.steps, self.busy, self.max_queue, self.preemptions = 0.0, 0, 0, 0, 0
        self.began = -math.inf  # when the last step started
        self.joined_at = {}
        self.kv_used, self.gaps = [], []
        self.waiting, self.running = [], []

    def join(self, i, at, token_1=None):
        """Request ``i`` joins the queue at time ``at``; on a decode replica with its prompt's KV
        and its first token, emitted at ``token_1``."""
        self.waiting.append(i)
        self.joined_at[i] = at
        self.g[i], self.c[i], self.blocks[i], self.window[i] = 0, 0, [], []
        self.last_emit[i] = None
        if token_1 is not None:
            self.g[i], self.c[i] = 1, self.prompt[i]
            self.last_emit_time[i] = token_1

    def has_work(self):
        return bool(self.waiting or self.running)

    def outstanding(self):
        return len(self.waiting) + len(self.running)

    def in_use(self):
        return self.e.blocks - len(self.free)

    def hit(self, i, g):
        if not self.caching:
            return 0
        cap = (self.prompt[i] + g - 1) // self.B
        h = 0
        while h < cap and self.s.key(i, h) in self.where:
            h += 1
        return h

    def _allocate(self, i, window=None):
        b = self.free.pop(0)
        if self.block_key[b] is not None:
            del self.where[self.block_key[b]]
            self.block_key[b] = None
        self.ref[b] = 1
        if window is None:
            self.blocks[i].append(b)
        else:  # a window block: cached as its request's, found again only with all the others
            self.window[i].append(b)
            if self.caching:
                self.block_key[b] = ("window", i, window)
                self.where[self.block_key[b]] = b

    def _fill(self, i, c0, c1):
        if not self.caching:
            return
        for j in range(c0 // self.B, c1 // self.B):
            k = self.s.key(i, j)
            if k in self.where and self.e.fixed_blocks and self.ref[self.where[k]] == 0:
                self.block_key[self.where.pop(k)] = None  # a stale copy in the free queue (a window's
                # request recomputing after a miss) gives the cache's entry up to the block recomputed
            if k not in self.where:
                b = self.blocks[i][j]
                self.where[k] = b
                self.block_key[b] = k

    def _release(self, i):
        for b in reversed(self.window[i]):  # the window's blocks first
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free.append(b)
        self.window[i] = []
        for b in reversed(self.blocks[i]):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free.append(b)
        self.blocks[i] = []

    def iterate(self):
        e, B, prompt, g, c = self.e, self.B, self.prompt, self.g, self.c
        waiting, running = self.waiting, self.running
        rows = []
        budget = e.budget
        preempted = False
        pos = 0
        while pos < len(running) and budget > 0:
            i = running[pos]
            take = min(prompt[i] + g[i] - c[i], budget)
            need = math.ceil((c[i] + take) / B) - len(self.blocks[i])
            while need > len(self.free):
                v = running.pop()
                self._release(v)
                c[v] = 0
                waiting.insert(0, v)
                self.preemptions += 1
                preempted = True
                if v == i:
                    break
            if i not in running:
                break
            for _ in range(need):
                self._allocate(i)
            self._fill(i, c[i], c[i] + take)
            rows.append((i, c[i], take))
            budget -= take
            pos += 1
        if not preempted:
            seen = self.began if e.lookahead and running else self.now  # async scheduling (see serving.py)
            while waiting and len(running) < e.limit and budget > 0:
                i = waiting[0]
                if self.joined_at[i] > seen:
                    break
                h = self.hit(i, g[i])
                hits = [self.where[self.s.key(i, j)] for j in range(h)]
                windows = [("window", i, j) for j in range(e.fixed_blocks)]
                if h and not all(w in self.where for w in windows):
                    h, hits = 0, []  # a window block was evicted: nothing is found
                if h:
                    hits += [self.where[w] for w in windows]
                c0 = max(h * B, c[i])  # (a decode replica's request arrives with its prompt computed)
                take = min(prompt[i] + g[i] - c0, budget)
                new = math.ceil((c0 + take) / B) - h + (0 if h else e.fixed_blocks)
                if new + sum(1 for b in hits if self.ref[b] == 0) > len(self.free):
                    break
                for b in hits:
                    if self.ref[b] == 0:
                        self.free.remove(b)
                    self.ref[b] += 1
                self.blocks[i] = hits[:h]
                self.window[i] = hits[h:]
                for _ in range(new - (0 if h else e.fixed_blocks)):
                    self._allocate(i)
                for j in range(0 if h else e.fixed_blocks):
                    self._allocate(i, window=j)
                if i not in self.cached:
                    self.cached[i] = c0
                c[i] = c0
                self._fill(i, c0, c0 + take)
                running.append(waiting.pop(0))
                rows.append((i, c0, take))
                budget -= take
        self.max_queue = max(self.max_queue, len(waiting))
        if not rows:
            return []
        N = sum(t for _, _, t in rows)
        C = sum(c0 + t for _, c0, t in rows)
        A = sum(t * (2 * c0 + t + 1) // 2 for _, c0, t in rows)
        S = sum(1 for i, c0, t in rows if c0 + t == prompt[i] + g[i])
        d = e.cost(N, C, A, S)
        self.began = self.now
        self.now += d
        self.steps += 1
        self.kv_used.append(self.in_use())
        finished = []
        for i, c0, t in rows:
            c[i] = c0 + t
            if c[i] == prompt[i] + g[i]:
                g[i] += 1
                self.busy += 1
                if g[i] > 1:
                    self.gaps.append(d if self.last_emit[i] == self.steps - 1 else self.now - self.last_emit_time[i])
                self.last_emit[i] = self.steps
                self.last_emit_time[i] = self.now
                if g[i] == 1:
                    self.first_token[i] = self.now
                if g[i] == self.output[i]:
                    self.done[i] = self.now
                    running.remove(i)
                    self._release(i)
                    finished.append(i)
        return finished if finished else [None]


@dataclasses.dataclass
class Prefill:
    """A prefill pool in front of the replicas, which then only decode."""

    replicas: int
    engine: Engine  # the prefill replicas'
    link_s: list  # each request's KV transfer time
    routes: list | None = None  # the random router's prefill replica per routed request (routing order)


def _route(router, reps, x_of, q, k, draw, weight, B, prompt, cached):
    """The replica (an index into ``x_of``) for request ``q``, the pool's ``k``-th routed
    (``draw``: the random router's)."""
    if router == "round_robin":
        return k % len(x_of)
    if router == "random":
        return draw

    def score(x):
        rep = reps[x_of[x]]
        if router == "least_outstanding":
            return (rep.outstanding(), x)
        if router == "least_kv" or not cached:
            return (rep.in_use(), rep.outstanding(), x)
        miss = math.ceil(prompt[q] / B) - rep.hit(q, 0)
        return (miss * weight + rep.in_use(), rep.outstanding(), x)
    return min(range(len(x_of)), key=score)


def simulate(arrival, prompt, output, content, e: Engine, caching=True, replicas=1, router="round_robin",
             weight=1.0, routes=None, prefill: Prefill | None = None):
    """Requests (``arrival`` NaN for a session's later turn) on ``replicas`` replicas (with
    ``prefill``, decode replicas behind it; the random router's decode replica is ``routes[i]``
    per request, as its prefill pool's is per routed request); returns a dict of per-request client
    times and arrivals, cached tokens, replica (and prefill replica), and the counters."""
    n = len(arrival)
    B = e.block_tokens
    shares = Shares(n, prompt, content.parent, content.shared, content.hash_start, content.hash_ids,
                    content.hash_block, B)
    npre = prefill.replicas if prefill else 0
    reps = [CachedReplica(prefill.engine, shares, prompt, [1] * n, caching) for _ in range(npre)]
    reps += [CachedReplica(e, shares, prompt, output, caching and not prefill) for _ in range(replicas)]
    first_pool = list(range(npre or replicas))
    decode_pool = list(range(npre, npre + replicas))
    pending = [(arrival[i], i) for i in range(n) if not math.isnan(arrival[i])]
    heapq.heapify(pending)
    arrived = list(arrival)
    where = [None] * n
    prefill_of = [None] * n
    kv_arrived = [False] * n
    link_free = [0.0] * npre
    first = [None] * n
    done = [None] * n
    routed = routed_decode = 0
    def later(i):  # request i + 1 is the next turn of request i's session
        return i + 1 < n and content.turn[i + 1] > 1 and content.session[i + 1] == content.session[i]

    def next_sent(j):  # the request a client sends after request j: the next session's first turn
        j += 1
        while j < n and content.turn[j] > 1:
            j += 1
        return j

    taken = 0  # closed-loop clients: the next request no client has sent (past the first C given)
    for _ in range(content.clients):
        taken = next_sent(taken) if taken < n else n
    while True:
        t_next = pending[0][0] if pending else math.inf
        busy = [r for r in range(len(reps)) if reps[r].has_work()]
        r = min(busy, key=lambda x: (reps[x].now, x)) if busy else None
        if r is not None and reps[r].now < t_next:
            rep = reps[r]
            finished = rep.iterate()
            for i in sorted(i for i in finished if i is not None):
                if r < npre:  # a prompt done: its first token
                    first[i] = rep.done[i] + e.api_s
                    if output[i] > 1:  # its KV crosses the link
                        link_free[r] = max(rep.done[i], link_free[r]) + prefill.link_s[i]
                        kv_arrived[i] = True
                        heapq.heappush(pending, (link_free[r], i))
                        continue
                elif not npre:
                    first[i] = rep.first_token[i] + e.api_s
                done[i] = rep.done[i] + e.api_s
                if later(i):  # its session's next turn, after its think time
                    t = done[i] + content.think_s[i + 1]
                    arrived[i + 1] = t
                    heapq.heappush(pending, (t, i + 1))
                elif content.clients:  # its client is free: an event (t, n + i), after arrivals at t
                    heapq.heappush(pending, (done[i], n + i))
            continue
        if not pending:
            break
        t, q = heapq.heappop(pending)
        if q >= n:  # a free client sends the next request no client has sent, after its think time
            if taken < n:
                arrived[taken] = t + content.think_s[taken]
                heapq.heappush(pending, (arrived[taken], taken))
                taken = next_sent(taken)
            continue
        if kv_arrived[q]:
            x = _route(router, reps, decode_pool, q, routed_decode, routes and routes[q], weight, B, prompt, False)
            routed_decode += 1
            token_1 = first[q] - e.api_s
        else:
            draws = prefill.routes if prefill else routes
            x = _route(router, reps, first_pool, q, routed, draws and draws[routed], weight, B, prompt, caching)
            routed += 1
            token_1 = None
        k = (decode_pool if kv_arrived[q] else first_pool)[x]
        if k < npre:
            prefill_of[q] = k
        else:
            where[q] = k - npre
        rep = reps[k]
        if not rep.has_work():
            rep.now = max(rep.now, t)
        rep.join(q, t, token_1)
    return dict(arrival=arrived, first_token=first, done=done, replica=where, prefill_replica=prefill_of,
                cached=[reps[prefill_of[i] if npre else where[i]].cached[i] for i in range(n)],
                steps=sum(x.steps for x in reps), busy=sum(x.busy for x in reps),
                preemptions=sum(x.preemptions for x in reps), max_queue=max(x.max_queue for x in reps),
                kv_used=[u for x in reps for u in x.kv_used], gaps=[gp for x in reps for gp in x.gaps])
