"""Calls per second of ``ascend-emu replay`` on a synthetic msprobe dump, in process and on a pool.

Writes ``tests/synthetic_msprobe.py``'s dump (``--layers`` layers of ``npu_kv_rmsnorm_rope_cache``
and ``npu_lightning_indexer``, default 61, ``--steps`` steps, ``--ranks`` ranks) into a temporary
directory, replays it once untimed (kernel compilation, the page cache), then with each ``-n``
of ``--workers`` and prints calls per second. For ``-n 1`` it also prints the time per call
outside the op itself: the wall time per call minus the time spent in
:func:`ascend_emu.compare.calls.replay` (the emulator's run of the call), i.e. loading the
tensors, comparing, writing the emulator's outputs and the result file. A pool's figure
includes starting its worker processes.

Usage: ``python benchmarks/bench_replay.py [--layers 61] [--steps 1] [--ranks 2] [--workers 1 2]``.
"""

from __future__ import annotations

import argparse
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
    ns = p.parse_args(argv)

    from ascend_emu.compare import msprobe
    from tests.synthetic_msprobe import write_dump

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "dump"
        calls = len(write_dump(root, layers=ns.layers, steps=ns.steps, ranks=ns.ranks))
        msprobe.replay_dump(root, Path(tmp) / "warm", workers=1)
        real = msprobe.replay
        inside = [0.0]

        def timed(call):
            t0 = time.perf_counter()
            try:
                return real(call)
            finally:
                inside[0] += time.perf_counter() - t0

        print(f"{calls} calls ({ns.layers} layers x {ns.steps} step(s) x {ns.ranks} rank(s) x 2 ops)")
        for n in ns.workers:
            inside[0] = 0.0
            msprobe.replay = timed if n == 1 else real
            t0 = time.perf_counter()
            msprobe.replay_dump(root, Path(tmp) / f"emu{n}", workers=n)
            wall = time.perf_counter() - t0
            msprobe.replay = real
            line = f"-n {n}: {calls / wall:8.1f} calls/s ({wall:.2f} s)"
            if n == 1:
                line += f"; outside the op: {(wall - inside[0]) / calls * 1e3:.2f} ms per call"
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
