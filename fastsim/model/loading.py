"""Reading configs: YAML files (following ``extends:``), ``--set`` overrides, trace paths made
absolute relative to the file that names them. What it reads is validated by the schema
(:mod:`.schema`), field by field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from .schema import SAME_THING, Config, ConfigError, set_dotted, validate


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml's parser when present
    """YAML as people write numbers: ``1e3``, ``2.5e-3`` and ``1E6`` are floats (YAML 1.1, and
    so PyYAML, reads an exponent without a dot and a sign as a string)."""


def _mapping(loader: _Loader, node: yaml.MappingNode) -> dict:
    """A mapping that names a key twice is an error (YAML says keys are unique; PyYAML would
    keep the last value without a word)."""
    loader.flatten_mapping(node)
    seen: dict = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, (list, dict)):
            continue  # construct_mapping refuses an unhashable key, with its mark
        if key in seen:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} appears twice in one mapping (lines {seen[key] + 1} and {mark.line + 1})",
                mark)
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep=True)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def parse_override(text: str) -> tuple[str, Any]:
    """Split ``dotted.key=value``; the value is read as a YAML scalar (number, string, null...)."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {text!r}: expected dotted.key=value")
    try:
        return key, yaml.load(value, Loader=_Loader)
    except yaml.YAMLError:
        raise ConfigError(f"{key}: cannot read value {value!r}") from None


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"extends: {path} includes itself")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(not_utf8(path, exc)) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        raw = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise ConfigError(f"{path}:{where}: YAML syntax error: {problem}") from None
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections, got {type(raw).__name__}")
    _paths_relative_to(path, raw)
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    if not isinstance(parent, str):
        raise ConfigError(f"extends: expected a path to a config file (got {parent!r})")
    base = _read_yaml(path.parent / parent, (*seen, path))
    sweep = raw.pop("sweep", None)
    _merge(base, raw)
    if sweep is not None:  # a study's grid replaces its base's grid
        base["sweep"] = sweep
    return base


def not_utf8(path: Path | str, exc: UnicodeDecodeError) -> str:
    """The message for a text file that is not UTF-8 (binary, or another encoding)."""
    bom = "UTF-16" if exc.object[:2] in (b"\xff\xfe", b"\xfe\xff") else None
    what = f"{bom} text: save it as UTF-8" if bom else f"byte 0x{exc.object[exc.start]:02x} at offset {exc.start}"
    return f"{path}: not a UTF-8 text file ({what})"


PATH_KEYS = ("workload.trace", "model.config_json")
"""Keys whose values are files, written relative to the config file that names them."""


def _paths_relative_to(path: Path, raw: dict) -> None:
    """Make the file paths ``raw`` (the YAML of ``path``) names absolute, as relative to ``path``:
    the :data:`PATH_KEYS`, and the values of a sweep axis over one."""
    sweep = raw.get("sweep")
    for key in PATH_KEYS:
        section, leaf = key.split(".")
        node = raw.get(section)
        if isinstance(node, dict) and isinstance(node.get(leaf), str):
            node[leaf] = path_relative_to(path, node[leaf])
        if isinstance(sweep, dict) and isinstance(sweep.get(key), list):
            sweep[key] = [path_relative_to(path, t) if isinstance(t, str) else t for t in sweep[key]]


def path_relative_to(config_file: Path, trace: str) -> str:
    """A file path as written in ``config_file``, made absolute."""
    p = Path(trace).expanduser()
    return str(p if p.is_absolute() else (config_file.parent / p).resolve())


def _merge(base: dict, over: dict) -> None:
    if isinstance(base.get("model"), dict) and isinstance(over.get("model"), dict):
        for key in over["model"]:  # a model named by the extending file replaces its base's
            if key in SAME_THING:
                base["model"].pop(SAME_THING[key], None)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


def read_config(path: str | Path, overrides: dict[str, Any] | None = None) -> Config:
    """Read a YAML config (following ``extends:``), apply dotted-key ``overrides``, validate
    each field (:func:`fastsim.load_config` also checks that the scenario can run).

    An override key ``sweep.<dotted.key>`` sets one sweep axis.
    """
    raw = _read_yaml(Path(path))
    for key, value in (overrides or {}).items():
        if key.startswith("sweep."):
            raw.setdefault("sweep", {})
            if not isinstance(raw["sweep"], dict):
                raise ConfigError("sweep: expected a mapping of dotted keys to lists")
            raw["sweep"][key.removeprefix("sweep.")] = value
        else:
            set_dotted(raw, key, value)
    return validate(raw)
