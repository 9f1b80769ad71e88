"""`fastsim calibrate`: it recovers a calibration from runs simulated with it, reads vLLM's result
files, refuses bad files naming the file, row and column, and the shipped calibration is its fit
of the open measurements."""

import json

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from fastsim import ConfigError, load_config, simulate
from fastsim.cli import app

from ..conftest import ROOT

BASE = ROOT / "configs/calibration/vllm-2026-02-h100.yaml"
TRUTH = {"calibration.compute_efficiency": 0.75, "calibration.bandwidth_efficiency": 0.8,
         "calibration.step_overhead_ms": 2.0, "calibration.layer_overhead_us": 25.0,
         "calibration.api_overhead_ms": 8.0, "calibration.stall_rate_hz": 3.0, "calibration.stall_median_ms": 10.0,
         "calibration.stall_sigma": 0.8}
FITTED = ("ttft_mean_s", "e2e_mean_s", "ttft_p90_s", "e2e_p90_s", "ttft_p99_s", "e2e_p99_s")  # tails: the jitter


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


N = 1500  # requests a run


def truly(settings: dict, n: int = N) -> dict:
    """What a run of ``settings`` measures if TRUTH is the engine's real calibration."""
    return simulate(load_config(BASE, {**settings, **TRUTH, "workload.n_requests": n})).metrics


def write_csv(path, runs):
    keys = sorted({k for settings, _ in runs for k in settings})
    lines = [",".join(keys + list(FITTED))]
    for settings, metrics in runs:
        lines.append(",".join([str(settings[k]) for k in keys] + [repr(metrics[m]) for m in FITTED]))
    path.write_text("\n".join(lines) + "\n")


SIX = [{"model.preset": "llama-2-7b", "engine.tp": 1, "workload.rate": r, "workload.prompt.value": p}
       for r, p in ((4, 575), (14, 575), (8, 2000))] + \
      [{"model.preset": "llama-2-70b", "engine.tp": 4, "workload.rate": r, "workload.prompt.value": p}
       for r, p in ((3, 575), (9, 575), (4, 2000))]
OTHERS = [{"model.preset": "llama-2-7b", "engine.tp": 1, "workload.rate": 10, "workload.prompt.value": 1200},
          {"model.preset": "codellama-34b", "engine.tp": 2, "workload.rate": 6, "workload.prompt.value": 575},
          {"model.preset": "llama-2-70b", "engine.tp": 4, "workload.rate": 6, "workload.prompt.value": 300}]


def test_a_known_calibration_is_recovered_well_enough_to_predict_other_scenarios(tmp_path):
    """Jitter included: six runs' means, p90s and p99s, fitted from the jitter off, give back a
    calibration that predicts three other scenarios' means, p90s and end-to-end p99s within 3 %
    and TTFT p99s within 5 %. A first token's tail rests on a few long stalls: over ten seeds,
    the true calibration's own TTFT p99 of these 1,500-request scenarios varies by 3.6-4.8 %
    (coefficient of variation; 2.0-3.1 % at 6,000), and the fit's stalls lie elsewhere on the
    ridge of like tails (0.85 a second of 27 ms for 3 of 10 ms): measured 1.2, 4.0 and 0.7 % off
    (the other metrics at most 2.6 %)."""
    measured = tmp_path / "six.csv"
    write_csv(measured, [({**s, "workload.n_requests": N}, truly(s)) for s in SIX])
    out = tmp_path / "fit.yaml"
    result = invoke("calibrate", BASE, measured, "--out", out, "--json", "--set", "calibration.stall_rate_hz=0")
    assert result.exit_code == 0, result.output
    fit = json.loads(result.stdout)
    assert all(abs(e) < 0.02 for e in fit["median_abs_error"].values())
    fitted = yaml.safe_load(out.read_text())["calibration"]
    for settings in OTHERS:
        want = truly(settings)
        got = simulate(load_config(BASE, {**settings, **{f"calibration.{k}": v for k, v in fitted.items()},
                                          "workload.n_requests": N})).metrics
        for name in FITTED:
            assert got[name] == pytest.approx(want[name], rel=0.05 if name == "ttft_p99_s" else 0.03), (settings, name)


