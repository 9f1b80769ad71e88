"""Fleets (docs/model/fleets.md): ``fleet.replicas`` copies of the config's engine behind
a router, optionally with a prefill pool in front. The driver folds each pool into a kernel
plan once, routes, runs the pools and pools their outcomes into one (counters summed, latencies
over every request, the step runs of every replica for the inter-token latencies).

Which loop runs each pool is :mod:`.paths`'s to say; every continuous-batching run is the
serving loop's (:mod:`.kernels.serve`), in one of its shapes (:mod:`.kernels._shape`):

- One replica and no prefill pool is the single engine (:func:`fastsim.engine.kernels.run`).
- A static router (round robin, random) decides from the request alone: each replica runs its
  own requests apart, as one engine. A load-aware router needs the replicas advanced together:
  one run of the pool.
- Content that requests share (system prompts, sessions: the prefix cache as runs of blocks,
  :mod:`.kernels._segments`; a trace's recorded sharing: block by block, :mod:`.kernels._cache`),
  and sessions, whose next turn the run releases when the turn before is done: one run of one
  engine or of the pool, behind any router.
- Disaggregated: the prefill pool runs each prompt as a one-token request (the prefill
  replicas' hardware, tp and budget; the shared prefix cached there); each prefill replica's KV
  link carries the prompts to the decode pool (:mod:`.link`), which routes them in order of KV
  arrival and decodes them from c = p, g = 1 (no pinned prefix), so the gap to the second token
  includes the transfer. Sessions behind a prefill pool run both pools in one run: a turn waits
  on the decode pool.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..model import fleet as pools
from ..model.routers import ROUTERS
from ..model.schema import Config
from . import content as shares
from . import link, paths, router, stalls
from .kernels import (FULL_COLUMNS, Outcome, Plan, Scratch, longest_output, outcome, run_engine, with_api,
                      with_room)
from .kernels import _segments as segments
from .kernels import _blocks as blockwise
from .kernels._kv import PAGED, RESERVE, Counters, Runs
from .kernels._shape import WORK_ROWS, Pool, Rules, routing as routing_of
from .kernels.serve import serve
from .router import ONE_ENGINE
from .traffic import Traffic, routes
from ..model.cost import frozen, step_time

def _merge(parts: list[tuple[np.ndarray, Outcome]], n: int, k: np.ndarray) -> Outcome:
    """One outcome from replicas' (their requests, their outcome), in engine time."""
    first, done = np.empty(n), np.empty(n)
    replica = np.empty(n, np.int32)
    for r, (ids, out) in enumerate(parts):
        first[ids], done[ids], replica[ids] = out.first_token_s, out.done_s, r
    outs = [out for _, out in parts]
    runs = [out.runs for out in outs if len(out.runs)]
    return Outcome(first, done, sum(o.steps for o in outs), sum(o.busy_slot_steps for o in outs),
                   max(o.max_queue for o in outs), sum(o.preemptions for o in outs),
                   sum(o.kv_block_steps for o in outs), sum(o.kv_capacity_steps for o in outs),
                   max((o.kv_peak_use for o in outs if o.kv_capacity_steps), default=float("nan")),
                   np.concatenate(runs) if runs else outs[0].runs[:0].copy(),
                   np.concatenate([o.gaps_s for o in outs]), k, replica)


def _apart(where: np.ndarray, replicas: int, k: np.ndarray, one) -> Outcome | None:
    """Replicas that run apart, each on its requests (``where``: each request's replica):
    ``one(ids)`` runs one replica's (None: it could not). Their outcomes merged, or None."""
    parts = []
    for r in range(replicas):
        ids = np.flatnonzero(where == r)
        if not ids.size:
            continue
        out = one(ids)
        if out is None:
            return None
        parts.append((ids, dataclasses.replace(out, runs=out.runs.copy())))  # the scratch is reused
    merged = _merge(parts, where.size, k)
    merged.replica[:] = where
    return merged


