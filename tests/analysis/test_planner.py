"""Planner tools: SLO goodput and attainment, `fastsim capacity`, `fastsim compare`, `fastsim plot`."""

import json
import math

import numpy as np
import pytest
import xarray as xr
from typer.testing import CliRunner

from fastsim import Config, load_config, simulate
from fastsim.analysis import metrics
from fastsim.analysis.capacity import rate_text, search
from fastsim.analysis.targets import parse_target
from fastsim.cli import app


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


# SLOs
def test_goodput_rule_on_hand_made_requests():
    arrival = np.array([0.0, 0.0, 0.0, 0.0])
    first = np.array([0.1, 0.6, 0.2, 0.3])
    done = np.array([1.1, 1.6, 0.2, 5.3])
    output = np.array([11, 11, 1, 11])  # TPOT 0.1, 0.1, (one token: 0), 0.5
    _, _, _, good = metrics._latencies(arrival, output, first, done, 0.5, 0.2, np.inf)
    assert good == 2  # the second misses TTFT, the fourth TPOT; the one-token request is good
    _, _, _, good = metrics._latencies(arrival, output, first, done, np.inf, np.inf, 1.2)
    assert good == 2  # e2e only
    _, _, _, good = metrics._latencies(arrival, output, first, done, np.inf, np.inf, np.inf)
    assert good == 4


def test_goodput_and_attainment_from_per_request_results():
    config = Config().with_values({"workload.rate": 40, "slo.ttft_s": 0.009, "slo.tpot_s": 0.006})
    r = simulate(config)
    ttft = r.first_token_s - r.arrival_s
    tpot = np.where(r.output_tokens > 1, (r.done_s - r.first_token_s) / np.maximum(r.output_tokens - 1, 1), 0.0)
    good = int(((ttft <= 0.009) & (tpot <= 0.006)).sum())
    assert 0 < good < len(ttft)
    assert r.metrics["slo_attainment"] == good / len(ttft)
    assert r.metrics["goodput_rps"] == good / r.metrics["span_s"]
    none = simulate(Config())
    assert math.isnan(none.metrics["goodput_rps"]) and math.isnan(none.metrics["slo_attainment"])


# capacity
def test_capacity_meets_its_targets_and_a_rate_just_above_fails(root):
    """The answer was simulated and held (the bisection's lower end, maybe rounded down to four
    significant digits, which held too); within 1 % above it and that rounding, a rate fails."""
    config = load_config(root / "configs/h100.yaml", {"workload.n_requests": 4000})
    targets = [parse_target("ttft_p99_s<=0.5"), parse_target("tpot_p99_s<=0.05")]
    answer = search(config, targets)
    assert answer.status == "found" and answer.simulations < 40
    at = simulate(config.with_values({"workload.rate": answer.max_rate})).metrics
    above = simulate(config.with_values({"workload.rate": answer.max_rate * 1.012})).metrics
    assert all(t.holds(at) for t in targets)
    assert not all(t.holds(above) for t in targets)
    assert answer.binding in {str(t) for t in targets}


def test_capacity_cli_answers_every_setting_and_writes_a_dataset(root, tmp_path):
    out = tmp_path / "cap.nc"
    result = invoke("capacity", root / "configs/h100.yaml", "--quiet", "--set", "workload.n_requests=2000",
                    "--set", "sweep.engine.max_batched_tokens=[2048, 8192]", "--workers", "2", "--out", out)
    assert result.exit_code == 0, result.output
    assert "meeting slo_attainment>=0.9" in result.stdout
    with xr.open_dataset(out) as ds:
        assert list(ds.max_rate_rps.dims) == ["max_batch", "max_batched_tokens"]
        assert ds.max_rate_rps.attrs["units"] == "requests/s"
        assert (ds.slo_attainment.values >= 0.9).all() and np.isfinite(ds.max_rate_rps.values).all()
        assert ds.attrs["targets"] == "slo_attainment>=0.9" and int(ds.attrs["simulations"]) > 0
        row = ds.sel(max_batch=256, max_batched_tokens=8192)
        shown = rate_text(float(row.max_rate_rps))
        assert f" {shown} " in result.stdout and float(shown) == float(row.max_rate_rps)  # running it holds


