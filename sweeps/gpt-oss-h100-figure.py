"""The figure of docs/validation.md, "Closed-loop benchmarks": gpt-oss-120b on H100 at 1024/1024,
simulated (fastsim frontier on configs/calibration/inferencex-gpt-oss-120b-h100.yaml, written first
to /tmp/gptoss-frontier.nc) against the InferenceX runs it never saw. A measured point's
throughput per GPU comes from its means by Little's law: C clients x mean output / (TTFT + (mean
output - 1) x TPOT) / tp; its interactivity is 1 / mean TPOT. Run from the repository's root:

    fastsim frontier configs/calibration/inferencex-gpt-oss-120b-h100.yaml --out /tmp/gptoss-frontier.nc
    python sweeps/gpt-oss-h100-figure.py
"""
import csv
import matplotlib; matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import xarray as xr
ds = xr.open_dataset("/tmp/gptoss-frontier.nc")
rows = [r for r in csv.DictReader(open("configs/calibration/inferencex-gpt-oss-120b-h100.csv"))
        if r["workload.prompt.value"] == "1024" and r["workload.output.value"] == "1024"]
fig, ax = plt.subplots(figsize=(8, 5.5))
colors = {2: "tab:blue", 4: "tab:orange", 8: "tab:green"}
for tp in (2, 4, 8):
    p = ds.sel(tp=tp)
    ax.plot(p.interactivity_tok_s, p.tok_s_per_gpu, "-o", color=colors[tp], ms=4, label=f"tp {tp}, simulated")
    m = [r for r in rows if int(r["engine.tp"]) == tp]
    out = 0.9 * 1024  # outputs uniform in [0.8, 1] x 1024: mean 0.9 x 1024
    x = [1 / float(r["tpot_mean_s"]) for r in m]
    e2e = [float(r["ttft_mean_s"]) + (out - 1) * float(r["tpot_mean_s"]) for r in m]
    y = [int(r["concurrency"]) * out / e / tp for r, e in zip(m, e2e)]
    ax.plot(x, y, "--s", color=colors[tp], ms=4, alpha=0.7, label=f"tp {tp}, measured (InferenceX)")
ax.set_xlabel("output tokens per second a user sees: 1 / mean TPOT (tokens/s/user)")
ax.set_ylabel("output tokens per second per GPU (tokens/s/GPU)")
ax.set_title("gpt-oss-120b on H100 SXM, 1024/1024, 4 to 64 clients", fontsize="medium")
ax.grid(True, alpha=0.3); ax.legend(fontsize="small")
fig.tight_layout(); fig.savefig("docs/gpt-oss-h100-frontier.png", dpi=100)
