"""The fault battery: damaged checkpoints never change a result, a full disk stops cleanly with
the previous output and the checkpoint intact, and Ctrl-C takes effect at once, keeping every
finished point."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import xarray as xr
from typer.testing import CliRunner

from fastsim import load_config
from fastsim.analysis.metrics import METRICS
from fastsim.api import checkpoint_path
from fastsim.cli import app
from fastsim.sweep.checkpoint import Checkpoint, ResumeWarning
from fastsim.sweep.grid import build_grid
from fastsim.sweep.runner import run_grid

SMALL = "workload:\n  n_requests: 300\nsweep:\n  workload.rate: [4, 8, 16]\n  engine.max_batch: [16, 64]\n"


@pytest.fixture
def study(tmp_path, root):
    path = tmp_path / "study.yaml"
    path.write_text(f"extends: {root / 'configs/h100.yaml'}\n{SMALL}")
    return path


def sweep(config, out, *args):
    return CliRunner().invoke(app, ["sweep", str(config), "--out", str(out), "--quiet", "--workers", "1", *args])


def record_size() -> int:
    return 8 + 8 * len(METRICS) + 8


def damaged(study, tmp_path, damage) -> tuple[xr.Dataset, xr.Dataset, list[str]]:
    """A sweep's reference dataset; the same sweep resumed from its full checkpoint after
    ``damage(path)``; and the warnings of the resume."""
    reference = tmp_path / "reference.nc"
    assert sweep(study, reference).exit_code == 0
    out = tmp_path / "out.nc"
    grid = build_grid(load_config(study))
    run_grid(grid, workers=1, checkpoint=checkpoint_path(out))  # a finished run's record, kept
    damage(checkpoint_path(out))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = sweep(study, out, "--resume")
    assert result.exit_code == 0, result.output
    assert not checkpoint_path(out).exists()
    said = [str(w.message) for w in caught if issubclass(w.category, ResumeWarning)]
    return xr.load_dataset(reference), xr.load_dataset(out), said


def flip(offset_in_record: int, record: int = 2):
    def damage(path):
        data = bytearray(path.read_bytes())
        data[Checkpoint.HEADER_BYTES + record * record_size() + offset_in_record] ^= 0x10
        path.write_bytes(bytes(data))
    return damage


def overwrite_metrics(value: float):
    def damage(path):
        data = bytearray(path.read_bytes())
        start = Checkpoint.HEADER_BYTES + 1 * record_size() + 8
        data[start:start + 8 * len(METRICS)] = np.full(len(METRICS), value).tobytes()
        path.write_bytes(bytes(data))
    return damage


def overwrite_index(index: int):
    def damage(path):
        data = bytearray(path.read_bytes())
        start = Checkpoint.HEADER_BYTES + 3 * record_size()
        data[start:start + 8] = np.int64(index).tobytes()
        path.write_bytes(bytes(data))
    return damage


def duplicate_record(path):
    data = path.read_bytes()
    first = data[Checkpoint.HEADER_BYTES:Checkpoint.HEADER_BYTES + record_size()]
    path.write_bytes(data + first)


def torn_tail(path):
    with open(path, "ab") as f:
        f.write(b"\x01\x02\x03")


@pytest.mark.parametrize("damage,rerun", [
    (flip(8 + 3), 1),  # a changed metric value
    (flip(0), 1),  # a flipped byte in the index
    (flip(8 + 8 * len(METRICS)), 1),  # in the checksum
    (overwrite_metrics(float("nan")), 1),  # NaN metrics
    (overwrite_metrics(0.0), 1),
    (overwrite_index(-1), 1),
    (overwrite_index(10**9), 1),
    (overwrite_index(0), 1),  # another point's index: the record fails, the point reruns
    (duplicate_record, 2),  # a point recorded twice: trust neither
    (torn_tail, 0),  # a write the kill tore: ignored, as always
], ids=["metric", "index-byte", "checksum", "nan", "zero", "index-1", "index-1e9", "index-other", "duplicate",
        "torn"])
def test_a_damaged_checkpoint_never_changes_the_result(study, tmp_path, damage, rerun):
    reference, resumed, said = damaged(study, tmp_path, damage)
    xr.testing.assert_identical(reference.drop_attrs(), resumed.drop_attrs())
    assert said == ([f"{checkpoint_path(tmp_path / 'out.nc')}: {rerun} of {6 + (damage is duplicate_record)} "
                     "recorded points failed their checks (damaged file); they run again"] if rerun else [])


def test_the_command_line_says_how_many_points_rerun(study, tmp_path):
    out = tmp_path / "out.nc"
    run_grid(build_grid(load_config(study)), workers=1, checkpoint=checkpoint_path(out))
    flip(8 + 3)(checkpoint_path(out))
    done = subprocess.run([sys.executable, "-m", "fastsim", "sweep", str(study), "--out", str(out), "--resume",
                           "--quiet"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (f"warning: {checkpoint_path(out)}: 1 of 6 recorded points failed their checks (damaged file); "
            "they run again") in done.stderr.splitlines()


def test_valid_records_out_of_range_or_twice_are_discarded(tmp_path, study):
    config = load_config(study)
    log = Checkpoint(tmp_path / "c.partial", config, 6, list(METRICS))
    log.open(resume=False)
    rows = np.arange(5 * len(METRICS), dtype=float).reshape(5, -1)
    log.append(np.array([0, 1, 1, 7, -2]), rows)  # checksums that hold, indices that do not
    log.close()
    with pytest.warns(ResumeWarning, match="4 of 5 recorded points"):
        indices, kept = Checkpoint(tmp_path / "c.partial", config, 6, list(METRICS)).load()
    assert indices.tolist() == [0] and np.array_equal(kept, rows[:1])


def test_a_damaged_header_is_refused(study, tmp_path):
    out = tmp_path / "out.nc"
    run_grid(build_grid(load_config(study)), workers=1, checkpoint=checkpoint_path(out))
    flip(-10, 0)(checkpoint_path(out))  # inside the header's fingerprint
    result = sweep(study, out, "--resume")
    assert result.exit_code == 2 and "checkpoint of a different run" in result.stderr


def test_a_checkpoint_that_is_a_folder_is_named(study, tmp_path):
    out = tmp_path / "out.nc"
    checkpoint_path(out).mkdir()
    for args in ([], ["--resume"]):
        result = sweep(study, out, *args)
        assert result.exit_code == 2
        assert result.stderr.strip() == (f"error: {checkpoint_path(out)}: not a file (this run's checkpoint goes "
                                         "there); remove it")


def test_a_failure_before_any_point_leaves_no_checkpoint(study, tmp_path, monkeypatch):
    from fastsim.sweep import runner

    def no_memory(*args):
        raise MemoryError

    monkeypatch.setattr(runner, "make_blocks", no_memory)  # fails once the checkpoint is open
    out = tmp_path / "out.nc"
    result = sweep(study, out)
    assert result.exit_code == 2 and "out of memory" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.yaml"]


# --- a full disk: a small tmpfs where this test may mount one

@pytest.fixture
def tiny_disk(tmp_path):
    mount = tmp_path / "tiny"
    mount.mkdir()
    if sys.platform != "linux" or os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a small tmpfs needs root on Linux")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)], capture_output=True)
    if made.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "--lazy", str(mount)], check=False)  # a failed netCDF write keeps its file open


def fill(disk, leave: int) -> None:
    """Fill ``disk`` but ``leave`` bytes."""
    free = shutil.disk_usage(disk).free - leave
    (disk / "filler").write_bytes(b"\0" * max(0, free))


def test_a_full_disk_stops_with_exit_2_and_keeps_the_previous_output(study, tiny_disk, tmp_path):
    out = tiny_disk / "out.nc"
    out.write_bytes(b"previous output")
    fill(tiny_disk, 12 * 1024)  # room for the checkpoint, not for the dataset
    result = sweep(study, out)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {out}: ") and "no space left" in lines[0].lower(), lines
    assert out.read_bytes() == b"previous output"
    assert checkpoint_path(out).is_file()  # every point finished: kept for --resume
    (tiny_disk / "filler").unlink()
    resumed = sweep(study, out, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert xr.load_dataset(out).sizes["rate"] == 3
    assert sorted(p.name for p in tiny_disk.iterdir()) == ["out.nc"]


@pytest.mark.parametrize("option", ["--requests-out", "plot"])
def test_other_outputs_on_a_full_disk(study, tiny_disk, tmp_path, root, option):
    fill(tiny_disk, 4 * 1024)
    if option == "plot":
        data = tmp_path / "s.nc"
        assert sweep(study, data).exit_code == 0
        result = CliRunner().invoke(app, ["plot", str(data), "--out", str(tiny_disk / "fig.png")])
    else:
        result = CliRunner().invoke(app, ["run", str(study), "--requests-out", str(tiny_disk / "r.nc")])
    assert result.exit_code == 2, result.output
    said = [line for line in result.stderr.strip().splitlines() if not line.startswith("compiling kernels")]
    assert len(said) == 1 and str(tiny_disk) in said[0] and "no space left" in said[0].lower(), said
    assert sorted(p.name for p in tiny_disk.iterdir()) == ["filler"]  # no partial file left


def test_outputs_on_a_read_only_file_system_are_refused_before_any_work(study, tmp_path, root):
    """Every command that writes a file refuses, naming it, one that cannot be created there."""
    mount = tmp_path / "ro"
    mount.mkdir()
    if sys.platform != "linux" or os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a read-only tmpfs needs root on Linux")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        for args in (["sweep", study, "--out", mount / "a.nc"], ["capacity", study, "--out", mount / "new" / "a.nc"],
                     ["run", study, "--requests-out", mount / "r.nc"],
                     ["calibrate", root / "configs/h100.yaml", root / "configs/calibration/vllm-2026-02-h100.csv",
                      "--out", mount / "c.yaml"]):
            result = CliRunner().invoke(app, [str(a) for a in args])
            assert result.exit_code == 2, result.output
            assert result.stderr.strip().splitlines() == [f"error: {args[-2]} {args[-1]}: cannot write here "
                                                           "(Read-only file system)"]
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=False)


# --- interrupts

def load_sweep(tmp_path, root, n_requests: int, rates: list[float]):
    """A study over configs/h100.yaml: one setting, a point per rate of ``n_requests``."""
    config = tmp_path / "load.yaml"
    config.write_text(f"extends: {root / 'configs/h100.yaml'}\nworkload:\n  n_requests: {n_requests}\n"
                      f"sweep:\n  workload.rate: {rates}\n  engine.max_batch: [64]\n"
                      "  engine.max_batched_tokens: [8192]\n")
    return config


def start(cmd: list[str], partial, records: int, **popen) -> subprocess.Popen:
    """Start ``cmd``; return once its checkpoint ``partial`` holds ``records`` points."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **popen)
    deadline = time.monotonic() + 120
    while not (partial.exists() and partial.stat().st_size >= Checkpoint.HEADER_BYTES + records * record_size()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.002)
    return proc


