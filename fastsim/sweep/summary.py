"""Human-readable summaries of a sweep's metrics table: plain rows of strings for the CLI.

A small grid is shown whole, one row per point, with the lesson's columns, TPOT p99 and ITL
p99 (and preemptions and KV cache peak use when some point has them). A load sweep (three rates
or more) is shown per setting (the other axes), at the highest rate it sustains. Else, a large
one is shown compactly: per policy, the point with the best throughput. With a ``seed`` axis, every figure is
the mean across seeds with the half-width of its 95 % confidence interval (Student's t).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis.metrics import METRICS
from ..analysis import capacity, plan
from ..model import fleet as pools
from ..model.schema import Config, dim_name
from .grid import Grid, axis_label

METRIC_INDEX = {name: k for k, name in enumerate(METRICS)}
FULL_TABLE_MAX_ROWS = 40
# Without an SLO, a rate is sustained when the median request waits under a second for its first
# token: past saturation the queue, and so the median wait, grows for the whole run (minutes, not
# seconds). With one, when 90 % of requests meet it (fastsim capacity's default rule).
SUSTAINED_TTFT_P50_S = 1.0
SUSTAINED_ATTAINMENT = 0.9

def _shown(*names: str) -> list[tuple[str, str, float, str]]:
    """(metric, header, scale, format) of each, as the metrics catalog declares them."""
    return [(name, METRICS[name].header, METRICS[name].scale, METRICS[name].fmt) for name in names]


COLUMNS = _shown("throughput_tok_s", "slot_use", "ttft_p50_s", "ttft_p99_s", "e2e_p50_s", "e2e_p99_s", "tpot_p99_s",
                 "itl_p99_s")
# Shown only when some point has them: preemptions, KV cache use with a limited cache, prefix
# cache hits.
OPTIONAL_COLUMNS = _shown("preemptions", "kv_peak_use", "prefix_hit_rate", "slo_attainment", "gpus", "usd_per_mtok")


def columns(table: np.ndarray) -> list[tuple]:
    """The summary's metric columns for a metrics table (the last axis indexes METRICS): the
    optional ones where some point has them (preemptions, a limited KV cache, prefix cache hits,
    an SLO, a price), GPUs where they vary."""
    def column(name: str) -> np.ndarray:
        return table[..., METRIC_INDEX[name]]

    gpus = column("gpus")
    shown = {"preemptions": bool((column("preemptions") > 0).any()),
             "prefix_hit_rate": bool((column("prefix_hit_rate") > 0).any()),  # (NaN > 0 is False)
             "gpus": bool(np.nanmax(gpus) > np.nanmin(gpus)) if np.isfinite(gpus).any() else False}
    for name in ("kv_peak_use", "slo_attainment", "usd_per_mtok"):
        shown[name] = bool(np.isfinite(column(name)).any())
    return COLUMNS + [c for c in OPTIONAL_COLUMNS if shown[c[0]]]


# Two-sided 95 % Student t quantiles for 1..30 degrees of freedom; beyond, the normal 1.96.
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042]


def t95(dof: int) -> float:
    return _T95[dof - 1] if dof <= len(_T95) else 1.96


def mean_ci(values: np.ndarray) -> tuple[float, float]:
    """Mean and 95 % confidence half-width of independent replications (NaN half-width if one)."""
    values = np.asarray(values, dtype=float)
    n = values.size
    mean = float(values.mean())
    if n < 2:
        return mean, math.nan
    return mean, t95(n - 1) * float(values.std(ddof=1)) / math.sqrt(n)


def _cell(samples: np.ndarray, column: tuple) -> str:
    """One figure: a metric over the seeds of one point (a single value without a seed axis)."""
    name, _, scale, fmt = column
    values = samples[:, METRIC_INDEX[name]] * scale
    if np.isnan(values).all():
        return "-"  # not defined at this point (no KV limit, no prefix cache, no SLO, no price)
    if values.size == 1:
        return fmt.format(float(values[0]))
    mean, half = mean_ci(values)
    return fmt.format(mean) if math.isnan(half) else f"{fmt.format(mean)} ± {fmt.format(half)}"


def describe(config: Config, n_requests: int) -> str:
    """One line naming what a run simulated: model, GPU, tp, fleet, engine limits and traffic."""
    from ..model.cost import fixed_blocks, kv_blocks

    h, m, e, w, f = config.hardware, config.model, config.engine, config.workload, config.fleet
    model = m.preset or f"a {m.weight_gb:g} GB model"
    gpu = h.preset or f"a {h.mem_bandwidth_tb_s:g} TB/s GPU"
    blocks = kv_blocks(config)
    kv = "KV unlimited" if blocks is None else f"KV {blocks * e.block_tokens:,} tokens"
    if m.hybrid:  # hybrid attention: what a request holds beyond its tokens
        held = [f"{m.window_layers} layers' {m.window_tokens:,}-token {m.window_kind} windows"] if m.window_layers else []
        held += [f"{m.linear_layers} linear-attention layers' states"] if m.linear_layers else []
        kv += f" of full attention + {fixed_blocks(config)} blocks a request for " if blocks is not None else " for "
        kv += " and ".join(held)
    if m.sparse_topk is not None:
        kv += f", sparse attention (top {m.sparse_topk:,} tokens)"
    budget = "" if e.max_batched_tokens is None else f", budget {e.max_batched_tokens:,} tokens"
    ranks = f" on each of {e.dp} ranks" if e.dp > 1 else ""
    engine = f"{e.policy} batching{ranks}, max_batch {e.max_batch}, limit {e.limit}{budget}, {kv}"
    if e.speculative is not None:
        s = e.speculative
        engine += (f", speculative decoding ({s.method}, {s.tokens} tokens, acceptance for a mean accepted length of "
                   f"{s.mean_accepted_length():.2f})")
    if pools.prefix_cache(config):
        engine += ", prefix cache"
    if f.replicas > 1 or f.prefill_replicas:
        pool = f"{f.prefill_replicas} prefill + {f.replicas} decode replicas" if f.prefill_replicas else (
            f"{f.replicas} replicas")
        engine += f"; {pool} ({f.router})"
    if w.trace is not None:
        rate = "as recorded" if w.rate is None else f"rescaled to {w.rate:g}/s"
        traffic = f"{n_requests:,} requests of {Path(w.trace).name}, {rate}"
    elif w.sessions is not None and w.concurrency is not None:
        traffic = (f"{n_requests:,} turns of sessions from {w.concurrency:,} closed-loop clients, a session each at "
                   f"a time ({w.rng} traffic, seed {w.seed})")
    elif w.sessions is not None:
        traffic = f"{n_requests:,} turns of sessions starting at {w.rate:g}/s ({w.rng} traffic, seed {w.seed})"
    elif w.concurrency is not None:
        think = "" if w.think_s is None else ", with think time"
        traffic = f"{n_requests:,} requests from {w.concurrency:,} closed-loop clients{think} ({w.rng} traffic, seed {w.seed})"
    else:
        traffic = f"{n_requests:,} requests at {w.rate:g}/s ({w.rng} traffic, seed {w.seed})"
    return f"{model} on {gpu}, {layout(config)}: {engine}: {traffic}"


def layout(config: Config) -> str:
    """A replica's GPUs in words: ``tp 8``, ``tp 16 over 2 scale-up domains of 8``, ``dp 4 x tp
    1``, with ``, expert parallel over N GPUs`` where the experts are spread."""
    from ..model.cost import domains, exchange_domains

    e = config.engine
    span = domains(config)
    text = (f"dp {e.dp} x " if e.dp > 1 else "") + f"tp {e.tp}" + (
        f" over {span} scale-up domains of {e.tp // span}" if span > 1 else "")
    gpus, span = e.dp * e.tp, exchange_domains(config)
    spread = f" in {span} scale-up domains of {gpus // span}" if e.dp > 1 and span > 1 else ""
    return text + (f", expert parallel over {gpus} GPUs{spread}" if e.expert_parallel else "")


def _sustained(config: Config, table: np.ndarray) -> tuple[np.ndarray, str]:
    """Which points sustain their load (shape: the table's but its seed and metric axes), and
    the rule, in words: the config's SLO met by 90 % of requests, or without one a median TTFT
    under a second."""
    slo = {k: v for k, v in config.slo.model_dump().items() if v is not None}
    if slo:
        met = table[..., METRIC_INDEX["slo_attainment"]].mean(axis=-1) >= SUSTAINED_ATTAINMENT
        bounds = ", ".join(f"{k.removesuffix('_s').upper()} <= {v:g} s" for k, v in slo.items())
        return met, f"{SUSTAINED_ATTAINMENT:.0%} of requests meet the slo: {bounds}"
    waited = table[..., METRIC_INDEX["ttft_p50_s"]].mean(axis=-1) <= SUSTAINED_TTFT_P50_S
    return waited, f"TTFT p50 <= {SUSTAINED_TTFT_P50_S:g} s; no slo in the config"


def unsteady(table: np.ndarray) -> str | None:
    """A line about the points whose measured window drifts (``steady`` 0), or None."""
    flags = table[..., METRIC_INDEX["steady"]]
    count, total = int((flags == 0).sum()), flags.size
    if not count:
        return None
    return (f"notice: not steady: {count} of {total} point{'s' * (total != 1)} (the dataset's steady variable says "
            "which): their TTFT median or prefix-cache hit rate drifts across the measured window, so their figures "
            "describe a run still changing (a queue growing, a cache filling); run more requests, or leave the "
            "start out with workload.warmup")


def next_steps(config_file: Path, result: Path, config: Config) -> str:
    """The line after a sweep: what to ask next of the config and of its result (not the plan of
    a grid that sweeps fleet.replicas, which the plan refuses: it chooses them)."""
    has_slo = any(v is not None for v in config.slo.model_dump().values())
    target = "" if has_slo else " --target 'ttft_p99_s<=0.5'"
    plan = "" if "fleet.replicas" in config.sweep else f"fastsim plan {config_file}{target} (the cheapest fleet), "
    return (f"next: fastsim capacity {config_file}{target} (the highest rate per setting), {plan}"
            f"fastsim plot {result} (a figure)")


def summarize(grid: Grid, table: np.ndarray) -> tuple[str, list[str], list[list[str]], int]:
    """(title, column headers, rows, number of leading label columns) describing a sweep's
    metrics ``table``, which has shape (*axis lengths, len(METRICS)) with axes in the order of
    ``grid.keys``."""
    axes = {dim_name(key): values for key, values in zip(grid.keys, grid.axes)}
    dims = [d for d in axes if d != "seed"]
    if "seed" in axes:  # seeds become the second-to-last axis: (*dims, seed, metric)
        table = np.moveaxis(table, list(axes).index("seed"), -2)
    else:
        table = table[..., np.newaxis, :]
    n_seeds = table.shape[-2]
    suffix = f" (mean ± 95% CI over {n_seeds} seeds)" if n_seeds > 1 else ""
    shown = columns(table)
    headers = [h for _, h, _, _ in shown]
    shape = table.shape[:-2]
    n_rows = math.prod(shape)

    def row(index: tuple[int, ...], skip: str | None = None) -> list[str]:
        labels = [axis_label(axes[d][i]) for d, i in zip(dims, index) if d != skip]
        return labels + [_cell(table[index], c) for c in shown]

    load_sweep = "rate" in dims and len(axes["rate"]) >= 3 and n_rows // len(axes["rate"]) <= FULL_TABLE_MAX_ROWS
    if n_rows <= FULL_TABLE_MAX_ROWS and not load_sweep:
        rows = [row(index) for index in np.ndindex(*shape)]
        return f"{n_rows} grid point{'s' * (n_rows != 1)}{suffix}", dims + headers, rows, len(dims)
    if load_sweep:
        # Per setting, the highest rate it sustains: completions keep up with arrivals.
        r = dims.index("rate")
        kept, rule = _sustained(grid.base, table)
        kept = np.moveaxis(kept, r, -1)
        settings = [d for d in dims if d != "rate"]
        rows = []
        for index in np.ndindex(*kept.shape[:-1]):
            ok = np.flatnonzero(kept[index])
            labels = [axis_label(axes[d][i]) for d, i in zip(settings, index)]
            if ok.size == 0:
                rows.append(labels + [f"< {axis_label(axes['rate'][0])}"] + [""] * len(headers))
                continue
            best = ok[-1]
            full = index[:r] + (best,) + index[r:]
            sustained = axis_label(axes["rate"][best]) + ("+" if best == len(axes["rate"]) - 1 else "")
            rows.append(labels + [sustained] + [_cell(table[full], c) for c in shown])
        title = f"{n_rows} grid points: per setting, the highest rate it sustains ({rule}; + = the grid's highest){suffix}"
        return title, settings + ["max rate"] + headers, rows, len(settings) + 1
    # Compact: per policy (or overall), the point with the best mean throughput.
    throughput = table[..., METRIC_INDEX["throughput_tok_s"]].mean(axis=-1)
    p = dims.index("policy") if "policy" in dims else None
    rows = []
    for k, policy in enumerate(axes["policy"] if p is not None else [None]):
        sub = throughput if p is None else np.take(throughput, [k], axis=p)
        index = np.unravel_index(int(np.nanargmax(sub)), sub.shape)
        if p is not None:
            index = index[:p] + (k,) + index[p + 1 :]
        rows.append([str(policy or "all")] + row(index, skip="policy"))
    title = f"{n_rows} grid points: best throughput per policy{suffix}"
    labels = ["policy"] + [d for d in dims if d != "policy"]
    return title, labels + headers, rows, len(labels)


def capacity_rows(grid: Grid, answers: list[capacity.Answer], targets) -> tuple[str, list[str], list[list[str]], int]:
    """(title, headers, rows, label columns) for a capacity search, one answer per setting in C
    order: per setting, the highest rate meeting every target, the goodput there, the
    latencies, and the target that binds."""
    dims = [dim_name(key) for key in grid.keys]
    rows = []
    for index, a in zip(np.ndindex(*grid.shape), answers):
        labels = [axis_label(grid.axes[j][i]) for j, i in enumerate(index)]
        rate = "none" if a.status == "lowest rate fails" else capacity.rate_text(a.max_rate)
        rate = f">= {rate}" if a.status == "bound not reached" else rate
        m = a.metrics
        rows.append(labels + [rate, f"{m['goodput_rps']:.3g}", f"{m['ttft_p99_s']:.2f}s",
                              f"{m['tpot_p99_s'] * 1e3:.1f}ms", f"{m['e2e_p99_s']:.1f}s", a.binding])
    names = [str(t) for t in targets]
    unit = "sessions/s" if grid.base.workload.sessions is not None else "requests/s"  # workload.rate's
    title = f"capacity: the highest rate ({unit}, to 1 %) meeting {' and '.join(names)}"
    return title, dims + ["max rate", "goodput", "TTFT p99", "TPOT p99", "e2e p99", "binding"], rows, len(dims)


def _finite(x: float) -> float | None:
    return None if math.isnan(x) else x


def plan_entries(grid: Grid, answers: list[plan.Answer]) -> list[dict[str, Any]]:
    """A plan's candidates cheapest first, as ``fastsim plan --json`` prints them: settings
    (dotted key: value), replicas (None when the targets never hold), gpus, USD per hour and per
    million tokens, every metric at the answer (NaN as None) and what binds."""
    entries = []
    for i in plan.ranking(answers):
        a = answers[i]
        metrics = {name: _finite(float(v)) for name, v in a.metrics.items()}
        met = a.status == plan.MET
        settings = {key: values[j] for key, values, j in zip(grid.keys, grid.axes, grid.indices(int(i)))}
        entry = {"settings": settings, "replicas": a.replicas, "gpus": int(metrics["gpus"]) if met else None,
                 "usd_per_hour": metrics["usd_per_hour"], "usd_per_mtok": metrics["usd_per_mtok"],
                 "metrics": metrics, "binding": a.says}
        if a.prefill_replicas is not None:
            entry["prefill_replicas"] = a.prefill_replicas
        entries.append(entry)
    return entries


# Axes that name what a candidate runs on: the compact plan shows the best candidate of each of their values.
HARDWARE_AXES = ("hardware.preset", "model.preset", "fleet.prefill_hardware")
TOP = 10  # candidates the compact plan shows when the grid has no such axis


def plan_rows(grid: Grid, answers: list[plan.Answer], targets, max_replicas: int, every: bool = False
              ) -> tuple[str, list[str], list[tuple[str, list[list[str]]]], list[str]]:
    """(title, headers, groups, notes) for a plan (one answer per candidate, in C order),
    cheapest first: per candidate a heading (its rank, settings and what binds) over one row of
    figures. By default only the best candidate per GPU and model (the hardware and model axes'
    values; the top ten when the grid has none), ``every``: all of them. Candidates that cannot
    run are grouped by reason in the notes."""
    kinds = [j for j, key in enumerate(grid.keys) if key in HARDWARE_AXES]
    sized = any(a.prefill_replicas is not None for a in answers)  # a column for the prefill pools the plan sized
    groups, seen, cannot = [], set(), {}
    for rank, i in enumerate(plan.ranking(answers), start=1):
        a, idx = answers[i], grid.indices(int(i))
        if a.status == plan.CANNOT_RUN:
            cannot.setdefault(a.binding, []).append(rank)
            continue
        kind = tuple(idx[j] for j in kinds)
        if not every and (kind in seen if kinds else len(groups) >= TOP):
            continue
        seen.add(kind)
        settings = ", ".join(f"{_setting(key)} {axis_label(grid.axes[j][v])}" for j, (key, v) in enumerate(zip(grid.keys, idx)))
        heading = f"{rank}. {settings or 'the config'}: {a.says or 'one replica meets them'}"
        prefill = [f"{'' if a.prefill_replicas is None else a.prefill_replicas}"] if sized else []
        if a.status != plan.MET:
            groups.append((heading, [[f"> {max_replicas}", *prefill, "", "", "", "", "", ""]]))
            continue
        m = a.metrics
        attainment = m["slo_attainment"]
        groups.append((heading, [[f"{a.replicas}", *prefill, f"{m['gpus']:.0f}", _money(m["usd_per_hour"]),
                                  _money(m["usd_per_mtok"]), f"{m['ttft_p99_s']:.2f}s",
                                  f"{m['tpot_p99_s'] * 1e3:.1f}ms",
                                  "" if math.isnan(attainment) else f"{attainment * 100:.1f}%"]]))
    notes = [f"{len(ranks)} candidate{'s' if len(ranks) > 1 else ''} cannot run ({_ranks(ranks)}): {reason}"
             for reason, ranks in cannot.items()]
    runnable = len(answers) - sum(len(r) for r in cannot.values())
    if len(groups) < runnable:
        per = "per " + " and ".join(_setting(grid.keys[j]) for j in kinds) if kinds else f"the top {TOP}"
        notes.append(f"{len(groups)} of {runnable} candidates shown, the best {per}; --all lists every one")
    names = [str(t) for t in targets]
    title = (f"plan: per candidate, the fewest replicas (up to {max_replicas}) meeting {' and '.join(names)}; "
             "cheapest first; what binds follows each candidate (it fails with one replica fewer)")
    headers = ["replicas", *(["prefill"] if sized else []), "GPUs", "$/hour", "$/Mtok", "TTFT p99", "TPOT p99",
               "SLO met"]
    return title, headers, groups, notes


def _setting(key: str) -> str:
    """A candidate's axis in a few letters: its key's last part, or its section for a preset."""
    section, _, leaf = key.rpartition(".")
    if leaf == "config_json":
        return "model"
    return {"hardware": "GPU", "model": "model", "fleet": "prefill GPU"}[section] if leaf.endswith(
        ("preset", "hardware")) else leaf


def _ranks(ranks: list[int]) -> str:
    """``[3, 4, 5, 9]`` -> ``'ranks 3-5, 9'``."""
    runs, start = [], ranks[0]
    for prev, cur in zip(ranks, [*ranks[1:], None]):
        if cur != prev + 1:
            runs.append(f"{start}-{prev}" if prev > start else f"{start}")
            start = cur
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(runs)


def _money(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:,.2f}"


def frontier_rows(grid: Grid, table: np.ndarray, on: np.ndarray) -> tuple[str, list[str], list[list[str]], int]:
    """(title, headers, rows, label columns) of a frontier run (:mod:`fastsim.analysis.frontier`):
    every candidate's points by clients, ``*`` marking those on the frontier ``on``."""
    dims = [dim_name(key) for key in grid.keys]
    rows = []
    for index in np.ndindex(*table.shape[:-1]):
        m = table[index]
        labels = [axis_label(grid.axes[j][i]) for j, i in enumerate(index)]
        rows.append(labels + [f"{m[METRIC_INDEX['tok_s_per_gpu']]:.0f}", f"{m[METRIC_INDEX['interactivity_tok_s']]:.1f}",
                              f"{m[METRIC_INDEX['ttft_p99_s']]:.2f}s", _money(m[METRIC_INDEX['usd_per_mtok']]),
                              "*" if on[index] else ""])
    title = f"frontier: {int(on.sum())} of {on.size} points (C clients; *: none has more tok/s/GPU and tok/s/user)"
    dims = ["C" if d == "concurrency" else d for d in dims]
    return title, dims + ["tok/s/GPU", "tok/s/user", "TTFT p99", "$/Mtok", "*"], rows, len(dims)
