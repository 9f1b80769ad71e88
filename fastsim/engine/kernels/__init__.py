"""Step-loop kernels of one engine, and the driver that runs one.

The driver here validates nothing (the config was checked), folds the config into a :class:`Plan`
of plain numbers once, allocates the outputs and calls one kernel (:mod:`.one_engine` picks it):
the lesson's (:mod:`.lesson`) when every serving-model addition is off, else the serving model's
(:mod:`.serve`, :mod:`.serving_batched`). Kernels work in engine time; the client's API
overhead is added once, by :func:`run` (or the fleet's driver), to every request's times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..._jit import inline
from ...model import cost
from ...model.schema import Config
from ._calendar import COMPACT_RUN, FULL_COLUMNS, RING_MAX
from ._kv import PAGED, REHIT, RESERVE, WHOLE
from ._speculative import NO_IDS, OFF, Spec, seed_of, thresholds
from .one_engine import LAYOUT, Numbers, kernel_of

__all__ = ["RING_MAX", "RUNS_PER_REQUEST", "Outcome", "Plan", "Scratch", "kv_totals", "longest_output", "outcome",
           "run", "run_engine", "with_api", "with_room"]

UNLIMITED_BUDGET = 1 << 62
RUNS_PER_REQUEST = 3  # room for step runs; measured 0.9 to 2.8 a request (lesson, rates 8 and 40)
NO_TOKEN_1 = np.empty(0)


class Counters(NamedTuple):
    """What a kernel returns beside the per-request times it fills (:mod:`.one_engine`)."""

    steps: int
    busy: int  # slot-steps that emitted a token
    max_queue: int
    preemptions: int
    kv_sum: int  # sum over steps of KV blocks in use
    kv_peak: int
    runs: int  # step runs it recorded (or needed room for)
    gaps: int  # irregular gaps likewise


@dataclass(frozen=True)
class Plan:
    """A config folded into what the kernels take."""

    lesson: bool  # every serving-model addition off
    policy: str
    limit: int
    window_s: float  # dynamic batching (inf for static)
    k: np.ndarray  # step-time coefficients (:func:`fastsim.model.cost.coefficients`)
    budget: int
    blocks: int  # -1: unlimited
    block_tokens: int
    kv_mode: int  # PAGED, RESERVE or REHIT (:mod:`._kv`)
    prefix_blocks: int
    max_output: int
    lookahead: bool  # async scheduling (:func:`.serve.serve`)
    api_s: float
    fixed_blocks: int = 0  # a hybrid-attention model's per running request (:func:`fastsim.model.cost.fixed_blocks`)
    spec: Spec = OFF  # speculative decoding (:mod:`._speculative`); a run takes a copy with its own counts

    def run_spec(self, ids: np.ndarray = NO_IDS) -> Spec:
        """The plan's speculative decoding with counts of its own, for one run; ``ids``: each request's
        place in the run's traffic (empty: as given)."""
        return self.spec._replace(counts=np.zeros(self.spec.tokens + 1, np.int64), ids=ids) if self.spec.tokens else OFF

    def spec_counts(self, spec: Spec) -> np.ndarray | None:
        """A run's counts (the verifications that accepted 0, 1, ..., k tokens), None without speculation."""
        return spec.counts if self.spec.tokens else None

    @property
    def dp(self) -> int:
        """Data-parallel ranks a replica (lock-step: the serving loop's :mod:`._lockstep` shape)."""
        return int(self.k[cost.RANKS])

    def numbers(self, spec: Spec = OFF) -> Numbers:
        """What every one-engine kernel takes of the plan (:mod:`.one_engine`), with a run's ``spec``."""
        return Numbers(self.limit, self.window_s, self.k, self.budget, self.blocks, self.block_tokens, self.kv_mode,
                       self.prefix_blocks, self.max_output, self.lookahead, self.fixed_blocks, spec)

    @classmethod
    def of(cls, config: Config, max_output: int | None = None, prefix: bool = True) -> Plan:
        """``max_output``: the longest output (default: the workload distribution's; a trace's
        comes from its requests). ``prefix``: whether the shared prefix is pinned (not on a
        decode replica, whose prompts arrive whole).

        The last plan is kept: a sweep's points that differ only in their workload share the
        other sections' objects (:meth:`Config.at` copies only what changes) and reuse it. (Threads
        may share it: it is one tuple, read and replaced whole.)"""
        global _last_plan
        max_output = config.workload.max_output if max_output is None else max_output
        sections = (config.engine, config.hardware, config.model, config.calibration)
        key = (max_output, config.workload.prefix_tokens, prefix,
               config.workload.seed if config.engine.speculative is not None else None)
        last = _last_plan
        if last is not None and last[1] == key and all(a is b for a, b in zip(last[0], sections)):
            return last[2]
        plan = cls._fold(config, max_output, prefix)
        _last_plan = (sections, key, plan)
        return plan

    @classmethod
    def _fold(cls, config: Config, max_output: int, prefix: bool) -> Plan:
        e = config.engine
        blocks = cost.kv_blocks(config)
        k = cost.coefficients(config)
        return cls(
            lesson=cost.is_lesson(config, k),
            policy=e.policy,
            limit=e.limit,
            window_s=e.window_ms / 1000 if e.policy == "dynamic" else np.inf,
            k=k,
            budget=UNLIMITED_BUDGET if e.max_batched_tokens is None else e.max_batched_tokens,
            blocks=-1 if blocks is None else blocks,
            block_tokens=e.block_tokens,
            kv_mode=_kv_mode(config, prefix),
            prefix_blocks=cost.prefix_blocks(config) if prefix else 0,
            max_output=max_output,
            lookahead=e.async_scheduling,
            api_s=config.calibration.api_overhead_ms / 1000,
            fixed_blocks=cost.fixed_blocks(config),
            spec=_spec(config),
        )


