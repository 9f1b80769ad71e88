"""`fastsim plan`: the cheapest fleet per candidate, confirmed by direct runs; candidates that
never meet the targets or cannot run say so; the plan dataset is one compare and plot accept."""

import json

import numpy as np
import pytest
import xarray as xr
from typer.testing import CliRunner

from fastsim import ConfigError, load_config
from fastsim.cli import app

from ..conftest import ROOT


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


EIGHT = ROOT / "tests" / "data" / "plan-eight.yaml"


@pytest.fixture(scope="module")
def eight(tmp_path_factory):
    """The issue's plan: 2 GPUs x 2 max_num_seqs x 2 routers, 100 req/s, 20,000 requests."""
    out = tmp_path_factory.mktemp("plan") / "eight.nc"
    result = invoke("plan", EIGHT, "--json", "--workers", "2", "--out", out)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), out


def run_json(settings, replicas):
    sets = [a for key, value in {**settings, "fleet.replicas": replicas}.items() for a in ("--set", f"{key}={value}")]
    result = invoke("run", EIGHT, "--json", *sets)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_every_answer_is_the_fewest_replicas_a_direct_run_confirms(eight):
    entries, _ = eight
    assert len(entries) == 8
    prices = [e["usd_per_hour"] for e in entries]
    assert prices == sorted(prices)  # cheapest first
    for e in entries:
        assert e["replicas"] is not None and e["binding"] in ("", "slo_attainment>=0.9")
        at = run_json(e["settings"], e["replicas"])
        assert at["slo_attainment"] >= 0.9
        assert (at["gpus"], at["usd_per_hour"]) == (e["gpus"], e["usd_per_hour"])
        assert at == e["metrics"]
        if e["replicas"] > 1:
            assert run_json(e["settings"], e["replicas"] - 1)["slo_attainment"] < 0.9
    assert {tuple(sorted(e["settings"])) for e in entries} == {
        ("engine.max_batch", "fleet.router", "hardware.preset")}


def test_the_plan_dataset_ranks_and_is_one_compare_and_plot_accept(eight, tmp_path):
    entries, out = eight
    with xr.open_dataset(out) as ds:
        assert list(ds.replicas.dims) == ["hardware", "max_batch", "router"]
        assert ds.attrs["kind"] == "plan" and ds.attrs["targets"] == "slo_attainment>=0.9"
        best = ds.where(ds["rank"] == 1, drop=True)
        assert float(best.usd_per_hour.min()) == entries[0]["usd_per_hour"]
        for name in ("replicas", "gpus", "usd_per_hour", "usd_per_mtok", "ttft_p99_s"):
            assert name in ds.data_vars and ds[name].attrs.get("long_name")
    assert invoke("compare", out, out).exit_code == 0
    result = invoke("plot", out, "--out", tmp_path / "plan.png")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "plan.png").stat().st_size > 1000


def test_a_candidate_that_never_meets_or_cannot_run_says_so(tmp_path):
    config = tmp_path / "hard.yaml"
    config.write_text(f"extends: {ROOT / 'configs/llama70b-tp4.yaml'}\nslo:\n  ttft_s: 2.0\n  tpot_s: 0.05\n"
                      "workload:\n  n_requests: 1000\n  rate: 60\n"
                      "sweep:\n  engine.tp: [1, 4]\n  fleet.prefill_replicas: [0, 1]\n")
    result = invoke("plan", config, "--max-replicas", "3", "--out", tmp_path / "hard.nc")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert sum(line.endswith(": never met: slo_attainment>=0.9") for line in lines) == 2
    assert sum(line.split() == [">", "3"] for line in lines) == 2  # under each, the replicas tried
    assert any(line.startswith("2 candidates cannot run (ranks 3-4): model.weight_gb (141.107) does not fit")
               for line in lines)  # 141 GB of weights on one H100, said once for both
    entries = json.loads(invoke("plan", config, "--max-replicas", "4", "--json", "--out", tmp_path / "h.nc").stdout)
    assert [e["replicas"] for e in entries] == [4, None, None, None]  # then never met, then 2 that cannot run
    assert entries[1]["binding"] == "never met: slo_attainment>=0.9"
    assert entries[2]["binding"].startswith("cannot run: model.weight_gb (141.107) does not fit")


