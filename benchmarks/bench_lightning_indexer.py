"""npu_lightning_indexer (PA_BSND, bf16, decode) against a plain torch reference and the floor.

Candidates, measured in the same run (best average over 15 alternating rounds of ``--calls``
calls after a warm-up round, ``benchmarks/_timing.py``):

- emu: ``ascend_emu.ops.npu_lightning_indexer`` on the bf16 cache (gather, fp32 GEMM, weighted
  head sum, top-k, indices and scores).
- torch reference: what the official golden does, per batch: gather the blocks through
  ``block_table``, ``.float()``, ``q @ k.T``, ReLU, times the weights, sum over heads, causal
  limit (all kv tokens for S1 = 1), ``torch.sort`` descending, first ``sparse_count``.
- floor: the work no implementation can skip, on pre-widened contiguous fp32 keys, per batch:
  one bare fp32 GEMM ``q [64, 128] @ k[:L].T`` (NumPy / BLAS), the head sum as one sgemv
  ``w [64] @ dots [64, L]`` (the ReLU's pass not counted), and the top-k: ``np.partition`` of
  the ``[L]`` score row then a sort of the ``k`` kept values (the op returns its indices by
  score descending, docs/sources.md#npu_lightning_indexer; sorting values alone is cheaper than sorting indices).
- machine floor (``benchmarks/_floor.py``): the same GEMM on the bf16 operands, on the fastest
  engine this machine has for it (sgemm or oneDNN bf16, chosen by timing at set-up), plus the same
  head sum and top-k; printed with the engine each part took.

Default shape (docs/performance.md#benchmarks): B = 1, S1 = 1, N1 = 64, D = 128, kv length 4096 of S2 = 8192 cache
tokens per batch, block_size 256, sparse_count 2048.

Usage: ``python benchmarks/bench_lightning_indexer.py [--batch 1] [--kv-len 4096] [--calls 20]``
"""

from __future__ import annotations

import argparse

import ascend_emu  # noqa: F401  (before torch, as `ascend-emu run` imports it: torch's OpenMP threads
# then sleep when idle, docs/performance.md "Threads"; torch first: bench_mixed_threads.py)
import ml_dtypes
import numpy as np
import torch
from _floor import MachineFloor, floor_line, other, product, ratio_line
from _timing import best_times

from ascend_emu.mla import INDEXER_HEAD_DIM as D
from ascend_emu.mla import INDEXER_HEADS as N1
from ascend_emu.ops import npu_lightning_indexer
from ascend_emu.torch_npu._convert import to_torch

BF16 = np.dtype(ml_dtypes.bfloat16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1, help="B (default 1)")
    parser.add_argument("--kv-len", type=int, default=4096, help="kv tokens used per batch (default 4096)")
    parser.add_argument("--s2", type=int, default=8192, help="cache tokens per batch (default 8192)")
    parser.add_argument("--block-size", type=int, default=256, help="block_size (default 256)")
    parser.add_argument("--sparse-count", type=int, default=2048, help="k (default 2048)")
    parser.add_argument("--calls", type=int, default=20, help="calls per timed round")
    args = parser.parse_args()
    b, kv_len, bs, k = args.batch, args.kv_len, args.block_size, args.sparse_count
    blocks_per_batch = args.s2 // bs
    nb = b * blocks_per_batch

    rng = np.random.default_rng(0)
    query = rng.uniform(-10, 10, (b, 1, N1, D)).astype(BF16)  # [B, 1, N1, D]
    key = rng.uniform(-10, 10, (nb, bs, 1, D)).astype(BF16)  # [blocks, block_size, 1, D]
    weights = rng.uniform(-1, 1, (b, 1, N1)).astype(BF16)  # [B, 1, N1]
    block_table = rng.permutation(nb).astype(np.int32).reshape(b, blocks_per_batch)  # [B, S2 / bs]
    act_q = np.ones(b, np.int32)
    act_k = np.full(b, kv_len, np.int32)
    kw = dict(actual_seq_lengths_query=act_q, actual_seq_lengths_key=act_k, block_table=block_table,
              layout_query="BSND", layout_key="PA_BSND", sparse_count=k, sparse_mode=3)

    def emu():
        return npu_lightning_indexer(query, key, weights, return_value=True, **kw)

    q_t, k_t, w_t, bt_t = (to_torch(a) for a in (query, key, weights, block_table))
    need = -(-kv_len // bs)

    def reference():
        out = torch.full((b, 1, 1, k), -1, dtype=torch.int32)
        for i in range(b):
            # causal limit of the only query row: act_kv - 1 + 0 + 1 = every cached token
            keys = k_t[bt_t[i, :need].long()].reshape(need * bs, D)[:kv_len].float()  # [L, D]
            q = q_t[i, 0].float()  # [N1, D]
            scores = (torch.relu(q @ keys.T) * w_t[i, 0].float()[:, None]).sum(0)  # [L]
            order = torch.sort(scores, descending=True).indices[:k]
            out[i, 0, 0, :order.numel()] = order.to(torch.int32)
        return out

    keys32 = [key[block_table[i, :need]].reshape(need * bs, D)[:kv_len].astype(np.float32) for i in range(b)]
    q32 = query.astype(np.float32)

    w32 = weights.astype(np.float32)  # [B, 1, N1]

    def top_k(score):
        """The k largest of a score row [L], sorted (their values: the least sorting work)."""
        return np.sort(np.partition(score, kv_len - k)[kv_len - k:])

    def floor():
        for i in range(b):
            dots = q32[i, 0] @ keys32[i].T  # [N1, L]
            top_k(w32[i, 0] @ dots)

    keys16 = [key[block_table[i, :need]].reshape(need * bs, D)[:kv_len] for i in range(b)]  # [L, D] bf16
    dots32 = [q32[i, 0] @ keys32[i].T for i in range(b)]  # [N1, L]
    scores = [w32[i, 0] @ dots32[i] for i in range(b)]  # [L]
    parts = []
    for i in range(b):
        parts += [product("q.k", query[i, 0], keys16[i].T),
                  other("head sum", "sgemv", lambda i=i: w32[i, 0] @ dots32[i]),
                  other("top-k", "numpy", lambda s=scores[i]: top_k(s))]
    machine = MachineFloor(parts)

    idx, _ = emu()
    ref = reference().numpy()
    agree = np.mean(idx == ref)
    assert agree > 0.99, f"emu and torch reference disagree on {100 * (1 - agree):.2f} % of indices"

    t_emu, t_ref, t_floor, t_machine = best_times([emu, reference, floor, machine], 15, number=args.calls)
    print(f"npu_lightning_indexer PA_BSND bf16  B={b} S1=1 N1={N1} D={D} kv={kv_len} of S2={args.s2} "
          f"block_size={bs} sparse_count={k}  (torch threads {torch.get_num_threads()})")
    print(f"  emu (ascend_emu.ops)   : {t_emu * 1e3:8.3f} ms/call   same indices as the reference: {100 * agree:.2f} %")
    print(f"  torch reference        : {t_ref * 1e3:8.3f} ms/call   reference / emu = {t_ref / t_emu:5.2f}x")
    print(f"  floor (GEMM, sum, top-k): {t_floor * 1e3:8.3f} ms/call   emu / floor     = {t_emu / t_floor:5.2f}x")
    print(f"  {floor_line(machine, t_machine)}")
    print(f"  {ratio_line('emu', t_emu, t_machine)}")


if __name__ == "__main__":
    main()
