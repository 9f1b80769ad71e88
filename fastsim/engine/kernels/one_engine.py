"""The four one-engine kernels behind one compiled signature, so that a driver calls any of them
alike, from Python (:func:`fastsim.engine.kernels.run_engine`) or from a compiled loop over many
small runs (:mod:`fastsim.analysis.batch`):

    kernel(arrival, prompt, output, plan, token_1, first_token, done, runs, gaps, work)
        -> (steps, busy slot-steps, max_queue, preemptions, sum over steps of KV blocks in use,
            peak KV blocks in use, number of runs, number of gaps)

``plan`` is :attr:`fastsim.engine.kernels.Plan.numbers`, a :class:`Numbers`. The lesson's
kernels ignore what they do not model (and a decode replica's ``token_1``: they are never given
one).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..._jit import jit
from ...model.cost import T_KV, T_WEIGHTS, frozen_in_loop
from ..router import ONE_ENGINE
from . import lesson
from ._kv import RESERVE, Counters
from ._shape import WORK_ROWS, Alone, Pool, Rules
from .serve import serve
from ._speculative import Spec
from . import serving_batched as batched_kernel

NONE = np.int64(0)  # a counter the lesson's kernels do not keep (a typed 0: a literal one would
# compile every compiled caller of the counters once more)
ONE = np.int64(1)  # one engine's replicas, typed likewise: with literal arguments the serving
UNROUTED = np.int64(ONE_ENGINE)  # kernel would be compiled once for one engine and again for pools
NO_SLACK = np.inf  # a replica that releases no arrivals


class Numbers(NamedTuple):
    """What every one-engine kernel takes of a plan (:class:`fastsim.engine.kernels.Plan`)."""

    limit: int
    window_s: float
    k: np.ndarray
    budget: int
    blocks: int
    block_tokens: int
    kv_mode: int
    prefix_blocks: int
    max_output: int
    lookahead: bool
    fixed_blocks: int
    spec: Spec  # speculative decoding (a run's: its counts are filled)


@jit
def lesson_continuous(arrival, prompt, output, plan, token_1, first_token, done, runs, gaps, work):
    k = plan.k
    steps, busy, queue, nruns = lesson.continuous(arrival, prompt, output, plan.limit, k[T_WEIGHTS], k[T_KV],
                                                  first_token, done, runs, work)
    return steps, busy, queue, NONE, NONE, NONE, nruns, NONE


@jit
def lesson_batched(arrival, prompt, output, plan, token_1, first_token, done, runs, gaps, work):
    k = plan.k
    steps, busy, queue, nruns = lesson.batched(arrival, prompt, output, plan.limit, plan.window_s, k[T_WEIGHTS],
                                               k[T_KV], first_token, done, runs, work)
    return steps, busy, queue, NONE, NONE, NONE, nruns, NONE


@jit
def serving_continuous(arrival, prompt, output, plan, token_1, first_token, done, runs, gaps, work):
    limit, _, k, budget, blocks, bt, kv_mode, pb, o_max, lookahead, fixed, spec = plan
    unrouted = np.empty(0, np.int64)  # one engine: no router's draws in, no replicas out
    no_times = np.empty(0)
    no_cache = np.empty((0, 0), np.int64)  # (KV counted: no prefix cache's array)
    k = frozen_in_loop(k)
    pool = Pool(ONE, k, budget, blocks, NO_SLACK, fixed)
    rules = Rules(limit, bt, pb, kv_mode == RESERVE, o_max, lookahead, 0.0, spec)
    routing = Alone(UNROUTED, unrouted, 1.0, no_times, no_times, unrouted, token_1, 0, unrouted, 1)
    _, (steps, busy, queue, preemptions, kv_sum, kv_peak), nruns, ngaps, _ = serve(
        arrival, prompt, output, Pool(NONE, k, budget, blocks, NO_SLACK, fixed), pool, rules, routing,
        Counters(kv_mode, o_max, fixed),
        no_cache, first_token, done, unrouted, unrouted, runs, gaps, work)
    return steps, busy, queue, preemptions, kv_sum, kv_peak, nruns, ngaps


@jit
def serving_batched(arrival, prompt, output, plan, token_1, first_token, done, runs, gaps, work):
    limit, window, k, blocks, bt, pb, o_max = (plan.limit, plan.window_s, plan.k, plan.blocks, plan.block_tokens,
                                               plan.prefix_blocks, plan.max_output)
    steps, busy, queue, kv_sum, kv_peak, nruns = batched_kernel.batched(
        arrival, prompt, output, limit, window, k, blocks, bt, pb, plan.fixed_blocks, o_max, first_token, done, runs,
        work)
    return steps, busy, queue, NONE, kv_sum, kv_peak, nruns, NONE


# kernel -> (rows of per-request state it keeps in ``work``, whether its runs are compact)
LAYOUT = {
    lesson_continuous: (lesson.WORK_ROWS, True),
    lesson_batched: (lesson.WORK_ROWS, True),
    serving_continuous: (WORK_ROWS, False),
    serving_batched: (batched_kernel.WORK_ROWS, False),
}


def kernel_of(lesson_model: bool, policy: str, decode: bool):
    """The kernel of a plan: the lesson's when every serving-model addition is off (and the
    requests are not a decode replica's), else the serving model's; continuous or batched."""
    if policy == "continuous":
        return lesson_continuous if lesson_model and not decode else serving_continuous
    return lesson_batched if lesson_model else serving_batched
