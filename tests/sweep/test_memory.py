"""Memory: oversized runs are refused before anything is allocated, with the key and the figures."""

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from fastsim import Config, ConfigError, load_config
from fastsim.sweep import memory
from fastsim.cli import app


def one_line(result):
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr  # no traceback
    return lines[0]


def test_a_billion_requests_is_refused_with_the_key_and_the_estimate(root, monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: 21_000_000_000)
    result = CliRunner().invoke(app, ["run", str(root / "configs/h100.yaml"), "--set", "workload.n_requests=1e9"])
    assert one_line(result) == "error: workload.n_requests: 1,000,000,000 requests need ~336 GB, 21 GB available"


def test_max_memory_option(root):
    cfg = str(root / "configs/h100.yaml")
    small = one_line(CliRunner().invoke(app, ["run", cfg, "--max-memory", "1MB"]))
    assert small.startswith("error: workload.n_requests: 20,000 requests need ~") and "allowed" in small
    shared = one_line(CliRunner().invoke(app, ["run", cfg, "--max-memory", "1MB", "--set",
                                               "workload.system_prompts={count: 2, tokens: 100}", "--set",
                                               "engine.block_tokens=1"]))  # (its 43 MB: the most)
    assert shared.startswith("error: engine.prefix_caching: the prefix cache of 411,525 blocks needs ~")
    assert CliRunner().invoke(app, ["run", cfg, "--max-memory", "1GiB", "--json"]).exit_code == 0
    assert "--max-memory" in one_line(CliRunner().invoke(app, ["run", cfg, "--max-memory", "lots"]))


@pytest.mark.parametrize("policy", ["static", "dynamic", "continuous"])
def test_every_policy_is_refused_with_its_estimate(root, policy):
    """configs/h100.yaml under --max-memory 1kB: one line with the estimate, whatever the policy
    (static batching once met the prefix cache's refusal first, which had none)."""
    line = one_line(CliRunner().invoke(app, ["run", str(root / "configs/h100.yaml"), "--set",
                                             f"engine.policy={policy}", "--max-memory", "1kB"]))
    need = memory.run_bytes(load_config(root / "configs/h100.yaml", {"engine.policy": policy}))
    assert line == f"error: workload.n_requests: 20,000 requests need ~{memory._size(need)}, 1.0 kB allowed"


def test_sweep_refusal_counts_workers_and_the_table(root, tmp_path):
    cfg = str(root / "configs/h100.yaml")
    out = tmp_path / "x.nc"
    line = one_line(CliRunner().invoke(app, ["sweep", cfg, "--workers", "2", "--max-memory", "4MB", "--out", str(out)]))
    assert "20,000 requests a point on 2 workers need ~" in line
    big_grid = ["--set", "workload.n_requests=1", "--set", f"sweep.workload.seed=[{','.join(map(str, range(30000)))}]"]
    line = one_line(CliRunner().invoke(app, ["sweep", cfg, *big_grid, "--max-memory", "8MB", "--out", str(out)]))
    assert line.startswith("error: sweep: 2,970,000 points need ~")  # 99 x 30,000
    assert not list(tmp_path.iterdir())


def test_longest_output_does_not_drive_memory():
    base = Config()
    huge = base.with_values({"workload.output.dist": "fixed", "workload.output.value": 10**9})
    assert memory.run_bytes(huge) == memory.run_bytes(base)
    memory.check(huge)  # would need 8 GB if the calendar were sized by the longest output