@pytest.mark.parametrize("args,message", [
    (["--set", "sweep.fleet.replicas=[1, 2]"], "sweep: fleet.replicas is what fastsim plan chooses"),
    (["--max-replicas", "0"], "Invalid value for '--max-replicas'"),
    (["--target", "latency<=1"], "unknown metric 'latency'"),
])
def test_plan_bad_input_exits_2(tmp_path, args, message):
    result = invoke("plan", EIGHT, *args, "--out", tmp_path / "x.nc")
    assert result.exit_code == 2 and message in result.stderr, result.output


def test_plan_needs_a_target(tmp_path):
    result = invoke("plan", ROOT / "configs/reference.yaml", "--out", tmp_path / "x.nc")
    assert result.exit_code == 2 and "plan needs a target" in result.stderr


PD = ROOT / "tests" / "data" / "plan-pd.yaml"


def test_a_prefill_pool_the_plan_sizes_is_the_cheapest_pair_a_direct_run_confirms(tmp_path):
    """fleet.prefill_replicas: auto: for each candidate the plan chooses both pools; the pair
    meets the SLO in a steady state, and one decode or one prefill replica fewer misses it or is
    not steady (or there is one)."""
    result = invoke("plan", PD, "--json", "--out", tmp_path / "pd.nc")
    assert result.exit_code == 0, result.output
    entries = json.loads(result.stdout)
    assert len(entries) == 4 and all(e["replicas"] and e["prefill_replicas"] for e in entries)

    def meets(settings, replicas, prefill):
        sets = [a for key, value in {**settings, "fleet.replicas": replicas, "fleet.prefill_replicas": prefill}.items()
                for a in ("--set", f"{key}={value}")]
        ran = invoke("run", PD, "--json", *sets)
        assert ran.exit_code == 0, ran.output
        metrics = json.loads(ran.stdout)
        return metrics["slo_attainment"] >= 0.9 and metrics["steady"] != 0

    for e in entries:
        r, p = e["replicas"], e["prefill_replicas"]
        assert meets(e["settings"], r, p)
        if p > 1:
            assert not meets(e["settings"], r, p - 1)
        if r > 1:
            assert not meets(e["settings"], r - 1, p)
        assert e["binding"].startswith("decode: ") and "; prefill: " in e["binding"]
    with xr.open_dataset(tmp_path / "pd.nc") as ds:
        assert ds.prefill_pool.attrs["units"] == "replicas" and (ds.prefill_pool.values >= 1).all()


@pytest.mark.parametrize("command", ["run", "sweep", "capacity"])
def test_a_prefill_pool_left_to_the_plan_is_refused_elsewhere(tmp_path, command):
    result = invoke(command, PD, *(["--json"] if command == "run" else ["--out", tmp_path / "x.nc"]))
    assert result.exit_code == 2
    assert "fleet.prefill_replicas: auto is what fastsim plan chooses" in result.stderr, result.output


def test_a_prefill_axis_may_mix_counts_and_auto(tmp_path):
    """Colocated, a fixed prefill pool and one the plan sizes, side by side in one dataset."""
    config = tmp_path / "mixed.yaml"
    config.write_text(f"extends: {PD}\nsweep:\n  hardware.preset: [h100-sxm]\n  engine.tp: [4]\n"
                      "  fleet.prefill_replicas: [0, 2, auto]\n")
    result = invoke("plan", config, "--out", tmp_path / "mixed.nc")
    assert result.exit_code == 0, result.output
    with xr.open_dataset(tmp_path / "mixed.nc") as ds:
        assert ds.prefill_replicas.values.tolist() == ["0", "2", "auto"]
        pool = ds.prefill_pool.values.ravel()
        assert np.isnan(pool[:2]).all() and pool[2] >= 1  # only the sized pool has a chosen size


def test_a_demand_in_output_tokens_is_a_rate_over_the_mean_output():
    """--output-tok-s: the rate that carries the demand at the workload's mean output (the
    requests it draws); clients have no rate to set."""
    from fastsim.analysis.plan import for_demand
    from fastsim.engine.traffic import generate

    config = load_config(ROOT / "tests/data/plan-eight.yaml")
    at, mean = for_demand(config, 12_000.0)
    assert mean == generate(config.workload).output_tokens.mean()
    assert at.workload.rate == pytest.approx(12_000.0 / mean, rel=1e-12)
    with pytest.raises(ConfigError, match="closed-loop clients"):
        for_demand(config.at({"workload.rate": None, "workload.concurrency": 8}), 12_000.0)
