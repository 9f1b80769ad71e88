"""The config schema: inert, frozen pydantic models of a scenario, with their defaults.

A config names one scenario (hardware, model, engine, workload, calibration, SLOs, fleet) and
optionally a ``sweep:`` grid mapping dotted keys to lists of values. Validation here checks each
field alone (and the few fields a section checks together: presets, min <= max) and never touches
disk; the checks that span sections live above the schema (:mod:`fastsim.engine.checks`). Every
problem is raised as :class:`ConfigError`, whose message names the offending key.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, Field, PlainValidator, ValidationError, field_validator, model_validator

from .fields import ConfigError, Finite, Int, Section, _integral, doc  # ConfigError: imported from here by every layer
from .workload import WARMUP_UNITS, Workload, _seconds  # noqa: F401 (the section, and names others import from here)
from . import routers
from .hardware_model import Hardware, Model
from .presets import HARDWARE
from .speculative import Speculative

# The names a config may use; the engine's registries map each to its kernel or router.
POLICIES = ("static", "dynamic", "continuous")
ROUTERS = tuple(routers.ROUTERS)
# The most replicas a pool has: beyond any fleet built, and a simulation's state (and set-up
# time, ~2 us a replica) stays small.
LARGEST_POOL = 1_000_000


class Engine(Section):
    policy: str = Field("continuous", **doc("batching policy: static, dynamic or continuous"))
    max_batch: Int = Field(64, ge=1, **doc("batch slots (vLLM's max_num_seqs)", "sequences"))
    max_concurrent: Int | None = Field(None, ge=1, **doc(
        "cap on running sequences (null: none); the running limit is min(max_batch, cap)", "sequences"))
    window_ms: float = Field(50.0, ge=0, **Finite, **doc(
        "dynamic batching: a batch also starts once the oldest waiting request has waited this long", "ms"))
    max_batched_tokens: Int | None = Field(None, ge=1, **doc(
        "token budget per step, chunked prefill (vLLM's max_num_batched_tokens; null: unlimited)", "tokens"))
    tp: Int = Field(1, ge=1, **doc("tensor-parallel GPUs per replica (per data-parallel rank)", "GPUs"))
    dp: Int = Field(1, ge=1, **doc(
        "attention data-parallel ranks per replica, tp GPUs each (vLLM's --data-parallel-size with "
        "--enable-expert-parallel): each rank schedules its own requests with its own KV cache and budget, the "
        "ranks step together and a mixture of experts' experts are spread over all dp x tp GPUs", "ranks"))
    expert_parallel: bool = Field(False, **doc(
        "spread a mixture of experts' experts over the tp GPUs instead of splitting each (vLLM's "
        "--enable-expert-parallel): a MoE layer's all-reduce becomes a dispatch and a combine"))
    kv_alloc: Literal["paged", "reserve"] = Field("paged", **doc(
        "paged: blocks as tokens are computed, preemption when they run out; reserve: prompt + longest "
        "output at admission"))
    block_tokens: Int = Field(16, ge=1, **doc("tokens per KV block", "tokens"))
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, **Finite, **doc(
        "share of GPU memory the engine takes; KV cache = tp (mem_gb x this - reserved_gb) - weight_gb",
        "fraction"))
    reserved_gb: float = Field(2.0, ge=0, **Finite, **doc("memory per GPU kept for activations and CUDA graphs",
                                                           "GB"))
    kv_cache_gb: float | None = Field(None, gt=0, **Finite, **doc(
        "the KV cache of a replica (of each data-parallel rank) outright, overriding the memory rule (null: from memory)", "GB"))
    prefix_caching: bool = Field(False, **doc(
        "cache KV blocks by content and reuse them across requests (vLLM's automatic prefix caching); "
        "continuous batching's: static and dynamic batching have none and run without it"))
    async_scheduling: bool = Field(False, **doc(
        "continuous batching: a step's batch is chosen while the step before it runs (vLLM's "
        "--async-scheduling), so a request arriving at a busy engine joins the step after the next (static "
        "and dynamic batching, which form a batch only on an idle engine, are unaffected)"))
    speculative: Speculative | None = Field(None, **doc(
        "speculative decoding under continuous batching: each step a decoding request verifies k proposed "
        "tokens and emits 1 + those accepted (null: off; its keys: docs/model/deployed.md, Speculative decoding)"))

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        return _one_of(POLICIES, v)

    @property
    def limit(self) -> int:
        """Most sequences running at once: min(max_batch, max_concurrent)."""
        return self.max_batch if self.max_concurrent is None else min(self.max_batch, self.max_concurrent)


class Calibration(Section):
    compute_efficiency: float = Field(1.0, gt=0, le=1, **Finite, **doc("achieved share of peak FLOP/s",
                                                                        "fraction"))
    bandwidth_efficiency: float = Field(1.0, gt=0, le=1, **Finite, **doc("achieved share of memory bandwidth",
                                                                          "fraction"))
    step_overhead_ms: float = Field(0.0, ge=0, **Finite, **doc(
        "fixed cost of every step (scheduling, launches)", "ms"))
    layer_overhead_us: float = Field(0.0, ge=0, **Finite, **doc(
        "added to every step per model layer (kernel latencies that grow with depth)", "us"))
    moe_layer_overhead_us: float = Field(0.0, ge=0, **Finite, **doc(
        "added to every step per layer that routes to experts (the MoE kernels' own latencies: routing, "
        "sorting tokens by expert, the grouped GEMMs' launches)", "us"))
    api_overhead_ms: float = Field(0.0, ge=0, **Finite, **doc(
        "added to every token's time as the client sees it (HTTP, tokenising)", "ms"))
    stall_rate_hz: float = Field(0.0, ge=0, le=1000, **Finite, **doc(
        "jitter: how often each replica's engine stalls, at random instants (0: never, no jitter)", "1/s"))
    stall_median_ms: float = Field(0.0, ge=0, le=10000, **Finite, **doc(
        "jitter: the median length of a stall (log-normal)", "ms"))
    stall_sigma: float = Field(0.0, ge=0, le=5, **Finite, **doc(
        "jitter: the log-spread of a stall's length (0: every stall lasts the median)"))
    fitted_to: str | None = Field(None, **doc(
        "what the values were fitted to (engine and version, GPU, runs), as fastsim calibrate records it"))


class Slo(Section):
    """Service-level objectives: a request is good when it meets every one that is set (vLLM
    bench's --goodput rule; TPOT counts as 0 for a one-token output). None: not an objective."""

    ttft_s: float | None = Field(None, gt=0, **Finite, **doc("time to first token a good request meets", "s"))
    tpot_s: float | None = Field(None, gt=0, **Finite, **doc("time per output token a good request meets", "s"))
    e2e_s: float | None = Field(None, gt=0, **Finite, **doc("end-to-end latency a good request meets", "s"))


def _prefill_pool(value: Any) -> int | str:
    """A whole number of prefill replicas (0: none), or ``auto`` (the plan sizes the pool)."""
    if value == "auto":
        return value
    whole = _integral(value)
    if isinstance(whole, bool) or not isinstance(whole, int) or not 0 <= whole <= LARGEST_POOL:
        raise ValueError(f"must be a whole number of replicas from 0 to {LARGEST_POOL:,}, or auto (got {value!r})")
    return whole


class Fleet(Section):
    """Replicas behind a router, and an optional prefill pool (docs/model/fleets.md).
    None: as the engine (prefill_tp, prefill_max_batched_tokens) or the config's hardware."""

    replicas: Int = Field(1, ge=1, le=LARGEST_POOL, **doc(
        "replicas of the engine (decode replicas, with a prefill pool)", "replicas"))
    router: str = Field("round_robin", **doc(
        "round_robin, random, least_outstanding, least_kv or prefix_aware: which replica each request goes to"))
    prefill_replicas: Annotated[int | str, PlainValidator(_prefill_pool)] = Field(0, **doc(
        "a prefill pool in front (0: colocated; else the replicas only decode); auto: fastsim plan sizes it",
        "replicas"))
    prefill_tp: Int | None = Field(None, ge=1, **doc("tensor-parallel GPUs per prefill replica (null: engine.tp)",
                                                     "GPUs"))
    prefill_hardware: str | None = Field(None, **doc(
        "hardware preset of the prefill replicas (null: the config's hardware)"))
    prefill_max_batched_tokens: Int | None = Field(None, ge=1, **doc(
        "token budget of a prefill replica's step (null: the engine's)", "tokens"))
    kv_link_gb_s: float = Field(50.0, gt=0, **Finite, **doc(
        "each prefill replica's KV link to the decode pool (50: one 400 Gb/s NIC)", "GB/s"))
    kv_link_latency_ms: float = Field(0.0, ge=0, **Finite, **doc("fixed latency of one KV transfer", "ms"))
    prefix_weight: float = Field(1.0, ge=0, **Finite, **doc(
        "prefix_aware router: weight of a replica's missed prompt blocks against its KV blocks in use"))

    @field_validator("router")
    @classmethod
    def _known_router(cls, v: str) -> str:
        return _one_of(ROUTERS, v)

    @field_validator("prefill_hardware")
    @classmethod
    def _known_hardware(cls, name: str | None) -> str | None:
        if name is not None and name not in HARDWARE:
            raise ValueError(f"unknown hardware preset {name!r} (valid: {', '.join(HARDWARE)})")
        return name


def _one_of(names: tuple[str, ...], v: Any) -> str:
    if v not in names:
        raise ValueError(f"must be one of {', '.join(names)} (got {v!r})")
    return v


class Config(Section):
    description: str = ""
    hardware: Hardware = Hardware()
    model: Model = Model()
    engine: Engine = Engine()
    workload: Workload = Workload()
    calibration: Calibration = Calibration()
    slo: Slo = Slo()
    fleet: Fleet = Fleet()
    sweep: dict[str, list[Any]] = {}

    @field_validator("sweep")
    @classmethod
    def _valid_axes(cls, sweep: dict[str, list[Any]]) -> dict[str, list[Any]]:
        check_axes(sweep)
        return sweep

    def with_values(self, values: dict[str, Any]) -> Config:
        """A new config with dotted keys set to ``values`` (validated field by field, as
        :func:`validate`; the sweep is kept)."""
        raw = self.model_dump(exclude_unset=True)  # explicit keys only: a new preset fills the rest
        for key, value in values.items():
            set_dotted(raw, key, value)
        return validate(raw)

    def at(self, values: dict[str, Any]) -> Config:
        """A new config with dotted keys set to ``values`` *without validating them*: for sweep
        points whose values :func:`section_validator` has already checked and normalised. Each
        section touched is copied once, whatever the number of its keys (each copy costs a sweep
        point several microseconds)."""
        tree = _Updates()
        for key, value in values.items():
            node = tree
            *sections, leaf = key.split(".")
            for part in sections:
                node = node.setdefault(part, _Updates())
                if not isinstance(node, _Updates):  # a key inside a section also given whole
                    raise ValueError(f"{key!r} is set both whole and inside")
            node[leaf] = value

        def put(model: BaseModel, updates: _Updates) -> BaseModel:
            return model.model_copy(update={name: put(getattr(model, name), v) if isinstance(v, _Updates) else v
                                            for name, v in updates.items()})

        return put(self, tree)


class _Updates(dict):
    """A section's updates in :meth:`Config.at` (a dict subclass: a field's own dict value is
    not one)."""


def _leaf_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys += _leaf_keys(ann, f"{prefix}{name}.")
        elif name not in ("sweep", "description"):
            keys.append(prefix + name)
    return keys


LEAF_KEYS: tuple[str, ...] = tuple(_leaf_keys(Config))
"""Every dotted key a scenario has (what ``--set`` and ``sweep:`` accept)."""


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The section class a field holds (``Sessions | None`` holds ``Sessions``), or None."""
    for t in (annotation, *get_args(annotation)):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t
    return None


def field_of(key: str) -> Any:
    """The pydantic field of a dotted key (also one inside an optional section)."""
    cls: Any = Config
    *sections, leaf = key.split(".")
    for part in sections:
        cls = _model_of(cls.model_fields[part].annotation)
    return cls.model_fields[leaf]


def check_axes(sweep: dict[str, list[Any]]) -> None:
    """Refuse (ValueError, for the ``sweep`` field's validator) an axis that is no key, is empty,
    repeats a value, or shares its dimension name or its section with another."""
    names: dict[str, str] = {}
    for key, values in sweep.items():
        if key not in LEAF_KEYS and inside_optional(key) is None:
            raise ValueError(_not_a_key(key))
        for other in sweep:
            if key.startswith(other + "."):
                raise ValueError(f"axes {other!r} and {key!r}: a section is swept whole or by its keys, not both")
        if not values:
            raise ValueError(f"axis {key!r} is empty")
        if len({_hashable(v) for v in values}) != len(values):
            raise ValueError(f"axis {key!r} repeats a value: {values}")
        dim = dim_name(key)
        if dim in names:
            raise ValueError(f"axes {names[dim]!r} and {key!r} would both be named {dim!r}")
        names[dim] = key


def dim_name(key: str) -> str:
    """The dataset dimension of a sweep axis: the key's last part, but the section's name for what
    names a whole section (``hardware.preset`` is ``hardware``; ``model.preset`` and
    ``model.config_json`` are ``model``), so GPUs and models sweep together; inside an optional
    section, its path there joined by ``_`` (``workload.sessions.think_s.mean`` is ``think_s_mean``)."""
    inside = inside_optional(key)
    if inside is not None:
        return key[len(inside) + 1 :].replace(".", "_")
    section, _, leaf = key.rpartition(".")
    return section if leaf in ("preset", "config_json") and section in ("hardware", "model") else leaf


def _hashable(v: Any) -> Any:
    return repr(v) if isinstance(v, (list, dict)) else v


OPTIONAL_SECTIONS: dict[str, type[BaseModel]] = {
    key: cls for key in LEAF_KEYS if (cls := _model_of(field_of(key).annotation)) is not None}
"""Sections that are null by default (``workload.sessions``): whole values of their key, whose
own keys a sweep may also set (``workload.sessions.think_s.mean``)."""


def _not_a_key(key: str) -> str:
    """Why ``key`` is no sweep axis: the section's keys that are, inside an optional section."""
    for section, cls in OPTIONAL_SECTIONS.items():
        if key.startswith(section + "."):
            where = section
            for part in key[len(section) + 1 :].split("."):
                if cls is None or part not in cls.model_fields:
                    valid = ", ".join(cls.model_fields) if cls is not None else "none: it is a value"
                    return f"{key!r} is not a config key: {where} has no {part!r} (valid: {valid})"
                where, cls = f"{where}.{part}", _model_of(cls.model_fields[part].annotation)
    return (f"{key!r} is not a config key (valid: {', '.join(LEAF_KEYS)}, and the keys inside "
            f"{' and '.join(OPTIONAL_SECTIONS)})")


def inside_optional(key: str) -> str | None:
    """The optional section ``key`` names a field inside (``workload.sessions`` for
    ``workload.sessions.turns.max``), or None."""
    for section, cls in OPTIONAL_SECTIONS.items():
        if key.startswith(section + "."):
            for part in key[len(section) + 1 :].split("."):
                field = cls.model_fields.get(part) if cls is not None else None
                if field is None:
                    return None
                cls = _model_of(field.annotation)
            return section
    return None


def get_dotted(node: Any, key: str) -> Any:
    for part in key.split("."):
        node = getattr(node, part)
    return node


SAME_THING = {"preset": "config_json", "config_json": "preset"}
"""model.preset and model.config_json name the model: setting one replaces the other."""


def set_dotted(raw: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    if len(parts) == 2 and parts[0] == "model" and parts[1] in SAME_THING and isinstance(raw.get("model"), dict):
        raw["model"].pop(SAME_THING[parts[1]], None)
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{'.'.join(parts[: i + 1])}: is a value, not a section (in {key!r})")
        node = child
    node[parts[-1]] = value


# Keys that were renamed: the error names the new one.
RENAMED = {
    "workload.prompt_tokens": "workload.prompt (a length distribution like workload.output: "
    "dist fixed|lognormal|uniform; e.g. workload.prompt.value: 1000)",
}


def _describe(err: dict) -> str:
    key = ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden" and key in RENAMED:
        return f"{key}: replaced by {RENAMED[key]}"
    if err["type"] == "extra_forbidden":
        section = ".".join(str(p) for p in err["loc"][:-1])
        valid = [k for k in (*LEAF_KEYS, "description", "sweep") if k.startswith(section)]
        return f"{key}: unknown key (valid here: {', '.join(valid)})"
    msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    if err["type"] not in ("value_error", "missing") and not isinstance(got, (dict, list)):
        msg += f" (got {got!r})"
    if key and msg.startswith(f"{key}."):  # a section's check that names its keys itself
        return msg
    return f"{key or 'config'}: {msg}"


def _config_error(exc: ValidationError, section: str = "") -> ConfigError:
    """One line for pydantic's errors: the first, its key given in full from the config's root."""
    errors = exc.errors()
    first = dict(errors[0], loc=(*section.split("."), *errors[0]["loc"])) if section else errors[0]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return ConfigError(_describe(first) + more)


def validate(raw: Any) -> Config:
    """Validate a plain mapping into a :class:`Config`, field by field; errors name the key.
    (Whether the scenario can run is :func:`fastsim.engine.checks.check`'s question.)"""
    if not isinstance(raw, dict):
        raise ConfigError(f"config: expected a mapping of sections, got {type(raw).__name__}")
    try:
        return Config.model_validate(raw)
    except ValidationError as exc:
        raise _config_error(exc) from None
