"""DeepSeek-V4's ``compressor`` against the machine floor, in one run.

For the README's three scenarios (C4A: D 512, coff 2, ratio 4; C4Li: D 128, coff 2, ratio 4;
C128A: D 512, coff 1, ratio 128; H 4096 as DeepSeek-V4-Flash, bf16) and two steps (``decode``:
``--batch`` requests of one token each, every one completing a group, so every call pools and
reads the state; ``prefill``: one request of ``--prefill`` tokens from position 0) it prints the
op's time per call and its ratio to the machine floor (``benchmarks/_floor.py``): the product
``x [T, H] @ [wkv; wgate]^T [H, 2 * coff * D]`` on the fastest engine this machine has for bf16
operands, plus the bytes the op moves otherwise at the copy bandwidth (x and the two weights
read, the state rows written and read, the output written). Beside it, in the same rounds, the
"sgemm floor": the same product as one fp32 sgemm on operands widened beforehand (the emulator's
engine for these products) plus the same movement, so that ``op / sgemm floor`` is what the op
adds around its engine and ``sgemm floor / machine floor`` the engine's own gap. Time per call:
the best average over ``--rounds`` alternating rounds of ``--calls`` calls after a warm-up round
(``benchmarks/_timing.py``).

``--cpu-time``: the same alternating rounds (and the machine floor's choice of engine) timed in
process CPU time (``time.process_time``: all the process's threads) instead of wall time, for a
machine shared with other work, where a process waits for a core for a varying part of each
round.

``--nz``: wkv and wgate cast to FRACTAL_NZ (``ascend_emu.layouts.as_nz``, as vllm-ascend's linear
weights with ``weight_nz_mode`` 2), so the op multiplies their widening kept on them.

Usage: ``python benchmarks/bench_compressor.py [--batch 16] [--prefill 512] [--calls 3] [--rounds 5]
[--nz] [--cpu-time] [--threads N]``
(``--threads``: OpenBLAS / Numba / OpenMP threads, ``benchmarks/_timing.py``; without it torch's
oneDNN, and so the machine floor, takes every core while ``OPENBLAS_NUM_THREADS=1
NUMBA_NUM_THREADS=1`` hold the op to one).
"""

from __future__ import annotations

import argparse
import time

import ascend_emu  # noqa: F401  (before torch, as the other benchmarks: docs/performance.md "Threads")
import ml_dtypes
import numpy as np
from _floor import SGEMM, TRIALS, MachineFloor, Part, candidates, floor_line, movement, product, ratio_line
from _timing import best_times, run_with_threads

from ascend_emu.layouts import as_nz
from ascend_emu.ops import compressor

BF16 = np.dtype(ml_dtypes.bfloat16)
H = 4096
SCENARIOS = (("C4A", 512, 2, 4), ("C4Li", 128, 2, 4), ("C128A", 512, 1, 128))