@pytest.mark.parametrize("where", [[], ["--scheduler", "local"]], ids=["threads", "local-dask"])
def test_ctrl_c_on_long_points_takes_effect_at_once(tmp_path, root, where):
    """Points of 4 M requests (over a second each): Ctrl-C, sent to the process group as a
    terminal does, ends the sweep without waiting for the points in flight, keeps the ones that
    finished, and no worker prints anything."""
    config = load_sweep(tmp_path, root, 4_000_000, [4, 8, 16, 32])
    out = tmp_path / "out.nc"
    partial = checkpoint_path(out)
    cmd = [sys.executable, "-m", "fastsim", "sweep", str(config), "--out", str(out), "--workers", "2", "--quiet",
           *where]
    proc = start(cmd, partial, 1, start_new_session=True)
    time.sleep(0.3)  # the next points are well under way
    os.killpg(proc.pid, signal.SIGINT)
    sent = time.monotonic()
    _, stderr = proc.communicate(timeout=60)
    took = time.monotonic() - sent
    assert proc.returncode == 130, stderr
    said = [line for line in stderr.strip().splitlines() if not line.startswith("compiling kernels")]  # a cold cache
    assert said == [f"error: interrupted; finished points are kept in {partial}: rerun with --resume"]
    assert took < 1.0, took  # a point of 4 M requests takes over a second: it was not waited for
    kept = (partial.stat().st_size - Checkpoint.HEADER_BYTES) // record_size()
    assert 1 <= kept < 4