def _spec(config: Config) -> Spec:
    """Speculative decoding as the loop takes it (counts empty: each run takes its own)."""
    s = config.engine.speculative
    if s is None:
        return OFF
    return Spec(s.tokens, s.span, thresholds(s.per_position()), seed_of(config.workload.seed), OFF.counts, NO_IDS)


def _kv_mode(config: Config, prefix: bool) -> int:
    """How an engine holds KV as counters: reserved, or paged; under a prefix cache a preempted
    request re-hits its own blocks (all or none where local-attention layers hold a window; never
    where linear-attention layers hold a state, which vLLM does not cache: docs/model/deployed.md)."""
    e, m = config.engine, config.model
    if e.kv_alloc == "reserve":
        return RESERVE
    if not (e.prefix_caching and prefix) or m.linear_layers:
        return PAGED
    return WHOLE if m.window_layers else REHIT


_last_plan: tuple | None = None  # (the sections, the other inputs, the plan) of the last Plan.of


@dataclass(frozen=True)
class Outcome:
    """What simulating a scenario produces: per-request times and the counters metrics need.
    One engine's, or a fleet's pooled over its replicas (sums; ``max_queue`` and
    ``kv_peak_use`` the largest of any replica)."""

    first_token_s: np.ndarray  # float64 (n,)
    done_s: np.ndarray  # float64 (n,)
    steps: int
    busy_slot_steps: int
    max_queue: int
    preemptions: int
    kv_block_steps: int  # sum over steps of the KV blocks in use (replicas with a limited cache)
    kv_capacity_steps: int  # sum over steps of the blocks those caches hold
    kv_peak_use: float  # blocks in use / blocks, peak (NaN: no limited cache)
    runs: np.ndarray  # step runs, for inter-token latencies: int64 (r, 5), or COMPACT_RUN (r,) (see ._calendar)
    gaps_s: np.ndarray  # float64: inter-token gaps of requests that skipped steps
    k: np.ndarray  # the step-time coefficients the runs' durations come from
    replica: np.ndarray | None = None  # int32 (n,): the (decode) replica that served each request
    prefill_replica: np.ndarray | None = None  # int32 (n,): the prefill replica, or -1 (disaggregated)
    arrival_s: np.ndarray | None = None  # float64 (n,): arrivals, when the run set some (sessions' later turns)
    cached_tokens: np.ndarray | None = None  # int64 (n,): each request's prefix-cache hit at its first admission
    prefix_hit_rate: float = float("nan")  # hit tokens at first admissions / prompt tokens (NaN: no cache)
    spec_counts: np.ndarray | None = None  # speculative decoding: the verifications that accepted 0, 1, ..., k tokens

    def arrivals(self, given: np.ndarray) -> np.ndarray:
        """The arrival times the run saw: ``given`` (the traffic's), but where the run set some
        (sessions' later turns)."""
        return given if self.arrival_s is None else self.arrival_s


def _room(buffer: np.ndarray, size: int) -> np.ndarray:
    """``buffer``, or a new one when it is too small or far too large (a huge one is let go)."""
    return buffer if size <= buffer.size <= 8 * size + (1 << 22) else np.empty(size, np.int64)


