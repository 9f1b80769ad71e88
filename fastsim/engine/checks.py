"""Whether a scenario can run at all: the checks that span config sections, run once by the
driver before any simulation (a run, or every combination of the axes a check reads in a
sweep). Each refuses with :class:`ConfigError`, naming the keys and the numbers.

The schema (:mod:`fastsim.model.schema`) checks fields alone; what needs several sections, the
cost model or a trace file is here: the token budget against the running limit (vLLM's rule), a
shared prefix shorter than every prompt, tensor parallelism that divides the KV heads and has a
link to cost, weights that fit in memory, a step cost that stays finite (one step of the
longest request within a year), a longest request that fits in the KV cache, the
fleet's prefill pool (continuous only, its own tp, hardware and budget) and routers that need
continuous batching.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..model import fleet, speculative
from ..model.cost import COEFFICIENT_KEYS, UNPICKED, coefficients, fixed_blocks, kv_blocks, kv_capacity_gb
from ..model.routers import ROUTERS
from ..model.schema import Config, ConfigError
from . import paths, trace



def _workload_is_whole(config: Config) -> None:
    w = config.workload
    for key, value in (("rate", w.rate), ("n_requests", w.n_requests)):
        if value is None and w.trace is None and not (key == "rate" and w.concurrency is not None):
            raise ConfigError(f"workload.{key}: null (as recorded) needs a workload.trace")
    if w.rng == "stdlib":  # the lesson's stream: Poisson arrivals, fixed prompts, its output lengths
        for key, value, lesson in (("arrival", w.arrival, "poisson"), ("prompt.dist", w.prompt.dist, "fixed"),
                                   ("output.dist", w.output.dist, "lognormal or fixed"), ("trace", w.trace, "")):
            if value is not None and value not in lesson.split(" or "):
                has = f"{key} {lesson}" if lesson else f"no {key}"
                raise ConfigError(f"workload.{key}: {value!r} needs workload.rng: numpy "
                                  f"(the lesson's stdlib stream has {has})")


def _names(config: Config, prefill: bool) -> Callable[[str], str]:
    """How errors name an engine key: as written, or for the prefill pool the fleet key that set it."""
    f = config.fleet
    renamed = {}
    if prefill:
        if f.prefill_tp is not None:
            renamed["engine.tp"] = "fleet.prefill_tp"
        if f.prefill_max_batched_tokens is not None:
            renamed["engine.max_batched_tokens"] = "fleet.prefill_max_batched_tokens"
    hardware = f"fleet.prefill_hardware {f.prefill_hardware}'s " if prefill and f.prefill_hardware else "hardware."

    def name(key: str) -> str:
        return renamed.get(key, hardware + key.removeprefix("hardware.") if key.startswith("hardware.") else key)

    return name


def _engine_runs(config: Config, output_max: int, prefill: bool = False) -> None:
    """The engine of ``config`` (for the prefill pool: :func:`fastsim.model.fleet.prefill_config`)
    can hold its model and the workload's longest request (``output_max`` output tokens)."""
    hw, m, e, w = config.hardware, config.model, config.engine, config.workload
    key = _names(config, prefill)
    pool = "the prefill replicas: " if prefill else ""
    if e.max_batched_tokens is not None and e.policy == "continuous" and e.max_batched_tokens < e.limit:
        raise ConfigError(
            f"{pool}{key('engine.max_batched_tokens')} ({e.max_batched_tokens}) must be at least the running limit, "
            f"min(engine.max_batch, engine.max_concurrent) ({e.limit}), as in vLLM"
        )
    if e.expert_parallel and not m.experts:
        raise ConfigError(f"{pool}engine.expert_parallel needs a mixture of experts (model.experts is 0"
                          f"{f' for model.preset {m.preset}' if m.preset else ''})")
    if e.tp > 1:
        if m.kv_heads is not None and not m.kv_lora_rank and m.kv_heads % e.tp and e.tp % m.kv_heads:
            of = (f"model.preset {m.preset}" if m.preset else f"model.config_json {m.config_json}" if m.config_json
                  else "the model (model.kv_heads)")
            raise ConfigError(f"{key('engine.tp')} ({e.tp}) must divide the {m.kv_heads} KV heads of {of}, or be a "
                              f"multiple of them (each GPU then holds a copy of one)")
        _collectives(config, f"{key('engine.tp')} ({e.tp}) > 1", "the all-reduce cost", key)
        _spans(config, f"{key('engine.tp')} ({e.tp})", e.tp, "a tp", key)
    if e.dp > 1 and not prefill:
        _data_parallel(config)
    _steps_are_finite(config, w.prompt.largest + output_max if w.trace is None else 1, key)
    capacity = kv_capacity_gb(config)
    if capacity is not None and capacity <= 0:
        raise ConfigError(
            f"{pool}model.weight_gb ({m.weight_gb:g}) does not fit: {key('engine.tp')} ({e.tp}) x "
            f"({key('hardware.mem_gb')} ({hw.mem_gb:g}) x engine.gpu_memory_utilization ({e.gpu_memory_utilization:g}) "
            f"- engine.reserved_gb ({e.reserved_gb:g})) = {e.tp * (hw.mem_gb * e.gpu_memory_utilization - e.reserved_gb):g} GB"
        )
    if w.trace is None:
        longest_fits(config, w.prompt.largest, output_max, f"{pool}workload.prompt {w.prompt.largest} + output")


