"""DeepSeek-V4 row scatters against the machine's copy bandwidth, in one run:
``npu_scatter_nd_update_v2`` / ``_sk`` (``[n, 2]`` (block, offset) rows into a bf16 SWA cache
``[blocks, 128, 1, 512]``, one padding row ``[-1, 127]`` among them, as vllm-ascend's
``dsa_kv_compress_scatter`` calls it) and ``scatter_nd_update_asc`` (flat ``[n, 1]`` rows into the
same cache viewed ``[rows, 512]``, as cann-recipes-infer's ``update_win_kv``).

For each row count n (``--tokens``, default 1, 128 and 4096: decode, a small and a large prefill)
it prints each op's time per call and its ratio to the machine floor (``benchmarks/_floor.py``):
the bytes the op reads (update rows and indices) and writes (the cache rows) at the copy
bandwidth. The op also validates every index and looks for duplicate slots; at small n its
per-call checks dominate. Time per call: the best average over ``--rounds`` alternating rounds
of ``--calls`` calls after a warm-up round (``benchmarks/_timing.py``).

:func:`cases` builds the calls and floors for one n, for a script that prints the V4 writers
together.

Usage: ``python benchmarks/bench_v4_scatter.py [--tokens 1 128 4096] [--blocks 64] [--calls 5] [--rounds 7]``
"""

from __future__ import annotations

import argparse

import ascend_emu  # noqa: F401  (before torch, as the other benchmarks: docs/performance.md "Threads")
import ml_dtypes
import numpy as np
from _floor import MachineFloor, floor_line, movement, ratio_line
from _timing import best_times

from ascend_emu.ops import npu_scatter_nd_update_sk, npu_scatter_nd_update_v2, scatter_nd_update_asc

BF16 = np.dtype(ml_dtypes.bfloat16)
BLOCK_SIZE, D = 128, 512


def cases(rng: np.random.Generator, n: int, blocks: int) -> list[tuple[str, object, MachineFloor]]:
    """``(name, call, machine floor)`` of each row scatter for ``n`` rows into a bf16
    ``[blocks, 128, 1, 512]`` cache (distinct slots; the last row is the padding ``[-1, 127]``)."""
    cache = np.zeros((blocks, BLOCK_SIZE, 1, D), BF16)
    slots = rng.choice(blocks * BLOCK_SIZE, size=n, replace=False).astype(np.int64)  # [n]
    pairs = np.stack([slots // BLOCK_SIZE, slots % BLOCK_SIZE], axis=1).astype(np.int32)  # [n, 2]
    flat = slots.reshape(n, 1).copy()
    if n > 1:
        pairs[-1], flat[-1] = (-1, BLOCK_SIZE - 1), -1
    x = rng.standard_normal((n, 1, D), dtype=np.float32).astype(BF16)
    rows = cache.reshape(-1, D)
    floor_2 = MachineFloor([movement("rows", x.nbytes + pairs.nbytes, x.nbytes)])
    floor_1 = MachineFloor([movement("rows", x.nbytes + flat.nbytes, x.nbytes)])
    return [
        ("npu_scatter_nd_update_v2", lambda: npu_scatter_nd_update_v2(cache, pairs, x), floor_2),
        ("npu_scatter_nd_update_sk", lambda: npu_scatter_nd_update_sk(cache, pairs, x), floor_2),
        ("scatter_nd_update_asc", lambda: scatter_nd_update_asc(rows, flat, x.reshape(n, D)), floor_1),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 128, 4096], help="row counts n")
    parser.add_argument("--blocks", type=int, default=64, help="cache blocks of 128 rows (at least n / 128)")
    parser.add_argument("--calls", type=int, default=5, help="calls per timed round")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"V4 row scatters  bf16 cache [{args.blocks}, {BLOCK_SIZE}, 1, {D}]")
    for n in args.tokens:
        runs = cases(rng, n, max(args.blocks, -(-n // BLOCK_SIZE)))
        times = best_times([f for _, call, floor in runs for f in (call, floor)], args.rounds, number=args.calls)
        for i, (name, _, floor) in enumerate(runs):
            t_op, t_floor = times[2 * i], times[2 * i + 1]
            print(f"n={n:5d}  {name:25s} {t_op * 1e6:9.1f} us/call  {floor_line(floor, t_floor, 'us')}  "
                  f"{ratio_line(name, t_op, t_floor)}")


if __name__ == "__main__":
    main()
