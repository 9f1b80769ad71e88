"""The README's promise to CI: .ci/run runs exactly its test command (the examples: tests/test_docs.py)."""

import re


def test_ci_runs_the_readme_test_command(root):
    readme = (root / "README.md").read_text()
    commands = re.findall(r"```bash\n(python3 -m pip install .*?)\n```", readme)
    assert commands[0].endswith("fastsim sweep configs/h100.yaml")
    test_command = commands[1]
    assert "pytest" in test_command
    ci = (root / ".ci/run").read_text().strip().splitlines()
    assert ci[-1] == test_command