def _collectives(config: Config, what: str, cost: str, key: Callable[[str], str] = str) -> None:
    """Refuse ``what`` (a layout whose GPUs exchange activations) without what ``cost`` is made
    of: the link's bandwidth, the layers and the hidden size (``key``: a key's name as the user
    gave it)."""
    hw, m = config.hardware, config.model
    missing = [k for k, v in ((key("hardware.link_gb_s"), hw.link_gb_s), ("model.n_layers", m.n_layers),
                              ("model.hidden", m.hidden)) if v is None]
    if missing:
        raise ConfigError(f"{what} needs {' and '.join(missing)} for {cost}")


def _spans(config: Config, what: str, gpus: int, fewer: str, key: Callable[[str], str] = str) -> None:
    """Refuse ``what``, a group of ``gpus`` GPUs, beyond one scale-up domain unless it fills whole
    domains joined by a network (``fewer``: what the user may give instead, at most one domain)."""
    hw, g = config.hardware, config.hardware.scaleup_gpus
    if g is None or gpus <= g:
        return
    if gpus % g:
        raise ConfigError(f"{what} spans scale-up domains of {key('hardware.scaleup_gpus')} ({g}) GPUs unevenly: "
                          f"give a multiple of {g}, or at most {g}")
    if hw.scaleout_gb_s is None:
        raise ConfigError(f"{what} spans {gpus // g} scale-up domains of {key('hardware.scaleup_gpus')} ({g}) GPUs, "
                          f"but {key('hardware.scaleout_gb_s')} is null (no network between them): set it, or "
                          f"{fewer} of at most {g}")


def _data_parallel(config: Config) -> None:
    """What attention data parallelism (``engine.dp`` > 1) needs: a mixture of experts served
    with expert parallelism by continuous batching, the exchange's link, one replica's dp x tp
    GPUs within a scale-up domain or spanning whole ones over a network, and a fleet it is
    modelled in (colocated; a router among replicas that does not score their caches)."""
    m, e, f = config.model, config.engine, config.fleet
    if not m.experts:
        raise ConfigError(f"engine.dp ({e.dp}) > 1 needs a mixture of experts (model.experts is 0): a dense "
                          f"model's copies are fleet.replicas")
    if not e.expert_parallel:
        raise ConfigError(f"engine.dp ({e.dp}) > 1 needs engine.expert_parallel: true (vLLM's --data-parallel-size "
                          f"with --enable-expert-parallel)")
    if e.policy != "continuous":
        raise ConfigError(f"engine.dp ({e.dp}) > 1 needs engine.policy continuous (got {e.policy})")
    _collectives(config, f"engine.dp ({e.dp}) > 1", "the experts' exchange")
    group = e.dp * e.tp
    _spans(config, f"engine.dp x engine.tp ({e.dp} x {e.tp} = {group} GPUs)", group, "dp x tp")
    if fleet.disaggregated(config):
        raise ConfigError(f"engine.dp ({e.dp}) > 1 with fleet.prefill_replicas is not modelled: data-parallel "
                          f"replicas serve colocated (set fleet.prefill_replicas to 0, or engine.dp to 1)")
    if f.router == "prefix_aware" and f.replicas > 1:
        raise ConfigError(f"fleet.router: prefix_aware with engine.dp ({e.dp}) > 1 is not modelled (the ranks' "
                          f"caches are apart); choose another router, or engine.dp 1")


YEAR_S = 365.25 * 86400


