"""Fake (meta) implementations: output shapes and dtypes of each registered op, no values.

Each rule restates, per mode, what torch_npu 2.14's meta function returns
(``torch_npu/op_plugin/meta/_meta_registrations.py``; ``npu_mla_preprocess``:
``op_plugin/atb/_atb_meta_registrations.py``), with the emulated CANN's conventions
(:data:`~ascend_emu.torch_npu.npu.utils.CANN_VERSION` >= 8.5.0.alpha003: an output a scenario
does not produce is an empty ``[0]`` tensor in v3). Inputs are fake / meta tensors; outputs are
created on the inputs' device. Used by ``torch.compile`` and by ``torch.ops.npu.*`` on meta
tensors.

The SoC and the Ascend 950's hifloat8 ``*_dtype`` tags are the op's to check (a fake follows the
meta function, which reads only dtypes and modes).
"""

from __future__ import annotations

import torch

from ..errors import ModeError, ShapeError, arg_error, describe
from ..quant.mx import MX_BLOCK_SIZE

#: Block of the MXFP8 dequant scales (v3 weight_quant_mode=3; the meta function's FP8_E4M3_BLOCK_SIZE).
FP8_E4M3_BLOCK_SIZE = MX_BLOCK_SIZE


def _new(like: torch.Tensor, shape, dtype) -> torch.Tensor:
    return torch.empty(list(shape), dtype=dtype, device=like.device)


def _lead(token_x: torch.Tensor) -> list[int]:
    """Token dims of the queries: ``[T]`` or ``[B, S]``."""
    return list(token_x.shape[:-1])


def _dr(token_x: torch.Tensor, rope_sin: torch.Tensor) -> int:
    """Dr as the meta function reads it: rope_sin's dim 2 for 3-D token_x, else dim 1."""
    return rope_sin.shape[2] if token_x.dim() == 3 else rope_sin.shape[1]


def _tokens(token_x: torch.Tensor) -> int:
    return token_x.shape[0] * token_x.shape[1] if token_x.dim() == 3 else token_x.shape[0]


def mla_prolog(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq, rmsnorm_gamma_ckv,
               rope_sin, rope_cos, cache_index, kv_cache, kr_cache, **_):
    """v1: ``(query [*, N, Hckv], query_rope [*, N, Dr])`` of rope_sin's dtype, the caches' likes."""
    n, hckv, dr = weight_uk.shape[0], weight_uk.shape[2], _dr(token_x, rope_sin)
    lead = _lead(token_x)
    return (_new(token_x, lead + [n, hckv], rope_sin.dtype), _new(token_x, lead + [n, dr], rope_sin.dtype),
            torch.empty_like(kv_cache), torch.empty_like(kr_cache))


def mla_prolog_v2(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq, rmsnorm_gamma_ckv,
                  rope_sin, rope_cos, cache_index, kv_cache, kr_cache, *, quant_scale_ckv=None, **_):
    """v2: int8 query and fp32 ``[T, N, 1]`` dequant scale with int8 token_x and quant_scale_ckv;
    else rope_sin's dtype and fp32 ``[1]``. query_rope bf16."""
    n, hckv, dr = weight_uk.shape[0], weight_uk.shape[2], _dr(token_x, rope_sin)
    lead = _lead(token_x)
    if token_x.dtype == torch.int8 and quant_scale_ckv is not None:
        query = _new(token_x, lead + [n, hckv], torch.int8)
        scale = _new(token_x, [_tokens(token_x), n, 1], torch.float32)
    else:
        query = _new(token_x, lead + [n, hckv], rope_sin.dtype)
        scale = _new(token_x, [1], torch.float32)
    return (query, _new(token_x, lead + [n, dr], torch.bfloat16), torch.empty_like(kv_cache),
            torch.empty_like(kr_cache), scale)


