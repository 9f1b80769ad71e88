"""Measured runs to calibrate against, read from a user's files: each a scenario (the settings it
ran with, over a base config) and the metrics measured, in fastsim's names and units.

Two formats:

- CSV: a header of dotted config keys (what each row ran: ``model.preset``, ``engine.tp``,
  ``workload.rate``, ...) and metric names (what was measured: ``ttft_mean_s``, ``e2e_mean_s``,
  ``itl_p50_s``, ...). Key cells are read as YAML scalars, as ``--set`` reads them.
- ``vllm bench serve --save-result`` JSON, read as vLLM writes it: ``request_rate`` (``"inf"``:
  every request at once), ``burstiness`` (1: Poisson arrivals, else gamma), ``max_concurrency``,
  ``num_prompts``, ``input_lens`` and ``output_lens`` (the requests' lengths, in order) and the
  measured ``mean_``/``median_``/``pNN_`` of ``ttft_ms``, ``tpot_ms``, ``itl_ms`` and ``e2el_ms``;
  hardware, model and engine come from the base config. Its means, medians, p90s and p99s (those
  fastsim reports) are calibrated against: the tails fit the engine's jitter.

Every problem is a :class:`ConfigError` naming the file, and the row and column where there are.
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..engine import checks, content as shares
from ..engine.traffic import Traffic, generate, shared
from ..model import fleet as pools
from ..model.fields import LARGEST
from ..model.loading import not_utf8, parse_override
from ..model.schema import LEAF_KEYS, Config, ConfigError
from .metrics import METRICS


ALL_AT_ONCE = "all at t=0"  # the arrival of a vllm bench run at request_rate inf, as shown


@dataclass(frozen=True)
class Measured:
    source: str  # "runs.csv row 3", "bench.json"
    # what it ran with, as shown: dotted keys over the base config (a vllm bench result at
    # request_rate inf: rate "inf" and arrival ALL_AT_ONCE, every request at t = 0)
    settings: dict[str, Any]
    config: Config  # the base config with them (checked)
    metrics: dict[str, float]  # measured, fastsim's names and units
    traffic: Traffic | None = None  # the exact requests, when the file gives their lengths


CONCURRENCY = "concurrency"  # a CSV column: closed-loop clients (workload.concurrency), as benchmarks name it


def _checked(config: Config, settings: dict[str, Any], where: str) -> Config:
    """The base ``config`` with a run's ``settings``, checked; a closed loop (``workload.concurrency``)
    replaces the base's open-loop arrivals."""
    if settings.get("workload.concurrency") is not None:
        settings = {"workload.rate": None, "workload.arrival": "poisson", "workload.burstiness": 1.0, **settings}
    try:
        run = config.with_values(settings)
        checks.check(run)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return run


