"""Every module imports on its own, and every third-party import is declared in pyproject.toml.

A dependency installed by hand where the tests run (and nowhere declared) passes every other test
and fails every user: this test reads the imports from the sources, so it fails as soon as a
declaration is missing, whatever this machine has installed.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import pkgutil
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import fastsim

ROOT = Path(__file__).resolve().parents[1]
MADE_BY_TESTS = {"elsewhere"}  # a module tests/test_jit.py writes and imports


def _name(requirement: str) -> tuple[str, list[str]]:
    """``'dask[distributed]>=2024.1'`` -> ``('dask', ['distributed'])``, names normalised."""
    m = re.match(r"\s*([A-Za-z0-9._-]+)\s*(?:\[([^\]]*)\])?", requirement)
    extras = [e.strip() for e in (m.group(2) or "").split(",") if e.strip()]
    return _normal(m.group(1)), extras


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared(groups: list[str]) -> set[str]:
    """The distributions pyproject.toml declares in ``dependencies`` and the named extras,
    with the distributions that a declared extra of theirs brings (``dask[distributed]``)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for group in groups:
        requirements += project["optional-dependencies"][group]
    names = set()
    for requirement in requirements:
        name, extras = _name(requirement)
        names.add(name)
        brought = (importlib.metadata.requires(name) or []) if extras else []
        for line in brought:
            marker = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", line)
            if marker and marker.group(1) in extras:
                names.add(_name(line)[0])
    return names


def _third_party_imports(folder: Path) -> dict[str, str]:
    """Top-level module -> a file that imports it, for every absolute import under ``folder``
    that is neither the standard library nor fastsim (or the tests) itself."""
    found: dict[str, str] = {}
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top not in sys.stdlib_module_names and top not in {"fastsim", "tests", *MADE_BY_TESTS}:
                    found.setdefault(top, str(path.relative_to(folder.parent)))
    return found


def _distributions(module: str) -> set[str]:
    """The distributions that provide ``module`` (its own name when none is installed)."""
    return {_normal(d) for d in importlib.metadata.packages_distributions().get(module, [module])}


@pytest.mark.parametrize("folder, groups", [("fastsim", ["plot"]), ("tests", ["test"])])
def test_every_third_party_import_is_declared(folder, groups):
    declared = _declared(groups)
    missing = {module: where for module, where in _third_party_imports(ROOT / folder).items()
               if not _distributions(module) & declared}
    assert not missing, f"imported but not declared in pyproject.toml ({', '.join(groups)}): {missing}"


def test_the_check_sees_a_missing_declaration(tmp_path, monkeypatch):
    """Dropping scipy from the declared dependencies is caught (calibrate imports it)."""
    text = (ROOT / "pyproject.toml").read_text()
    assert '"scipy' in text
    fake = tmp_path / "pyproject.toml"
    fake.write_text(re.sub(r'\n\s*"scipy[^"]*",', "", text))
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    imports = _third_party_imports(Path(fastsim.__file__).parent)
    assert "scipy" in imports and not _distributions("scipy") & _declared(["plot"])


def _modules() -> list[str]:
    return [m.name for m in pkgutil.walk_packages(fastsim.__path__, "fastsim.") if m.name != "fastsim.__main__"]


@pytest.mark.parametrize("module", _modules())
def test_every_module_imports(module):
    importlib.import_module(module)


def test_the_package_imports_without_posix_modules():
    """As on Windows: no ``fcntl`` (file locks; memory is psutil's on every platform)."""
    code = ("import sys, importlib; sys.modules['fcntl'] = None\n"
            f"for m in {_modules()!r}: importlib.import_module(m)\n"
            "from fastsim.sweep import files, memory\n"
            "assert files.fcntl is None and memory.available_bytes() > 0\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
