"""A deliberately simple pure-Python simulator of attention data parallelism (docs/model/deployed.md,
"Attention data parallelism"): the serving oracle's engines as ranks that step in lock-step.

A replica is ``dp`` ranks, each a :class:`.serving.Replica` with its own waiting queue, running
list, token budget and KV blocks. A request goes, at its arrival and after every step that
started before it, to a replica by the fleet's router (from the sums over each replica's ranks),
then to the replica's rank with the least 4 x waiting + running (ties: the lower rank).
Each step every rank schedules its own rows at the common clock; the step takes the overhead
plus the slowest rank's time, in which each rank reads its dense weights, its share of the
routed experts that no token of any rank picks not read, and its KV, and computes its own
tokens through the dense layers and its share of all ranks' tokens through the experts; a rank
with nothing to run waits the step out. When no rank has rows, no time passes (a rank that
preempted its only request admits it again at once); when no rank has work the clock jumps to
the next arrival.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .fleet import _choose
from .serving import Engine, Replica, result


@dataclass
class RankCost:
    """One rank's part of a lock-step step, in physical terms written out from the docs."""

    overhead_s: float
    dense_bytes: float  # every weight but the routed experts (a rank's tp GPUs hold them all)
    expert_bytes: float  # all routed experts of every MoE layer, over the dp ranks
    k_over_e: float
    kv_gpu: float  # KV bytes per token one GPU holds
    tp: int
    dp: int
    gpu_bytes_s: float
    params_b: float | None  # active parameters per token (None: compute is free)
    expert_params_b: float  # of which routed experts'
    dtype_flops: float
    bf16_flops: float
    n_layers: int
    attn_dim: int
    hidden: int
    vocab: int | None
    comm_fixed_s: float  # the rank's all-reduces and the exchange's latencies
    comm_s_per_token: float  # and their transfer time per token of the rank
    row_gpu: float = 0.0  # hybrid attention: bytes one GPU reads per sampled row (windows, states read and written)
    window_pairs: float = 0.0  # ... and query-key pairs per computed token over the local layers
    index_pair_flops: float = 0.0  # sparse attention: its indexer's FLOPs per query-key pair, every layer,
    index_flops: float | None = None  # at one GPU's achieved FLOP/s for it
    draft_scale: float = 1.0  # speculative decoding: k draft passes make the step this many times as long,
    fixed_s: float = 0.0  # but for this fixed overhead

    def rank(self, n_all, N, C, A, S):
        unread = self.expert_bytes * (1 - self.k_over_e) ** n_all if self.expert_bytes else 0.0
        t_mem = ((self.dense_bytes + (self.expert_bytes - unread) / self.dp) / self.tp / self.gpu_bytes_s
                 + self.kv_gpu / self.gpu_bytes_s * C + self.row_gpu / self.gpu_bytes_s * S)
        t_cmp = 0.0
        if self.params_b is not None:
            t_cmp = 2e9 * (self.params_b - self.expert_params_b) * N / self.tp / self.dtype_flops
            t_cmp += 2e9 * self.expert_params_b * n_all / self.dp / self.tp / self.dtype_flops
            t_cmp += (2 * self.hidden * self.vocab * S if self.vocab else 0) / self.tp / self.bf16_flops
            t_cmp += 4 * self.n_layers * self.attn_dim * A / self.tp / self.bf16_flops
            t_cmp += 4 * self.attn_dim * self.window_pairs * N / self.tp / self.bf16_flops
            if self.index_pair_flops:
                t_cmp += self.index_pair_flops * A / self.tp / self.index_flops
        return max(t_mem, t_cmp) + self.comm_fixed_s + self.comm_s_per_token * N

    def step(self, stats):
        """A step over the ranks' (N, C, A, S) (those with rows)."""
        n_all = sum(s[0] for s in stats)
        total = self.overhead_s + max(self.rank(n_all, *s) for s in stats)
        return self.fixed_s + self.draft_scale * (total - self.fixed_s)


def balance(ranks):
    """The rank a request goes to: the least 4 x waiting + running, ties the lower rank."""
    return min(range(len(ranks)), key=lambda j: (4 * len(ranks[j].waiting) + len(ranks[j].running), j))


class Group:
    """One replica: ``dp`` ranks on one clock."""

    def __init__(self, e: Engine, cost: RankCost, dp: int, arrival, prompt, output):
        self.cost = cost
        self.ranks = [Replica(e, arrival, prompt, output) for _ in range(dp)]
        self.now = 0.0

    def has_work(self):
        return any(r.has_work() for r in self.ranks)

    def outstanding(self):
        return sum(r.outstanding() for r in self.ranks)

    def blocks_in_use(self):
        return sum(r.blocks_in_use() for r in self.ranks)

    def wake(self, t):
        """An idle replica wakes when a request reaches it."""
        if not self.has_work():
            self.now = max(self.now, t)
            for r in self.ranks:
                r.now = self.now

    def advance(self, until):
        """Run every step that starts before ``until``."""
        while self.has_work() and self.now < until:
            rows = [r.schedule(no_more=False) for r in self.ranks]
            if not any(rows):
                continue
            d = self.cost.step([r.totals(x) for r, x in zip(self.ranks, rows) if x])
            for r, x in zip(self.ranks, rows):
                if x:
                    r.finish(x, d)
                else:
                    r.now += d
            self.now = self.ranks[0].now


def simulate(arrival, prompt, output, e: Engine, cost: RankCost, dp: int, replicas: int = 1,
             router: str = "round_robin", routes=None):
    """``replicas`` replicas of ``dp`` ranks behind ``router`` (the fleet oracle's, over each
    replica's sums), fed their arrivals (continuous batching). Returns a dict as
    :func:`.serving.simulate`'s, plus ``rank`` (per request, within its replica) and
    ``replica``; ``steps`` counts each rank's steps with rows."""
    n = len(arrival)
    if router == "least_kv" and e.blocks is None:
        e = dataclasses.replace(e, blocks=10**15)
    groups = [Group(e, cost, dp, arrival, prompt, output) for _ in range(replicas)]
    rank, replica = [None] * n, [None] * n
    for i in range(n):
        for g in groups:
            g.advance(arrival[i])
        j = _choose(router, i, i, groups, routes)
        g = groups[j]
        g.wake(arrival[i])
        r = balance(g.ranks)
        g.ranks[r].join(i)
        rank[i], replica[i] = r, j
    for g in groups:
        g.advance(math.inf)
    merged = Replica(e, arrival, prompt, output)
    for r in (r for g in groups for r in g.ranks):
        merged.first_token.update(r.first_token)
        merged.done.update(r.done)
        merged.gaps += r.gaps
        merged.kv_used += r.kv_used
        merged.steps += r.steps
        merged.busy += r.busy
        merged.preemptions += r.preemptions
        merged.max_queue = max(merged.max_queue, r.max_queue)
    out = result(merged, range(n), e.api_s)
    out.update(rank=rank, replica=replica)
    return out