def test_capacity_says_when_no_rate_works_or_the_bound_is_never_reached(root, tmp_path):
    impossible = invoke("capacity", root / "configs/h100.yaml", "--quiet", "--set", "sweep={}",
                        "--set", "workload.n_requests=300", "--target", "ttft_p99_s<=0.001", "--out", tmp_path / "a.nc")
    assert impossible.exit_code == 0 and " none " in impossible.stdout and "fails at 0.001/s" in impossible.stdout
    # (150 requests: too few to tell a steady state from a growing queue, which no answer may be)
    easy = invoke("capacity", root / "configs/h100.yaml", "--quiet", "--set", "sweep={}",
                  "--set", "workload.n_requests=150", "--target", "ttft_p99_s<=1e9", "--out", tmp_path / "b.nc")
    assert easy.exit_code == 0 and ">= " in easy.stdout and "the search bound" in easy.stdout


@pytest.mark.parametrize("args,message", [
    (["--target", "ttft<=1"], "unknown metric 'ttft'"),
    (["--target", "ttft_p99_s=1"], "expected METRIC<=VALUE or METRIC>=VALUE"),
])
def test_capacity_bad_targets_exit_2(root, tmp_path, args, message):
    result = invoke("capacity", root / "configs/h100.yaml", "--quiet", *args, "--out", tmp_path / "x.nc")
    assert result.exit_code == 2 and message in result.stderr


def test_capacity_needs_a_target(root, tmp_path):
    result = invoke("capacity", root / "configs/reference.yaml", "--quiet", "--out", tmp_path / "x.nc")
    assert result.exit_code == 2 and "capacity needs a target" in result.stderr


# compare
@pytest.fixture(scope="module")
def reference_nc(tmp_path_factory):
    from ..conftest import ROOT

    path = tmp_path_factory.mktemp("cmp") / "ref.nc"
    assert invoke("sweep", ROOT / "configs/reference.yaml", "--quiet", "--workers", "1", "--out", path).exit_code == 0
    return path


def test_compare_identical_files_exits_0(reference_nc):
    result = invoke("compare", reference_nc, reference_nc)
    assert result.exit_code == 0, result.output
    report = json.loads(invoke("compare", reference_nc, reference_nc, "--json").stdout)
    assert report["regressed"] is False and report["metrics"]["throughput_tok_s"]["regressions"] == 0


def test_compare_names_a_regressed_point(reference_nc, tmp_path):
    with xr.open_dataset(reference_nc) as ds:
        worse = ds.load()
    worse["throughput_tok_s"].loc[{"rate": 40, "policy": "continuous"}] *= 0.9
    worse["ttft_p99_s"].loc[{"rate": 8, "policy": "static"}] *= 0.5  # an improvement never fails
    path = tmp_path / "worse.nc"
    worse.to_netcdf(path)
    result = invoke("compare", reference_nc, path)
    assert result.exit_code == 1
    assert "1 regressed point(s)" in result.stdout and "rate=40.0, policy=continuous" in result.stdout
    report = json.loads(invoke("compare", reference_nc, path, "--json").stdout)
    assert report["regressions"] == [{"metric": "throughput_tok_s", "at": {"rate": 40.0, "policy": "continuous"},
                                      "baseline": pytest.approx(5709.66, abs=0.01),
                                      "candidate": pytest.approx(5709.66 * 0.9, abs=0.01),
                                      "change": pytest.approx(-0.1)}]
    assert report["metrics"]["ttft_p99_s"]["improvements"] == 1
    assert invoke("compare", reference_nc, path, "--rtol", "0.2").exit_code == 0
    assert invoke("compare", reference_nc, path, "--metric", "ttft_p99_s").exit_code == 0
    # --drift: the improvement is a change too
    drifted = invoke("compare", reference_nc, path, "--metric", "ttft_p99_s", "--drift")
    assert drifted.exit_code == 1 and "1 changed point(s)" in drifted.stdout and "rate=8.0, policy=static" in drifted.stdout
    assert invoke("compare", reference_nc, path, "--drift", "--rtol", "0.6").exit_code == 0


