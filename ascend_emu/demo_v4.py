"""A DeepSeek-V4-Flash attention layer on the NumPy API, as vllm-ascend's A2 / A3 path calls the ops.

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
from .quant import BF16
from .quant.v4 import indexer_quant_int8

#: The attention's fixed shapes (npu_sparse_attn_sharedkv: N1 64, D 512; the model's rope part).
HEADS = 64
HEAD_DIM = 512
ROPE_DIM = 64
NOPE_DIM = HEAD_DIM - ROPE_DIM
WINDOW = 128
#: The indexer: 64 heads x 128, top-512 (npu_vllm_quant_lightning_indexer's N1 and D).
INDEX_HEADS = 64
INDEX_DIM = 128
INDEX_TOPK = 512
#: Layer kinds by compress ratio: 0 SWA, 4 CSA (overlapping groups, coff 2), 128 HCA.
RATIOS = (0, 4, 128)
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
    theta: float = 10000.0
    cmp_theta: float = 40000.0
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


def _bf16(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float32).astype(BF16)


def _f32(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype(np.float32)


def _linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """bf16 ``x [.., in] @ w[out, in]^T`` accumulated in fp32, rounded once to bf16."""
    return _bf16(_f32(x) @ _f32(w).T)


def _rms(x: np.ndarray, weight: np.ndarray | None) -> np.ndarray:
    """RMSNorm over the last dim in fp32 (``x * rsqrt(mean(x^2) + eps) * weight``), rounded to bf16."""
    x32 = _f32(x)
    y = x32 / np.sqrt((x32 * x32).mean(-1, keepdims=True) + np.float32(EPS))
    return _bf16(y if weight is None else y * _f32(weight))


def hadamard(n: int) -> np.ndarray:
    """Normalized Sylvester Walsh-Hadamard matrix ``[n, n]`` fp32 (the indexer's rotation)."""
    h = np.ones((1, 1), np.float64)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(n)).astype(np.float32)


