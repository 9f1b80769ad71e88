"""The fleet's pools as configs and formulas: what a prefill replica runs, how many GPUs a fleet
takes and what they cost per hour (docs/model/fleets.md)."""

from __future__ import annotations

import math

from .routers import ROUTERS
from .schema import Config, Hardware


AUTO = "auto"  # fleet.prefill_replicas that fastsim plan chooses


def disaggregated(config: Config) -> bool:
    """True when a prefill pool serves the prompts and the replicas only decode."""
    return config.fleet.prefill_replicas == AUTO or config.fleet.prefill_replicas > 0


def sized_by_plan(config: Config) -> bool:
    """True when ``fastsim plan`` chooses the prefill pool's size (``fleet.prefill_replicas: auto``)."""
    return config.fleet.prefill_replicas == AUTO


def with_pools(config: Config, replicas: int, prefill: int | None = None) -> Config:
    """``config`` with ``replicas`` (decode) replicas, and ``prefill`` prefill replicas if given
    (for a pool sized by the plan; values already valid)."""
    values = {"fleet.replicas": replicas}
    if prefill is not None:
        values["fleet.prefill_replicas"] = prefill
    return config.at(values)


def prefix_cache(config: Config) -> bool:
    """True when the engines cache prefixes: ``engine.prefix_caching`` on continuous batching.
    Static and dynamic batching have no prefix cache (in vLLM or any engine): there the key has
    no effect, and a run goes as with it off (:func:`as_run`)."""
    return config.engine.prefix_caching and config.engine.policy == "continuous"


_last_off: tuple = (None, None)  # the engine section as_run last turned the cache off in, and the result


def as_run(config: Config) -> Config:
    """``config`` as its engines run it: ``engine.prefix_caching`` off where it has no effect
    (:func:`prefix_cache`), so that such a run is, to the bit, the run with it off. Points that
    share an engine section share the section returned (kernel plans are kept by identity)."""
    global _last_off
    e = config.engine
    if not e.prefix_caching or prefix_cache(config):
        return config
    last = _last_off
    if last[0] is not e:
        last = _last_off = (e, e.model_copy(update={"prefix_caching": False}))
    return config.model_copy(update={"engine": last[1]})


def cached(config: Config) -> bool:
    """True when the engines run the prefix-caching loop: a prefix cache, or sessions or
    closed-loop clients (whose arrivals wait for completions)."""
    w = config.workload
    return prefix_cache(config) or w.sessions is not None or w.concurrency is not None


def kind(config: Config) -> str:
    """How the fleet runs: ``one`` engine; replicas ``apart`` (a static router decides from the
    arrivals alone, so each replica runs by itself); a coupled ``pool`` (a load-aware router
    reads every replica's state at each arrival); ``disaggregated`` (a prefill pool, then
    the decode replicas); or ``cached`` (prefix caching or sessions, one engine or replicas, in
    one loop)."""
    f = config.fleet
    if disaggregated(config):
        return "disaggregated"
    if cached(config):
        return "cached"
    if f.replicas == 1:
        return "one"
    return "pool" if ROUTERS[f.router].load_aware else "apart"


def prefill_config(config: Config) -> Config:
    """The scenario one prefill replica runs: ``fleet.prefill_hardware`` (a preset; default the
    config's hardware), ``fleet.prefill_tp`` and ``fleet.prefill_max_batched_tokens`` (default
    the engine's); everything else as the config."""
    f, e = config.fleet, config.engine
    hardware = config.hardware if f.prefill_hardware is None else Hardware.model_validate({"preset": f.prefill_hardware})
    engine = e.model_copy(update={
        "tp": e.tp if f.prefill_tp is None else f.prefill_tp,
        "max_batched_tokens": e.max_batched_tokens if f.prefill_max_batched_tokens is None else f.prefill_max_batched_tokens,
    })
    return config.model_copy(update={"hardware": hardware, "engine": engine})


def gpus(config: Config) -> int:
    """GPUs of the whole fleet: replicas x engine.dp x engine.tp, plus prefill replicas x their tp."""
    f = config.fleet
    prefill = f.prefill_replicas * prefill_config(config).engine.tp if f.prefill_replicas else 0
    return f.replicas * config.engine.dp * config.engine.tp + prefill


def usd_per_hour(config: Config) -> float:
    """What the fleet's GPUs cost per hour on demand (each pool at its hardware's price); NaN
    where a price is unknown."""
    f = config.fleet

    def price(c: Config, replicas: int) -> float:
        each = c.hardware.usd_per_gpu_hour
        return 0.0 if replicas == 0 else (math.nan if each is None else replicas * c.engine.dp * c.engine.tp * each)

    return price(config, f.replicas) + (price(prefill_config(config), f.prefill_replicas) if f.prefill_replicas else 0.0)
