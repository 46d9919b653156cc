"""Thread scaling of the benchmarks: each one run at 1, 2, 4, ... threads, one process per count.

Every run sets ``OPENBLAS_NUM_THREADS``, ``NUMBA_NUM_THREADS``, ``OMP_NUM_THREADS`` and
``MKL_NUM_THREADS`` to the count, and passes ``--threads N`` to the scripts that take it (they also
set torch's count). Each run's whole output goes to ``<log dir>/<bench>-<N>.txt``; the lines with a
first lines are printed here, so one screen shows how a benchmark moves with the thread count.
A run past ``--timeout`` seconds is stopped and reported as such; the others go on.

    python benchmarks/thread_scaling.py --threads 1,2,4,8,16 --logs /tmp/scaling
    python benchmarks/thread_scaling.py --only sparse_attention indexer --threads 1,16

The set of runs (:data:`RUNS`) is decode-sized work at the benchmarks' default shapes, cut to a
few rounds so that the whole set at five thread counts takes a few minutes on 16 cores.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: (name, script, arguments, takes --threads): the runs, each at every thread count.
RUNS = (
    ("sparse_attention", "bench_sparse_attention.py", ["--repeat", "5"], True),
    ("indexer", "bench_lightning_indexer.py", ["--calls", "10"], False),
    ("fia_c8", "bench_fused_infer_attention_score.py", ["--c8", "--repeat", "2", "--cases", "16x128x1024", "64x16x2048"], True),
    ("fia_bf16", "bench_fused_infer_attention_score.py", ["--repeat", "2", "--cases", "16x128x1024", "64x16x2048"], True),
    ("mla_preprocess", "bench_mla_preprocess.py", ["--repeat", "5"], True),
    ("kv_rmsnorm_rope_cache", "bench_kv_rmsnorm_rope_cache.py", ["--calls", "10"], False),
    ("decode_step", "bench_decode_step.py", ["--layers", "8", "--repeat", "2", "--no-drop-in"], False),
)

#: Lines printed per run (the whole output is in the log file).
MAX_LINES = 40


def run_one(script: str, args: list[str], threads: int, takes_threads: bool, timeout: float) -> tuple[str, float, bool]:
    """Run one benchmark at ``threads`` threads; returns (output, seconds, timed out)."""
    env = dict(os.environ)
    for name in ("OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = str(threads)
    cmd = [sys.executable, str(HERE / script), *args]
    if takes_threads:
        cmd += ["--threads", str(threads)]
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        out = done.stdout + done.stderr
        if done.returncode:
            out += f"\n[exit status {done.returncode}]"
        return out, time.perf_counter() - start, False
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return out, time.perf_counter() - start, True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2,4,8,16", help="thread counts, comma-separated (default 1,2,4,8,16)")
    parser.add_argument("--only", nargs="*", help="runs whose name contains one of these (default: all)")
    parser.add_argument("--logs", default="thread_scaling_logs", help="directory for each run's whole output")
    parser.add_argument("--timeout", type=float, default=240, help="seconds per run before it is stopped")
    args = parser.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    print(f"cores: {os.cpu_count()}; thread counts: {counts}", flush=True)
    for name, script, extra, takes_threads in RUNS:
        if args.only and not any(o in name for o in args.only):
            continue
        for n in counts:
            out, seconds, timed_out = run_one(script, extra, n, takes_threads, args.timeout)
            (logs / f"{name}-{n}.txt").write_text(out)
            state = "stopped at the time-out" if timed_out else f"{seconds:.0f} s"
            print(f"== {name}, {n} threads ({state})", flush=True)
            lines = [line.rstrip() for line in out.splitlines() if line.strip()]
            for line in lines[:MAX_LINES]:
                print("   " + line, flush=True)
            if len(lines) > MAX_LINES:
                print(f"   ... {len(lines) - MAX_LINES} more lines in {logs / f'{name}-{n}.txt'}", flush=True)


if __name__ == "__main__":
    main()
