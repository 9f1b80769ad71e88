"""Replicas of data-parallel ranks that step together, for the serving loop (:mod:`.serve`;
docs/model/deployed.md, "Attention data parallelism").

The loop's replicas are then ranks, ``dp`` of them a replica (rank r of replica r // dp). A
replica runs a step in two passes over its ranks: each rank with work schedules its rows at the
common clock (preempting, admitting: the loop's phases 1 and 2) and stops before the step; the
step's time is the overhead plus the slowest rank's (:func:`fastsim.model.cost.rank_time`, over
every rank's tokens); then each rank with rows runs it (phase 3) and every other rank's clock
moves with them. When no rank has rows no time passes; when none has work the replica waits for
an arrival. The step is recorded once, as its slowest rank's step (:func:`fastsim.model.cost.group_step_time`).
"""

from __future__ import annotations

from ..._jit import inline
from ...model.cost import OVERHEAD, rank_time
from ._calendar import extend_run
from ._route import earliest, working
from ._shape import (ACTIVE, NWAIT, RUN_KV, RUN_M, RUN_NW, RUN_PAIRS, RUN_S, RUNNING, STEP_KV, STEP_N, STEP_PAIRS,
                     STEP_ROWS, STEP_S, STEP_W)


@inline
def keep_step(st, rep, n_tok, kv_tok, pairs, sampled, nrows, n_dec):
    """A rank's scheduled step (its tokens, KV tokens, pairs, sampled rows, rows, decoders), kept
    until its replica's step runs (:func:`step_of`)."""
    st[rep, ACTIVE], st[rep, STEP_N], st[rep, STEP_KV], st[rep, STEP_PAIRS] = 1, n_tok, kv_tok, pairs
    st[rep, STEP_S], st[rep, STEP_ROWS], st[rep, STEP_W] = sampled, nrows, n_dec


@inline
def kept_step(st, rep):
    """A rank's step as :func:`keep_step` kept it: (tokens, KV tokens, pairs, sampled rows, rows)."""
    return st[rep, STEP_N], st[rep, STEP_KV], st[rep, STEP_PAIRS], st[rep, STEP_S], st[rep, STEP_ROWS]


@inline
def step_of(k, st, base, dp, runs, nruns):
    """The replica's step over the ranks that scheduled rows: its seconds (0: none has rows),
    and the step recorded in the first rank's open run. Returns (seconds, nruns)."""
    n_all = w = 0
    for r in range(base, base + dp):
        if st[r, ACTIVE]:
            n_all += st[r, STEP_N]
            w += st[r, STEP_W]
    slowest, t = -1, 0.0
    for r in range(base, base + dp):
        if st[r, ACTIVE]:
            x = rank_time(k, n_all, st[r, STEP_N], st[r, STEP_KV], st[r, STEP_PAIRS], st[r, STEP_S])
            if slowest < 0 or x > t:
                slowest, t = r, x
    if slowest < 0:
        return 0.0, nruns
    s = slowest
    nruns, st[base, RUN_KV], st[base, RUN_PAIRS], st[base, RUN_NW], st[base, RUN_M], st[base, RUN_S] = extend_run(
        runs, nruns, st[base, RUN_KV], st[base, RUN_PAIRS], st[base, RUN_NW], st[base, RUN_M], st[base, RUN_S],
        st[s, STEP_N], st[s, STEP_KV], st[s, STEP_PAIRS], 1, w, st[s, STEP_S] | (n_all << 32))
    return k[OVERHEAD] + t, nruns


@inline
def next_rank(k, st, now_r, runs, nruns, until, dp, releasing, slack, turn, cur, bound, stage, sub, d):
    """The rank the serving loop runs next, and the pass: 0 to schedule its rows, 1 to run the
    step. A replica runs (``cur``, from ``turn`` in order over given arrivals, else the earliest
    with work) while its clock is before ``bound`` (``until``; where the run releases arrivals,
    also where no release of the others reaches) and a rank has work; between the passes the
    step's time ``d`` is set and recorded (in ``runs``). Returns (rank, or -1 when no replica
    runs before ``until``; pass, sub, turn, cur, bound, d, nruns)."""
    groups = now_r.size // dp
    while True:
        if cur >= 0:
            base = cur * dp
            if sub < dp:
                rep = base + sub
                sub += 1
                if stage == 0:
                    st[rep, ACTIVE] = 0
                    if st[rep, RUNNING] > 0 or st[rep, NWAIT] > 0:
                        return rep, stage, sub, turn, cur, bound, d, nruns
                elif st[rep, ACTIVE]:
                    return rep, stage, sub, turn, cur, bound, d, nruns
                else:
                    now_r[rep] += d  # a rank with nothing to run waits the step out
                continue
            sub = 0
            if stage == 0:
                d, nruns = step_of(k, st, base, dp, runs, nruns)
                if d > 0.0:
                    stage = 1
                elif not working(st, base, dp):
                    cur = -1  # (else a rank preempted its only request: it schedules again at once)
                continue
            stage = 0
            if now_r[base] >= min(bound, until) or not working(st, base, dp):
                cur = -1
            continue
        if releasing:
            rep, bound = earliest(st, now_r, until, 0, slack, slack, dp)
            if rep < 0:
                return -1, stage, sub, turn, cur, bound, d, nruns
            cur = rep // dp
        else:
            while turn < groups and (now_r[turn * dp] >= until or not working(st, turn * dp, dp)):
                turn += 1
            if turn == groups:
                return -1, stage, sub, turn, cur, bound, d, nruns
            cur = turn
            turn += 1
            bound = until
        stage = sub = 0