class Scratch:
    """Room for a kernel's step runs and its per-request state, kept between runs by a caller
    that uses each Outcome before the next run (as :func:`fastsim.simulate` does). Memory fresh
    from the system costs a page fault at its first touch: for the serving kernel's state at a
    million requests, measured a quarter of the kernel's time. Grows as needed."""

    def __init__(self) -> None:
        self.buffer = np.empty(0, np.int64)
        self.state = np.empty(0, np.int64)

    def take(self, rows: int, compact: bool) -> np.ndarray:
        """Room for ``rows`` runs in the compact or the full layout."""
        size = rows * (COMPACT_RUN.itemsize // 8 if compact else FULL_COLUMNS)
        self.buffer = _room(self.buffer, size)
        room = self.buffer[:size]
        return room.view(COMPACT_RUN) if compact else room.reshape(rows, FULL_COLUMNS)

    def work(self, rows: int, n: int) -> np.ndarray:
        """Room for a kernel's ``rows`` arrays of state for ``n`` requests: int64 (rows, n + 1),
        a spare slot at the end of each (:mod:`._running`), contents left over (each kernel
        initialises what it reads)."""
        size = rows * (n + 1)
        self.state = _room(self.state, size)
        return self.state[:size].reshape(rows, n + 1)


def outcome(p: Plan, first_token: np.ndarray, done: np.ndarray, counters: Counters, runs: np.ndarray, gaps: np.ndarray,
            replica: np.ndarray | None = None, spec_counts: np.ndarray | None = None) -> Outcome:
    """The Outcome of a kernel of plan ``p`` (one engine's, or a pool kernel's): its per-request
    times, the counters it returned (steps, busy, max_queue, preemptions, KV block-steps, peak KV
    blocks, runs, gaps) and the room it recorded its runs and gaps in."""
    steps, busy, queue, preemptions, kv_sum, kv_peak, nruns, ngaps = counters
    kv_steps, kv_capacity, kv_use = kv_totals(p.blocks, int(steps), int(kv_sum), int(kv_peak))
    return Outcome(first_token, done, int(steps), int(busy), int(queue), int(preemptions), kv_steps, kv_capacity,
                   kv_use, runs[:nruns], gaps[:ngaps], p.k, replica, spec_counts=spec_counts)


@inline
def kv_totals(blocks, steps, kv_sum, kv_peak):
    """A kernel's KV counters as an Outcome has them: (block-steps in use, block-steps the cache
    holds, peak use as a fraction); 0, 0 and NaN without a limited cache (``blocks`` -1)."""
    if blocks < 0:
        return 0, 0, np.nan
    return kv_sum, blocks * steps, kv_peak / blocks if blocks > 0 else np.nan


def run_engine(p: Plan, arrival: np.ndarray, prompt: np.ndarray, output: np.ndarray, scratch: Scratch | None = None,
               token_1: np.ndarray = NO_TOKEN_1) -> Outcome:
    """One engine on these requests (arrival-sorted), in engine time (no API overhead).
    ``token_1``: a decode replica's requests, each with its first token's time (see
    :func:`.serve.serve`). With ``scratch``, the Outcome's step runs live in it: valid
    until the next run that uses the same scratch."""
    n = arrival.size
    first_token = np.empty(n)
    done = np.empty(n)
    kernel = kernel_of(p.lesson, p.policy, token_1.size > 0)
    rows, compact = LAYOUT[kernel]
    scratch = Scratch() if scratch is None else scratch
    spec = p.run_spec()
    numbers = p.numbers(spec)
    def call(runs: np.ndarray, gaps: np.ndarray) -> tuple:
        spec.counts.fill(0)  # (a run again with more room counts afresh)
        return kernel(arrival, prompt, output, numbers, token_1, first_token, done, runs, gaps, scratch.work(rows, n))

    counters, runs, gaps = with_room(n, scratch, compact, call)
    return outcome(p, first_token, done, counters, runs, gaps, spec_counts=p.spec_counts(spec))


def with_room(n: int, scratch: Scratch, compact: bool, call) -> tuple[Counters, np.ndarray, np.ndarray]:
    """Run a kernel, ``call(runs, gaps)`` returning its counters, with room for the step runs
    and irregular gaps of ``n`` requests (in the compact or the full layout); when it needed
    more (rare), again with room for every record. Returns (counters, runs, gaps)."""
    room = (RUNS_PER_REQUEST * n + 64, n // 8 + 64)
    while True:
        runs = scratch.take(room[0], compact)
        gaps = np.empty(room[1])
        counters = Counters(*call(runs, gaps))
        if counters.runs <= len(runs) and counters.gaps <= len(gaps):
            return counters, runs, gaps
        room = (max(counters.runs, room[0]), max(counters.gaps, room[1]))


def with_api(out: Outcome, api_s: float) -> Outcome:
    """``out`` as the client sees it: ``api_s`` added to every first and last token's time."""
    if api_s:
        np.add(out.first_token_s, api_s, out=out.first_token_s)
        np.add(out.done_s, api_s, out=out.done_s)
    return out


def run(config: Config, traffic, plan: Plan | None = None, scratch: Scratch | None = None) -> Outcome:
    """Simulate ``traffic`` on the one engine ``config`` describes (client times, without the
    engine's stalls: :func:`fastsim.engine.fleet.run` adds them)."""
    p = Plan.of(config, longest_output(config, traffic)) if plan is None else plan
    return with_api(run_engine(p, traffic.arrival_s, traffic.prompt_tokens, traffic.output_tokens, scratch), p.api_s)


def longest_output(config: Config, traffic) -> int | None:
    """A trace's longest output (a distribution's is in the config)."""
    return int(traffic.output_tokens.max()) if config.workload.trace is not None else None
