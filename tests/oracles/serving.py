"""A deliberately simple pure-Python simulator of the serving model (docs/model/serving.md): the second oracle.

Python lists for the waiting queue and the running batch, per-request token counters, a full
scan of every scheduled row each step and every token's gap stored. It follows the written rules
literally (token accounting, running first with preemption of the newest, admission only when
nobody was preempted, reservations, the shared prefix, the step-time formula) and is slow and
obviously correct; the fast kernels and metrics must agree with it exactly.

An engine is a :class:`Replica` that requests join; :func:`simulate` feeds one replica its
arrivals, and the fleet oracle (``oracle_fleet``) feeds several through a router.
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
    cost: StepCost  # what a step takes
    api_s: float
    lookahead: bool = False  # async scheduling: while a step runs, the next one's batch is already fixed
    fixed_blocks: int = 0  # a hybrid-attention model's: blocks each admitted request holds beyond its tokens'
    spec_tokens: int = 0  # speculative decoding: tokens proposed and verified per decoding request and step (k)
    spec_span: int = 0  # KV slots a decoding request holds beyond its computed tokens in a step
    spec_accept: tuple = ()  # per position, its acceptance (a draw of 53 bits below acceptance x 2^53)
    spec_seed: int = 0  # the run's seed for the draws


@dataclass
class StepCost:
    """One step's cost in physical terms (docs/model/serving.md, docs/model/deployed.md), written
    out again from the docs, not folded into coefficients as the kernels do."""

    overhead_s: float
    weight_bytes: float  # every weight, all GPUs
    expert_bytes: float  # all routed experts of every MoE layer (0: dense)
    k_over_e: float  # experts picked per token / routed experts
    kv_gpu: float  # KV bytes per token one GPU holds
    tp: int
    gpu_bytes_s: float  # one GPU's achieved memory bandwidth
    params_b: float | None  # None: compute is free
    dtype_flops: float  # one GPU's achieved FLOP/s for the linear layers (at the dtype's peak)
    bf16_flops: float  # ... for attention and the LM head
    n_layers: int
    attn_dim: int
    hidden: int
    vocab: int | None
    comm_fixed_s: float  # the step's all-reduce (or dispatch and combine) latencies
    comm_s_per_token: float  # and their per-token transfer time
    row_gpu: float = 0.0  # hybrid attention: bytes one GPU reads per sampled row (windows, states read and written)
    window_pairs: float = 0.0  # ... and query-key pairs per computed token over the local layers
    index_pair_flops: float = 0.0  # sparse attention: its indexer's FLOPs per query-key pair, every layer,
    index_flops: float | None = None  # at one GPU's achieved FLOP/s for it
    draft_scale: float = 1.0  # speculative decoding: k draft passes make the step this many times as long,
    fixed_s: float = 0.0  # but for this fixed overhead

    def __call__(self, N, C, A, S):
        return self.fixed_s + self.draft_scale * (self.verify(N, C, A, S) - self.fixed_s)

    def verify(self, N, C, A, S):
        unread = self.expert_bytes * (1 - self.k_over_e) ** N if self.expert_bytes else 0.0
        # (W(N) / tp + kv_gpu C) / bandwidth, grouped as the lesson's weights + per-token KV times
        t_mem = (self.weight_bytes - unread) / self.tp / self.gpu_bytes_s + self.kv_gpu / self.gpu_bytes_s * C
        t_mem += self.row_gpu / self.gpu_bytes_s * S
        t_cmp = 0.0
        if self.params_b is not None:
            t_cmp = 2e9 * self.params_b * N / self.tp / self.dtype_flops
            t_cmp += (2 * self.hidden * self.vocab * S if self.vocab else 0) / self.tp / self.bf16_flops
            t_cmp += 4 * self.n_layers * self.attn_dim * A / self.tp / self.bf16_flops
            t_cmp += 4 * self.attn_dim * self.window_pairs * N / self.tp / self.bf16_flops
            if self.index_pair_flops:
                t_cmp += self.index_pair_flops * A / self.tp / self.index_flops
        return self.overhead_s + max(t_mem, t_cmp) + self.comm_fixed_s + self.comm_s_per_token * N


class Replica:
    """One engine. ``prompt`` and ``output`` are indexed by request id (a fleet's replicas share
    them; each request joins one replica). Times are the engine's (no API overhead)."""

    def __init__(self, e: Engine, arrival, prompt, output):
        self.e, self.arrival, self.prompt, self.output = e, arrival, prompt, output
        self.g, self.c, self.held = {}, {}, {}  # tokens emitted, tokens whose KV exists, blocks held
        self.last_emit, self.last_emit_time = {}, {}  # step and time of the last token
        self.first_token, self.done = {}, {}
        self.free = None if e.blocks is None else e.blocks - e.prefix_blocks
        self.now, self.steps, self.busy, self.max_queue, self.preemptions = 0.0, 0, 0, 0, 0
        self.began = -math.inf  # when the last step started
        self.joined_at = {}
        self.kv_used, self.gaps = [], []
        self.accepted = [0] * (e.spec_tokens + 1)  # speculative decoding: verifications that accepted 0, 1, ... k
        self.drafted = set()  # ... and the requests with a draft: they emitted a token on this replica
        self.waiting: list[int] = []
        self.running: list[int] = []

    def join(self, i, token_1_at=None):
        """Request ``i`` joins the queue; with ``token_1_at`` it arrives with its prompt's KV
        computed and its first token emitted then (a decode replica: c = p, g = 1)."""
        self.waiting.append(i)
        self.joined_at[i] = self.arrival[i]
        self.g[i], self.c[i], self.held[i] = 0, 0, 0
        self.last_emit[i] = None
        self.drafted.discard(i)
        if token_1_at is not None:
            self.c[i], self.g[i] = self.prompt[i], 1
            self.last_emit_time[i] = token_1_at

    def has_work(self):
        return bool(self.waiting or self.running)

    def outstanding(self):
        return len(self.waiting) + len(self.running)

    def blocks_in_use(self):
        return self.e.blocks - self.free

    def _reservation(self, i):
        e = self.e
        return math.ceil((self.prompt[i] + e.max_output) / e.block_tokens) - e.prefix_blocks + e.fixed_blocks

    def _paged_need(self, i, n_new):  # blocks beyond those held, for c + n_new computed tokens
        e = self.e
        return math.ceil((self.c[i] + n_new) / e.block_tokens) - e.prefix_blocks + e.fixed_blocks - self.held[i]

    def _verifies(self, i, c0=None):
        """Whether request ``i`` (with ``c0`` computed) is decoding under speculative decoding: it
        verifies its draft's k tokens."""
        c0 = self.c[i] if c0 is None else c0
        return self.e.spec_tokens > 0 and i in self.drafted and c0 == self.prompt[i] + self.g[i] - 1

    def _accepted(self, i):
        """How many of the draft's tokens request ``i`` accepts after emitting g tokens: from the
        first, while each position's draw is below its acceptance."""
        e, a = self.e, 0
        while a < e.spec_tokens and draw(e.spec_seed, i, self.g[i], a) < int(e.spec_accept[a] * 2**53):
            a += 1
        return a

    def iterate(self, no_more):
        """One turn of the engine's loop at ``self.now`` (arrivals already joined): schedule and
        run a step. ``no_more``: no request will join later (static and dynamic batching).
        Returns False when nothing could be scheduled (the caller moves time on)."""
        rows = self.schedule(no_more)
        if not rows:
            return False
        self.finish(rows, self.e.cost(*self.totals(rows)))
        return True

    def schedule(self, no_more):
        """The rows of the step at ``self.now``: (request, c before, n tokens); blocks are taken,
        requests preempted and admitted as the rules say."""
        e, prompt, output, g, c, held = self.e, self.prompt, self.output, self.g, self.c, self.held
        waiting, running = self.waiting, self.running
        cached = e.prefix_blocks * e.block_tokens  # tokens every admission starts with
        rows = []  # (request, c before, n tokens)
        if e.policy == "continuous":
            budget = e.budget
            preempted = False
            pos = 0
            while pos < len(running) and budget > 0:
                i = running[pos]
                verifying = self._verifies(i)
                take = 1 + e.spec_tokens if verifying else min(prompt[i] + g[i] - c[i], budget)
                if self.free is not None and e.alloc == "paged":
                    span = e.spec_span if verifying else take  # slots it holds in the step
                    while max(self._paged_need(i, span), 0) > self.free:
                        victim = running.pop()  # the newest admission
                        self.free += held[victim]
                        held[victim] = 0
                        c[victim] = 0
                        waiting.insert(0, victim)
                        self.preemptions += 1
                        preempted = True
                        if victim == i:
                            break
                    if i not in running:
                        break
                    need = max(self._paged_need(i, span), 0)
                    self.free -= need
                    held[i] += need
                rows.append((i, c[i], take))
                budget -= take
                pos += 1
            if not preempted:
                # async scheduling: this step's batch was chosen when the last step started, so a
                # request that arrived after that waits, unless nothing runs (an idle engine)
                seen = self.began if e.lookahead and running else self.now
                while waiting and len(running) < e.limit and budget > 0:
                    i = waiting[0]
                    if self.joined_at[i] > seen:
                        break
                    c[i] = max(c[i], cached)  # a warm prefix, or a prompt whose KV arrived whole
                    take = min(prompt[i] + g[i] - c[i], budget)
                    if self.free is not None:
                        need = self._reservation(i) if e.alloc == "reserve" else self._paged_need(i, take)
                        if need > self.free:
                            break  # the head blocks the queue
                        self.free -= need
                        held[i] = need
                    running.append(waiting.pop(0))
                    rows.append((i, c[i], take))
                    budget -= take
        else:
            if not running and waiting:
                fit = len(waiting)
                if self.free is not None:
                    fit, room = 0, self.free
                    for i in waiting:
                        if self._reservation(i) > room:
                            break
                        room -= self._reservation(i)
                        fit += 1
                take = min(e.limit, len(waiting), fit)
                full = len(waiting) >= e.limit or fit < min(e.limit, len(waiting))
                waited = e.policy == "dynamic" and self.now >= self.arrival[waiting[0]] + e.window_s
                if full or no_more or waited:
                    self.running, self.waiting = running, waiting = waiting[:take], waiting[take:]
                    for i in running:
                        c[i] = cached
                        if self.free is not None:
                            held[i] = self._reservation(i)
                            self.free -= held[i]
            for i in running:
                if i not in self.done:
                    rows.append((i, c[i], prompt[i] + g[i] - c[i]))
                else:  # padding: the finished row's KV is still read
                    rows.append((i, prompt[i] + output[i] - 1, 1))
        self.max_queue = max(self.max_queue, len(waiting))
        return rows

    def totals(self, rows):
        """(N, C, A, S) of a step's rows."""
        prompt, g = self.prompt, self.g
        N = sum(t for _, _, t in rows)
        C = sum(c0 + t for _, c0, t in rows)
        A = sum(t * (2 * c0 + t + 1) // 2 for _, c0, t in rows)
        S = sum((t if self._verifies(i, c0) else c0 + t == prompt[i] + g[i]) for i, c0, t in rows
                if i not in self.done)  # rows sampled: those that emit, every verified token
        return N, C, A, S

    def finish(self, rows, d):
        """The step of ``rows`` taking ``d`` seconds: tokens emitted, requests done."""
        e, prompt, output, g, c, held = self.e, self.prompt, self.output, self.g, self.c, self.held
        running = self.running
        self.began = self.now
        self.now += d
        self.steps += 1
        now = self.now
        if self.free is not None:
            self.kv_used.append(e.blocks - self.free)
        for i, c0, t in rows:
            if i in self.done:
                continue
            emits = 1
            if self._verifies(i, c0):
                a = self._accepted(i)
                self.accepted[a] += 1
                emits = min(1 + a, output[i] - g[i])
                c[i] = c0 + emits  # (the rejected tokens' KV is discarded)
            else:
                c[i] = c0 + t
            if c[i] == prompt[i] + g[i] + emits - 1:
                g[i] += emits
                self.drafted.add(i)  # (its draft proposes tokens for its next step)
                self.busy += 1
                if g[i] > 1:  # every gap between consecutive tokens
                    self.gaps.append(d if self.last_emit[i] == self.steps - 1 else now - self.last_emit_time[i])
                self.last_emit[i] = self.steps
                self.last_emit_time[i] = now
                if g[i] == 1:
                    self.first_token[i] = now
                if g[i] == output[i]:
                    self.done[i] = now
                    if e.policy == "continuous":
                        running.remove(i)
                        if self.free is not None:
                            self.free += held[i]
                            held[i] = 0
        if e.policy != "continuous" and all(i in self.done for i in running):
            if self.free is not None:
                self.free += sum(held[i] for i in running)
                for i in running:
                    held[i] = 0
            self.running = []


def simulate(arrival, prompt, output, e: Engine):
    """One engine fed its arrivals. Returns a dict: first_token, done (lists, client times),
    steps, busy, max_queue, preemptions, kv_used (blocks in use during each step, or None),
    gaps (every inter-token gap)."""
    n = len(arrival)
    rep = Replica(e, arrival, prompt, output)
    nxt = 0
    while nxt < n or rep.has_work():
        while nxt < n and arrival[nxt] <= rep.now:
            rep.join(nxt)
            nxt += 1
        if rep.iterate(no_more=nxt == n):
            continue
        if e.policy == "continuous":
            if not rep.waiting:  # idle: jump to the next arrival
                rep.now = arrival[nxt]
            continue  # else a request preempted itself: it is admitted next iteration
        events = [arrival[nxt]] if nxt < n else []
        if e.policy == "dynamic" and rep.waiting:
            events.append(arrival[rep.waiting[0]] + e.window_s)
        rep.now = max(rep.now, min(events))
    return result(rep, range(n), e.api_s)


def result(rep: Replica, ids, api_s):
    return dict(first_token=[rep.first_token[i] + api_s for i in ids], done=[rep.done[i] + api_s for i in ids],
                steps=rep.steps, busy=rep.busy, max_queue=rep.max_queue, preemptions=rep.preemptions,
                kv_used=rep.kv_used if rep.e.blocks is not None else None, gaps=rep.gaps,
                spec=rep.accepted if rep.e.spec_tokens else None)


MASK = 2**64 - 1


def mix(z):
    """splitmix64's finaliser (docs/model/deployed.md, "Speculative decoding")."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def spec_seed(workload_seed):
    """The run's seed for acceptance draws, from the workload's (as the docs write it)."""
    return mix((workload_seed * 0x2545F4914F6CDD1D + 0x5EC) & MASK)


def draw(seed, i, g, j):
    """53 uniform bits: position j (from 0) of request i's verification after g tokens."""
    return mix((seed + i * 0x9E3779B97F4A7C15 + g * 0xD1B54A32D192ED03 + j * 0x8CB92BA72F3D8DD7) & MASK) >> 11
