"""Exact inter-token latency quantiles from a run's step runs, without one value per token.

Every gap between consecutive tokens of a request is either the duration of the step that
emitted the later token (the request also emitted in the step before) or, for a request that
skipped steps, an irregular gap the kernel recorded. The kernels record runs of steps (see
:mod:`fastsim.engine.kernels._calendar`) whose durations are recomputed exactly from the
step-time formula: within a run they never decrease, so the steps of a run in any value range are
one contiguous stretch, found by a short search.

Selection, for every wanted rank at once: a sample of the runs (each standing for its gaps at its
middle step's value) brackets each rank in a narrow window of values. One pass over every run
then counts the gaps of the runs wholly below each window and keeps a copy of the runs that may
reach into it, whole (a run costs its last duration and a bound on its first). Among the runs
kept, the rank's value is selected the same way, narrowing until a few thousand steps are
left, which are listed and selected by weight; deeper narrowings keep only the part of each
run inside their window. A value outside its window means the sample misled: the window
widens and the pass runs again. The work follows the number of runs, not of tokens. Quantiles
use the lesson's rule (the sorted value at floor(p n)).
"""

from __future__ import annotations

import numpy as np

from .._jit import inline, jit, largest, smallest
from ..engine.kernels._calendar import run_copy, run_lengths, run_m, run_step, run_w
from ..model.cost import run_time

SAMPLES = 1 << 14  # runs (and gaps) sampled to bracket each rank
LIST_MAX = 1 << 15  # steps listed and selected outright
ROOM_MARGIN = 2.0  # room for kept runs: this many times what the sample puts in a window
GOLDEN = 0.6180339887498949  # spreads the sampled steps over their stretches (see _sample)
NONE = np.empty(0, np.int64)  # no stretches: every run whole


@inline
def _duration(k, runs, r, j):
    """Duration of step ``j`` of run ``r`` (the same operations as the kernel's; a lock-step
    replica's step is its slowest rank's, :func:`fastsim.model.cost.group_step_time`)."""
    n_tokens, kv_tokens, pairs, sampled = run_step(runs, r, j)
    return run_time(k, n_tokens, kv_tokens, pairs, sampled)


@inline
def _first(k, runs, r, ja, jb, da, db, bound, strict):
    """First step in [ja, jb] of run ``r`` whose duration is >= ``bound`` (> if ``strict``);
    jb + 1 if none. ``da`` and ``db`` are the durations at ja and jb. Durations never decrease
    within a run and grow almost linearly, so the search starts where a straight line between the
    ends meets the bound and gallops from there (two or three evaluations, mostly)."""
    if da > bound or (da == bound and not strict):
        return ja
    if db < bound or (db == bound and strict):
        return jb + 1
    lo, hi = ja, jb  # d(lo) is short of the bound, d(hi) meets it
    g = ja + int((bound - da) / (db - da) * (jb - ja)) if db > da else (ja + jb) // 2
    step = 1
    while hi - lo > 1:
        if g <= lo or g >= hi:
            g = (lo + hi) // 2
        d = _duration(k, runs, r, g)
        if d > bound or (d == bound and not strict):
            hi = g
            g = hi - step
        else:
            lo = g
            g = lo + step
        step *= 2
    return hi


@inline
def _stretch(runs, whole, cr, ca, cb, c):
    """Stretch ``c``: (run, first step, last step); with ``whole``, every step of run c."""
    if whole:
        return c, 0, run_m(runs, c) - 1
    return cr[c], ca[c], cb[c]


@jit
def _steps(runs, whole, cr, ca, cb):
    """How many gaps the stretches hold (steps x w)."""
    total = 0
    for c in range(runs.shape[0] if whole else cr.size):
        r, ja, jb = _stretch(runs, whole, cr, ca, cb, c)
        total += (jb - ja + 1) * run_w(runs, r)
    return total


