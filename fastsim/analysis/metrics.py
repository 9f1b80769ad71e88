"""Throughput and latency metrics of one simulated scenario, from plain NumPy arrays.

All times are seconds from t=0. The p-quantile of n values is the sorted value at index
``floor(p * n)`` clipped to ``n - 1`` (the lesson's rule); only those order statistics are selected
(a histogram pass, then a selection among the few values in each wanted bin), never a full sort.
A run of up to SORT_BELOW requests gets every metric from one compiled call (:func:`small_run`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .._jit import inline, jit, largest, smallest
from . import catalog, itl, steady

if TYPE_CHECKING:
    from ..engine.kernels import Outcome

METRICS = catalog.METRICS  # the metrics, in the order of tables and dataset variables
INTEGER_METRICS = catalog.integer_metrics()


BINS = 4096
SORT_BELOW = 4096
LATENCY_PS = (0.5, 0.9, 0.99)  # TTFT's and e2e's quantiles
TPOT_PS = (0.5, 0.9, 0.99)
ITL_PS = (0.5, 0.9, 0.99)


@jit
def _order_statistics(values, ranks, lo, hi):
    """The values of 0-based ``ranks`` in ``values`` (left as they are; ``lo`` < ``hi`` their
    extremes), in two passes: a histogram over BINS equal bins between the extremes, then a copy
    of the values in the few bins that hold a wanted rank, among which each rank is selected
    (not sorted)."""
    out = np.empty(ranks.size)
    scale = BINS / (hi - lo)
    below = np.zeros(BINS + 1, np.int64)  # values in the bins before bin b
    for v in values:
        below[min(int((v - lo) * scale), BINS - 1) + 1] += 1
    for b in range(BINS):
        below[b + 1] += below[b]
    slot = np.full(BINS, -1, np.int64)  # a wanted bin's place in the copy
    where = np.empty(ranks.size, np.int64)  # each rank's bin
    size = 0
    for t in range(ranks.size):
        b = itl.bin_of_rank(below, ranks[t])
        where[t] = b
        if slot[b] < 0:
            slot[b] = size
            size += below[b + 1] - below[b]
    copy = np.empty(size)
    fill = slot.copy()
    for v in values:
        b = min(int((v - lo) * scale), BINS - 1)
        if fill[b] >= 0:
            copy[fill[b]] = v
            fill[b] += 1
    ones = np.ones(size, np.int64)
    for t in range(ranks.size):
        b = where[t]
        a = slot[b]
        m = below[b + 1] - below[b]
        out[t] = itl.weighted_select(copy[a:a + m], ones[a:a + m], m, ranks[t] - below[b])
    return out


def _select(values: np.ndarray, ps: tuple[float, ...]) -> list[float]:
    """The lesson's quantiles of ``values`` (NaN when empty)."""
    n = values.size
    if n == 0:
        return [float("nan")] * len(ps)
    idx = [min(n - 1, int(p * n)) for p in ps]
    if n <= SORT_BELOW:  # a small run: sorting is cheaper than a histogram of BINS bins
        ordered = np.sort(values)
        return [float(ordered[i]) for i in idx]
    lo, hi = float(values.min()), float(values.max())
    if not hi > lo:  # all equal (or NaN)
        return [lo if hi == lo else float("nan")] * len(ps)
    return _order_statistics(values, np.array(idx, np.int64), lo, hi).tolist()


@jit
def _small_quantiles(ttft, e2e, tpot):
    """:func:`_select` of the three latencies of a small run (each <= SORT_BELOW values), in
    one call: TTFT's and e2e's at LATENCY_PS, then TPOT's at TPOT_PS."""
    out = np.empty(2 * len(LATENCY_PS) + len(TPOT_PS))
    _selected_into(out, 0, ttft, LATENCY_PS)
    _selected_into(out, len(LATENCY_PS), e2e, LATENCY_PS)
    _selected_into(out, 2 * len(LATENCY_PS), tpot, TPOT_PS)
    return out


