"""Which tokens requests share (docs/model/prefix-cache.md): drawn here, with the traffic, for
system prompts and multi-turn sessions; read from a trace for the traces that record it.

Content identity is a tree: request r has a parent (a request, a system prompt, or none) and
``shared`` tokens, and block j of r is block j of its parent when (j + 1) B <= shared, else r's
own. Nodes 0..n-1 are the requests, n..n+G-1 the system prompts (their own parent -1). A hash-id
trace gives identities directly instead: block j of r is (hash id i, j) for the hash block i
holding its last token, while the block lies within the prompt.

Sessions: session s starts at the s-th arrival of the workload's process (``rate`` sessions per
second) and has T_s turns; turn 1's prompt is drawn from ``workload.prompt``, turn k+1's is turn
k's prompt + output + a follow-up; outputs from ``workload.output``; a later turn arrives its
think time after the turn before it is done (``think_s``; the kernel sets its arrival). Streams
of their own (children of the workload seed): turns 5, follow-ups 6, think times 7, groups 8;
arrivals 0, outputs 1 and prompts 2 as for independent requests.

Closed-loop clients (``concurrency``) are content too: requests that share nothing (or system
prompts), or sessions, whose arrivals after the first C the run sets (:func:`clients`); their
think times come from stream 7 (with sessions, whose turns take stream 7, from a stream of their
own).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .._jit import jit
from ..model.schema import Workload
from .streams import stream

TURNS, FOLLOWUP, THINK, GROUPS = 5, 6, 7, 8  # child streams of the workload seed
CLIENT_THINK = 1 << 20  # closed-loop clients' think times between sessions (beyond every replica's stall stream)


@dataclass(frozen=True)
class Content:
    """What requests share, beside a :class:`~fastsim.engine.traffic.Traffic`'s lengths."""

    parent: np.ndarray  # int64 (n + G,): a request, n + a system prompt, or -1
    shared: np.ndarray  # int64 (n + G,): tokens shared with the parent
    hash_start: np.ndarray  # int64 (n + 1,): request r's hash ids are hash_ids[hash_start[r]:hash_start[r + 1]]
    hash_ids: np.ndarray  # int64: dense ids 0..H-1 (empty: no hash-id trace)
    hash_block: int  # tokens per hash id
    session: np.ndarray  # int64 (n,): -1 outside sessions
    turn: np.ndarray  # int64 (n,): 1, 2, ... within a session; 0 outside
    system_prompt: np.ndarray  # int64 (n,): the request's group, -1 without
    think_s: np.ndarray  # float64 (n,): a later turn's (or client's request's) think time; NaN: its arrival is given
    clients: int = 0  # closed-loop clients (workload.concurrency): request j >= clients is sent after one is done

    @property
    def shares(self) -> bool:
        """Some request shares tokens with another or with a system prompt."""
        n = self.session.size
        return bool(self.hash_ids.size or (self.parent[:n] >= 0).any())

    @functools.cached_property
    def next_start(self) -> np.ndarray:
        """Closed-loop clients: per request, the request its client takes once this one's
        session is done (each request a session of its own without sessions): the first turn of
        the session after its own (n: none); empty without clients."""
        n = self.turn.size
        if not self.clients:
            return np.empty(0, np.int64)
        if not np.any(self.turn > 1):
            return np.arange(1, n + 1, dtype=np.int64)
        starts = np.append(np.flatnonzero(self.turn <= 1), n)
        return starts[np.searchsorted(starts, np.arange(n), side="right")]

    @property
    def closed_loop(self) -> bool:
        """Some arrivals depend on completions (sessions, closed-loop clients)."""
        return self.clients > 0 or bool(np.any(self.turn > 1))


def none(n: int) -> Content:
    """Every request's content its own (each array its own: a result hands them out)."""
    def minus() -> np.ndarray:
        return np.full(n, -1, np.int64)

    return Content(minus(), np.zeros(n, np.int64), np.empty(0, np.int64), np.empty(0, np.int64), 1, minus(),
                   np.zeros(n, np.int64), minus(), np.full(n, np.nan))


def groups(w: Workload, count: int) -> np.ndarray:
    """``count`` draws of a system prompt (-1 without any), from the groups' stream."""
    sp = w.system_prompts
    if sp is None:
        return np.zeros(count, np.int64) if w.prefix_tokens else np.full(count, -1, np.int64)
    u = stream(w.seed, GROUPS).random(count)
    if sp.popularity == "uniform":
        return np.minimum((u * sp.count).astype(np.int64), sp.count - 1)
    weights = 1.0 / np.arange(1, sp.count + 1) ** sp.zipf_s
    cdf = np.cumsum(weights)
    return np.minimum(np.searchsorted(cdf, u * cdf[-1], side="right"), sp.count - 1).astype(np.int64)


def system_tokens(w: Workload) -> tuple[int, int]:
    """(system prompts, tokens each): ``system_prompts``, or ``prefix_tokens`` as one."""
    if w.system_prompts is not None:
        return w.system_prompts.count, w.system_prompts.tokens
    return (1, w.prefix_tokens) if w.prefix_tokens else (0, 0)


def with_system_prompts(w: Workload, n: int) -> Content:
    """Independent requests, each starting with its group's system prompt."""
    count, tokens = system_tokens(w)
    group = groups(w, n)
    parent = np.concatenate([np.where(group >= 0, n + group, -1), np.full(count, -1, np.int64)])
    shared = np.concatenate([np.where(group >= 0, tokens, 0), np.zeros(count, np.int64)])
    c = none(n)
    return Content(parent, shared, c.hash_start, c.hash_ids, 1, c.session, c.turn, group, c.think_s)