def vllm_result(path, rate, lens, calibration=TRUTH, burstiness=1.0, clients=None):
    """A vllm bench serve --save-result file of ``lens`` at ``rate``, as TRUTH's engine runs it:
    the fields vLLM writes (metrics in ms, p99s too)."""
    from fastsim.analysis.measured import read_vllm_json

    inputs, outputs = lens
    result = {"date": "20261203-120000", "backend": "vllm", "model_id": "meta-llama/Llama-2-7b-hf",
              "num_prompts": len(inputs), "request_rate": rate, "burstiness": burstiness, "max_concurrency": clients,
              "duration": 100.0, "completed": len(inputs), "input_lens": inputs, "output_lens": outputs,
              "mean_ttft_ms": 1.0}
    path.write_text(json.dumps(result))
    run = read_vllm_json(path, load_config(BASE, {"model.preset": "llama-2-7b", "engine.tp": 1, **SYNC}))
    m = simulate(run.config.with_values(calibration), run.traffic).metrics
    for ours, theirs in (("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl"), ("e2e", "e2el")):
        if f"{ours}_mean_s" in m:
            result[f"mean_{theirs}_ms"] = m[f"{ours}_mean_s"] * 1e3
        result[f"median_{theirs}_ms"] = m[f"{ours}_p50_s"] * 1e3
        result[f"p99_{theirs}_ms"] = m[f"{ours}_p99_s"] * 1e3
    path.write_text(json.dumps(result))
    return m


# The result-file tests run a synchronous engine (the earlier vLLM's). On an asynchronous one the
# local search from configs/h100.yaml's values stops short of the truth on these three runs (cost
# 0.013 against 0: a bandwidth efficiency of 0.74 for 0.8), and the fourth rate, near saturation,
# comes out 6 % long end to end, 8 % at p99: three runs of one model pin eight values loosely.
SYNC = {"engine.async_scheduling": False}


def lengths(seed, n=1200):
    rng = np.random.default_rng(seed)
    return (np.clip(rng.lognormal(6.3, 0.6, n), 16, 3000).astype(int).tolist(),
            np.clip(rng.lognormal(5.0, 0.7, n), 2, 1000).astype(int).tolist())


def test_vllm_bench_results_calibrate_and_predict_a_fourth_rate(tmp_path):
    files = []
    for i, rate in enumerate((4, 9, 14)):
        files.append(tmp_path / f"bench-{rate}qps.json")
        vllm_result(files[-1], rate, lengths(i), burstiness=1.0 if i else 0.5)
    out = tmp_path / "fit.yaml"
    result = invoke("calibrate", BASE, *files, "--set", "model.preset=llama-2-7b", "--set", "engine.tp=1",
                    "--set", "engine.async_scheduling=false", "--out", out, "--json")
    assert result.exit_code == 0, result.output
    fit = json.loads(result.stdout)
    for run in fit["runs"]:
        assert set(run["measured"]) == {"ttft_mean_s", "ttft_p50_s", "tpot_mean_s", "tpot_p50_s", "itl_mean_s",
                                        "itl_p50_s", "e2e_mean_s", "e2e_p50_s", "ttft_p99_s", "tpot_p99_s",
                                        "itl_p99_s", "e2e_p99_s"}
        for name in set(FITTED) & set(run["measured"]):
            assert run["after"][name] == pytest.approx(run["measured"][name], rel=0.06), name
    fitted = {f"calibration.{k}": v for k, v in yaml.safe_load(out.read_text())["calibration"].items()}
    fourth = tmp_path / "bench-18qps.json"
    want = vllm_result(fourth, 18, lengths(9))
    got = vllm_result(tmp_path / "bench-18qps-fitted.json", 18, lengths(9), fitted)
    # three runs barely pin the jitter; the files' TPOT and ITL means, fitted too, weigh on the e2e tail
    for name, rel in (("ttft_mean_s", 0.06), ("e2e_mean_s", 0.06), ("ttft_p99_s", 0.15), ("e2e_p99_s", 0.08)):
        assert got[name] == pytest.approx(want[name], rel=rel), name


