"""The one place that sets Numba flags for fastsim's kernels.

``cache=True`` writes compiled machine code beside the package so later processes (Dask workers
included) load it instead of compiling; ``nogil=True`` lets threads run kernels in parallel.
"""

from __future__ import annotations

import numba

jit = numba.njit(cache=True, nogil=True)

# For small helpers of the kernels: inlined into their callers at Numba's IR level, so their
# arguments and results stay in registers.
inline = numba.njit(cache=True, nogil=True, inline="always")
