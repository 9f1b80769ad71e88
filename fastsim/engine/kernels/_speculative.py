"""Speculative decoding in the serving loop (:mod:`.serve`; docs/model/deployed.md, "Speculative
decoding"): the acceptance draws and a step's verifications.

A decoding request's verification after it has emitted ``g`` tokens accepts the draft's
positions 1, 2, ... while each position's draw is below its acceptance: the draw of position j is
a hash of (the run's seed, the request, g, j), 53 bits compared with the position's threshold,
floor(acceptance x 2^53) (:func:`thresholds`). A request's draws depend on nothing else (not on
the step, the batch or the replica), so settings that change how requests are batched keep them
(common random numbers), and the oracle reproduces them in plain Python. Under speculation no
decoder is filed in the completion calendar: each step's verifications walk the decoders and
name those that finish.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..._jit import inline, jit, unmanaged
from ._running import cdiv

MASK = (1 << 64) - 1
_I, _G, _J = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xD1B54A32D192ED03), np.uint64(0x8CB92BA72F3D8DD7)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)


class Spec(NamedTuple):
    """Speculative decoding as the loop takes it: ``tokens`` proposed per step (0: off), the KV
    slots a decoder holds beyond its computed tokens (``span``), each position's threshold
    (int64 (tokens,)), the run's seed, its counts (int64 (tokens + 1,): the verifications that
    accepted 0, 1, ..., tokens of the draft's: filled) and each request's place in the run's
    traffic, which keys its draws (empty: its index here; a decode pool's are reordered)."""

    tokens: int
    span: int
    accept: np.ndarray
    seed: int
    counts: np.ndarray
    ids: np.ndarray


NO_IDS = np.zeros(0, np.int64)
OFF = Spec(0, 0, np.zeros(0, np.int64), 0, np.zeros(1, np.int64), NO_IDS)


def thresholds(per_position: list[float]) -> np.ndarray:
    """Each position's threshold for a draw's 53 bits (1.0: every draw below it)."""
    return np.array([int(p * 2.0**53) for p in per_position], np.int64)


def seed_of(workload_seed: int) -> int:
    """The run's seed for acceptance draws, from the workload's (as a signed 64-bit integer)."""
    z = mix((workload_seed * 0x2545F4914F6CDD1D + 0x5EC) & MASK)
    return z - (1 << 64) if z >= 1 << 63 else z


def mix(z: int) -> int:
    """splitmix64's finaliser, in Python integers (what :func:`draw_at` computes)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def draw_py(seed: int, i: int, g: int, j: int) -> int:
    """A draw (:func:`draw_at`) in plain Python."""
    return mix((seed + i * 0x9E3779B97F4A7C15 + g * 0xD1B54A32D192ED03 + j * 0x8CB92BA72F3D8DD7) & MASK) >> 11


@inline
def draw_at(base, j):
    """53 uniform bits for position ``j`` (from 0) of a verification whose ``base`` is seed + i x I
    + g x G (as uint64: request ``i`` after ``g`` tokens; :func:`draw_py` whole)."""
    z = base + np.uint64(j) * _J
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return np.int64((z ^ (z >> _S31)) >> _S11)


@jit
def verify(spec, rhead, n_dec, rnext, prompt, output, g, dbase, held, pending, steps, dues, bt, per):
    """The step just run (now ``steps``) verified the drafts of the ``n_dec`` decoders, the first
    of the running list from ``rhead``: each emits 1 + its accepted tokens, no more than its
    output has left, and is brought up to date (``g``, ``dbase``). Those that finish are listed in
    ``dues``, in running order; the others' slots for the next step are counted: each will hold
    ``held`` blocks (beyond ``per``), ``pending`` of them not taken yet. Returns (how many finish,
    tokens emitted, blocks the next step takes)."""
    accept, counts, ids = unmanaged(spec.accept), unmanaged(spec.counts), unmanaged(spec.ids)  # (out of the tuple
    k, seed, span = spec.tokens, spec.seed, spec.span  # once: not counted at each use)
    i = rhead
    ndue = emitted = need = 0
    for _ in range(n_dec):
        gi = g[i]
        base = np.uint64(seed) + np.uint64(ids[i] if ids.size else i) * _I + np.uint64(gi) * _G
        a = 0
        alive = 1  # (branch-free: every position drawn, the first rejection ends the run)
        for j in range(k):
            alive = alive if draw_at(base, j) < accept[j] else 0
            a += alive
        counts[a] += 1
        e = min(1 + a, output[i] - gi)
        gi += e
        g[i] = gi
        dbase[i] = steps
        emitted += e
        if gi == output[i]:
            dues[ndue] = i
            ndue += 1
        else:  # its slots beyond the blocks it holds: whole blocks more (a division only then)
            over = prompt[i] + gi - 1 + span - (held[i] + per) * bt
            add = cdiv(over, bt) if over > 0 else 0
            pending[i] = add
            held[i] += add
            need += add
        i = rnext[i]
    return ndue, emitted, need


@inline
def first_slots(spec, c_i, held, pending, i, bt, per):
    """A request that became a decoder with ``c_i`` tokens computed, holding ``held[i]`` blocks:
    the blocks its first verification's slots take (pending); returns how many."""
    pending[i] = max(cdiv(c_i + spec.span, bt) - per - held[i], 0)
    held[i] += pending[i]
    return pending[i]
