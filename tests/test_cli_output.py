"""What the commands print reads cleanly: tables fit 80 columns, changes read the natural way,
help and notices wrap at words, the progress estimate counts the points' work."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import xarray as xr
from typer.testing import CliRunner

from fastsim.cli import app, common

WIDTHS = [80, 200]


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(params=WIDTHS)
def width(request, monkeypatch):
    """The output console as wide as a terminal of this many columns."""
    monkeypatch.setattr(common.out, "width", request.param)
    return request.param


def _fits(text: str, width: int) -> None:
    tables = [line for line in text.splitlines() if line.startswith(" ")]  # table rows start with a pad
    assert tables and max(len(line) for line in tables) <= width, text
    assert "…" not in text


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    from fastsim.cli import app as the_app

    out = tmp_path_factory.mktemp("plan") / "plan.nc"
    result = CliRunner().invoke(the_app, ["plan", "configs/llama70b-gpus.yaml", "--out", str(out), "--quiet",
                                          "--set", "workload.n_requests=600", "--set", "sweep.engine.max_batch=[256]",
                                          "--set", "sweep.hardware.preset=[h100-sxm,b200]"])
    assert result.exit_code == 0, result.output
    return out


def test_calibrate_says_each_runs_settings_once_and_fits(root, tmp_path, width):
    result = invoke("calibrate", root / "configs/calibration/vllm-2026-02-h100.yaml", root / "configs/calibration/vllm-2026-02-h100.csv",
                    "--out", tmp_path / "c.yaml", "--fit", "api_overhead_ms")
    assert result.exit_code == 0, result.output
    _fits(result.stdout, width)
    assert result.stdout.count("preset llama-2-7b, tp 1, rate 8, n_requests 4800") == 1
    assert result.stdout.count("ttft_mean_s") == 4 + 1  # a row per run, and the medians line


def test_plan_is_compact_by_default_and_groups_reasons(plan_file, width, root):
    result = invoke("plan", root / "configs/llama70b-gpus.yaml", "--out", plan_file, "--resume", "--quiet",
                    "--set", "workload.n_requests=600", "--set", "sweep.engine.max_batch=[256]",
                    "--set", "sweep.hardware.preset=[h100-sxm,b200]")
    assert result.exit_code == 0, result.output
    text = result.stdout
    _fits(text, width)
    headings = [line for line in text.splitlines() if line[:1].isdigit() and ". GPU " in line]
    assert [h.split(",")[0].split(". ")[1] for h in headings] == ["GPU b200", "GPU h100-sxm"]  # one per GPU
    assert "2 candidates cannot run (ranks 11-12): model.weight_gb (141.107) does not fit" in text
    assert text.count("does not fit") == 1
    assert "2 of 10 candidates shown, the best per GPU; --all lists every one" in text
    every = invoke("plan", root / "configs/llama70b-gpus.yaml", "--out", plan_file, "--resume", "--quiet", "--all",
                   "--set", "workload.n_requests=600", "--set", "sweep.engine.max_batch=[256]",
                   "--set", "sweep.hardware.preset=[h100-sxm,b200]")
    assert len([line for line in every.stdout.splitlines() if ". GPU " in line]) == 10
    assert "candidates shown" not in every.stdout


def test_plan_figure_shows_the_cheapest_that_meet_the_targets(plan_file, tmp_path, monkeypatch):
    from fastsim.analysis import plot

    monkeypatch.setattr(plot, "PLAN_BARS", 3)
    assert invoke("plot", plan_file, "--out", tmp_path / "p.png").exit_code == 0
    import matplotlib.image

    height, width = matplotlib.image.imread(tmp_path / "p.png").shape[:2]
    assert height < 600 and width < 2000


def _dataset(path, ttft, attainment):
    ds = xr.Dataset({"ttft_p99_s": ("rate", np.array(ttft, float), {"units": "s"}),
                     "slo_attainment": ("rate", np.array(attainment, float), {"units": "1"})},
                    coords={"rate": [1.0, 2.0, 3.0]}, attrs={"fastsim_version": "test", "config": ""})
    ds.to_netcdf(path)
    return path


def test_compare_says_changes_the_natural_way(tmp_path, width):
    base = _dataset(tmp_path / "a.nc", [0.5, 0.0, 1.0], [1.0, 0.9, 0.8])
    cand = _dataset(tmp_path / "b.nc", [0.6, 0.2, 1.0], [1.0, 0.9, 0.8])
    result = invoke("compare", base, cand)
    assert result.exit_code == 1
    _fits(result.stdout, width)
    assert "from 0 to 0.2 (worse)" in result.stdout  # the baseline of 0, said as such
    assert "+20.0% (worse)" in result.stdout  # a latency that rose: a plus sign, and worse
    assert "unchanged: slo_attainment" in result.stdout
    assert "inf" not in result.stdout
    big = _dataset(tmp_path / "c.nc", [850.0, 0.0, 1.0], [1.0, 0.9, 0.4])
    text = invoke("compare", base, big).stdout
    assert "1,700.0x (worse)" in text and "-50.0% (worse)" in text


def test_compare_of_identical_datasets_is_one_line(tmp_path):
    base = _dataset(tmp_path / "a.nc", [0.5, 0.0, 1.0], [1.0, 0.9, 0.8])
    result = invoke("compare", base, base)
    assert result.exit_code == 0
    assert result.stdout.strip().splitlines() == [f"{base} and {base}: no change in any of the 2 metrics compared"]


def test_help_wraps_at_words(root):
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1"}
    text = subprocess.run([sys.executable, "-m", "fastsim", "--help"], capture_output=True, text=True, env=env,
                          check=True).stdout
    assert "least squares on log errors" in " ".join(line.strip("│ ") for line in text.splitlines())
    for line in text.splitlines():  # no line ends a sentence fragment early: each is filled
        words = line.strip("│ ").split()
        assert words != ["log"] and words != ["but"] and words != ["worse"], line


def test_stderr_notices_are_not_hard_wrapped_in_a_file(root, tmp_path):
    command = [sys.executable, "-m", "fastsim", "sweep", str(root / "configs/h100.yaml"), "--out",
               str(tmp_path / "a.nc"), "--set", "workload.n_requests=100", "--quiet"]
    err = subprocess.run(command, capture_output=True, text=True, check=True).stderr
    lines = [line for line in err.splitlines() if line.startswith("wrote ")]
    assert len(lines) == 1 and lines[0].endswith("s)"), err


def test_progress_counts_the_points_work(root):
    from fastsim import load_config
    from fastsim.sweep.grid import build_grid
    from fastsim.sweep.runner import run_grid

    config = load_config(root / "configs/h100.yaml", {"sweep": {"workload.n_requests": [100, 101, 20000]}})
    reports = []
    run_grid(build_grid(config), workers=1, on_progress=lambda *a: reports.append(a))
    assert reports[0] == (0, 3, 0.0) and reports[-1] == (3, 3, 1.0)
    done_two_small = [work for done, _, work in reports if done == 2]
    assert done_two_small and done_two_small[0] < 0.05  # two small points are a sliver of the work


def test_keys_lists_every_key_with_default_and_units(width):
    from fastsim.model.schema import LEAF_KEYS

    text = invoke("keys").stdout
    assert all(key in text for key in LEAF_KEYS)
    engine = invoke("keys", "engine").stdout
    _fits(engine, width)
    assert "engine.kv_cache_gb" in engine and "workload" not in engine
    line = next(line for line in engine.splitlines() if "engine.window_ms" in line)
    assert line.split() == ["engine.window_ms", "50", "ms", "float"]
    bad = invoke("keys", "nope")
    assert bad.exit_code == 2 and bad.stderr.startswith("error: nope: not a config section")
