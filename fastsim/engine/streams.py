"""NumPy random streams of a seed, made in microseconds.

``numpy.random.default_rng(SeedSequence(seed, spawn_key=(i,)))`` costs ~25 us, most of it in
SeedSequence's hashing (pure integer arithmetic, done one word at a time) and the objects
around it: on a sweep of 100-request points that was a fifth of each point. :func:`stream`
gives a Generator in exactly the same state: the hash runs compiled (NumPy's documented
algorithm: entropy words, pool of 4, then the state words), PCG64 is seeded from it as NumPy
seeds it, and the state is set on a Generator this thread keeps (so each stream is valid until
the next :func:`stream` call on the same thread). tests/engine/test_streams.py checks the states
against NumPy's own for many seeds and keys.
"""

from __future__ import annotations

import threading

import numpy as np

from .._jit import inline, jit

POOL_SIZE = 4  # SeedSequence's default pool of 32-bit words
M32 = 0xFFFFFFFF
PCG_MULT = 0x2360ED051FC65DA44385DF649FCCF645
M128 = (1 << 128) - 1
INIT_A, MULT_A, INIT_B, MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED  # SeedSequence's constants
MIX_L, MIX_R = 0xCA01F9DD, 0x4973F715

_local = threading.local()  # each thread's Generator


@inline
def _hash(value, h, mult):
    """SeedSequence's hash of a word with multiplier ``h`` (all mod 2**32): (hash, next h)."""
    value ^= h
    h = (h * mult) & M32
    value = (value * h) & M32
    return value ^ (value >> 16), h


@inline
def _mix(x, y):
    r = (MIX_L * x - MIX_R * y) & M32
    return r ^ (r >> 16)


@jit
def _state_words(entropy):
    """SeedSequence(entropy words: a tuple).generate_state(4, uint64) as 8 little-endian uint32
    words (a tuple: nothing to box)."""
    pool = np.zeros(POOL_SIZE, np.int64)
    h = INIT_A
    for i in range(POOL_SIZE):
        pool[i], h = _hash(entropy[i] if i < len(entropy) else 0, h, MULT_A)
    for src in range(POOL_SIZE):  # every word mixed into every other
        for dst in range(POOL_SIZE):
            if src != dst:
                v, h = _hash(pool[src], h, MULT_A)
                pool[dst] = _mix(pool[dst], v)
    for src in range(POOL_SIZE, len(entropy)):  # then the words beyond the pool (the spawn key)
        for dst in range(POOL_SIZE):
            v, h = _hash(entropy[src], h, MULT_A)
            pool[dst] = _mix(pool[dst], v)
    out = np.empty(8, np.int64)
    h = INIT_B
    for i in range(8):
        out[i], h = _hash(pool[i % POOL_SIZE], h, MULT_B)
    return out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7]


def _words(x: int) -> list[int]:
    """An integer as SeedSequence takes it: 32-bit words, least significant first ([0] for 0)."""
    words = []
    while True:
        words.append(x & M32)
        x >>= 32
        if not x:
            return words


def stream(seed: int, child: int) -> np.random.Generator:
    """The Generator of ``default_rng(SeedSequence(seed).spawn(child + 1)[child])``: the
    ``child``-th child stream of ``seed``. Valid until this thread's next call."""
    entropy = _words(seed)
    entropy += [0] * (POOL_SIZE - len(entropy)) + _words(child)  # a spawn key pads the entropy to the pool
    w = _state_words(tuple(entropy))
    seed128 = (w[1] << 96) | (w[0] << 64) | (w[3] << 32) | w[2]  # uint64 words 0, 1 (high, low)
    inc = (((w[5] << 96) | (w[4] << 64) | (w[7] << 32) | w[6]) << 1 | 1) & M128
    state = ((inc + seed128) * PCG_MULT + inc) & M128  # NumPy's pcg64_srandom_r: 0, step (= inc), + seed, step
    if not hasattr(_local, "generator"):
        _local.bits = np.random.PCG64(0)
        _local.generator = np.random.Generator(_local.bits)
    _local.bits.state = {"bit_generator": "PCG64", "state": {"state": state, "inc": inc}, "has_uint32": 0,
                         "uinteger": 0}
    return _local.generator
