"""A DeepSeek-V3.2 decode step on the NumPy API: prefill, then prolog -> indexer -> sparse attention.

What ``ascend-emu demo`` runs (the CLI only renders the :class:`DecodeStepReport` this module
returns). Two paths over the same weights, the same context and the same new token:

- **int8 path** (what DeepSeek-V3.2 deployments on Atlas A2/A3 run): ``npu_mla_prolog_v3`` with
  partial quant (int8 ``weight_uq_qr``) and per-tile kv quant (``kv_cache_quant_mode=3``) writes
  656-byte rows into a PA_BSND cache; ``npu_lightning_indexer`` picks the top-k context tokens;
  ``npu_kv_quant_sparse_flash_attention`` attends over them in the int8 cache.
- **bf16 path**: non-quant ``npu_mla_prolog_v3`` writes bf16 ``kv_cache`` / ``kr_cache``;
  ``npu_sparse_flash_attention`` attends over the same indices.

The difference between the two outputs is what quantization costs (max abs error, cosine).

Scale (:class:`DecodeStepConfig`): the model's per-layer shapes are kept (He = 7168, Hcq = 1536,
Hckv = 512, D = 128, Dr = 64, indexer 64 heads x 128, top-2048), the query heads are those of one
of 8 tensor-parallel ranks (128 / 8 = 16), and the context is 4096 tokens (the model serves up to
128 K); one layer, one sequence, random weights scaled ``randn / sqrt(fan_in)``. The indexer's own
projections (its query from ``query_norm``, its key and head weights from the hidden state) are
plain NumPy matmuls here: they are not among the emulated ops. The softmax scale is ``(D + Dr) ** -0.5``, DeepSeek's (without its YaRN factor).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import ops
from .checked_mode import mark_written
from .layouts import slots_from_block_table
from .mla import D_NOPE, D_ROPE, HCKV
from .quant import BF16, MLA_ROW, read_combined_cache


@dataclass(frozen=True, kw_only=True)
class DecodeStepConfig:
    """Shapes of the demo's decode step (defaults: DeepSeek-V3.2 per layer, one TP-8 rank).

    Attributes:
        he: hidden size He (the prolog accepts 7168 or 7680).
        hcq: query low-rank dim Hcq.
        heads: query heads N of this rank.
        context: tokens already in the cache before the decode step.
        block_size: rows per cache block (PA_BSND).
        sparse_count: top-k of the indexer, the tokens each query attends to.
        indexer_heads: indexer query heads.
        indexer_dim: indexer head dim.
        seed: the random seed of weights and inputs.
    """

    he: int = 7168
    hcq: int = 1536
    heads: int = 16
    context: int = 4096
    block_size: int = 128
    sparse_count: int = 2048
    indexer_heads: int = 64
    indexer_dim: int = 128
    seed: int = 0


@dataclass
class DecodeStepReport:
    """What the demo measured.

    Attributes:
        config: the shapes used.
        timings: ``[(step, seconds)]`` in the order run.
        blocks_used, num_blocks: cache blocks holding the ``context + 1`` tokens, and the cache size.
        block_table: the sequence's blocks ``[ceil((context + 1) / block_size)]`` (a shuffled pool).
        cache_bytes: ``{"int8 kv_cache": n, "bf16 kv_cache + kr_cache": n}``.
        row_slot: the cache slot of the decoded token (the new one).
        row: its 656 raw bytes (uint8 ``[656]``).
        row_k_nope, row_k_rope, row_scales: the row decoded: dequantized k_nope fp32 ``[512]``,
            k_rope bf16 ``[64]``, the 4 tile scales fp32 ``[4]``.
        selected: tokens the indexer selected (``min(sparse_count, context + 1)``).
        out_int8, out_bf16: attention outputs bf16 ``[N, 512]`` of the two paths.
        max_abs, cosine: their difference.
        decode_int8: runs the int8 path's decode step again (prolog -> indexer -> KV-quant sparse
            attention, the new token's row rewritten in place); returns its attention output.
        floor_int8: the bare work of that step, for benchmarks: fp32 BLAS products of the prolog's
            four matmuls on pre-widened weights, the indexer's q . k product over the context and
            its top-k selection (``argpartition``), the gather of the selected 656-byte rows and the
            attention's two fp32 products.
    """

    config: DecodeStepConfig
    timings: list[tuple[str, float]] = field(default_factory=list)
    blocks_used: int = 0
    num_blocks: int = 0
    block_table: np.ndarray | None = None
    cache_bytes: dict[str, int] = field(default_factory=dict)
    row_slot: int = 0
    row: np.ndarray | None = None
    row_k_nope: np.ndarray | None = None
    row_k_rope: np.ndarray | None = None
    row_scales: np.ndarray | None = None
    selected: int = 0
    out_int8: np.ndarray | None = None
    out_bf16: np.ndarray | None = None
    max_abs: float = 0.0
    cosine: float = 0.0
    decode_int8: Callable[[], np.ndarray] | None = None
    floor_int8: Callable[[], object] | None = None


def _rope_tables(positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """bf16 sin / cos ``[len(positions), Dr]`` in the half layout the MLA ops take."""
    inv_freq = 10000.0 ** (-np.arange(D_ROPE // 2, dtype=np.float32) / (D_ROPE // 2))  # [Dr/2]
    angle = positions.astype(np.float32)[:, None] * inv_freq  # [P, Dr/2]
    angle = np.concatenate([angle, angle], axis=-1)  # [P, Dr]
    return np.sin(angle).astype(BF16), np.cos(angle).astype(BF16)


def _quant_per_channel(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per output channel: int8 ``[K, C]`` and its fp32 dequant scale ``[1, C]``."""
    scale = np.abs(w).max(axis=0, keepdims=True) / 127  # [1, C]
    return np.rint(w / scale).astype(np.int8), scale.astype(np.float32)


