"""Every config key as a user sees it: dotted name, kind of value, default and units.

Units follow from the keys' names, which carry them by convention (``_gb``, ``_tb_s``,
``_gb_s``, ``_ms``, ``_us``, ``_s``, ``tflops``, ``tokens``); the few keys whose name cannot say
it are listed in ``UNITS``.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from .schema import LEAF_KEYS, POLICIES, ROUTERS, Config, ConfigError

UNITS = {
    "workload.rate": "requests/s",
    "workload.n_requests": "requests",
    "hardware.usd_per_gpu_hour": "USD/GPU-hour",
    "model.kv_bytes_per_token": "bytes/token",
    "model.params_b": "billions",
    "engine.max_batch": "sequences",
    "engine.max_concurrent": "sequences",
    "engine.max_batched_tokens": "tokens",
    "fleet.prefill_max_batched_tokens": "tokens",
    "engine.gpu_memory_utilization": "fraction",
    "calibration.compute_efficiency": "fraction",
    "calibration.bandwidth_efficiency": "fraction",
    "engine.tp": "GPUs",
    "fleet.prefill_tp": "GPUs",
    "fleet.replicas": "replicas",
    "fleet.prefill_replicas": "replicas",
    "workload.prompt.mu": "ln(tokens)",
    "workload.prompt.sigma": "ln(tokens)",
    "workload.output.mu": "ln(tokens)",
    "workload.output.sigma": "ln(tokens)",
}
SUFFIXES = (("_tb_s", "TB/s"), ("_gb_s", "GB/s"), ("_gb", "GB"), ("_ms", "ms"), ("_us", "us"), ("_s", "s"),
            ("tflops", "TFLOP/s"), ("tokens", "tokens"))
# keys whose values a registry checks, not their type
KINDS = {"engine.policy": " | ".join(POLICIES), "fleet.router": " | ".join(ROUTERS),
         "hardware.preset": "preset or null", "model.preset": "preset or null",
         "fleet.prefill_hardware": "hardware preset or null", "workload.trace": "path or null"}
LENGTH_KEYS = ("value", "min", "max", "median", "p90")  # of workload.prompt and workload.output: tokens


@dataclass(frozen=True)
class Key:
    name: str
    kind: str
    default: Any
    units: str


def units(key: str) -> str:
    if key in UNITS:
        return UNITS[key]
    section, _, leaf = key.rpartition(".")
    if section in ("workload.prompt", "workload.output") and leaf in LENGTH_KEYS:
        return "tokens"
    return next((u for suffix, u in SUFFIXES if leaf.endswith(suffix)), "")


def _kind(annotation: Any) -> str:
    """``int | None`` -> ``'int or null'``; a Literal -> its values."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    optional = type(None) in typing.get_args(annotation)
    one = args[0] if len(args) == 1 else annotation
    if typing.get_origin(one) is typing.Annotated:
        one = typing.get_args(one)[0]
    if typing.get_origin(one) is Literal:
        text = " | ".join(str(v) for v in typing.get_args(one))
    else:
        text = getattr(one, "__name__", str(one))
    return f"{text} or null" if optional else text


def config_keys(section: str | None = None) -> list[Key]:
    """Every dotted key (of ``section`` if given: ``engine``, ``workload.prompt``), in the
    schema's order, with its kind, default and units. An unknown section is a ConfigError."""
    keys = [k for k in LEAF_KEYS if section is None or k == section or k.startswith(section + ".")]
    if not keys:
        sections = sorted({k.split(".")[0] for k in LEAF_KEYS})
        raise ConfigError(f"{section}: not a config section or key (sections: {', '.join(sections)})")
    result = []
    for key in keys:
        model: type[BaseModel] = Config
        *parts, leaf = key.split(".")
        for part in parts:
            model = model.model_fields[part].annotation
        field = model.model_fields[leaf]
        result.append(Key(key, KINDS.get(key) or _kind(field.annotation), field.default, units(key)))
    return result
