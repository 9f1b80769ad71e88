"""Exact inter-token latency quantiles from a run's step runs, without one value per token.

Every gap between consecutive tokens of a request is either the duration of the step that
emitted the later token (the request also emitted in the step before) or, for a request that
skipped steps, an irregular gap the kernel recorded. The kernels record runs of steps (see
:mod:`fastsim.engine.kernels._calendar`) whose durations are recomputed exactly from the step-time
formula: within a run they never decrease, so a run's steps in any value range form one
contiguous stretch, found by bisection.

Selection: a sample of the runs brackets each wanted rank in a narrow window of values; one
pass over the runs counts the gaps below the window (a run wholly below or above it costs two
step-time evaluations, one reaching into it a short search) and keeps the few runs inside,
among which sampled windows narrow further until a few thousand steps are listed and selected
by weight. The work follows the number of runs, not of tokens. Quantiles use the lesson's rule
(the sorted value at floor(p n)).
"""

from __future__ import annotations

import numpy as np

from .._jit import inline, jit
from ..engine.kernels._calendar import run_lengths, run_m, run_step, run_w
from ..model.cost import step_time

BINS = 4096
SMALL = 256  # values sorted outright
SAMPLES = 1 << 14  # runs (and gaps) sampled to bracket each rank
LIST_MAX = 1 << 15  # steps listed and selected outright


@inline
def _duration(k, runs, r, j):
    """Duration of step ``j`` of run ``r`` (the same operations as the kernel's)."""
    n_tokens, kv_tokens, pairs = run_step(runs, r, j)
    return step_time(k, n_tokens, kv_tokens, pairs)


@inline
def _first(k, runs, r, ja, jb, da, db, bound, strict):
    """First step in [ja, jb] of run ``r`` whose duration is >= ``bound`` (> if ``strict``);
    jb + 1 if none. ``da`` and ``db`` are the durations at ja and jb. Durations never decrease
    within a run and grow almost linearly, so the search starts where a straight line between
    the ends meets the bound and gallops from there (two or three evaluations, mostly)."""
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
def _clip(k, runs, r, ja, jb, da, db, low, high):
    """The steps of run ``r`` in [ja, jb] (durations da, db at the ends) whose durations lie in
    [low, high]: returns (first, last), last < first when none, and the steps below ``low`` are
    ja..first-1."""
    first, d_first = ja, da
    if da < low:
        first = _first(k, runs, r, ja, jb, da, db, low, False)
        d_first = _duration(k, runs, r, first) if first <= jb else db
    last = jb if db <= high else _first(k, runs, r, first, jb, d_first, db, high, True) - 1
    return first, last


