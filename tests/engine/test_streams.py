"""fastsim's fast child streams are NumPy's own: the same Generator state, so the same draws."""

import threading

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from fastsim.engine.streams import stream


def numpy_child(seed: int, child: int) -> np.random.Generator:
    """The child stream as NumPy spawns it."""
    return np.random.default_rng(np.random.SeedSequence(seed).spawn(child + 1)[child])


@given(st.one_of(st.integers(0, 2**32 + 5), st.integers(0, 2**130)), st.integers(0, 6))
def test_a_child_stream_is_numpys(seed, child):
    ours = stream(seed, child).bit_generator.state
    theirs = numpy_child(seed, child).bit_generator.state
    assert ours == theirs
    assert (stream(seed, child).standard_normal(7) == numpy_child(seed, child).standard_normal(7)).all()


def test_word_boundaries_and_spawn_keys_beyond_32_bits():
    for seed in (0, 1, 2**32 - 1, 2**32, 2**64 - 1, 2**64, 2**96 + 3, 2**128):
        for child in (0, 3, 2**32, 2**40 + 1):
            ref = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(child,)))
            assert stream(seed, child).bit_generator.state == ref.bit_generator.state


def test_each_thread_has_its_own_generator():
    seen = {}

    def draw(name):
        seen[name] = stream(11, 1)

    threads = [threading.Thread(target=draw, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen[0] is not seen[1]
