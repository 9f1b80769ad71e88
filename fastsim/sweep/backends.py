"""Where work runs, and what a Ctrl-C there does. A grid's blocks run one at a time, on worker
threads, in forked worker processes (many small points, which are mostly Python) or on a Dask
cluster. Each is a context manager whose value submits blocks (:class:`Backend`); left by an
exception (Ctrl-C), it stops the work in flight at once: worker threads are told to stop and
are not waited for (a kernel cannot be interrupted; a search stops between two simulations),
worker processes (forked, or a local Dask cluster's) are ended, and ignore the terminal's Ctrl-C
themselves so that none prints a traceback. :mod:`.runner` chooses one and feeds it blocks.

Compiled code never runs on the main thread (:func:`in_worker`): Python raises Ctrl-C's
KeyboardInterrupt there, between any two bytecodes, including those of the Python that compiled
code calls back (Numba unpickles a constant as it returns an array), which does not expect it
and crashes the process. The main thread only waits, so Ctrl-C also takes effect at once.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Callable, Iterator, NamedTuple, TypeVar

import numpy as np

from ..model.schema import ConfigError
from .grid import Grid

if TYPE_CHECKING:
    from .runner import Task

T = TypeVar("T")


class Backend(NamedTuple):
    """Where blocks run, as a context manager's value: ``submit(block)`` returns a future of its
    (indices, rows), at most ``in_flight`` out at once. Left by an exception (Ctrl-C), the context
    stops the work in flight at once: the one cancel path."""

    submit: Callable[[np.ndarray], Future]
    in_flight: int


def run_block(grid: Grid, block: np.ndarray, task: Task, stop: threading.Event | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
    """A block of points (flat indices): (indices, rows). Runs in workers."""
    return block, task([grid.config(i) for i in block.tolist()], stop)


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


MAIN_WORKER = "fastsim-main"  # the name of the thread that runs the main thread's compiled work
_main: list = []  # [its executor, the last future submitted to it], once started


def _on_main_worker(fn: Callable[..., T], *args) -> Future:
    """Submit ``fn(*args)`` to the main thread's worker: one thread, kept from call to call, so
    that its scratch (:func:`fastsim.analysis.simulation.scratch`) is reused, as the main
    thread's own was. Not a daemon: an interpreter that exits normally waits for it rather than
    being torn down under a kernel."""
    if not _main:
        _main[:] = [ThreadPoolExecutor(1, thread_name_prefix=MAIN_WORKER), None]
    _main[1] = _main[0].submit(fn, *args)
    return _main[1]


def in_worker(fn: Callable[..., T], *args, **kwargs) -> T:
    """``fn(*args, **kwargs)``; called on the main thread, run on the main thread's worker while
    the main thread waits. Ctrl-C then interrupts the wait at once (KeyboardInterrupt raised
    here) and never the work, which goes on to its end (a kernel cannot be interrupted; the
    command line exits without waiting for it, and a next call waits its turn)."""
    if not _on_main_thread():
        return fn(*args, **kwargs)
    return _on_main_worker(functools.partial(fn, *args, **kwargs)).result()


@contextlib.contextmanager
def here(grid: Grid, task: Task) -> Iterator[Backend]:
    """Blocks run one at a time as they are submitted: in the calling thread, or from the main
    thread on its worker (:func:`in_worker`), told to stop on Ctrl-C (a search stops between
    two simulations)."""
    if _on_main_thread():
        stop = threading.Event()
        try:
            yield Backend(lambda block: _on_main_worker(run_block, grid, block, task, stop), 1)
        finally:
            stop.set()
        return

    def submit(block: np.ndarray) -> Future:
        future: Future = Future()
        future.set_result(run_block(grid, block, task))
        return future

    yield Backend(submit, 1)


@contextlib.contextmanager
def threads(grid: Grid, task: Task, workers: int) -> Iterator[Backend]:
    """Worker threads: the kernels release the GIL (``nogil``), the Python around them is a few
    percent of a point, and threads cost nothing to start (no imports, no Numba start-up per
    process). A running block is told to stop on Ctrl-C and is not waited for (the caller exits,
    or the thread ends with its block)."""
    stop = threading.Event()
    pool = ThreadPoolExecutor(workers, thread_name_prefix="fastsim")
    try:
        yield Backend(lambda block: pool.submit(run_block, grid, block, task, stop), 2 * workers)
    finally:
        stop.set()
        pool.shutdown(wait=False, cancel_futures=True)


_worker: tuple = ()  # a worker process's (grid, task)


def _start_worker(grid: Grid, task: Task, parent: int) -> None:
    """A worker process's set-up: Ctrl-C is the parent's to handle (it stops the pool and keeps
    what finished), and the worker ends quietly with its parent (killed, the parent could not
    read its results: the worker would only print a broken pipe)."""
    import signal

    global _worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:  # Linux: the kernel kills this process when its parent dies
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before that took effect
        os._exit(0)
    # A worker's errors reach the parent with its results. All it could print itself is its own
    # end when the parent is gone: a broken pipe, in the instant before the kernel kills it.
    sys.stderr = open(os.devnull, "w")
    _worker = (grid, task)


def _block_in_worker(block: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A block, in a worker process (the grid and task came with the fork)."""
    return run_block(_worker[0], block, _worker[1])