@inline
def _selected_into(out, t, values, ps):
    n = values.size
    work = values.copy()
    ones = np.ones(n, np.int64)
    for p in ps:
        out[t] = itl.weighted_select(work, ones, n, min(n - 1, int(p * n))) if n else np.nan
        t += 1


@jit
def halves(arrival, first_token, cached, prompt, every_arrival, every_done, end):
    """The statistics of the measured window's two halves (:func:`.steady.judge`) over the
    measured requests (in any order: taken by arrival, ties by index) that arrived by ``end``
    (the arrival process's last arrival); ``cached`` empty: no prefix cache; ``every_arrival``
    and ``every_done``: the whole run's requests. Returns (the statistics, how many requests they
    are of)."""
    in_order = True
    for i in range(1, arrival.size):
        if arrival[i] < arrival[i - 1]:
            in_order = False
            break
    order = np.arange(arrival.size) if in_order else np.argsort(arrival, kind="mergesort")
    n = 0
    while n < order.size and arrival[order[n]] <= end:
        n += 1
    out = np.full((2, steady.COLUMNS), np.nan)
    if n:  # the backlog's growth over the second half: arrivals in it less completions in it
        t0, t1 = arrival[order[n // 2]], arrival[order[n - 1]]
        came = done = 0
        for i in range(every_arrival.size):
            came += t0 < every_arrival[i] <= t1
            done += t0 < every_done[i] <= t1
        out[0, steady.BACKLOG], out[1, steady.BACKLOG] = came - done, came
    h = n // 2
    for half in range(2):
        a, b = (0, h) if half == 0 else (h, n)
        m = b - a
        if m == 0:
            continue
        ttft = np.empty(m)
        for j in range(a, b):
            ttft[j - a] = first_token[order[j]] - arrival[order[j]]
        ranks = steady.interval_ranks(m)
        if m <= SORT_BELOW:
            ones = np.ones(m, np.int64)
            for t in range(ranks.size):
                out[half, t] = itl.weighted_select(ttft, ones, m, ranks[t])
        else:
            lo, hi = smallest(ttft), largest(ttft)
            picked = _order_statistics(ttft, ranks, lo, hi) if hi > lo else np.full(ranks.size, lo)
            for t in range(ranks.size):
                out[half, t] = picked[t]
        if cached.size:
            hits = tokens = 0.0
            for j in range(a, b):
                hits += cached[order[j]]
                tokens += prompt[order[j]]
            out[half, steady.HITS] = hits / tokens
    if cached.size:  # the tenths' hit rates: each half's mean and variance
        per = steady.BATCHES // 2
        rates = np.empty(steady.BATCHES)
        for t in range(steady.BATCHES):
            hits = tokens = 0.0
            for j in range(t * n // steady.BATCHES, (t + 1) * n // steady.BATCHES):
                hits += cached[order[j]]
                tokens += prompt[order[j]]
            rates[t] = hits / tokens if tokens > 0 else 0.0
        for half in range(2):
            mean = 0.0
            for t in range(half * per, (half + 1) * per):
                mean += rates[t]
            mean /= per
            var = 0.0
            for t in range(half * per, (half + 1) * per):
                var += (rates[t] - mean) ** 2
            out[half, steady.HITS + 1] = mean
            out[half, steady.HITS + 2] = var / (per - 1)
    return out, n


def quantiles(values: np.ndarray, ps: tuple[float, ...]) -> list[float]:
    """The lesson's quantiles of ``values`` (NaN for an empty array)."""
    return _select(np.array(values, dtype=float), ps)


@jit
def _latencies(arrival, output, first_token, done, slo_ttft, slo_tpot, slo_e2e):
    """Per-request TTFT and e2e (n,), TPOT for the m requests with output > 1 (m,), and how many
    requests meet every SLO (each ``inf`` when not set; TPOT is 0 for a one-token output)."""
    n = arrival.size
    ttft = np.empty(n)
    e2e = np.empty(n)
    tpot = np.empty(n)
    m = 0
    good = 0
    for i in range(n):
        ttft[i] = first_token[i] - arrival[i]
        e2e[i] = done[i] - arrival[i]
        per_token = 0.0
        if output[i] > 1:
            per_token = (done[i] - first_token[i]) / (output[i] - 1)
            tpot[m] = per_token
            m += 1
        if ttft[i] <= slo_ttft and per_token <= slo_tpot and e2e[i] <= slo_e2e:
            good += 1
    return ttft, e2e, tpot[:m], good


@inline
def _block_sum(a, lo, n):
    """NumPy's sum of ``a[lo:lo + n]`` for n <= 128: eight running sums (one below 8 values)."""
    if n < 8:
        total = 0.0
        for i in range(lo, lo + n):
            total += a[i]
        return total
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    for i in range(lo + 8, lo + n - n % 8, 8):
        r0 += a[i]
        r1 += a[i + 1]
        r2 += a[i + 2]
        r3 += a[i + 3]
        r4 += a[i + 4]
        r5 += a[i + 5]
        r6 += a[i + 6]
        r7 += a[i + 7]
    total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for i in range(lo + n - n % 8, lo + n):
        total += a[i]
    return total


@jit
def _sum(a):
    """``a.sum()`` as NumPy sums it, to the bit, so a small run's means (compiled) are what a
    large run's (NumPy) would be: blocks of at most 128 values, each half of a longer stretch
    summed alone (its left half a multiple of 8 long), then the two added. Walked with a stack,
    not recursion (a recursive function cannot be loaded from Numba's cache)."""
    lo = np.empty(64, np.int64)  # the stretches from the whole array down to the current one
    size = np.empty(64, np.int64)
    left = np.empty(64)  # a stretch's left half's sum, once known
    in_right = np.zeros(64, np.bool_)  # whether the walk is in the stretch's right half
    lo[0], size[0], depth = 0, a.size, 0
    while True:
        while size[depth] > 128:  # down the left halves
            half = size[depth] // 2
            half -= half % 8
            lo[depth + 1], size[depth + 1], in_right[depth] = lo[depth], half, False
            depth += 1
        total = _block_sum(a, lo[depth], size[depth])
        while depth > 0:  # up, adding each right half to its left
            depth -= 1
            if not in_right[depth]:  # its left half is done: now the right one
                left[depth], in_right[depth] = total, True
                break
            total = left[depth] + total
        else:
            return total
        half = size[depth] // 2
        half -= half % 8
        lo[depth + 1], size[depth + 1] = lo[depth] + half, size[depth] - half
        depth += 1


@jit
def _means(arrival, output, first_token, done, tpot, every_arrival, every_done, start, end):
    """(TPOT's mean, the mean of 1 / TPOT, ITL's mean: every gap of the measured requests, and
    the mean requests in flight over [start, end]: every request's time there between its
    arrival and its completion, over the window's length)."""
    m = tpot.size
    inverse = 0.0
    for v in tpot:
        inverse += 1.0 / v if v > 0 else np.inf
    gaps = 0.0
    count = 0
    for i in range(arrival.size):
        if output[i] > 1:
            gaps += done[i] - first_token[i]
            count += output[i] - 1
    flight = 0.0
    for i in range(every_arrival.size):
        flight += max(min(every_done[i], end) - max(every_arrival[i], start), 0.0)
    return (_sum(tpot) / m if m else np.nan, inverse / m if m else np.nan, gaps / count if count else np.nan,
            flight / (end - start) if end > start else np.nan)


@jit
def _values(n, tokens, prompt_tokens, span, ttft_mean, e2e_mean, q, itl_q, means, good, has_slo, counts, max_batch,
            gpus, usd_per_hour):
    """Every metric but the last three (prefix_hit_rate, steady, accepted_length), in the order of :data:`METRICS`
    (as floats). ``q``: TTFT's and e2e's quantiles at LATENCY_PS, then TPOT's at TPOT_PS;
    ``itl_q``: ITL's at ITL_PS; ``means``: :func:`_means`; ``counts``: the outcome's (steps, busy
    slot-steps, max_queue, preemptions, KV block-steps, KV capacity block-steps, peak KV use)."""
    steps, busy, queue, preemptions, kv_steps, kv_capacity, kv_peak = counts
    tpot_mean, inverse_mean, itl_mean, in_flight = means
    throughput = tokens / span
    rates = (throughput, prompt_tokens / span, (tokens + prompt_tokens) / span, throughput / gpus, n / span,
             busy / (steps * max_batch), busy / steps, in_flight)
    latencies = (q[0], q[1], q[2], ttft_mean, q[3], q[4], q[5], e2e_mean, q[6], q[7], q[8], tpot_mean,
                 1.0 / tpot_mean, inverse_mean)
    return rates + latencies + (float(queue), float(steps), span, float(preemptions), kv_peak,
            kv_steps / kv_capacity if kv_capacity > 0 else np.nan, itl_q[0], itl_q[1], itl_q[2], itl_mean,
            good / span if has_slo else np.nan, good / n if has_slo else np.nan,
            float(gpus), usd_per_hour, usd_per_hour / (3600e-6 * throughput))


@jit
def small_run(arrival, output, first_token, done, counts, k, runs, gaps, max_batch, bounds, has_slo, gpus,
              usd_per_hour, with_itl, start, gap_count, cached, prompt, every, prompt_tokens):
    """(fits, every metric but the last three, steady) of a run of at most SORT_BELOW measured
    requests, in one compiled call (a sweep runs many such in a row: :mod:`.batch`); ``fits`` is
    False, and the metrics not all set, when its inter-token gaps are too many to list
    (:func:`.itl.listed_quantiles`). ``start``: the measured window's start; ``gap_count``: the
    run's inter-token gaps (its busy slot-steps less every request's first token); ``cached`` and
    ``prompt``: each measured request's cached and prompt tokens under a prefix cache (empty:
    none); ``every``: (arrivals, done times, the arrival process's end) of the whole run
    (:func:`halves`); ``prompt_tokens``: the measured requests' in all. Without ``with_itl``, the
    ITL quantiles are NaN (not computed)."""
    n = arrival.size
    ttft, e2e, tpot, good = _latencies(arrival, output, first_token, done, bounds[0], bounds[1], bounds[2])
    fits, itl_q = itl.listed_quantiles(k, runs, gaps, gap_count if with_itl else 0, ITL_PS)
    tokens = np.int64(0)  # not the literal 0, which would compile _values a second time
    for o in output:
        tokens += o
    end = largest(done)
    means = _means(arrival, output, first_token, done, tpot, every[0], every[1], start, end)
    values = _values(n, tokens, prompt_tokens, end - start, _sum(ttft) / n, _sum(e2e) / n,
                     _small_quantiles(ttft, e2e, tpot), itl_q, means, good, has_slo, counts, max_batch, gpus,
                     usd_per_hour)
    stats, checked = halves(arrival, first_token, cached, prompt, every[0], every[1], every[2])
    return fits, values, steady.judge(stats, checked, cached.size > 0)


def slo_bounds(slo: tuple[float | None, ...]) -> tuple[tuple[float, ...], bool]:
    """Objectives (None where not set) as the compiled metrics take them: bounds (inf where not
    set) and whether any is set."""
    return tuple(np.inf if b is None else float(b) for b in slo), any(b is not None for b in slo)


def accepted_length(counts: np.ndarray | None) -> float:
    """Tokens a verification emits on average, 1 + the accepted draft tokens (vLLM's mean acceptance
    length), over the whole run; ``counts``: the verifications that accepted 0, 1, ..., k tokens."""
    if counts is None or not counts.sum():
        return np.nan
    return 1 + float(np.arange(counts.size) @ counts) / float(counts.sum())


def acceptance_rates(counts: np.ndarray | None) -> list[float]:
    """Per position, the share of verifications that accepted the draft's token there (vLLM's
    acceptance rate per position); empty without speculation."""
    if counts is None or not counts.sum():
        return []
    return [float(counts[j:].sum()) / float(counts.sum()) for j in range(1, counts.size)]


def named(values: tuple) -> dict[str, float]:
    """A row of metric values (METRICS order) by name, the integer ones as ints."""
    out = dict(zip(METRICS, values))
    for name in INTEGER_METRICS:
        out[name] = int(out[name])
    return out


NO_CACHE = np.empty(0, np.int64)


def compute(arrival: np.ndarray, output: np.ndarray, first_token: np.ndarray, done: np.ndarray, out: Outcome,
            max_batch: int, slo: tuple[float | None, float | None, float | None] = (None, None, None), gpus: int = 1,
            usd_per_hour: float = float("nan"), with_itl: bool = True, start: float = 0.0,
            cached: np.ndarray | None = None, prompt: np.ndarray | None = None,
            every: tuple[np.ndarray, np.ndarray, float] | None = None, prompt_tokens: float = np.nan
            ) -> dict[str, float]:
    """Every metric of :data:`METRICS` for one simulated scenario, an engine's or a fleet's, over
    its measured requests (``arrival`` ... ``done``: theirs; all must have finished) in the window
    from ``start`` (0, or the first measured arrival after a warm-up) to the last completion;
    ``every``: (arrival, done times, the arrival process's end) of every request the run ran
    (None: the measured ones, and no end), whose first tokens are no inter-token gap, and whose
    backlog the steady-state check reads (:func:`halves`); ``slo`` is (TTFT, TPOT, e2e) objectives in seconds, None where not set;
    ``gpus`` and ``usd_per_hour`` the fleet's; ``cached`` and ``prompt``: each measured request's
    cached and prompt tokens under a prefix cache (None: no prefix cache); without ``with_itl``,
    the ITL quantiles are NaN (not computed: the costliest metric, which a fit may not need);
    ``prompt_tokens``: the measured requests' in all (NaN: input throughputs unknown). Step
    counters (steps, slot use, batch, queue, preemptions, KV use) and ITL quantiles are the whole run's."""
    bounds, has_slo = slo_bounds(slo)
    counts = (out.steps, out.busy_slot_steps, out.max_queue, out.preemptions, out.kv_block_steps,
              out.kv_capacity_steps, out.kv_peak_use)
    n = arrival.size
    every = (arrival, done, np.inf) if every is None else every
    gap_count = out.busy_slot_steps - every[0].size
    hit_rate = float(cached.sum()) / float(prompt.sum()) if cached is not None and prompt.sum() else np.nan
    cached, prompt = (NO_CACHE, NO_CACHE) if cached is None else (cached, prompt)
    if n <= SORT_BELOW:  # a small run: every metric in one compiled call
        fits, values, flag = small_run(arrival, output, first_token, done, counts, out.k, out.runs, out.gaps_s,
                                       max_batch, bounds, has_slo, gpus, usd_per_hour, with_itl, start, gap_count,
                                       cached, prompt, every, prompt_tokens)
        if fits:
            return named(values + (hit_rate, flag, accepted_length(out.spec_counts)))
    ttft, e2e, tpot, good = _latencies(arrival, output, first_token, done, *bounds)
    q = np.array(_select(ttft, LATENCY_PS) + _select(e2e, LATENCY_PS) + _select(tpot, TPOT_PS))
    itl_q = np.array(itl.quantiles(out.k, out.runs, out.gaps_s, gap_count if with_itl else 0, ITL_PS))
    means = float(ttft.sum()) / n, float(e2e.sum()) / n  # NumPy's sums, as _sum's
    stats, checked = halves(arrival, first_token, cached, prompt, *every)
    flag = steady.judge(stats, checked, cached.size > 0)
    end = float(done.max())
    more = _means(arrival, output, first_token, done, tpot, every[0], every[1], start, end)
    return named(_values(n, int(output.sum()), prompt_tokens, end - start, *means, q, itl_q, more, good, has_slo,
                         counts, max_batch, gpus, usd_per_hour) + (hit_rate, flag, accepted_length(out.spec_counts)))
