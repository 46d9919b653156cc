"""``ascend-emu warmup`` (or ``demo``) with a cold and then a warm on-disk kernel cache, each in a fresh process.

Cold: ``NUMBA_CACHE_DIR`` set to a new empty directory, so every kernel is compiled (what a fresh
install or a new Numba version pays once), once per ``--jobs`` value given (each in its own new
directory: ``-j 1`` compiles in the command's process, ``-j N`` in N worker processes sharing the
cache), with each cold time's ratio to the first. Warm: the command again with the last
directory, so every kernel is loaded from it (what each later ``ascend-emu warmup`` pays).
Printed: the wall time of each whole process (interpreter start and imports included) and the
total the command itself reports, and the 1-minute load average before the run (other jobs on the
machine take cores from the workers). The directories are removed afterwards unless ``--keep`` is given.

``--demo``: the same for ``ascend-emu demo -j N`` (its first run compiles only the kernels its ops
use, in N worker processes while it runs; the last line shown is its report of the compiling);
``--rounds R`` repeats the cold runs R times, alternating the ``--jobs`` values.

Usage: ``PYTHONPATH=. python benchmarks/bench_warmup.py [--demo] [--jobs 1,2] [--rounds 1] [--warm-runs 1] [--keep]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed_warmup(cache_dir: str, jobs: int, demo: bool = False) -> tuple[float, str]:
    """Run ``python -m ascend_emu warmup --quiet -j jobs`` (``demo``: ``demo -j jobs``) with
    ``NUMBA_CACHE_DIR=cache_dir``; return its wall time in seconds and its last output line (the
    demo's line about its first calls). Raises ``RuntimeError`` if it fails."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir, PYTHONPATH=path, COLUMNS="1000")
    command = ["demo"] if demo else ["warmup", "--quiet"]
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "ascend_emu", *command, "-j", str(jobs)], env=env, cwd=ROOT,
                          capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"ascend-emu {command[0]} exited {proc.returncode}: {proc.stderr[-2000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip() and (not demo or ln.startswith("first calls:"))]
    return wall, lines[-1] if lines else ""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", default="1,2", help="comma-separated --jobs values, each cold (default 1,2)")
    p.add_argument("--warm-runs", type=int, default=1, help="warm runs after the cold ones (default 1)")
    p.add_argument("--keep", action="store_true", help="keep the cache directories (their paths are printed)")
    p.add_argument("--demo", action="store_true", help="time ascend-emu demo instead of warmup")
    p.add_argument("--rounds", type=int, default=1, help="cold runs of each --jobs value, alternating (default 1)")
    a = p.parse_args()
    dirs = []
    try:
        first = None
        for _ in range(a.rounds):
            for jobs in (int(j) for j in a.jobs.split(",")):
                dirs.append(tempfile.mkdtemp(prefix="ascend_emu_bench_warmup_"))
                load = os.getloadavg()[0]
                wall, said = timed_warmup(dirs[-1], jobs, a.demo)
                first = first or wall
                print(f"cold cache, -j {jobs}: {wall:6.1f} s  {wall / first:5.2f}x  load {load:4.2f}   ({said})",
                      flush=True)
        for _ in range(a.warm_runs):
            load = os.getloadavg()[0]
            wall, said = timed_warmup(dirs[-1], jobs, a.demo)
            print(f"warm cache, -j {jobs}: {wall:6.1f} s  load {load:4.2f}   ({said})", flush=True)
    finally:
        for d in dirs:
            if a.keep:
                print(f"cache kept in {d}")
            else:
                shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
