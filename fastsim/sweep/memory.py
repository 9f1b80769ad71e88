"""How much memory a run or a sweep needs, estimated before anything is allocated.

The estimate is an upper bound built from what a run allocates at its peak, per request: the
traffic (arrival, prompt, output), what generating it allocates on the way, the kernel's
per-request state (first token, done, calendar links and due steps, token counters: kept in the
thread's scratch between runs), the record of step runs (room for three a request, 32 bytes
each: the per-step records the inter-token latencies come from), the metrics' latency arrays,
and a fleet's outcomes per pool: so it depends on how the fleet runs (:func:`fastsim.model.fleet.kind`).
Per replica, a coupled pool keeps a completion calendar of up to ``engine.kernels.RING_MAX``
buckets (one engine's calendar is bounded the same way), so no token count drives memory: the
inter-token latency quantiles are selected from the step runs without listing every step.
tests/sweep/test_memory.py measures the peak against the estimate for every kind.
"""

from __future__ import annotations

import re

from ..analysis.batch import GROUP_REQUESTS, MAX_REQUESTS
from ..engine import paths
from ..engine.kernels import RING_MAX
from ..model import fleet
from ..model.cost import kv_blocks
from ..model.schema import Config, ConfigError
from .grid import Grid

# Peak bytes a request, by how the fleet runs: the growth of resident memory over one run whose
# scratch is allocated for it (as a command's run, or a worker's first point), 100 k to 2 M
# requests, at most: one engine 299 (continuous, serving model; 145 the lesson's),
# replicas apart 309, a coupled pool 298, disaggregated 468, the prefix cache's loop 460
# (sessions behind a prefill pool); some 15 % is added.
BYTES_PER_REQUEST = {"one": 336, "apart": 352, "pool": 352, "disaggregated": 512, "cached": 512}
# Static and dynamic batching (one engine, or replicas apart: all they run on): at most 131
# (one engine, 500 k requests; 175 counting the fixed part at 100 k) and 170 (4 replicas).
BYTES_PER_REQUEST_STATIC = {"one": 160, "apart": 208}
BYTES_PER_BLOCK = 5 * 8 + 4 * 16  # the prefix cache's arrays per block, and its table (up to 4 slots a block)
BYTES_PER_RUN = 8 << 20  # calendar (512 KiB at most), small arrays, a thread's start: 2 to 7 MB measured
# A sweep's points of up to analysis.batch.MAX_REQUESTS requests run many to a compiled call,
# which holds the traffic of up to GROUP_REQUESTS requests twice (each point's, and joined) and
# their times: 64 bytes each (measured: 18 MB a worker, with the fixed part).
BYTES_PER_GROUPED_REQUEST = 3 * 8 + 3 * 8 + 2 * 8
BYTES_PER_REPLICA = 512  # a pool's per-replica state, beside its calendar (8 bytes a bucket)
BYTES_PER_POINT = 4 * 8  # per metric of a sweep's table: the table, a checkpoint copy, output


def available_bytes() -> int:
    """Memory the system can give without swapping (Linux ``MemAvailable``; its equivalent on
    macOS and Windows)."""
    import psutil

    return psutil.virtual_memory().available


_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_size(text: str) -> int:
    """``"8GB"``, ``"500M"``, ``"16GiB"``, ``"2e9"`` -> bytes; errors name ``--max-memory``."""
    m = re.fullmatch(r"\s*((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?)\s*([kmgt]i?)?b?\s*", text.lower())
    size = float(m.group(1)) * _UNITS[m.group(2) or ""] if m else 0.0
    if not 0 < size < 2**63:  # also infinity
        raise ConfigError(f"--max-memory: expected a size such as 8GB, 500MB or 16GiB, below 9.2e18 bytes "
                          f"(got {text!r})")
    return int(size)


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.0f} {unit}" if n >= 10 * scale else f"{n / scale:.1f} {unit}"
    return f"{n:.0f} bytes"


def requests(config: Config) -> int:
    """How many requests ``config`` simulates (a trace's length when n_requests is null)."""
    w = config.workload
    if w.n_requests is not None:
        return w.n_requests
    from ..engine.trace import load

    return len(load(w.trace))


def run_bytes(config: Config) -> int:
    """Peak bytes of simulating ``config`` once (traffic, kernel, metrics; a trace is read once
    per process and its 32 bytes a request are counted among them)."""
    per_request = BYTES_PER_REQUEST if config.engine.policy == "continuous" else BYTES_PER_REQUEST_STATIC
    return requests(config) * per_request[_kind(config)] + BYTES_PER_RUN + replica_bytes(config)


