"""What the serving loop (:mod:`.serve`) is given: its pools of replicas, the rules every replica
shares, and how requests reach them. The routing's class is the run's *shape*, read when the loop
is compiled: one engine or a pool, and whether the run releases arrivals of its own (a session's
next turn, a prompt's KV reaching a decode pool). Each shape is compiled apart from the one
source, so that one engine over given arrivals carries none of a pool's or a session's code.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba.extending import overload

from ..._jit import inline, jit, largest
from ..router import ONE_ENGINE
from ._bare import occupancy
from ._calendar import RING_MAX
from ._speculative import Spec

# Per-request rows of the loop's ``work``.
(G, C, HELD, DBASE, PHASE, LAST_T, RPREV, RNEXT, CNEXT, CPREV, DUE, PNEXT, QNEXT, JOINED, SEQ, WORK_ROWS) = range(16)
# Per-replica scalars, columns of its ``st``.
(RHEAD, RTAIL, RUNNING, CURSOR, N_DEC, SUM_C, PARTIAL, PTOP, NPRE, QFIRST, QLAST, NWAIT, STEPS, BUSY, MAX_QUEUE,
 PREEMPTIONS, KV_SUM, KV_PEAK, FREE, AUX, RUN_KV, RUN_PAIRS, RUN_NW, RUN_M, RUN_S, ADMITTED,
 # a lock-step rank's step between scheduling it and running it (:mod:`._lockstep`): whether it has
 # rows, its tokens, KV tokens, pairs, sampled rows, rows (in its slice of the loop's) and decoders
 ACTIVE, STEP_N, STEP_KV, STEP_PAIRS, STEP_S, STEP_ROWS, STEP_W, N_STATE) = range(34)
assert ADMITTED == 25, ":func:`load` and :func:`save` keep columns RHEAD (0) to ADMITTED (25)"


class Pool(NamedTuple):
    """Replicas alike: how many, their step-time coefficients (:func:`fastsim.model.cost.frozen`),
    token budget (>= the running limit) and KV blocks (-1: unlimited; a router that counts blocks
    is given so many that they never bind), the least time after a replica's clock at which
    an arrival it releases can come (inf: it releases none), and the blocks each running request
    holds beyond those its tokens fill (a hybrid-attention model's: :func:`fastsim.model.cost.fixed_blocks`)."""

    replicas: int
    k: tuple
    budget: int
    blocks: int
    slack: float
    fixed: int


class Rules(NamedTuple):
    """What every replica shares: the running limit, tokens per block, the blocks a shared prefix
    pins (every admission starts with so many tokens), whether blocks are reserved at admission
    (for the longest output ``o_max``), async scheduling, the client's API overhead (a
    session's next turn comes that and its think time after the turn before is done), and
    speculative decoding (:class:`._speculative.Spec`; its ``OFF``)."""

    limit: int
    bt: int
    pb: int
    reserve: bool
    o_max: int
    lookahead: bool
    api_s: float
    spec: Spec


class Routing(NamedTuple):
    """How requests reach replicas: the router's code (:data:`fastsim.model.routers.ROUTERS`), the
    random router's replica per routed request, prefix_aware's weight; a session's later turns'
    think times, or closed-loop clients' (empty: neither); in front of a prefill pool, each request's KV transfer time
    and the random router's decode replica per request; for a decode pool run alone, each
    request's first token's time (its KV arrives with it); closed-loop clients (0: none: a done
    request releases its session's next turn). Use one of its shapes."""

    code: int
    routes: np.ndarray
    weight: float
    think: np.ndarray
    link_s: np.ndarray
    decode_routes: np.ndarray
    token_1: np.ndarray
    clients: int = 0
    next_start: np.ndarray = np.empty(0, np.int64)  # clients: per request, the next session's first turn
    # (each request its own session without sessions: i + 1); empty without clients
    dp: int = 1  # data-parallel ranks per replica (a lock-step shape's); the router chooses among replicas

    ALONE, RELEASES, LOCKSTEP = False, False, False


class Alone(Routing):
    """One engine over given arrivals: each joins its queue as it comes."""

    ALONE, RELEASES = True, False


class AloneReleasing(Routing):
    """One engine whose run releases arrivals (sessions)."""

    ALONE, RELEASES = True, True


class Routed(Routing):
    """A pool over given arrivals: each routed at its instant."""

    ALONE, RELEASES = False, False


class RoutedReleasing(Routing):
    """A pool whose run releases arrivals (sessions, a prefill pool in front)."""

    ALONE, RELEASES = False, True


class Lockstep(Routing):
    """Replicas of ``dp`` data-parallel ranks that step together, over given arrivals."""

    ALONE, RELEASES, LOCKSTEP = False, False, True


class LockstepReleasing(Routing):
    """Replicas of lock-step ranks whose run releases arrivals (sessions, closed-loop clients)."""

    ALONE, RELEASES, LOCKSTEP = False, True, True


SHAPES = {(True, False, False): Alone, (True, True, False): AloneReleasing, (False, False, False): Routed,
          (False, True, False): RoutedReleasing, (False, False, True): Lockstep, (False, True, True): LockstepReleasing}


def routing(code: int, routes: np.ndarray, weight: float, think: np.ndarray, link_s: np.ndarray,
            decode_routes: np.ndarray, token_1: np.ndarray, prefill: bool = False, clients: int = 0,
            next_start: np.ndarray = np.empty(0, np.int64), dp: int = 1) -> Routing:
    """The routing of a run in its shape: one engine when ``code`` is ``ONE_ENGINE``; releasing
    when there are sessions or ``clients`` (``think``) or a ``prefill`` pool in front; lock-step
    replicas of ``dp`` ranks when ``dp`` > 1 (``code``: the router among replicas)."""
    shape = SHAPES[(code == ONE_ENGINE and dp == 1, bool(think.size) or prefill, dp > 1)]
    return shape(np.int64(code), routes, float(weight), think, link_s, decode_routes, token_1, np.int64(clients),
                 next_start, np.int64(dp))


def alone(r):
    """Whether the run is one engine's (read when the loop is compiled)."""
    return r.ALONE


def releases(r):
    """Whether the run releases arrivals of its own (read when the loop is compiled)."""
    return r.RELEASES


def lockstep(r):
    """Whether replicas are data-parallel ranks that step together (read when the loop is compiled)."""
    return r.LOCKSTEP


@overload(lockstep, inline="always")
def _lockstep(r):
    value = r.instance_class.LOCKSTEP
    return lambda r: value


@overload(alone, inline="always")
def _alone(r):
    value = r.instance_class.ALONE
    return lambda r: value


@overload(releases, inline="always")
def _releases(r):
    value = r.instance_class.RELEASES
    return lambda r: value


@inline
def load(st, rep):
    """A replica's scalars, columns RHEAD to ADMITTED of ``st`` in order (the loop keeps them in
    locals while the replica runs)."""
    return (st[rep, 0], st[rep, 1], st[rep, 2], st[rep, 3], st[rep, 4], st[rep, 5], st[rep, 6], st[rep, 7], st[rep, 8],
            st[rep, 9], st[rep, 10], st[rep, 11], st[rep, 12], st[rep, 13], st[rep, 14], st[rep, 15], st[rep, 16],
            st[rep, 17], st[rep, 18], st[rep, 19], st[rep, 20], st[rep, 21], st[rep, 22], st[rep, 23], st[rep, 24],
            st[rep, 25])


@inline
def save(st, rep, values):
    """A replica's scalars back in ``st`` (as :func:`load` gives them)."""
    (st[rep, 0], st[rep, 1], st[rep, 2], st[rep, 3], st[rep, 4], st[rep, 5], st[rep, 6], st[rep, 7], st[rep, 8],
     st[rep, 9], st[rep, 10], st[rep, 11], st[rep, 12], st[rep, 13], st[rep, 14], st[rep, 15], st[rep, 16],
     st[rep, 17], st[rep, 18], st[rep, 19], st[rep, 20], st[rep, 21], st[rep, 22], st[rep, 23], st[rep, 24],
     st[rep, 25]) = values


@jit
def start(prompt, output, token_1, work, replicas, npre, pre_blocks, dec_blocks, pb, bt, limit, releasing, arrival_order,
          ranked=False):
    """The loop's state at the start: each request with nothing computed, or in a decode pool run
    alone (``token_1`` not empty) with its prompt computed and its first token emitted then; with
    ``arrival_order`` one engine's waiting queue linked in that order; every replica idle with
    its free blocks (all but a pinned prefix's); and room for what the loop keeps (``releasing``:
    a heap of released arrivals; ``ranked``: a step's rows for every replica, which step
    together). Returns (ring, stride, and the arrays: calendar buckets, their
    occupancy, decoders by phase, st, each replica's clock, its last step's start, outstanding
    requests, KV blocks in use, a step's rows (requests, computed tokens, new tokens), its
    completing decoders, the heap's times and requests, whether each request's KV is on its way,
    each link's free time, a step's prompts to send)."""
    n = prompt.size
    g, c, held, qnext = work[G], work[C], work[HELD], work[QNEXT]
    last_t = work[LAST_T].view(np.float64)
    decode_pool = token_1.size > 0
    for i in range(n):  # loops, not slice assignments or reductions: each of those adds about a second to
        # the compile a new user's first run waits for
        g[i] = 1 if decode_pool else 0
        c[i] = prompt[i] if decode_pool else 0
        held[i] = 0
        if decode_pool:
            last_t[i] = token_1[i]
        if arrival_order:
            qnext[i] = i + 1 if i + 1 < n else -1
    ring = min(largest(output) + 1, RING_MAX)
    stride = (ring + 63) & ~63  # replica r's calendar: buckets [r * stride, r * stride + ring)
    st = np.zeros((replicas, N_STATE), np.int64)
    used = np.zeros(replicas, np.int64)
    for rep in range(replicas):
        st[rep, RHEAD] = st[rep, RTAIL] = st[rep, PARTIAL] = st[rep, PTOP] = st[rep, QFIRST] = st[rep, QLAST] = -1
        if arrival_order:
            st[rep, QFIRST] = 0
        blocks = pre_blocks if rep < npre else dec_blocks
        st[rep, FREE] = blocks - pb if blocks >= 0 else 0
        used[rep] = pb if blocks >= 0 else 0
    rows = min(limit, n) + 1  # a step's rows at most (every request)
    slices = replicas if ranked else 1
    return (ring, stride, np.full(replicas * stride + 1, -1, np.int64),  # and a spare slot (:mod:`._running`)
            occupancy(replicas * stride), np.zeros((replicas, bt), np.int64), st, np.zeros(replicas),
            np.full(replicas, -np.inf), np.zeros(replicas, np.int64), used, np.empty(rows * slices, np.int64),
            np.empty(rows * slices, np.int64), np.empty(rows * slices, np.int64), np.empty(rows, np.int64),
            np.empty(n if releasing else 0),
            np.empty(n if releasing else 0, np.int64), np.zeros(n if npre > 0 else 0, np.bool_), np.zeros(max(npre, 1)),
            np.empty(rows, np.int64))