def _pool(p: Plan, loop: str, name: str, replicas: int, arrival: np.ndarray, prompt: np.ndarray,
          output: np.ndarray, draws: np.ndarray, scratch: Scratch | None, token_1: np.ndarray = np.empty(0),
          ids: np.ndarray = np.empty(0, np.int64)) -> Outcome:
    """``replicas`` replicas of plan ``p`` behind router ``name`` on ``loop`` (:mod:`.paths`:
    each apart on the one-engine kernels, or one run of the serving loop), on requests in routing
    order (``arrival`` non-decreasing); engine times. ``draws``: the random router's replica per
    request; ``ids``: each request's place in the run's traffic (empty: as given), which keys its
    speculative decoding's draws (such runs are one run of the serving loop)."""
    n = arrival.size
    if n == 0:  # every output was one token: the decode pool has nothing to do
        return Outcome(np.empty(0), np.empty(0), 0, 0, 0, 0, 0, 0, float("nan"), np.empty((0, FULL_COLUMNS), np.int64),
                       np.empty(0), p.k, np.empty(0, np.int32))
    if loop == paths.ENGINE:
        return _apart(router.assign(name, replicas, draws), replicas, p.k, lambda ids: run_engine(
            p, arrival[ids], prompt[ids], output[ids], scratch, token_1[ids] if token_1.size else token_1))
    return _served_pool(p, name, replicas, arrival, prompt, output, draws, scratch, token_1, ids)


def _served_pool(p: Plan, name: str, replicas: int, arrival: np.ndarray, prompt: np.ndarray, output: np.ndarray,
                 draws: np.ndarray, scratch: Scratch | None, token_1: np.ndarray = np.empty(0),
                 ids: np.ndarray = np.empty(0, np.int64)) -> Outcome:
    """:func:`_pool` with every replica in one run of :mod:`.kernels.serve` (a load-aware router, or
    replicas of data-parallel ranks)."""
    how = ROUTERS[name]
    n = arrival.size
    blocks = p.blocks if p.blocks >= 0 or not how.counts_blocks else 1 << 50  # counted in a cache of any size
    first, done = np.empty(n), np.empty(n)
    replica = np.empty(n, np.int64)
    scratch = Scratch() if scratch is None else scratch
    k = frozen(p.k)
    pools = (Pool(0, k, p.budget, blocks, np.inf, p.fixed_blocks),
             Pool(replicas * p.dp, k, p.budget, blocks, np.inf, p.fixed_blocks))
    spec = p.run_spec(ids)
    rules = Rules(p.limit, p.block_tokens, p.prefix_blocks, p.kv_mode == RESERVE, p.max_output, p.lookahead, 0.0, spec)
    routing = routing_of(how.code, draws.astype(np.int64), 1.0, NO_TIMES, NO_TIMES, NO_ROUTES, token_1, dp=p.dp)
    def call(runs: np.ndarray, gaps: np.ndarray) -> tuple:
        spec.counts.fill(0)  # (a run again with more room counts afresh)
        return _counters(serve(arrival, prompt, output, *pools, rules, routing,
                               Counters(p.kv_mode, p.max_output, p.fixed_blocks), NO_CACHE, first, done, replica,
                               NO_ROUTES, runs, gaps, scratch.work(WORK_ROWS, n)))[1]

    counters, runs, gaps = with_room(n, scratch, False, call)
    return outcome(p, first, done, counters, runs, gaps, replica.astype(np.int32), p.spec_counts(spec))


NO_TIMES = np.empty(0)
NO_ROUTES = np.empty(0, np.int64)
NO_CACHE = np.empty((0, 0), np.int64)  # the prefix cache's array, where KV is counted


def _counters(got: tuple) -> tuple[tuple, tuple, bool]:
    """:func:`.kernels.serve.serve`'s counters as :class:`~.kernels.Counters` takes them: (the
    prefill pool's, the others', whether it stopped)."""
    pre, counts, nruns, ngaps, stopped = got
    return (*pre, 0, 0), (*counts, nruns, ngaps), stopped


