"""Numba's on-disk cache of fastsim's kernels is keyed by the whole package's sources: a kernel
whose helper changed in another file is compiled again, not loaded stale."""

import shutil

from numba.core import caching

from fastsim import _jit
from fastsim.engine.kernels import one_engine


def locator_of(dispatcher):
    return dispatcher._cache._impl.locator


def test_a_kernel_is_cached_under_the_package_stamp():
    locator = locator_of(one_engine.serving_continuous)
    assert isinstance(locator, _jit._WholePackage)
    assert locator.get_source_stamp() == _jit.package_stamp()


def test_the_stamp_changes_with_any_source_file(tmp_path):
    copy = tmp_path / "fastsim"
    shutil.copytree(_jit.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = _jit.package_stamp(copy)
    helper = copy / "engine" / "kernels" / "_bare.py"
    helper.write_text(helper.read_text() + "# a helper changed, not the kernel's own file\n")
    _jit.package_stamp.cache_clear()
    assert _jit.package_stamp(copy) != before


def test_functions_outside_the_package_keep_numbas_locators(tmp_path, monkeypatch):
    module = tmp_path / "elsewhere.py"
    module.write_text("import numba\n\n@numba.njit(cache=True)\ndef f(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import elsewhere

    assert elsewhere.f(1) == 2
    assert not isinstance(locator_of(elsewhere.f), _jit._WholePackage)
    assert isinstance(locator_of(elsewhere.f), caching._CacheLocator)
