"""Writing a file whole: under a temporary name beside it, renamed into place once complete, so
that a reader (or a rerun after a crash or a full disk) never sees half a file and a previous
version stays until the new one is complete. Used by every layer that writes an output."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a new, empty temporary file beside ``path`` to write; on success it is renamed to
    ``path`` (a reader never sees a half-written file), on failure removed.

    The file is created with mode 0666 less the umask, as ``open(path, "w")`` would, not with
    the 0600 of :func:`tempfile.mkstemp`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temporary(path)
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


TEMPORARY_EXTRA = len("..01234567.tmp")  # bytes a temporary name adds to its file's


def _temporary(path: Path) -> Path:
    """A new temporary name beside ``path`` (:data:`TEMPORARY_EXTRA` bytes longer)."""
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")


def check_writable(path: str | Path, what: str) -> None:
    """Refuse, before any work, an output ``path`` that cannot be written: a folder, below a file,
    a name longer than the file system takes (with the temporary name it is written under; its
    lock and checkpoint beside it are shorter), or where this process may not create a file
    (no permission, a read-only file system: tried with a file created and removed at once).
    ``what`` names it (``--out``)."""
    from .model.fields import ConfigError

    path = Path(path)
    try:
        if path.is_dir():
            raise ConfigError(f"{what} {path}: is a folder; name a file in it")
        whole = path.absolute()
        ancestor = next(p for p in whole.parents if p.exists())  # where the file (or its folder) goes
        if not ancestor.is_dir():
            raise ConfigError(f"{what} {path}: {ancestor} is a file, not a folder")
        *folders, name = whole.relative_to(ancestor).parts  # (a name too long for a folder failed to stat)
        most = os.pathconf(ancestor, "PC_NAME_MAX")
        if len(os.fsencode(name)) + TEMPORARY_EXTRA > most:
            raise ConfigError(f"{what} {path}: file name too long ({len(os.fsencode(name))} bytes, and "
                              f"{TEMPORARY_EXTRA} more for the temporary name it is written under; the file system "
                              f"takes {most})")
        probe = _temporary(ancestor / (name if not folders else "fastsim"))
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"{what} {path}: cannot write here ({exc.strerror or exc})") from None


def disk_error(path: Path, exc: Exception) -> OSError:
    """An OSError for a library's failure to write ``path`` (netCDF's "HDF error"), saying so
    when the disk is full. (The netCDF library keeps a file it failed to close open, so its
    space stays taken until the process ends: the command line ends at once.)"""
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        free = -1
    if 0 <= free < 1 << 20:
        return OSError(errno.ENOSPC, f"no space left on the device ({free:,} bytes free); nothing was written")
    return OSError(errno.EIO, f"cannot write ({exc}); nothing was written")
