"""DeepSeek-V4 cache writers against a copy-bandwidth floor, every writer in one run.

For each token count T (``--tokens``, default 1, 16, 128 and 1024) and each writer it prints the
op's time per call and its ratio to the machine floor (``benchmarks/_floor.py``): the bytes the
writer must read (x, slot_mapping) and write (the rows it places) moved at the machine's copy
bandwidth. Writers: ``kv_compress_epilog`` layout 1 (640-byte rows, d 512; quant_mode 2, and
quant_mode 1 with fp32 scales, quant_mode 3's HiF8 rows of 512 bytes) and layout 2 (the paged split, block 128),
``indexer_compress_epilog`` (fp8 keys + fp32 scales, and the MX form with E8M0 bytes, d 128) and
``indexer_compress_epilog_v2`` (packed uint8 cache, d 128); slots distinct and shuffled over a
cache of ``--slots`` rows. Scatter writers (``npu_scatter_nd_update_v2`` and kin) join the table by
themselves once ``ascend_emu.ops`` has them (:func:`scatter_cases`, the hook). The SoC is set to
an Ascend 950 for the run (the epilogs are 950 ops).

Time per call: the best average over ``--rounds`` alternating rounds of ``--calls`` calls after a
warm-up round (``benchmarks/_timing.py``).

Usage: ``python benchmarks/bench_v4_writers.py [--tokens 1 16 128 1024] [--slots 8192] [--calls 5] [--rounds 7]``
"""

from __future__ import annotations

import argparse
import os

os.environ["ASCEND_EMU_SOC_NAME"] = "Ascend950PR_9599"  # read at every call: the epilogs are 950 ops

import ascend_emu  # noqa: E402,F401  (before torch, as the other benchmarks: docs/performance.md "Threads")
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from _floor import MachineFloor, floor_line, movement, ratio_line  # noqa: E402
from _timing import best_times  # noqa: E402

from ascend_emu import ops  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
D_KV, ROW, D_IDX, BLOCK = 512, 640, 128, 128


def writer_cases(rng, t: int, n_slots: int) -> list[tuple[str, object, int, int]]:
    """``(name, call, bytes read, bytes written)`` of each epilog writer for T tokens."""
    slots = rng.permutation(n_slots)[:t].astype(np.int32)
    x = (rng.standard_normal((t, D_KV)) * 4).astype(BF16)
    xi = (rng.standard_normal((t, D_IDX)) * 4).astype(BF16)
    blocks = -(-n_slots // BLOCK)
    kv1 = np.zeros((n_slots, 1, ROW), FP8)
    kvh = np.zeros((n_slots, D_KV), np.uint8)
    kv2 = np.zeros((blocks, BLOCK, 1, ROW), FP8)
    ic, isc = np.zeros((n_slots, D_IDX), FP8), np.zeros((n_slots, 1), np.float32)
    imx = np.zeros((n_slots, 1), ml_dtypes.float8_e8m0fnu)
    iv2 = np.zeros((blocks, BLOCK, 1, D_IDX + 4), np.uint8)
    read_kv, read_idx = x.nbytes + slots.nbytes, xi.nbytes + slots.nbytes
    return [
        ("kv_compress_epilog L1", lambda: ops.kv_compress_epilog(kv1, x, slots), read_kv, t * ROW),
        ("kv_compress_epilog L2", lambda: ops.kv_compress_epilog(kv2, x, slots, layout=2), read_kv, t * (576 + 8)),
        ("kv_compress_epilog L1 mode 1", lambda: ops.kv_compress_epilog(kv1, x, slots, quant_group_size=128,
                                                                         quant_mode=1), read_kv, t * ROW),
        ("kv_compress_epilog L1 HiF8", lambda: ops.kv_compress_epilog(kvh, x, slots, quant_group_size=128, quant_mode=3,
                                                                       scale=0.5), read_kv, t * D_KV),
        ("indexer_compress_epilog", lambda: ops.indexer_compress_epilog(ic, isc, xi, slots), read_idx, t * (D_IDX + 4)),
        ("indexer_compress_epilog MX", lambda: ops.indexer_compress_epilog(ic, imx, xi, slots, quant_mode=0), read_idx,
         t * (D_IDX + 1)),
        ("indexer_compress_epilog_v2", lambda: ops.indexer_compress_epilog_v2(iv2, xi, slots), read_idx,
         t * (D_IDX + 4)),
    ]


def scatter_cases(rng, t: int, n_slots: int) -> list[tuple[str, object, int, int]]:
    """The hook for the V4 scatter writers: ``npu_scatter_nd_update_v2`` (bf16 SWA rows of 512 by
    ``[block, offset]``), once ``ascend_emu.ops`` has it; empty before. A case whose call is
    refused is reported and left out."""
    fn = getattr(ops, "npu_scatter_nd_update_v2", None) if "npu_scatter_nd_update_v2" in ops.__all__ else None
    if fn is None:
        return []
    slots = rng.permutation(n_slots)[:t]
    blocks = -(-n_slots // BLOCK)
    cache = np.zeros((blocks, BLOCK, 1, D_KV), BF16)
    idx = np.stack([slots // BLOCK, slots % BLOCK], axis=1).astype(np.int32)
    upd = (rng.standard_normal((t, 1, D_KV))).astype(BF16)
    try:
        fn(cache, idx, upd)
    except Exception as exc:  # the hook guesses the call; say why it is left out
        print(f"  (npu_scatter_nd_update_v2 left out: {type(exc).__name__}: {exc})")
        return []
    return [("npu_scatter_nd_update_v2", lambda: fn(cache, idx, upd), upd.nbytes + idx.nbytes, upd.nbytes)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 128, 1024], help="token counts T")
    parser.add_argument("--slots", type=int, default=8192, help="cache rows (slots)")
    parser.add_argument("--calls", type=int, default=5, help="calls per timed round")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"DeepSeek-V4 cache writers  cache {args.slots} slots, kv d {D_KV} ({ROW}-byte rows), indexer d {D_IDX}")
    for t in args.tokens:
        cases = writer_cases(rng, t, args.slots) + scatter_cases(rng, t, args.slots)
        floors = [MachineFloor([movement("x -> rows", read, written)]) for _, _, read, written in cases]
        fns = [f for pair in zip([c[1] for c in cases], floors, strict=True) for f in pair]
        times = best_times(fns, args.rounds, number=args.calls)
        for (name, *_), floor, op_t, floor_t in zip(cases, floors, times[0::2], times[1::2], strict=True):
            print(f"T={t:5d}  {name:29s} {op_t * 1e6:9.1f} us/call  {floor_line(floor, floor_t, 'us')}  "
                  f"{ratio_line(name, op_t, floor_t)}")


if __name__ == "__main__":
    main()
