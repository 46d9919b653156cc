"""The price of the deterministic mode (docs/numerics.md#deterministic): deterministic / fast time
ratios per op and per product, measured in one run (best of alternating rounds).

Printed:

- per op: each small call of tests/test_deterministic.py's ``FAMILY_CALLS`` (``ascend_emu.warmup``'s
  seeded inputs: the MLA prolog at its real weight sizes, He 7168 and Hcq 1536, with 2 tokens;
  MlaPreprocess at He 2048 with one head; the other ops at tiny kv lengths), fast and
  deterministic;
- per product: the decode-sized products the ops run through ``emu.matmul``: the prolog's
  ``x @ W_dq`` ``[T, 7168] x [7168, 1536]``, ``cq @ W_uq_qr`` ``[T, 1536] x [1536, 3072]``,
  ``x @ W_dkv_kr`` ``[T, 7168] x [7168, 576]`` (bf16 weights, T = 1 and 16), the attention's
  ``S = Q K^T`` ``[16, 576] x [576, kv]`` and ``P V`` ``[16, kv] x [kv, 512]`` per request
  (``--context`` kv), and the int8 ``[16, 512] x [512, kv]`` of the C8 path;
- the decode step of ``ascend-emu demo`` (int8 path, ``--context`` tokens, one layer) with
  ``--step``.

Usage: ``python benchmarks/bench_deterministic.py [--repeat 3] [--context 2048] [--threads N] [--step]``
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _timing import best_times, run_with_threads  # noqa: E402

from ascend_emu import _deterministic, warmup  # noqa: E402
from ascend_emu.emu import matmul  # noqa: E402
from ascend_emu.quant import BF16  # noqa: E402
from tests.test_deterministic import FAMILY_CALLS  # noqa: E402


def deterministic(fn):
    def run():
        with _deterministic.scope(True):
            return fn()
    return run


def products(context: int, rng) -> list[tuple[str, object]]:
    def bf16(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(0.05)).astype(BF16)

    out = []
    for t in (1, 16):
        for label, k, n in (("x @ W_dq", 7168, 1536), ("cq @ W_uq_qr", 1536, 3072), ("x @ W_dkv_kr", 7168, 576)):
            a = bf16(t, k).astype(np.float32)
            w = bf16(k, n)
            out.append((f"prolog {label} [{t}, {k}] x [{k}, {n}] bf16",
                        lambda a=a, w=w: matmul.matmul_weight(a, w)))
    q = bf16(16, 576).astype(np.float32)
    kv = bf16(context, 576).astype(np.float32)
    p = bf16(16, context).astype(np.float32)
    out.append((f"attention S = Q K^T [16, 576] x [576, {context}]", lambda: matmul.matmul_f32(q, kv.T)))
    out.append((f"attention P V [16, {context}] x [{context}, 512]", lambda: matmul.matmul_f32(p, kv[:, :512])))
    q8 = rng.integers(-128, 128, (16, 512), dtype=np.int8)
    k8 = rng.integers(-128, 128, (context, 512), dtype=np.int8)
    out.append((f"C8 int8 q K^T [16, 512] x [512, {context}]", lambda: matmul.matmul_int8(q8, k8, w_nk=True)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="alternating rounds")
    parser.add_argument("--context", type=int, default=2048, help="kv length of the attention products and step")
    parser.add_argument("--threads", type=int, default=None, help="OpenBLAS / Numba / OpenMP threads")
    parser.add_argument("--step", action="store_true", help="also the demo's decode step (one layer)")
    ns = parser.parse_args()
    setup = run_with_threads(ns.threads)
    os.environ.pop(_deterministic.ENV, None)
    print(f"deterministic / fast, best of {ns.repeat} alternating rounds ({setup}, "
          f"int8 engine {matmul.int8_engine()}):")
    rows = []
    calls = {c.name: c for c in warmup._calls()}
    rows += [(f"op {name}", calls[name]) for name in FAMILY_CALLS]
    rows += products(ns.context, np.random.default_rng(0))
    if ns.step:
        from ascend_emu.demo import DecodeStepConfig, run_decode_step

        rep = run_decode_step(DecodeStepConfig(context=ns.context, sparse_count=min(2048, ns.context)))
        rows.append((f"decode step, int8 path, context {ns.context}, one layer", rep.decode_int8))
    width = max(len(label) for label, _ in rows)
    for label, fn in rows:
        fast, det = best_times([fn, deterministic(fn)], ns.repeat)
        print(f"  {label:<{width}}  fast {fast * 1e3:9.3f} ms  deterministic {det * 1e3:9.3f} ms  "
              f"ratio {det / fast:6.2f}")


if __name__ == "__main__":
    main()
