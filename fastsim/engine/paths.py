"""The registry of run paths (docs/performance.md#run-paths): which compiled loop runs a
config's pools, behind which router, and where it falls back. The fleet's driver
(:mod:`.fleet`), the batched sweep path (:mod:`fastsim.analysis.batch`), a sweep's warm-up
(:mod:`fastsim.sweep.runner`) and the memory estimate (:mod:`fastsim.sweep.memory`) read it;
nothing else decides.

The loops:

- ``engine``: the one-engine kernels (:func:`.kernels.one_engine.kernel_of`: the lesson's, or
  the serving loop in its one-engine shape), on one engine, or on each replica of a pool whose
  router decides from the request alone (the replicas run apart);
- ``serve``: one run of the serving loop (:mod:`.kernels.serve`) over every replica: a
  load-aware router, content the requests share, sessions, closed-loop clients, data-parallel
  ranks (its lock-step shape).

Where requests share content, its KV state (:mod:`.kernels._kv`) is the prefix cache as ``runs``
of blocks for a chat tree (system prompts and sessions' turns), or ``blocks``, one by one, for a
trace's recorded sharing, which runs cannot hold (a request may run beside what it shares), and
where the runs' bookkeeping stops (the rules keep that from happening; the loop checks).
"""

from __future__ import annotations

from typing import NamedTuple

from ..model import fleet as pools
from ..model.routers import ROUTERS
from ..model.schema import Config

ENGINE, SERVE = "engine", "serve"
RUNS, BLOCKS = "runs", "blocks"


class Path(NamedTuple):
    fleet: str  # how the fleet runs (:func:`fastsim.model.fleet.kind`)
    loop: str  # the replicas' loop (the decode pool's, behind a prefill pool)
    prefill: str  # the prefill pool's loop; "" without one; "joint" when both pools run in the replicas' loop
    router: str  # the router the replicas run: prefix_aware is least_kv where they cache nothing
    shares: str  # what requests share, as the replicas' loop holds it: "" (nothing), RUNS or BLOCKS


def uncached(router: str) -> str:
    """The router a pool that caches nothing runs: prefix-aware routing scores prompts against
    the cache, and with nothing cached (nothing shared, or a decode pool, whose prompts arrive
    whole) every replica would miss the whole prompt: what is left is least_kv's score."""
    return "least_kv" if router == "prefix_aware" else router


def shares(config: Config) -> bool:
    """Whether the config's requests share content, as its workload says: system prompts,
    sessions, or under a prefix cache a shared prefix or a trace (which counts as sharing)."""
    w = config.workload
    return (w.sessions is not None or w.system_prompts is not None
            or (pools.prefix_cache(config) and (bool(w.prefix_tokens) or w.trace is not None)))


def of(config: Config, shared: bool | None = None, tree: bool = True, closed: bool | None = None) -> Path:
    """The path of ``config``. ``shared``: whether its requests share content (the traffic's
    :attr:`~.traffic.Traffic.content` is set); None: as the config says, a trace counting as
    shared (:attr:`.content.Content.shares`). ``tree``: whether what they share is a chat tree (system prompts, sessions:
    :func:`.content.chat_tree`), which the serving loop's cache holds; a trace's recorded
    sharing is not. ``closed``: whether some arrivals wait for completions (later turns of
    sessions, requests of closed-loop clients; None: whether the workload has sessions or clients)."""
    f, w = config.fleet, config.workload
    kind = pools.kind(config)
    closed = (w.sessions is not None or w.concurrency is not None) if closed is None else closed
    if shared is None:
        shared = shares(config)
        tree = tree and w.trace is None
    held = RUNS if tree else BLOCKS
    router = uncached(f.router)
    # a pool of replicas that caches nothing: apart, unless load-aware, or speculating (each request's
    # acceptance draws are its own in one loop over the fleet's requests)
    pool = SERVE if ROUTERS[router].load_aware or config.engine.speculative is not None else ENGINE
    if kind == "disaggregated":
        if closed:  # a turn (a client's next request) waits on the decode pool: one loop for both
            return Path(kind, SERVE, "joint", f.router, held)
        return Path(kind, pool, SERVE if shared else pool, router, "")
    if kind == "cached" and (shared or closed):  # (arrivals that wait for completions: the serving loop)
        return Path(kind, SERVE, "", f.router if shared else router, held if shared else "")
    if config.engine.dp > 1:  # data-parallel ranks step together: the serving loop's lock-step shape
        return Path(kind, SERVE, "", router, "")
    return Path(kind, ENGINE if f.replicas == 1 else pool, "", f.router if kind == "one" else router, "")


def batchable(config: Config, shared: bool, warmup: int) -> bool:
    """Whether a point runs on :mod:`fastsim.analysis.batch`'s compiled loop over many small
    runs: one engine on the one-engine kernels (also with a prefix cache over requests that share
    nothing), every request measured."""
    path = of(config, shared)
    return (warmup == 0 and path.loop == ENGINE and config.fleet.replicas == 1 and path.fleet != "disaggregated"
            and config.engine.speculative is None)


def compiled(config: Config) -> tuple:
    """What decides the compiled code a config runs (a sweep's warm-up compiles each once): its
    path, and the one-engine kernel's model and policy."""
    from .kernels import Plan  # (the plan folds the cost model: only where a kernel is chosen)

    plan = Plan.of(config)
    return of(config), plan.lesson, plan.policy == "continuous"
