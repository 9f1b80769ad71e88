"""The README's tables are what the commands it names print today: a change that moves a figure
must move the README with it."""

import re

import pytest
from typer.testing import CliRunner

import fastsim
from fastsim.cli import app


def block_after(readme: str, marker: str) -> list[str]:
    """The lines of the first ```text block after ``marker``."""
    start = readme.index(marker)
    block = re.search(r"```text\n(.*?)```", readme[start:], re.S)
    return block.group(1).rstrip("\n").splitlines()


def printed(*args) -> list[str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return [line.rstrip() for line in result.stdout.splitlines()]


@pytest.mark.parametrize("marker, command", [
    ("`fastsim capacity configs/h100.yaml` (9 settings", ("capacity", "configs/h100.yaml")),
    ("`fastsim sweep configs/azure-conv.yaml` replays", ("sweep", "configs/azure-conv.yaml", "--quiet")),
    ("`fastsim plan configs/llama70b-gpus.yaml` (Llama-3.1-70B", ("plan", "configs/llama70b-gpus.yaml")),
], ids=["capacity", "azure-conv", "plan"])
def test_a_printed_table_is_what_its_command_prints(root, tmp_path, monkeypatch, marker, command):
    monkeypatch.chdir(root)
    shown = block_after((root / "README.md").read_text(), marker)
    out = printed(*command, "--out", tmp_path / "out.nc")
    missing = [line for line in shown if line not in out]
    assert not missing, missing  # the README may show some rows, each exactly as printed


def test_the_h100_load_table_is_the_sweep(root):
    shown = block_after((root / "README.md").read_text(), "`configs/h100.yaml` (256 sequences, budget")
    ds = fastsim.sweep(fastsim.load_config(root / "configs/h100.yaml"), workers=1)
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
