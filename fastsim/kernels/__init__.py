"""Step-loop kernels for the batching policies, and the registry that picks one.

The driver here validates nothing (the config did), folds the config into a :class:`Plan` of
plain numbers once, allocates the outputs and calls one kernel: the lesson's (:mod:`.lesson`)
when every serving-model addition is off, else the serving model's (:mod:`.serving`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import cost
from ..config import Config
from ..traffic import Traffic
from . import lesson, serving
from ._calendar import COMPACT_RUN, FULL_COLUMNS, RING_MAX

__all__ = ["POLICIES", "RING_MAX", "Outcome", "Plan", "Scratch", "run", "step_time_coefficients"]

UNLIMITED_BUDGET = 1 << 62
RUNS_PER_REQUEST = 3  # room for step runs; measured 0.9 to 2.8 a request (lesson, rates 8 and 40)


@dataclass(frozen=True)
class Plan:
    """A config folded into what the kernels take."""

    lesson: bool  # every serving-model addition off
    limit: int
    window_s: float  # dynamic batching (inf for static)
    k: np.ndarray  # step-time coefficients (:func:`fastsim.cost.coefficients`)
    budget: int
    blocks: int  # -1: unlimited
    block_tokens: int
    reserve: bool
    prefix_blocks: int
    max_output: int
    api_s: float

    @classmethod
    def of(cls, config: Config, traffic: Traffic | None = None) -> Plan:
        """``traffic`` gives a trace's longest output (a distribution's is in the config)."""
        e = config.engine
        blocks = cost.kv_blocks(config)
        k = cost.coefficients(config)
        return cls(
            lesson=cost.is_lesson(config, k),
            limit=e.limit,
            window_s=e.window_ms / 1000 if e.policy == "dynamic" else np.inf,
            k=k,
            budget=UNLIMITED_BUDGET if e.max_batched_tokens is None else e.max_batched_tokens,
            blocks=-1 if blocks is None else blocks,
            block_tokens=e.block_tokens,
            reserve=e.kv_alloc == "reserve",
            prefix_blocks=cost.prefix_blocks(config) if blocks is not None else 0,
            max_output=(int(traffic.output_tokens.max()) if config.workload.trace is not None
                        else config.workload.max_output),
            api_s=config.calibration.api_overhead_ms / 1000,
        )


@dataclass(frozen=True)
class Outcome:
    """What a kernel produces for one scenario."""

    first_token_s: np.ndarray  # float64 (n,)
    done_s: np.ndarray  # float64 (n,)
    steps: int
    busy_slot_steps: int
    max_queue: int
    preemptions: int
    kv_blocks: int  # in the cache; -1: unlimited
    kv_block_steps: int  # sum over steps of the blocks in use
    kv_peak_blocks: int
    runs: np.ndarray  # step runs, for inter-token latencies: int64 (r, 4), or COMPACT_RUN (r,) (see ._calendar)
    gaps_s: np.ndarray  # float64: inter-token gaps of requests that skipped steps
    k: np.ndarray  # the step-time coefficients the runs' durations come from


def _continuous(p: Plan, tr: Traffic, first_token: np.ndarray, done: np.ndarray, runs: np.ndarray,
                gaps: np.ndarray) -> tuple:
    if p.lesson:
        steps, busy, queue, nruns = lesson._continuous(
            tr.arrival_s, tr.prompt_tokens, tr.output_tokens, p.limit, p.k[1], p.k[2], first_token, done, runs
        )
        return steps, busy, queue, 0, 0, 0, runs, nruns, np.empty(0), 0
    steps, busy, queue, preemptions, kv_sum, kv_peak, nruns, ngaps = serving._continuous(
        tr.arrival_s, tr.prompt_tokens, tr.output_tokens, p.limit, p.k, p.budget, p.blocks, p.block_tokens,
        p.reserve, p.prefix_blocks, p.max_output, p.api_s, first_token, done, runs, gaps,
    )
    return steps, busy, queue, preemptions, kv_sum, kv_peak, runs, nruns, gaps, ngaps


def _batched(p: Plan, tr: Traffic, first_token: np.ndarray, done: np.ndarray, runs: np.ndarray,
             gaps: np.ndarray) -> tuple:
    if p.lesson:
        steps, busy, queue, nruns = lesson._batched(
            tr.arrival_s, tr.prompt_tokens, tr.output_tokens, p.limit, p.window_s, p.k[1], p.k[2],
            first_token, done, runs,
        )
        return steps, busy, queue, 0, 0, 0, runs, nruns, np.empty(0), 0
    steps, busy, queue, kv_sum, kv_peak, nruns = serving._batched(
        tr.arrival_s, tr.prompt_tokens, tr.output_tokens, p.limit, p.window_s, p.k, p.blocks, p.block_tokens,
        p.prefix_blocks, p.max_output, p.api_s, first_token, done, runs,
    )
    return steps, busy, queue, 0, kv_sum, kv_peak, runs, nruns, np.empty(0), 0


POLICIES: dict[str, Callable] = {
    "static": _batched,  # window = inf
    "dynamic": _batched,
    "continuous": _continuous,
}
"""Policy name -> kernel runner; config validation checks ``engine.policy`` against these keys."""


def step_time_coefficients(config: Config) -> tuple[float, float]:
    """The lesson's step time, ``t_weight + t_kv * ctx``: (t_weight, t_kv) in seconds."""
    k = cost.coefficients(config)
    return float(k[cost.T_WEIGHTS]), float(k[cost.T_KV])


class Scratch:
    """Room for a kernel's step runs, kept between runs by a caller that uses each Outcome before
    the next run (as :func:`fastsim.simulate` does): a fresh buffer's first touch costs 10-20 ms
    per million requests, as much as a fifth of the kernel. Grows as needed."""

    def __init__(self) -> None:
        self.buffer = np.empty(0, np.int64)

    def take(self, rows: int, compact: bool) -> np.ndarray:
        """Room for ``rows`` runs in the compact or the full layout."""
        size = rows * (COMPACT_RUN.itemsize // 8 if compact else FULL_COLUMNS)
        if self.buffer.size < size or self.buffer.size > 8 * size + (1 << 22):  # grow, or let a huge one go
            self.buffer = np.empty(size, np.int64)
        room = self.buffer[:size]
        return room.view(COMPACT_RUN) if compact else room.reshape(rows, FULL_COLUMNS)


def run(config: Config, traffic: Traffic, plan: Plan | None = None, scratch: Scratch | None = None) -> Outcome:
    """Simulate ``traffic`` on the engine ``config`` describes. With ``scratch``, the Outcome's
    step runs live in it: valid until the next run that uses the same scratch."""
    p = Plan.of(config, traffic) if plan is None else plan
    n = len(traffic)
    first_token = np.empty(n)
    done = np.empty(n)
    room = (RUNS_PER_REQUEST * n + 64, n // 8 + 64)
    kernel = POLICIES[config.engine.policy]
    while True:
        runs = (Scratch() if scratch is None else scratch).take(room[0], p.lesson)
        gaps = np.empty(room[1])
        steps, busy, queue, preemptions, kv_sum, kv_peak, runs, nruns, gaps, ngaps = kernel(
            p, traffic, first_token, done, runs, gaps
        )
        if nruns <= len(runs) and ngaps <= len(gaps):
            break
        room = (max(nruns, room[0]), max(ngaps, room[1]))  # rare: run again with room for every record
    return Outcome(first_token, done, int(steps), int(busy), int(queue), int(preemptions), p.blocks,
                   int(kv_sum), int(kv_peak), runs[:nruns], gaps[:ngaps], p.k)
