"""The lesson's table, reproduced to full precision through the CLI (`fastsim run --json`)."""

import json

import pytest
from typer.testing import CliRunner

from fastsim.cli import app

# Full-precision figures printed by the lesson's own program (batching.py), run unmodified.
LESSON = {
    ("static", 8): dict(throughput_tok_s=1188.0921153497159, slot_use=0.14858808428708953, ttft_p50_s=5.593280630995636, ttft_p99_s=16.034675307873666, e2e_p50_s=6.611364327896489, e2e_p99_s=17.615648820663132, steps=46745, span_s=374.1528070566758),
    ("dynamic", 8): dict(throughput_tok_s=1186.017601290538, slot_use=0.11951116693623318, ttft_p50_s=3.4810065173111506, ttft_p99_s=14.044792436371324, e2e_p50_s=4.453172374797287, e2e_p99_s=15.45954283362883, steps=58118, span_s=374.8072537172273),
    ("continuous", 8): dict(throughput_tok_s=1200.318818565445, slot_use=0.0893194706994329, ttft_p50_s=0.007253926828096155, ttft_p99_s=0.009628398064523935, e2e_p50_s=0.4414884467452066, e2e_p99_s=4.434102422707125, steps=77763, span_s=370.3416068501495),
    ("static", 40): dict(throughput_tok_s=1299.1670704336175, slot_use=0.14858808428708953, ttft_p50_s=124.53239959752027, ttft_p99_s=263.75497892904565, e2e_p50_s=125.23196649210074, e2e_p99_s=264.4628048953225, steps=46745, span_s=342.16384490997893),
    ("dynamic", 40): dict(throughput_tok_s=1321.7394708647796, slot_use=0.15020111151958135, ttft_p50_s=122.8435038248131, ttft_p99_s=258.305953416518, e2e_p50_s=123.64650218042078, e2e_p99_s=258.9107163037544, steps=46243, span_s=336.32043969236764),
    ("continuous", 40): dict(throughput_tok_s=5709.660678176113, slot_use=0.5425943285680807, ttft_p50_s=0.009319110318116145, ttft_p99_s=0.012900251578958888, e2e_p50_s=0.5745329496339983, e2e_p99_s=5.714362521225942, steps=12801, span_s=77.85541471827),
}

# The table as the lesson prints it (rounded), for the rendered summary.
LESSON_TABLE = """\
 8     static       1188       15%     5.59s    16.03s     6.6s    17.6s
 8     dynamic      1186       12%     3.48s    14.04s     4.5s    15.5s
 8     continuous   1200        9%     0.01s     0.01s     0.4s     4.4s
 40    static       1299       15%   124.53s   263.75s   125.2s   264.5s
 40    dynamic      1322       15%   122.84s   258.31s   123.6s   258.9s
 40    continuous   5710       54%     0.01s     0.01s     0.6s     5.7s"""


@pytest.mark.parametrize("policy,rate", sorted(LESSON))
def test_run_json_reproduces_lesson(root, policy, rate):
    args = ["run", str(root / "configs/reference.yaml"), "--set", f"engine.policy={policy}",
            "--set", f"workload.rate={rate}", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    for name, expected in LESSON[policy, rate].items():
        assert got[name] == pytest.approx(expected, rel=1e-6), name
    assert got["steps"] == LESSON[policy, rate]["steps"]  # the same decisions, step for step


def test_reference_sweep_prints_the_lesson_table(root, tmp_path):
    result = CliRunner().invoke(app, ["sweep", str(root / "configs/reference.yaml"), "--workers", "1",
                                      "--quiet", "--out", str(tmp_path / "ref.nc")])
    assert result.exit_code == 0, result.output
    # the lesson's columns, then fastsim's extra TPOT p99 column
    rows = "\n".join(line[: len(LESSON_TABLE.splitlines()[0])] for line in result.stdout.splitlines()
                     if line.startswith((" 8 ", " 40 ")))
    assert rows == LESSON_TABLE
