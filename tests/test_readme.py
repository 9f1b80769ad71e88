"""The README's promises: its Python example runs and prints what it says; CI runs its test command."""

import contextlib
import io
import re


def python_blocks(text):
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_python_api_example_prints_what_it_says(root, monkeypatch):
    monkeypatch.chdir(root)
    (block,) = [b for b in python_blocks((root / "README.md").read_text()) if "import fastsim" in b]
    expected = [line.split("#", 1)[1].strip() for line in block.splitlines() if line.startswith("print(")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "README.md", "exec"), {})
    assert out.getvalue().splitlines() == expected


def test_ci_runs_the_readme_test_command(root):
    readme = (root / "README.md").read_text()
    commands = re.findall(r"```bash\n(python3 -m pip install .*?)\n```", readme)
    assert commands[0].endswith("fastsim sweep configs/h100.yaml")
    test_command = commands[1]
    assert "pytest" in test_command
    ci = (root / ".ci/run").read_text().strip().splitlines()
    assert ci[-1] == test_command