def _steps_are_finite(config: Config, tokens: int, key: Callable[[str], str]) -> None:
    """Refuse a step cost that overflows or is beyond any planning horizon: one step of
    ``tokens`` tokens (the longest request) taking more than a year."""
    k = coefficients(config)
    k[UNPICKED] = 0.0  # a log-share, not a time (-inf when every expert is picked)
    with np.errstate(over="ignore", invalid="ignore"):
        terms = k * np.array([1, 1, tokens, tokens, float(tokens) ** 2, 1, tokens, tokens, 0, 0, tokens, 0, 1])
    worst = int(np.argmax(np.where(np.isfinite(terms), terms, np.inf)))
    if not terms[worst] <= YEAR_S:
        names = ", ".join(key(n) for n in COEFFICIENT_KEYS[worst].split(", "))
        raise ConfigError(f"one step of the longest request ({tokens:,} tokens) would take {terms[worst]:.3g} s, "
                          f"more than a year: check {names}, and the lengths of workload.prompt and workload.output")


def _prefix_cache(config: Config) -> None:
    """What prefix caching, system prompts, sessions and closed-loop clients need."""
    e, w, f = config.engine, config.workload, config.fleet
    loop = "workload.sessions" if w.sessions is not None else "workload.concurrency"
    if (w.sessions is not None or w.concurrency is not None) and e.policy != "continuous":
        raise ConfigError(f"{loop} needs engine.policy continuous (got {e.policy})")
    cached = fleet.cached(config)  # static and dynamic batching have no prefix cache: the key is moot there
    caching = fleet.prefix_cache(config)
    what = "engine.prefix_caching" if caching else loop
    off = "; or set engine.prefix_caching=false" if caching else ""
    if cached and e.kv_alloc != "paged":
        raise ConfigError(f"{what} needs engine.kv_alloc paged (got {e.kv_alloc}){off}")
    if cached and kv_blocks(config) is None:
        raise ConfigError(f"{what} needs a KV cache of known size: set hardware.mem_gb (a hardware.preset does) "
                          f"or engine.kv_cache_gb{off}")
    if w.concurrency is not None:
        if w.trace is not None:
            raise ConfigError("workload.concurrency: not with a workload.trace (a trace records its own arrivals)")
        if w.warmup_window[0] == "seconds":
            raise ConfigError(f"workload.warmup {w.warmup!r} with workload.concurrency: give a number of requests "
                              f"(closed-loop clients send as requests complete, which the run decides)")
    if (w.sessions is not None or w.concurrency is not None) and w.rng != "numpy":
        raise ConfigError(f"{loop} needs workload.rng: numpy")
    if w.sessions is not None and w.prefix_tokens and not e.prefix_caching:
        raise ConfigError("workload.prefix_tokens with workload.sessions needs engine.prefix_caching: true (the "
                          "prefix is then a cached system prompt; a pinned one is not modelled in sessions)")
    if w.sessions is not None and w.trace is not None:
        raise ConfigError("workload.sessions: not with a workload.trace (a trace records its own arrivals)")
    if w.system_prompts is not None and w.prefix_tokens:
        raise ConfigError("workload.system_prompts: give it or workload.prefix_tokens (one system prompt), not both")
    sp = w.system_prompts
    if sp is not None and w.trace is not None:
        raise ConfigError("workload.system_prompts: not with a workload.trace (a trace records what it shares)")
    if sp is not None and sp.tokens >= w.prompt.smallest:
        raise ConfigError(f"workload.system_prompts.tokens ({sp.tokens}) must be shorter than every prompt "
                          f"(the shortest workload.prompt is {w.prompt.smallest})")
    if f.router == "prefix_aware" and not e.prefix_caching:
        raise ConfigError("fleet.router: prefix_aware needs engine.prefix_caching: true (it routes by cached blocks)")
    m = config.model
    if m.hybrid and cached and paths.shares(config):
        kinds = " and ".join(k for k, n in (("model.window_layers", m.window_layers),
                                            ("model.linear_layers", m.linear_layers)) if n)
        raise ConfigError(f"{kinds}: a hybrid-attention model under a prefix cache over shared content (system "
                          "prompts, sessions, a trace's or a shared prefix) is not modelled: set "
                          "engine.prefix_caching=false, or model.window_layers=0 and model.linear_layers=0 to take "
                          "it as full attention")


