"""Output files: locked while a sweep writes them (each is written whole, under a temporary
name then renamed into place: :func:`fastsim._atomic.atomic_path`)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

from ..model.schema import ConfigError

try:
    import fcntl
except ImportError:  # Windows: the lock is filelock's (the same refusal, without the owner's pid)
    fcntl = None


def lock_path(out: Path) -> Path:
    """The lock a sweep writing ``out`` holds while it runs."""
    return out.with_name(out.name + ".lock")


@contextlib.contextmanager
def output_lock(out: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``out`` for as long as a sweep writes it (and its checkpoint).

    The lock is on ``<out>.lock``; the operating system drops it when the owner dies, so a killed
    sweep never leaves ``out`` locked. A second sweep on the same ``out`` fails at once, naming
    the owner's pid where the platform lets it be read (POSIX).
    """
    path = lock_path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    with (_posix_lock if fcntl is not None else _portable_lock)(out, path):
        yield


def _busy(out: Path, owner: str = "") -> ConfigError:
    who = f" (pid {owner})" if owner else ""
    return ConfigError(f"{out}: another sweep{who} is writing this output; wait for it, or stop it")


@contextlib.contextmanager
def _posix_lock(out: Path, path: Path) -> Iterator[None]:
    """``flock`` on ``path``, which holds the owner's pid while it is held."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise _busy(out, owner) from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the previous owner removed the file as we opened it: take the new one
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        path.unlink(missing_ok=True)  # while still held, so no one locks a file on its way out
        os.close(fd)


@contextlib.contextmanager
def _portable_lock(out: Path, path: Path) -> Iterator[None]:
    """filelock's lock on ``path``, for platforms without ``fcntl``."""
    import filelock

    lock = filelock.FileLock(path, blocking=False)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise _busy(out) from None
    try:
        yield
    finally:
        lock.release()
