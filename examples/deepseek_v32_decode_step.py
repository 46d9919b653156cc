"""A DeepSeek-V3.2 decode step in torch_npu: prolog v3 -> lightning indexer -> KV-quant sparse attention.

Run on a laptop with:  ascend-emu run examples/deepseek_v32_decode_step.py
(on an Atlas A2 / A3 machine the same script runs against the real torch_npu).

Two sequences (contexts of 300 and 170 tokens) sit in a paged PA_BSND cache of 656-byte per-tile
rows, written by npu_mla_prolog_v3 (partial quant, kv_cache_quant_mode=3). One decode step:

1. npu_mla_prolog_v3 writes the new token of each sequence into its next slot and returns its
   absorbed query (query 512 + query_rope 64) and query_norm (int8, per-token scale).
2. npu_lightning_indexer scores every cached token of the sequence with the indexer's 64 heads
   (its query from the dequantized query_norm, its keys in a bf16 PA_BSND cache) and returns the
   top-128 positions.
3. npu_kv_quant_sparse_flash_attention attends to exactly those tokens in the int8 cache.

A small torch golden checks steps 2 and 3 from the cache bytes (the indexer's selection by its
scores, the attention output by the official criterion); the script exits non-zero on a wrong value.
"""

import sys

import torch
import torch_npu

torch.npu.config.allow_internal_format = True
torch.manual_seed(0)
He, Hcq, Hckv, N, D, Dr = 7168, 1536, 512, 8, 128, 64
BlockSize, BlockNum, Dtile, TopK = 64, 12, 656, 128
IdxHeads, IdxDim = 64, 128
context = torch.tensor([300, 170])  # tokens cached per sequence before the step
B = context.numel()
kv_lens = (context + 1).to(torch.int32)  # after the step

# weights (random, scaled like trained ones); weight_uq_qr int8 per output channel
w_dq = torch_npu.npu_format_cast((torch.randn(He, Hcq) * He ** -0.5).to(torch.bfloat16).npu(), 29)
w_uq_qr = torch.randn(Hcq, N * (D + Dr)) * Hcq ** -0.5
scale_uq_qr = w_uq_qr.abs().amax(dim=0, keepdim=True) / 127
w_uq_qr = torch_npu.npu_format_cast(torch.round(w_uq_qr / scale_uq_qr).to(torch.int8).npu(), 29)
w_uk = (torch.randn(N, D, Hckv) * D ** -0.5).to(torch.bfloat16).npu()
w_dkv_kr = torch_npu.npu_format_cast((torch.randn(He, Hckv + Dr) * He ** -0.5).to(torch.bfloat16).npu(), 29)
gamma_cq, gamma_ckv = torch.ones(Hcq, dtype=torch.bfloat16).npu(), torch.ones(Hckv, dtype=torch.bfloat16).npu()
w_iq = (torch.randn(Hcq, IdxHeads * IdxDim) * Hcq ** -0.5).to(torch.bfloat16)  # indexer projections
w_ik = (torch.randn(He, IdxDim) * He ** -0.5).to(torch.bfloat16)
w_iw = (torch.randn(He, IdxHeads) * He ** -0.5).to(torch.bfloat16)