def can_fork() -> bool:
    """Forking is safe here: Linux, and no other thread that a child could inherit mid-lock (a
    notebook's kernel has some: its sweeps of small points stay on one thread) but the main
    thread's worker, idle (waiting for work, it holds none)."""
    busy = bool(_main) and _main[1] is not None and not _main[1].done()
    others = [t for t in threading.enumerate() if t is not threading.current_thread()]
    return sys.platform == "linux" and not busy and all(t.name.startswith(MAIN_WORKER) for t in others)


if hasattr(os, "register_at_fork"):  # a forked child has the executor but not its thread
    os.register_at_fork(after_in_child=_main.clear)


@contextlib.contextmanager
def processes(grid: Grid, task: Task, workers: int) -> Iterator[Backend]:
    """Forked worker processes, for points too small for threads to share the GIL well. Forked,
    a worker starts in milliseconds with the grid, the task and the loaded kernels already in its
    memory; every worker is forked here, before any other thread (the pool's own, a progress
    bar's) exists. Ctrl-C kills them."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"), initializer=_start_worker,
                               initargs=(grid, task, os.getpid()))
    pool.submit(os.getpid).result()  # a forking pool starts every worker at its first task

    finished = False
    try:
        yield Backend(lambda block: pool.submit(_block_in_worker, block), 2 * workers)
        finished = True
    finally:
        if not finished:
            for process in list((pool._processes or {}).values()):
                with contextlib.suppress(OSError):
                    process.kill()
        pool.shutdown(wait=finished, cancel_futures=not finished)  # idle workers exit at once


def check_scheduler(address: str) -> None:
    """Refuse a ``--scheduler`` that is neither ``local`` nor a Dask address (``tcp://host:8786``)
    before any work starts."""
    if address == "local":
        return
    from distributed.comm.addressing import parse_address, parse_host_port

    try:
        host, port = parse_host_port(parse_address(address)[1])
        if not host or not 0 < port < 65536:
            raise ValueError("no host" if not host else f"port {port} out of range")
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"--scheduler {address!r}: not 'local' nor a Dask scheduler address such as "
                          f"tcp://host:8786 ({exc})") from None


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """Ignore SIGINT (on the main thread) while processes are started: they keep ignoring it,
    so a terminal's Ctrl-C, sent to the whole process group, reaches only this process, which
    stops them and keeps what finished (they would each print a traceback)."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _quiet_workers() -> Iterator[None]:
    """Local Dask workers started meanwhile log errors only (not the warnings a cancel on
    Ctrl-C makes each print): the setting is read from the environment they inherit."""
    key = "DASK_LOGGING__DISTRIBUTED"
    previous = os.environ.get(key)
    os.environ[key] = "error"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = previous


def _listening(address: str) -> None:
    """Raise OSError at once when nothing listens at a tcp:// address (Dask retries for its
    whole timeout before it says so)."""
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    if address.startswith("tcp://") and port.isdigit():
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()


@contextlib.contextmanager
def dask(grid: Grid, task: Task, scheduler: str, workers: int, prepare: Callable[[], None]) -> Iterator[Backend]:
    """A Dask cluster (``local``: one started here, of ``workers`` processes), each worker running
    ``prepare()`` first (loading the kernels). Every block is submitted at once; Ctrl-C ends a
    local cluster's workers, which may be deep in a kernel."""
    from distributed import Client, LocalCluster

    cluster = None
    if scheduler == "local":
        with sigint_ignored(), _quiet_workers():  # what its processes inherit
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None)
        client = Client(cluster)
    else:
        try:
            _listening(scheduler)
            client = Client(scheduler, timeout="10s")
        except (OSError, TimeoutError, ValueError) as exc:
            raise ConfigError(f"--scheduler {scheduler}: cannot reach a Dask scheduler ({exc})") from None
    quiet = logging.getLogger("distributed")  # the scheduler, here, would log the loss of killed workers
    level = quiet.level
    try:
        client.run(prepare)
        shared = client.scatter(grid, broadcast=True)  # sent once, not with every block
        executor = client.get_executor(pure=False)
        try:
            yield Backend(lambda block: executor.submit(run_block, shared, block, task), 1 << 62)
        except BaseException:
            if cluster is not None:  # its workers may be deep in a kernel: end them, not wait
                quiet.setLevel(logging.CRITICAL)
                _kill_workers(cluster)
            raise
        finally:
            executor.shutdown(wait=False)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
        quiet.setLevel(level)


def _kill_workers(cluster) -> None:
    """End a local cluster's worker processes at once (its nannies then close quickly)."""
    import signal

    for nanny in cluster.workers.values():
        pid = getattr(getattr(getattr(nanny, "process", None), "process", None), "pid", None)
        if pid:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
