"""Many small scenarios of one engine in one compiled call: a sweep's points, as rows of metrics.

A point of a few hundred requests costs more in the Python around its run (a kernel call, the
metrics, the objects between them) than in simulating it. Consecutive points that share an
engine's plan and objectives (they differ only in their workload: seeds, rates, lengths) run
here back to back in one compiled loop: each point's kernel, its client times and every metric
(:func:`.metrics.small_run`), straight into its row. The rows are those :func:`fastsim.simulate`
gives, to the bit: the same compiled code computes both. A point the loop cannot finish (its step
runs overflow their room, or its inter-token gaps are too many to list) is simulated alone, as
are fleets and points of more than :data:`MAX_REQUESTS` requests.
"""

from __future__ import annotations

import numpy as np

from .._jit import inline, jit
from ..engine.checks import steps_fit
from ..engine.kernels import RUNS_PER_REQUEST, Plan, kv_totals, longest_output, one_engine
from ..engine import paths, traffic as traffic_of
from ..engine.traffic import Traffic
from ..model import fleet as pools
from ..model.schema import Config
from .metrics import METRICS, SORT_BELOW, slo_bounds, small_run
from .simulation import scratch, simulate

HIT_RATE = list(METRICS).index("prefix_hit_rate")
STEADY = list(METRICS).index("steady")
MAX_REQUESTS = SORT_BELOW  # a point with more runs alone (its metrics select rather than sort)
GROUP_REQUESTS = 1 << 18  # requests run in one call at most (their traffic and times are held)


@inline
def _points(kernel, plan, api_s, requests, room, objectives, rows):
    """Point i on requests ``starts[i]:starts[i + 1]`` (of ``requests``: arrival, prompt,
    output, starts) with ``room`` (first token and done times for every request; runs, gaps
    and work for the largest point); ``objectives``: (max_batch, SLO bounds, whether any is set,
    GPUs, USD per hour, whether ITL is measured). Fills each finished point's row; returns which finished."""
    arrival, prompt, output, starts = requests
    first_token, done, runs, gaps, work = room
    max_batch, bounds, has_slo, gpus, usd_per_hour, with_itl = objectives
    token_1 = np.empty(0)
    no_cache = np.empty(0, np.int64)  # (nothing shared: no hit drifts)
    k, blocks = plan.k, plan.blocks
    finished = np.zeros(starts.size - 1, np.bool_)
    for i in range(starts.size - 1):
        a, b = starts[i], starts[i + 1]
        steps, busy, queue, preemptions, kv_sum, kv_peak, nruns, ngaps = kernel(
            arrival[a:b], prompt[a:b], output[a:b], plan, token_1, first_token[a:b], done[a:b], runs, gaps, work)
        if nruns > runs.shape[0] or ngaps > gaps.size:
            continue
        for j in range(a, b):  # client times
            first_token[j] += api_s
            done[j] += api_s
        kv_steps, kv_capacity, kv_use = kv_totals(blocks, steps, kv_sum, kv_peak)
        counts = (steps, busy, queue, preemptions, kv_steps, kv_capacity, kv_use)
        prompt_tokens = 0.0
        for j in range(a, b):
            prompt_tokens += prompt[j]
        fits, values, flag = small_run(arrival[a:b], output[a:b], first_token[a:b], done[a:b], counts, k,
                                       runs[:nruns], gaps[:ngaps], max_batch, bounds, has_slo, gpus, usd_per_hour,
                                       with_itl, 0.0, busy - (b - a), no_cache, no_cache,
                                       (arrival[a:b], done[a:b], np.inf), prompt_tokens)
        if fits:
            for m in range(len(values)):
                rows[i, m] = values[m]
            rows[i, STEADY] = flag
            finished[i] = True
    return finished


# One compiled loop per kernel (a kernel passed as an argument could not be cached on disk).
@jit
def _lesson_continuous(plan, api_s, requests, room, objectives, rows):
    return _points(one_engine.lesson_continuous, plan, api_s, requests, room, objectives, rows)