def test_compare_refuses_what_cannot_be_compared(root, reference_nc, tmp_path):
    other = tmp_path / "other.nc"
    assert invoke("sweep", root / "configs/reference.yaml", "--quiet", "--set", "sweep.workload.rate=[8, 20]",
                  "--out", other).exit_code == 0
    result = invoke("compare", reference_nc, other)
    assert result.exit_code == 2 and "coordinate rate differs: baseline [8.0, 40.0] vs candidate [8.0, 20.0]" in result.stderr
    junk = tmp_path / "junk.nc"
    junk.write_text("not netcdf")
    assert invoke("compare", reference_nc, junk).exit_code == 2
    plain = tmp_path / "plain.nc"
    xr.Dataset({"x": ("rate", [1.0, 2.0])}, {"rate": [8.0, 40.0]}).to_netcdf(plain)
    result = invoke("compare", reference_nc, plain)
    assert result.exit_code == 2 and "not a fastsim dataset" in result.stderr
    result = invoke("compare", reference_nc, reference_nc, "--metric", "nonsense")
    assert result.exit_code == 2 and "'nonsense' is not in the baseline" in result.stderr


# plot
def test_plot_writes_pngs_for_sweeps_and_capacity(root, tmp_path, reference_nc):
    png = tmp_path / "ref.png"
    result = invoke("plot", reference_nc, "--hue", "policy", "--out", png)
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cap = tmp_path / "cap.nc"
    assert invoke("capacity", root / "configs/h100.yaml", "--quiet", "--set", "workload.n_requests=500",
                  "--set", "sweep.engine.max_batched_tokens=[8192]", "--out", cap).exit_code == 0
    result = invoke("plot", cap, "--x", "max_batch", "--out", tmp_path / "cap.png")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "cap.png").stat().st_size > 1000


def test_plot_draws_every_axis_it_can_and_names_those_beyond(root, reference_nc, tmp_path):
    result = invoke("plot", reference_nc, "--out", tmp_path / "x.png")  # rate x policy: policy as hue
    assert result.exit_code == 0, result.output
    h100 = tmp_path / "h100.nc"  # rate x max_batch x max_batched_tokens: hue, then columns
    assert invoke("sweep", root / "configs/h100.yaml", "--quiet", "--set", "workload.n_requests=300",
                  "--out", h100).exit_code == 0
    assert invoke("plot", h100, "--out", tmp_path / "h100.png").exit_code == 0
    four = tmp_path / "four.nc"
    assert invoke("sweep", root / "configs/h100.yaml", "--quiet", "--set", "workload.n_requests=100",
                  "--set", "sweep.workload.seed=[1, 2]", "--out", four).exit_code == 0
    result = invoke("plot", four, "--out", tmp_path / "four.png")
    assert result.exit_code == 2
    assert "axes 'seed' have several values beyond x (rate), hue (max_batch) and col (max_batched_tokens): " \
           "pick one of each with --sel seed=VALUE" in result.stderr
    assert invoke("plot", four, "--sel", "seed=1", "--out", tmp_path / "y.png").exit_code == 0
    bad = invoke("plot", reference_nc, "--sel", "policy=greedy", "--out", tmp_path / "z.png")
    assert bad.exit_code == 2 and "not a value of policy" in bad.stderr


@pytest.mark.parametrize("where,message", [
    ("under-a-file/x.png", "is a file, not a folder"),
    ("x.foo", "unknown figure format '.foo'"),
    ("/proc/fastsim.png", "cannot write"),  # not writable, even by root
])
def test_plot_out_problems_are_one_line(reference_nc, tmp_path, where, message):
    (tmp_path / "under-a-file").write_text("")
    result = invoke("plot", reference_nc, "--out", tmp_path / where)
    assert result.exit_code == 2 and message in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1


