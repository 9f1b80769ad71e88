"""Ctrl-C at random moments of one long ``fastsim run``, many times: every interrupt must end the
process with exit code 130 within a second, never with a crash (a signal's negative exit code).

Not collected by pytest (its name does not start with ``test_``); run it by hand after touching
how runs or signals are handled (docs/running.md, "Commands"):

    python tests/stress_interrupt.py                 # 200 interrupts of 8 M requests, ~20 minutes on 2 cores
    python tests/stress_interrupt.py --runs 20 --requests 2000000

Each run starts in a session of its own and gets SIGINT sent to its whole process group, as a
terminal's Ctrl-C is, at a moment drawn uniformly over an uninterrupted run's length (start-up,
traffic, kernel, metrics, printing), until that many have landed (a run that ended first does
not count). Python's faulthandler is on in the children: a crash prints its threads' stacks,
which this script shows. An interrupt in the first few ms, while Python itself starts (its
site module, before any of fastsim's code), ends as Python ends it: counted apart. Exit code 0
when every other interrupt ended the run with 130 within a second.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT_S = 1.0  # the longest an interrupt may take to end the run


def command(requests: int) -> list[str]:
    return [sys.executable, "-X", "faulthandler", "-m", "fastsim", "run", str(ROOT / "configs/h100.yaml"),
            "--set", f"workload.n_requests={requests}", "--json"]


def start(requests: int) -> subprocess.Popen:
    return subprocess.Popen(command(requests), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, cwd=ROOT)


def interrupt(requests: int, after_s: float) -> tuple[int | None, float, str]:
    """One run, interrupted ``after_s`` seconds after its start: (exit code, seconds from the
    signal to the end, stderr); exit code None when the run ended before the signal."""
    proc = start(requests)
    try:
        proc.wait(timeout=after_s)
        return None, 0.0, proc.stderr.read()
    except subprocess.TimeoutExpired:
        pass
    os.killpg(proc.pid, signal.SIGINT)
    sent = time.monotonic()
    try:
        _, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        return proc.returncode, time.monotonic() - sent, "hung for 60 s: killed\n" + stderr
    return proc.returncode, time.monotonic() - sent, stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="interrupts to land (default 200)")
    parser.add_argument("--requests", type=int, default=8_000_000, help="requests of the run (default 8 M)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the moments drawn")
    args = parser.parse_args()
    began = time.monotonic()
    whole = start(args.requests)  # also compiles the kernels, once, if the cache is cold
    _, stderr = whole.communicate()
    if whole.returncode != 0:
        print(f"an uninterrupted run failed (exit {whole.returncode}):\n{stderr}", file=sys.stderr)
        return 1
    length = time.monotonic() - began
    if "compiling kernels" in stderr:  # time a run that loads them from the cache instead
        began = time.monotonic()
        start(args.requests).communicate()
        length = time.monotonic() - began
    print(f"an uninterrupted run of {args.requests:,} requests: {length:.2f} s; {args.runs} interrupts at random "
          f"moments within it", flush=True)
    rng = random.Random(args.seed)
    stops: list[float] = []
    codes: dict[int, int] = {}
    failures = python_start = ended_first = 0
    while len(stops) < args.runs and ended_first < args.runs:
        after = rng.uniform(0.0, length)
        code, took, stderr = interrupt(args.requests, after)
        if code is None or code == 0:  # the run was faster than the one timed (a shared machine), or
            ended_first += 1  # had done its work: on its way out it ignores Ctrl-C (cli.main); draw again
            continue
        stops.append(took)
        codes[code] = codes.get(code, 0) + 1
        # before any of fastsim's code, Python's own start-up: its SIGINT handler not yet installed
        # (killed by the signal, saying nothing), or its site module running (a traceback there)
        if code != 130 and ("<frozen site>" in stderr or (code == -signal.SIGINT and not stderr.strip())):
            python_start += 1
            print(f"interrupt {len(stops)} at {after * 1e3:.0f} ms, in Python's own start-up: exit {code}",
                  flush=True)
        elif code != 130 or took > LIMIT_S:
            failures += 1
            print(f"interrupt {len(stops)} at {after:.3f} s: exit {code} after {took:.3f} s\n{stderr}", flush=True)
    if not stops:
        print("every run ended before its interrupt: nothing measured", file=sys.stderr)
        return 1
    print(f"{len(stops)} interrupts ({ended_first} more runs ended first): exit codes "
          f"{', '.join(f'{c} x{n}' for c, n in sorted(codes.items()))}; stop time median "
          f"{statistics.median(stops) * 1e3:.0f} ms, p90 {sorted(stops)[int(0.9 * (len(stops) - 1))] * 1e3:.0f} ms, "
          f"max {max(stops) * 1e3:.0f} ms; {python_start} in Python's own start-up; {failures} failed (exit other "
          f"than 130, or over {LIMIT_S:g} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