def _case(d, coff, r, lens, starts, rng):
    """Arguments of one call: requests of ``lens`` tokens from positions ``starts``."""
    b, t = len(lens), int(sum(lens))
    bs = 8 if r == 4 else 32
    cols = -(-(max(s + n for s, n in zip(starts, lens, strict=True))) // bs)
    table = (1 + np.arange(b * cols, dtype=np.int32)).reshape(b, cols)
    state = np.zeros((b * cols + 1, bs, 2 * coff * d), np.float32)
    rows = min(t, t // r + b)
    return dict(x=(rng.standard_normal((t, H))).astype(BF16),
                wkv=(rng.standard_normal((coff * d, H)) / 64).astype(BF16),
                wgate=(rng.standard_normal((coff * d, H)) / 64).astype(BF16), state_cache=state,
                ape=rng.standard_normal((r, coff * d)).astype(np.float32), norm_weight=np.ones(d, BF16),
                rope_sin=rng.uniform(-1, 1, (rows, 64)).astype(BF16),
                rope_cos=rng.uniform(-1, 1, (rows, 64)).astype(BF16),
                state_block_table=table, cu_seqlens=np.concatenate([[0], np.cumsum(lens)]).astype(np.int32),
                seqused=None, start_pos=np.array(starts, np.int32), rope_head_dim=64, cmp_ratio=r, coff=coff,
                norm_eps=1e-6, rotary_mode=2, cache_mode=1)


def cpu_best_times(fns, repeat: int, *, number: int = 1) -> list[float]:
    """:func:`_timing.best_times` in process CPU time (``--cpu-time``): seconds per call, the best
    of ``repeat`` alternating rounds after a warm-up round."""
    best = [float("inf")] * len(fns)
    for r in range(repeat + 1):
        for i, fn in enumerate(fns):
            t0 = time.process_time()
            for _ in range(number):
                fn()
            if r:
                best[i] = min(best[i], (time.process_time() - t0) / number)
    return best


def cpu_product(label: str, a: np.ndarray, w: np.ndarray) -> Part:
    """:func:`_floor.product` with the engines timed in process CPU time (``--cpu-time``)."""
    fns = candidates(a, w)
    times = dict(zip(fns, cpu_best_times(list(fns.values()), TRIALS), strict=True))
    name = min(times, key=times.get)
    return Part(label, name, fns[name], times[name], times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16, help="decode requests (one token each)")
    parser.add_argument("--prefill", type=int, default=512, help="prefill tokens (one request)")
    parser.add_argument("--calls", type=int, default=3, help="calls per timed round")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds")
    parser.add_argument("--nz", action="store_true", help="wkv / wgate cast to FRACTAL_NZ (widening kept)")
    parser.add_argument("--cpu-time", action="store_true", help="time in process CPU time (a shared machine)")
    parser.add_argument("--threads", type=int, default=None, help="thread count of every library (restarts)")
    args = parser.parse_args()
    threads = run_with_threads(args.threads)
    rng = np.random.default_rng(0)
    print(f"compressor  H={H} bf16{'  wkv / wgate FRACTAL_NZ' if args.nz else ''}  {threads}"
          f"{'  (process CPU time)' if args.cpu_time else ''}")
    for name, d, coff, r in SCENARIOS:
        for step, lens, starts in (("decode", [1] * args.batch, [8 * r - 1] * args.batch),
                                   ("prefill", [args.prefill], [0])):
            kw = _case(d, coff, r, lens, starts, rng)
            if args.nz:
                kw["wkv"], kw["wgate"] = as_nz(kw["wkv"]), as_nz(kw["wgate"])
            out = compressor(**kw)
            t = kw["x"].shape[0]
            w = np.concatenate([np.asarray(kw["wkv"]), np.asarray(kw["wgate"])]).T
            groups = sum((s + n) // r - s // r for s, n in zip(starts, lens, strict=True))
            state_bytes = 4 * 2 * coff * d * (t + groups * coff * r)  # rows written, rows a group reads
            moved = movement("x, weights, state, out", kw["x"].nbytes + w.nbytes + state_bytes // 2,
                             out.nbytes + state_bytes // 2)
            floor = MachineFloor([(cpu_product if args.cpu_time else product)("x@[wkv;wgate]^T", kw["x"], w), moved])
            sgemm = MachineFloor([Part("x@[wkv;wgate]^T", SGEMM, candidates(kw["x"], w)[SGEMM]), moved])

            def op(kw=kw):
                compressor(**kw)

            timed = cpu_best_times if args.cpu_time else best_times
            t_op, t_floor, t_sgemm = timed([op, floor, sgemm], args.rounds, number=args.calls)
            print(f"{name:6s} {step:8s} T={t:4d}  {t_op * 1e3:8.2f} ms/call  {floor_line(floor, t_floor, 'ms')}  "
                  f"{ratio_line(name + ' ' + step, t_op, t_floor)}  (sgemm floor {t_sgemm * 1e3:.2f} ms: "
                  f"op / sgemm floor {t_op / t_sgemm:.2f}, sgemm floor / machine floor {t_sgemm / t_floor:.2f})")


if __name__ == "__main__":
    main()
