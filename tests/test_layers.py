"""The package's one-way layers: an import only goes down, and the command line goes through the
Python API alone."""

import ast

import pytest

from .conftest import ROOT

PACKAGE = ROOT / "fastsim"
# Bottom to top; a module may import its own layer and those below it.
LAYERS = [("_version", "_jit"), ("model", "_atomic"), ("engine",), ("analysis",), ("sweep",), ("bench",), ("api",),
          ("cli", "__main__", "__init__")]
RANK = {name: k for k, names in enumerate(LAYERS) for name in names}


def imports(path):
    """The top-level part of the package each ``from``-import of ``path`` names."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = list(parts[: len(parts) - node.level])  # the package the dots lead to
            target = base + (node.module.split(".") if node.module else [a.name for a in node.names][:1])
            yield target[0] if target else "__init__"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fastsim."):
            yield node.module.split(".")[1]


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_only_go_down(path):
    here = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
    up = [name for name in imports(path) if RANK[name] > RANK[here]]
    assert not up, f"{path.name} imports up a layer: {up}"


def test_the_command_line_goes_through_the_api_only():
    for path in (PACKAGE / "cli").glob("*.py"):
        assert set(imports(path)) <= {"api", "cli"}, path.name


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_is_too_long(path):
    assert len(path.read_text().splitlines()) <= 460, f"{path.name}: split it along its concepts"