@jit
def _weighted_select(values, weights, rank):
    """The value of 0-based ``rank`` when each ``values[i]`` counts ``weights[i]`` times."""
    while True:
        n = values.size
        lo = values.min()
        hi = values.max()
        if lo == hi:
            return lo
        if n <= SMALL:
            order = np.argsort(values)
            acc = 0
            for t in order:
                acc += weights[t]
                if acc > rank:
                    return values[t]
            return values[order[-1]]
        nb = min(BINS, n // 4)  # about four values a bin
        scale = nb / (hi - lo)
        hist = np.zeros(nb, np.int64)
        bins = np.empty(n, np.int64)
        for t in range(n):
            bins[t] = min(int((values[t] - lo) * scale), nb - 1)
            hist[bins[t]] += weights[t]
        target = 0
        while hist[target] <= rank:
            rank -= hist[target]
            target += 1
        keep = bins == target
        values = values[keep]
        weights = weights[keep]


@inline
def _in_window(k, runs, r, ja, jb, low, high):
    """Steps ja..jb of run ``r`` against the value window [low, high]: returns (steps below it,
    first, last), last < first when none of them is inside."""
    da = _duration(k, runs, r, ja)
    if da > high:
        return 0, 1, 0
    db = _duration(k, runs, r, jb)
    if db < low:
        return jb - ja + 1, 1, 0
    first, last = _clip(k, runs, r, ja, jb, da, db, low, high)
    return first - ja, first, last


@jit
def _sorted_sample(values, weights):
    """A weighted sample sorted by value, its cumulative weight fractions, and one over the
    square root of its effective size (Kish)."""
    spread = np.sqrt((weights**2).sum()) / weights.sum()
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    return values[order], cum / cum[-1], spread


@jit
def _bracket(values, cum, f, margin):
    """Sample values bracketing the weighted fraction ``f``, ``margin`` either side (infinite
    where the margin runs off the sample)."""
    a = np.searchsorted(cum, f - margin)
    b = np.searchsorted(cum, f + margin)
    low = values[a] if f - margin > 0 and a < values.size else -np.inf
    high = values[b] if f + margin < 1 and b < values.size else np.inf
    return low, high


@jit
def _list(k, runs, cr, ca, cb, gvals):
    """Every step ca..cb of runs cr (with its weight) and every gap value, as (values, weights)."""
    listed = gvals.size
    for c in range(cr.size):
        listed += cb[c] - ca[c] + 1
    vals = np.empty(listed)
    wts = np.empty(listed, np.int64)
    t = 0
    for c in range(cr.size):
        r = cr[c]
        for j in range(ca[c], cb[c] + 1):
            vals[t] = _duration(k, runs, r, j)
            wts[t] = run_w(runs, r)
            t += 1
    vals[t:] = gvals
    wts[t:] = 1
    return vals, wts


@jit
def _refine(k, runs, cr, ca, cb, gvals, rank):
    """The value of 0-based ``rank`` among steps ca..cb of runs cr (each counted w times) and the
    gap values ``gvals``: narrow by sampled windows until few steps remain, then list them."""
    before = -1  # steps listed before the last narrowing
    while True:
        nc = cr.size
        listed = gvals.size
        for c in range(nc):
            listed += cb[c] - ca[c] + 1
        if listed <= LIST_MAX or listed == before:  # few enough, or narrowing stopped helping
            vals, wts = _list(k, runs, cr, ca, cb, gvals)
            return _weighted_select(vals, wts, rank)
        # a sample of the candidates: each stands for its steps at its middle step's value
        sc = min(nc, SAMPLES)
        sg = min(gvals.size, SAMPLES)
        values = np.empty(sc + sg)
        weights = np.empty(sc + sg)
        for t in range(sc):
            c = t * nc // sc
            values[t] = _duration(k, runs, cr[c], (ca[c] + cb[c]) // 2)
            weights[t] = (cb[c] - ca[c] + 1) * run_w(runs, cr[c]) * (nc / sc)
        for t in range(sg):
            values[sc + t] = gvals[t * gvals.size // sg]
            weights[sc + t] = gvals.size / sg
        values, cum, spread = _sorted_sample(values, weights)
        count = gvals.size
        for c in range(nc):
            count += (cb[c] - ca[c] + 1) * run_w(runs, cr[c])
        f = rank / count
        margin = 4 * np.sqrt(f * (1 - f)) * spread + 1e-4
        na = np.empty(nc, np.int64)
        nb = np.empty(nc, np.int64)
        nrun = np.empty(nc, np.int64)
        while True:
            low, high = _bracket(values, cum, f, margin)
            below = 0
            inside = 0
            keep = 0
            for c in range(nc):
                r = cr[c]
                w = run_w(runs, r)
                steps_below, ja, jb = _in_window(k, runs, r, ca[c], cb[c], low, high)
                below += steps_below * w
                if ja <= jb:
                    nrun[keep] = r
                    na[keep] = ja
                    nb[keep] = jb
                    keep += 1
                    inside += (jb - ja + 1) * w
            gin = (gvals >= low) & (gvals <= high)
            below += (gvals < low).sum()
            inside += gin.sum()
            if below <= rank < below + inside:
                break
            margin *= 4  # the sample misled: widen the window
        if low == high:  # every step in the window has this one value
            return low
        before = listed
        cr, ca, cb = nrun[:keep], na[:keep], nb[:keep]
        gvals = gvals[gin]
        rank -= below


@jit
def _sample(k, runs, gaps):
    """:func:`_sorted_sample` of every (nr/S)-th run, standing for its m x w gaps at its middle
    step's value, and every (ng/S)-th irregular gap."""
    nr = runs.shape[0]
    ng = gaps.size
    sr = min(nr, SAMPLES)
    sg = min(ng, SAMPLES)
    values = np.empty(sr + sg)
    weights = np.empty(sr + sg)
    for t in range(sr):
        r = t * nr // sr
        values[t] = _duration(k, runs, r, run_m(runs, r) // 2)
        weights[t] = run_m(runs, r) * run_w(runs, r) * (nr / sr)
    for t in range(sg):
        values[sr + t] = gaps[t * ng // sg]
        weights[sr + t] = ng / sg
    return _sorted_sample(values, weights)


@jit
def _select(k, runs, gaps, rank, total, values, cum, spread):
    """The value of 0-based ``rank`` among the ``total`` inter-token gaps.

    The sample (:func:`_sample`) brackets the rank in a narrow window of values, with a margin of
    four standard errors; one pass over every run counts the gaps below the window and finds the
    runs that reach into it; :func:`_refine` finishes among those. Should the window miss the
    rank, its margin grows fourfold and the pass runs again. (This first pass is
    :func:`_refine`'s over every run, without materialising candidate arrays for all of them.)
    """
    nr = runs.shape[0]
    f = rank / total
    margin = 4 * np.sqrt(f * (1 - f)) * spread + 1e-4
    room = nr // 4 + 1024  # a window reaches into a few per cent of the runs
    while True:
        low, high = _bracket(values, cum, f, margin)
        cr = np.empty(room, np.int64)
        ca = np.empty(room, np.int64)
        cb = np.empty(room, np.int64)
        below = 0
        inside = 0
        keep = 0
        for r in range(nr):  # _in_window written out: most runs miss the window, and skipping
            last = run_m(runs, r) - 1  # them at once makes this pass ~30 % faster (measured)
            w = run_w(runs, r)
            da = _duration(k, runs, r, 0)
            if da > high:
                continue
            db = _duration(k, runs, r, last)
            if db < low:
                below += (last + 1) * w
                continue
            ja, jb = _clip(k, runs, r, 0, last, da, db, low, high)
            below += ja * w
            if ja <= jb:
                if keep < room:
                    cr[keep] = r
                    ca[keep] = ja
                    cb[keep] = jb
                keep += 1
                inside += (jb - ja + 1) * w
        gin = (gaps >= low) & (gaps <= high)
        below += (gaps < low).sum()
        inside += gin.sum()
        if keep > room:  # more runs reach into the window than there was room for
            room = keep
        elif below <= rank < below + inside:
            return _refine(k, runs, cr[:keep], ca[:keep], cb[:keep], gaps[gin], rank - below)
        else:
            margin *= 4  # the sample misled: widen the window


def quantiles(k: np.ndarray, runs: np.ndarray, gaps: np.ndarray, total: int, ps: tuple[float, ...]) -> list[float]:
    """The lesson's quantiles of every inter-token gap: ``total`` of them (a request with o tokens
    has o - 1), from the step runs and irregular gaps of a kernel. NaN when there are none."""
    if total == 0:
        return [float("nan")] * len(ps)
    ranks = [min(total - 1, int(p * total)) for p in ps]
    lengths = run_lengths(runs)
    if int(lengths.sum()) + gaps.size <= LIST_MAX:  # a small run: list every gap, no sampling
        vals, wts = _list(k, runs, np.arange(len(runs)), np.zeros(len(runs), np.int64), lengths - 1, gaps)
        return [float(_weighted_select(vals, wts, rank)) for rank in ranks]
    values, cum, spread = _sample(k, runs, gaps)
    return [float(_select(k, runs, gaps, rank, total, values, cum, spread)) for rank in ranks]
