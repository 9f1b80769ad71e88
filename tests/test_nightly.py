"""The nightly regression: the study, run now, matches the committed baseline (fastsim compare
--drift: a prediction that moved either way fails, as the nightly job of docs/outputs.md does)."""

from typer.testing import CliRunner

from fastsim.cli import app


def test_nightly_study_matches_the_committed_baseline(root, tmp_path):
    out = tmp_path / "nightly.nc"
    run = CliRunner().invoke(app, ["sweep", str(root / "sweeps/nightly.yaml"), "--quiet", "--out", str(out)])
    assert run.exit_code == 0, run.output
    result = CliRunner().invoke(app, ["compare", str(root / "results/nightly-baseline.nc"), str(out), "--drift", "--rtol", "0.02"])
    assert result.exit_code == 0, result.output
