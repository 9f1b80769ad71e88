"""Exact inter-token latency quantiles from step runs, against listing every gap and sorting."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastsim.analysis import itl
from fastsim.engine.kernels._calendar import COMPACT_RUN, LOW, record_compact
from fastsim.model.cost import step_time

K_LESSON = np.array([0.0, 4.48e-3, 3.9e-8, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
K_SERVING = np.array([1e-3, 4.0e-3, 4.0e-8, 2.0e-5, 1.0e-9, 1.6e-4, 1.0e-8, 3.0e-6, 1.0e-3, np.log(0.9)])


def brute(k, runs, gaps, ps):
    values = list(gaps)
    for kv, pairs, nw, m, sampled in runs.tolist():
        n_tok, w = nw >> 32, nw & 0xFFFFFFFF
        values += [step_time.py_func(k, n_tok, kv + j * w, pairs + j * w, sampled) for j in range(m) for _ in range(w)]
    values.sort()
    return [values[min(len(values) - 1, int(p * len(values)))] for p in ps]


def make_runs(rows):
    return np.array([[kv, pairs, (n << 32) | w, m, w + (n % 3 == 0)] for kv, pairs, n, w, m in rows],
                    dtype=np.int64).reshape(-1, 5)


def make_compact(rows):
    """The lesson kernels' layout of rows with N = 0 and A = C."""
    assert all(n == 0 and pairs == kv for kv, pairs, n, _, _ in rows)
    return np.array([(kv, (w << 32) | m) for kv, _, _, w, m in rows], dtype=COMPACT_RUN)


def lesson_rows(rows):
    return [(kv, kv, 0, w, m) for kv, _, _, w, m in rows]


def total(runs, gaps):
    return int((runs[:, 3] * (runs[:, 2] & 0xFFFFFFFF)).sum()) + len(gaps)


@settings(max_examples=60)
@given(st.data())
def test_random_runs_match_sorting(data):
    k = data.draw(st.sampled_from([K_LESSON, K_SERVING]))
    rows = data.draw(st.lists(st.tuples(st.integers(0, 200_000), st.integers(0, 200_000), st.integers(0, 300),
                                        st.integers(1, 8), st.integers(1, 40)), min_size=0, max_size=60))
    compact = data.draw(st.booleans())
    gaps = np.array(data.draw(st.lists(st.floats(1e-4, 1.0), max_size=0 if compact else 20)))
    if compact:
        rows = lesson_rows(rows)
    runs = make_runs(rows)
    ps = (0.0, 0.5, 0.9, 0.99, 1.0)
    n = total(runs, gaps)
    got = itl.quantiles(k, make_compact(rows) if compact else runs, gaps, n, ps)
    if n == 0:
        assert all(np.isnan(got))
    else:
        assert got == brute(k, runs, gaps, ps)


@pytest.mark.parametrize("room", [itl.ROOM_MARGIN, 0.0], ids=["room from the sample", "room too small"])
@pytest.mark.parametrize("compact", [False, True], ids=["full", "compact"])
@pytest.mark.parametrize("shape", ["identical", "two values", "one long run", "many long runs"])
def test_large_and_degenerate_distributions(shape, compact, room, monkeypatch):
    """More steps than are ever listed outright, including all-equal and two-valued ones; with
    less room for the kept runs than they need, the pass runs again with enough."""
    monkeypatch.setattr(itl, "ROOM_MARGIN", room)
    if shape == "identical":  # constant arrivals, fixed lengths: every step alike
        rows = [(1000, 1000, 3, 2, 1)] * 50_000
    elif shape == "two values":
        rows = [(1000, 1000, 3, 2, 1), (9000, 9000, 3, 2, 1)] * 30_000
    elif shape == "one long run":
        rows = [(5000, 5000, 4, 4, 200_000)]
    else:
        rng = np.random.default_rng(3)
        rows = [(int(c), int(c), 4, int(w), int(m)) for c, w, m in
                zip(rng.integers(0, 100_000, 3000), rng.integers(1, 9, 3000), rng.integers(1, 200, 3000))]
    if compact:
        rows = lesson_rows(rows)
    runs = make_runs(rows)
    gaps = np.array([]) if compact else np.array([0.01, 0.02])
    for k in (K_LESSON, K_SERVING):
        ps = (0.5, 0.99)
        got = itl.quantiles(k, make_compact(rows) if compact else runs, gaps, total(runs, gaps), ps)
        assert got == brute(k, runs, gaps, ps)


def test_compact_records_extend_runs_and_split_overlong_ones():
    record = record_compact.py_func
    runs = np.zeros(4, COMPACT_RUN)
    count = record(runs, 0, 100, 1, 3)  # one step reading 100 tokens, 3 requests emitting
    count = record(runs, count, 103, 5, 3)  # continues it: 100 + 1 x 3
    assert count == 1 and runs[0].tolist() == (100, (3 << 32) | 6)
    count = record(runs, count, 120, 2, 3)  # does not continue it (121 would)
    count = record(runs, count, 0, 7, 0)  # nobody emits: nothing to record
    assert count == 2 and runs[1].tolist() == (120, (3 << 32) | 2)
    count = record(runs, count, 500, LOW + 10, 2)  # more steps than a row holds: two rows
    assert count == 4 and runs[2].tolist() == (500, (2 << 32) | LOW)
    assert runs[3].tolist() == (500 + 2 * LOW, (2 << 32) | 10)
    assert record(runs, count, 7, 1, 1) == 5  # past the capacity it only counts
