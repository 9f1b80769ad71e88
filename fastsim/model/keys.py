"""Every config key as a user sees it: dotted name, kind of value, default, units and meaning,
read from the schema's field metadata (:func:`fastsim.model.fields.doc`), so the configuration
reference (``fastsim keys``, docs/configuration.md) cannot drift from the code.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any, Literal

from .schema import LEAF_KEYS, POLICIES, ROUTERS, ConfigError, field_of

# keys whose values a registry checks, not their type
KINDS = {"engine.policy": " | ".join(POLICIES), "fleet.router": " | ".join(ROUTERS),
         "hardware.preset": "preset or null", "model.preset": "preset or null",
         "fleet.prefill_hardware": "hardware preset or null", "workload.trace": "path or null",
         "fleet.prefill_replicas": "int or auto", "workload.warmup": "int or duration",
         "workload.system_prompts": "{count, tokens, popularity, zipf_s} or null",
         "workload.sessions": "{turns, followup, think_s, max_context} or null",
         "engine.speculative": "{method, tokens, acceptance, draft_layers, draft_model} or null"}


@dataclass(frozen=True)
class Key:
    name: str
    kind: str
    default: Any
    units: str
    meaning: str


def units(key: str) -> str:
    """A key's units ('' when it has none)."""
    return (field_of(key).json_schema_extra or {}).get("units", "")


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
        field = field_of(key)
        result.append(Key(key, KINDS.get(key) or _kind(field.annotation), field.default, units(key),
                          field.description or ""))
    return result


def default_text(value: Any) -> str:
    """A default as the reference shows it: null, 0.9, paged."""
    return "null" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def reference_markdown() -> str:
    """The configuration reference page (docs/configuration.md): every key, section by section,
    with its kind, default, units and meaning."""
    lines = ["# Configuration reference", "",
             "Every key a config file, `--set KEY=VALUE` and a `sweep:` grid accept, generated from the schema "
             "(`fastsim keys --markdown`; a test checks this page against it). A config states only what differs "
             "from the defaults, which are the lesson's scenario. `null` means unset.", ""]
    section = None
    for k in config_keys():
        here = k.name.rsplit(".", 1)[0]
        if here != section:
            if section is not None:
                lines.append("")
            section = here
            lines += [f"## `{section}`", "", "| key | kind | default | units | meaning |", "| --- | --- | --- | --- | --- |"]
        lines.append(f"| `{k.name}` | {k.kind.replace('|', '&#124;')} | {default_text(k.default)} | {k.units} | "
                     f"{k.meaning} |")
    return "\n".join(lines) + "\n"