def run(config: Config, traffic: Traffic, scratch: Scratch | None = None) -> Outcome:
    """Simulate ``traffic`` on the fleet ``config`` describes, on the path :mod:`.paths` names
    (client times: the engines' stalls, then the API overhead). With ``scratch``, the outcome's
    step runs may live in it: valid until the next run that uses it."""
    f = config.fleet
    arrival, prompt, output, content = traffic.arrival_s, traffic.prompt_tokens, traffic.output_tokens, traffic.content
    tree = None if content is None else shares.chat_tree(content, prompt, output)
    closed = content is not None and content.closed_loop
    path = paths.of(config, content is not None and content.shares, tree is not None, closed)
    plan = Plan.of(config, longest_output(config, traffic), prefix=path.fleet != "disaggregated")
    draws = routes(config.workload, len(traffic), f.replicas, 0) if ROUTERS[f.router].draws else np.empty(
        len(traffic), np.int64)
    if path.fleet == "disaggregated":
        out = _disaggregated(config, plan, traffic, tree, path, draws, scratch)
    else:
        if path.shares or closed:
            out = _shared(config, plan, traffic, tree, draws, scratch)
        elif f.replicas == 1 and plan.dp == 1:  # the single engine, to the bit
            out = run_engine(plan, arrival, prompt, output, scratch)
        else:  # replicas apart or a coupled pool (data-parallel ranks: always): the router decides
            out = _pool(plan, path.loop, path.router, f.replicas, arrival, prompt, output, draws, scratch)
        out = dataclasses.replace(out, replica=None) if f.replicas == 1 else out  # one replica's, as always
    if path.fleet == "cached" and not path.shares and pools.prefix_cache(config):
        out = _no_hits(out)  # a cache over requests that share nothing (the plan's REHIT counts re-admissions)
    stalls.apply(config, out.arrivals(arrival), out.first_token_s, out.done_s, out.replica, out.prefill_replica)
    if closed and content.clients and config.calibration.stall_rate_hz:  # a client waits for the stalls it sees
        stalls.hold_clients(out.arrival_s, out.first_token_s, out.done_s, content.think_s,
                            config.calibration.api_overhead_ms / 1000, content.clients, content.next_start)
    return with_api(out, config.calibration.api_overhead_ms / 1000)


def _no_hits(out: Outcome) -> Outcome:
    """``out`` with the prefix cache's figures of requests that share nothing: no first admission
    hits."""
    return dataclasses.replace(out, cached_tokens=np.zeros(len(out.done_s), np.int64), prefix_hit_rate=0.0)


def _slack(k: np.ndarray, releases: float) -> float:
    """The least time after a replica's clock at which an arrival it releases can come: its
    shortest step (one token), then ``releases`` (inf: it releases none)."""
    return step_time(k, 1, 1, 1, 0) + releases


