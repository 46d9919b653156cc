"""npu_kv_rmsnorm_rope_cache (PA_NZ, bf16) against the torch-CPU golden a developer would write.

The baseline, measured in the same run: plain torch ops in fp32 (split, RmsNorm, de-interleave,
rotate_half RoPE), ``.to(bfloat16)``, then ``index_put`` into NZ views
``[block_num, D/16, block_size, 16]`` of the two caches (the op-plugin golden's scatter, without
its Python loop). Both write the same caches (checked before timing). Time per call is the best
average over 15 alternating rounds of ``--calls`` calls, after a warm-up round
(``benchmarks/_timing.py``).

For each thread count (1, 2, 4, ... up to ``--max-threads``, default the machine's cores; Numba and
torch get the same count) it prints the op's time per call and per token, the time per token of
its fused Numba pass alone (``emu.kv_rmsnorm_rope_cache.fused_rows``: RmsNorm, RoPE, rounding,
without validation and scatters), the golden / emu ratio and the op's time relative to one
thread, and the machine floor of the data it moves (``benchmarks/_floor.py``: the bytes the op
reads, kv, gamma, cos, sin and the slots, and writes, the two caches' rows, as a copy of half their
sum at the machine's copy bandwidth; ``np.copyto`` runs on one thread) with the op's ratio to it.
Also in the same rounds: the op through the torch_npu drop-in (``ascend_emu.torch_npu``, torch
tensors over the same inputs, its own caches; checked byte-identical to the ops call first) and
its time over the golden's (target 0.15 at B = 1: ``--batch 1``).
Targets (docs/performance.md#against-the-floors): golden / emu > 1 at every thread count, fused pass <= 0.2 us per token
at B=1024, and no thread count slower than a smaller one.

Usage: ``python benchmarks/bench_kv_rmsnorm_rope_cache.py [--batch 1024] [--seq 1] [--block-size 128]``
"""

from __future__ import annotations

import argparse
import importlib
import os

import ascend_emu  # noqa: F401  (before torch, as `ascend-emu run` imports it: torch's OpenMP threads
# then sleep when idle, docs/performance.md "Threads"; torch first: bench_mixed_threads.py)
import ml_dtypes
import numba
import numpy as np
import torch
from _floor import MachineFloor, floor_line, movement
from _timing import best_times

import ascend_emu.torch_npu as torch_npu
from ascend_emu.ops import npu_kv_rmsnorm_rope_cache
from ascend_emu.torch_npu._convert import to_torch

fused_rows = importlib.import_module("ascend_emu.emu.kv_rmsnorm_rope_cache").fused_rows

