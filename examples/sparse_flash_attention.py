"""torch_npu.npu_sparse_flash_attention over a bf16 PA_BSND (paged) cache.

Run on a laptop with:  ascend-emu run examples/sparse_flash_attention.py
(on an Atlas A2 / A3 machine the same script runs against the real torch_npu).

A decode step of MLA-absorb sparse attention: every query token attends to the kv tokens its
``sparse_indices`` row selects (top-k blocks of ``sparse_block_size`` tokens, -1 padded), read
through ``block_table`` from a paged cache, with the right-down causal mask (sparse_mode=3). The
script checks the op against a small torch golden written here (gather, fp32 softmax, P rounded to
bf16 before the PV matmul) with the official criterion and exits non-zero on a wrong value.
"""

import sys

import torch
import torch_npu

torch.manual_seed(0)
B, S1, N1, N2, Dn, Dr = 2, 2, 16, 1, 512, 64
BlockSize, Sbs, TopK = 16, 2, 12
act_q = [2, 1]
act_kv = [45, 30]
blocks_per_batch = [(n + BlockSize - 1) // BlockSize for n in act_kv]
BlockNum = sum(blocks_per_batch) + 2
scale_value = (Dn + Dr) ** -0.5

query = torch.randn(B, S1, N1, Dn, dtype=torch.bfloat16)
query_rope = torch.randn(B, S1, N1, Dr, dtype=torch.bfloat16)
key_cache = torch.randn(BlockNum, BlockSize, N2, Dn, dtype=torch.bfloat16)  # value = key (MLA absorb)
key_rope_cache = torch.randn(BlockNum, BlockSize, N2, Dr, dtype=torch.bfloat16)
block_table = torch.zeros(B, max(blocks_per_batch), dtype=torch.int32)
free = torch.randperm(BlockNum).to(torch.int32)  # the pages of each sequence, anywhere in the cache
used = 0
for b, n in enumerate(blocks_per_batch):
    block_table[b, :n] = free[used:used + n]
    used += n

# top-k sparse blocks per query token, valid ids first, then -1
sparse_indices = torch.full((B, S1, N2, TopK), -1, dtype=torch.int32)
for b in range(B):
    n_blocks = (act_kv[b] + Sbs - 1) // Sbs
    for s in range(S1):
        k = TopK if s == 0 else TopK // 2
        sparse_indices[b, s, 0, :k] = torch.randperm(n_blocks)[:k].to(torch.int32)

out, softmax_max, softmax_sum = torch_npu.npu_sparse_flash_attention(
    query.npu(), key_cache.npu(), key_cache.npu(), sparse_indices.npu(), scale_value,
    block_table=block_table.npu(), actual_seq_lengths_query=torch.tensor(act_q, dtype=torch.int32).npu(),
    actual_seq_lengths_kv=torch.tensor(act_kv, dtype=torch.int32).npu(), query_rope=query_rope.npu(),
    key_rope=key_rope_cache.npu(), sparse_block_size=Sbs, layout_query="BSND", layout_kv="PA_BSND", sparse_mode=3,
    attention_mode=2)
out = out.cpu()
print("attention_out:", tuple(out.shape), out.dtype, " softmax_max:", tuple(softmax_max.shape))


# ---- a torch golden: gather through block_table, causal limit, fp32 softmax, bf16 P, fp32 PV
def golden():
    ref = torch.zeros(B, S1, N1, Dn)
    for b in range(B):
        for s in range(act_q[b]):
            limit = act_kv[b] - act_q[b] + s + 1
            positions = []
            for blk in sparse_indices[b, s, 0].tolist():
                if blk == -1:
                    break
                positions += [p for p in range(blk * Sbs, min(blk * Sbs + Sbs, act_kv[b])) if p < limit]
            if not positions:
                continue
            pages = block_table[b, [p // BlockSize for p in positions]].long()
            rows = torch.tensor([p % BlockSize for p in positions])
            k = torch.cat([key_cache[pages, rows, 0], key_rope_cache[pages, rows, 0]], dim=-1).float()  # [L, 576]
            q = torch.cat([query[b, s], query_rope[b, s]], dim=-1).float()  # [N1, 576]
            p = torch.softmax(q @ k.T * scale_value, dim=-1).to(torch.bfloat16).float()  # [N1, L]
            ref[b, s] = p @ key_cache[pages, rows, 0].float()
    return ref.to(torch.bfloat16)


ref = golden()
close = torch.isclose(out.float(), ref.float(), rtol=5e-3, atol=1e-4).float().mean().item()
print(f"elements within isclose(rtol=5e-3, atol=1e-4) of the torch golden: {close:.4%}")
print("query (b=1, s=1) is past act_q=1: output all zero:", bool((out[1, 1].float() == 0).all()))
if close <= 0.99 or not (out[1, 1].float() == 0).all():
    print("FAILED: npu_sparse_flash_attention differs from the golden")
    sys.exit(1)