# The axes that change what a run needs beside its requests: the policy, how the fleet runs,
# its pools, the prefix cache and what requests share, the KV cache, the longest output.
KEYS = ("engine", "fleet", "hardware", "model", "workload.sessions", "workload.system_prompts",
        "workload.prefix_tokens", "workload.output")


def largest(grid: Grid) -> Config:
    """The point of ``grid`` that needs the most memory: the most requests any point simulates,
    on the combination of the :data:`KEYS` axes whose run needs most (as many as the checks that
    span sections read)."""
    most = {"workload.n_requests": grid.max_requests, "workload.trace": None}
    return max((grid.config_at(idx).at(most) for idx in grid.combinations(KEYS)), key=run_bytes)


def point_bytes(config: Config) -> int:
    """Peak bytes of a sweep's worker running points like ``config``: its run, or for small
    points the compiled call that runs many (:mod:`fastsim.analysis.batch`)."""
    grouped = BYTES_PER_RUN + GROUP_REQUESTS * BYTES_PER_GROUPED_REQUEST if requests(config) <= MAX_REQUESTS else 0
    return max(run_bytes(config), grouped)


def _kind(config: Config) -> str:
    """How the run goes, for its memory: its path (:func:`fastsim.engine.paths.of`; what a trace
    shares is known once it is read: it counts as shared): ``cached`` where the replicas run the
    prefix cache's loop (or both pools do), else ``one``, ``apart``, ``pool`` or ``disaggregated``."""
    path = paths.of(config)
    if path.shares:
        return "cached"
    if path.fleet == "disaggregated":
        return path.fleet
    if config.fleet.replicas == 1 and config.engine.dp == 1:
        return "one"
    return "apart" if path.loop == paths.ENGINE else "pool"  # (data-parallel ranks: a pool of them)


def replica_bytes(config: Config) -> int:
    """Bytes of a run's per-replica state (0 for one engine): a coupled pool's calendars, one a
    data-parallel rank."""
    how, w = _kind(config), config.workload
    if how == "one":
        return 0
    ring = RING_MAX if w.trace is not None else min(w.max_output + 1, RING_MAX)
    stride = (ring + 63) // 64 * 64  # buckets, 8 bytes each, and the bitmap over them: a bit each
    calendar = stride * 8 + stride // 8 if how in ("pool", "disaggregated") else 0
    if how == "cached":  # its cache in place of a calendar, and the blocks its running requests hit
        calendar = (kv_blocks(config) or 0) * BYTES_PER_BLOCK
    prefill = config.fleet.replicas if fleet.sized_by_plan(config) else config.fleet.prefill_replicas  # as many, at a guess
    return (config.fleet.replicas * config.engine.dp + prefill) * (BYTES_PER_REPLICA + calendar)


def check(config: Config, concurrent_runs: int = 1, points: int = 0, limit: int | None = None) -> None:
    """Refuse (``ConfigError`` naming the key that drives the size) when ``concurrent_runs``
    simulations of ``config`` plus a sweep table of ``points`` points need more than ``limit``
    bytes (default: what the system has available). With ``points``, the runs are a sweep's
    (:func:`point_bytes`)."""
    from ..analysis.metrics import METRICS

    allowed = "allowed" if limit is not None else "available"
    limit = available_bytes() if limit is None else limit
    each = point_bytes(config) if points else run_bytes(config)
    runs = concurrent_runs * each
    table = points * len(METRICS) * BYTES_PER_POINT
    if runs + table <= limit:
        return
    have = f"{_size(limit)} {allowed}"
    n = requests(config)
    if runs >= table and 2 * replica_bytes(config) > each:
        f = config.fleet
        if f.replicas == 1 and not f.prefill_replicas:  # one engine's prefix cache
            raise ConfigError(f"engine.prefix_caching: the prefix cache of {kv_blocks(config):,} blocks needs "
                              f"~{_size(runs + table)}, {have}")
        prefill = f" and {f.prefill_replicas:,} prefill replicas" if f.prefill_replicas else ""
        pools = f"{f.replicas:,} replicas{prefill}"
        raise ConfigError(f"fleet.replicas: {pools} need ~{_size(runs + table)}, {have}")
    if runs >= table:
        each = f" a point on {concurrent_runs} workers" if concurrent_runs > 1 else ""
        raise ConfigError(f"workload.n_requests: {n:,} requests{each} need ~{_size(runs + table)}, {have}")
    raise ConfigError(f"sweep: {points:,} points need ~{_size(runs + table)}, {have}")