def test_plot_without_matplotlib_is_one_line(reference_nc, tmp_path, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ModuleNotFoundError("No module named 'matplotlib'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    result = invoke("plot", reference_nc, "--out", tmp_path / "x.png")
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: fastsim plot needs matplotlib: pip install 'fastsim[plot]'"


def test_plot_labels_with_long_names_units_and_slo_bounds(root, tmp_path):
    from fastsim.analysis import plot
    from fastsim.analysis.compare import open_dataset

    out = tmp_path / "h.nc"
    assert invoke("sweep", root / "configs/h100.yaml", "--quiet", "--set", "workload.n_requests=200", "--out",
                  out).exit_code == 0
    ds = open_dataset(out)
    assert plot._label(ds.ttft_p99_s) == "time to first token, 99th percentile (s)"
    assert plot._axis_label(ds, "rate") == "workload.rate (requests/s)"
    config = {"slo": {"ttft_s": 0.5, "tpot_s": 0.05, "e2e_s": None}}
    assert (plot._slo_bound(config, "ttft_p99_s"), plot._slo_bound(config, "tpot_p50_s")) == (0.5, 0.05)
    assert plot._slo_bound(config, "e2e_p99_s") is None and plot._slo_bound(config, "throughput_tok_s") is None
    assert plot._defaults(ds, None, None, None) == ("rate", "max_batch", "max_batched_tokens")
    assert plot._defaults(ds, "max_batch", None, None) == ("max_batch", "rate", "max_batched_tokens")


def test_tables_fit_the_terminal_without_cutting_a_cell(root, tmp_path, monkeypatch):
    from fastsim.cli import common

    monkeypatch.setattr(common.out, "width", 80)
    result = invoke("sweep", root / "configs/h100.yaml", "--quiet", "--set", "workload.n_requests=300",
                    "--out", tmp_path / "x.nc")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "…" not in result.stdout and max(len(line) for line in lines[1:]) <= 80
    assert sum("max_batched_tokens" in line for line in lines) >= 2  # the labels repeat in each part
    assert result.stderr.strip().splitlines()[-1].startswith(
        f"next: fastsim capacity {root / 'configs/h100.yaml'} (the highest rate per setting), fastsim plan")
    fleets = invoke("sweep", root / "configs/llama70b-fleet.yaml", "--quiet", "--set", "workload.n_requests=300",
                    "--out", tmp_path / "f.nc")  # it sweeps fleet.replicas, which a plan refuses: not suggested
    assert fleets.exit_code == 0 and "fastsim plan" not in fleets.stderr and "fastsim capacity" in fleets.stderr


def test_the_sweep_summary_sustains_by_the_configs_slo(root, tmp_path):
    result = invoke("sweep", root / "configs/h100.yaml", "--quiet", "--set", "workload.n_requests=300",
                    "--out", tmp_path / "x.nc")
    assert "the highest rate it sustains (90% of requests meet the slo: TTFT <= 0.5 s, TPOT <= 0.05 s" in result.stdout
    plain = invoke("sweep", root / "configs/h100.yaml", "--quiet", "--set", "workload.n_requests=300",
                   "--set", "slo.ttft_s=null", "--set", "slo.tpot_s=null", "--out", tmp_path / "y.nc")
    assert "(TTFT p50 <= 1 s; no slo in the config; + = the grid's highest)" in plain.stdout
    assert "--target 'ttft_p99_s<=0.5'" in plain.stderr


def test_target_help_lists_the_metrics_and_quotes_the_example():
    result = invoke("capacity", "--help")
    assert "'METRIC<=VALUE'" in result.stdout and "slo_attainment" in result.stdout
    assert "ttft_p99_s" in invoke("plan", "--help").stdout


@pytest.mark.parametrize("rate", [107.63482, 26.04843875, 0.0012345, 1000.0, 99.99999, 3.0])
def test_a_rate_is_rounded_down_and_printed_exactly(rate):
    from fastsim.analysis.capacity import round_down

    short = round_down(rate)
    assert short <= rate and short >= rate * (1 - 1e-3) and len(f"{short:.4g}".replace(".", "").lstrip("0")) <= 4
    assert float(rate_text(short)) == short and float(rate_text(rate)) == rate