def test_compiled_work_leaves_the_main_thread_to_wait():
    """in_worker runs a call from the main thread on the main thread's worker (Ctrl-C interrupts
    only the wait), with its result or its exception; from any other thread, in place."""
    import threading

    from fastsim.sweep.backends import in_worker

    where = []

    def record() -> int:
        where.append(threading.current_thread())
        return 7

    assert in_worker(record) == 7 and where[-1] is not threading.main_thread()
    with pytest.raises(ZeroDivisionError):
        in_worker(lambda: 1 / 0)
    other = threading.Thread(target=in_worker, args=(record,))
    other.start()
    other.join()
    assert where[-1] is other


def _loading_numpy(pid: int) -> bool:
    """The process has begun loading NumPy: fastsim's own code runs (Python's start-up is over)."""
    try:
        return "_multiarray_umath" in open(f"/proc/{pid}/maps").read()
    except OSError:
        return False


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
@pytest.mark.parametrize("after_s", [0.0, 0.5, 2.0], ids=["loading", "starting", "simulating"])
def test_ctrl_c_ends_one_long_run_at_once_and_cleanly(root, after_s):
    """A run of 8 M requests (seconds of kernel, which cannot be interrupted): Ctrl-C, at a
    moment of its start-up or of its simulation, ends it at once with exit code 130 and one
    line, never a crash (it once segfaulted: KeyboardInterrupt landed in the Python that compiled
    code calls back). tests/stress_interrupt.py sends 200 at random moments."""
    cmd = [sys.executable, "-X", "faulthandler", "-m", "fastsim", "run", str(root / "configs/h100.yaml"),
           "--set", "workload.n_requests=8000000", "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while not _loading_numpy(proc.pid):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.001)
    time.sleep(after_s)
    assert proc.poll() is None, "the run ended before its interrupt"
    os.killpg(proc.pid, signal.SIGINT)
    sent = time.monotonic()
    _, stderr = proc.communicate(timeout=60)
    took = time.monotonic() - sent
    said = [line for line in stderr.strip().splitlines() if not line.startswith("compiling kernels")]
    assert proc.returncode == 130 and said == ["error: interrupted"], stderr
    assert took < 3.0, took  # ~0.05 s; generous for a loaded machine


def test_forked_workers_end_quietly_when_their_parent_is_killed(tmp_path, root):
    """Many small points run in forked worker processes; SIGKILL to the parent alone: the
    workers end with it, and nothing (no broken-pipe traceback) reaches stderr."""
    seeds = ", ".join(map(str, range(40000)))
    config = tmp_path / "many.yaml"
    config.write_text(f"extends: {root / 'configs/h100.yaml'}\nworkload:\n  n_requests: 100\n"
                      f"sweep:\n  workload.seed: [{seeds}]\n")
    out = tmp_path / "out.nc"
    partial = checkpoint_path(out)
    cmd = [sys.executable, "-m", "fastsim", "sweep", str(config), "--out", str(out), "--workers", "2", "--quiet"]
    proc = start(cmd, partial, 1)
    children = [int(p) for p in open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()]
    assert children, "the points should run in forked workers"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    stderr = proc.stderr.read()  # returns once every writer (the workers too) has exited
    said = [line for line in stderr.splitlines() if not line.startswith("compiling kernels")]
    assert said == [], stderr
    def alive(pid: int) -> bool:
        try:
            return open(f"/proc/{pid}/stat").read().split()[2] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + 10  # the workers die with the parent; multiprocessing's tracker soon after
    while any(alive(child) for child in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(child) for child in children)


@pytest.mark.parametrize("records", [0, 1, 3])
def test_sigkill_at_any_moment_then_resume_gives_the_identical_dataset(tmp_path, root, records):
    """Killed with no point recorded yet (the header alone), after one, after three."""
    config = load_sweep(tmp_path, root, 150_000, [4, 8, 16, 32, 48])
    out = tmp_path / "out.nc"
    partial = checkpoint_path(out)
    cmd = [sys.executable, "-m", "fastsim", "sweep", str(config), "--out", str(out), "--workers", "1", "--quiet"]
    proc = start(cmd, partial, records)
    proc.kill()
    proc.communicate(timeout=30)
    assert not out.exists()
    resumed = sweep(config, out, "--resume")
    assert resumed.exit_code == 0, resumed.output
    reference = tmp_path / "reference.nc"
    assert sweep(config, reference).exit_code == 0
    xr.testing.assert_identical(xr.load_dataset(reference).drop_attrs(), xr.load_dataset(out).drop_attrs())