def _speculative(config: Config) -> None:
    """What speculative decoding needs: continuous batching over paged KV, a budget for every
    decoder's verification, a draft the model has (or names), smaller than the model."""
    e, m = config.engine, config.model
    s = e.speculative
    if s is None:
        return
    if e.policy != "continuous":
        raise ConfigError(f"engine.speculative needs engine.policy continuous (got {e.policy}): a batch that runs "
                          "to its end has no verification steps to shorten")
    if e.kv_alloc != "paged":
        raise ConfigError(f"engine.speculative needs engine.kv_alloc paged (got {e.kv_alloc})")
    if e.max_batched_tokens is not None and e.max_batched_tokens < e.limit * (1 + s.tokens):
        raise ConfigError(f"engine.max_batched_tokens ({e.max_batched_tokens}) must hold every running request's "
                          f"verification: the running limit ({e.limit}) x (1 + engine.speculative.tokens "
                          f"{s.tokens}) = {e.limit * (1 + s.tokens)}")
    if s.method in ("mtp", "eagle") and m.n_layers is None:
        raise ConfigError(f"engine.speculative.method {s.method} needs model.n_layers (a draft pass is one layer)")
    if s.method == "mtp" and not (s.draft_layers or m.mtp_layers):
        of = f"model.preset {m.preset}" if m.preset else f"model.config_json {m.config_json}" if m.config_json else \
            "the model"
        raise ConfigError(f"engine.speculative.method mtp: {of} has no multi-token-prediction layers "
                          "(model.mtp_layers is 0): set engine.speculative.draft_layers, or use eagle or ngram")
    if s.method == "draft":
        draft = speculative.draft_shape(s)
        if m.params_b is not None and draft.active >= m.params_b * 1e9:
            raise ConfigError(f"engine.speculative.draft_model {s.draft_model}: its {draft.active / 1e9:.3g} B active "
                              f"parameters are not fewer than the model's (model.params_b {m.params_b:g})")
    if fleet.cached(config) and paths.shares(config):
        raise ConfigError("engine.speculative under a prefix cache over shared content (system prompts, sessions, a "
                          "trace's or a shared prefix) is not modelled: set engine.prefix_caching=false")


def traffic_fits(config: Config, traffic) -> None:
    """Refuse drawn sessions whose longest turn cannot fit in the KV cache (a ``max_context``
    beyond it)."""
    if config.workload.sessions is None or not len(traffic):
        return
    longest = int(np.argmax(traffic.prompt_tokens + traffic.output_tokens))
    p, o = int(traffic.prompt_tokens[longest]), int(traffic.output_tokens[longest])
    longest_fits(config, p, o, f"workload.sessions.max_context {config.workload.sessions.max_context}: a turn of "
                                f"prompt {p} + output")


def _can_run(config: Config) -> None:
    w = config.workload
    _prefix_cache(config)
    _speculative(config)
    if w.trace is None and w.prefix_tokens and w.prefix_tokens >= w.prompt.smallest:
        raise ConfigError(
            f"workload.prefix_tokens ({w.prefix_tokens}) must be shorter than every prompt "
            f"(the shortest workload.prompt is {w.prompt.smallest})"
        )
    cal = config.calibration
    if cal.layer_overhead_us and config.model.n_layers is None:
        raise ConfigError(f"calibration.layer_overhead_us ({cal.layer_overhead_us:g}) needs model.n_layers "
                          f"(a model.preset sets it)")
    _engine_runs(config, w.max_output)
    f, policy = config.fleet, config.engine.policy
    if ROUTERS[f.router].load_aware and policy != "continuous":
        raise ConfigError(f"fleet.router: {f.router} needs engine.policy continuous (got {policy}; static and "
                          f"dynamic fleets route round_robin or random)")
    if fleet.disaggregated(config):
        if policy != "continuous":
            raise ConfigError(f"fleet.prefill_replicas ({f.prefill_replicas}) needs engine.policy continuous "
                              f"(got {policy}): disaggregated serving batches continuously")
        _engine_runs(fleet.prefill_config(config), 1, prefill=True)


