"""docs/model/deployed.md, "Hybrid attention": gpt-oss-120b (MXFP4) at 8k/1k on H100 SXM, its
sliding-window layers held as vLLM's hybrid KV cache manager holds them against the import
before (every layer full attention: model.window_layers 0). Per tp: the KV cache in tokens and
in 9,216-token requests, then at each closed-loop client count (InferenceX's set-up: prompts
and outputs uniform in [0.8, 1] x 8192 and 1024, max_num_seqs = clients) the requests running
in the mean, TPOT and output throughput per GPU. Run from the repository's root (about a
minute):

    python sweeps/hybrid-kv.py
"""
import warnings

import fastsim
from fastsim.model import cost

BASE = "configs/calibration/inferencex-gpt-oss-120b-h100.yaml"
CLIENTS = (8, 16, 32, 64, 128)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for tp in (1, 2):
        print(f"tp {tp}")
        for label, window in (("hybrid", 18), ("as full", 0)):
            c = fastsim.load_config(BASE, {"engine.tp": tp, "model.window_layers": window,
                                           "workload.prompt.value": 8192, "workload.output.value": 1024})
            blocks, fixed = cost.kv_blocks(c), cost.fixed_blocks(c)
            print(f"  {label:8} KV {blocks * 16:,} tokens, {blocks // (9216 // 16 + fixed)} requests of 9,216")
            for n in CLIENTS:
                r = fastsim.simulate(c.with_values({"workload.concurrency": n, "engine.max_batch": n,
                                                    "workload.n_requests": 10 * n, "workload.warmup": 2 * n}))
                m = r.metrics
                print(f"    {n:4} clients: running {m['mean_batch']:6.1f}, TPOT {m['tpot_mean_s'] * 1e3:6.1f} ms, "
                      f"{m['tok_s_per_gpu']:7.0f} tok/s/GPU, preemptions {int(m['preemptions'])}")