def test_closed_loop_results_calibrate(tmp_path):
    """vllm bench serve --max-concurrency C --request-rate inf: C clients, each sending its next
    request as its last is done; results at three concurrencies recover the engine that made them
    (a fourth, unseen, is predicted), and the fit names the clients."""
    files = []
    for i, clients in enumerate((2, 8, 32)):
        files.append(tmp_path / f"bench-c{clients}.json")
        vllm_result(files[-1], "inf", lengths(i, 160), clients=clients)
    out = tmp_path / "fit.yaml"
    result = invoke("calibrate", BASE, *files, "--set", "model.preset=llama-2-7b", "--set", "engine.tp=1",
                    "--set", "engine.async_scheduling=false", "--fit",
                    "bandwidth_efficiency,step_overhead_ms,api_overhead_ms", "--out", out, "--json")
    assert result.exit_code == 0, result.output
    fit = json.loads(result.stdout)
    assert fit["runs"][1]["settings"] == {"workload.n_requests": 160, "workload.concurrency": 8}
    fitted = {f"calibration.{k}": v for k, v in yaml.safe_load(out.read_text())["calibration"].items()}
    want = vllm_result(tmp_path / "bench-c16.json", "inf", lengths(7, 160), clients=16)
    got = vllm_result(tmp_path / "bench-c16-fitted.json", "inf", lengths(7, 160), fitted, clients=16)
    for name in ("ttft_mean_s", "tpot_mean_s", "e2e_mean_s"):
        assert got[name] == pytest.approx(want[name], rel=0.06), name


def test_a_result_sent_all_at_once_says_so(tmp_path):
    """request_rate inf: every request is simulated at t = 0, and the table and the JSON say
    that, not the rate and arrival process that only fill the config's keys."""
    bench = tmp_path / "bench-inf.json"
    vllm_result(bench, "inf", lengths(3, 200))
    args = ["calibrate", BASE, bench, "--set", "model.preset=llama-2-7b", "--set", "engine.tp=1",
            "--set", "engine.async_scheduling=false", "--fit", "calibration.api_overhead_ms", "--out",
            tmp_path / "fit.yaml"]
    table = invoke(*args)
    assert table.exit_code == 0, table.output
    assert "bench-inf.json: n_requests 200, rate inf, arrival all at t=0" in table.stdout
    fit = json.loads(invoke(*args, "--json").stdout)
    assert fit["runs"][0]["settings"] == {"workload.n_requests": 200, "workload.rate": "inf",
                                          "workload.arrival": "all at t=0"}


