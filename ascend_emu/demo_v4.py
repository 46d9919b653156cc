"""DeepSeek-V4-Flash attention layers on the NumPy API, as vllm-ascend calls the ops (A2 / A3 and 950).

What ``ascend-emu demo --model v4`` runs and what ``tests/test_demo_v4.py`` checks against the
float64 reference model (``tests/reference/deepseek_v4_attention.py``). One request; a call of
:meth:`V4AttentionLayer.step` takes the next ``T`` tokens (a prefill chunk or one decode token)
and runs, in the order of vllm-ascend ``vllm_ascend/attention/dsa_v1.py`` (docs/v4.md "The V4
decode step"):

1. the projections (plain NumPy, bf16 weights, fp32 accumulation, bf16 results, as
   ``npu_quant_matmul`` / ``npu_transpose_batchmatmul`` stand in here): ``qr = q_norm(wq_a x)``,
   ``q = wq_b qr`` with the weightless per-head RMS, ``kv = kv_norm(wkv x)``;
2. ``inplace_partial_rotary_mul`` on ``q[..., 448:512]`` and ``kv[..., 448:512]``; the kv rows
   written to the SWA cache (bf16 ``[blocks, 128, 1, 512]``, PA_ND);
3. ratio > 1: ``compressor`` (its state cache carried over calls), ``compressor_metadata`` for the
   slots, the rows written to the compressed cache; ratio 4 (CSA): the indexer (its own
   compressor with D 128, the Hadamard rotation, int8 keys with fp16 scales) and
   ``npu_vllm_quant_lightning_indexer`` for the top-512;
4. ``npu_sparse_attn_sharedkv`` (+ ``_metadata``) over the window, the compressed rows (HCA) or
   the selected ones (CSA), with the per-head sink;
5. the inverse RoPE (``inplace_partial_rotary_mul`` with ``negate_sin``) and the grouped output
   projection.

The Ascend 950 path (``path="950"``, vllm-ascend's A5 branch) keeps 640-byte fp8 rows in the SWA
and compressed caches, written by ``kv_compress_epilog`` (layout 1, quant_mode 2), and attends with
``npu_kv_quant_sparse_attn_sharedkv``; its indexer keys are fp8 with fp32 scales in the packed
``indexer_compress_epilog_v2`` cache, its query fp8, its weights fp32 (module constant :data:`PATHS`,
docs/v4.md "The V4 decode step"). :class:`V4Block` adds the mHC ops around a layer and
:func:`run_v4_decode_step` is what ``ascend-emu demo --model v4`` runs.

Scale (:class:`V4Config`): DeepSeek-V4-Flash's dimensions (hidden 4096, 64 query heads, head dim
512 = 448 + 64, window 128, q rank 1024, 8 output groups of rank 1024, indexer 64 x 128, top-512);
the test reduces hidden / q rank / o rank (the attention ops do not see them); random weights
``randn / sqrt(fan_in)``. RoPE uses ``theta ** (-2i / 64)`` (10000 for SWA layers, 40000 for
compressed ones, as the model) without YaRN.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from . import ops
from .errors import ModeError, ShapeError, arg_error
from . import soc
from .quant import BF16, fp8_dtype, to_bf16, to_f32
from .layouts import (V4_CMP_ROPE_THETA, V4_FP8_ROW_BYTES, V4_HEAD_DIM, V4_INDEXER_DIM, V4_INDEXER_PACKED_ROW,
                      V4_ROPE_DIM, V4_ROPE_THETA, V4_STATE_BLOCK_SIZES, V4_WINDOW, slot_of_block_row,
                      v4_rope_tables)
from .quant.v4 import decode_kv_rows, indexer_quant_fp8, indexer_quant_int8

#: The attention's fixed shapes (npu_sparse_attn_sharedkv: N1 64, D 512; the model's rope part).
HEADS = 64
HEAD_DIM = V4_HEAD_DIM
ROPE_DIM = V4_ROPE_DIM
NOPE_DIM = HEAD_DIM - ROPE_DIM
WINDOW = V4_WINDOW
#: The indexer: 64 heads x 128, top-512 (npu_vllm_quant_lightning_indexer's N1 and D).
INDEX_HEADS = 64
INDEX_DIM = V4_INDEXER_DIM
INDEX_TOPK = 512
#: Layer kinds by compress ratio: 0 SWA, 4 CSA (overlapping groups, coff 2), 128 HCA.
RATIOS = (0, 4, 128)
#: State-cache rows per block by path and ratio (vllm-ascend ``DSV4_BLOCK_SIZES``, block size 128).
STATE_BLOCK_SIZES = {"a3": V4_STATE_BLOCK_SIZES["a2a3"], "950": V4_STATE_BLOCK_SIZES["950"]}
#: The two cache paths: ``a3`` (Atlas A2 / A3: bf16 caches, npu_sparse_attn_sharedkv) and ``950``
#: (Ascend 950: 640-byte fp8 rows written by kv_compress_epilog, npu_kv_quant_sparse_attn_sharedkv).
PATHS = ("a3", "950")
#: The 950 path's row: kv_compress_epilog quant_mode 2 (rope bf16, 448 fp8, 7 E8M0 scales, pad).
ROW_950 = V4_FP8_ROW_BYTES
#: The 950 path's packed indexer cache row ``D'``: 128 fp8 key bytes and one fp32 scale
#: (indexer_compress_epilog_v2, layout 2: a block holds its value rows, then its scale rows).
IDX_ROW_950 = V4_INDEXER_PACKED_ROW
EPS = 1e-6


@dataclass(frozen=True, kw_only=True)
class V4Config:
    """Shapes of the layer (defaults: DeepSeek-V4-Flash).

    Attributes:
        hidden: the hidden size (4096). q_rank: wq_a's output (1024). o_groups, o_rank: the grouped
        output projection (8 groups of rank 1024). max_tokens: the request's longest length (cache
        size). block_size: rows per block of every paged cache (a multiple of 16, at most 1024).
        theta, cmp_theta: RoPE bases of SWA and of compressed layers. seed: weights' seed.
    """

    hidden: int = 4096
    q_rank: int = 1024
    o_groups: int = 8
    o_rank: int = 1024
    max_tokens: int = 1024
    block_size: int = 128
    theta: float = V4_ROPE_THETA
    cmp_theta: float = V4_CMP_ROPE_THETA
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("hidden", "q_rank", "o_rank", "max_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise arg_error(ShapeError, name, "an int >= 1", v)
        if self.o_groups not in (1, 2, 4, 8, 16, 32, 64):
            raise arg_error(ShapeError, "o_groups", "a power of two dividing the 64 heads", self.o_groups)
        if self.block_size % 16 or not 16 <= self.block_size <= 1024:
            raise arg_error(ShapeError, "block_size", "a multiple of 16 in [16, 1024] (PA_ND / PA_BSND)",
                            self.block_size)


def _linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """bf16 ``x [.., in] @ w[out, in]^T`` accumulated in fp32, rounded once to bf16."""
    return to_bf16(to_f32(x) @ to_f32(w).T)


def _rms(x: np.ndarray, weight: np.ndarray | None) -> np.ndarray:
    """RMSNorm over the last dim in fp32 (``x * rsqrt(mean(x^2) + eps) * weight``), rounded to bf16."""
    x32 = to_f32(x)
    y = x32 / np.sqrt((x32 * x32).mean(-1, keepdims=True) + np.float32(EPS))
    return to_bf16(y if weight is None else y * to_f32(weight))


def hadamard(n: int) -> np.ndarray:
    """Normalized Sylvester Walsh-Hadamard matrix ``[n, n]`` fp32 (the indexer's rotation)."""
    h = np.ones((1, 1), np.float64)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(n)).astype(np.float32)


