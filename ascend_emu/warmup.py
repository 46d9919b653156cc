"""Compile (or load) every Numba kernel of the emu backend by running each op once on tiny inputs.

Why: the kernels are ``@njit(cache=True)``, cached in
:func:`~ascend_emu._kernel_cache.kernel_cache_dir` (keyed on the package version and sources). With
a cold on-disk cache (a fresh install, an edited kernel source, a new Numba version, a CI runner
without that directory cached) the first call of each op compiles
its kernels, tens of seconds in all; with a warm cache every process still loads them on first
use: Numba's registry set-up once per process (0.25 s; about 0.6 s when SciPy is installed,
because Numba then imports ``scipy.linalg`` to look for BLAS) and roughly 10-20 ms per kernel.

- ``ascend-emu warmup`` (a separate process) fills the on-disk cache: run it once after
  installing, or as a CI step before the tests, so no test or notebook pays the compilation.
- :func:`warmup` in the process itself (a notebook's first cell, a ``conftest.py``) also loads
  every kernel there, so the first real call of each op pays only its own work.

Each op runs once per scenario whose kernels differ in compiled types (dtype, quant mode, cache
layout), serially and, with two or more Numba threads, again with its work split across threads
(the parallel kernels are separate compiled functions). Inputs are tiny except where the op
fixes a dimension (the MLA prolog's He = 7168 and Hcq = 1536), seeded, and thrown away.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import numba
import numpy as np

from . import ops, soc
from ._kernel_cache import kernel_cache_dir
from .layouts import (V4_CMP_ROPE_THETA, V4_FP8_ROW_BYTES, V4_HEAD_DIM, V4_INDEXER_DIM, V4_INDEXER_PACKED_ROW, CacheLayout,
                      cache_mode_traits, v4_rope_tables)
from .ops.kv_rmsnorm_rope_cache import OUTPUT_KV_CACHE_MODES
from .ops.mla_prolog import QUANT_SCENARIOS
from .quant import BF16, fp8_dtype

#: Rows of the tiny inputs (tokens, kv positions).
TOKENS = 2


@dataclass(frozen=True)
class WarmupResult:
    """One warmed-up call.

    Attributes:
        op: the op's name and scenario.
        seconds: wall time of its calls (compilation or cache loading included).
    """

    op: str
    seconds: float


@dataclass(frozen=True)
class Call:
    """One warm-up call: ``ascend_emu.ops.<op>(*args, **kwargs)`` on NumPy inputs.

    Attributes:
        name: the op's name and scenario.
        op: the op's name in :mod:`ascend_emu.ops` (and in the torch_npu drop-in).
        args, kwargs: its arguments (FRACTAL_NZ weights as :class:`~ascend_emu.layouts.NZArray`).
        then: run on the result (e.g. to compile a kernel the result uses later).
        soc: the emulated SoC the call needs (``ASCEND_EMU_SOC_NAME`` set for the call only), or
            None (the process's own).
    """

    name: str
    op: str
    args: tuple
    kwargs: dict
    then: Callable[[object], object] | None = None
    soc: str | None = None

    def __call__(self) -> object:
        with _soc_set(self.soc):
            out = getattr(ops, self.op)(*self.args, **self.kwargs)
            return self.then(out) if self.then is not None else out

    def through_drop_in(self) -> functools.partial:
        """The same call through ``ascend_emu.torch_npu.<op>`` on new torch copies of the inputs
        (NZ weights cast with ``npu_format_cast(t, 29)``; caches copied, so the NumPy call's are
        untouched), as a ``functools.partial`` (``.func``, ``.args``, ``.keywords``). Needs torch."""
        import ascend_emu.torch_npu as torch_npu

        from .layouts import NZArray
        from .torch_npu._convert import to_torch

        def convert(v):
            if isinstance(v, NZArray):
                return torch_npu.npu_format_cast(to_torch(np.array(np.asarray(v))), 29)
            return to_torch(np.array(v)) if isinstance(v, np.ndarray) else v

        fn = self.drop_in_op()
        if fn is None:
            raise AttributeError(f"op: expected a torch_npu op, got {self.op!r} (registered under "
                                 "torch.ops._C_ascend / torch.ops.custom only)")
        args = tuple(convert(v) for v in self.args)
        kwargs = {k: convert(v) for k, v in self.kwargs.items()}
        return functools.partial(fn, *args, **kwargs)

    def drop_in_op(self):
        """``ascend_emu.torch_npu.<op>`` (``torch_npu.atb.<op>`` for MlaPreprocess), or None for an
        op outside torch_npu's namespace (the V4 ops: ``torch.ops._C_ascend`` / ``custom``). Needs torch."""
        import ascend_emu.torch_npu as torch_npu

        return getattr(torch_npu.atb if self.op == "npu_mla_preprocess" else torch_npu, self.op, None)


@contextlib.contextmanager
def _soc_set(name: str | None) -> Iterator[None]:
    """``ASCEND_EMU_SOC_NAME`` = ``name`` inside (None: unchanged), restored after."""
    if name is None:
        yield
        return
    saved = os.environ.get(soc.SOC_NAME_ENV)
    os.environ[soc.SOC_NAME_ENV] = name
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(soc.SOC_NAME_ENV, None)
        else:
            os.environ[soc.SOC_NAME_ENV] = saved


def _rand(rng: np.random.Generator, shape, dtype=BF16, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(dtype)


def _int8(rng: np.random.Generator, shape) -> np.ndarray:
    return rng.integers(-127, 128, shape).astype(np.int8)


# ---------------------------------------------------------------------- one call per scenario
def _kv_calls(rng) -> Iterator[Call]:
    b = TOKENS
    # (dtype, cache_mode, int8 quant, num_blocks, block_size): Norm caches are [B, 1, cache_length, D]
    for dtype, mode, quant, nb, bs in ((BF16, "PA_NZ", False, 2, 32), (np.dtype(np.float16), "Norm", False, b, 4),
                                       (BF16, "PA", True, 2, 32)):
        kv = _rand(rng, (b, 1, 1, 576), dtype)  # [B, 1, S, 576]
        gamma, cos, sin = _rand(rng, (512,), dtype), _rand(rng, (b, 1, 1, 64), dtype), _rand(rng, (b, 1, 1, 64), dtype)
        cache_dtype = np.dtype(np.int8) if quant else np.dtype(dtype)
        k_cache, ckv_cache = (np.zeros(CacheLayout(mode=mode, num_blocks=nb, block_size=bs, dim=d,
                                                   itemsize=cache_dtype.itemsize).declared_shape(), cache_dtype)
                              for d in (64, 512))
        if cache_mode_traits(mode).index_kind == "position":
            index = np.zeros((b, 1), np.int64)  # [B, S] positions
        else:
            index = np.arange(b, dtype=np.int64)  # [B*S] slots
        scales = dict(k_rope_scale=np.ones(64, np.float32), c_kv_scale=np.ones(512, np.float32)) if quant else {}
        name = f"npu_kv_rmsnorm_rope_cache {np.dtype(dtype).name} {mode}{' int8' if quant else ''}"
        yield Call(name, "npu_kv_rmsnorm_rope_cache", (kv, gamma, cos, sin, index, k_cache, ckv_cache),
                   dict(scales, cache_mode=mode, is_output_kv=mode in OUTPUT_KV_CACHE_MODES))


def _prolog_calls(rng) -> Iterator[Call]:
    t, n, he, hcq = TOKENS, 1, 7168, 1536
    bf = dict(w_dq=ops.npu_format_cast(_rand(rng, (he, hcq), scale=he ** -0.5), 29),
              w_dkv_kr=ops.npu_format_cast(_rand(rng, (he, 576), scale=he ** -0.5), 29))
    i8 = dict(w_dq=ops.npu_format_cast(_int8(rng, (he, hcq)), 29),
              w_dkv_kr=ops.npu_format_cast(_int8(rng, (he, 576)), 29))
    w_uq_qr = {False: ops.npu_format_cast(_rand(rng, (hcq, n * 192), scale=hcq ** -0.5), 29),
               True: ops.npu_format_cast(_int8(rng, (hcq, n * 192)), 29)}
    w_uk = _rand(rng, (n, 128, 512), scale=128 ** -0.5)  # [N, D, Hckv]
    gamma_cq, gamma_ckv = _rand(rng, (hcq,)), _rand(rng, (512,))
    sin, cos = _rand(rng, (t, 64)), _rand(rng, (t, 64))
    x_bf, x_i8 = _rand(rng, (t, he)), _int8(rng, (t, he))
    one = lambda shape: np.full(shape, 1e-3, np.float32)  # noqa: E731
    full = dict(dequant_scale_x=one((t, 1)), dequant_scale_w_dq=one((1, hcq)), dequant_scale_w_dkv_kr=one((1, 576)))
    # (weight_quant_mode, kv_cache_quant_mode, query_quant_mode) -> kv / kr cache dtypes and scales
    scenarios = {
        (0, 0, 0): (BF16, BF16, {}),
        (1, 2, 0): (np.int8, np.int8, dict(quant_scale_ckv=one((1, 512)), quant_scale_ckr=one((1, 64)))),
        (1, 3, 0): (np.int8, None, dict(k_nope_clip_alpha=np.ones(1, np.float32))),
        (2, 1, 1): (np.int8, BF16, dict(full, quant_scale_ckv=one((1,)))),
        (2, 3, 0): (np.int8, None, dict(full, k_nope_clip_alpha=np.ones(1, np.float32))),
    }
    for (wqm, kvq, qqm), (kv_dt, kr_dt, scales) in scenarios.items():
        w = i8 if wqm == 2 else bf
        tile = kvq == 3
        kv_cache = np.zeros((1, 16, 1, 656 if tile else 512), kv_dt)
        kr_cache = np.zeros((0,), BF16) if tile else np.zeros((1, 16, 1, 64), kr_dt)
        kw = dict(scales, weight_quant_mode=wqm, kv_cache_quant_mode=kvq, query_quant_mode=qqm,
                  ckvkr_repo_mode=int(tile), quant_scale_repo_mode=int(tile), query_norm_flag=True,
                  cache_index=np.arange(t, dtype=np.int64), cache_mode="PA_BSND" if tile else "PA_NZ")
        if wqm:
            kw["dequant_scale_w_uq_qr"] = one((1, n * 192))
        args = (x_i8 if wqm == 2 else x_bf, w["w_dq"], w_uq_qr[wqm > 0], w_uk, w["w_dkv_kr"], gamma_cq, gamma_ckv,
                sin, cos, kv_cache, kr_cache)
        yield Call(f"npu_mla_prolog_v3 {QUANT_SCENARIOS[wqm, kvq, qqm].name}, {kw['cache_mode']} "
                   f"(quant modes {wqm}, {kvq}, {qqm})", "npu_mla_prolog_v3", args, kw)


def _preprocess_calls(rng) -> Iterator[Call]:
    t, n, he = TOKENS, 1, 2048
    for dtype, cache_mode, quant_mode in ((BF16, "krope_ctkv", "per_token_quant_symm"),
                                          (np.dtype(np.float16), "int8_nzcache", "per_tensor_quant_asymm"),
                                          (BF16, "nzcache", "per_tensor_quant_asymm")):
        fp16 = dtype == np.float16

        def descale(size, fp16=fp16):
            d = np.full(size, 1e-3, np.float32)
            return d.view(np.int32).astype(np.int64) if fp16 else d  # fp16: fp32 bits in an int64

        nz = cache_mode != "krope_ctkv"
        kv_dt = np.int8 if cache_mode == "int8_nzcache" else dtype
        kv_cache = np.zeros((1, 512 // (32 // np.dtype(kv_dt).itemsize), 128, 32 // np.dtype(kv_dt).itemsize),
                            kv_dt) if nz else np.zeros((1, 128, 1, 512), dtype)
        rope_cache = np.zeros((1, 4, 128, 16), dtype) if nz else np.zeros((1, 128, 1, 64), dtype)
        kw = dict(cache_mode=cache_mode, quant_mode=quant_mode)
        if quant_mode == "per_tensor_quant_asymm":
            kw.update(quant_scale0=np.ones(1, dtype), quant_offset0=np.zeros(1, np.int8),
                      quant_scale1=np.ones(1, dtype), quant_offset1=np.zeros(1, np.int8))
        if cache_mode == "int8_nzcache":
            kw.update(ctkv_scale=np.ones(1, dtype), q_nope_scale=np.ones(n, dtype))
        args = (_rand(rng, (t, he), dtype), _rand(rng, (he,), dtype), _rand(rng, (he,), dtype),
                ops.npu_format_cast(_int8(rng, (2112, he)), 29), descale(2112), _rand(rng, (1536,), dtype),
                _rand(rng, (1536,), dtype), ops.npu_format_cast(_int8(rng, (n * 192, 1536)), 29), descale(n * 192),
                _rand(rng, (512,), dtype), _rand(rng, (t, 64), dtype), _rand(rng, (t, 64), dtype),
                _rand(rng, (n, 128, 512), dtype), kv_cache, rope_cache, np.arange(t, dtype=np.int32))
        yield Call(f"npu_mla_preprocess {dtype.name} {cache_mode}", "npu_mla_preprocess", args, kw)


def _indexer_calls(rng) -> Iterator[Call]:
    b, n1, d, bs = 1, 64, 128, 16
    for dtype, layout_key in ((BF16, "PA_BSND"), (np.dtype(np.float16), "BSND")):
        query = _rand(rng, (b, TOKENS, n1, d), dtype)  # [B, S1, N1, D]
        weights = _rand(rng, (b, TOKENS, n1), dtype)  # [B, S1, N1]
        kw = dict(layout_query="BSND", layout_key=layout_key, sparse_count=8, sparse_mode=3, return_value=True)
        if cache_mode_traits(layout_key).paged:
            key = _rand(rng, (2, bs, 1, d), dtype)  # [blocks, block_size, 1, D]
            kw.update(block_table=np.arange(2, dtype=np.int32).reshape(1, 2),
                      actual_seq_lengths_key=np.array([2 * bs], np.int32))
        else:
            key = _rand(rng, (b, 2 * bs, 1, d), dtype)  # [B, S2, 1, D]
        yield Call(f"npu_lightning_indexer {dtype.name} {layout_key}", "npu_lightning_indexer",
                   (query, key, weights), kw)


def _quant_indexer_calls(rng) -> Iterator[Call]:
    b, n1, d, bs = 1, 64, 128, 16
    query = _int8(rng, (b, TOKENS, n1, d))  # [B, S1, N1, D]
    weights, q_scale = (_rand(rng, (b, TOKENS, n1), np.dtype(np.float16)) for _ in range(2))  # [B, S1, N1]
    key = _int8(rng, (2, bs, 1, d))  # [blocks, block_size, 1, D]
    k_scale = _rand(rng, (2, bs, 1), np.dtype(np.float16))  # [blocks, block_size, 1]
    kw = dict(layout_query="BSND", layout_key="PA_BSND", sparse_count=8, sparse_mode=3,
              block_table=np.arange(2, dtype=np.int32).reshape(1, 2), actual_seq_lengths_key=np.array([2 * bs], np.int32))
    yield Call("npu_quant_lightning_indexer int8 PA_BSND", "npu_quant_lightning_indexer",
               (query, key, weights, q_scale, k_scale, 0, 0), kw)


def _sparse_attention_calls(rng) -> Iterator[Call]:
    b, s1, n1, bs, k = 1, TOKENS, 16, 16, 4
    act_q, act_kv = np.array([s1], np.int32), np.array([2 * bs], np.int32)
    table = np.arange(2, dtype=np.int32).reshape(1, 2)  # [B, blocks]
    indices = np.tile(np.arange(k, dtype=np.int32), (b, s1, 1, 1))  # [B, S1, N2, K] kv positions
    common = dict(block_table=table, actual_seq_lengths_query=act_q, actual_seq_lengths_kv=act_kv, sparse_block_size=1,
                  layout_query="BSND", layout_kv="PA_BSND", sparse_mode=3, attention_mode=2)
    for dtype in (BF16, np.dtype(np.float16)):
        query, query_rope = _rand(rng, (b, s1, n1, 512), dtype), _rand(rng, (b, s1, n1, 64), dtype)
        key, key_rope = _rand(rng, (2, bs, 1, 512), dtype), _rand(rng, (2, bs, 1, 64), dtype)
        yield Call(f"npu_sparse_flash_attention {dtype.name} PA_BSND", "npu_sparse_flash_attention",
                   (query, key, key, indices, 0.04), dict(common, query_rope=query_rope, key_rope=key_rope))
    rows = np.zeros((2, bs, 1, 656), np.int8)  # [blocks, block_size, 1, 656] combined rows
    rows[..., :512] = _int8(rng, (2, bs, 1, 512))
    rows[..., 512:640] = _rand(rng, (2, bs, 1, 64)).view(np.int8)
    rows[..., 640:] = np.full((2, bs, 1, 4), 1e-2, np.float32).view(np.int8)
    query = _rand(rng, (b, s1, n1, 576))
    yield Call("npu_kv_quant_sparse_flash_attention per-tile PA_BSND", "npu_kv_quant_sparse_flash_attention",
               (query, rows, rows, indices, 0.04, 2, 2),
               dict(common, quant_scale_repo_mode=1, tile_size=128, rope_head_dim=64))


def _fused_infer_attention_calls(rng) -> Iterator[Call]:
    b, n, bs = 1, 16, 16
    table = np.arange(2, dtype=np.int32).reshape(1, 2)  # [B, blocks]
    for dtype in (BF16, np.dtype(np.float16)):
        query, query_rope = _rand(rng, (b, n, 1, 512), dtype), _rand(rng, (b, n, 1, 64), dtype)  # BNSD
        ckv, kr = _rand(rng, (2, 1, bs, 512), dtype), _rand(rng, (2, 1, bs, 64), dtype)  # [blocks, 1, bs, D]
        yield Call(f"npu_fused_infer_attention_score {dtype.name} MLA decode", "npu_fused_infer_attention_score",
                   (query, ckv, ckv),
                   dict(query_rope=query_rope, key_rope=kr, num_heads=n, num_key_value_heads=1, input_layout="BNSD",
                        scale=576 ** -0.5, block_table=table, block_size=bs, actual_seq_lengths_kv=[2 * bs]))
    query, query_rope = _int8(rng, (b, n, 1, 512)), _rand(rng, (b, n, 1, 64))  # BNSD
    ckv, kr = _int8(rng, (2, 1, bs, 512)), _rand(rng, (2, 1, bs, 64))  # [blocks, 1, bs, D]
    yield Call("npu_fused_infer_attention_score_v2 C8 MLA decode", "npu_fused_infer_attention_score_v2",
               (query, ckv, ckv),
               dict(query_rope=query_rope, key_rope=kr, num_query_heads=n, num_key_value_heads=1,
                    input_layout="BNSD", softmax_scale=576 ** -0.5, block_table=table, block_size=bs,
                    actual_seq_kvlen=[2 * bs], query_quant_mode=3,
                    dequant_scale_query=np.full((b, n, 1), 1e-2, np.float32),
                    dequant_scale_key=np.array([0.02], np.float32), dequant_scale_value=np.array([0.02], np.float32)))


def _format_cast_calls(rng) -> Iterator[Call]:
    for dtype in (BF16, np.dtype(np.int8)):
        w = _rand(rng, (32, 64)).astype(dtype)
        yield Call(f"npu_format_cast {dtype.name} (and NZ storage)", "npu_format_cast", (w, 29), {},
                   then=lambda nz: nz.storage())


def _v4_calls(rng) -> Iterator[Call]:
    """DeepSeek-V4: the compressor (A2 / A3; the 950's fp32 norm), the row scatter, the 950
    writers and the 950 shared-KV attention over rows the writer encoded (one small call each)."""
    a950 = soc.ASCEND950_EXAMPLE
    h, d = 1024, 128  # the compressor's smallest hidden size, the indexer's D
    # A2 / A3: c2 without overlap (its products stay small enough for the deterministic-mode
    # reference check); the 950: c4 with overlapping groups (coff 2) and its fp32 norm weight
    for name, r, coff, norm_dtype, where in (("A2 / A3 c2", 2, 1, BF16, None), ("Ascend 950 c4", 4, 2, np.float32, a950)):
        x = _rand(rng, (r, h))
        w = [_rand(rng, (coff * d, h), scale=h ** -0.5) for _ in range(2)]
        cos, sin = v4_rope_tables(2, V4_CMP_ROPE_THETA)  # rows: the group, the padding row
        yield Call(f"compressor {name}", "compressor",
                   (x, *w, np.zeros((2, 8, 2 * coff * d), np.float32), _rand(rng, (r, coff * d), np.float32),
                    (1 + 0.1 * _rand(rng, (d,), np.float32)).astype(norm_dtype), sin, cos,
                    np.array([[1]], np.int32), np.array([0, r], np.int32), None, np.zeros(1, np.int32), 64, r, coff),
                   {"rotary_mode": 2}, soc=where)
    slots = np.array([3, -1, 0], np.int32)
    yield Call("npu_scatter_nd_update_v2 bfloat16 [n, 2]", "npu_scatter_nd_update_v2",
               (np.zeros((2, 4, 1, 64), BF16), np.array([[1, 3], [-1, 3], [0, 0]], np.int32), _rand(rng, (3, 1, 64))),
               {})
    yield Call("kv_compress_epilog layout 1", "kv_compress_epilog",
               (np.zeros((4, 1, V4_FP8_ROW_BYTES), fp8_dtype("float8_e4m3fn")), _rand(rng, (3, V4_HEAD_DIM)), slots),
               {}, soc=a950)
    yield Call("indexer_compress_epilog", "indexer_compress_epilog",
               (np.zeros((4, V4_INDEXER_DIM), fp8_dtype("float8_e4m3fn")), np.zeros((4, 1), np.float32),
                _rand(rng, (3, V4_INDEXER_DIM)), slots), {}, soc=a950)
    yield Call("indexer_compress_epilog_v2 layout 2", "indexer_compress_epilog_v2",
               (np.zeros((1, 16, 1, V4_INDEXER_PACKED_ROW), np.uint8), _rand(rng, (3, V4_INDEXER_DIM)), slots),
               {"layout": 2}, soc=a950)
    kv = np.zeros((2, 16, 1, V4_FP8_ROW_BYTES), fp8_dtype("float8_e4m3fn"))
    with _soc_set(a950):
        ops.kv_compress_epilog(kv.reshape(-1, 1, V4_FP8_ROW_BYTES), _rand(rng, (16, V4_HEAD_DIM)),
                               np.arange(16, 32, dtype=np.int32))
        plan = ops.npu_kv_quant_sparse_attn_sharedkv_metadata(
            64, 1, V4_HEAD_DIM, 1, cu_seqlens_q=np.array([0, 1], np.int32), seqused_kv=np.array([16], np.int32),
            batch_size=1, max_seqlen_q=1, max_seqlen_kv=16, cmp_topk=0, cmp_ratio=1, layout_q="TND",
            has_cmp_kv=False, tile_size=64, rope_head_dim=64)
    yield Call("npu_kv_quant_sparse_attn_sharedkv SWA TND", "npu_kv_quant_sparse_attn_sharedkv",
               (_rand(rng, (1, 64, V4_HEAD_DIM)), 1),
               dict(ori_kv=kv, ori_block_table=np.array([[1]], np.int32), cu_seqlens_q=np.array([0, 1], np.int32),
                    seqused_kv=np.array([16], np.int32), sinks=_rand(rng, (64,), np.float32), metadata=plan,
                    tile_size=64, rope_head_dim=64, softmax_scale=V4_HEAD_DIM ** -0.5, cmp_ratio=1,
                    layout_q="TND"), soc=a950)


#: Every op family's warm-up calls (each yields :class:`Call` objects), the families whose first
#: call compiles longest first (cold, 2 cores: kv_rmsnorm_rope_cache 55 s, sparse attention 47 s,
#: MlaPreprocess 26 s, the prolog 30 s, fused_infer_attention_score 14 s, the indexer 13 s, the
#: rest a few s), so that worker processes (``jobs``) taking them in this order finish together.
CALLS = (_kv_calls, _sparse_attention_calls, _preprocess_calls, _prolog_calls, _indexer_calls,
         _fused_infer_attention_calls, _quant_indexer_calls, _format_cast_calls, _v4_calls)


# ---------------------------------------------------------------------- running
@contextlib.contextmanager
def split_every_kernel() -> Iterator[None]:
    """Let every threaded kernel split even tiny work (so its parallel variant is compiled too)."""
    kernels = importlib.import_module("ascend_emu.emu.kernels")
    kv = importlib.import_module("ascend_emu.emu.kv_rmsnorm_rope_cache")
    saved = (kernels.ELEMENTS_PER_PART, kernels.SCATTER_BYTES_PER_THREAD, kv.TOKENS_PER_PART)
    kernels.ELEMENTS_PER_PART, kernels.SCATTER_BYTES_PER_THREAD, kv.TOKENS_PER_PART = 1, 1, 1
    try:
        yield
    finally:
        kernels.ELEMENTS_PER_PART, kernels.SCATTER_BYTES_PER_THREAD, kv.TOKENS_PER_PART = saved


def _family_calls(family: int) -> list[Call]:
    """The warm-up calls of ``CALLS[family]``, on inputs from a generator seeded with ``family`` (the
    same in every process)."""
    return list(CALLS[family](np.random.default_rng(family)))


def _calls() -> list[Call]:
    """Every warm-up call, family by family."""
    return [call for family in range(len(CALLS)) for call in _family_calls(family)]


def _run(call: Call, split: bool) -> WarmupResult:
    start = time.perf_counter()
    call()
    if split:
        with split_every_kernel():
            call()
    return WarmupResult(call.name, time.perf_counter() - start)


def _run_family_in_worker(item: tuple[int, bool]) -> list[WarmupResult]:
    """A pool worker's unit: every call of family ``item[0]``, in order (the family's later calls
    mostly reuse the kernels its first compiles, so a family stays in one process)."""
    family, split = item
    return [_run(call, split) for call in _family_calls(family)]


def warmup(*, parallel: bool = True, report: Callable[[WarmupResult], None] | None = None,
           on_start: Callable[[int, int, str], None] | None = None, jobs: int = 1,
           load: bool = True) -> list[WarmupResult]:
    """Run every op once per scenario on tiny inputs (module doc), compiling or loading its kernels.

    The split runs lower the emu backend's work thresholds for their duration (module globals),
    so do not call ops from other Python threads while it runs.

    With ``jobs`` > 1 the calls first run in that many worker processes (``spawn``, the replay's
    :class:`~ascend_emu.workers.ProcessPool`), one op family (:data:`CALLS`) at a time in
    whichever worker is free, so the kernels compile in parallel into the shared on-disk cache
    (Numba's cache files are written whole, then renamed into place); then, with ``load``, every
    call runs here once more, loading its kernels from that cache.

    Args:
        parallel: also run each call with its work split across threads, when Numba has two or more
            (compiles the parallel kernels; they are separate functions).
        report: called with each result as soon as it is measured (e.g. to print progress); with
            ``jobs`` > 1, with each family's results as its worker finishes it.
        on_start: called before each call with its number (from 1), the number of calls and its
            name (e.g. to show what is compiling); with ``jobs`` > 1, as each worker result arrives,
            with the number of calls finished.
        jobs: worker processes that compile (1: everything in this process).
        load: with ``jobs`` > 1, load every kernel into this process afterwards (False: only fill
            the on-disk cache, as ``ascend-emu warmup --jobs N`` does).

    Returns:
        One :class:`WarmupResult` per call, in call order (with ``jobs`` > 1 and ``load``: the
        workers' times, which include the compilation).

    Raises:
        ValueError: ``jobs`` is not an int >= 1.
        RuntimeError: a worker's call failed (the calls are valid: a bug or a broken install).
        Whatever an op raises in this process, for the same reason.
    """
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise ValueError(f"jobs: expected an int >= 1, got {jobs!r}")
    split = parallel and numba.get_num_threads() > 1
    calls = _calls()
    if jobs == 1:
        results = []
        for number, call in enumerate(calls, 1):
            if on_start is not None:
                on_start(number, len(calls), call.name)
            results.append(_run(call, split))
            if report is not None:
                report(results[-1])
        return results

    from .workers import ProcessPool, TaskFailure

    by_family: dict[int, list[WarmupResult]] = {}
    done = 0
    items = [(family, split) for family in range(len(CALLS))]
    for family, results in ProcessPool(min(jobs, len(CALLS))).run(_run_family_in_worker, items, None):
        if isinstance(results, TaskFailure):
            raise RuntimeError(f"the warm-up calls of {CALLS[family].__name__} failed in a worker process "
                               f"({results.kind}): {results.message}")
        by_family[family] = results
        for result in results:
            done += 1
            if on_start is not None:
                on_start(done, len(calls), result.op)
            if report is not None:
                report(result)
    if load:
        for call in calls:
            _run(call, split)
    return [result for family in range(len(CALLS)) for result in by_family[family]]


def default_jobs() -> int:
    """``ascend-emu warmup``'s default ``--jobs``: the cores this process may use when the kernel
    cache directory holds no kernel yet (a cold cache: the directory is keyed on the sources, so an
    edit or an upgrade starts an empty one), else 1 (loading is quicker than starting workers)."""
    from .workers import default_workers

    if any(kernel_cache_dir().rglob("*.nbi")):
        return 1
    return default_workers()


def _jobs(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    """``ascend-emu warmup``: :func:`warmup`, printing one line per call and the total."""
    import argparse

    parser = argparse.ArgumentParser(prog="ascend-emu warmup", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


def add_arguments(parser) -> None:
    """The ``warmup`` subcommand's options."""
    parser.add_argument("--serial-only", action="store_true",
                        help="skip the threaded kernel variants (compiled on first use instead)")
    parser.add_argument("-j", "--jobs", type=_jobs, default=None, metavar="N",
                        help="compile in N worker processes sharing the on-disk cache (default: the "
                             "number of cores this process may use when the cache is empty, else 1; "
                             "1: in this process)")
    parser.add_argument("--quiet", action="store_true", help="print only the total")


def run(ns) -> int:
    """Run the ``warmup`` subcommand from parsed arguments; exit status 0. The total line ends with
    the kernel cache directory and the folder to delete to clear it."""
    from .progress import Progress

    start = time.perf_counter()

    def show(result: WarmupResult) -> None:
        if not ns.quiet:
            print(f"  {result.seconds:7.2f} s  {result.op}", flush=True)

    jobs = ns.jobs if ns.jobs is not None else default_jobs()
    with Progress(show_steps=False, quiet=ns.quiet) as progress:
        results = warmup(parallel=not ns.serial_only, report=show, jobs=jobs, load=False,
                         on_start=lambda number, total, name: progress.step(f"[{number}/{total}] {name}"))
    cache = kernel_cache_dir()
    workers = f"{jobs} processes, " if jobs > 1 else ""
    print(f"warmed up {len(results)} op calls in {time.perf_counter() - start:.1f} s "
          f"({workers}Numba threads: {numba.get_num_threads()}); kernel cache: {cache} "
          f"(delete {cache.parent} to clear it and older versions' caches)")
    return 0