BAD = [
    ("runs.csv", "model.preset,workload.rate,latency_s\nllama-2-7b,8,1\n",
     "runs.csv: column 'latency_s' is neither a config key (such as workload.rate) nor a fastsim metric"),
    ("runs.csv", "model.preset,workload.rate\nllama-2-7b,8\n", "runs.csv: no measured metric among the columns"),
    ("runs.csv", "model.preset,workload.rate,ttft_mean_s\nllama-2-7b,8,0.03\nllama-2-7b,20,nan\n",
     "runs.csv: row 3, column ttft_mean_s: 'nan' is not a positive finite measurement"),
    ("runs.csv", "model.preset,workload.rate,ttft_mean_s\nllama-2-7b,8,\n",
     "runs.csv: row 2, column ttft_mean_s: not a number ('')"),
    ("runs.csv", "model.preset,workload.rate,ttft_mean_s\nllama-9,8,0.03\n",
     "runs.csv: row 2: model.preset: unknown model preset 'llama-9'"),
    ("runs.csv", "model.preset,engine.tp,ttft_mean_s\nllama-2-70b,1,0.03\n",
     "runs.csv: row 2: model.weight_gb (137.953) does not fit: engine.tp (1)"),
    ("runs.csv", "model.preset,workload.rate,ttft_mean_s\nllama-2-7b,8,0.03,4\n", "runs.csv: row 2: 4 cells for 3 columns"),
    ("runs.csv", "", "runs.csv: empty"),
    ("bench.json", "{not json", "bench.json: not JSON"),
    ("bench.json", '{"date": 1}', "bench.json: not a vllm bench serve result (no request_rate)"),
    ("bench.json", '{"request_rate": 4, "max_concurrency": 8, "input_lens": [10], "output_lens": [5]}',
     "bench.json: max_concurrency 8 with request_rate 4: clients that also pace their requests are not modelled"),
    ("bench.json", '{"request_rate": 4, "num_prompts": 1, "mean_ttft_ms": 20}',
     "bench.json: no input_lens (save the result with --save-detailed)"),
    ("bench.json", '{"request_rate": 4, "num_prompts": 2, "input_lens": [10], "output_lens": [5], "mean_ttft_ms": 20}',
     "bench.json: 1 input_lens and 1 output_lens for num_prompts 2"),
    ("bench.json", '{"request_rate": -4, "num_prompts": 1, "input_lens": [10], "output_lens": [5], "mean_ttft_ms": 20}',
     "bench.json: request_rate -4 is neither a positive number nor \"inf\""),
    ("bench.json", '{"request_rate": 4, "num_prompts": 1, "input_lens": [10], "output_lens": [5]}',
     "bench.json: no measured mean_ or median_ of ttft_ms"),
    ("bench.json", '{"model_id": "meta-llama/Llama-3.1-70B-Instruct", "request_rate": 4, "num_prompts": 1, '
                   '"input_lens": [10], "output_lens": [5], "mean_ttft_ms": 20}',
     "bench.json: model_id 'meta-llama/Llama-3.1-70B-Instruct' is not the config's model (model.preset llama-3.1-8b)"),
]