def run_decode_step(config: DecodeStepConfig = DecodeStepConfig(), *,
                    on_step: Callable[[str], None] | None = None) -> DecodeStepReport:
    """Run the demo's prefill and decode step on both paths (module doc) and measure them.

    Args:
        config: the shapes.
        on_step: called with each step's name before it runs (progress display).

    Returns:
        The :class:`DecodeStepReport`.

    Raises:
        The ops' errors, if ``config`` asks for shapes they reject (e.g. He other than 7168 / 7680).
    """
    c = config
    rep = DecodeStepReport(config=c)
    rng = np.random.default_rng(c.seed)

    def step(name: str, fn: Callable[[], object]):
        if on_step is not None:
            on_step(name)
        start = time.perf_counter()
        out = fn()
        rep.timings.append((name, time.perf_counter() - start))
        return out

    def randn(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(BF16)

    n, ctx, bs = c.heads, c.context, c.block_size
    total = ctx + 1  # the context and the decoded token
    blocks_used = -(-total // bs)
    num_blocks = blocks_used + 8  # a pool larger than the sequence needs
    block_table = rng.permutation(num_blocks)[:blocks_used].astype(np.int32)[None, :]  # [1, blocks_used]
    slots = slots_from_block_table(block_table, [total], bs, num_blocks)[0]  # [context + 1]
    rep.blocks_used, rep.num_blocks, rep.block_table = blocks_used, num_blocks, block_table[0]

    # ---- weights
    def make_weights():
        w_uq_qr = randn(c.hcq, n * (D_NOPE + D_ROPE), scale=c.hcq ** -0.5)  # [Hcq, N*(D+Dr)]
        w_uq_qr_int8, w_uq_qr_scale = _quant_per_channel(w_uq_qr.astype(np.float32))
        return dict(
            weight_dq=ops.npu_format_cast(randn(c.he, c.hcq, scale=c.he ** -0.5), 29),  # [He, Hcq] NZ
            weight_uq_qr=ops.npu_format_cast(w_uq_qr, 29),
            weight_uq_qr_int8=ops.npu_format_cast(w_uq_qr_int8, 29),
            dequant_scale_w_uq_qr=w_uq_qr_scale,  # [1, N*(D+Dr)]
            weight_uk=randn(n, D_NOPE, HCKV, scale=D_NOPE ** -0.5),  # [N, D, Hckv]
            weight_dkv_kr=ops.npu_format_cast(randn(c.he, HCKV + D_ROPE, scale=c.he ** -0.5), 29),
            rmsnorm_gamma_cq=(1 + 0.1 * rng.standard_normal(c.hcq, dtype=np.float32)).astype(BF16),
            rmsnorm_gamma_ckv=(1 + 0.1 * rng.standard_normal(HCKV, dtype=np.float32)).astype(BF16),
            w_iq=randn(c.hcq, c.indexer_heads * c.indexer_dim, scale=c.hcq ** -0.5),  # indexer projections
            w_ik=randn(c.he, c.indexer_dim, scale=c.he ** -0.5),
            w_iw=randn(c.he, c.indexer_heads, scale=c.he ** -0.5),
        )

    w = step("weights: random, cast to FRACTAL_NZ, int8 weight_uq_qr", make_weights)
    x = randn(1, total, c.he)  # [1, context + 1, He]: the context, then the decoded token
    sin, cos = _rope_tables(np.arange(total))  # [context + 1, Dr]
    kv_int8 = np.zeros((num_blocks, bs, 1, MLA_ROW.row_bytes), np.int8)  # [BlockNum, BlockSize, 1, 656]
    kv_bf16 = np.zeros((num_blocks, bs, 1, HCKV), BF16)  # [BlockNum, BlockSize, 1, Hckv]
    kr_bf16 = np.zeros((num_blocks, bs, 1, D_ROPE), BF16)  # [BlockNum, BlockSize, 1, Dr]
    k_indexer = np.zeros((num_blocks, bs, 1, c.indexer_dim), BF16)  # [BlockNum, BlockSize, 1, 128]
    common = dict(weight_dq=w["weight_dq"], weight_uk=w["weight_uk"], weight_dkv_kr=w["weight_dkv_kr"],
                  rmsnorm_gamma_cq=w["rmsnorm_gamma_cq"], rmsnorm_gamma_ckv=w["rmsnorm_gamma_ckv"])

    def prolog_int8(tok: slice):
        return ops.npu_mla_prolog_v3(
            x[:, tok], weight_uq_qr=w["weight_uq_qr_int8"], rope_sin=sin[None, tok], rope_cos=cos[None, tok],
            kv_cache=kv_int8, kr_cache=np.zeros(0, BF16), cache_index=slots[None, tok],
            dequant_scale_w_uq_qr=w["dequant_scale_w_uq_qr"], k_nope_clip_alpha=np.ones(1, np.float32),
            cache_mode="PA_BSND", weight_quant_mode=1, kv_cache_quant_mode=3, query_quant_mode=0,
            ckvkr_repo_mode=1, quant_scale_repo_mode=1, tile_size=MLA_ROW.tile_size, **common)

    def prolog_bf16(tok: slice):
        return ops.npu_mla_prolog_v3(
            x[:, tok], weight_uq_qr=w["weight_uq_qr"], rope_sin=sin[None, tok], rope_cos=cos[None, tok],
            kv_cache=kv_bf16, kr_cache=kr_bf16, cache_index=slots[None, tok], cache_mode="PA_BSND",
            query_norm_flag=True, **common)

    def indexer_keys(tok: slice):
        k = (x[0, tok].astype(np.float32) @ w["w_ik"].astype(np.float32)).astype(BF16)  # [T, 128]
        k_indexer.reshape(-1, c.indexer_dim)[slots[tok]] = k  # PA_BSND rows
        mark_written(k_indexer, slots[tok])  # a plain scatter, not an op: declared for checked mode

    prefill, decode = slice(0, ctx), slice(ctx, total)
    step(f"prefill {ctx} tokens: npu_mla_prolog_v3, int8 per-tile cache", lambda: prolog_int8(prefill))
    step(f"prefill {ctx} tokens: npu_mla_prolog_v3, bf16 cache", lambda: prolog_bf16(prefill))
    step(f"prefill {ctx} tokens: indexer keys", lambda: indexer_keys(prefill))

    # ---- decode step: the new token at position `context`
    query8, query_rope8, *_ = step("decode: npu_mla_prolog_v3 (int8 per-tile)", lambda: prolog_int8(decode))
    query16, query_rope16, _, query_norm, _ = step("decode: npu_mla_prolog_v3 (bf16)", lambda: prolog_bf16(decode))
    indexer_keys(decode)
    xt = x[0, decode].astype(np.float32)  # [1, He]
    q_idx = (query_norm.reshape(1, c.hcq).astype(np.float32) @ w["w_iq"].astype(np.float32)).astype(BF16).reshape(
        1, 1, c.indexer_heads, c.indexer_dim)  # [B, S1, 64, 128]: from query_norm, as DeepSeek-V3.2's indexer
    w_idx = (xt @ w["w_iw"].astype(np.float32) * c.indexer_heads ** -0.5).astype(BF16).reshape(
        1, 1, c.indexer_heads)  # [B, S1, N1]
    seq_q, seq_kv = np.array([1], np.int32), np.array([total], np.int32)
    sparse_indices, _ = step("decode: npu_lightning_indexer", lambda: ops.npu_lightning_indexer(
        q_idx, k_indexer, w_idx, actual_seq_lengths_query=seq_q, actual_seq_lengths_key=seq_kv,
        block_table=block_table, layout_query="BSND", layout_key="PA_BSND", sparse_count=c.sparse_count,
        sparse_mode=3))  # [1, 1, 1, sparse_count] int32
    rep.selected = int((sparse_indices >= 0).sum())
    scale_value = float((D_NOPE + D_ROPE) ** -0.5)
    q576 = np.concatenate([query8, query_rope8], axis=-1)  # [1, 1, N, 576]
    out8 = step("decode: npu_kv_quant_sparse_flash_attention", lambda: ops.npu_kv_quant_sparse_flash_attention(
        q576, kv_int8, kv_int8, sparse_indices, scale_value, 2, 2, block_table=block_table,
        actual_seq_lengths_query=seq_q, actual_seq_lengths_kv=seq_kv, layout_query="BSND", layout_kv="PA_BSND",
        sparse_mode=3, attention_mode=2, quant_scale_repo_mode=1, tile_size=MLA_ROW.tile_size,
        rope_head_dim=D_ROPE))  # [1, 1, N, 512]
    out16, *_ = step("decode: npu_sparse_flash_attention (bf16)", lambda: ops.npu_sparse_flash_attention(
        query16, kv_bf16, kv_bf16, sparse_indices, scale_value, block_table=block_table,
        actual_seq_lengths_query=seq_q, actual_seq_lengths_kv=seq_kv, query_rope=query_rope16, key_rope=kr_bf16,
        layout_query="BSND", layout_kv="PA_BSND", sparse_mode=3, attention_mode=2))  # [1, 1, N, 512]

    def decode_int8():
        q, qr, *_ = prolog_int8(decode)
        idx, _ = ops.npu_lightning_indexer(
            q_idx, k_indexer, w_idx, actual_seq_lengths_query=seq_q, actual_seq_lengths_key=seq_kv,
            block_table=block_table, layout_query="BSND", layout_key="PA_BSND", sparse_count=c.sparse_count)
        return ops.npu_kv_quant_sparse_flash_attention(
            np.concatenate([q, qr], axis=-1), kv_int8, kv_int8, idx, scale_value, 2, 2, block_table=block_table,
            actual_seq_lengths_query=seq_q, actual_seq_lengths_kv=seq_kv, layout_query="BSND", layout_kv="PA_BSND",
            sparse_mode=3, attention_mode=2, quant_scale_repo_mode=1, tile_size=MLA_ROW.tile_size,
            rope_head_dim=D_ROPE)

    f32 = {name: np.asarray(w[name], np.float32) for name in ("weight_dq", "weight_uq_qr_int8", "weight_dkv_kr")}
    w_uk32 = w["weight_uk"].astype(np.float32)  # [N, D, Hckv]
    q_idx32 = q_idx.reshape(c.indexer_heads, c.indexer_dim).astype(np.float32)  # [64, 128]
    k_idx32 = k_indexer.reshape(-1, c.indexer_dim)[slots].astype(np.float32)  # [context + 1, 128]
    q576_32 = q576.reshape(n, -1).astype(np.float32)  # [N, 576]
    rows_flat = kv_int8.reshape(-1, MLA_ROW.row_bytes)  # [BlockNum * BlockSize, 656]
    picked = slots[sparse_indices.reshape(-1)[sparse_indices.reshape(-1) >= 0]]  # [K] slots

    def floor_int8():
        cq = xt @ f32["weight_dq"]  # [1, Hcq]
        qcqr = (cq @ f32["weight_uq_qr_int8"]).reshape(n, D_NOPE + D_ROPE)  # [N, 192]
        np.matmul(qcqr[:, None, :D_NOPE], w_uk32)  # [N, 1, Hckv]
        xt @ f32["weight_dkv_kr"]  # [1, Hckv + Dr]
        score = np.maximum(q_idx32 @ k_idx32.T, 0).sum(0)  # [context + 1]
        np.argpartition(-score, min(c.sparse_count, score.size) - 1)
        k = rows_flat[picked].astype(np.float32)  # [K, 656]: the gather
        p = q576_32 @ k[:, :HCKV + D_ROPE].T  # [N, K]
        return p @ k[:, :HCKV]  # [N, Hckv]

    rep.decode_int8, rep.floor_int8 = decode_int8, floor_int8

    # ---- what it shows
    rep.cache_bytes = {"int8 kv_cache (656-byte rows)": kv_int8.nbytes,
                       "bf16 kv_cache + kr_cache": kv_bf16.nbytes + kr_bf16.nbytes}
    rep.row_slot = int(slots[ctx])
    rep.row = kv_int8.reshape(-1, MLA_ROW.row_bytes)[rep.row_slot].view(np.uint8).copy()  # [656]
    k_nope, k_rope, scales = read_combined_cache(kv_int8, slot=rep.row_slot)
    rep.row_k_nope, rep.row_k_rope, rep.row_scales = k_nope[0], k_rope[0], scales[0]
    rep.out_int8 = np.asarray(out8).reshape(n, HCKV)
    rep.out_bf16 = np.asarray(out16).reshape(n, HCKV)
    a = rep.out_int8.astype(np.float64)
    b = rep.out_bf16.astype(np.float64)
    rep.max_abs = float(np.abs(a - b).max())
    rep.cosine = float((a * b).sum() / (np.linalg.norm(a) * np.linalg.norm(b)))
    return rep
