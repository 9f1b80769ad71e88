"""`fastsim run` and `fastsim bench` end to end, including the installed console script."""

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import xarray as xr
from typer.testing import CliRunner

from fastsim import Config, load_config, simulate
from fastsim.cli import app
from fastsim.analysis.metrics import METRICS


def test_run_prints_a_table(root):
    result = CliRunner().invoke(app, ["run", str(root / "configs/reference.yaml")])
    assert result.exit_code == 0
    assert "continuous batching, max_batch 64" in result.stdout
    for name in METRICS:
        assert name in result.stdout


def test_run_json_is_one_object_with_every_metric(root):
    result = CliRunner().invoke(app, ["run", str(root / "configs/h100.yaml"), "--json",
                                      "--set", "workload.n_requests=500"])
    assert result.exit_code == 0
    assert list(json.loads(result.stdout)) == list(METRICS)


def test_json_writes_null_for_undefined_metrics(root):
    result = CliRunner().invoke(app, ["run", str(root / "configs/h100.yaml"), "--json", "--set",
                                      "workload.output.dist=fixed", "--set", "workload.output.value=1"])
    assert json.loads(result.stdout)["tpot_p50_s"] is None


def test_requests_out(root, tmp_path):
    path = tmp_path / "deep" / "requests.nc"
    cfg = root / "configs/reference.yaml"
    result = CliRunner().invoke(app, ["run", str(cfg), "--set", "engine.policy=static", "--requests-out", str(path)])
    assert result.exit_code == 0, result.output
    expected = simulate(load_config(cfg, {"engine.policy": "static"}))
    with xr.open_dataset(path) as ds:
        assert ds.sizes["request"] == 3000
        np.testing.assert_array_equal(ds.done_s.values, expected.done_s)
        np.testing.assert_array_equal(ds.first_token_s.values, expected.first_token_s)
        assert ds.done_s.attrs["units"] == "s"
        assert "policy: static" in ds.attrs["config"]
        tpot = ds.tpot_s.values[expected.output_tokens > 1]  # per request, as vllm bench computes it
        assert np.nanmean(tpot) == pytest.approx(expected.metrics["tpot_mean_s"], rel=1e-12)
        assert np.isnan(ds.tpot_s.values[expected.output_tokens == 1]).all()
        assert ds.ttft_s.values.mean() == pytest.approx(expected.metrics["ttft_mean_s"], rel=1e-12)
    assert [p.name for p in path.parent.iterdir()] == ["requests.nc"]  # no temporary left behind


