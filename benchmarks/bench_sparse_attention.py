"""npu_kv_quant_sparse_flash_attention against its floor and against a plain torch reference.

Shapes of the op-plugin golden (docs/sources.md#npu_kv_quant_sparse_flash_attention): s1=1, n1=128, n2=1, s2=8192 of which 4096 are
used, top-2048 sparse indices (sparse_block_size 1), PA_BSND cache with block_size 256, bf16
query; b=1 and b=4. Measured in one run, best of alternating rounds of ``--calls`` calls after a
warm-up (``_timing.best_times``), each round after a short untimed pause so that the previous
candidate's spinning BLAS / OpenMP workers are parked:

- floor: per batch, the gather of the selected 656-byte rows (NumPy fancy indexing) plus the two
  bare products ``q [128, 576] @ K^T [576, 2048]`` and ``P [128, 2048] @ V [2048, 512]`` on
  pre-widened fp32 operands holding bf16 values, on the engine the op runs them on
  (``emu.matmul.matmul_bf16_f32``: oneDNN's bf16 dot products where torch is loaded on a CPU with
  them, else sgemm; the operands' exponent spans pre-computed); a ratio below 1 is printed as a
  bug in the floor;
- machine floor (``benchmarks/_floor.py``): per batch the gather at copy bandwidth (a copy of
  as many bytes) and the two products on bf16 operands (the dequantized keys are bf16), each on the
  fastest engine this machine has for it (sgemm or oneDNN bf16, chosen by timing at set-up);
  printed with the engine each part took;
- torch reference (if torch is installed): what a developer would write: gather through
  block_table, dequantize (int8 * scale -> bf16), fp32 scores, causal mask, fp32 softmax, bf16 P,
  fp32 PV, per batch.

Targets: op <= 1.5x the floor; op >= 5x faster than the torch reference.

``--threads N`` runs all three on N threads (OpenBLAS, Numba and torch): the script restarts
itself with ``OPENBLAS_NUM_THREADS`` / ``NUMBA_NUM_THREADS`` / ``OMP_NUM_THREADS`` set, since
OpenBLAS reads its count only at start-up. On a machine shared with other jobs, ``--threads 1``
gives stable ratios; with more threads a GEMM waits for its slowest thread, so a busy core can
stretch any candidate many times over.

Usage: ``python benchmarks/bench_sparse_attention.py [--batches 1 4] [--repeat 10] [--calls 5] [--threads N]``
"""

from __future__ import annotations

import argparse
import time

import ml_dtypes
import numba
import numpy as np
from _floor import MachineFloor, floor_line, movement, product, ratio_line
from _timing import best_times, have_torch, run_with_threads

import ascend_emu.emu  # noqa: F401  (sets OMP_WAIT_POLICY before torch starts its OpenMP pool)
from ascend_emu.emu.matmul import matmul_bf16_f32, span
from ascend_emu.mla import D_QK, D_ROPE, HCKV, TILE_SIZE
from ascend_emu.ops import npu_kv_quant_sparse_flash_attention
from ascend_emu.quant import MLA_ROW

BF16 = np.dtype(ml_dtypes.bfloat16)
S1, N1, S2, S2_ACT, TOP_K, BLOCK_SIZE = 1, 128, 8192, 4096, 2048, 256
SCALE = 0.041666666666666664
#: Largest accepted ratio op / floor; smallest accepted speed-up over torch.
TARGET_FLOOR_RATIO = 1.5
TARGET_TORCH_SPEEDUP = 5.0
#: Pause before each timed candidate (seconds).
SETTLE_S = 0.05
#: Environment variables ``--threads`` sets (OpenBLAS, Numba, torch / OpenMP).