def mla_prolog_v3(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq, rmsnorm_gamma_ckv,
                  rope_sin, rope_cos, kv_cache, kr_cache, *, query_norm_flag=False, weight_quant_mode=0,
                  kv_cache_quant_mode=0, **kwargs):
    """v3: ``(query, query_rope, dequant_scale_q_nope, query_norm, dequant_scale_q_norm)``, as torch_npu's
    meta function gives them (hifloat8 data is uint8, so the tags leave every dtype as the inputs give
    it; the op checks the tags and the SoC)."""
    n, hckv, dr, hcq = weight_uk.shape[0], weight_uk.shape[2], _dr(token_x, rope_sin), weight_dq.shape[1]
    lead, tokens = _lead(token_x), _tokens(token_x)
    f32 = torch.float32
    if weight_quant_mode == 3 and kv_cache_quant_mode == 1:
        query = _new(token_x, lead + [n, hckv], torch.float8_e4m3fn)
        scale_nope = _new(token_x, [tokens, n, 1], f32)
    elif weight_quant_mode in (2, 4, 5) and kv_cache_quant_mode == 1:
        query = _new(token_x, lead + [n, hckv], token_x.dtype)
        scale_nope = _new(token_x, [tokens, n, 1], f32)
    else:
        query = _new(token_x, lead + [n, hckv], torch.bfloat16)
        scale_nope = _new(token_x, [0], f32)
    query_rope = _new(token_x, lead + [n, dr], torch.bfloat16)
    if query_norm_flag:
        query_norm = _new(token_x, lead + [hcq], weight_uq_qr.dtype)
        if weight_quant_mode == 3:
            scale_norm = _new(token_x, [tokens, hcq // FP8_E4M3_BLOCK_SIZE], torch.float8_e8m0fnu)
        elif weight_quant_mode in (1, 2, 4, 5):
            scale_norm = _new(token_x, [tokens, 1], f32)
        else:
            scale_norm = _new(token_x, [0], f32)
    else:
        query_norm = _new(token_x, [0], weight_uq_qr.dtype)
        scale_norm = _new(token_x, [0], torch.float8_e8m0fnu if weight_quant_mode == 3 else f32)
    return query, query_rope, scale_nope, query_norm, scale_norm


def mla_prolog_v3_functional(*args, **kwargs):
    """v3's five outputs, then ``kv_cache`` / ``kr_cache`` likes (the updated caches)."""
    kv_cache, kr_cache = args[9], args[10]
    return (*mla_prolog_v3(*args, **kwargs), torch.empty_like(kv_cache), torch.empty_like(kr_cache))


def _kv_rope_ckv(kv, gamma, cos, v):
    """k_rope ``[B, N, S, Dk]`` and c_kv ``[B, N, S, Dv]`` in kv's dtype."""
    lead = list(kv.shape[:-1])
    if v is None:
        return _new(kv, lead + [cos.shape[3]], kv.dtype), _new(kv, lead + [gamma.shape[0]], kv.dtype)
    return _new(kv, lead + [kv.shape[3]], kv.dtype), _new(kv, lead + [v.shape[3]], kv.dtype)


def kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, v=None, **_):
    """``(k_cache, ckv_cache)`` likes, then k_rope and c_kv."""
    return (torch.empty_like(k_cache), torch.empty_like(ckv_cache), *_kv_rope_ckv(kv, gamma, cos, v))


def kv_rmsnorm_rope_cache_v2(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, v=None, **_):
    """``(k_rope, c_kv)`` (the caches are written in place)."""
    return _kv_rope_ckv(kv, gamma, cos, v)


def kv_rmsnorm_rope_cache_v2_functional(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, v=None, **_):
    """``(k_rope, c_kv)``, then the updated caches' likes."""
    return (*_kv_rope_ckv(kv, gamma, cos, v), torch.empty_like(k_cache), torch.empty_like(ckv_cache))


def sparse_flash_attention(query, key, value, sparse_indices, scale_value, *, layout_query="BSND",
                           return_softmax_lse=False, **_):
    """``(attention_out, softmax_max, softmax_sum)``: out of query's shape and dtype; the fp32
    LSE pieces ``[B, N2, S1, N1/N2]`` (BSND) / ``[N2, T1, N1/N2]`` (TND) when asked, else ``[0]``
    (N2 read from ``key``'s dim 2 / 1 as the meta function reads it)."""
    if layout_query not in ("BSND", "TND"):
        raise arg_error(ModeError, "layout_query", "'BSND' or 'TND'", describe(layout_query))
    out = _new(query, query.shape, query.dtype)
    if not return_softmax_lse:
        return out, _new(query, [0], torch.float32), _new(query, [0], torch.float32)
    if layout_query == "TND":
        shape = [key.shape[1], query.shape[0], query.shape[1] // key.shape[1]]
    else:
        shape = [query.shape[0], key.shape[2], query.shape[1], query.shape[2] // key.shape[2]]
    return out, _new(query, shape, torch.float32), _new(query, shape, torch.float32)


def kv_quant_sparse_flash_attention(query, key, value, sparse_indices, scale_value, key_quant_mode,
                                    value_quant_mode, *, layout_query="BSND", rope_head_dim=64, **_):
    """attention_out: query's shape with the last dim less ``rope_head_dim``, query's dtype."""
    if layout_query not in ("BSND", "TND"):
        raise arg_error(ModeError, "layout_query", "'BSND' or 'TND'", describe(layout_query))
    return _new(query, [*query.shape[:-1], query.shape[-1] - rope_head_dim], query.dtype)


def lightning_indexer(query, key, weights, *, layout_query="BSND", layout_key="BSND", sparse_count=2048,
                      return_value=False, **_):
    """``(sparse_indices int32, sparse_values)``: ``[B, S1, N2, sparse_count]`` (BSND query) or
    ``[T1, N2, sparse_count]``; values in query's dtype when ``return_value``, else ``[0]``."""
    if layout_query == "BSND":
        shape = [query.shape[0], query.shape[1], key.shape[2], sparse_count]
    else:
        shape = [query.shape[0], key.shape[-2], sparse_count]  # N2: [.., N2, D] in every key layout
    values = _new(query, shape if return_value else [0], query.dtype)
    return _new(query, shape, torch.int32), values


def _dynamic_quant_outputs(input, smooth_scales, group_index, dst_type, quant_mode, dst_type_max, count):
    """y and ``count`` fp32 tensors of the scale's shape (the ``npu_dynamic_quant`` /
    ``_asymmetric`` metas), after the argument rules the CPU op applies first."""
    from ..ops.dynamic_quant import INT4_PER_INT32, QUANT_MODES, QUANT_MODES_950, _dst_kind  # ops loads at first use
    from ..soc import require_ascend950

    if not isinstance(quant_mode, str) or quant_mode not in QUANT_MODES_950:
        raise arg_error(ModeError, "quant_mode", f"one of {QUANT_MODES} (A2 / A3) or {QUANT_MODES_950} (Ascend 950)",
                        describe(quant_mode))
    if quant_mode not in QUANT_MODES:
        require_ascend950("quant_mode", quant_mode, "a scale per column")
    if dst_type_max != 0.0:
        raise arg_error(ModeError, "dst_type_max", "0.0 (the fp8 / hifloat8 maxima are Ascend 950's)",
                        describe(dst_type_max))
    lead = list(input.shape[:-1])
    scale_shape = lead[:-1] + [input.shape[-1]] if quant_mode == "perchannel" else lead
    if _dst_kind(dst_type) == "int4":
        y = _new(input, lead + [input.shape[-1] // INT4_PER_INT32], torch.int32)
    else:
        y = _new(input, input.shape, torch.int8)
    return (y, *(_new(input, scale_shape, torch.float32) for _ in range(count)))


def dynamic_quant(input, *, smooth_scales=None, group_index=None, dst_type=None, quant_mode="pertoken",
                  dst_type_max=0.0):
    """``(y, scale)`` (``npu_dynamic_quant`` meta): y int8 like ``input``, or int32 ``[..., H / 8]``
    for quint4x2 (H a multiple of 8); scale fp32 ``input.shape[:-1]`` (per channel
    ``input.shape[:-2] + [H]``). The dst_type / quant_mode / dst_type_max the CPU op rejects raise
    its ModeError (Ascend 950's fp8 / hifloat8 / per-tensor outputs are not emulated)."""
    return _dynamic_quant_outputs(input, smooth_scales, group_index, dst_type, quant_mode, dst_type_max, 1)


def dynamic_quant_asymmetric(input, *, smooth_scales=None, group_index=None, dst_type=None,
                             quant_mode="pertoken", dst_type_max=0.0):
    """``(y, scale, offset)`` (``npu_dynamic_quant_asymmetric`` meta): as :func:`dynamic_quant`,
    offset fp32 of scale's shape."""
    return _dynamic_quant_outputs(input, smooth_scales, group_index, dst_type, quant_mode, dst_type_max, 2)


def quant_lightning_indexer(query, key, weights, query_dequant_scale, key_dequant_scale, query_quant_mode,
                            key_quant_mode, *, layout_query="BSND", layout_key="BSND", sparse_count=2048, **_):
    """int32 ``[B, S1, N2, sparse_count]`` (BSND query) or ``[T1, N2, sparse_count]``
    (``npu_quant_lightning_indexer_forward``)."""
    if layout_query == "BSND":
        shape = [query.shape[0], query.shape[1], key.shape[2], sparse_count]
    else:
        shape = [query.shape[0], key.shape[-2], sparse_count]  # N2: [.., N2, D] in every key layout
    return _new(query, shape, torch.int32)


def interleave_rope(x, cos, sin):
    """A tensor like ``x`` (``npu_interleave_rope_meta``)."""
    return torch.empty_like(x)


def rotary_mul(self, r1, r2, rotary_mode="half", rotate=None):
    """``self``'s shape and dtype (``npu_rotary_mul_meta``)."""
    return _new(self, self.shape, self.dtype)


def scatter_pa_kv_cache(key, value, key_cache, value_cache, slot_mapping, **_):
    """Nothing: the caches are written in place (``npu_scatter_pa_kv_cache_meta``)."""
    return None


def scatter_pa_kv_cache_functional(key, value, key_cache, value_cache, slot_mapping, **_):
    """Tensors like key_cache and value_cache (``npu_scatter_pa_kv_cache_functional_meta``)."""
    return torch.empty_like(key_cache), torch.empty_like(value_cache)


def gather_pa_kv_cache(key_cache, value_cache, block_tables, seq_lens, key, value, **_):
    """Nothing: key and value are written in place (no meta function in 2.14; the schema returns ())."""
    return None


def gather_pa_kv_cache_functional(key_cache, value_cache, block_tables, seq_lens, key, value, **_):
    """Tensors of key's and value's shapes and dtypes (``npu_gather_pa_kv_cache_functional_meta``)."""
    return _new(key, key.shape, key.dtype), _new(value, value.shape, value.dtype)


#: input_layout -> (query layout, attention_out layout, query dims) (the meta function's
#: ``get_query_and_attention_out_layout`` map).
def _fia_shapes(query, value, block_table, input_layout, num_heads, num_key_value_heads, lse_flag):
    """``(attention_out shape, lse shape)`` as ``npu_fused_infer_attention_score_forward`` /
    ``_v2_forward`` infer them (:func:`ascend_emu.ops._fused_infer_attention_mha.output_shapes`,
    the one definition; int4 / fp4 packed values are not emulated)."""
    from ..ops._fused_infer_attention_mha import output_shapes
    return output_shapes(tuple(query.shape), tuple(value.shape), block_table is not None, input_layout, num_heads,
                         num_key_value_heads, lse_flag)


def fused_infer_attention_score(query, key, value, *, quant_scale2=None, query_rope=None, block_table=None,
                                input_layout="BSH", num_heads=1, num_key_value_heads=0, softmax_lse_flag=False, **_):
    """``(attention_out, softmax_lse)`` (``npu_fused_infer_attention_score_forward``): out in
    query's dtype (int8 with quant_scale2; int8 query: query_rope's dtype, else fp16); lse fp32."""
    out_shape, lse_shape = _fia_shapes(query, value, block_table, input_layout, num_heads, num_key_value_heads,
                                       softmax_lse_flag)
    dtype = torch.int8 if quant_scale2 is not None else (
        (query_rope.dtype if query_rope is not None else torch.half) if query.dtype == torch.int8 else query.dtype)
    return _new(query, out_shape, dtype), _new(query, lse_shape, torch.float32)


def fused_infer_attention_score_v2(query, key, value, *, quant_scale_out=None, query_rope=None, block_table=None,
                                   input_layout="BSH", num_query_heads=1, num_key_value_heads=0,
                                   return_softmax_lse=False, out_dtype=None, **_):
    """``(attention_out, softmax_lse)`` (``npu_fused_infer_attention_score_v2_forward``, without the
    hifloat8 / fp8 / packed-fp4 inputs): as v1, with ``out_dtype``'s type for a quantised output
    (the op's :func:`~ascend_emu.ops._fused_infer_attention_quant.check_out_dtype`; HiFloat8 as
    uint8)."""
    out_shape, lse_shape = _fia_shapes(query, value, block_table, input_layout, num_query_heads, num_key_value_heads,
                                       return_softmax_lse)
    if quant_scale_out is not None or out_dtype is not None:
        dtype = _quant_out_torch_dtype(out_dtype, quant_scale_out)
    else:
        dtype = (query_rope.dtype if query_rope is not None else torch.half) if query.dtype == torch.int8 \
            else query.dtype
    return _new(query, out_shape, dtype), _new(query, lse_shape, torch.float32)


def _quant_out_torch_dtype(out_dtype, scale):
    """The torch dtype of a quantised FIA v2 output (int8, an FP8 dtype, uint8 for HiFloat8)."""
    from ..ops._fused_infer_attention_quant import check_out_dtype, quant_out_dtype

    name = check_out_dtype(out_dtype, scale)
    return torch.uint8 if name == "hifloat8" else getattr(torch, quant_out_dtype(name).name)


def fused_infer_attention_score_out(*args, attention_out, softmax_lse, **_):
    """The out= tensors themselves."""
    return attention_out, softmax_lse


def fused_infer_attention_score_infer_output(query, value, *, input_layout="BSH", quant_scale2=None,
                                             quant_scale_out=None, block_table=None, num_heads=None,
                                             num_query_heads=None, num_key_value_heads=0, softmax_lse_flag=False,
                                             return_softmax_lse=False, query_rope=None, out_dtype=None, **_):
    """``(attention_out, softmax_lse)`` of both infer_output ops: the forward fakes' shapes and dtypes."""
    heads = num_heads if num_heads is not None else (num_query_heads if num_query_heads is not None else 1)
    out_shape, lse_shape = _fia_shapes(query, value, block_table, input_layout, heads, num_key_value_heads,
                                       softmax_lse_flag or return_softmax_lse)
    quant = quant_scale2 if quant_scale2 is not None else quant_scale_out
    dtype = _quant_out_torch_dtype(out_dtype, quant) if quant is not None or out_dtype is not None else (
        (query_rope.dtype if query_rope is not None else torch.half) if query.dtype == torch.int8 else query.dtype)
    return _new(query, out_shape, dtype), _new(query, lse_shape, torch.float32)


def fused_infer_attention_score_workspace(query, *args, **_):
    """uint8 ``[0]``: what the emulation's workspace query returns (no device tiling)."""
    return _new(query, [0], torch.uint8)


def mla_preprocess(input, gamma0, beta0, wdqkv, descale0, gamma1, beta1, wuq, descale1, gamma2, cos, sin, wuk,
                   kv_cache, kv_cache_rope, slotmapping, **_):
    """``(q_out0 [T, N, 512] of kv_cache's dtype, kv_cache like, q_out1 [T, N, 64] of input's
    dtype, kv_cache_rope like)``."""
    t, n = input.shape[0], wuk.shape[0]
    return (_new(input, [t, n, 512], kv_cache.dtype), torch.empty_like(kv_cache),
            _new(input, [t, n, 64], input.dtype), torch.empty_like(kv_cache_rope))


def mla_preprocess_out(*args, q_out0, kv_cache_out0, q_out1, kv_cache_out1, **_):
    """The out= tensors themselves."""
    return q_out0, kv_cache_out0, q_out1, kv_cache_out1


def format_cast(self, acl_format, **_):
    """A tensor like ``self``."""
    return torch.empty_like(self)


def format_cast_tensor(self, dst, **_):
    """A tensor like ``self``."""
    return torch.empty_like(self)


def format_cast_inplace(self, *args, **_):
    """``self``."""
    return self


def _quant_950_dtype(code: int, name: str, meaning: str) -> torch.dtype:
    """torch dtype of an Ascend 950 cast / quant output code (uint8 for hifloat8, as
    ``npu_dtype_cast_meta``), after the SoC gate the CPU op applies."""
    from ..ops.quant_950 import DTYPE_CODE_NAMES
    from ..soc import require_ascend950

    dst = DTYPE_CODE_NAMES.get(code) if isinstance(code, int) else None
    if dst is None:
        raise arg_error(ModeError, name, "a torch ScalarType value or a torch_npu dtype code", describe(code))
    require_ascend950(name, code, meaning or dst)
    return torch.uint8 if dst == "hifloat8" else getattr(torch, dst)


def dtype_cast(self, dtype, input_dtype=None):
    """``self``'s shape in the dtype of code ``dtype`` (``npu_dtype_cast_meta``: hifloat8 as
    uint8; torch_npu.int4 (285) as uint8 with the last dim halved, Ascend 950)."""
    from ..ops.quant_950 import CAST_950_TYPES, DTYPE_CODE_NAMES, GENERAL_CAST_TYPES, INT4_CODE
    from ..soc import require_ascend950

    if dtype == INT4_CODE:
        if self.dim() == 0 or self.shape[-1] % 2:
            raise arg_error(ShapeError, "self", "a last dim divisible by 2 for int4 output",
                            f"shape {tuple(self.shape)}")
        require_ascend950("dtype", dtype, "int4")
        return _new(self, list(self.shape[:-1]) + [self.shape[-1] // 2], torch.uint8)
    name = DTYPE_CODE_NAMES.get(dtype) if isinstance(dtype, int) else None
    if name in GENERAL_CAST_TYPES and name not in CAST_950_TYPES:
        return _new(self, self.shape, getattr(torch, name))
    return _new(self, self.shape, _quant_950_dtype(dtype, "dtype", ""))


def dynamic_mx_quant(input, *, axis=-1, round_mode="rint", dst_type=296, block_size=32, scale_alg=0,  # noqa: A002
                     dst_type_max=0.0, max_low_bound=0.0):
    """``(y like input in the FP8 dtype, uint8 scale pairs)`` (``npu_dynamic_mx_quant`` meta)."""
    from ..quant.mx import mx_scale_shape

    dtype = _quant_950_dtype(dst_type, "dst_type", "")
    if dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise arg_error(ModeError, "dst_type", "an FP8 code: 292 / 24 (float8_e4m3fn) or 291 / 23 (float8_e5m2)",
                        describe(dst_type))
    return _new(input, input.shape, dtype), _new(input, mx_scale_shape(input.shape, axis, block_size), torch.uint8)


def dynamic_mx_quant_with_dual_axis(input, *, round_mode="rint", dst_type=296, scale_alg=0,  # noqa: A002
                                    dst_type_max=0.0):
    """``(y1, mxscale1, y2, mxscale2)`` (``npu_dynamic_mx_quant_with_dual_axis`` meta): y1 / y2 like
    input in the FP8 dtype; uint8 scale pairs along -1 and -2 (blocks of 32)."""
    from ..quant.mx import mx_scale_shape

    dtype = _quant_950_dtype(dst_type, "dst_type", "")
    if dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise arg_error(ModeError, "dst_type", "an FP8 code: 292 / 24 (float8_e4m3fn) or 291 / 23 (float8_e5m2)",
                        describe(dst_type))
    if input.dim() < 2:
        raise arg_error(ShapeError, "input", "2 to 7 dims", f"shape {tuple(input.shape)}")
    return (_new(input, input.shape, dtype), _new(input, mx_scale_shape(input.shape, -1), torch.uint8),
            _new(input, input.shape, dtype), _new(input, mx_scale_shape(input.shape, -2), torch.uint8))


#: Fake implementation of each registered overload (``namespace::name[.overload]``).
FAKES = {
    "npu::npu_mla_prolog": mla_prolog,
    "npu::npu_mla_prolog_v2": mla_prolog_v2,
    "npu::npu_mla_prolog_v3": mla_prolog_v3,
    "npu::npu_mla_prolog_v3_functional": mla_prolog_v3_functional,
    "npu::npu_kv_rmsnorm_rope_cache": kv_rmsnorm_rope_cache,
    "npu::npu_kv_rmsnorm_rope_cache_v2": kv_rmsnorm_rope_cache_v2,
    "npu::npu_kv_rmsnorm_rope_cache_v2_functional": kv_rmsnorm_rope_cache_v2_functional,
    "npu::npu_sparse_flash_attention": sparse_flash_attention,
    "npu::npu_kv_quant_sparse_flash_attention": kv_quant_sparse_flash_attention,
    "npu::npu_lightning_indexer": lightning_indexer,
    "npu::npu_interleave_rope": interleave_rope,
    "npu::npu_dynamic_quant": dynamic_quant,
    "npu::npu_dynamic_quant_asymmetric": dynamic_quant_asymmetric,
    "npu::npu_dtype_cast": dtype_cast,
    "npu::npu_dynamic_mx_quant": dynamic_mx_quant,
    "npu::npu_dynamic_mx_quant_with_dual_axis": dynamic_mx_quant_with_dual_axis,
    "npu::npu_rotary_mul": rotary_mul,
    "npu::npu_scatter_pa_kv_cache": scatter_pa_kv_cache,
    "npu::npu_scatter_pa_kv_cache_functional": scatter_pa_kv_cache_functional,
    "npu::npu_gather_pa_kv_cache": gather_pa_kv_cache,
    "npu::npu_gather_pa_kv_cache_functional": gather_pa_kv_cache_functional,
    "npu::npu_quant_lightning_indexer": quant_lightning_indexer,
    "npu::npu_fused_infer_attention_score": fused_infer_attention_score,
    "npu::npu_fused_infer_attention_score.out": fused_infer_attention_score_out,
    "npu::_npu_fused_infer_attention_score_get_max_workspace": fused_infer_attention_score_workspace,
    "npu::npu_fused_infer_attention_score_v2": fused_infer_attention_score_v2,
    "npu::npu_fused_infer_attention_score_v2.out": fused_infer_attention_score_out,
    "npu::_npu_fused_infer_attention_score_v2_get_max_workspace": fused_infer_attention_score_workspace,
    "npu::_npu_fused_infer_attention_score_infer_output": fused_infer_attention_score_infer_output,
    "npu::_npu_fused_infer_attention_score_v2_infer_output": fused_infer_attention_score_infer_output,
    "atb::npu_mla_preprocess": mla_preprocess,
    "atb::npu_mla_preprocess.out": mla_preprocess_out,
    "npu::npu_format_cast": format_cast,
    "npu::npu_format_cast.Tensor": format_cast_tensor,
    "npu::npu_format_cast_": format_cast_inplace,
    "npu::npu_format_cast_.acl_format": format_cast_inplace,
}


# ---------------------------------------------------------------- DeepSeek-V4 framework-namespace ops
def rms_norm_dynamic_quant(x, gamma, smooth_scale=None, beta=None, epsilon=1e-6, **_):
    return _new(x, x.shape, torch.int8), _new(x, x.shape[:-1], torch.float32)


def inplace_partial_rotary_mul(x, r1, r2, rotary_mode, partial_slice, negate_sin=False, **_):
    return None


def compressor_metadata(rope_cos, rope_sin, cu_seqlens, start_pos, kv_block_table, kv_block_size,
                        slot_mapping_format, compress_ratio, num_compressed_tokens, num_reqs_actual, **_):
    n, d = num_compressed_tokens, rope_cos.shape[-1]
    slot = [n] if slot_mapping_format == 1 else [n, 2]
    return (_new(rope_cos, [n, 1, 1, d], rope_cos.dtype), _new(rope_cos, [n, 1, 1, d], rope_cos.dtype),
            _new(rope_cos, slot, torch.int32))


def compressor_metadata_out(*args, cos_out, sin_out, slot_mapping_out, **_):
    return cos_out, sin_out, slot_mapping_out


# ----------------------------------------------------------------- DeepSeek-V4 mHC (ops.hc)
# Not torch_npu ops: the framework namespaces' bindings (:mod:`.namespaces`) use these, keyed by
# the ascend_emu.ops function (:data:`NAMESPACE_FAKES`); shapes as vllm-ascend's
# ``construct_hc_pre_output_tensor`` / ``construct_hc_post_output_tensor`` make them.
def _hc_pre_outputs(x: torch.Tensor) -> tuple:
    lead, hc, d = list(x.shape[:-2]), x.shape[-2], x.shape[-1]
    return (_new(x, [*lead, d], torch.bfloat16), _new(x, [*lead, hc], torch.float32),
            _new(x, [*lead, hc, hc], torch.float32))


def hc_pre(x, *_, **__):
    """``(y bf16 [*lead, D], post fp32 [*lead, hc], comb_frag fp32 [*lead, hc, hc])``."""
    return _hc_pre_outputs(x)


def hc_pre_v3(x, *_, **__):
    """hc_pre's outputs and ``pre`` fp32 ``[*lead, hc]``."""
    y, post, comb = _hc_pre_outputs(x)
    return y, post, comb, _new(x, post.shape, torch.float32)


def hc_pre_inv_rms(x, **_):
    """fp32 ``[*lead, 1]``."""
    return _new(x, [*x.shape[:-2], 1], torch.float32)


def hc_pre_sinkhorn(mixes, rsqrt, hc_scale, hc_base, x, *_, **__):
    """hc_pre's outputs (from x)."""
    return _hc_pre_outputs(x)


def hc_post(x, residual, post, comb, **_):
    """Like residual, in x's dtype."""
    return _new(x, residual.shape, x.dtype)


# ---------------------------------------- DeepSeek-V4 shared-KV attention (ops.sparse_attn_sharedkv)
def sparse_attn_sharedkv(q, *_, **__):
    """``(out like q, softmax_lse fp32 [0])`` (the adapter's ``construct_output_tensor`` without
    ``return_softmax_lse``, the only mode the op takes)."""
    return _new(q, q.shape, q.dtype), _new(q, [0], torch.float32)


def sparse_attn_sharedkv_metadata(*_, cu_seqlens_q=None, seqused_kv=None, **__):
    """int32 ``[1024]`` on the device of the first length tensor given (the adapter's rule)."""
    like = cu_seqlens_q if cu_seqlens_q is not None else seqused_kv
    device = like.device if like is not None else "meta"
    return torch.empty([1024], dtype=torch.int32, device=device)


def vllm_quant_lightning_indexer(query, key, weights, *_, sparse_count=2048, layout_query="BSND", **__):
    """``(sparse_indices int32 [*lead, 1, sparse_count], sparse_values fp32 [0])``."""
    lead = list(query.shape[:-2])
    return _new(query, [*lead, 1, sparse_count], torch.int32), _new(query, [0], torch.float32)


def vllm_quant_lightning_indexer_metadata(*_, actual_seq_lengths_query=None, actual_seq_lengths_key=None, **__):
    """int32 ``[1024]`` on the device of a length tensor given."""
    like = actual_seq_lengths_query if actual_seq_lengths_query is not None else actual_seq_lengths_key
    return torch.empty([1024], dtype=torch.int32, device=like.device if like is not None else "meta")


def scatter_nd_update(var, indices, update, **_):
    """Nothing: var is written in place (the schemas return ())."""
    return None


# ----------------------------------------------------------------- DeepSeek-V4 compressor (ops.compressor)
def compressor(x, wkv, wgate, state_cache, ape, norm_weight, rope_sin, rope_cos, *_, cmp_ratio=4, **__):
    """cmp_kv in x's dtype: ``[B, ceil(S / cmp_ratio), D]`` for a 3-D x, else ``[rope_sin rows, D]``
    (vllm-ascend ``construct_compressor_output_tensor``)."""
    d = norm_weight.shape[0]
    if x.dim() == 3:
        return _new(x, [x.shape[0], -(-x.shape[1] // cmp_ratio), d], x.dtype)
    return _new(x, [rope_sin.shape[0], d], x.dtype)


def custom_quant_lightning_indexer(query, key, weights, query_dequant_scale, key_dequant_scale, query_quant_mode,
                                   key_quant_mode, **kw):
    """``(sparse_indices like torch_npu's op, sparse_values fp32 [0])`` (the recipes' custom op)."""
    idx = quant_lightning_indexer(query, key, weights, query_dequant_scale, key_dequant_scale, query_quant_mode,
                                  key_quant_mode, **kw)
    return idx, _new(query, [0], torch.float32)


# ------------------------------------------------ DeepSeek-V4 cache writers (kv_compress_epilog, indexer_compress_epilog): in place
def v4_writer(*_, **__):
    return None


#: Fakes of the framework-namespace ops that have no torch_npu counterpart, by their
#: :mod:`ascend_emu.ops` function (:func:`._registry.namespace_fake`).
NAMESPACE_FAKES = {
    "kv_compress_epilog": v4_writer,
    "indexer_compress_epilog": v4_writer,
    "indexer_compress_epilog_v2": v4_writer,
    "npu_rms_norm_dynamic_quant": rms_norm_dynamic_quant,
    "inplace_partial_rotary_mul": inplace_partial_rotary_mul,
    "compressor_metadata": compressor_metadata,
    "compressor_metadata_out": compressor_metadata_out,
    "npu_hc_pre_v2": hc_pre,
    "npu_hc_pre_v3": hc_pre_v3,
    "npu_hc_pre": hc_pre,
    "npu_hc_pre_inv_rms": hc_pre_inv_rms,
    "npu_hc_pre_sinkhorn": hc_pre_sinkhorn,
    "npu_hc_post": hc_post,
    "npu_sparse_attn_sharedkv": sparse_attn_sharedkv,
    "npu_sparse_attn_sharedkv_metadata": sparse_attn_sharedkv_metadata,
    "npu_kv_quant_sparse_attn_sharedkv": sparse_attn_sharedkv,
    "npu_kv_quant_sparse_attn_sharedkv_metadata": sparse_attn_sharedkv_metadata,
    "npu_vllm_quant_lightning_indexer": vllm_quant_lightning_indexer,
    "custom_npu_quant_lightning_indexer": custom_quant_lightning_indexer,
    "npu_vllm_quant_lightning_indexer_metadata": vllm_quant_lightning_indexer_metadata,
    "npu_scatter_nd_update_v2": scatter_nd_update,
    "npu_scatter_nd_update_sk": scatter_nd_update,
    "scatter_nd_update_asc": scatter_nd_update,
    "compressor": compressor,
}
