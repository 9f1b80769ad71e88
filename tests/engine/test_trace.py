"""Trace replay: the Azure and plain formats, rate rescaling, caching, and every bad trace."""

import csv
from datetime import datetime

import numpy as np
import pytest
from typer.testing import CliRunner

from fastsim import Config, load_config, simulate
from fastsim.engine import trace
from fastsim.cli import app
from fastsim.engine.traffic import generate

CONV = "configs/traces/AzureLLMInferenceTrace_conv.csv"


def azure_rows(path):
    with open(path) as f:
        rows = list(csv.reader(f))[1:]
    t = [datetime.fromisoformat(r[0][:26]) for r in rows]  # microseconds: the file has 100 ns digits
    return [(x - t[0]).total_seconds() for x in t], [int(r[1]) for r in rows], [int(r[2]) for r in rows]


def test_native_rate_replays_the_file(root):
    config = Config().with_values({"workload.trace": str(root / CONV), "workload.rate": None,
                                   "workload.n_requests": None})
    tr = generate(config.workload)
    arrival, prompt, output = azure_rows(root / CONV)
    assert len(tr) == 19_366
    assert np.abs(tr.arrival_s - arrival).max() < 1e-6  # to the microsecond
    assert tr.prompt_tokens.tolist() == prompt and tr.output_tokens.tolist() == output


def test_rescaled_rate_is_exact_and_n_takes_the_first(root):
    for rate, n in ((20.0, 19_366), (3.0, 500)):
        w = Config().with_values({"workload.trace": str(root / CONV), "workload.rate": rate, "workload.n_requests": n})
        tr = generate(w.workload)
        assert len(tr) == n and (n - 1) / tr.arrival_s[-1] == rate
        native = generate(w.with_values({"workload.rate": None}).workload)
        assert np.allclose(tr.arrival_s, native.arrival_s * tr.arrival_s[-1] / native.arrival_s[-1])
        assert (tr.output_tokens == native.output_tokens).all()


def test_traces_are_read_once(root, monkeypatch):
    path = str(root / CONV)
    trace.load(path)
    monkeypatch.setattr("builtins.open", lambda *a, **k: pytest.fail("read the trace again"))
    for rate in (4, 8):
        generate(Config().with_values({"workload.trace": path, "workload.rate": rate, "workload.n_requests": 100}).workload)


def test_plain_format_and_paths_relative_to_the_config(tmp_path):
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n5.0,10,3\n5.5,20,1\n7.0,0,2\n")
    (tmp_path / "c.yaml").write_text("workload:\n  trace: t.csv\n  rate: null\n  n_requests: null\n")
    r = simulate(load_config(tmp_path / "c.yaml"))
    assert r.arrival_s.tolist() == [0.0, 0.5, 2.0] and r.prompt_tokens.tolist() == [10, 20, 0]
    assert r.output_tokens.tolist() == [3, 1, 2] and r.metrics["steps"] > 0


def test_azure_conv_sweep_names_the_sustained_rate(root, tmp_path):
    result = CliRunner().invoke(app, ["sweep", str(root / "configs/azure-conv.yaml"), "--quiet",
                                      "--set", "workload.n_requests=3000", "--out", str(tmp_path / "a.nc")])
    assert result.exit_code == 0, result.output
    assert "per setting, the highest rate it sustains" in result.stdout
    assert len([line for line in result.stdout.splitlines() if line.startswith((" 64 ", " 256 "))]) == 4


BAD = [
    ("arrival_s,prompt_tokens,output_tokens\n", "empty trace"),
    ("time,in,out\n1,2,3\n", "unknown trace format (header time,in,out); expected columns TIMESTAMP,ContextTokens,"
                             "GeneratedTokens (Azure LLM inference) or arrival_s,prompt_tokens,output_tokens"),
    ("arrival_s,prompt_tokens,output_tokens\n0,10,2\n1,-4,2\n", "row 3, column prompt_tokens: negative token count (-4)"),
    ("arrival_s,prompt_tokens,output_tokens\n0,10,2\n1,4.5,2\n", "row 3, column prompt_tokens: not a whole number of tokens ('4.5')"),
    ("arrival_s,prompt_tokens,output_tokens\n0,10,0\n", "row 2, column output_tokens: zero token count (0); at least 1"),
    ("arrival_s,prompt_tokens,output_tokens\n0,10,2\n2,1,1\n1,1,1\n", "row 4, column arrival_s: earlier than the row before"),
    ("arrival_s,prompt_tokens,output_tokens\nsoon,10,2\n", "row 2, column arrival_s: not a time in seconds ('soon')"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6,10,2\nyesterday,1,1\n",
     "row 3, column TIMESTAMP: not a date-time ('yesterday')"),
    ("arrival_s,prompt_tokens,output_tokens\n0,10,2\n1,2\n", "row 3: 2 columns, expected 3"),
    ("arrival_s,prompt_tokens,output_tokens\n0,10,2\n1,600000,2\n", "row 3 (prompt 600000 + output 2 = 600002 tokens) "
                                                                    "does not fit in the KV cache"),
]


@pytest.mark.parametrize("text,message", BAD, ids=[m[:30] for _, m in BAD])
def test_bad_traces_exit_2_naming_file_row_and_column(root, tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    result = CliRunner().invoke(app, ["run", str(root / "configs/h100.yaml"), "--set", f"workload.trace={path}",
                                      "--set", "workload.n_requests=null"])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and str(path) in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_trace_problems_stop_a_sweep_before_it_runs(root, tmp_path):
    path = tmp_path / "long.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,2\n1,600000,2\n")
    result = CliRunner().invoke(app, ["sweep", str(root / "configs/azure-conv.yaml"), "--quiet", "--out",
                                      str(tmp_path / "x.nc"), "--set", f"workload.trace={path}"])
    assert result.exit_code == 2 and "does not fit in the KV cache" in result.stderr
    assert not (tmp_path / "x.nc").exists()


@pytest.mark.parametrize("args,message", [
    (["--set", "workload.trace=/nonexistent.csv"], "workload.trace: /nonexistent.csv: no such file"),
    (["--set", f"workload.trace={CONV}", "--set", "workload.n_requests=50000"],
     "workload.n_requests: 50,000 requests, but"),
    (["--set", "workload.rate=null"], "workload.rate: null (as recorded) needs a workload.trace"),
])
def test_bad_trace_settings(root, args, message, monkeypatch):
    monkeypatch.chdir(root)
    result = CliRunner().invoke(app, ["run", "configs/h100.yaml", *args])
    assert result.exit_code == 2 and message in result.stderr, result.stderr


def test_old_prompt_tokens_key_names_the_new_one(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text("workload:\n  prompt_tokens: 512\n")
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 2
    assert "workload.prompt_tokens: replaced by workload.prompt" in result.stderr
    assert "workload.prompt.value: 1000" in result.stderr
