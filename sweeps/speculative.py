"""docs/model/deployed.md, "Speculative decoding": DeepSeek-R1 (FP8) on 8 H200s and on 8 B200s
(tp 8), served with its multi-token-prediction layer proposing 1 to 3 tokens at an acceptance of
0.6 and 0.9 per position, against no speculation. InferenceX's set-up: prompts and outputs
uniform in [0.8, 1] x 1,024 tokens, closed-loop clients, max_num_seqs as many, the first 2 x
clients requests a warm-up; the shipped calibration (configs/h100.yaml). Per GPU and client
count: TPOT (mean) and output throughput per GPU of each setting. Run from the repository's
root (a few minutes):

    python sweeps/speculative.py
"""
import warnings

import fastsim

CLIENTS = (1, 4, 16, 64, 256, 1024)
SETTINGS = [None] + [(k, a) for a in (0.6, 0.9) for k in (1, 2, 3)]

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for gpu in ("h200", "b200"):
        base = fastsim.load_config("configs/h100.yaml", {
            "hardware.preset": gpu, "model.preset": "deepseek-r1", "engine.tp": 8, "engine.prefix_caching": False,
            "workload.prompt": {"dist": "uniform", "min": 820, "max": 1024},
            "workload.output": {"dist": "uniform", "min": 820, "max": 1024}, "slo.ttft_s": None, "slo.tpot_s": None})
        print(f"{gpu}: TPOT ms / output tok/s per GPU")
        print("  clients  " + "  ".join(f"{'none' if s is None else f'k{s[0]} a{s[1]}':>13}" for s in SETTINGS))
        for n in CLIENTS:
            cells = []
            for s in SETTINGS:
                spec = None if s is None else {"method": "mtp", "tokens": s[0], "acceptance": s[1]}
                r = fastsim.simulate(base.with_values({
                    "engine.speculative": spec, "workload.concurrency": n, "engine.max_batch": n, "workload.rate": None,
                    "workload.n_requests": 12 * n, "workload.warmup": 2 * n}))
                m = r.metrics
                cells.append(f"{m['tpot_mean_s'] * 1e3:5.1f} / {m['tok_s_per_gpu']:5.0f}")
            print(f"  {n:7}  " + "  ".join(f"{c:>13}" for c in cells))