def _shared(config: Config, p: Plan, traffic: Traffic, tree: tuple | None, draws: np.ndarray,
            scratch: Scratch | None, output: np.ndarray | None = None,
            prefill: tuple[Plan, np.ndarray] | None = None) -> Outcome:
    """Requests that share content (system prompts, sessions, a trace's records) on ``p``'s
    replicas, in one run of :mod:`.kernels.serve` (engine times): the prefix cache as runs of
    blocks over a chat ``tree`` (:func:`.content.chat_tree`), or block by block (``tree`` None: a
    trace's recorded sharing; or where the runs' bookkeeping stopped). ``output``: the outputs
    they run (ones on a prefill pool run alone). With ``prefill`` (the prefill replicas' plan and
    their random router's draws), the replicas decode behind a prefill pool in the same loop
    (sessions: a turn waits on the decode pool). Closed-loop clients' requests that share nothing
    run here too (their arrivals wait for completions), the KV as counters (a preempted request
    re-hits its own blocks under the cache) unless a prefill pool caches in front."""
    f, c = config.fleet, traffic.content
    output = traffic.output_tokens if output is None else output
    n = len(traffic)
    caching = config.engine.prefix_caching
    held = caching and (c.shares or prefill is not None)  # the cache's content (else: counters, own re-hits)
    bt = p.block_tokens
    pre_plan, pre_draws = prefill if prefill is not None else (p, NO_ROUTES)
    npre = f.prefill_replicas if prefill is not None else 0
    think = c.think_s if c.closed_loop else NO_TIMES
    turns = p.api_s + float(np.nanmin(think)) if think.size and not np.isnan(think).all() else np.inf
    link_s = link.transfer_s(config, traffic.prompt_tokens) if npre else NO_TIMES
    pre_slack = _slack(pre_plan.k, min(float(link_s.min()) if n else np.inf, turns)) if npre else np.inf
    dec_slack = _slack(p.k, turns)
    assert min(pre_slack, dec_slack) > 0, "a step takes time (model.params_b > 0: it reads KV), so pools keep in step"
    one = f.replicas == 1 and not npre
    code = ONE_ENGINE if one else ROUTERS[f.router].code
    pb = 0 if caching else p.prefix_blocks
    spec = p.run_spec()
    rules = Rules(p.limit, bt, pb, False, p.max_output, p.lookahead, p.api_s, spec)
    routing = routing_of(code, (pre_draws if npre else draws).astype(np.int64), f.prefix_weight, think, link_s,
                         draws.astype(np.int64), NO_TIMES, prefill=npre > 0, clients=c.clients,
                         next_start=c.next_start, dp=p.dp)
    pre = Pool(npre, frozen(pre_plan.k), pre_plan.budget, pre_plan.blocks, pre_slack, pre_plan.fixed_blocks)
    dec = Pool(f.replicas * p.dp, frozen(p.k), p.budget, p.blocks, dec_slack, p.fixed_blocks)
    scratch = Scratch() if scratch is None else scratch
    first, done = np.empty(n), np.empty(n)
    replica, pre_replica = np.full(n, -1, np.int64), np.full(n, -1, np.int64)
    blocks = pre_plan.blocks if npre else p.blocks  # the caching replicas'
    got = []  # the last call's arrivals, KV state and counters

    def call(runs: np.ndarray, gaps: np.ndarray, tree: tuple | None) -> tuple:
        arrived = traffic.arrival_s.copy()
        if not held:
            kv, cache = Counters(p.kv_mode if caching else PAGED, p.max_output,
                                 pre_plan.fixed_blocks if npre else p.fixed_blocks), NO_CACHE
        elif tree is not None:
            parent, group, tokens = tree
            gend = tokens // bt
            group = group if gend else np.full_like(group, -1)
            groups = max(int(group.max()) + 1, 1) if n else 1
            cache, layout = segments.start(max(p.blocks, pre_plan.blocks), groups, npre + f.replicas * p.dp, group,
                                           parent)
            kv = Runs(*layout, gend)
        else:
            kv, cache = blockwise.start(c, traffic.prompt_tokens, output, bt, npre or f.replicas * p.dp, blocks), NO_CACHE
        spec.counts.fill(0)  # (a run again with more room counts afresh)
        counters = _counters(serve(arrived, traffic.prompt_tokens, output, pre, dec, rules, routing, kv, cache, first,
                                   done, replica, pre_replica, runs, gaps, scratch.work(WORK_ROWS, n)))
        got[:] = [arrived, kv, cache, counters]
        return (0,) * 8 if counters[2] else counters[1]

    counters, runs, gaps = with_room(n, scratch, False, lambda runs, gaps: call(runs, gaps, tree))
    if got[-1][2]:  # the runs' bookkeeping stopped: block by block
        counters, runs, gaps = with_room(n, scratch, False, lambda runs, gaps: call(runs, gaps, None))
    arrived, kv, cache, (pre_counters, _, _) = got
    if not held or not n:
        cached = np.zeros(n, np.int64)
    else:
        cached = kv.cached.copy() if isinstance(kv, blockwise.Blocks) else cache[-n:, segments.CACHED].copy()
    out = outcome(p, first, done, counters, runs, gaps, None if one else replica.astype(np.int32),
                  p.spec_counts(spec))
    if npre:
        pre_out = outcome(pre_plan, first, done, pre_counters, runs[:0], gaps[:0])
        out = _joined(pre_out, out, first, done, replica.astype(np.int32), pre_replica.astype(np.int32))
    return _with_hits(out, traffic, arrived, cached, caching)


