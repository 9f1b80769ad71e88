"""The one place that sets Numba flags for fastsim's kernels, and the loops they use instead of
NumPy reductions that cost a new user's first run a second each to compile.

``cache=True`` writes compiled machine code beside the package so later processes (Dask workers
included) load it instead of compiling; ``nogil=True`` lets threads run kernels in parallel.
"""

from __future__ import annotations

import numba

jit = numba.njit(cache=True, nogil=True)

# For small helpers of the kernels: inlined into their callers at Numba's IR level, so their
# arguments and results stay in registers.
inline = numba.njit(cache=True, nogil=True, inline="always")


@inline
def largest(a):
    """``a.max()`` of an array without NaN (0 when empty), as a loop: Numba's max compiles in
    about a second, which a new user's first run pays."""
    m = a[0] if a.size else 0
    for v in a:
        m = max(m, v)
    return m


@inline
def smallest(a):
    """``a.min()`` likewise."""
    m = a[0] if a.size else 0
    for v in a:
        m = min(m, v)
    return m