@jit
def _sample(k, runs, whole, cr, ca, cb, gaps, size):
    """About ``size`` of the runs' stretches and gaps, evenly spaced: each stands for its gaps
    at the value of one of its steps, spread over the stretch (a golden-ratio sequence), so a long
    stretch that spans a window does not pile its weight at its middle. Fewer stretches than
    ``size`` give several steps each (a few long stretches still narrow the windows: one
    request of 10^8 tokens is one stretch). Returns (values, weights)."""
    nc = runs.shape[0] if whole else cr.size
    sc = min(nc, size)
    per = size // sc if sc else 1  # steps sampled per stretch: 1 unless the stretches are few
    sg = min(gaps.size, size)
    values = np.empty(sc * per + sg)
    weights = np.empty(sc * per + sg)
    t = 0
    for s in range(sc):
        r, ja, jb = _stretch(runs, whole, cr, ca, cb, s * nc // sc)
        length = jb - ja + 1
        m = min(per, length)
        for q in range(m):
            values[t] = _duration(k, runs, r, ja + int(((s * per + q) * GOLDEN) % 1.0 * length))
            weights[t] = length * run_w(runs, r) * (nc / sc) / m
            t += 1
    for u in range(sg):
        values[t + u] = gaps[u * gaps.size // sg]
        weights[t + u] = gaps.size / sg
    return values[:t + sg], weights[:t + sg]


@inline
def _floor(k, db, grown):
    """A bound below the first duration of a stretch whose last is ``db``, over ``grown``
    contexts' growth (steps after the first x w): a step takes at most ``w * max(t_kv, t_pair)``
    longer than the one before (the memory and the compute side each grow by that much, the
    rest not at all); with room for rounding."""
    return db - grown * max(k[2], k[4]) * (1.0 + 1e-9) - 1e-12 * db


@jit
def _split(k, runs, cr, ca, cb, gaps, lows, highs, below, kr, ka, kb, kept):
    """One pass over the stretches (run ``cr[c]``, steps ``ca[c]..cb[c]``) and the gaps, for
    every window [lows[i], highs[i]]: count into ``below[i]`` the gaps under it and keep into
    row i of kr, ka, kb the stretches reaching into it (``kept[i]`` of them; past the rows' room
    only counted): a copy of the run (in ``runs``' layout) and the part of the stretch inside
    the window. The next narrowing reads those copies in order: reading kept runs where they
    lie, a few percent of them scattered over the record, measured 70-120 ns each.

    A stretch costs one duration, its last step's, and a bound on its first (:func:`_floor`):
    only the few near a window compute more. Counting below is a multiply, not a branch: half
    the stretches are below the median."""
    room = kr.shape[1]
    lowest = smallest(lows)
    for c in range(cr.size):
        r, ja, jb = cr[c], ca[c], cb[c]
        w = run_w(runs, r)
        db = _duration(k, runs, r, jb)
        steps = (jb - ja + 1) * w
        if db < lowest:  # below every window
            for i in range(lows.size):
                below[i] += steps
            continue
        floor = _floor(k, db, (jb - ja) * w)  # <= the first step's duration
        for i in range(lows.size):
            low, high = lows[i], highs[i]
            below[i] += steps * (db < low)
            if db >= low and floor <= high:  # it may reach into the window
                da = _duration(k, runs, r, ja)
                if da > high:
                    continue
                first = ja if da >= low else _first(k, runs, r, ja, jb, da, db, low, False)
                d_first = _duration(k, runs, r, first)
                last = jb if db <= high else _first(k, runs, r, first, jb, d_first, db, high, True) - 1
                below[i] += (first - ja) * w
                if first <= last:
                    t = kept[i]
                    if t < room:
                        run_copy(kr, i, t, runs, r)
                        ka[i, t], kb[i, t] = first, last
                    kept[i] += 1
    for g in gaps:
        for i in range(lows.size):
            below[i] += g < lows[i]


WHOLE_WINDOWS = 3  # windows a pass over every run whole serves at once (ITL's p50, p90 and p99 in one)


@jit
def _split_whole(k, runs, lows, highs, kr):
    """The first pass, over every run whole, for three windows at once (lows[i], highs[i], i < 3):
    :func:`_split` without cutting the stretches to the windows. A run that may reach into
    window i (its last duration at least ``lows[i]``, a bound on its first at most
    ``highs[i]``) is copied whole into row i of ``kr`` (whose last slot is a spare: past the
    slots before it, only counted); only runs wholly below a window count below it. Their
    steps outside the window stay in the narrowing, so its answer is checked to lie in the
    window (see :func:`_select`). Returns (below 0, 1, 2, kept 0, 1, 2). Against
    :func:`_split` on every run (measured 1.1-1.35x for the whole ITL): no searches for a
    window's edges here, counters in registers, and no branch: every run is copied to the next
    free slot, which the next run overwrites unless this one is kept (a kept run is a few
    percent of them, at random: a branch on it was mispredicted often enough to cost a third
    of the pass). A run's durations, most of the pass's work, serve every window (three in
    one pass: measured 0.6x the time of two passes of two)."""
    room = kr.shape[1] - 1
    low0, high0, low1, high1, low2, high2 = lows[0], highs[0], lows[1], highs[1], lows[2], highs[2]
    below0 = below1 = below2 = kept0 = kept1 = kept2 = 0
    for r in range(runs.shape[0]):
        w = run_w(runs, r)
        m = run_m(runs, r)
        db = _duration(k, runs, r, m - 1)
        steps = m * w
        floor = _floor(k, db, (m - 1) * w)
        below0 += steps * (db < low0)
        below1 += steps * (db < low1)
        below2 += steps * (db < low2)
        run_copy(kr, 0, min(kept0, room), runs, r)
        kept0 += (db >= low0) & (floor <= high0)
        run_copy(kr, 1, min(kept1, room), runs, r)
        kept1 += (db >= low1) & (floor <= high1)
        run_copy(kr, 2, min(kept2, room), runs, r)
        kept2 += (db >= low2) & (floor <= high2)
    return below0, below1, below2, kept0, kept1, kept2


@jit
def _listing(k, runs, whole, cr, ca, cb, gaps):
    """Every step of the stretches (with its weight w) and every gap, as (values, weights)."""
    nc = runs.shape[0] if whole else cr.size
    listed = gaps.size
    for c in range(nc):
        _, ja, jb = _stretch(runs, whole, cr, ca, cb, c)
        listed += jb - ja + 1
    values = np.empty(listed)
    weights = np.empty(listed, np.int64)
    t = 0
    for c in range(nc):
        r, ja, jb = _stretch(runs, whole, cr, ca, cb, c)
        w = run_w(runs, r)
        for j in range(ja, jb + 1):
            values[t] = _duration(k, runs, r, j)
            weights[t] = w
            t += 1
    for j in range(gaps.size):  # a loop: an array assigned to a slice costs ~4 s of compiling
        values[t + j] = gaps[j]
        weights[t + j] = 1
    return values, weights


@jit
def _listed_ranks(k, runs, whole, cr, ca, cb, gaps, ranks):
    """The values of 0-based ``ranks`` among every step of the stretches and every gap, listed."""
    values, weights = _listing(k, runs, whole, cr, ca, cb, gaps)
    return _weighted_ranks(values, weights, ranks)


@inline
def bin_of_rank(cum, rank):
    """The bin that holds 0-based ``rank``, given ``cum[b]``, the weight in the bins before bin b
    (``cum[0]`` = 0; one entry more than bins): the last b with cum[b] <= rank."""
    b, above = 0, cum.size
    while above - b > 1:
        mid = (b + above) // 2
        if cum[mid] <= rank:
            b = mid
        else:
            above = mid
    return b


@jit
def _weighted_ranks(values, weights, ranks):
    """The values of 0-based ``ranks`` when each ``values[i]`` counts ``weights[i]`` times. A
    selection, not a sort: one pass bins the weights over equal bins between the extremes (about
    eight values a bin), then a quickselect finds each rank in its bin alone."""
    out = np.empty(ranks.size)
    lo, hi = smallest(values), largest(values)
    if not hi > lo:
        out[:] = lo
        return out
    bins = max(16, values.size // 8)
    scale = bins / (hi - lo)
    where = np.empty(values.size, np.int64)  # each value's bin
    cum = np.zeros(bins + 1, np.int64)  # cum[b]: the weight below bin b
    for i in range(values.size):
        b = min(int((values[i] - lo) * scale), bins - 1)
        where[i] = b
        cum[b + 1] += weights[i]
    for b in range(bins):
        cum[b + 1] += cum[b]
    for t in range(ranks.size):
        b = bin_of_rank(cum, ranks[t])
        inside = np.empty(min(values.size, cum[b + 1] - cum[b]))  # each value weighs at least 1
        inside_w = np.empty(inside.size, np.int64)
        m = np.int64(0)  # not a literal 0, which would compile weighted_select twice
        for i in range(values.size):
            if where[i] == b:
                inside[m] = values[i]
                inside_w[m] = weights[i]
                m += 1
        out[t] = weighted_select(inside, inside_w, m, ranks[t] - cum[b])
    return out


@jit
def weighted_select(values, weights, m, rank):
    """The value of 0-based ``rank`` among ``values[:m]``, each counting ``weights`` times; the
    arrays are reordered. A quickselect with three-way partitions: a run's many equal durations
    end it at once. (Metrics use it too, with unit weights: compiling a sort costs a new user's
    first run more than a second.)"""
    lo, hi = 0, m
    while True:
        a, b, c = values[lo], values[(lo + hi) // 2], values[hi - 1]
        pivot = max(min(a, b), min(max(a, b), c))  # the median of three
        lt, i, gt = lo, lo, hi  # [lo, lt) < pivot, [lt, i) == pivot, [gt, hi) > pivot
        w_lt = w_eq = 0
        while i < gt:
            v = values[i]
            if v < pivot:
                values[i], values[lt] = values[lt], v
                weights[i], weights[lt] = weights[lt], weights[i]
                w_lt += weights[lt]
                lt += 1
                i += 1
            elif v > pivot:
                gt -= 1
                values[i], values[gt] = values[gt], v
                weights[i], weights[gt] = weights[gt], weights[i]
            else:
                w_eq += weights[i]
                i += 1
        if rank < w_lt:
            hi = lt
        elif rank < w_lt + w_eq:
            return pivot
        else:
            rank -= w_lt + w_eq
            lo = gt


def _windows(values: np.ndarray, weights: np.ndarray, fractions: np.ndarray, widen: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
    """Sample values bracketing each weighted fraction, with a margin of four standard errors
    (times ``widen``); infinite where the margin runs off the sample.

    The standard error of the sample's weighted fraction below a value is that of a weighted
    mean of indicators: sqrt(sum of (w_i (1[below] - f))^2) / sum of w_i. Runs weigh their gaps,
    so it is not the textbook sqrt(f (1 - f) / n): near a cliff of the distribution (the 99th
    percentile among the few steps that carry a prefill, above a mass of decode steps) the
    heavy runs all lie on one side and the window can be many times narrower."""
    order = np.argsort(values)  # unstable, 3.8x faster: an edge among ties picks their one value
    values, weights = values[order], weights[order]
    cum = np.cumsum(weights)
    share = weights / cum[-1]
    cum /= cum[-1]
    at = np.minimum(np.searchsorted(cum, fractions), values.size - 1)  # each fraction's sample value
    below = np.arange(values.size)[:, None] <= at[None, :]
    error = np.sqrt(((share[:, None] * (below - fractions[None, :])) ** 2).sum(axis=0))
    margin = (4 * error + 1e-4) * widen
    lo, hi = fractions - margin, fractions + margin
    a = np.minimum(np.searchsorted(cum, lo), values.size - 1)
    b = np.minimum(np.searchsorted(cum, hi), values.size - 1)
    return np.where(lo > 0, values[a], -np.inf), np.where(hi < 1, values[b], np.inf)


def _select(k, runs, cr, ca, cb, gaps, ranks: np.ndarray, count: int, parent: int = -1) -> list[float]:
    """The values of 0-based ``ranks`` among the ``count`` gaps of the stretches (cr, ca..cb:
    run, first and last step; None: every run whole) and ``gaps``; ``parent``: the gaps one
    narrowing before, when that one could cut runs (when this one kept them all, windows stop
    helping: the steps are listed whatever their number)."""
    whole = cr is None
    if whole:
        cr = ca = cb = NONE
    if not whole and (int((cb - ca + 1).sum()) + gaps.size <= LIST_MAX or count == parent):
        return _listed_ranks(k, runs, False, cr, ca, cb, gaps, ranks).tolist()
    values, weights = _sample(k, runs, whole, cr, ca, cb, gaps, SAMPLES)
    widen = np.ones(ranks.size)
    todo = np.arange(ranks.size)
    out = [0.0] * ranks.size
    room = max(1024, runs.shape[0] // 16) if whole else max(1, cr.size)  # a narrowing keeps at most all
    while todo.size:
        lows, highs = _windows(values, weights, ranks[todo] / count, widen[todo])
        below = np.zeros(todo.size, np.int64)
        kept = np.zeros(todo.size, np.int64)
        windows = -(-todo.size // WHOLE_WINDOWS) * WHOLE_WINDOWS if whole else todo.size  # whole: three a pass
        if whole:  # room for as many runs as the sample puts in a window (else a second pass)
            sampled = values[:values.size - min(gaps.size, SAMPLES)]  # the sample's runs; its gaps follow
            share = max(np.count_nonzero((sampled >= lo) & (sampled <= hi)) for lo, hi in zip(lows, highs))
            room = max(room, int(ROOM_MARGIN * share / sampled.size * runs.shape[0]))
        # the kept runs, copied (and the spare slot _split_whole writes to)
        kr = np.empty((windows, room + int(whole)) + runs.shape[1:], runs.dtype)
        ka, kb = (np.empty((todo.size, room), np.int64) for _ in range(2))
        if whole:
            pick = np.arange(windows) % todo.size  # a short last pass repeats windows, into spare rows
            for a in range(0, todo.size, WHOLE_WINDOWS):
                got = _split_whole(k, runs, lows[pick[a:a + WHOLE_WINDOWS]], highs[pick[a:a + WHOLE_WINDOWS]],
                                   kr[a:a + WHOLE_WINDOWS])
                n = min(WHOLE_WINDOWS, todo.size - a)
                below[a:a + n], kept[a:a + n] = got[:n], got[WHOLE_WINDOWS:WHOLE_WINDOWS + n]
            below += np.count_nonzero(gaps[:, None] < lows[None, :], axis=0)
        else:
            _split(k, runs, cr, ca, cb, gaps, lows, highs, below, kr, ka, kb, kept)
        if kept.max() > room:  # more stretches reach into a window than there was room for
            room = int(kept.max())
            continue
        again = []
        for i, t in enumerate(todo):
            inside = gaps[(gaps >= lows[i]) & (gaps <= highs[i])]
            rows = slice(0, kept[i])
            sub, each = kr[i, rows], np.arange(kept[i])  # the kept runs, each a stretch of its own
            if whole:  # kept whole: every step
                ka[i, rows], kb[i, rows] = 0, run_lengths(sub) - 1
            size = _steps(sub, False, each, ka[i, rows], kb[i, rows]) + inside.size
            rank = ranks[t] - below[i]
            found = np.nan
            if 0 <= rank < size:
                if lows[i] == highs[i] and not whole:  # every kept step has that value
                    found = float(lows[i])
                else:
                    # from runs kept whole, the next narrowing is the first that can cut one: it
                    # keeping every step is no sign that windows stop helping
                    found = _select(k, sub, each, ka[i, rows], kb[i, rows], inside, np.array([rank]), size,
                                    -1 if whole else count)[0]
            if lows[i] <= found <= highs[i]:  # runs kept whole: the answer must also lie in the window
                out[t] = found
            else:
                widen[t] *= 4  # the sample misled: widen the window
                again.append(t)
        todo = np.array(again, dtype=np.int64)
    return out


@jit
def listed_quantiles(k, runs, gaps, total, ps):
    """(fits, values): :func:`quantiles` of a small run (a sweep point of a few requests) with
    every gap listed, in one compiled call; ``fits`` is False (and the values NaN) when there
    are more than LIST_MAX of them to list."""
    out = np.full(len(ps), np.nan)
    if total == 0:
        return True, out
    if runs.shape[0] > LIST_MAX:
        return False, out
    steps = 0
    for r in range(runs.shape[0]):
        steps += run_m(runs, r)
    if steps + gaps.size > LIST_MAX:
        return False, out
    ranks = np.empty(len(ps), np.int64)
    for t in range(len(ps)):
        ranks[t] = min(total - 1, int(ps[t] * total))
    none = np.empty(0, np.int64)
    whole = ranks.size > 0  # True as a value: a literal True would compile _listed_ranks a second time
    return True, _listed_ranks(k, runs, whole, none, none, none, gaps, ranks)


def quantiles(k: np.ndarray, runs: np.ndarray, gaps: np.ndarray, total: int, ps: tuple[float, ...]) -> list[float]:
    """The lesson's quantiles of every inter-token gap: ``total`` of them (a request with o tokens
    has o - 1), from the step runs and irregular gaps of a kernel. NaN when there are none."""
    fits, values = listed_quantiles(k, runs, gaps, total, ps)
    if fits:
        return values.tolist()
    ranks = np.array([min(total - 1, int(p * total)) for p in ps], dtype=np.int64)
    return _select(k, runs, None, None, None, gaps, ranks, total)