@jit
def _lesson_batched(plan, api_s, requests, room, objectives, rows):
    return _points(one_engine.lesson_batched, plan, api_s, requests, room, objectives, rows)


@jit
def _serving_continuous(plan, api_s, requests, room, objectives, rows):
    return _points(one_engine.serving_continuous, plan, api_s, requests, room, objectives, rows)


@jit
def _serving_batched(plan, api_s, requests, room, objectives, rows):
    return _points(one_engine.serving_batched, plan, api_s, requests, room, objectives, rows)


LOOPS = {
    one_engine.lesson_continuous: _lesson_continuous,
    one_engine.lesson_batched: _lesson_batched,
    one_engine.serving_continuous: _serving_continuous,
    one_engine.serving_batched: _serving_batched,
}


class _Group:
    """Consecutive points run in one call: one plan, the same objectives and fleet."""

    def __init__(self, config: Config, plan: Plan) -> None:
        self.config, self.plan = config, plan
        self.members: list[tuple[int, Config, Traffic]] = []
        self.requests = 0

    def takes(self, config: Config, plan: Plan, n: int) -> bool:
        return (plan is self.plan and config.slo is self.config.slo and config.fleet is self.config.fleet
                and self.requests + n <= GROUP_REQUESTS)

    def run(self, rows: np.ndarray) -> None:
        """Fill the members' rows (simulating alone any the loop could not finish)."""
        p, c = self.plan, self.config
        traffic = [t for _, _, t in self.members]
        sizes = [len(t) for t in traffic]
        largest = max(sizes)
        kernel = one_engine.kernel_of(p.lesson, p.policy, False)
        work_rows, compact = one_engine.LAYOUT[kernel]
        s = scratch()
        room = (np.empty(self.requests), np.empty(self.requests), s.take(RUNS_PER_REQUEST * largest + 64, compact),
                np.empty(largest // 8 + 64), s.work(work_rows, largest))
        requests = (np.concatenate([t.arrival_s for t in traffic]), np.concatenate([t.prompt_tokens for t in traffic]),
                    np.concatenate([t.output_tokens for t in traffic]), np.cumsum([0] + sizes))
        bounds, has_slo = slo_bounds((c.slo.ttft_s, c.slo.tpot_s, c.slo.e2e_s))
        objectives = (c.engine.max_batch, bounds, has_slo, pools.gpus(c), pools.usd_per_hour(c), True)
        out = np.full((len(sizes), len(METRICS)), np.nan)  # prefix_hit_rate: NaN without a prefix cache
        finished = LOOPS[kernel](p.numbers(), p.api_s, requests, room, objectives, out)
        for (r, config, t), row, ok in zip(self.members, out, finished.tolist()):
            if config.engine.prefix_caching:  # nothing shared: no first admission hits
                row[HIT_RATE] = 0.0
            rows[r] = row if ok else list(simulate(config, t, checked=True).metrics.values())


def metric_rows(configs: list[Config]) -> np.ndarray:
    """Each config's metrics (:data:`METRICS` order), as :func:`fastsim.simulate` gives them; the
    configs were checked. Consecutive configs with the same workload share one draw of traffic."""
    rows = np.empty((len(configs), len(METRICS)))
    drawn, traffic, group = None, None, None
    for r, config in enumerate(configs):
        config = pools.as_run(config)  # as simulate() runs it
        if traffic_of.key(config) != drawn:
            drawn, traffic = traffic_of.key(config), traffic_of.of(config)
            tokens = traffic.tokens()
        n = len(traffic)
        if not paths.batchable(config, traffic.content is not None, traffic.warmup) or n > MAX_REQUESTS or config.calibration.stall_rate_hz:
            rows[r] = list(simulate(config, traffic, checked=True).metrics.values())  # checks its steps
            continue
        steps_fit(config, *tokens)
        plan = Plan.of(config, longest_output(config, traffic))
        if group is None or not group.takes(config, plan, n):
            if group is not None:
                group.run(rows)
            group = _Group(config, plan)
        group.members.append((r, config, traffic))
        group.requests += n
    if group is not None:
        group.run(rows)
    return rows
