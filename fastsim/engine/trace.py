"""Recorded request traces: read, checked row by row, and cached once per process.

Three CSV formats, told apart by their header, and JSON lines:

- Azure LLM inference (2023): ``TIMESTAMP,ContextTokens,GeneratedTokens``, timestamps as
  date-times (``2023-11-16 18:15:46.6805900``);
- plain: ``arrival_s,prompt_tokens,output_tokens``, arrivals in seconds;
- conversations: ``chat_id,parent_chat_id,timestamp,input_length,output_length`` (seconds): a
  row whose parent is an earlier row shares the parent's prompt + output (capped at its prompt);
- JSON lines (a file ending ``.jsonl``), one object a request as in the Mooncake traces:
  ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids`` (one id per
  ``workload.trace_hash_block`` tokens of the prompt; equal ids at a position mean equal tokens
  up to there).

Arrivals are shifted to start at 0. Every problem is a :class:`~fastsim.model.schema.ConfigError` naming
the file, the row (the line number in the file) and the column.
"""

from __future__ import annotations

import csv
import functools
import os
from dataclasses import dataclass, field

import numpy as np

from ..model.fields import LARGEST
from ..model.loading import not_utf8
from ..model.schema import ConfigError, Workload
from . import content as shares
from .content import Content

FORMATS = {
    ("TIMESTAMP", "ContextTokens", "GeneratedTokens"): "azure",
    ("arrival_s", "prompt_tokens", "output_tokens"): "plain",
    ("chat_id", "parent_chat_id", "timestamp", "input_length", "output_length"): "conversation",
}
JSON_KEYS = ("timestamp", "input_length", "output_length", "hash_ids")
NO_IDS = np.empty(0, np.int64)


@dataclass(frozen=True)
class Trace:
    path: str
    arrival_s: np.ndarray  # float64 (n,), from 0, non-decreasing
    prompt_tokens: np.ndarray  # int64 (n,)
    output_tokens: np.ndarray  # int64 (n,), >= 1
    lines: np.ndarray  # int64 (n,): each request's line in the file
    parent: np.ndarray | None = None  # int64 (n,): a conversation's parent row (an index), or -1
    hash_start: np.ndarray = field(default_factory=lambda: NO_IDS)  # int64 (n + 1,): JSON lines: row r's ids
    hash_ids: np.ndarray = field(default_factory=lambda: NO_IDS)  # are hash_ids[hash_start[r]:hash_start[r + 1]],
    # dense (0, 1, ... in order of first appearance)

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
    if path.endswith(".jsonl"):
        return _read_json_lines(path)
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
    at = 2 if kind == "conversation" else 0  # the columns of the time and the two lengths
    for j, (line, row) in enumerate(body):
        if len(row) != len(header):
            raise ConfigError(f"{path}: row {line}: {len(row)} columns, expected {len(header)} ({','.join(header)})")
        row = row[at:]
        prompt[j] = _token_count(path, line, header[at + 1], row[1].strip(), 0)
        output[j] = _token_count(path, line, header[at + 2], row[2].strip(), 1)
        if kind != "azure":
            try:
                times[j] = float(row[0])
            except ValueError:
                raise ConfigError(f"{path}: row {line}, column {header[at]}: not a time in seconds ({row[0]!r})") from None
            if not np.isfinite(times[j]):
                raise ConfigError(f"{path}: row {line}, column {header[at]}: not a finite time ({row[0]!r})")
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
    lines = np.array([line for line, _ in body])
    _in_order(path, times, lines, header[at])
    parent = _parents(path, body) if kind == "conversation" else None
    return Trace(path, times - times[0], prompt, output, lines, parent)


def _in_order(path: str, times: np.ndarray, lines: np.ndarray, column: str) -> None:
    late = np.flatnonzero(np.diff(times) < 0)
    if late.size:
        raise ConfigError(f"{path}: row {lines[late[0] + 1]}, column {column}: earlier than the row before (out of order)")


