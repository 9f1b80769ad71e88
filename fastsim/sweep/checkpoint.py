"""Checkpoints: an append-only file of finished points, so that an interrupted sweep (or
capacity search, or plan) resumes where it stopped."""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

import numpy as np

from .._version import __version__
from ..model.schema import Config, ConfigError


class ResumeWarning(UserWarning):
    """A resumed checkpoint held records that failed their checks: their points run again."""


class Checkpoint:
    """Append-only file of finished points, safe against SIGKILL at any moment, and checked
    when read: a damaged record costs its point a rerun, never a wrong result.

    Layout: a header (magic, SHA-256 of the sweep's fingerprint: its config, grid, metrics,
    task and fastsim version; point and metric counts), then fixed-size records (int64 point
    index, float64 metrics, and a 64-bit BLAKE2b checksum of both keyed by the fingerprint).
    Each block is appended with one write and fsync'd; a torn last record (the process died
    mid-write) is ignored on reading. A record whose checksum fails, whose index is out of
    range, or whose index appears twice is discarded (with a :class:`ResumeWarning` saying how
    many), and its point runs again.
    """

    MAGIC = b"fastsim-checkpoint-2\n"
    HEADER_BYTES = len(MAGIC) + 32 + 16

    def __init__(self, path: Path, config: Config, n_points: int, columns: list[str], task: str = "sweep"):
        """A record of ``n_points`` points of ``config``'s grid, each a row of float64 ``columns``;
        ``task`` names what computed them (a sweep, or a search and its targets)."""
        self.path = path
        self.n_points = n_points
        self.n_metrics = len(columns)
        self.record = np.dtype([("index", "<i8"), ("metrics", "<f8", (self.n_metrics,)), ("check", "<u8")])
        fingerprint = json.dumps(
            {"config": config.model_dump(), "version": __version__, "metrics": columns, "task": task},
            sort_keys=True,
            default=repr,
        )
        self.digest = hashlib.sha256(fingerprint.encode()).digest()
        self.header = self.MAGIC + self.digest + np.array([n_points, self.n_metrics], "<i8").tobytes()
        self._fd: int | None = None

    @classmethod
    def is_empty(cls, path: Path) -> bool:
        """``path`` is a checkpoint with no finished point (or no file at all)."""
        return not path.is_file() or path.stat().st_size <= cls.HEADER_BYTES

    def _checksums(self, raw: bytes) -> np.ndarray:
        """The checksum of each record in ``raw`` (whole records): of its index and metrics."""
        size = self.record.itemsize
        sums = (hashlib.blake2b(raw[j:j + size - 8], digest_size=8, key=self.digest).digest()
                for j in range(0, len(raw), size))
        return np.array([int.from_bytes(d, "little") for d in sums], dtype=np.uint64)

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """The finished points recorded so far, each checked: (indices, metrics rows)."""
        if not self.path.is_file():
            raise ConfigError(f"{self.path}: not a file (a checkpoint is one); remove it to start over")
        data = self.path.read_bytes()
        if not data.startswith(self.MAGIC):
            raise ConfigError(f"{self.path}: not a fastsim checkpoint (or one of an older fastsim); delete it to "
                              "start over")
        if data[: len(self.header)] != self.header:
            raise ConfigError(
                f"{self.path}: checkpoint of a different run (config, grid, targets or fastsim version changed); "
                "delete it to start over"
            )
        body = data[len(self.header) :]
        size = self.record.itemsize
        usable = len(body) - len(body) % size
        records = np.frombuffer(body[:usable], dtype=self.record)
        sound = self._checksums(body[:usable]) == records["check"]
        index = records["index"]
        sound &= (index >= 0) & (index < self.n_points)
        values, counts = np.unique(index[sound], return_counts=True)
        sound &= ~np.isin(index, values[counts > 1])  # a point recorded twice: trust neither
        if not sound.all():
            bad = int((~sound).sum())
            warnings.warn(f"{self.path}: {bad} of {len(records)} recorded points failed their checks "
                          f"(damaged file); they run again", ResumeWarning, stacklevel=2)
        return index[sound], records["metrics"][sound]

    def open(self, resume: bool) -> tuple[np.ndarray, np.ndarray]:
        """Start (or, with ``resume``, continue) the file; returns the points already done."""
        indices, rows = np.empty(0, np.int64), np.empty((0, self.n_metrics))
        if resume and (self.path.exists() or self.path.is_symlink()):
            indices, rows = self.load()
        # Rewrite without any torn tail or damaged record, so appends stay aligned.
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
        rec["check"] = self._checksums(rec.tobytes())
        return rec.tobytes()

    def append(self, indices: np.ndarray, rows: np.ndarray) -> None:
        assert self._fd is not None
        os.write(self._fd, self._records(indices, rows))
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
