"""Sweeps: labelled output, agreement with single runs, determinism across workers and Dask,
crash safety and resume, summaries."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import xarray as xr
from typer.testing import CliRunner

import fastsim
from fastsim import load_config
from fastsim.api import checkpoint_path
from fastsim.cli import app
from fastsim.analysis.metrics import METRICS
from fastsim.sweep.checkpoint import Checkpoint
from fastsim.sweep.summary import mean_ci


def h100_study(path, root, body):
    """Write a study at ``path`` that extends configs/h100.yaml with ``body``."""
    path.write_text(f"extends: {root / 'configs/h100.yaml'}\n{body}")
    return path


@pytest.fixture
def small(tmp_path, root):
    """h100 with a small grid: 3 policies x 2 batch sizes x 2 rates x 2 caps = 24 points."""
    return h100_study(
        tmp_path / "small.yaml",
        root,
        "engine:\n  prefix_caching: false\n"  # (the continuous points without it too)
        "workload:\n  n_requests: 2000\n"
        "sweep:\n  engine.policy: [static, dynamic, continuous]\n  engine.max_batch: [16, 64]\n"
        "  workload.rate: [8, 40]\n  engine.max_concurrent: [null, 8]\n",
    )


def sweep_cli(*args):
    return CliRunner().invoke(app, ["sweep", *map(str, args), "--quiet"])


def test_the_policies_compared_on_configs_h100_say_where_the_prefix_cache_was(root, tmp_path):
    """The lesson's comparison on the planner's config, whose prefix cache is on: static and
    dynamic batching run without one, as with it off, and the dataset says which points had it."""
    grid = ["--set", "sweep.engine.policy=[static,dynamic,continuous]", "--set", "sweep.workload.rate=[8,40]",
            "--set", "sweep.engine.max_batch=[64]", "--set", "sweep.engine.max_batched_tokens=[8192]",
            "--set", "workload.n_requests=1000", "--workers", "1"]
    on, off = tmp_path / "on.nc", tmp_path / "off.nc"
    result = sweep_cli(root / "configs/h100.yaml", *grid, "--out", on)
    assert result.exit_code == 0, result.output
    assert sweep_cli(root / "configs/h100.yaml", *grid, "--set", "engine.prefix_caching=false", "--out",
                     off).exit_code == 0
    with xr.open_dataset(on) as a, xr.open_dataset(off) as b:
        used = a.prefix_cache_in_effect
        assert used.dtype == bool and used.dims == a.throughput_tok_s.dims
        others = [d for d in used.dims if d != "policy"]
        assert used.any(others).values.tolist() == used.all(others).values.tolist() == [False, False, True]
        assert not b.prefix_cache_in_effect.any()
        without = a.drop_vars("prefix_cache_in_effect").sel(policy=["static", "dynamic"])
        xr.testing.assert_equal(without, b.drop_vars("prefix_cache_in_effect").sel(policy=["static", "dynamic"]))


def test_dataset_is_labelled(small, tmp_path):
    out = tmp_path / "res.nc"
    result = sweep_cli(small, "--workers", "1", "--out", out)
    assert result.exit_code == 0, result.output
    with xr.open_dataset(out) as ds:
        assert list(ds.throughput_tok_s.dims) == ["policy", "max_batch", "rate", "max_concurrent"]
        assert list(ds.data_vars) == [*METRICS, "prefix_cache_in_effect"]
        for name, metric in METRICS.items():
            units, long_name = metric.units, metric.long_name
            assert ds[name].attrs == {"units": units, "long_name": long_name}
        assert ds.prefix_cache_in_effect.dims == ds.throughput_tok_s.dims
        assert ds.prefix_cache_in_effect.attrs["units"] == "1" and ds.prefix_cache_in_effect.attrs["long_name"]
        assert not ds.prefix_cache_in_effect.any()  # engine.prefix_caching: false
        assert ds.rate.attrs["units"] == "requests/s"
        assert ds.policy.values.tolist() == ["static", "dynamic", "continuous"]
        assert np.isnan(ds.max_concurrent.values[0]) and ds.max_concurrent.values[1] == 8
        assert ds.steps.dtype == np.int64
        assert load_config(small).model_dump() == fastsim.Config.model_validate(
            __import__("yaml").safe_load(ds.attrs["config"])).model_dump()
        assert ds.attrs["fastsim_version"] == fastsim.__version__ and "numba_version" in ds.attrs
        ds.throughput_tok_s.sel(policy="continuous", max_batch=64, max_concurrent=8, rate=40)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res.nc", "small.yaml"]  # nothing else left


def test_models_gpus_and_a_boolean_axis_sweep_together(tmp_path, root):
    """hardware.preset and model.preset are the dims hardware and model; a true/false axis is
    written (netCDF has no booleans) and read back as booleans."""
    path = tmp_path / "moe.yaml"
    path.write_text(f"extends: {root / 'configs/h100.yaml'}\nworkload: {{n_requests: 200}}\nengine: {{tp: 2}}\n"
                    "model: {preset: qwen3-30b-a3b}\nsweep:\n  hardware.preset: [h100-sxm, b200]\n"
                    "  model.preset: [qwen3-30b-a3b, mixtral-8x7b]\n  engine.expert_parallel: [false, true]\n")
    out = tmp_path / "moe.nc"
    result = sweep_cli(path, "--workers", "1", "--out", out)
    assert result.exit_code == 0, result.output
    with xr.open_dataset(out) as ds:
        assert list(ds.throughput_tok_s.dims) == ["hardware", "model", "expert_parallel"]
        assert ds.expert_parallel.dtype == bool and ds.expert_parallel.values.tolist() == [False, True]
        point = ds.sel(hardware="b200", model="mixtral-8x7b", expert_parallel=True)
        one = fastsim.simulate(load_config(path, {"hardware.preset": "b200", "model.preset": "mixtral-8x7b",
                                                  "engine.expert_parallel": True}))
        assert float(point.ttft_p99_s) == one.metrics["ttft_p99_s"]


def test_every_point_equals_fastsim_run(small, tmp_path):
    ds = fastsim.sweep(load_config(small), workers=1)
    for policy, batch, rate, cap in [("static", 16, 8, None), ("continuous", 64, 40, 8), ("dynamic", 64, 40, None)]:
        args = ["run", str(small), "--json", "--set", f"engine.policy={policy}", "--set", f"engine.max_batch={batch}",
                "--set", f"workload.rate={rate}", "--set", f"engine.max_concurrent={'null' if cap is None else cap}"]
        got = json.loads(CliRunner().invoke(app, args).stdout)
        point = ds.sel(policy=policy, max_batch=batch, rate=rate).isel(max_concurrent=0 if cap is None else 1)
        values = {k: point[k].item() for k in METRICS}
        assert {k: None if v != v else v for k, v in values.items()} == got  # NaN is null in JSON


def test_identical_across_workers_and_dask(small):
    from distributed import LocalCluster

    config = load_config(small)
    one = fastsim.sweep(config, workers=1)
    two = fastsim.sweep(config, workers=2)
    xr.testing.assert_identical(one, two)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        on_dask = fastsim.sweep(config, scheduler=cluster.scheduler_address)
    xr.testing.assert_identical(one, on_dask)


def test_cli_local_dask_cluster(small, tmp_path):
    ref = fastsim.sweep(load_config(small), workers=1)
    out = tmp_path / "dask.nc"
    result = sweep_cli(small, "--scheduler", "local", "--workers", "2", "--out", out)
    assert result.exit_code == 0, result.output
    with xr.open_dataset(out) as ds:
        xr.testing.assert_equal(ds.load().drop_vars(list(ds.coords)), ref.drop_vars(list(ref.coords)))


def test_unreachable_scheduler_exits_2(small, tmp_path):
    result = sweep_cli(small, "--scheduler", "tcp://127.0.0.1:1", "--out", tmp_path / "x.nc")
    assert result.exit_code == 2 and "cannot reach a Dask scheduler" in result.stderr


@pytest.fixture
def slow(tmp_path, root):
    """40 points of 200,000 requests: several seconds, so a sweep can be stopped part-way."""
    return h100_study(
        tmp_path / "slow.yaml",
        root,
        "engine:\n  prefix_caching: false\n"
        "workload:\n  n_requests: 200000\n"
        "sweep:\n  engine.policy: [static, continuous]\n  workload.rate: [4, 8, 16, 32, 64]\n"
        "  engine.max_batch: [32, 64, 128, 256]\n",
    )


@pytest.fixture
def many_small(tmp_path, root):
    """40,000 points of 100 requests: enough Python per point to go to worker processes."""
    seeds = ", ".join(map(str, range(40000)))
    return h100_study(tmp_path / "many.yaml", root,
                      f"workload:\n  n_requests: 100\nsweep:\n  workload.seed: [{seeds}]\n")


RECORD = 8 + 8 * len(METRICS) + 8  # index, metrics, checksum
HEADER = Checkpoint.HEADER_BYTES


def start_and_stop(config, out, workers, sig, command="sweep", record=RECORD, timings=None):
    """Start ``fastsim command`` in its own process group; once a point is recorded, send ``sig``
    to the group (as a terminal's Ctrl-C does). Returns (exit code, stderr, points recorded);
    ``timings`` gets the seconds from the signal to the exit."""
    partial = checkpoint_path(out)
    cmd = [sys.executable, "-m", "fastsim", command, str(config), "--out", str(out), "--workers", str(workers),
           "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if partial.exists() and partial.stat().st_size >= HEADER + record:
            break
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.01)
    os.killpg(proc.pid, sig)
    sent = time.monotonic()
    _, stderr = proc.communicate(timeout=60)
    if timings is not None:
        timings.append(time.monotonic() - sent)
    return proc.returncode, stderr, (partial.stat().st_size - HEADER) // record


def test_sigkill_then_resume_gives_the_identical_dataset(slow, tmp_path):
    out = tmp_path / "out.nc"
    code, _, done = start_and_stop(slow, out, 1, signal.SIGKILL)
    assert code == -signal.SIGKILL and 0 < done < 40, done
    assert not out.exists()
    with open(checkpoint_path(out), "ab") as f:  # as if the kill had torn a write
        f.write(b"\x01\x02\x03")
    refused = sweep_cli(slow, "--out", out, "--workers", "1")
    assert refused.exit_code == 2 and "--resume" in refused.stderr
    resumed = sweep_cli(slow, "--out", out, "--workers", "2", "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert not checkpoint_path(out).exists()
    with xr.open_dataset(out) as got:
        xr.testing.assert_identical(got.load(), fastsim.sweep(load_config(slow), workers=2))


@pytest.mark.parametrize("study", ["slow", "many_small"])  # on worker threads; in worker processes
def test_ctrl_c_stops_cleanly_and_keeps_progress(study, request, tmp_path):
    out = tmp_path / "out.nc"
    code, stderr, done = start_and_stop(request.getfixturevalue(study), out, 2, signal.SIGINT)
    assert code == 130 and done > 0
    said = [line for line in stderr.strip().splitlines() if not line.startswith("compiling kernels")]  # a cold cache
    assert said == [
        f"error: interrupted; finished points are kept in {checkpoint_path(out)}: rerun with --resume"
    ]  # and no traceback from the workers
    assert not out.exists()


def test_small_points_in_worker_processes_give_the_same_table(root, tmp_path, monkeypatch):
    from fastsim.sweep import backends, runner
    from fastsim.sweep.grid import build_grid

    config = load_config(h100_study(tmp_path / "few.yaml", root,
                                    "workload:\n  n_requests: 50\nsweep:\n  workload.seed: [1, 2, 3, 4, 5, 6, 7]\n"
                                    "  workload.rate: [4, 30]\n"))
    grid = build_grid(config)
    alone = runner.run_grid(grid, workers=1)
    original, used = backends.processes, []

    def spy(*args):
        used.append(args)
        return original(*args)

    monkeypatch.setattr(runner, "MIN_SECONDS_FOR_PROCESSES", 0.0)
    monkeypatch.setattr(backends, "can_fork", lambda: True)  # earlier tests leave Dask's threads behind
    monkeypatch.setattr(backends, "processes", spy)
    forked = runner.run_grid(grid, workers=2)
    assert used and np.array_equal(alone, forked, equal_nan=True)


def test_resume_refuses_a_different_sweep(small, tmp_path):
    out = tmp_path / "o.nc"
    log = Checkpoint(checkpoint_path(out), load_config(small), 24, list(METRICS))
    log.open(resume=False)
    log.close()
    result = sweep_cli(small, "--out", out, "--resume", "--set", "workload.seed=8")
    assert result.exit_code == 2 and "checkpoint of a different run" in result.stderr


def test_bad_axis_value_is_named_before_anything_runs(small, tmp_path):
    result = sweep_cli(small, "--set", "sweep.workload.rate=[8, -1]", "--out", tmp_path / "x.nc")
    assert result.exit_code == 2
    assert "sweep axis 'workload.rate', value -1: workload.rate:" in result.stderr
    bad_combo = sweep_cli(small, "--set", "sweep.workload.output.min=[1, 500]", "--set",
                          "workload.output.max=100", "--out", tmp_path / "x.nc")
    assert bad_combo.exit_code == 2 and "min (500) must not exceed max (100)" in bad_combo.stderr
    assert not list(tmp_path.glob("x.nc*"))


def test_seed_axis_summary_has_confidence_intervals(tmp_path, root):
    path = h100_study(tmp_path / "seeds.yaml", root, "engine:\n  prefix_caching: false\nworkload:\n  n_requests: 1000\n"
                      "sweep:\n  engine.policy: [static, continuous]\n  workload.seed: [1, 2, 3, 4]\n")
    out = tmp_path / "s.nc"
    result = sweep_cli(path, "--workers", "1", "--out", out)
    assert result.exit_code == 0, result.output
    assert "mean ± 95% CI over 4 seeds" in result.stdout
    with xr.open_dataset(out) as ds:
        assert ds.sizes["seed"] == 4
        thr = ds.throughput_tok_s.sel(policy="continuous").values
    mean, half = mean_ci(thr)
    assert f"{mean:.0f} ± {half:.0f}" in result.stdout
    assert mean_ci(np.array([1.0, 3.0])) == (2.0, pytest.approx(12.706 * np.sqrt(2) / np.sqrt(2)))


def test_large_grid_gets_a_compact_summary(root, tmp_path):
    result = sweep_cli(root / "configs/h100.yaml", "--set", "workload.n_requests=300", "--workers", "2",
                       "--set", "engine.prefix_caching=false",
                       "--set", "sweep.engine.policy=[static, dynamic, continuous]", "--set", "sweep.workload.rate=[8, 40]",
                       "--out", tmp_path / "h.nc")
    assert result.exit_code == 0, result.output
    assert "54 grid points: best throughput per policy" in result.stdout
    assert sum(line.startswith((" static", " dynamic", " continuous")) for line in result.stdout.splitlines()) == 3


def test_load_sweep_summary_names_the_highest_sustained_rate(root, tmp_path):
    result = sweep_cli(root / "configs/h100.yaml", "--set", "workload.n_requests=2000", "--out", tmp_path / "h.nc")
    assert result.exit_code == 0, result.output
    assert ("99 grid points: per setting, the highest rate it sustains (90% of requests meet the slo: "
            "TTFT <= 0.5 s, TPOT <= 0.05 s") in result.stdout  # the config's SLO, fastsim capacity's rule
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith((" 64 ", " 256 ", " 1024 "))]
    assert len(rows) == 9
    with xr.open_dataset(tmp_path / "h.nc") as ds:
        for max_batch, budget, rate, *_ in rows:
            point = ds.sel(max_batch=int(max_batch), max_batched_tokens=int(budget))
            ok = point.rate.values[point.slo_attainment.values >= 0.9]
            assert rate.rstrip("+") == f"{ok.max():g}"


@pytest.mark.parametrize("command", ["capacity", "plan"])
def test_ctrl_c_stops_a_search_at_once_and_keeps_what_it_finished(tmp_path, root, command):
    """Searches stop between two simulations: the pool ends within a simulation, not a search."""
    config = h100_study(tmp_path / "search.yaml", root, "workload:\n  n_requests: 100000\n"
                        "sweep:\n  engine.max_batch: [16, 32, 64, 128, 256, 512]\n"
                        "  engine.max_batched_tokens: [2048, 4096, 8192]\n")
    out = tmp_path / f"{command}.nc"
    timings = []
    code, stderr, done = start_and_stop(config, out, 2, signal.SIGINT, command, 8 + 8 * (4 + len(METRICS)) + 8, timings)
    assert code == 130 and done > 0
    assert stderr.strip().splitlines() == [
        f"error: interrupted; finished points are kept in {checkpoint_path(out)}: rerun with --resume"]
    assert timings[0] < 3  # measured 0.1-0.3 s; a whole search of 100,000-request fleets takes several
    resumed = CliRunner().invoke(app, [command, str(config), "--out", str(out), "--resume", "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    assert out.exists() and not checkpoint_path(out).exists()