def _parents(path: str, body: list) -> np.ndarray:
    """Each conversation row's parent row (an index into the requests), or -1."""
    seen: dict[str, int] = {}
    parent = np.full(len(body), -1, np.int64)
    for j, (line, row) in enumerate(body):
        chat, up = row[0].strip(), row[1].strip()
        if up not in ("", "-1"):
            if up not in seen:
                raise ConfigError(f"{path}: row {line}, column parent_chat_id: {up!r} is not an earlier row's chat_id "
                                  f"(a parent must appear before its child)")
            parent[j] = seen[up]
        seen[chat] = j
    return parent


def _read_json_lines(path: str) -> Trace:
    """A trace of JSON lines with hash ids (the Mooncake format)."""
    import json

    times, prompt, output, lines, start, ids = [], [], [], [], [0], []
    dense: dict[int, int] = {}
    try:
        with open(path) as f:
            text = list(enumerate(f, start=1))
    except OSError as exc:
        raise ConfigError(f"workload.trace: {path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"workload.trace: {not_utf8(path, exc)}") from None
    for line, raw in text:
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: line {line}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict) or any(k not in row for k in JSON_KEYS):
            raise ConfigError(f"{path}: line {line}: expected an object with {', '.join(JSON_KEYS)}")
        stamp = row["timestamp"]
        if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not np.isfinite(stamp):
            raise ConfigError(f"{path}: line {line}, timestamp: not a time in milliseconds ({stamp!r})")
        hashes = row["hash_ids"]
        if not isinstance(hashes, list) or any(isinstance(h, bool) or not isinstance(h, int) for h in hashes):
            raise ConfigError(f"{path}: line {line}, hash_ids: not a list of integers")
        times.append(stamp / 1000)
        prompt.append(_token_count(path, line, "input_length", str(row["input_length"]), 0))
        output.append(_token_count(path, line, "output_length", str(row["output_length"]), 1))
        ids += [dense.setdefault(h, len(dense)) for h in hashes]
        start.append(len(ids))
        lines.append(line)
    if not times:
        raise ConfigError(f"{path}: empty trace (no requests)")
    t, lines_a = np.array(times), np.array(lines)
    _in_order(path, t, lines_a, "timestamp")
    return Trace(path, t - t[0], np.array(prompt, np.int64), np.array(output, np.int64), lines_a, None,
                 np.array(start, np.int64), np.array(ids, np.int64))


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
    if trace.hash_start.size:
        counts = np.diff(trace.hash_start)
        wrong = np.flatnonzero(counts != -(-trace.prompt_tokens // w.trace_hash_block))
        if wrong.size:
            r = wrong[0]
            raise ConfigError(f"{trace.path}: line {trace.lines[r]}, hash_ids: {counts[r]} ids for input_length "
                              f"{trace.prompt_tokens[r]}; workload.trace_hash_block {w.trace_hash_block} needs "
                              f"{-(-trace.prompt_tokens[r] // w.trace_hash_block)}")
    return trace, n


def content(trace: Trace, n: int, hash_block: int) -> Content | None:
    """What the first ``n`` requests share, as recorded (None: a trace without it)."""
    if trace.hash_start.size:
        c = shares.none(n)
        start = trace.hash_start[:n + 1]
        return Content(np.full(n, -1, np.int64), np.zeros(n, np.int64), start, trace.hash_ids[:start[-1]], hash_block,
                       c.session, c.turn, c.system_prompt, c.think_s)
    if trace.parent is None:
        return None
    parent = trace.parent[:n]
    ends = trace.prompt_tokens + trace.output_tokens
    shared = np.where(parent >= 0, np.minimum(ends[np.maximum(parent, 0)], trace.prompt_tokens[:n]), 0)
    c = shares.none(n)
    return Content(parent.copy(), shared, c.hash_start, c.hash_ids, 1, c.session, c.turn, c.system_prompt, c.think_s)


def native_rate(w: Workload) -> float:
    """The mean arrival rate of the requests a trace workload takes, as recorded."""
    recorded, n = requests(w)
    return (n - 1) / recorded.arrival_s[n - 1] if n > 1 and recorded.arrival_s[n - 1] > 0 else float("nan")
