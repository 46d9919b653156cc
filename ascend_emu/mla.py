"""The fixed MLA (DeepSeek V3 / V3.2) dimensions, defined once for every op, kernel and test.

Source: docs/sources.md#npu_mla_prolog_v3 (Hckv = 512, D = 128, Dr = 64, Nkv = 1), docs/sources.md#per_tile_rows (per-tile quant, tile
128) and docs/sources.md#npu_kv_quant_sparse_flash_attention (the sparse-attention query ``[.., 576] = cat(q_nope 512, q_rope 64)``). The op pages
(docs/sources.md#npu_mla_prolog_v3, docs/sources.md#npu_kv_quant_sparse_flash_attention) fix the same
values. The 656-byte combined row built from them is :data:`ascend_emu.quant.MLA_ROW`.
"""

#: Hckv: kv low-rank dim (k_nope / compressed kv width, the absorbed value width).
HCKV = 512
#: D: per-head qk nope dim (before the absorption into Hckv).
D_NOPE = 128
#: Dr: qk rope dim.
D_ROPE = 64
#: Hckv + Dr = 576: the absorbed query / key width (kv_rmsnorm_rope_cache input, SFA query).
D_QK = HCKV + D_ROPE
#: Nkv: kv heads of the MLA caches.
NKV = 1
#: Per-tile quant tile (elements of k_nope per fp32 scale).
TILE_SIZE = 128

# DeepSeek-V3.2 lightning indexer (npu_lightning_indexer doc, "约束说明": query N = 64, key N = 1,
# D = 128 for query and key; the same values as the model's index_n_heads / index_head_dim).
#: N1: indexer query heads.
INDEXER_HEADS = 64
#: N2: indexer key heads.
INDEXER_KEY_HEADS = 1
#: D: indexer query / key head dim.
INDEXER_HEAD_DIM = 128