# each sequence owns blocks through its block-table row (shuffled, as an allocator leaves them)
need = [(int(n) + BlockSize - 1) // BlockSize for n in kv_lens]
owned = torch.randperm(BlockNum)
block_table = torch.zeros(B, max(need), dtype=torch.int32)
block_table[0, :need[0]] = owned[:need[0]].int()
block_table[1, :need[1]] = owned[need[0]:need[0] + need[1]].int()


def slot(b, pos):
    return int(block_table[b, pos // BlockSize]) * BlockSize + pos % BlockSize


def rope_tables(positions):
    inv_freq = 1.0 / 10000 ** (torch.arange(0, Dr, 2).float() / Dr)
    angles = positions.float()[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.sin().to(torch.bfloat16).npu(), angles.cos().to(torch.bfloat16).npu()


kv_cache = torch.zeros(BlockNum, BlockSize, 1, Dtile, dtype=torch.int8).npu()
idx_cache = torch.zeros(BlockNum, BlockSize, 1, IdxDim, dtype=torch.bfloat16)


def prolog(x, positions, b):
    """npu_mla_prolog_v3 for the tokens ``x`` [1, S, He] of sequence b at ``positions``."""
    sin, cos = rope_tables(positions[None])
    index = torch.tensor([[slot(b, int(p)) for p in positions]])
    idx_cache.view(-1, IdxDim)[index[0]] = (x[0].float() @ w_ik.float()).to(torch.bfloat16)  # indexer keys
    return torch_npu.npu_mla_prolog_v3(
        x.npu(), w_dq, w_uq_qr, w_uk, w_dkv_kr, gamma_cq, gamma_ckv, sin, cos, kv_cache,
        torch.empty(0, dtype=torch.bfloat16).npu(), cache_index=index.npu(), dequant_scale_w_uq_qr=scale_uq_qr.npu(),
        k_nope_clip_alpha=torch.ones(1).npu(), cache_mode="PA_BSND", query_norm_flag=True, weight_quant_mode=1,
        kv_cache_quant_mode=3, ckvkr_repo_mode=1, quant_scale_repo_mode=1, tile_size=128)


# ---- prefill: each sequence's context
for b in range(B):
    prolog(torch.randn(1, int(context[b]), He, dtype=torch.bfloat16), torch.arange(int(context[b])), b)

# ---- 1. decode: the new token of each sequence at position context[b]
new_x = torch.randn(B, 1, He, dtype=torch.bfloat16)
steps = [prolog(new_x[b:b + 1], context[b:b + 1], b) for b in range(B)]
query = torch.cat([torch.cat([q.cpu(), qr.cpu()], dim=-1) for q, qr, *_ in steps]).view(B, 1, N, Hckv + Dr)
query_norm = torch.cat([qn.cpu().float() * sqn.cpu() for _, _, _, qn, sqn in steps])  # [B, Hcq] dequantized
print("prolog v3: query", tuple(query.shape), query.dtype, "| query_norm", tuple(steps[0][3].shape),
      steps[0][3].dtype)

# ---- 2. indexer
q_idx = (query_norm @ w_iq.float()).to(torch.bfloat16).view(B, 1, IdxHeads, IdxDim)
w_idx = (new_x[:, 0].float() @ w_iw.float() * IdxHeads ** -0.5).to(torch.bfloat16).view(B, 1, IdxHeads)
ones = torch.ones(B, dtype=torch.int32)
sparse_indices, _ = torch_npu.npu_lightning_indexer(
    q_idx.npu(), idx_cache.npu(), w_idx.npu(), actual_seq_lengths_query=ones.npu(),
    actual_seq_lengths_key=kv_lens.npu(), block_table=block_table.npu(), layout_query="BSND",
    layout_key="PA_BSND", sparse_count=TopK, sparse_mode=3)
print("indexer: sparse_indices", tuple(sparse_indices.shape), sparse_indices.dtype)

# ---- 3. KV-quant sparse attention over the selected tokens
scale_value = (D + Dr) ** -0.5
out = torch_npu.npu_kv_quant_sparse_flash_attention(
    query.npu(), kv_cache, kv_cache, sparse_indices, scale_value, 2, 2, block_table=block_table.npu(),
    actual_seq_lengths_query=ones.npu(), actual_seq_lengths_kv=kv_lens.npu(), layout_query="BSND",
    layout_kv="PA_BSND", sparse_mode=3, attention_mode=2, quant_scale_repo_mode=1, tile_size=128, rope_head_dim=Dr)
print("attention:", tuple(out.shape), out.dtype)

# ---- golden, from the cache bytes
ok = True
rows = kv_cache.cpu().view(-1, Dtile)  # [BlockNum * BlockSize, 656]
for b in range(B):
    n = int(kv_lens[b])
    slots = torch.tensor([slot(b, p) for p in range(n)])
    k_idx = idx_cache.view(-1, IdxDim)[slots].float()  # [n, 128]
    score = (torch.relu(q_idx[b, 0].float() @ k_idx.T) * w_idx[b, 0].float()[:, None]).sum(0)  # [n]
    picked = sparse_indices[b, 0, 0].cpu().long()
    assert (picked >= 0).all(), "a full top-k was expected"
    rest = torch.ones(n, dtype=torch.bool)
    rest[picked] = False
    if score[rest].max() > score[picked].min() + 1e-3 * score.abs().max():  # selection = the top scores
        print(f"FAIL: sequence {b}: the indexer skipped a higher-scoring token")
        ok = False
    r = rows[slots[picked]]  # [TopK, 656]
    nope = (r[:, :Hckv].float() * r[:, 640:].contiguous().view(torch.float32).repeat_interleave(128, dim=1))
    nope = nope.to(torch.bfloat16).float()
    rope = r[:, Hckv:640].contiguous().view(torch.bfloat16).float()
    k = torch.cat([nope, rope], dim=-1)  # [TopK, 576]
    p = torch.softmax(query[b, 0].float() @ k.T * scale_value, dim=-1).to(torch.bfloat16).float()
    golden = (p @ nope).to(torch.bfloat16)  # [N, 512]
    got = out[b, 0].cpu()
    close = torch.isclose(got.float(), golden.float(), rtol=5e-3, atol=1e-4).float().mean().item()
    print(f"sequence {b}: {n} cached tokens, top-{TopK} selected, output within isclose(5e-3, 1e-4): "
          f"{close:.2%}")
    ok &= close > 0.99
sys.exit(0 if ok else 1)