@pytest.mark.parametrize("name,text,message", BAD, ids=[m[:45] for _, _, m in BAD])
def test_bad_measured_files_exit_2_naming_file_row_and_column(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    result = invoke("calibrate", BASE, tmp_path / name, "--out", tmp_path / "fit.yaml")
    assert result.exit_code == 2, result.output
    assert message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1  # the error alone: the fit is announced once the files are read


def test_bad_fit_keys_and_missing_files_exit_2(tmp_path):
    result = invoke("calibrate", BASE, ROOT / "configs/calibration/vllm-2026-02-h100.csv", "--fit", "speed")
    assert result.exit_code == 2 and "--fit speed: not a calibration key (valid: compute_efficiency" in result.stderr
    result = invoke("calibrate", BASE, tmp_path / "none.csv")
    assert result.exit_code == 2 and "none.csv: no such file" in result.stderr


def test_a_subset_of_keys_is_fitted_alone(tmp_path):
    out = tmp_path / "fit.yaml"
    result = invoke("calibrate", BASE, ROOT / "configs/calibration/vllm-2026-02-h100.csv", "--fit", "api_overhead_ms",
                    "--out", out, "--json")
    assert result.exit_code == 0, result.output
    fit = json.loads(result.stdout)
    assert list(fit["calibration"]) == ["api_overhead_ms"]
    written = yaml.safe_load(out.read_text())["calibration"]
    base = load_config(BASE).calibration
    assert written["compute_efficiency"] == base.compute_efficiency  # the others as the config has them
    assert written["api_overhead_ms"] == pytest.approx(fit["calibration"]["api_overhead_ms"], abs=1e-6)


def test_the_fit_reports_its_progress_evaluation_by_evaluation():
    """``on_evaluation`` (the CLI's spinner) hears every evaluation's count, in order, as it ends."""
    from fastsim import calibrate

    counts = []
    result = calibrate(load_config(BASE), [ROOT / "configs/calibration/vllm-2026-02-h100.csv"], ["api_overhead_ms"],
                       on_evaluation=counts.append)
    assert counts == list(range(1, result.evaluations + 1))


def test_a_rounding_level_change_of_the_simulation_does_not_move_the_fit(tmp_path, monkeypatch):
    """The search compares costs that differ in their last digits; rounded residuals keep it on
    one path when every simulated metric moves by 1e-12 (as adding a run's step times up in
    another order does)."""
    from dataclasses import replace

    from fastsim import calibrate
    from fastsim.analysis import calibrate as fitting

    measured = tmp_path / "two.csv"
    write_csv(measured, [({**s, "workload.n_requests": 600}, truly(s, 600)) for s in SIX[:2]])
    start = load_config(BASE, {"calibration.compute_efficiency": 0.85, "calibration.bandwidth_efficiency": 0.85,
                               "calibration.step_overhead_ms": 1.5})
    keys = ["calibration.bandwidth_efficiency", "calibration.step_overhead_ms"]
    plain = calibrate(start, [measured], keys).after
    simulated = fitting.simulate

    def nudged(*args, **kwargs):
        result = simulated(*args, **kwargs)
        return replace(result, metrics={k: v * (1 + 1e-12) for k, v in result.metrics.items()})

    monkeypatch.setattr(fitting, "simulate", nudged)
    assert calibrate(start, [measured], keys).after == plain


def test_a_doubtful_fit_says_why_on_stderr_and_in_the_json(tmp_path):
    """One run of two measurements for five values, one of them far off what the model can do:
    the fit runs (exit 0) and says so, a line each."""
    measured = tmp_path / "one.csv"
    measured.write_text("model.preset,engine.tp,workload.rate,workload.n_requests,ttft_mean_s,e2e_mean_s\n"
                        "llama-2-7b,1,4,300,30.0,2.0\n")
    result = invoke("calibrate", BASE, measured, "--out", tmp_path / "fit.yaml", "--json")
    assert result.exit_code == 0, result.output
    warnings = json.loads(result.stdout)["warnings"]
    assert warnings[0] == ("2 measurements for 5 fitted values: the fit is underdetermined; fit fewer (--fit) or "
                           "measure more runs")
    assert any(w.startswith("one.csv row 2: ttft_mean_s is ") and "off after the fit" in w for w in warnings)
    assert [line.removeprefix("warning: ") for line in result.stderr.splitlines() if line.startswith("warning: ")] \
        == warnings


def test_a_result_of_the_config_s_model_is_read(tmp_path):
    vllm_result(tmp_path / "bench.json", 4, lengths(1, 50))  # model_id meta-llama/Llama-2-7b-hf, preset llama-2-7b


def test_an_overloaded_run_is_called_overloaded(tmp_path):
    """A stage past the engine's capacity: its simulation falls behind the arrivals (the late
    requests wait far longer than the early ones), and calibrate says so, in the table, the
    JSON and a warning; fastsim run says so too."""
    measured = tmp_path / "stages.csv"
    measured.write_text("model.preset,engine.tp,workload.rate,workload.n_requests,ttft_mean_s,e2e_mean_s\n"
                        "llama-2-7b,1,8,1500,0.03,2.1\nllama-2-7b,1,60,1500,30,40\n")
    fit = invoke("calibrate", BASE, measured, "--fit", "api_overhead_ms", "--out", tmp_path / "fit.yaml", "--json")
    assert fit.exit_code == 0, fit.output
    assert [run["overloaded"] for run in json.loads(fit.stdout)["runs"]] == [False, True]
    assert "stages.csv row 3: overloaded: the fitted engine falls behind the arrivals" in fit.stderr
    table = invoke("calibrate", BASE, measured, "--fit", "api_overhead_ms", "--out", tmp_path / "fit.yaml")
    assert "stages.csv row 3: preset llama-2-7b, tp 1, rate 60, n_requests 1500 (overloaded)" in table.stdout
    run = invoke("run", BASE, "--set", "model.preset=llama-2-7b", "--set", "workload.rate=60")
    assert run.exit_code == 0 and "notice: overloaded: the engine falls behind the arrivals" in run.stderr
    calm = invoke("run", BASE, "--set", "model.preset=llama-2-7b", "--set", "workload.rate=8")
    assert "overloaded" not in calm.stderr


def test_a_cached_system_prompt_is_calibrated_as_fastsim_run_simulates_it(tmp_path):
    """With prefix caching on, a shared prefix is a system prompt cached by content: calibrate
    simulates each measured run (a CSV row, or a vllm bench file's lengths) as `fastsim run`
    does, system prompt included (it once drew the prompts without it)."""
    from fastsim.analysis.calibrate import _Runs
    from fastsim.analysis.measured import read_csv, read_vllm_json

    base = load_config(BASE, {"engine.prefix_caching": True, "workload.n_requests": 300})
    measured = tmp_path / "runs.csv"
    measured.write_text("model.preset,engine.tp,workload.rate,ttft_mean_s,e2e_mean_s\nllama-2-7b,1,8,0.03,2.1\n")
    path = tmp_path / "bench.json"
    vllm_result(path, 4, lengths(2, 300))
    runs = read_csv(measured, base) + [read_vllm_json(path, base.with_values({"model.preset": "llama-2-7b"}))]
    values = {"calibration.api_overhead_ms": 8.0}
    for run, got in zip(runs, _Runs(runs).results(values)):
        want = simulate(run.config.at(values), run.traffic)
        assert run.traffic is None or run.traffic.content is not None
        same = [name for name in want.metrics if not name.startswith("itl_") or name in run.metrics]  # (the fit
        # computes ITL only where measured: the costliest metric)
        assert [got.metrics[name] for name in same] == pytest.approx([want.metrics[name] for name in same], nan_ok=True)
        assert got.metrics["prefix_hit_rate"] > 0


def test_an_inferencex_result_is_read_in_seconds_with_the_config_s_lengths(tmp_path):
    """InferenceX's result files: vllm bench's fields, times in seconds, no per-request lengths
    (the config's workload draws them, and must match the file's mean lengths); its throughputs
    are measurements too."""
    import warnings

    from fastsim.analysis.measured import read_vllm_json
    from fastsim.model.hf_config import Approximation

    folder = ROOT / "configs/calibration"
    result = {"model_id": "openai/gpt-oss-120b", "num_prompts": 80, "request_rate": "inf", "max_concurrency": 8,
              "total_input_tokens": 80 * 922, "total_output_tokens": 80 * 921, "output_throughput": 1180.0,
              "median_ttft": 0.0701, "p99_ttft": 0.12, "median_tpot": 0.00625, "mean_tpot": 0.0063}
    path = tmp_path / "gptoss_tp2_conc8.json"
    path.write_text(json.dumps(result))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Approximation)
        base = load_config(folder / "inferencex-gpt-oss-120b-h100.yaml", {"engine.tp": 2})
        run = read_vllm_json(path, base)
        assert run.settings == {"workload.n_requests": 80, "workload.concurrency": 8}
        assert run.metrics == {"ttft_p50_s": 0.0701, "ttft_p99_s": 0.12, "tpot_p50_s": 0.00625,
                               "tpot_mean_s": 0.0063, "throughput_tok_s": 1180.0}
        assert run.traffic is None and run.config.workload.prompt.min == 820  # the config's lengths, drawn
        with pytest.raises(ConfigError, match="total_input_tokens 73760 is 922 tokens a request, but "
                                              "workload.prompt draws a mean of 4506"):
            read_vllm_json(path, base.with_values({"workload.prompt.value": 8192, "workload.prompt.range_ratio": 0.1}))
