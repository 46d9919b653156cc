"""DeepSeek-V4 mHC: ``npu_hc_pre_v2`` (and ``npu_hc_post``) against the machine floor, in one run.

For each token count T (``--tokens``, default 1, 16 and 128; hc 4, D 4096 as DeepSeek-V4-Flash)
it prints the op's time per call and its ratio to the machine floor (``benchmarks/_floor.py``):
for hc_pre the product ``x [T, 4D] @ hc_fn^T [4D, 24]`` on the fastest engine the machine has for
fp32 operands (the op's HF32 operands are fp32 values) plus the data hc_pre moves otherwise
(x read for y, y written) at the copy bandwidth; for hc_post the bytes it reads (x, residual,
post, comb) and writes (out) at the copy bandwidth. Time per call: the best average over
``--rounds`` alternating rounds of ``--calls`` calls after a warm-up round (``benchmarks/_timing.py``).

Usage: ``python benchmarks/bench_hc.py [--tokens 1 16 128] [--calls 5] [--rounds 7]``
"""

from __future__ import annotations

import argparse

import ascend_emu  # noqa: F401  (before torch, as the other benchmarks: docs/performance.md "Threads")
import ml_dtypes
import numpy as np
from _floor import MachineFloor, floor_line, movement, product, ratio_line
from _timing import best_times

from ascend_emu.ops import npu_hc_post, npu_hc_pre_v2

BF16 = np.dtype(ml_dtypes.bfloat16)
HC, D, MIX = 4, 4096, 24


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 128], help="token counts T")
    parser.add_argument("--calls", type=int, default=5, help="calls per timed round")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    hc_fn = (rng.random((MIX, HC * D)) / (HC * D)).astype(np.float32)
    scale, base = (rng.random(3) * 2).astype(np.float32), (rng.random(MIX) * 2).astype(np.float32)
    print(f"mHC  hc={HC} D={D}")
    for t in args.tokens:
        x = (rng.random((t, HC, D)) * 2).astype(BF16)
        y, post, comb = npu_hc_pre_v2(x, hc_fn, scale, base, HC, 20, 1e-6, 1e-6)

        def pre(x=x):
            npu_hc_pre_v2(x, hc_fn, scale, base, HC, 20, 1e-6, 1e-6)

        def post_op(y=y, x=x, post=post, comb=comb):
            npu_hc_post(y, x, post, comb)

        pre_floor = MachineFloor([product("x@hc_fn^T", x.reshape(t, HC * D).astype(np.float32), hc_fn.T),
                                  movement("x -> y", x.nbytes, y.nbytes)])
        post_floor = MachineFloor([movement("x, residual -> out", y.nbytes + x.nbytes + post.nbytes + comb.nbytes,
                                            x.nbytes)])
        t_pre, t_pre_floor, t_post, t_post_floor = best_times([pre, pre_floor, post_op, post_floor], args.rounds,
                                                              number=args.calls)
        print(f"T={t:4d}  hc_pre  {t_pre * 1e6:9.1f} us/call  {floor_line(pre_floor, t_pre_floor, 'us')}  "
              f"{ratio_line('hc_pre', t_pre, t_pre_floor)}")
        print(f"T={t:4d}  hc_post {t_post * 1e6:9.1f} us/call  {floor_line(post_floor, t_post_floor, 'us')}  "
              f"{ratio_line('hc_post', t_post, t_post_floor)}")


if __name__ == "__main__":
    main()
