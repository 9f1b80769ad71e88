"""Targets a planner sets (``ttft_p99_s<=0.5``, ``slo_attainment>=0.9``), and the default one:
the config's SLO met by a fraction of requests. Capacity searches and plans both use them."""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass

from ..model.schema import Config, ConfigError
from .metrics import METRICS


class Stopped(Exception):
    """A search saw its stop flag (Ctrl-C) between two simulations and gave up."""


@dataclass(frozen=True)
class Target:
    metric: str
    op: str  # "<=" or ">="
    bound: float

    def holds(self, metrics: dict[str, float]) -> bool:
        value = metrics[self.metric]
        return not math.isnan(value) and {"<=": operator.le, ">=": operator.ge}[self.op](value, self.bound)

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"


def parse_target(text: str) -> Target:
    """``METRIC<=VALUE`` or ``METRIC>=VALUE``; errors name ``--target``."""
    m = re.fullmatch(r"\s*(\w+)\s*(<=|>=)\s*([-+0-9.eE]+)\s*", text)
    if not m:
        raise ConfigError(f"--target {text!r}: expected METRIC<=VALUE or METRIC>=VALUE, e.g. 'ttft_p99_s<=0.5' "
                          "(quote it: the shell reads < and > as redirections)")
    metric, op, value = m.groups()
    if metric not in METRICS:
        raise ConfigError(f"--target {text!r}: unknown metric {metric!r} (valid: {', '.join(METRICS)})")
    try:
        bound = float(value)
    except ValueError:
        raise ConfigError(f"--target {text!r}: {value!r} is not a number") from None
    if not math.isfinite(bound):
        raise ConfigError(f"--target {text!r}: the bound must be a finite number")
    if op == "<=" and bound < 0:
        raise ConfigError(f"--target {text!r}: can never hold ({metric} is never negative)")
    return Target(metric, op, bound)


def default_targets(config: Config, attainment: float | None, what: str = "capacity") -> list[Target]:
    """With no --target: the config's SLOs met by ``attainment`` (default 90 %) of requests."""
    if all(v is None for v in config.slo.model_dump().values()):
        raise ConfigError(f"{what} needs a target: --target 'METRIC<=VALUE', or an slo: section in the config")
    return [Target("slo_attainment", ">=", 0.9 if attainment is None else attainment)]


def targets_from(config: Config, texts: list[str] | None, attainment: float | None, what: str = "capacity"
                 ) -> list[Target]:
    """The targets of a command line: each ``--target``, plus the SLO rule when ``--attainment``
    is given or no target is."""
    targets = [parse_target(t) for t in texts or []]
    if attainment is not None or not targets:
        targets += default_targets(config, attainment, what)
    return targets


STEADY = Target("steady", ">=", 1.0)  # every answer's: its measured window is a steady state


def binding_names(targets: list[Target]) -> list[str]:
    """What can fail, by name, as a search's rows number it: ``targets``, then :data:`STEADY`."""
    return [str(t) for t in targets] + [str(STEADY)]


def failing(targets: list[Target], metrics: dict[str, float]) -> list[Target]:
    """The targets ``metrics`` miss, in order, then :data:`STEADY` if the measured window drifts
    (a run too short to tell passes it): a capacity or a plan never answers with a run that is
    not a steady state."""
    return [t for t in targets if not t.holds(metrics)] + ([STEADY] if metrics.get("steady") == 0.0 else [])
