"""Recorded request traces: read, checked row by row, and cached once per process.

Two CSV formats, told apart by their header:

- Azure LLM inference (2023): ``TIMESTAMP,ContextTokens,GeneratedTokens``, timestamps as
  date-times (``2023-11-16 18:15:46.6805900``);
- plain: ``arrival_s,prompt_tokens,output_tokens``, arrivals in seconds.

Arrivals are shifted to start at 0. Every problem is a :class:`~fastsim.model.schema.ConfigError` naming
the file, the row (the line number in the file) and the column.
"""

from __future__ import annotations

import csv
import functools
import os
from dataclasses import dataclass

import numpy as np

from ..model.fields import LARGEST
from ..model.loading import not_utf8
from ..model.schema import ConfigError, Workload

FORMATS = {
    ("TIMESTAMP", "ContextTokens", "GeneratedTokens"): "azure",
    ("arrival_s", "prompt_tokens", "output_tokens"): "plain",
}


@dataclass(frozen=True)
class Trace:
    path: str
    arrival_s: np.ndarray  # float64 (n,), from 0, non-decreasing
    prompt_tokens: np.ndarray  # int64 (n,)
    output_tokens: np.ndarray  # int64 (n,), >= 1
    lines: np.ndarray  # int64 (n,): each request's line in the file

    def __len__(self) -> int:
        return self.arrival_s.size


def load(path: str) -> Trace:
    """The trace at ``path``, read once per process (again only if the file changes)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(f"workload.trace: {path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"workload.trace: {path}: cannot read ({exc.strerror})") from None
    return _read(path, st.st_mtime_ns, st.st_size)


def _token_count(path: str, line: int, column: str, text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{path}: row {line}, column {column}: not a whole number of tokens ({text!r})") from None
    if value < least:
        what = "negative" if value < 0 else "zero"
        raise ConfigError(f"{path}: row {line}, column {column}: {what} token count ({value}); at least {least}")
    if value > LARGEST:
        raise ConfigError(f"{path}: row {line}, column {column}: {value:.3g} tokens is beyond the largest count "
                          f"fastsim holds (2^53, {LARGEST:.2g})")
    return value


@functools.lru_cache(maxsize=8)
def _read(path: str, mtime_ns: int, size: int) -> Trace:
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except OSError as exc:
        raise ConfigError(f"workload.trace: {path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"workload.trace: {not_utf8(path, exc)}") from None
    except csv.Error as exc:
        raise ConfigError(f"workload.trace: {path}: not a CSV text file ({exc})") from None
    header = tuple(c.strip() for c in rows[0]) if rows else ()
    kind = FORMATS.get(header)
    if kind is None:
        expected = " or ".join(",".join(cols) + f" ({name})" for cols, name in
                               zip(FORMATS, ("Azure LLM inference", "plain, seconds")))
        raise ConfigError(f"{path}: unknown trace format (header {','.join(header) or 'missing'}); "
                          f"expected columns {expected}")
    body = [(line, row) for line, row in enumerate(rows[1:], start=2) if any(c.strip() for c in row)]
    if not body:
        raise ConfigError(f"{path}: empty trace (a header and no requests)")
    n = len(body)
    times = np.empty(n)
    prompt = np.empty(n, np.int64)
    output = np.empty(n, np.int64)
    stamps = []
    for j, (line, row) in enumerate(body):
        if len(row) != 3:
            raise ConfigError(f"{path}: row {line}: {len(row)} columns, expected {len(header)} ({','.join(header)})")
        prompt[j] = _token_count(path, line, header[1], row[1].strip(), 0)
        output[j] = _token_count(path, line, header[2], row[2].strip(), 1)
        if kind == "plain":
            try:
                times[j] = float(row[0])
            except ValueError:
                raise ConfigError(f"{path}: row {line}, column {header[0]}: not a time in seconds ({row[0]!r})") from None
            if not np.isfinite(times[j]):
                raise ConfigError(f"{path}: row {line}, column {header[0]}: not a finite time ({row[0]!r})")
        else:
            stamps.append(row[0].strip().replace(" ", "T"))
    if kind == "azure":
        try:
            ns = np.array(stamps, dtype="datetime64[ns]")
        except ValueError:
            for (line, row), stamp in zip(body, stamps):
                try:
                    np.datetime64(stamp, "ns")
                except ValueError:
                    raise ConfigError(f"{path}: row {line}, column {header[0]}: not a date-time ({row[0]!r})") from None
            raise
        times = (ns - ns[0]).astype(np.int64) / 1e9
    late = np.flatnonzero(np.diff(times) < 0)
    if late.size:
        line = body[late[0] + 1][0]
        raise ConfigError(f"{path}: row {line}, column {header[0]}: earlier than the row before (out of order)")
    return Trace(path, times - times[0], prompt, output, np.array([line for line, _ in body]))


def arrivals(trace: Trace, n: int, rate: float | None) -> np.ndarray:
    """The first ``n`` arrival times, rescaled to a mean of ``rate`` requests per second
    ((n - 1) / last arrival, exactly) or as recorded (``rate`` None)."""
    t = trace.arrival_s[:n]
    if rate is None:
        return t.copy()
    if n < 2 or t[-1] == 0:
        raise ConfigError(f"workload.rate: cannot rescale {n} request(s) of {trace.path} that arrive at one instant")
    return t / t[-1] * ((n - 1) / rate)


def requests(w: Workload) -> tuple[Trace, int]:
    """The trace workload ``w`` replays and how many of its requests it takes."""
    trace = load(w.trace)
    n = len(trace) if w.n_requests is None else w.n_requests
    if n > len(trace):
        raise ConfigError(f"workload.n_requests: {n:,} requests, but {w.trace} has {len(trace):,}")
    return trace, n


def native_rate(w: Workload) -> float:
    """The mean arrival rate of the requests a trace workload takes, as recorded."""
    recorded, n = requests(w)
    return (n - 1) / recorded.arrival_s[n - 1] if n > 1 and recorded.arrival_s[n - 1] > 0 else float("nan")