def think_times(w: Workload, n: int, clients: bool = False) -> np.ndarray:
    """``n`` think times of the sessions' distribution, or with ``clients`` (or without
    sessions) the closed-loop clients'."""
    t = w.sessions.think_s if w.sessions is not None and not clients else w.think_s
    if t is None:  # clients without think time
        return np.zeros(n)
    if t.dist == "fixed":
        return np.full(n, t.value)
    rng = stream(w.seed, CLIENT_THINK if w.sessions is not None and clients else THINK)
    if t.dist == "exponential":
        return rng.standard_exponential(n) * t.mean
    return np.exp(rng.standard_normal(n) * t.sigma + t.mu)


def sessions(w: Workload, starts: np.ndarray, first_prompt: np.ndarray, output: np.ndarray, turns: np.ndarray,
             followup: np.ndarray, cap: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, Content]:
    """Requests as turns of sessions, from per-session draws (``starts``, ``first_prompt``,
    ``turns``, at least as many as sessions) and per-request ones (``output``, ``followup``).
    Returns arrival (NaN for later turns), prompt, output and the content."""
    n = output.size
    count, tokens = system_tokens(w)
    group = groups(w, n)  # one per session
    cap = np.iinfo(np.int64).max if cap is None else cap
    arrival, prompt, session, turn, parent, shared = _turns(starts, first_prompt, output, turns, followup, cap)
    system = np.where(turn > 0, group[np.maximum(session, 0)], -1) if count else np.full(n, -1, np.int64)
    parent = np.where((turn == 1) & (system >= 0), n + system, parent)
    shared = np.where((turn == 1) & (system >= 0), tokens, shared)
    parent = np.concatenate([parent, np.full(count, -1, np.int64)])
    shared = np.concatenate([shared, np.zeros(count, np.int64)])
    think = np.where(turn > 1, think_times(w, n), np.nan)
    c = none(n)
    return arrival, prompt, output, Content(parent, shared, c.hash_start, c.hash_ids, 1, session, turn, system, think)


def clients(w: Workload, c: Content) -> tuple[np.ndarray, Content]:
    """Closed-loop clients (``workload.concurrency`` C) over requests ``c`` (what they share:
    system prompts or nothing, or sessions): client k sends request k (with sessions, the k-th
    session's first turn) at k ramp_s / C; every later request (session) is taken, in order, by
    the first client whose request is done (whose session's last turn is), and sent its think
    time after; a session's later turns follow their turn before, as without clients. Returns the
    given arrivals (NaN for the requests the run releases) and the content."""
    n = c.think_s.size
    starts = np.flatnonzero(c.turn <= 1)  # what a client sends when it is free: a request, or a session
    first = min(w.concurrency, starts.size)
    arrival = np.full(n, np.nan)
    arrival[starts[:first]] = np.arange(first) * (w.ramp_s / w.concurrency)
    if w.sessions is None:
        think = think_times(w, n)
    else:  # a later turn keeps its session's think time; a first turn takes the client's
        think = c.think_s.copy()
        think[starts] = think_times(w, starts.size, clients=True)
    think[starts[:first]] = np.nan
    return arrival, Content(c.parent, c.shared, c.hash_start, c.hash_ids, c.hash_block, c.session, c.turn,
                            c.system_prompt, think, w.concurrency)


def chat_tree(c: Content, prompt: np.ndarray, output: np.ndarray) -> tuple[np.ndarray, np.ndarray, int] | None:
    """When requests share only system prompts (all of one length) and their session's turns
    before them (the whole of each, which a later turn waits for): each request's turn before
    (-1: none), its system prompt (-1: none) and the system prompts' tokens; else (a trace's
    sharing, whose requests may run beside what they share) None."""
    n = prompt.size
    if c.hash_ids.size:
        return None
    parent, shared = c.parent[:n], c.shared[:n]
    index = np.arange(n)
    turn = (c.turn > 1) & (parent == index - 1)
    system = (parent >= n) & (c.system_prompt >= 0)
    if not np.all(turn | system | (parent < 0)):
        return None
    before = np.flatnonzero(turn)
    if np.any(shared[before] != prompt[before - 1] + output[before - 1]) or np.any(
            c.system_prompt[before] != c.system_prompt[before - 1]):
        return None
    tokens = np.unique(shared[system])
    if tokens.size > 1:
        return None
    return np.where(turn, index - 1, -1), c.system_prompt.copy(), int(tokens[0]) if tokens.size else 0


@jit
def _turns(starts, first_prompt, output, turns, followup, cap):
    """Lay sessions' turns out as requests, in session order then turn order, until n."""
    n = output.size
    arrival = np.full(n, np.nan)
    prompt = np.empty(n, np.int64)
    session = np.empty(n, np.int64)
    turn = np.empty(n, np.int64)
    parent = np.full(n, -1, np.int64)
    shared = np.zeros(n, np.int64)
    r = 0
    s = 0
    while r < n:
        p = first_prompt[s]
        for k in range(1, turns[s] + 1):
            if r == n:
                break
            if k > 1:
                before = prompt[r - 1] + output[r - 1]
                p = before + followup[r]
                if p + output[r] > cap:
                    break  # the session ends before a turn that would pass its context
                parent[r] = r - 1
                shared[r] = before
            else:
                arrival[r] = starts[s]
            prompt[r] = p
            session[r] = s
            turn[r] = k
            r += 1
        s += 1
    return arrival, prompt, session, turn, parent, shared
