"""Calls per second of ``ascend-emu replay`` on a synthetic msprobe dump: in process, on a process
pool and on a local Ray.

Writes ``tests/synthetic_msprobe.py``'s dump (``--layers`` layers of ``npu_kv_rmsnorm_rope_cache``
and ``npu_lightning_indexer``, default 61, ``--steps`` steps, ``--ranks`` ranks; ``--prolog`` adds
``npu_mla_prolog_v3`` with its FRACTAL_NZ weights rebuilt from the dump's casts, and
``npu_sparse_flash_attention``) into a temporary directory, replays it once untimed (kernel
compilation, the page cache), then with each ``-n`` of ``--workers`` and, with ``--ray``, on a
local Ray of ``--ray`` CPUs, and prints calls per second.

The time per call outside the op itself: for ``-n 1``, the wall time per call minus the time
spent in :func:`ascend_emu.compare.calls.replay` (the emulator's run of the call), i.e. loading
the tensors, comparing, writing the emulator's outputs and the result file. For a pool or Ray,
the CPU time per call (wall time x workers / calls) minus that ``-n 1`` op time: the same work
plus the engine's own cost and starting its workers (each imports torch and ascend_emu, loads
the kernels), a figure that falls as the dump grows. Ray's own start (``ray.init``) is timed
apart and not counted in its calls per second.

Usage: ``python benchmarks/bench_replay.py [--layers 61] [--steps 1] [--ranks 2] [--workers 1 2]
[--ray 2] [--prolog]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=61)
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--ray", type=int, default=0, metavar="CPUS", help="also on a local Ray of CPUS CPUs (0: not)")
    p.add_argument("--prolog", action="store_true", help="add npu_mla_prolog_v3 and npu_sparse_flash_attention")
    ns = p.parse_args(argv)

    from ascend_emu.compare import msprobe
    from ascend_emu.workers import RayEngine, init_ray
    from tests.synthetic_msprobe import write_dump

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "dump"
        calls = len(write_dump(root, layers=ns.layers, steps=ns.steps, ranks=ns.ranks, prolog=ns.prolog))
        msprobe.replay_dump(root, Path(tmp) / "warm", workers=1)
        real = msprobe.replay
        inside = [0.0]

        def timed(call):
            t0 = time.perf_counter()
            try:
                return real(call)
            finally:
                inside[0] += time.perf_counter() - t0

        ops = 4 if ns.prolog else 2
        print(f"{calls} calls ({ns.layers} layers x {ns.steps} step(s) x {ns.ranks} rank(s) x {ops} ops), "
              f"{os.cpu_count()} CPU(s) seen")
        op_time = None
        runs = [(f"-n {n}", n, None) for n in ns.workers]
        if ns.ray:
            runs.append((f"Ray ({ns.ray} CPUs)", ns.ray, RayEngine(workers=ns.ray)))
            t0 = time.perf_counter()
            ray = init_ray(num_cpus=ns.ray)
            print(f"Ray start (ray.init, not counted below): {time.perf_counter() - t0:.2f} s")
        for label, n, engine in runs:
            inside[0] = 0.0
            msprobe.replay = timed if n == 1 and engine is None else real
            t0 = time.perf_counter()
            msprobe.replay_dump(root, Path(tmp) / f"emu-{label.replace(' ', '')}", workers=n, engine=engine)
            wall = time.perf_counter() - t0
            msprobe.replay = real
            line = f"{label}: {calls / wall:8.1f} calls/s ({wall:.2f} s)"
            if n == 1 and engine is None:
                op_time = inside[0] / calls
                line += f"; outside the op: {wall / calls * 1e3 - op_time * 1e3:.2f} ms per call"
            elif op_time is not None:
                line += (f"; outside the op: {(wall * n / calls - op_time) * 1e3:.2f} ms CPU per call (worker "
                         "start-up included)")
            print(line)
        if ns.ray:
            ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
