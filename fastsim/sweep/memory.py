"""How much memory a run or a sweep needs, estimated before anything is allocated.

The estimate is an upper bound built from what a run allocates at its peak, per request: the
traffic (arrival, prompt, output), what generating it allocates on the way, the kernel's
per-request state (first token, done, calendar links and due steps, token counters: kept in the
thread's scratch between runs), the record of step runs (room for three a request, 32 bytes
each: the per-step records the inter-token latencies come from), the metrics' latency arrays,
and a fleet's outcomes per pool. The completion calendar is bounded (``engine.kernels.RING_MAX``
buckets), so no token count drives memory.
"""

from __future__ import annotations

import re

from ..model.schema import Config, ConfigError

BYTES_PER_REQUEST = 352  # measured peak 73 to 331, P/D the largest (tests/sweep/test_memory.py checks the bound)
BYTES_PER_RUN = 1 << 20  # calendar (512 KiB at most) and small arrays
BYTES_PER_POINT = 4 * 8  # per metric of a sweep's table: the table, a checkpoint copy, output


def available_bytes() -> int:
    """Memory the system can give without swapping (Linux ``MemAvailable``; its equivalent on
    macOS and Windows)."""
    import psutil

    return psutil.virtual_memory().available


_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_size(text: str) -> int:
    """``"8GB"``, ``"500M"``, ``"16GiB"``, ``"2e9"`` -> bytes; errors name ``--max-memory``."""
    m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([kmgt]i?)?b?\s*", text.lower())
    if not m or float(m.group(1)) <= 0:
        raise ConfigError(f"--max-memory: expected a size such as 8GB, 500MB or 16GiB (got {text!r})")
    return int(float(m.group(1)) * _UNITS[m.group(2) or ""])


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
    return requests(config) * BYTES_PER_REQUEST + BYTES_PER_RUN


def check(config: Config, concurrent_runs: int = 1, points: int = 0, limit: int | None = None) -> None:
    """Refuse (``ConfigError`` naming the key that drives the size) when ``concurrent_runs``
    simulations of ``config`` plus a sweep table of ``points`` points need more than ``limit``
    bytes (default: what the system has available)."""
    from ..analysis.metrics import METRICS

    allowed = "allowed" if limit is not None else "available"
    limit = available_bytes() if limit is None else limit
    runs = concurrent_runs * run_bytes(config)
    table = points * len(METRICS) * BYTES_PER_POINT
    if runs + table <= limit:
        return
    have = f"{_size(limit)} {allowed}"
    n = requests(config)
    if runs >= table:
        each = f" a point on {concurrent_runs} workers" if concurrent_runs > 1 else ""
        raise ConfigError(f"workload.n_requests: {n:,} requests{each} need ~{_size(runs + table)}, {have}")
    raise ConfigError(f"sweep: {points:,} points need ~{_size(runs + table)}, {have}")