def test_requests_out_unwritable_exits_2(root, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = CliRunner().invoke(app, ["run", str(root / "configs/reference.yaml"), "--requests-out",
                                      str(blocker / "x.nc")])
    assert result.exit_code == 2 and "--requests-out" in result.stderr


def test_bench_runs_and_checks():
    result = CliRunner().invoke(app, ["bench", "--n", "20000", "--repeats", "1", "--sweep-points", "400", "--no-cold"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    for policy in ("static", "dynamic", "continuous"):
        assert sum(line.split()[:2] == ["lesson", policy] for line in lines) == 2  # both rates
    assert sum(line.split()[:3] == ["serving", "(h100)", "continuous"] for line in lines) == 3  # light to moderate
    assert sum(line.split()[:5] == ["closed", "loop", "(h100)", "256", "clients"] for line in lines) == 1
    routers = [re.search(r"\) +(\w+)", line)[1] for line in lines if line.startswith(" fleet (")]
    assert routers == ["round_robin", "least_outstanding", "round_robin"]  # 8 replicas twice, then 2P + 6D
    chat = [re.search(r"\) +(\w+)", line)[1] for line in lines if line.startswith(" chat fleet (")]
    assert chat == ["prefix_aware", "round_robin", "least_outstanding", "prefix_aware"]  # 4 replicas, then 2P + 2D
    assert "first call" in result.stdout and "sweep overhead: 400 points" in result.stdout


def test_bench_serving_scenario_is_configs_h100(root):
    from fastsim.bench import SERVING

    h100 = load_config(root / "configs/h100.yaml")
    assert Config().with_values(SERVING).model_dump() == h100.with_values(
        {"workload.n_requests": 3000, "workload.rate": 8, "workload.seed": 7}).model_copy(
        update={"sweep": {}, "description": ""}).model_dump()


def test_bench_chat_fleet_is_configs_chat_fleet(root):
    from fastsim.bench import CHAT, SERVING

    chat = load_config(root / "configs/chat-fleet.yaml")
    assert Config().with_values({**SERVING, **CHAT}).model_dump() == chat.with_values(
        {"workload.n_requests": 3000, "workload.seed": 7, "workload.warmup": 0}).model_copy(
        update={"sweep": {}, "description": ""}).model_dump()


def test_run_prints_a_trace_fleet(root):
    result = CliRunner().invoke(app, ["run", str(root / "configs/azure-conv.yaml"), "--set", "fleet.replicas=2",
                                      "--set", "workload.n_requests=400"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("llama-3.1-8b on h100-sxm, tp 1: continuous batching, max_batch 256, limit 256, "
                                    "budget 8,192 tokens, KV 411,520 tokens, prefix cache; 2 replicas (round_robin): "
                                    "400 requests of AzureLLMInferenceTrace_conv.csv, as recorded")


def test_run_names_clients_over_sessions(root):
    result = CliRunner().invoke(app, ["run", str(root / "configs/chat-fleet.yaml"), "--set", "workload.rate=null",
                                      "--set", "workload.concurrency=16", "--set", "workload.warmup=100",
                                      "--set", "workload.n_requests=500"])
    assert result.exit_code == 0, result.output
    assert "turns of sessions from 16 closed-loop clients, a session each at a time" in result.stdout.splitlines()[0]


def test_run_names_the_layout_of_a_replica():
    from fastsim import Config
    from fastsim.sweep.summary import layout

    assert layout(Config().with_values({"engine.tp": 8})) == "tp 8"
    assert layout(Config().with_values({"hardware.preset": "h100-sxm", "engine.tp": 16})) == \
        "tp 16 over 2 scale-up domains of 8"
    assert layout(Config().with_values({"model.preset": "qwen3-30b-a3b", "hardware.preset": "gb200", "engine.tp": 16,
                                        "engine.expert_parallel": True})) == "tp 16, expert parallel over 16 GPUs"
    moe = {"model.preset": "qwen3-30b-a3b", "hardware.preset": "h100-sxm", "engine.expert_parallel": True}
    assert layout(Config().with_values({**moe, "engine.dp": 4})) == "dp 4 x tp 1, expert parallel over 4 GPUs"
    assert layout(Config().with_values({**moe, "engine.dp": 4, "engine.tp": 4})) == \
        "dp 4 x tp 4, expert parallel over 16 GPUs in 2 scale-up domains of 8"


def test_console_script_installed(root):
    script = shutil.which("fastsim")
    assert script, "the fastsim console script is not on PATH"
    for command in ([script], [sys.executable, "-m", "fastsim"]):
        result = subprocess.run([*command, "run", str(root / "configs/reference.yaml"), "--json"],
                                capture_output=True, text=True, check=True)
        assert json.loads(result.stdout)["steps"] == 77763


def test_a_first_run_says_it_compiles_and_a_cached_one_does_not(root, tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    command = [sys.executable, "-m", "fastsim", "run", str(root / "configs/reference.yaml"), "--set",
               "workload.n_requests=50", "--json"]
    first = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    again = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    assert first.stderr.strip() == "compiling kernels, first run only (they are cached for the next) ..."
    assert again.stderr == "" and json.loads(again.stdout) == json.loads(first.stdout)


def test_a_run_says_that_static_batching_has_no_prefix_cache(root):
    """configs/h100.yaml turns the prefix cache on; static batching has none: the run goes without
    it (as with the key off) and says so in one notice."""
    args = ["run", str(root / "configs/h100.yaml"), "--set", "engine.policy=static", "--set", "workload.n_requests=500",
            "--json"]
    on = CliRunner().invoke(app, args)
    off = CliRunner().invoke(app, [*args, "--set", "engine.prefix_caching=false"])
    assert on.exit_code == 0 and off.exit_code == 0, on.output
    assert on.stdout == off.stdout
    notices = [line for line in on.stderr.splitlines() if line.startswith("notice:")]
    assert notices == ["notice: engine.prefix_caching has no effect on static batching (static and dynamic batching "
                       "have no prefix cache)"]
    assert "notice:" not in off.stderr
