"""Sweep grids: a config's ``sweep:`` expanded into validated points.

A point is a flat index in C order of the axes (the last axis varies fastest); its config is
built on demand from the base and the axis values, each validated once when the grid is built
(and the checks that span sections run once per combination of the axes they read), so setting
a grid up costs the same per point however long its axes.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
from pydantic import BaseModel

from ..engine.checks import CHECKS
from ..model.axes import axis_validator, coupled_section, section_validator
from ..model.schema import Config, ConfigError, get_dotted

AT_ONCE = 256  # axes this long are validated in one call when their field allows it


@dataclass(frozen=True)
class Grid:
    """A validated sweep: the base config and each axis's values, normalised (``1e3`` on an
    integer axis is ``1000``). Points are flat indices in C order of the axes (the last axis
    varies fastest); a point's config is built on demand, without validating it again.

    Axes of a coupled section (:func:`~fastsim.model.axes.coupled_section`: a preset fills the rest
    of the section, or fields are checked together) are not set key by key: a point takes the
    whole section validated for its combination of those axes' values (``sections``).
    """

    base: Config
    keys: tuple[str, ...]
    axes: tuple[tuple[Any, ...], ...]
    # coupled section -> (positions of its axes in ``keys``, {their value indices: section})
    sections: dict[str, tuple[tuple[int, ...], dict[tuple[int, ...], Any]]]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(values) for values in self.axes)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def max_requests(self) -> int:
        """The most requests any point simulates."""
        return max(self._requests())

    @property
    def min_requests(self) -> int:
        """The fewest requests any point simulates."""
        return min(self._requests())

    def _requests(self) -> list[int]:
        """The numbers of requests points simulate (one per value of an ``n_requests`` axis)."""
        from .memory import requests

        key = "workload.n_requests"
        if key not in self.keys:
            return [requests(self.base)]
        return [requests(self.base.at({key: n})) for n in self.axes[self.keys.index(key)]]

    def requests_per_point(self) -> np.ndarray:
        """How many requests each point simulates (flat, C order)."""
        key = "workload.n_requests"
        if key not in self.keys:
            return np.full(self.size, self._requests()[0], dtype=np.int64)
        j = self.keys.index(key)
        shape = [1] * len(self.shape)
        shape[j] = self.shape[j]
        per_value = np.array(self._requests(), dtype=np.int64).reshape(shape)
        return np.broadcast_to(per_value, self.shape).reshape(-1)

    def indices(self, index: int) -> tuple[int, ...]:
        """Per-axis value indices of the point at flat ``index``."""
        out = []
        for values in reversed(self.axes):
            index, j = divmod(index, len(values))
            out.append(j)
        return tuple(reversed(out))

    def config_at(self, idx: tuple[int, ...]) -> Config:
        """The config of the point with per-axis value indices ``idx``."""
        values = {key: values[j] for key, values, j in zip(self.keys, self.axes, idx)}
        for section, (positions, objects) in self.sections.items():
            for p in positions:
                del values[self.keys[p]]
            values[section] = objects[tuple(idx[p] for p in positions)]
        return self.base.at(values)

    def config(self, index: int) -> Config:
        return self.config_at(self.indices(index))

    def combinations(self, prefixes: tuple[str, ...]) -> Iterator[tuple[int, ...]]:
        """The value indices of every combination of the axes whose keys start with one of
        ``prefixes``, every other axis at its first value."""
        read = [p for p, key in enumerate(self.keys) if key.startswith(prefixes)]
        for combo in itertools.product(*(range(len(self.axes[p])) for p in read)):
            idx = [0] * len(self.keys)
            for p, j in zip(read, combo):
                idx[p] = j
            yield tuple(idx)


def axis_label(value: Any) -> str:
    """How an axis value is written in a summary and, for a whole section (a sweep over
    ``workload.system_prompts``, say), as a dataset coordinate: null, a float's shortest form,
    a section's keys that differ from their defaults as compact JSON, or the value as text."""
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, BaseModel):
        return json.dumps(value.model_dump(mode="json", exclude_defaults=True), separators=(",", ":"))
    return str(value)


def build_grid(config: Config, check: bool = True) -> Grid:
    """Validate ``config.sweep`` into a :class:`Grid`; errors name the axis and the value.

    Each axis value is validated once; axes of one coupled section in combination; and the
    checks that span sections (:data:`fastsim.engine.checks.CHECKS`) on every combination of the axes
    they read (unless ``check`` is False: then the caller checks each point it runs). Never every point of the grid (unless every axis is one that those checks read).
    """
    keys = list(config.sweep)
    normalised: dict[str, list[Any]] = {k: [None] * len(v) for k, v in config.sweep.items()}
    groups: dict[str | None, list[str]] = {}
    for key in keys:
        groups.setdefault(coupled_section(key), []).append(key)
    sections: dict[str, tuple[tuple[int, ...], dict[tuple[int, ...], Any]]] = {}
    validators: dict[str, Callable[[dict[str, Any]], Any]] = {}

    def validated(section: str, values: dict[str, Any]) -> Any:
        if section not in validators:
            validators[section] = section_validator(config, section)
        try:
            return validators[section](values)
        except ConfigError as exc:
            if len(values) == 1:
                ((key, value),) = values.items()
                raise ConfigError(f"sweep axis {key!r}, value {value!r}: {exc}") from None
            raise ConfigError(f"sweep point {values}: {exc}") from None

    for key in groups.pop(None, []):  # value by value, in the section that holds the key
        values = config.sweep[key]
        at_once = axis_validator(config, key) if len(values) >= AT_ONCE else None
        if at_once is not None:  # a long axis of a plain field: one call (1 us a value, not 12)
            try:
                normalised[key] = list(at_once(values))
                continue
            except ConfigError:
                pass  # some value is refused: find it, value by value, for the error naming it
        section = key.rsplit(".", 1)[0] if "." in key else ""
        for j, value in enumerate(values):
            node = validated(section, {key: value})
            normalised[key][j] = get_dotted(node, key[len(section) + 1 :] if section else key)
    for section, group in groups.items():
        objects = {}
        for combo in itertools.product(*(range(len(config.sweep[k])) for k in group)):
            node = validated(section, {k: config.sweep[k][j] for k, j in zip(group, combo)})
            objects[combo] = node
            for k, j in zip(group, combo):
                normalised[k][j] = get_dotted(node, k[len(section) + 1 :])
        sections[section] = (tuple(keys.index(k) for k in group), objects)
    grid = Grid(config, tuple(keys), tuple(tuple(normalised[k]) for k in keys), sections)
    if check:
        _check_combinations(grid)
    return grid


def _check_combinations(grid: Grid) -> None:
    """Run each cross-section check on every combination of the axes it reads (the others at
    their first value)."""
    for prefixes, check in CHECKS:
        for idx in grid.combinations(prefixes):
            try:
                check(grid.config_at(idx))
            except ConfigError as exc:
                point = {key: grid.axes[p][idx[p]] for p, key in enumerate(grid.keys) if key.startswith(prefixes)}
                raise ConfigError(f"sweep point {point}: {exc}") from None