BF16 = np.dtype(ml_dtypes.bfloat16)
RMS, ROPE = 512, 64
C0 = 16  # bf16 NZ fractal row
EPS = 1e-5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1024, help="B (default 1024)")
    parser.add_argument("--seq", type=int, default=1, help="S (default 1)")
    parser.add_argument("--block-size", type=int, default=128, help="BlockSize (default 128)")
    parser.add_argument("--calls", type=int, default=20, help="calls per timed round")
    parser.add_argument("--max-threads", type=int, default=min(os.cpu_count() or 1, numba.config.NUMBA_NUM_THREADS),
                        help="largest thread count (default: the machine's cores)")
    args = parser.parse_args()
    b, s, bs = args.batch, args.seq, args.block_size
    t = b * s
    nb = max(-(-s // bs) * b, -(-t // bs)) + 8

    rng = np.random.default_rng(0)
    kv = (8 * rng.standard_normal((b, 1, s, RMS + ROPE)) - 10).astype(BF16)  # [B, 1, S, 576]
    gamma = (990 * rng.standard_normal(RMS) - 1000).astype(BF16)  # [512]
    cos = rng.standard_normal((b, 1, s, ROPE)).astype(BF16)  # [B, 1, S, 64]
    sin = (0.02 * rng.standard_normal((b, 1, s, ROPE)) - 0.01).astype(BF16)  # [B, 1, S, 64]
    index = rng.permutation(nb * bs)[:t].astype(np.int64)  # [B*S] global slots
    k_cache = np.zeros((nb, bs, 1, ROPE), BF16)  # [BlockNum, BlockSize, 1, 64], NZ bytes
    ckv_cache = np.zeros((nb, bs, 1, RMS), BF16)  # [BlockNum, BlockSize, 1, 512], NZ bytes

    def emu():
        npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache, epsilon=EPS, cache_mode="PA_NZ")

    kv_t, gamma_t, cos_t, sin_t, index_t = (to_torch(a) for a in (kv, gamma, cos, sin, index))
    k_cache_t = torch.zeros((nb, bs, 1, ROPE), dtype=torch.bfloat16)
    ckv_cache_t = torch.zeros((nb, bs, 1, RMS), dtype=torch.bfloat16)
    k_cache_d, ckv_cache_d = torch.zeros_like(k_cache_t), torch.zeros_like(ckv_cache_t)  # the drop-in's caches

    def drop_in():
        torch_npu.npu_kv_rmsnorm_rope_cache(kv_t, gamma_t, cos_t, sin_t, index_t, k_cache_d, ckv_cache_d,
                                            epsilon=EPS, cache_mode="PA_NZ")
    blk, row = index_t // bs, index_t % bs

    def golden():
        rms_in, rope_in = kv_t.split([RMS, ROPE], dim=-1)
        x = rms_in.float()
        y = x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + EPS) * gamma_t.float()
        k = rope_in.float().view(b, 1, s, ROPE // 2, 2).transpose(-1, -2).reshape(b, 1, s, ROPE)
        k_embed = k * cos_t.float() + torch.cat((-k[..., ROPE // 2:], k[..., :ROPE // 2]), dim=-1) * sin_t.float()
        k_nz = k_cache_t.view(nb, ROPE // C0, bs, C0)  # NZ memory view
        ckv_nz = ckv_cache_t.view(nb, RMS // C0, bs, C0)
        k_nz[blk, :, row, :] = k_embed.to(torch.bfloat16).reshape(t, ROPE // C0, C0)
        ckv_nz[blk, :, row, :] = y.to(torch.bfloat16).reshape(t, RMS // C0, C0)

    emu()
    golden()
    drop_in()
    for mine, dropped in ((k_cache, k_cache_d), (ckv_cache, ckv_cache_d)):
        assert mine.view(np.uint16).tobytes() == dropped.view(torch.int16).numpy().tobytes(), "drop-in != ops"
    for mine, theirs in ((k_cache, k_cache_t), (ckv_cache, ckv_cache_t)):
        a, g = mine.astype(np.float32), theirs.float().numpy()
        assert np.allclose(a, g, rtol=0.04, atol=0.04), "emu and torch golden caches disagree"

    kv_bits = kv.reshape(t, RMS + ROPE).view(np.uint16)  # [T, 576]
    cos_bits, sin_bits = cos.reshape(t, ROPE).view(np.uint16), sin.reshape(t, ROPE).view(np.uint16)  # [T, 64]
    gamma32 = gamma.astype(np.float32)

    def fused():
        fused_rows(kv_bits, gamma32, cos_bits, sin_bits, np.float32(EPS), True)

    read = kv.nbytes + gamma.nbytes + cos.nbytes + sin.nbytes + index.nbytes
    written = t * (RMS + ROPE) * BF16.itemsize  # the rows of both caches
    machine = MachineFloor([movement("inputs -> cache rows", read, written)])

    counts = [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= args.max_threads]
    torch_threads, numba_threads = torch.get_num_threads(), numba.get_num_threads()
    print(f"npu_kv_rmsnorm_rope_cache PA_NZ bf16  B={b} S={s} block_size={bs} block_num={nb}")
    print("threads   emu us/call  emu us/token  fused us/token  golden us/call  golden/emu  emu vs 1 thread"
          "  machine floor us  emu/machine  drop-in us/call  drop-in/golden")
    first, machine_best = None, float("inf")
    try:
        for n in counts:
            numba.set_num_threads(n)
            torch.set_num_threads(n)
            t_emu, t_fused, t_gold, t_machine, t_drop = best_times([emu, fused, golden, machine, drop_in], 15,
                                                                   number=args.calls)
            first = first or t_emu
            print(f"{n:7d} {t_emu * 1e6:13.1f} {t_emu * 1e6 / t:13.3f} {t_fused * 1e6 / t:15.3f} "
                  f"{t_gold * 1e6:15.1f} {t_gold / t_emu:11.2f}x {t_emu / first:15.2f}x "
                  f"{t_machine * 1e6:17.1f} {t_emu / t_machine:11.2f}x {t_drop * 1e6:16.1f} {t_drop / t_gold:15.2f}")
            machine_best = min(machine_best, t_machine)
    finally:
        torch.set_num_threads(torch_threads)
        numba.set_num_threads(numba_threads)
    print(f"{floor_line(machine, machine_best, 'us', per=f'best of the rows; {read} bytes read, {written} written')}")


if __name__ == "__main__":
    main()