#: The rope tables (:func:`ascend_emu.layouts.v4_rope_tables`): fp32 cos / sin ``[positions, 64]``.
rope_tables = v4_rope_tables


def make_weights(cfg: V4Config, ratio: int, rng: np.random.Generator) -> dict:
    """Random weights of one layer (bf16 matrices ``randn / sqrt(fan_in)``, fp32 sink / ape).

    Keys as ``tests/reference/deepseek_v4_attention.py`` reads them: ``wq_a, q_norm, wq_b, wkv,
    kv_norm, wo_a, wo_b, sink``; ratio > 1 ``cmp`` {``wkv, wgate, ape, norm``}; ratio 4
    ``idx_wq_b, idx_weights, idx_cmp``.
    """
    if ratio not in RATIOS:
        raise arg_error(ModeError, "ratio", f"one of {RATIOS} (SWA, CSA, HCA)", ratio)

    def mat(out: int, inp: int) -> np.ndarray:
        return to_bf16(rng.standard_normal((out, inp), dtype=np.float32) / np.float32(np.sqrt(inp)))

    def norm(n: int) -> np.ndarray:
        return to_bf16(1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32))

    def compressor(d: int) -> dict:
        coff = 2 if ratio == 4 else 1
        return {"wkv": mat(coff * d, cfg.hidden), "wgate": mat(coff * d, cfg.hidden),
                "ape": rng.standard_normal((ratio, coff * d), dtype=np.float32) * np.float32(0.5), "norm": norm(d)}

    w = {"wq_a": mat(cfg.q_rank, cfg.hidden), "q_norm": norm(cfg.q_rank), "wq_b": mat(HEADS * HEAD_DIM, cfg.q_rank),
         "wkv": mat(HEAD_DIM, cfg.hidden), "kv_norm": norm(HEAD_DIM),
         "wo_a": mat(cfg.o_groups * cfg.o_rank, HEADS * HEAD_DIM // cfg.o_groups),
         "wo_b": mat(cfg.hidden, cfg.o_groups * cfg.o_rank), "sink": rng.standard_normal(HEADS, dtype=np.float32)}
    if ratio:
        w["cmp"] = compressor(HEAD_DIM)
    if ratio == 4:
        w["idx_wq_b"] = mat(INDEX_HEADS * INDEX_DIM, cfg.q_rank)
        w["idx_weights"] = mat(INDEX_HEADS, cfg.hidden)
        w["idx_cmp"] = compressor(INDEX_DIM)
    return w


def _paged(blocks: int, rng: np.random.Generator) -> np.ndarray:
    """A shuffled block table ``int32 [1, blocks]`` over ids 1..blocks (id 0 stays unused)."""
    return (rng.permutation(blocks) + 1).astype(np.int32)[None, :]


class V4AttentionLayer:
    """One attention layer of one request on the emulated ops (module doc), its caches and state.

    Attributes:
        ratio: 0 (SWA), 4 (CSA) or 128 (HCA). pos: tokens written so far. path: ``"a3"`` / ``"950"``.
        swa_cache: bf16 ``[blocks + 1, bs, 1, 512]`` PA_ND (block 0 unused; 950: float8_e4m3fn
        ``[.., 640]`` rows), ``swa_table``.
        cmp_cache, cmp_table: the compressed rows (ratio > 1), one row per ``ratio`` tokens.
        idx_cache (int8 ``[.., bs, 1, 128]``), idx_scale (fp16 ``[.., bs, 1]``): the indexer's
        compressed keys (ratio 4; the 950 path: one packed uint8 ``[.., bs, 1, 132]`` cache, no
        idx_scale). times: seconds per op name, summed over calls.

    Raises (construction):
        ModeError: a path not in :data:`PATHS`; the 950 path on a SoC that is not an Ascend 950.
    """

    def __init__(self, cfg: V4Config, ratio: int, weights: dict, seed: int = 0, path: str = "a3"):
        if path not in PATHS:
            raise arg_error(ModeError, "path", f"one of {PATHS}", path)
        if path == "950":
            soc.require_ascend950("path", path, "the Ascend 950's fp8 caches")
        self.cfg, self.ratio, self.w, self.path = cfg, ratio, weights, path
        rng = np.random.default_rng(seed)
        row, cdt = (ROW_950, fp8_dtype("float8_e4m3fn")) if path == "950" else (HEAD_DIM, BF16)
        bs = cfg.block_size
        self.theta = cfg.cmp_theta if ratio else cfg.theta
        self.cos, self.sin = rope_tables(cfg.max_tokens, self.theta)
        n = -(-cfg.max_tokens // bs)
        self.swa_table = _paged(n, rng)
        self.swa_cache = np.zeros((n + 1, bs, 1, row), cdt)
        self.pos = 0
        self.times: dict[str, float] = {}
        if ratio:
            nc = -(-(cfg.max_tokens // ratio) // bs) or 1
            self.cmp_table = _paged(nc, rng)
            self.cmp_cache = np.zeros((nc + 1, bs, 1, row), cdt)
            state_bs = STATE_BLOCK_SIZES[path][ratio]
            ns = -(-cfg.max_tokens // state_bs)
            self.state_table = _paged(ns, rng)
            self.state = {"cmp": np.zeros((ns + 1, state_bs, 2 * (2 if ratio == 4 else 1) * HEAD_DIM), np.float32)}
        if ratio == 4:
            self.state["idx_cmp"] = np.zeros((ns + 1, state_bs, 2 * 2 * INDEX_DIM), np.float32)
            if path == "950":  # one packed uint8 cache: a block's fp8 key rows, then its fp32 scales
                self.idx_cache = np.zeros((nc + 1, bs, 1, IDX_ROW_950), np.uint8)
            else:
                self.idx_cache = np.zeros((nc + 1, bs, 1, INDEX_DIM), np.int8)
                self.idx_scale = np.zeros((nc + 1, bs, 1), np.float16)
        self._hadamard = hadamard(INDEX_DIM)

    # ------------------------------------------------------------------ helpers
    def _timed(self, name: str, fn, *args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - t0
        return out

    def _rope(self, x4: np.ndarray, positions: np.ndarray, lo: int, inverse: bool = False) -> None:
        """``inplace_partial_rotary_mul`` on ``x4 [T, 1, N, D]`` dims ``lo .. lo + 64`` at ``positions``."""
        t = positions.size
        cos = self.cos[positions].reshape(t, 1, 1, ROPE_DIM)
        sin = self.sin[positions].reshape(t, 1, 1, ROPE_DIM)
        self._timed("inplace_partial_rotary_mul", ops.inplace_partial_rotary_mul, x4, cos, sin, "interleave",
                    [lo, lo + ROPE_DIM], negate_sin=inverse)

    def _slots(self, table: np.ndarray, rows_at: np.ndarray) -> np.ndarray:
        """``(block, offset)`` int32 ``[n, 2]`` of the request's logical rows ``rows_at`` (vllm-ascend's
        ``slot_mapping`` for ``npu_scatter_nd_update_v2``)."""
        bs = self.cfg.block_size
        return np.stack([table[0, rows_at // bs], rows_at % bs], axis=1).astype(np.int32)

    def _scatter(self, what: str, cache: np.ndarray, slots: np.ndarray, values: np.ndarray) -> None:
        """``npu_scatter_nd_update_v2(cache, slots [n, 2], values [n, ...])`` (rows with block -1 skipped);
        on the 950 path the kv rows go through ``kv_compress_epilog`` (layout 1, quant_mode 2) at the
        flat slots ``block * bs + offset`` (-1 skipped), as vllm-ascend's A5 branch writes them."""
        if self.path == "950" and what in ("swa", "compressed"):
            flat = np.where(slots[:, 0] >= 0, slots[:, 0] * cache.shape[1] + slots[:, 1], -1).astype(np.int32)
            rows = cache.reshape(-1, 1, cache.shape[-1])  # a view: [blocks * bs, 1, 640]
            self._timed(f"kv_compress_epilog ({what})", ops.kv_compress_epilog, rows,
                        to_bf16(values).reshape(slots.shape[0], HEAD_DIM), flat, 64, 2, True, 1, None)
            return
        self._timed(f"npu_scatter_nd_update_v2 ({what})", ops.npu_scatter_nd_update_v2, cache, slots,
                    np.ascontiguousarray(values).reshape(slots.shape[0], *cache.shape[2:]))

    # ------------------------------------------------------------------ the step
    def step(self, x: np.ndarray) -> np.ndarray:
        """The next ``T`` tokens ``x`` bf16 ``[T, hidden]`` -> the layer's output bf16 ``[T, hidden]``.

        Raises:
            ShapeError: x not ``[T, hidden]``, or the request would pass ``max_tokens``.
        """
        cfg, w, ratio = self.cfg, self.w, self.ratio
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != cfg.hidden or x.shape[0] < 1:
            raise arg_error(ShapeError, "x", f"bf16 [T >= 1, {cfg.hidden}]", f"shape {list(x.shape)}")
        t, p0 = x.shape[0], self.pos
        if p0 + t > cfg.max_tokens:
            raise arg_error(ShapeError, "x", f"at most {cfg.max_tokens - p0} more tokens (max_tokens)", t)
        x = to_bf16(x)
        positions = np.arange(p0, p0 + t)
        # 1. projections
        qr = self._timed("projections", lambda: _rms(_linear(x, w["wq_a"]), w["q_norm"]))
        q = self._timed("projections", lambda: _rms(_linear(qr, w["wq_b"]).reshape(t, HEADS, HEAD_DIM), None))
        kv = self._timed("projections", lambda: _rms(_linear(x, w["wkv"]), w["kv_norm"]))
        # 2. RoPE, SWA cache
        q4 = np.ascontiguousarray(q.reshape(t, 1, HEADS, HEAD_DIM))
        kv4 = np.ascontiguousarray(kv.reshape(t, 1, 1, HEAD_DIM))
        self._rope(q4, positions, NOPE_DIM)
        self._rope(kv4, positions, NOPE_DIM)
        self._scatter("swa", self.swa_cache, self._slots(self.swa_table, positions), kv4)
        self.pos = p0 + t
        cu = np.array([0, t], np.int32)
        seqused = np.array([self.pos], np.int32)
        # 3. compressed rows, indexer
        indices = None
        if ratio:
            self._compress(x, p0, cu)
        if ratio == 4:
            indices = self._indexer(x, qr, positions, cu, seqused)
            self.last_indices = indices[-1, 0]
        # 4. attention
        o = self._attention(q4.reshape(t, HEADS, HEAD_DIM), indices, cu, seqused, t)
        # 5. inverse RoPE, grouped output projection
        o4 = np.ascontiguousarray(o.reshape(t, 1, HEADS, HEAD_DIM))
        self._rope(o4, positions, NOPE_DIM, inverse=True)
        g = cfg.o_groups

        def out_proj():
            wo_a = to_f32(w["wo_a"]).reshape(g, cfg.o_rank, -1)
            og = to_bf16(np.einsum("tgd,grd->tgr", to_f32(o4).reshape(t, g, -1), wo_a))
            return _linear(og.reshape(t, g * cfg.o_rank), w["wo_b"])
        return self._timed("projections", out_proj)

    def _attention(self, q: np.ndarray, indices, cu: np.ndarray, seqused: np.ndarray, t: int) -> np.ndarray:
        """The shared-KV attention of the path (with its ``_metadata`` plan): bf16 ``[T, 64, 512]``."""
        ratio = self.ratio
        common = dict(cu_seqlens_q=cu, seqused_kv=seqused, batch_size=1, max_seqlen_q=t, max_seqlen_kv=self.pos,
                      cmp_topk=INDEX_TOPK if ratio == 4 else 0, cmp_ratio=ratio if ratio else -1, layout_q="TND",
                      has_cmp_kv=bool(ratio))
        call = dict(ori_kv=self.swa_cache, cmp_kv=self.cmp_cache if ratio else None, cmp_sparse_indices=indices,
                    ori_block_table=self.swa_table, cmp_block_table=self.cmp_table if ratio else None,
                    cu_seqlens_q=cu, seqused_kv=seqused, sinks=self.w["sink"], softmax_scale=HEAD_DIM ** -0.5,
                    cmp_ratio=ratio if ratio else 1, layout_q="TND")
        if self.path == "950":
            meta = self._timed("npu_kv_quant_sparse_attn_sharedkv_metadata",
                               ops.npu_kv_quant_sparse_attn_sharedkv_metadata, HEADS, 1, HEAD_DIM, 1,
                               tile_size=64, rope_head_dim=ROPE_DIM, **common)
            o, _ = self._timed("npu_kv_quant_sparse_attn_sharedkv", ops.npu_kv_quant_sparse_attn_sharedkv, q, 1,
                               metadata=meta, tile_size=64, rope_head_dim=ROPE_DIM, **call)
            return o
        meta = self._timed("npu_sparse_attn_sharedkv_metadata", ops.npu_sparse_attn_sharedkv_metadata,
                           HEADS, 1, HEAD_DIM, **common)
        o, _ = self._timed("npu_sparse_attn_sharedkv", ops.npu_sparse_attn_sharedkv, q, metadata=meta, **call)
        return o

    def _compressor(self, key: str, x: np.ndarray, p0: int, cu: np.ndarray, d: int):
        """One ``compressor`` call of weights ``w[key]`` (d 512 or 128): ``(rows, slots)`` of the
        compressed rows this call completes (``compressor_metadata``'s ``[n, 2]`` slots, -1 invalid)."""
        w, ratio, bs = self.w[key], self.ratio, self.cfg.block_size
        t = x.shape[0]
        n = min(t, t // ratio + 1)
        start = np.array([p0], np.int32)
        cos, sin, slots = self._timed("compressor_metadata", ops.compressor_metadata, self.cos, self.sin, cu, start,
                                      self.cmp_table, bs, 2, ratio, n, 1)
        state = self.state[key]
        norm = to_f32(w["norm"]) if self.path == "950" else w["norm"]  # the 950 kernel takes an fp32 norm weight
        rows = self._timed("compressor", ops.compressor, x, w["wkv"], w["wgate"], state, w["ape"], norm,
                           sin.reshape(n, ROPE_DIM), cos.reshape(n, ROPE_DIM), self.state_table, cu, None, start,
                           ROPE_DIM, ratio, 2 if ratio == 4 else 1, EPS, 2, 1)
        return np.asarray(rows).reshape(n, d), slots

    def _compress(self, x: np.ndarray, p0: int, cu: np.ndarray) -> None:
        """ratio > 1: the compressor's new rows into the compressed cache (and the indexer's keys)."""
        if getattr(ops, "compressor", None) is None:
            raise arg_error(ModeError, "ratio", "0 (SWA): this build has no ops.compressor for CSA / HCA layers",
                            self.ratio)
        rows, slots = self._compressor("cmp", x, p0, cu, HEAD_DIM)
        self._scatter("compressed", self.cmp_cache, slots, rows)
        if self.ratio == 4:
            keys, slots = self._compressor("idx_cmp", x, p0, cu, INDEX_DIM)
            keys = to_bf16(to_f32(keys) @ self._hadamard.T)
            if self.path == "950":
                flat = np.where(slots[:, 0] >= 0, slot_of_block_row(slots[:, 0], slots[:, 1], self.cfg.block_size), -1)
                self._timed("indexer_compress_epilog_v2", ops.indexer_compress_epilog_v2, self.idx_cache, keys,
                            flat.astype(np.int32), 2)
            else:
                kq, ks = indexer_quant_int8(keys)
                self._scatter("indexer keys", self.idx_cache, slots, kq)
                self._scatter("indexer scales", self.idx_scale, slots, ks)

    def _packed_keys(self) -> tuple[np.ndarray, np.ndarray]:
        """The 950 path: the packed indexer cache read as fp8 keys ``[blocks, bs, 1, 128]`` and fp32
        scales ``[blocks, bs, 1]`` (copies; offsets of :func:`ascend_emu.quant.v4.indexer_v2_offsets`)."""
        c, bs = self.idx_cache, self.cfg.block_size
        flat = c.reshape(c.shape[0], bs * IDX_ROW_950)
        keys = np.ascontiguousarray(flat[:, :bs * INDEX_DIM]).view(fp8_dtype("float8_e4m3fn"))
        scales = np.ascontiguousarray(flat[:, bs * INDEX_DIM:bs * IDX_ROW_950]).view(np.float32)
        return keys.reshape(c.shape[0], bs, 1, INDEX_DIM), scales.reshape(c.shape[0], bs, 1)

    def _indexer(self, x, qr, positions, cu, seqused) -> np.ndarray:
        """CSA: the top-512 compressed rows per token, int32 ``[T, 1, 512]`` (-1 padded)."""
        w, t = self.w, x.shape[0]
        iq = self._timed("projections", _linear, qr, w["idx_wq_b"]).reshape(t, 1, INDEX_HEADS, INDEX_DIM)
        iq = np.ascontiguousarray(iq)
        self._rope(iq, positions, INDEX_DIM - ROPE_DIM)
        iq = to_bf16(to_f32(iq).reshape(t * INDEX_HEADS, INDEX_DIM) @ self._hadamard.T)
        weights = self._timed("projections", _linear, x, w["idx_weights"])
        weights = to_f32(weights) * np.float32(INDEX_DIM ** -0.5 * INDEX_HEADS ** -0.5)
        if self.path == "950":  # fp8 query and keys, fp32 weights and scales
            qv, qs = indexer_quant_fp8(iq)
            qv = qv.view(fp8_dtype("float8_e4m3fn"))  # the codes as E4M3FN
            keys, key_scales = self._packed_keys()
        else:  # int8 query and keys, fp16 weights and scales
            qv, qs = indexer_quant_int8(iq)
            weights, keys, key_scales = weights.astype(np.float16), self.idx_cache, self.idx_scale
        meta = self._timed("npu_vllm_quant_lightning_indexer_metadata", ops.npu_vllm_quant_lightning_indexer_metadata,
                           INDEX_HEADS, 1, INDEX_DIM, 0, 0, actual_seq_lengths_query=cu[1:],
                           actual_seq_lengths_key=seqused, batch_size=1, max_seqlen_q=t, max_seqlen_k=self.pos,
                           layout_query="TND", layout_key="PA_BSND", sparse_count=INDEX_TOPK, sparse_mode=3,
                           cmp_ratio=self.ratio)
        idx, _ = self._timed("npu_vllm_quant_lightning_indexer", ops.npu_vllm_quant_lightning_indexer,
                             qv.reshape(t, INDEX_HEADS, INDEX_DIM), keys, weights,
                             qs.reshape(t, INDEX_HEADS), key_scales, 0, 0, cu[1:], seqused, self.cmp_table, meta,
                             "TND", "PA_BSND", INDEX_TOPK, 3, cmp_ratio=self.ratio)
        return idx


# ------------------------------------------------------------------------------ the block (mHC)
#: mHC: copies of the residual stream and Sinkhorn iterations (DeepSeek-V4).
HC_MULT = 4
HC_ITERS = 20


def make_hc_weights(cfg: V4Config, rng: np.random.Generator) -> dict:
    """Random mHC weights of one block's attention half: ``hc_fn`` fp32 ``[24, 4 * hidden]``,
    ``hc_scale`` fp32 ``[3]``, ``hc_base`` fp32 ``[24]``, ``attn_norm`` bf16 ``[hidden]``."""
    mix = (2 + HC_MULT) * HC_MULT
    return {"hc_fn": rng.standard_normal((mix, HC_MULT * cfg.hidden), dtype=np.float32)
            / np.float32(np.sqrt(HC_MULT * cfg.hidden)),
            "hc_scale": np.array([1.0, 1.0, 1.0], np.float32) + np.float32(0.1) * rng.standard_normal(3, np.float32),
            "hc_base": np.float32(0.1) * rng.standard_normal(mix, np.float32),
            "attn_norm": to_bf16(1.0 + 0.1 * rng.standard_normal(cfg.hidden, dtype=np.float32))}


class V4Block:
    """The attention half of a V4 decoder block: ``npu_hc_pre_v2`` -> RMSNorm -> the attention
    layer -> ``npu_hc_post`` on the 4-copy residual stream ``h`` bf16 ``[T, 4, hidden]``
    (vllm-ascend ``models/deepseek_v4/model.py``; the FFN / MoE half is not run here)."""

    def __init__(self, cfg: V4Config, ratio: int, weights: dict, hc_weights: dict, seed: int = 0,
                 path: str = "a3"):
        self.attn = V4AttentionLayer(cfg, ratio, weights, seed, path)
        self.hc = hc_weights

    @property
    def times(self) -> dict[str, float]:
        return self.attn.times

    def step(self, h: np.ndarray) -> np.ndarray:
        """``h`` bf16 ``[T, 4, hidden]`` -> the stream after the attention half, same shape."""
        hc, timed = self.hc, self.attn._timed
        y, post, comb = timed("npu_hc_pre_v2", ops.npu_hc_pre_v2, h, hc["hc_fn"], hc["hc_scale"], hc["hc_base"],
                              HC_MULT, HC_ITERS, EPS, EPS)
        a = self.attn.step(timed("projections", _rms, y, hc["attn_norm"]))
        return timed("npu_hc_post", ops.npu_hc_post, a, h, post, comb)


@dataclass
class V4StepReport:
    """What :func:`run_v4_decode_step` measured.

    Attributes:
        config, ratios, context, decode_steps: what ran (one block per ratio).
        prefill_times, decode_times: ``{op: seconds}`` summed over the layers; decode: the mean per
            decoded token. Times of the first calls include Numba compiling (see ``first_call``).
        caches: ``[(layer, cache, shape, dtype, bytes)]``.
        swa_row: ``(layer, position, block, offset, first values)`` of the last decoded token.
        cmp_rows: ``{ratio: compressed rows written}``; selected: the CSA indexer's rows for the
            last token (``-1`` excluded).
        out: the stream after the last step, bf16 ``[1, 4, hidden]``.
    """

    config: V4Config
    ratios: tuple
    context: int
    decode_steps: int
    prefill_times: dict
    decode_times: dict
    caches: list
    swa_row: tuple
    cmp_rows: dict
    selected: int
    out: np.ndarray


def run_v4_decode_step(cfg: V4Config | None = None, *, ratios: tuple = (4, 128), context: int = 508,
                       decode_steps: int = 8, path: str = "a3") -> V4StepReport:
    """Prefill ``context`` tokens through one block per ratio, then decode ``decode_steps`` tokens.

    Args:
        cfg: shapes (default :class:`V4Config`: DeepSeek-V4-Flash). ratios: the layers (0 SWA, 4
            CSA, 128 HCA). context: >= 1 tokens before decoding. decode_steps: >= 1. path: ``"a3"``
            or ``"950"`` (:data:`PATHS`; the SoC must then be an Ascend 950).

    Raises:
        ShapeError: context + decode_steps above ``cfg.max_tokens``, or either below 1.
        ModeError: a ratio not in :data:`RATIOS`.
    """
    cfg = cfg or V4Config()
    for name, v in (("context", context), ("decode_steps", decode_steps)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise arg_error(ShapeError, name, "an int >= 1", v)
    if context + decode_steps > cfg.max_tokens:
        raise arg_error(ShapeError, "context", f"at most max_tokens - decode_steps = {cfg.max_tokens - decode_steps}",
                        context)
    for r in ratios:
        if r not in RATIOS:
            raise arg_error(ModeError, "ratios", f"values in {RATIOS}", list(ratios))
    rng = np.random.default_rng(cfg.seed)
    blocks = [V4Block(cfg, r, make_weights(cfg, r, rng), make_hc_weights(cfg, rng), seed=cfg.seed + i, path=path)
              for i, r in enumerate(ratios)]

    def run(h):
        for b in blocks:
            h = b.step(h)
        return h

    def totals():
        out: dict[str, float] = {}
        for b in blocks:
            for k, v in b.times.items():
                out[k] = out.get(k, 0.0) + v
        return out

    run(to_bf16(rng.standard_normal((context, HC_MULT, cfg.hidden), dtype=np.float32)))
    prefill = totals()
    for _ in range(decode_steps):
        h = run(to_bf16(rng.standard_normal((1, HC_MULT, cfg.hidden), dtype=np.float32)))
    after = totals()
    decode = {k: (after[k] - prefill.get(k, 0.0)) / decode_steps for k in after}
    caches, cmp_rows = [], {}
    for i, b in enumerate(blocks):
        a = b.attn
        named = [("swa", a.swa_cache)]
        if a.ratio:
            named += [("compressed", a.cmp_cache)] + [(f"state ({k})", v) for k, v in a.state.items()]
            cmp_rows[a.ratio] = a.pos // a.ratio
        if a.ratio == 4 and a.path == "950":
            named += [("indexer keys + scales (packed)", a.idx_cache)]
        elif a.ratio == 4:
            named += [("indexer keys", a.idx_cache), ("indexer scales", a.idx_scale)]
        caches += [(i, n, tuple(c.shape), str(c.dtype), c.nbytes) for n, c in named]
    last = blocks[-1].attn
    p = last.pos - 1
    blk, off = int(last.swa_table[0, p // cfg.block_size]), p % cfg.block_size
    row = last.swa_cache[blk, off, 0]
    if path == "950":  # the row's values back: the rope bf16 bytes and the fp8 values times their E8M0 scales
        row = decode_kv_rows(row.reshape(1, ROW_950))[0]
    swa_row = (len(blocks) - 1, p, blk, off, row[:6].astype(np.float32))
    csa = [b.attn for b in blocks if b.attn.ratio == 4]
    selected = int((csa[0].last_indices >= 0).sum()) if csa else 0
    return V4StepReport(cfg, tuple(ratios), context, decode_steps, prefill, decode, caches, swa_row, cmp_rows,
                        selected, h)