def rope_tables(positions: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """fp32 cos / sin ``[positions, 64]`` with each frequency twice (``[c0, c0, c1, c1, ...]``)."""
    inv = 1.0 / theta ** (np.arange(0, ROPE_DIM, 2, dtype=np.float64) / ROPE_DIM)
    ang = np.repeat(np.arange(positions, dtype=np.float64)[:, None] * inv, 2, axis=1)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def make_weights(cfg: V4Config, ratio: int, rng: np.random.Generator) -> dict:
    """Random weights of one layer (bf16 matrices ``randn / sqrt(fan_in)``, fp32 sink / ape).

    Keys as ``tests/reference/deepseek_v4_attention.py`` reads them: ``wq_a, q_norm, wq_b, wkv,
    kv_norm, wo_a, wo_b, sink``; ratio > 1 ``cmp`` {``wkv, wgate, ape, norm``}; ratio 4
    ``idx_wq_b, idx_weights, idx_cmp``.
    """
    if ratio not in RATIOS:
        raise arg_error(ModeError, "ratio", f"one of {RATIOS} (SWA, CSA, HCA)", ratio)

    def mat(out: int, inp: int) -> np.ndarray:
        return _bf16(rng.standard_normal((out, inp), dtype=np.float32) / np.float32(np.sqrt(inp)))

    def norm(n: int) -> np.ndarray:
        return _bf16(1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32))

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
        ratio: 0 (SWA), 4 (CSA) or 128 (HCA). pos: tokens written so far.
        swa_cache: bf16 ``[blocks + 1, bs, 1, 512]`` PA_ND (block 0 unused), ``swa_table``.
        cmp_cache, cmp_table: the compressed rows (ratio > 1), one row per ``ratio`` tokens.
        idx_cache (int8 ``[.., bs, 1, 128]``), idx_scale (fp16 ``[.., bs, 1]``): the indexer's
        compressed keys (ratio 4). times: seconds per op name, summed over calls.
    """

    def __init__(self, cfg: V4Config, ratio: int, weights: dict, seed: int = 0):
        self.cfg, self.ratio, self.w = cfg, ratio, weights
        rng = np.random.default_rng(seed)
        bs = cfg.block_size
        self.theta = cfg.cmp_theta if ratio else cfg.theta
        self.cos, self.sin = rope_tables(cfg.max_tokens, self.theta)
        n = -(-cfg.max_tokens // bs)
        self.swa_table = _paged(n, rng)
        self.swa_cache = np.zeros((n + 1, bs, 1, HEAD_DIM), BF16)
        self.pos = 0
        self.times: dict[str, float] = {}
        if ratio:
            nc = -(-(cfg.max_tokens // ratio) // bs) or 1
            self.cmp_table = _paged(nc, rng)
            self.cmp_cache = np.zeros((nc + 1, bs, 1, HEAD_DIM), BF16)
        if ratio == 4:
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

    def _write(self, cache: np.ndarray, table: np.ndarray, rows_at: np.ndarray, values: np.ndarray) -> None:
        """Write ``values [n, ...]`` at logical rows ``rows_at [n]`` of the request's paged cache."""
        bs = cache.shape[1]
        blocks = table[0, rows_at // bs]
        cache[blocks, rows_at % bs] = values.reshape(cache[blocks, rows_at % bs].shape)

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
        x = _bf16(x)
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
        self._timed("swa cache write", self._write, self.swa_cache, self.swa_table, positions, kv4)
        self.pos = p0 + t
        cu = np.array([0, t], np.int32)
        seqused = np.array([self.pos], np.int32)
        # 3. compressed rows, indexer
        indices = None
        if ratio:
            self._compress(x, p0, cu)
        if ratio == 4:
            indices = self._indexer(x, qr, positions, cu, seqused)
        # 4. attention
        meta = self._timed("npu_sparse_attn_sharedkv_metadata", ops.npu_sparse_attn_sharedkv_metadata,
                           HEADS, 1, HEAD_DIM, cu_seqlens_q=cu, seqused_kv=seqused, batch_size=1,
                           max_seqlen_q=t, max_seqlen_kv=self.pos, cmp_topk=INDEX_TOPK if ratio == 4 else 0,
                           cmp_ratio=ratio if ratio else -1, layout_q="TND", has_cmp_kv=bool(ratio))
        o, _ = self._timed("npu_sparse_attn_sharedkv", ops.npu_sparse_attn_sharedkv, q4.reshape(t, HEADS, HEAD_DIM),
                           ori_kv=self.swa_cache, cmp_kv=self.cmp_cache if ratio else None,
                           cmp_sparse_indices=indices, ori_block_table=self.swa_table,
                           cmp_block_table=self.cmp_table if ratio else None, cu_seqlens_q=cu, seqused_kv=seqused,
                           sinks=w["sink"], metadata=meta, softmax_scale=HEAD_DIM ** -0.5,
                           cmp_ratio=ratio, layout_q="TND")
        # 5. inverse RoPE, grouped output projection
        o4 = np.ascontiguousarray(o.reshape(t, 1, HEADS, HEAD_DIM))
        self._rope(o4, positions, NOPE_DIM, inverse=True)
        g = cfg.o_groups

        def out_proj():
            wo_a = _f32(w["wo_a"]).reshape(g, cfg.o_rank, -1)
            og = _bf16(np.einsum("tgd,grd->tgr", _f32(o4).reshape(t, g, -1), wo_a))
            return _linear(og.reshape(t, g * cfg.o_rank), w["wo_b"])
        return self._timed("projections", out_proj)

    def _compress(self, x: np.ndarray, p0: int, cu: np.ndarray) -> None:
        """ratio > 1: the compressor's new rows into the compressed cache (needs ``ops.compressor``)."""
        compressor = getattr(ops, "compressor", None)
        if compressor is None:
            raise arg_error(ModeError, "ratio", "0 (SWA): this build has no ops.compressor for CSA / HCA layers",
                            self.ratio)
        raise NotImplementedError("compressor wiring lands with ops.compressor")

    def _indexer(self, x, qr, positions, cu, seqused) -> np.ndarray:
        raise NotImplementedError("indexer wiring lands with ops.compressor")
