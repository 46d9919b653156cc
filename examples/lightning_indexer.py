"""torch_npu.npu_lightning_indexer: pick the top-k cache tokens for a DeepSeek-V3.2 decode step.

Run on a laptop with:  ascend-emu run examples/lightning_indexer.py
(on an Atlas A3 machine the same script runs against the real torch_npu).

Three sequences decode one token each. Their indexer keys live in a paged PA_BSND cache
(block_size 128) reached through a block table; the indexer scores every cached token with
``sum_h w[h] * relu(q[h] . k)`` over its 64 heads and returns the 256 best token positions of
each sequence, which is what npu_kv_quant_sparse_flash_attention takes as ``sparse_indices``.
A small torch golden (the op's formula, fp32) checks the result.
"""

import torch
import torch_npu

torch.manual_seed(0)
n_heads, head_dim = 64, 128  # the indexer's query heads and head dim (key: 1 head)
block_size, blocks = 128, 24
sparse_count = 256
kv_lens = torch.tensor([700, 129, 1500], dtype=torch.int32)  # tokens cached per sequence (incl. the new one)
batch = kv_lens.numel()

# each sequence owns blocks through its row of the block table (shuffled, as an allocator leaves them)
owned = torch.randperm(blocks)
need = [(int(n) + block_size - 1) // block_size for n in kv_lens]
block_table = torch.zeros(batch, max(need), dtype=torch.int32)
start = 0
for b, n in enumerate(need):
    block_table[b, :n] = owned[start:start + n]
    start += n

key_cache = torch.randn(blocks, block_size, 1, head_dim, dtype=torch.bfloat16)
query = torch.randn(batch, 1, n_heads, head_dim, dtype=torch.bfloat16)  # BSND, one new token each
weights = (torch.randn(batch, 1, n_heads) * n_heads ** -0.5).to(torch.bfloat16)

indices, scores = torch_npu.npu_lightning_indexer(
    query.npu(), key_cache.npu(), weights.npu(),
    actual_seq_lengths_query=torch.ones(batch, dtype=torch.int32).npu(),
    actual_seq_lengths_key=kv_lens.npu(), block_table=block_table.npu(),
    layout_query="BSND", layout_key="PA_BSND", sparse_count=sparse_count, sparse_mode=3, return_value=True)
indices, scores = indices.cpu(), scores.cpu()
print("sparse_indices:", tuple(indices.shape), indices.dtype, " scores:", tuple(scores.shape), scores.dtype)

# golden: gather each sequence's keys through the block table, score in fp32, sort descending
ok = True
for b in range(batch):
    n = int(kv_lens[b])
    rows = [key_cache[block_table[b, p // block_size], p % block_size, 0] for p in range(n)]
    keys = torch.stack(rows).float()  # [n, D]
    s = (torch.relu(query[b, 0].float() @ keys.T) * weights[b, 0].float()[:, None]).sum(0)  # [n]
    best = torch.sort(s, descending=True).values[:sparse_count]
    got = indices[b, 0, 0]
    k = min(sparse_count, n)
    picked = got[:k].long()
    # the same tokens in the same order (up to swaps of near-equal scores), then -1 padding
    same = torch.allclose(s[picked], best, rtol=1e-4, atol=1e-4) and len(set(picked.tolist())) == k
    same = same and bool((got[k:] == -1).all()) and bool(((picked >= 0) & (picked < n)).all())
    close = torch.allclose(scores[b, 0, 0, :k].float(), s[picked], rtol=2 ** -7, atol=1e-3)
    print(f"seq {b}: {n} cached tokens, top-{k} token ids {got[:6].tolist()} ..., best score "
          f"{float(scores[b, 0, 0, 0]):.4f}; golden agrees: {same and close}")
    ok = ok and same and close
if not ok:
    raise SystemExit("npu_lightning_indexer disagrees with the torch golden")