def longest_fits(config: Config, prompt: int, output: int, what: str) -> None:
    """Refuse a workload whose longest request (``prompt`` + ``output`` tokens, described by
    ``what``) cannot fit in the KV cache: it could never finish."""
    e = config.engine
    blocks, fixed = kv_blocks(config), fixed_blocks(config)
    # (speculation: its last verification holds slots beyond its last token)
    tokens = prompt + output + (e.speculative.span - 2 if e.speculative is not None else 0)
    if blocks is not None and -(-max(tokens, prompt + output) // e.block_tokens) + fixed > blocks:
        held = f", and {fixed} blocks a request holds for its local or linear-attention layers" if fixed else ""
        raise ConfigError(
            f"workload: the longest request ({what} {output} = {prompt + output} tokens{held}) does not fit in "
            f"the KV cache ({blocks} blocks of engine.block_tokens {e.block_tokens} = {blocks * e.block_tokens} "
            f"tokens: {_capacity(config)} at model.kv_bytes_per_token {config.model.kv_bytes_per_token:g})"
        )


def _capacity(config: Config) -> str:
    gb = kv_capacity_gb(config)
    return f"engine.kv_cache_gb {gb:.3g} GB" if config.engine.kv_cache_gb is not None else f"{gb:.3g} GB"


def _trace_fits(config: Config) -> None:
    """Refuse a trace with a request that can never run on ``config``'s engines (reads the file)."""
    if config.workload.trace is None:
        return
    recorded, n = trace.requests(config.workload)
    prompt, output = recorded.prompt_tokens[:n], recorded.output_tokens[:n]
    engines = [(config, output, "")]
    if fleet.disaggregated(config):
        engines.append((fleet.prefill_config(config), np.ones_like(output), "the prefill replicas: "))
    for engine, out, pool in engines:
        longest = int(np.argmax(prompt + out))
        row = f"{pool}{recorded.path}: row {recorded.lines[longest]} (prompt {prompt[longest]} + output"
        _steps_are_finite(engine, int(prompt[longest] + out[longest]), _names(config, bool(pool)))
        longest_fits(engine, int(prompt[longest]), int(out[longest]), row)
    prefix = config.workload.prefix_tokens
    if prefix and prefix >= prompt.min():
        short = int(np.argmin(prompt))
        raise ConfigError(f"workload.prefix_tokens ({prefix}) must be shorter than every prompt "
                          f"({recorded.path}: row {recorded.lines[short]} has {prompt[short]})")


STEPS_MAX = 1e10  # steps a run may need: a minute or two of the step loop (1 to 10 ns a step)


def steps_fit(config: Config, output_tokens: float, prompt_tokens: float) -> None:
    """Refuse traffic of ``output_tokens`` and ``prompt_tokens`` in all (as drawn, or recorded)
    that needs more than :data:`STEPS_MAX` steps: at least one step per output token of each
    running sequence (at most the running limit a step), and one per token budget of prompt."""
    e = config.engine
    steps = output_tokens / e.limit
    if e.max_batched_tokens is not None:
        steps = max(steps, prompt_tokens / e.max_batched_tokens)
    if steps > STEPS_MAX:
        budget = f", engine.max_batched_tokens {e.max_batched_tokens} a step" if e.max_batched_tokens else ""
        raise ConfigError(
            f"workload: {output_tokens:.3g} output and {prompt_tokens:.3g} prompt tokens need at least {steps:.3g} "
            f"steps (at most {e.limit} sequences a step{budget}), beyond the {STEPS_MAX:.0e} a run simulates in "
            f"reasonable time: fewer requests (workload.n_requests) or shorter lengths (workload.output, "
            f"workload.prompt)")


WORKLOAD_KEYS = ("workload.rate", "workload.n_requests", "workload.trace", "workload.rng", "workload.arrival",
                 "workload.concurrency",
                 "workload.prompt.dist", "workload.output.dist")
# What the engine checks read: a sweep runs them on every combination of the axes under these.
ENGINE_KEYS = ("hardware.", "model.", "engine.", "fleet.", "workload.prompt.", "workload.output.",
               "workload.prefix_tokens", "workload.trace", "workload.system_prompts", "workload.sessions",
               "workload.rng", "workload.concurrency", "workload.warmup")

CHECKS: list[tuple[tuple[str, ...], Callable[[Config], None]]] = [
    (WORKLOAD_KEYS, _workload_is_whole),
    (ENGINE_KEYS, _can_run),
    (ENGINE_KEYS + ("workload.n_requests",), _trace_fits),
]
"""(key prefixes a check reads, the check): a sweep runs each on every combination of the axes
under its prefixes, the others at their first value. The last reads trace files."""


def check(config: Config, plan: bool = False) -> None:
    """Refuse ``config`` if it can never run (every check of :data:`CHECKS`). A prefill pool the
    plan sizes (``fleet.prefill_replicas: auto``) is for ``plan`` alone, checked as one replica."""
    if fleet.sized_by_plan(config):
        if not plan:
            raise ConfigError("fleet.prefill_replicas: auto is what fastsim plan chooses; to run a fleet, give the "
                              "number of prefill replicas (0: colocated)")
        config = fleet.with_pools(config, config.fleet.replicas, 1)
    for _, run in CHECKS:
        run(config)
