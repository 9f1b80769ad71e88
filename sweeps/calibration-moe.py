"""docs/validation.md, "Mixtures of experts": the one calibration refitted where the v0.15.1 runs
cannot see, jointly over the v0.15.1 runs and the closed-loop InferenceX runs of gpt-oss-120b
(MXFP4, H100, tp 2-8) and MiniMax-M2.5 (NVFP4, B200, tp 1-8, and dp 2 and 4 with expert
parallelism). Every run is simulated with the
same values; only the keys named are fitted, the others stay as configs/h100.yaml has them.
Prints the fitted values and, per file and metric, the median error and median absolute error
before and after. Run from the repository's root (about two minutes):

    python sweeps/calibration-moe.py                        # fits calibration.moe_layer_overhead_us
    python sweeps/calibration-moe.py api_overhead_ms,moe_layer_overhead_us   # another choice of keys
"""
import sys
import warnings
from pathlib import Path

import numpy as np

import fastsim
from fastsim.analysis import calibrate, measured

FILES = {  # (config, measured runs)
    "v0.15.1": "configs/calibration/vllm-0.15-h100",
    "gpt-oss-120b H100": "configs/calibration/inferencex-gpt-oss-120b-h100",
    "MiniMax-M2.5 B200": "configs/calibration/inferencex-minimax-m2.5-b200",
    "MiniMax-M2.5 B200 dp": "configs/calibration/inferencex-minimax-m2.5-b200-dp",
}
keys = calibrate.fit_keys((sys.argv[1] if len(sys.argv) > 1 else "moe_layer_overhead_us").split(","))
runs, names = [], []
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # (the imports' notices)
    for name, stem in FILES.items():
        found = measured.read([Path(stem + ".csv")], fastsim.load_config(stem + ".yaml"))
        runs += found
        names += [name] * len(found)
    fit = calibrate.fit(runs, keys)
print("fitted:", ", ".join(f"{k} {v:.6g}" for k, v in fit.after.items()), f"({fit.evaluations} evaluations)")
for label, predicted in (("before", fit.predicted_before), ("after", fit.predicted_after)):
    errors: dict[tuple[str, str], list[float]] = {}
    for run, got, name in zip(runs, predicted, names):
        for metric, value in run.metrics.items():
            errors.setdefault((name, metric), []).append(got[metric] / value - 1)
    print(label)
    for (name, metric), e in errors.items():
        print(f"  {name:18} {metric:12} median {np.median(e):+6.1%}, median |error| {np.median(np.abs(e)):5.1%}")
