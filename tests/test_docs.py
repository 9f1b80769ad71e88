"""The README and the docs site keep their promises: every command they show runs and prints
what they show, the configuration reference is the schema's, the Python examples print what
they say, and no page points outside the repository."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import unicodedata
from pathlib import Path

import pytest
from typer.testing import CliRunner

import fastsim
from fastsim.cli import app
from fastsim.model.keys import reference_markdown

from .conftest import ROOT

PAGES = sorted((ROOT / "docs").rglob("*.md"))
TEXTS = [ROOT / "README.md", *PAGES]
WRITES = {"sweep", "capacity", "plan", "calibrate"}  # commands that write results/ unless given --out


def console_blocks(path: Path) -> list[tuple[str, list[str]]]:
    """(command, the output lines shown) of every ```console block; '...' stands for lines left out."""
    blocks = []
    for block in re.findall(r"```console\n(.*?)```", path.read_text(), re.S):
        first, *shown = block.rstrip("\n").splitlines()
        assert first.startswith("$ fastsim "), f"{path.name}: a console block starts with '$ fastsim ...'"
        blocks.append((first[2:], [line.rstrip() for line in shown if line.strip() != "..."]))
    return blocks


SHOWN = [(path, command, lines) for path in TEXTS for command, lines in console_blocks(path)]
_printed: dict[str, list[str]] = {}  # command -> its stdout lines: a command shown on several pages runs once


def printed(command: str, tmp_path: Path) -> list[str]:
    if command not in _printed:
        args = shlex.split(command)[1:]
        if args[0] in WRITES and "--out" not in args:
            args += ["--out", str(tmp_path / "out.nc")]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        _printed[command] = [line.rstrip() for line in result.stdout.splitlines()]
    return _printed[command]


@pytest.mark.parametrize("path, command, shown", SHOWN,
                         ids=[f"{p.relative_to(ROOT)}:{c.split()[1]}:{i}" for i, (p, c, _) in enumerate(SHOWN)])
def test_a_shown_command_prints_what_is_shown(monkeypatch, tmp_path, path, command, shown):
    monkeypatch.chdir(ROOT)
    out = printed(command, tmp_path)
    missing = [line for line in shown if line not in out]
    assert not missing, missing  # a page may leave lines out, and shows each of the others exactly


def test_every_page_shows_runnable_commands():
    assert len(SHOWN) >= 10 and {p.name for p, _, _ in SHOWN} >= {"README.md", "walkthrough.md", "planning.md"}


def test_the_configuration_reference_is_the_schemas():
    assert (ROOT / "docs/configuration.md").read_text() == reference_markdown()  # regenerate: fastsim keys --markdown


@pytest.mark.parametrize("path", [ROOT / "README.md", ROOT / "docs/api.md"], ids=["README", "api"])
def test_a_python_example_prints_what_it_says(monkeypatch, path):
    monkeypatch.chdir(ROOT)
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", path.read_text(), re.S) if "import fastsim" in b]
    expected = [line.split("#", 1)[1].strip() for line in block.splitlines() if line.startswith("print(")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, str(path), "exec"), {})
    assert out.getvalue().splitlines() == expected


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_points_outside_the_repository(path):
    text = path.read_text()
    assert "DESIGN.md" not in text and "shared folder" not in text
    for target in re.findall(r"\]\(([^)#\s]+)", text):  # relative links resolve inside the repository
        if "://" in target:
            continue
        resolved = (path.parent / target).resolve()
        assert resolved.is_relative_to(ROOT) and resolved.exists(), target


def _anchors(page: Path) -> set[str]:
    """The anchors MkDocs gives a page's headings (the toc extension's slugs: ASCII word
    characters, spaces and hyphens kept, lower case, runs of spaces and hyphens one hyphen)."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    titles = (unicodedata.normalize("NFKD", re.sub(r"[`*]", "", t)).encode("ascii", "ignore").decode()
              for t in re.findall(r"^#+ (.+)$", text, re.M))
    return {re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", t).strip().lower()) for t in titles}


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_to_a_section_finds_it(path):
    """A link ``page.md#section`` names a heading of that page (mkdocs --strict checks the site
    too; this says which link on which page)."""
    for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", path.read_text()):
        page = (path.parent / target).resolve() if target else path
        assert anchor in _anchors(page), f"{target}#{anchor}"


def test_the_h100_load_table_is_the_sweep():
    """docs/validation.md's table of configs/h100.yaml at 256 sequences and budget 8192."""
    text = (ROOT / "docs/validation.md").read_text()
    block = re.search(r"```text\n(.*?)```", text[text.index("`configs/h100.yaml` (256 sequences"):], re.S)
    shown = block.group(1).rstrip("\n").splitlines()
    ds = fastsim.sweep(fastsim.load_config(ROOT / "configs/h100.yaml"), workers=1)
    ds = ds.sel(max_batch=256, max_batched_tokens=8192)

    def ms_or_s(x):
        return f"{x:.1f} s" if x >= 10 else f"{round(x * 1e3)} ms"

    for line in shown[1:]:
        rate = int(line.split()[0])
        p = ds.sel(rate=rate)
        want = (f"{rate:7d} {round(float(p.throughput_tok_s)):7d} {ms_or_s(float(p.ttft_p50_s)):>9} "
                f"{ms_or_s(float(p.ttft_p99_s)):>9} {float(p.e2e_p50_s):6.2f} s "
                f"{round(float(p.itl_p99_s) * 1e3):5d} ms {round(float(p.kv_peak_use) * 100):6d} %")
        assert line == want