def _with_hits(out: Outcome, traffic: Traffic, arrived: np.ndarray, cached: np.ndarray, caching: bool) -> Outcome:
    """``out`` with what the cache's runs add: the arrivals they set (sessions), each request's
    cached tokens and the hit rate (NaN without a cache)."""
    prompt = traffic.prompt_tokens.sum()
    closed = traffic.content is not None and traffic.content.closed_loop
    return dataclasses.replace(out, arrival_s=arrived if closed else None, cached_tokens=cached,
                               prefix_hit_rate=float(cached.sum()) / float(prompt) if caching and prompt else np.nan)


def _joined(pre: Outcome, dec: Outcome, first: np.ndarray, done: np.ndarray, replica: np.ndarray,
            pre_replica: np.ndarray) -> Outcome:
    """A disaggregated fleet's outcome from its prefill pool's and its decode pool's: each
    request's first token and done time, decode replica (-1: done at its prefill) and prefill
    replica."""
    assert not len(pre.runs), "a prefill replica never decodes"
    both = (pre, dec)
    return Outcome(first, done, pre.steps + dec.steps, pre.busy_slot_steps + dec.busy_slot_steps,
                   max(pre.max_queue, dec.max_queue), pre.preemptions + dec.preemptions,
                   pre.kv_block_steps + dec.kv_block_steps, pre.kv_capacity_steps + dec.kv_capacity_steps,
                   max((o.kv_peak_use for o in both if o.kv_capacity_steps), default=float("nan")), dec.runs,
                   np.concatenate([pre.gaps_s, dec.gaps_s]), dec.k, replica, pre_replica,
                   cached_tokens=pre.cached_tokens, prefix_hit_rate=pre.prefix_hit_rate, spec_counts=dec.spec_counts)


def _disaggregated(config: Config, plan: Plan, traffic: Traffic, tree: tuple | None, path: paths.Path,
                   draws: np.ndarray, scratch: Scratch | None) -> Outcome:
    """A prefill pool in front of the decode replicas (engine times)."""
    f = config.fleet
    n = len(traffic)
    arrival, prompt, output = traffic.arrival_s, traffic.prompt_tokens, traffic.output_tokens
    # the prefill pool: every prompt as a one-token request
    prefill = Plan.of(pools.prefill_config(config), 1)
    pre_draws = routes(config.workload, n, f.prefill_replicas, 1) if ROUTERS[f.router].draws else draws
    if path.prefill == "joint":  # a turn waits on the decode pool: one loop
        return _shared(config, plan, traffic, tree, draws, scratch, prefill=(prefill, pre_draws))
    ones = np.ones(n, np.int64)
    if traffic.content is None:  # nothing shared: the KV counters
        pre = _pool(prefill, path.prefill, path.router, f.prefill_replicas, arrival, prompt, ones, pre_draws, scratch)
        pre = _no_hits(pre) if pools.prefix_cache(config) else pre
    else:  # the prompts are cached where they are computed
        pre_config = config.at({"fleet.replicas": f.prefill_replicas})
        pre = _shared(pre_config, prefill, traffic, tree, pre_draws, scratch, output=ones)
        if pre.replica is None:
            pre = dataclasses.replace(pre, replica=np.zeros(n, np.int32))
    ended = pre.done_s  # the end of each prompt's step: its first token (engine time)
    sent = output > 1
    reached = link.kv_arrivals(config, ended, prompt, sent, pre.replica)
    ids = np.flatnonzero(sent)
    ids = ids[np.lexsort((ids, reached[ids]))]  # the decode pool's order: by KV arrival, ties by index
    dec = _pool(plan, path.loop, path.router, f.replicas, reached[ids], prompt[ids], output[ids], draws[ids], scratch,
                token_1=ended[ids], ids=ids)
    done = ended.copy()
    done[ids] = dec.done_s
    replica = np.full(n, -1, np.int32)
    replica[ids] = dec.replica
    return _joined(pre, dec, ended, done, replica, pre.replica)
