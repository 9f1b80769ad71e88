"""The one place that sets Numba flags for fastsim's kernels, and the loops they use instead of
NumPy reductions that cost a new user's first run a second each to compile.

``cache=True`` writes compiled machine code beside the package so later processes (Dask workers
included) load it instead of compiling; ``nogil=True`` lets threads run kernels in parallel.

Numba keys a cached function by its own file's contents only, while a kernel's machine code
holds the helpers it calls from other files: after an edit or a ``git pull`` that changed only a
helper, an editable install would go on loading the old kernel. fastsim's functions are keyed by
the contents of the whole package instead (:class:`_WholePackage`).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import numba
from numba.core import caching, cgutils, types
from numba.extending import intrinsic

PACKAGE = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=4)
def package_stamp(root: Path = PACKAGE) -> str:
    """A hash of every source file under ``root`` (read once a process)."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


class _WholePackage:
    """Mixed into Numba's cache locators: a fastsim function's cached code is valid while no
    source file of the package changed; other functions are left to Numba's own locators."""

    def get_source_stamp(self):
        return package_stamp()

    @classmethod
    def from_function(cls, py_func, py_file):
        if not Path(py_file).resolve().is_relative_to(PACKAGE):
            return None
        return super().from_function(py_func, py_file)


def _keyed_by_package(locator: type) -> type:
    return type(f"WholePackage{locator.__name__}", (_WholePackage, locator), {})


def _numba(name: str):
    """A name of numba.core.caching, public since Numba 0.61 (a leading underscore before)."""
    return getattr(caching, name, None) or getattr(caching, "_" + name)


_numba("CacheImpl")._locator_classes[:0] = [
    _keyed_by_package(_numba(name)) for name in ("UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator")]

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


@intrinsic
def unmanaged(typingctx, array):
    """A view of ``array`` that Numba does not reference-count: every use of an array in compiled
    code (given to a helper that branches or is called apart, taken out of a tuple) costs an
    atomic increment and decrement of its count, measured a call's whole cost (31.6 against 1.9 ns
    a call with five arrays). The view is valid while something else holds ``array``: a caller's
    argument, or a variable of the function used after its last use of the view."""

    def codegen(context, builder, signature, args):
        original = context.make_array(array)(context, builder, value=args[0])
        view = context.make_array(array)(context, builder)
        cgutils.copy_struct(view, original)
        view.meminfo = context.get_constant_null(types.MemInfoPointer(array.dtype))
        return view._getvalue()

    return array(array), codegen