def read_csv(path: Path, config: Config) -> list[Measured]:
    """One run per row of a CSV of config keys and measured metrics."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except UnicodeDecodeError as exc:
        raise ConfigError(not_utf8(path, exc)) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    except csv.Error as exc:
        raise ConfigError(f"{path}: not a CSV file ({exc})") from None
    if not rows:
        raise ConfigError(f"{path}: empty (expected a header of config keys and metric names)")
    header = [c.strip() for c in rows[0]]
    for column in header:
        if column not in LEAF_KEYS and column not in METRICS and column != CONCURRENCY:
            raise ConfigError(f"{path}: column {column!r} is neither a config key (such as workload.rate) nor a "
                              f"fastsim metric (such as ttft_mean_s; all: {', '.join(METRICS)})")
    metrics = [c for c in header if c in METRICS]
    if not metrics:
        raise ConfigError(f"{path}: no measured metric among the columns (such as ttft_mean_s, e2e_mean_s)")
    runs = []
    for line, row in enumerate(rows[1:], start=2):
        if not any(c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise ConfigError(f"{path}: row {line}: {len(row)} cells for {len(header)} columns")
        settings, measured = {}, {}
        for column, cell in zip(header, row):
            cell = cell.strip()
            if column in METRICS:
                measured[column] = _measurement(path, line, column, cell)
            elif cell:
                key = "workload.concurrency" if column == CONCURRENCY else column
                try:
                    settings[key] = parse_override(f"{key}={cell}")[1]
                except ConfigError:
                    raise ConfigError(f"{path}: row {line}, column {column}: cannot read {cell!r} (a value as "
                                      f"--set reads it: a number, a name or null)") from None
        runs.append(Measured(f"{path.name} row {line}", settings,
                             _checked(config, settings, f"{path}: row {line}"), measured))
    if not runs:
        raise ConfigError(f"{path}: no runs (a header and no rows)")
    return runs


def _measurement(path: Path, line: int, column: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{path}: row {line}, column {column}: not a number ({text!r})") from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{path}: row {line}, column {column}: {text!r} is not a positive finite measurement")
    return value


# vLLM's statistic -> fastsim's, for each vLLM metric (ms) and fastsim prefix (s)
VLLM_METRICS = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e"}
STATS = {"mean": "mean", "median": "p50", "p90": "p90", "p99": "p99"}  # the tails fit the jitter
RATES = {"output_throughput": "throughput_tok_s", "request_throughput": "request_rate_rps",
         "total_token_throughput": "total_tok_s"}  # a result's throughputs (per second)


def _in_seconds(data: dict) -> bool:
    """InferenceX's result files: vllm bench's fields with the times in seconds (``median_ttft``,
    not ``median_ttft_ms``)."""
    ms = any(f"{s}_{m}_ms" in data for s in STATS for m in VLLM_METRICS)
    return not ms and any(f"{s}_{m}" in data for s in STATS for m in VLLM_METRICS)


def _mean_length(lengths) -> float | None:
    """The mean a length distribution draws (None: a lognormal's, not worth the check)."""
    return lengths.value if lengths.dist == "fixed" else (lengths.min + lengths.max) / 2 if lengths.dist == "uniform" \
        else None


def read_vllm_json(path: Path, config: Config) -> Measured:
    """One run from a ``vllm bench serve --save-result`` JSON file (or InferenceX's: the same
    fields, times in seconds; without the requests' lengths, which the config's workload draws)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(not_utf8(path, exc)) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(data, dict) or "request_rate" not in data:
        raise ConfigError(f"{path}: not a vllm bench serve result (no request_rate)")
    clients = data.get("max_concurrency")
    if clients is not None and not (_is_number(clients) and clients == int(clients) and clients >= 1):
        raise ConfigError(f"{path}: max_concurrency {clients!r} is not a positive whole number of clients")
    rate = data["request_rate"]
    at_once = rate == "inf" or (_is_number(rate) and math.isinf(rate))
    if clients is not None and not at_once:
        raise ConfigError(f"{path}: max_concurrency {clients} with request_rate {rate}: clients that also pace their "
                          f"requests are not modelled (a closed loop sends at request_rate inf)")
    _same_model(path, data, config)
    burstiness = data.get("burstiness", 1.0)
    if not _is_number(burstiness) or not 0 < burstiness < math.inf:
        raise ConfigError(f"{path}: burstiness {burstiness!r} is not a positive number (1: Poisson arrivals)")
    seconds = _in_seconds(data)
    listed = not seconds or "input_lens" in data
    inputs, outputs = (_token_counts(path, data, key) if listed else None for key in ("input_lens", "output_lens"))
    n = data.get("num_prompts", int(inputs.size) if listed else None)
    if not _is_number(n) or not math.isfinite(n) or n != int(n):
        raise ConfigError(f"{path}: num_prompts {n!r} is not a whole number of requests")
    n = int(n)
    if listed and (inputs.size != outputs.size or inputs.size != n):
        raise ConfigError(f"{path}: {inputs.size} input_lens and {outputs.size} output_lens for num_prompts {n}")
    if n < 1:
        raise ConfigError(f"{path}: num_prompts {n}: no requests")
    measured = {}
    unit, scale = ("", 1.0) if seconds else ("_ms", 1e-3)
    fields = {f"{stat}_{vllm}{unit}": f"{ours}_{q}_s" for vllm, ours in VLLM_METRICS.items() for stat, q in STATS.items()}
    for key, name in {**fields, **RATES}.items():
        value = data.get(key)
        if value is not None and name in METRICS:
            if not _is_number(value) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"{path}: {key}: {value!r} is not a positive finite measurement")
            measured[name] = value * (scale if key in fields else 1.0)
    if not any(name.endswith("_s") for name in measured):
        raise ConfigError(f"{path}: no measured mean_ or median_ of ttft_ms, tpot_ms, itl_ms or e2el_ms")
    if not at_once and not (_is_number(rate) and rate > 0):
        raise ConfigError(f"{path}: request_rate {rate!r} is neither a positive number nor \"inf\"")
    settings = {"workload.n_requests": n, "workload.rate": 1.0 if at_once else float(rate), "workload.rng": "numpy",
                "workload.arrival": "poisson" if burstiness == 1 else "gamma", "workload.burstiness": burstiness,
                "workload.trace": None, "workload.warmup": 0}
    if listed:  # the lengths the config gets are the longest (what must fit); the requests are the file's
        settings.update({"workload.prompt.dist": "fixed", "workload.prompt.value": int(inputs.max()),
                         "workload.output.dist": "fixed", "workload.output.value": int(outputs.max()),
                         "workload.output.max": int(outputs.max())})
    if clients is not None:
        settings.update({"workload.concurrency": int(clients), "workload.rate": None, "workload.arrival": "poisson",
                         "workload.burstiness": 1.0, "workload.sessions": None})
    run = _checked(config, settings, str(path))  # the longest request must fit the KV cache
    if not listed:  # the config's lengths must be the benchmark's
        _same_lengths(path, data, run, n)
        return Measured(path.name, _shown(settings, clients, at_once, n), run, measured,
                        Traffic(np.zeros(n), *_drawn_lengths(run)) if at_once and clients is None else None)
    traffic = shared(run.workload, pools.prefix_cache(run), Traffic(np.zeros(n), inputs, outputs))
    if clients is not None:  # the first C at t = 0, each later one as a request is done
        arrival, content = shares.clients(run.workload, shares.none(n) if traffic.content is None else traffic.content)
        traffic = Traffic(arrival, inputs, outputs, content)
    elif not at_once:
        traffic = replace(traffic, arrival_s=generate(run.workload).arrival_s)
    return Measured(path.name, _shown(settings, clients, at_once, n), run, measured, traffic)


def _shown(settings: dict, clients: int | None, at_once: bool, n: int) -> dict[str, Any]:
    """What a result's run is shown as: at request_rate inf every request comes at t = 0 (the
    run's rate 1.0 only fills the key); a closed loop, its clients."""
    if clients is not None:
        return {"workload.n_requests": n, "workload.concurrency": int(clients)}
    if at_once:
        return {"workload.n_requests": n, "workload.rate": "inf", "workload.arrival": ALL_AT_ONCE}
    return {k: settings[k] for k in ("workload.n_requests", "workload.rate", "workload.arrival", "workload.burstiness")}


def _drawn_lengths(run: Config) -> tuple[np.ndarray, np.ndarray]:
    t = generate(run.workload)
    return t.prompt_tokens, t.output_tokens


def _same_lengths(path: Path, data: dict, run: Config, n: int) -> None:
    """A result without its requests' lengths is simulated with the config's: refuse a config
    whose mean lengths are not the result's (``total_input_tokens``, ``total_output_tokens``) within 10 %."""
    w = run.workload
    for key, lengths, name in (("total_input_tokens", w.prompt, "workload.prompt"),
                               ("total_output_tokens", w.output, "workload.output")):
        total, mean = data.get(key), _mean_length(lengths)
        if _is_number(total) and total > 0 and mean is not None and abs(mean / (total / n) - 1) > 0.1:
            raise ConfigError(f"{path}: {key} {total:g} is {total / n:.0f} tokens a request, but {name} draws a mean "
                              f"of {mean:g}: set {name} to the lengths the benchmark drew (e.g. value: 1024, "
                              f"range_ratio: 0.8)")


def _words(name: str) -> set[str]:
    """A model's name as words: ``meta-llama/Llama-3.1-8B-Instruct`` -> {llama, 3.1, 8b, instruct}."""
    return set(re.split(r"[-_\s]+", name.lower().rsplit("/", 1)[-1])) - {""}


def _same_model(path: Path, data: dict, config: Config) -> None:
    """Refuse a result whose ``model_id`` (or ``tokenizer_id``) names another model than the
    config's preset: every word of the preset's name (``llama-3.1-70b``) must be in the id's. A
    config without a preset has nothing to compare."""
    preset = config.model.preset
    if preset is None:
        return
    for key in ("model_id", "tokenizer_id"):
        name = data.get(key)
        if isinstance(name, str) and name and not _words(preset) <= _words(name):
            raise ConfigError(f"{path}: {key} {name!r} is not the config's model (model.preset {preset}): "
                              f"calibrate against the model measured, e.g. --set model.preset=<its preset>")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _token_counts(path: Path, data: dict, key: str) -> np.ndarray:
    """The list ``data[key]`` of token counts, each a whole number from 1 to 2^53."""
    if key not in data:
        raise ConfigError(f"{path}: no {key} (save the result with --save-detailed)")
    values = data[key]
    if not isinstance(values, list):
        raise ConfigError(f"{path}: {key} is not a list of token counts (got {type(values).__name__})")
    for j, v in enumerate(values):
        if not _is_number(v) or v != int(v) or not 1 <= v <= LARGEST:
            raise ConfigError(f"{path}: {key}[{j}] = {v!r} is not a token count (a whole number from 1 to 2^53)")
    return np.array(values, dtype=np.int64)


def read(paths: list[Path], config: Config) -> list[Measured]:
    """Every run of every file (told apart by their suffix: .json is vLLM's, else CSV)."""
    runs: list[Measured] = []
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"{path}: no such file")
        runs += [read_vllm_json(path, config)] if path.suffix.lower() == ".json" else read_csv(path, config)
    return runs


def describe(run: Measured) -> str:
    """A run's settings in a few words: each dotted key's last component, or its length's name
    for a length's value (``workload.prompt.value`` is ``prompt``)."""
    def word(key: str) -> str:
        parts = key.split(".")
        return parts[-2] if parts[-1] == "value" and len(parts) > 2 else parts[-1]

    return ", ".join(f"{word(k)} {v}" for k, v in run.settings.items()) or "the config"
