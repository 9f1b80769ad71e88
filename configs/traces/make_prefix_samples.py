"""Write the two synthetic chat traces with prefix information that configs/chat-traces.yaml
replays (run from anywhere: ``python configs/traces/make_prefix_samples.py``; seeded, so the
files are reproduced byte for byte).

The same conversations in both formats: 8 system prompts of 1,024 tokens (Zipf popularity),
sessions starting at 2 per second (Poisson) with 1 to 8 turns, each turn re-sending the
conversation so far plus a new message, 20 s of thinking between turns, as recorded (open loop):

- ``chat-sample.jsonl``: JSON lines in the Mooncake format: ``timestamp`` (ms),
  ``input_length``, ``output_length``, ``hash_ids`` (one id per 512 prompt tokens; equal ids at a
  position mean equal tokens up to its end);
- ``chat-sample.csv``: ``chat_id,parent_chat_id,timestamp,input_length,output_length`` (seconds),
  each turn's parent the turn before it (the system prompt is not visible in this format).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SESSIONS, SYSTEM, SYSTEM_TOKENS, HASH_BLOCK = 400, 8, 1024, 512


def conversations(seed: int = 2026) -> list[dict]:
    rng = np.random.default_rng(seed)
    weights = 1 / np.arange(1, SYSTEM + 1)
    rows, t = [], 0.0
    for s in range(SESSIONS):
        t += rng.exponential(0.5)
        system = int(rng.choice(SYSTEM, p=weights / weights.sum()))
        at, parent = t, None
        for turn in range(int(rng.integers(1, 9))):
            message = int(np.clip(rng.lognormal(5.5, 0.8), 16, 3000))
            prompt = SYSTEM_TOKENS + message if parent is None else parent["input_length"] + parent["output_length"] + message
            if prompt > 16000:
                break
            row = {"chat_id": f"{s}-{turn}", "parent": parent, "system": system, "timestamp": at,
                   "input_length": prompt, "output_length": int(np.clip(rng.lognormal(5.0, 0.7), 1, 1500))}
            rows.append(row)
            parent = row
            at += 20.0 + row["output_length"] * 0.02  # the reply streams, then the user thinks
    return sorted(rows, key=lambda r: r["timestamp"])


def hash_ids(rows: list[dict]) -> None:
    """Each row's prefix-hash ids: a hash block's id names every token up to its end."""
    ids: dict[tuple, int] = {}
    for row in rows:
        count = -(-row["input_length"] // HASH_BLOCK)
        parent = row["parent"]
        shared = parent["input_length"] + parent["output_length"] if parent else SYSTEM_TOKENS
        out = []
        for i in range(count):
            end = (i + 1) * HASH_BLOCK
            if parent and end <= parent["input_length"]:
                out.append(parent["hash_ids"][i])
            elif parent and end <= shared:  # the parent's reply: the same for every child of it
                out.append(ids.setdefault(("reply", parent["chat_id"], i), len(ids)))
            elif end <= SYSTEM_TOKENS:
                out.append(ids.setdefault(("system", row["system"], i), len(ids)))
            else:
                out.append(ids.setdefault(("own", row["chat_id"], i), len(ids)))
        row["hash_ids"] = out


def main() -> None:
    rows = conversations()
    hash_ids(rows)
    t0 = rows[0]["timestamp"]
    with open(HERE / "chat-sample.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps({"timestamp": round((r["timestamp"] - t0) * 1000), "input_length": r["input_length"],
                                "output_length": r["output_length"], "hash_ids": r["hash_ids"]}) + "\n")
    with open(HERE / "chat-sample.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["chat_id", "parent_chat_id", "timestamp", "input_length", "output_length"])
        for r in rows:
            w.writerow([r["chat_id"], r["parent"]["chat_id"] if r["parent"] else "", f"{r['timestamp'] - t0:.3f}",
                        r["input_length"], r["output_length"]])


if __name__ == "__main__":
    main()
