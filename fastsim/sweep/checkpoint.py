"""Checkpoints: an append-only file of finished points, so that an interrupted sweep (or
capacity search, or plan) resumes where it stopped."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from .._version import __version__
from ..model.schema import Config, ConfigError


class Checkpoint:
    """Append-only file of finished points, safe against SIGKILL at any moment.

    Layout: a header (magic, SHA-256 of the sweep's fingerprint, point and metric counts), then
    fixed-size records (int64 point index, float64 metrics). Each block is appended with one write
    and fsync'd; a torn last record (the process died mid-write) is ignored on reading.
    """

    MAGIC = b"fastsim-checkpoint-1\n"

    def __init__(self, path: Path, config: Config, n_points: int, columns: list[str], task: str = "sweep"):
        """A record of ``n_points`` points of ``config``'s grid, each a row of float64 ``columns``;
        ``task`` names what computed them (a sweep, or a search and its targets)."""
        self.path = path
        self.n_metrics = len(columns)
        self.record = np.dtype([("index", "<i8"), ("metrics", "<f8", (self.n_metrics,))])
        fingerprint = json.dumps(
            {"config": config.model_dump(), "version": __version__, "metrics": columns, "task": task},
            sort_keys=True,
            default=repr,
        )
        digest = hashlib.sha256(fingerprint.encode()).digest()
        self.header = self.MAGIC + digest + np.array([n_points, self.n_metrics], "<i8").tobytes()
        self._fd: int | None = None

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """The finished points recorded so far: (indices, metrics rows)."""
        data = self.path.read_bytes()
        if not data.startswith(self.MAGIC):
            raise ConfigError(f"{self.path}: not a fastsim checkpoint")
        if data[: len(self.header)] != self.header:
            raise ConfigError(
                f"{self.path}: checkpoint of a different run (config, grid, targets or fastsim version changed); "
                "delete it to start over"
            )
        body = data[len(self.header) :]
        usable = len(body) - len(body) % self.record.itemsize
        records = np.frombuffer(body[:usable], dtype=self.record)
        return records["index"], records["metrics"]

    def open(self, resume: bool) -> tuple[np.ndarray, np.ndarray]:
        """Start (or, with ``resume``, continue) the file; returns the points already done."""
        indices, rows = np.empty(0, np.int64), np.empty((0, self.n_metrics))
        if resume and self.path.exists():
            indices, rows = self.load()
        # Rewrite without any torn tail, so appends stay aligned.
        self._write_fresh(indices, rows)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        return indices, rows

    def _write_fresh(self, indices: np.ndarray, rows: np.ndarray) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(self.header)
            f.write(self._records(indices, rows))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def _records(self, indices: np.ndarray, rows: np.ndarray) -> bytes:
        rec = np.empty(len(indices), dtype=self.record)
        rec["index"] = indices
        if len(indices):
            rec["metrics"] = rows
        return rec.tobytes()

    def append(self, indices: np.ndarray, rows: np.ndarray) -> None:
        assert self._fd is not None
        os.write(self._fd, self._records(indices, rows))
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