MEASURE = """
import gc, json, sys
import psutil
import fastsim
from fastsim.sweep import memory
base = fastsim.Config().with_values(json.loads(sys.argv[1]))
if base.sweep:  # load every kernel it takes: two of the points
    fastsim.sweep(base.model_copy(update={"sweep": {"workload.seed": [1, 2]}}), workers=1)
else:  # past SORT_BELOW requests, as the large runs' metrics code
    fastsim.simulate(base.with_values({"workload.n_requests": 5000}))
gc.collect()
resting = psutil.Process().memory_info().rss
with open("/proc/self/clear_refs", "w") as f:  # reset the peak (VmHWM) to what is resident now
    f.write("5")
fastsim.simulate(base) if not base.sweep else fastsim.sweep(base, workers=1)  # its scratch grows from the small run's
peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(peak * 1024 - resting, memory.point_bytes(base) if base.sweep else memory.run_bytes(base))
"""
SERVING = {"hardware.preset": "h100-sxm", "model.preset": "llama-3.1-8b", "engine.max_batched_tokens": 8192}
SESSIONS = {"workload.sessions": {"turns": {"max": 6}}, "workload.rate": 2}
KINDS = {
    "one-lesson-static": {"engine.policy": "static"},
    "one-lesson-continuous": {"engine.policy": "continuous"},
    "one-serving-static": {**SERVING, "engine.policy": "static"},
    "one-serving-dynamic": {**SERVING, "engine.policy": "dynamic"},
    "one-serving-continuous": SERVING,
    "apart-static": {**SERVING, "engine.policy": "static", "fleet.replicas": 4, "workload.rate": 60},
    "apart": {**SERVING, "fleet.replicas": 4, "workload.rate": 120},
    "apart-random": {**SERVING, "fleet.replicas": 4, "fleet.router": "random", "workload.rate": 120},
    "pool": {**SERVING, "fleet.replicas": 4, "fleet.router": "least_outstanding", "workload.rate": 120},
    "disaggregated": {**SERVING, "fleet.replicas": 3, "fleet.prefill_replicas": 1, "workload.rate": 90},
    # prefix caching: over requests that share nothing on the fast kernels, else on the cache's loop
    "cached-unshared": {**SERVING, "engine.prefix_caching": True},
    "cached-pool-unshared": {**SERVING, "engine.prefix_caching": True, "fleet.replicas": 4, "workload.rate": 120},
    "cached": {**SERVING, "engine.prefix_caching": True, "workload.system_prompts": {"count": 8, "tokens": 200}},
    "sessions": {**SERVING, **SESSIONS},
    "sessions-disaggregated": {**SERVING, **SESSIONS, "fleet.replicas": 3, "fleet.prefill_replicas": 1,
                               "workload.rate": 6},
    # data-parallel ranks: a pool of them in one replica
    "dp": {**SERVING, "model.preset": "qwen3-30b-a3b", "engine.dp": 4, "engine.expert_parallel": True,
           "workload.rate": 120},
    # a sweep of small points, many to a compiled call (analysis.batch): 1,000 points of 4,000 requests
    "sweep-small-points": {"workload.rng": "numpy", "sweep": {"workload.seed": list(range(1000))}},
}


@pytest.mark.skipif(sys.platform != "linux", reason="reads the peak from /proc/self/status")
@pytest.mark.parametrize("kind", KINDS)
def test_estimate_bounds_the_measured_peak(kind):
    """Peak resident memory of a run of 400,000 requests whose scratch grows for it, as a
    command's does (beyond what the process held at rest, kernels loaded), stays under the
    estimate, for every way a fleet runs and every policy; a sweep's worker's, for small points."""
    n = 4000 if "sweep" in KINDS[kind] else 400_000
    values = {"workload.rate": 40, **KINDS[kind], "workload.n_requests": n}
    done = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(values)], capture_output=True, text=True,
                          check=True)
    peak, estimate = map(int, done.stdout.split())
    assert peak <= estimate, (kind, peak / n, estimate / n)


def test_estimate_counts_a_pools_calendars():
    config = Config().with_values({"workload.n_requests": 1000, "fleet.replicas": 100_000,
                                   "fleet.router": "least_outstanding"})
    calendars = 100_000 * 8 * (config.workload.max_output + 1)
    assert memory.run_bytes(config) >= calendars
    with pytest.raises(ConfigError, match=r"^fleet.replicas: 100,000 replicas need ~"):
        memory.check(config, limit=calendars // 2)


def test_memory_error_is_one_line(root, monkeypatch):
    from fastsim import api

    def boom(config):
        raise MemoryError

    monkeypatch.setattr(api, "simulate", boom)
    line = one_line(CliRunner().invoke(app, ["run", str(root / "configs/reference.yaml")]))
    assert line.startswith("error: out of memory")


@pytest.mark.parametrize("text,size", [("8GB", 8e9), ("500M", 5e8), ("16GiB", 16 * 2**30), ("2e9", 2e9), ("1kb", 1e3)])
def test_parse_size(text, size):
    assert memory.parse_size(text) == size


def test_parse_size_rejects_nonsense():
    for text in ("", "GB", "-1GB", "0", "8XB"):
        with pytest.raises(ConfigError, match="--max-memory"):
            memory.parse_size(text)


def test_capacity_checks_the_largest_point_of_its_grid(root, tmp_path):
    line = one_line(CliRunner().invoke(app, ["capacity", str(root / "configs/h100.yaml"), "--quiet", "--workers", "1",
                                             "--set", "sweep.workload.n_requests=[1000, 1e9]", "--max-memory", "1GB",
                                             "--out", str(tmp_path / "c.nc")]))
    assert line.startswith("error: workload.n_requests: 1,000,000,000 requests need ~336 GB")
    assert not list(tmp_path.iterdir())


def test_a_sweep_is_estimated_at_its_most_demanding_point(root):
    """Not at its base's values: a static base with a continuous point, one replica and four."""
    from fastsim.sweep.grid import build_grid

    config = load_config(root / "configs/h100.yaml", {"engine.policy": "static", "workload.n_requests": 100_000,
                                                      "sweep.engine.policy": ["static", "continuous"],
                                                      "sweep.fleet.replicas": [1, 4]})
    grid = build_grid(config)
    most = memory.largest(grid)
    assert (most.engine.policy, most.fleet.replicas) == ("continuous", 4)
    assert memory.run_bytes(most) == max(memory.run_bytes(grid.config(i)) for i in range(grid.size))