def make_inputs(rng, b):
    nb = b * S2 // BLOCK_SIZE
    query = rng.uniform(-10, 10, (b, S1, N1, D_QK)).astype(np.float32).astype(BF16)  # [B, 1, 128, 576]
    nope = rng.uniform(-5, 10, (nb, BLOCK_SIZE, 1, HCKV)).astype(np.int8)
    rope = rng.uniform(-10, 10, (nb, BLOCK_SIZE, 1, D_ROPE)).astype(np.float32).astype(BF16)
    scales = rng.uniform(-100, 100, (nb, BLOCK_SIZE, 1, HCKV // TILE_SIZE)).astype(np.float32)
    cache = np.concatenate([nope, rope.view(np.int8), scales.view(np.int8)], axis=-1)  # [nb, 256, 1, 656]
    idx = np.stack([rng.choice(S2_ACT - S1 + 1, TOP_K, replace=False) for _ in range(b)]).astype(np.int32)
    table = np.arange(nb, dtype=np.int32).reshape(b, -1)  # [B, 32]
    return dict(query=query, cache=cache, sparse_indices=idx.reshape(b, S1, 1, TOP_K), block_table=table,
                act_q=np.full(b, S1, np.int32), act_kv=np.full(b, S2_ACT, np.int32))


def op_call(x):
    return lambda: npu_kv_quant_sparse_flash_attention(
        x["query"], x["cache"], x["cache"], x["sparse_indices"], SCALE, 2, 2, block_table=x["block_table"],
        actual_seq_lengths_query=x["act_q"], actual_seq_lengths_kv=x["act_kv"], layout_kv="PA_BSND",
        sparse_mode=3, attention_mode=2)


def floor_call(x):
    b = x["query"].shape[0]
    rows = x["cache"].reshape(-1, MLA_ROW.row_bytes)  # [slots, 656]
    slots = [x["block_table"][i, x["sparse_indices"][i, 0, 0] // BLOCK_SIZE].astype(np.int64) * BLOCK_SIZE
             + x["sparse_indices"][i, 0, 0] % BLOCK_SIZE for i in range(b)]
    q = [x["query"][i, 0].astype(np.float32) for i in range(b)]  # [128, 576]
    k = [MLA_ROW.dequantize(rows[s])[0].astype(BF16).astype(np.float32) for s in slots]  # [2048, 512] bf16 values
    kr = [np.concatenate([kk, np.zeros((TOP_K, D_ROPE), np.float32)], axis=1) for kk in k]  # [2048, 576]
    p = [np.full((N1, TOP_K), 1 / TOP_K, np.float32) for _ in range(b)]  # bf16 values
    spans = [(span(q[i]), span(kr[i]), span(p[i])) for i in range(b)]  # pre-computed, as the operands

    def run():
        for i in range(b):
            rows[slots[i]]  # the gather of the selected rows
            qs, ks, ps = spans[i]
            matmul_bf16_f32(q[i], kr[i].T, a_span=qs, b_span=ks)  # the op's engine for its products
            matmul_bf16_f32(p[i], k[i], a_span=ps, b_span=ks)
    return run


def machine_floor(x) -> MachineFloor:
    """The machine floor (module doc): per batch, the gather of the selected rows at copy
    bandwidth, ``q [128, 576] @ K^T`` and ``P [128, 2048] @ V [2048, 512]`` on bf16 operands."""
    rng = np.random.default_rng(1)
    parts = []
    for i in range(x["query"].shape[0]):
        k = rng.standard_normal((TOP_K, D_QK), dtype=np.float32).astype(BF16)  # [2048, 576] stand-in keys
        p = np.full((N1, TOP_K), 1 / TOP_K, np.float32).astype(BF16)  # [128, 2048]
        parts += [movement("gather", TOP_K * MLA_ROW.row_bytes), product("q@K", x["query"][i, 0], k.T),
                  product("P@V", p, np.ascontiguousarray(k[:, :HCKV]))]
    return MachineFloor(parts)


def torch_call(x):
    import torch

    b = x["query"].shape[0]
    rows = torch.from_numpy(x["cache"].reshape(-1, MLA_ROW.row_bytes))
    query = torch.from_numpy(x["query"].view(np.int16)).view(torch.bfloat16)
    idx = torch.from_numpy(x["sparse_indices"])
    table = torch.from_numpy(x["block_table"]).long()

    def run():
        outs = []
        for i in range(b):
            pos = idx[i, 0, 0].long()
            pos = pos[pos >= 0]
            r = rows[table[i, pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE]  # [L, 656]
            scale = r[:, 640:].contiguous().view(torch.float32).repeat_interleave(TILE_SIZE, dim=-1)
            k_nope = (r[:, :HCKV].float() * scale).to(torch.bfloat16)
            k = torch.cat([k_nope, r[:, HCKV:640].contiguous().view(torch.bfloat16)], dim=-1).float()
            s = query[i, 0].float() @ k.T * SCALE  # [128, L]
            limit = int(x["act_kv"][i]) - int(x["act_q"][i]) + 1
            s = s.masked_fill((pos >= limit)[None, :], float("-inf"))
            p = torch.softmax(s, dim=-1).to(torch.bfloat16).float()
            outs.append((p @ k_nope.float()).to(torch.bfloat16))
        return outs
    return run


def settle() -> None:
    """Untimed pause before each candidate: BLAS / OpenMP workers of the previous candidate stop
    spinning, so no candidate pays for another's idle threads (they share two cores here)."""
    time.sleep(SETTLE_S)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--calls", type=int, default=5, help="calls per timed round (default 5)")
    ap.add_argument("--threads", type=int, default=None, help="threads of OpenBLAS, Numba and torch (default: theirs)")
    a = ap.parse_args()
    threads = run_with_threads(a.threads)
    torch_golden = have_torch()
    print(f"threads: {threads} (Numba uses {numba.get_num_threads()})")
    rng = np.random.default_rng(0)
    for b in a.batches:
        x = make_inputs(rng, b)
        machine = machine_floor(x)
        fns = [floor_call(x), machine, op_call(x)] + ([torch_call(x)] if torch_golden else [])
        times = best_times(fns, a.repeat, number=a.calls, before=[settle] * len(fns))
        t_floor, t_machine, t_op = times[:3]
        print(f"npu_kv_quant_sparse_flash_attention b={b}, s1=1, n1=128, kv 4096 of 8192, top-{TOP_K}, "
              f"block_size {BLOCK_SIZE}")
        print(f"  floor (row gather + GEMMs):      {t_floor * 1e3:8.2f} ms")
        print(f"  op:                              {t_op * 1e3:8.2f} ms")
        ratio = t_op / t_floor
        print(f"  ratio op / floor: {ratio:.2f} ({'meets' if ratio <= TARGET_FLOOR_RATIO else 'misses'} the target "
              f"<= {TARGET_FLOOR_RATIO})")
        if ratio < 1:
            print(f"  WARNING: the floor is slower than the op ({ratio:.2f}x): a bug in the floor")
        print(f"  {floor_line(machine, t_machine)}")
        print(f"  {ratio_line('op', t_op, t_machine)}")
        if torch_golden:
            t_torch = times[3]
            speedup = t_torch / t_op
            print(f"  torch reference (gather + softmax): {t_torch * 1e3:8.2f} ms")
            print(f"  speed-up over torch: {speedup:.1f}x ({'meets' if speedup >= TARGET_TORCH_SPEEDUP else 'misses'}"
                  f" the target >= {TARGET_TORCH_SPEEDUP}x)")


if __name__ == "__main__":
    main()
