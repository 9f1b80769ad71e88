"""One scenario end to end: traffic -> kernel -> metrics."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from . import kernels, metrics
from .config import Config
from .traffic import Traffic, generate


_local = threading.local()  # each thread's kernels.Scratch


@dataclass(frozen=True)
class Result:
    """Metrics (keyed by :data:`fastsim.metrics.METRICS` names) and per-request arrays."""

    config: Config
    metrics: dict[str, float]
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    first_token_s: np.ndarray
    done_s: np.ndarray


def measure(config: Config, traffic: Traffic, out: kernels.Outcome) -> dict[str, float]:
    """The metrics of a kernel's outcome on ``traffic``."""
    slo = config.slo
    return metrics.compute(traffic.arrival_s, traffic.output_tokens, out, config.engine.max_batch,
                           (slo.ttft_s, slo.tpot_s, slo.e2e_s))


def simulate(config: Config, traffic: Traffic | None = None) -> Result:
    """Run one scenario: ``config``'s base values (its ``sweep:`` grid is ignored).

    ``traffic`` may be passed to reuse arrays already drawn for ``config.workload``.
    """
    if config.workload.trace is not None:
        from .trace import check_fits

        check_fits(config)  # a recorded request too long for the KV cache could never finish
    traffic = generate(config.workload) if traffic is None else traffic
    if not hasattr(_local, "scratch"):
        _local.scratch = kernels.Scratch()
    out = kernels.run(config, traffic, scratch=_local.scratch)  # measured before the next run
    return Result(
        config,
        measure(config, traffic, out),
        traffic.arrival_s,
        traffic.prompt_tokens,
        traffic.output_tokens,
        out.first_token_s,
        out.done_s,
    )
