"""The throughput-interactivity frontier: closed-loop sweeps of every candidate, the points no
other beats on both axes, and `fastsim frontier` end to end."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from typer.testing import CliRunner

from fastsim import ConfigError, load_config
from fastsim.analysis import frontier
from fastsim.analysis.catalog import METRICS
from fastsim.cli import app

from ..conftest import ROOT


def table_of(points: list[tuple[float, float]]) -> np.ndarray:
    names = list(METRICS)
    table = np.full((len(points), len(names)), np.nan)
    for i, (x, y) in enumerate(points):
        table[i, names.index(frontier.X)], table[i, names.index(frontier.Y)] = x, y
    return table


def test_a_point_is_on_the_frontier_when_no_point_beats_it_on_both():
    points = [(10, 100), (20, 90), (15, 80), (20, 90), (5, 100), (30, 10), (np.nan, 500), (1, 1)]
    assert frontier.on_frontier(table_of(points)).tolist() == [True, True, False, True, False, True, False, False]


def test_the_grid_is_every_candidate_under_clients_at_each_concurrency():
    config = load_config(ROOT / "configs/h100.yaml")
    grid = frontier.grid_config(config)
    assert list(grid.sweep) == ["engine.max_batch", "engine.max_batched_tokens", "workload.concurrency"]
    assert grid.sweep["workload.concurrency"] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert grid.workload.rate is None and grid.workload.concurrency == 1
    assert frontier.grid_config(config, [8, 64]).sweep["workload.concurrency"] == [8, 64]
    with pytest.raises(ConfigError, match="workload.concurrency: 0 is not a positive whole number"):
        frontier.grid_config(config, [0, 8])


def test_fastsim_frontier_writes_the_curves_and_marks_the_frontier(tmp_path):
    out = tmp_path / "f.nc"
    args = ["frontier", "configs/h100.yaml", "--set", "workload.n_requests=600", "--set",
            "sweep.engine.max_batch=[16,256]", "--set", "sweep.engine.max_batched_tokens=[8192]",
            "--concurrency", "1,8,64", "--out", str(out), "--quiet"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "frontier: " in result.stdout and max(map(len, result.stdout.splitlines())) <= 80
    ds = xr.open_dataset(out)
    assert dict(ds.sizes) == {"max_batch": 2, "max_batched_tokens": 1, "concurrency": 3}
    tput = ds.tok_s_per_gpu.values
    assert (np.diff(tput, axis=-1) > 0).all()  # more clients, more throughput ...
    assert (np.diff(ds.interactivity_tok_s.values, axis=-1) < 0).all()  # ... each user slower
    assert ds.on_frontier.values[1, 0, -1]  # 64 clients on 256 slots: the most throughput
    assert tput[0, 0, -1] < tput[1, 0, -1]  # 16 slots hold 64 clients back: less throughput (the queue's wait
    assert ds.interactivity_tok_s.values[0, 0, -1] > ds.interactivity_tok_s.values[1, 0, -1]  # is TTFT, not TPOT)
    plotted = CliRunner().invoke(app, ["plot", str(out), "--out", str(tmp_path / "f.png")])
    assert plotted.exit_code == 0 and (tmp_path / "f.png").stat().st_size > 10_000


def test_a_bad_concurrency_list_is_refused():
    result = CliRunner().invoke(app, ["frontier", "configs/h100.yaml", "--concurrency", "8,x"])
    assert result.exit_code == 2 and "--concurrency '8,x'" in result.stderr
