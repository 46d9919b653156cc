"""int8 quant of the MHA / GQA form of ``npu_fused_infer_attention_score`` / ``_v2``: v1's int8
full quant (``dequant_scale1``, ``quant_scale1``, ``dequant_scale2``, with or without the output
quant) and the int8 output quant of a float query (v1 ``quant_scale2`` / ``quant_offset2``, v2
``quant_scale_out`` / ``quant_offset_out``); their limits (named constants) and validation.

Sources: op-plugin ``docs/zh/custom_APIs/torch_npu/torch_npu-npu_fused_infer_attention_score.md``
("int8量化参数" and "int8量化约束": the three dtype combinations, what each must / may / must not
pass, per-tensor / per-channel output scales, the layouts BSH / BNSD / BSND / BNSD_BSND, an
offset rejected where a row takes no part in the computation; "Q_S = 1 ... qkv全int8：不支持"),
``torch_npu-npu_fused_infer_attention_score_v2.md`` (``quant_scale_out`` / ``quant_offset_out``)
and ``torch_npu-npu_trans_quant_param.md`` (the uint64 form: the scale's FP19 bits in bits 0-31,
the offset in bits 37-45, bit 46 set). Numerics: the op module's steps Q1-Q9
(:mod:`ascend_emu.ops.fused_infer_attention_score`).

v2's ``out_dtype`` (:func:`check_out_dtype`): the output quant's element type, int8 when absent
(op-plugin ``op_plugin/ops/opapi/FusedInferAttentionScoreV2KernelNpuOpApi.cpp``,
``construct_fia_output_tensor_v2``: with ``quant_scale_out`` the output is int8 unless
``out_dtype`` names another type); FP8 E4M3FN / E5M2 and HiFloat8 (uint8 codes) on an emulated
Ascend 950 only (the arch35 post-quant, ops-transformer
``attention/common/op_kernel/arch35/vf/vf_post_quant_arch35.h``; the A2 / A3 int8 constraints of
the v2 doc); numerics in step Q10 of the op module.
"""

from __future__ import annotations

import numpy as np

from .. import soc
from ..errors import DTypeError, ModeError, ShapeError, arg_error, describe
from ..quant.fp8 import FP8_DTYPES, SCALAR_TYPE_CODES, TORCH_NPU_DTYPE_CODES
from ._check import check_dtype, required
from .quant_950 import dtype_code

#: The query dtype of the full quant (key and value int8 too).
FULL_QUANT_DTYPE = "int8"
#: Layouts that take any of the int8 quant arguments (the doc's int8 constraints).
QUANT_LAYOUTS = ("BSH", "BNSD", "BSND", "BNSD_BSND")
#: dequant_scale1 / dequant_scale2: fp32, or uint64 in npu_trans_quant_param's form.
DEQUANT_SCALE_DTYPES = ("float32", "uint64")
#: quant_scale1: fp32, per-tensor.
QUANT_SCALE1_DTYPES = ("float32",)
#: Output quant scale / offset: fp32, or bf16 with a bf16 query.
QUANT_OUT_DTYPES = ("float32", "bfloat16")
#: The FP19 the cube's fixpipe dequant reads: the fp32 bits with the low 13 mantissa bits cleared
#: (npu_trans_quant_param's "high 19 bits" of the scale); applied to fp32 and uint64 scales alike.
FP19_MASK = 0xFFFFE000
#: uint64 bits that may be set besides the scale's 32: bit 46 (the flag npu_trans_quant_param sets);
#: the 9-bit offset (bits 37-45) is not emulated and must be 0.
UINT64_FLAG_BIT = 1 << 46
#: The output quant's element type without ``out_dtype``.
QUANT_OUT_DEFAULT_TYPE = "int8"
#: Output quant element types only an Ascend 950 writes (v2 ``out_dtype``; HiFloat8 as uint8 codes).
QUANT_OUT_TYPES_950 = ("float8_e4m3fn", "float8_e5m2", "hifloat8")
#: ``out_dtype`` codes taken -> the element type: a torch dtype's ScalarType value (int8 1,
#: float8_e5m2 23, float8_e4m3fn 24) or a torch_npu code (hifloat8 290, float8_e5m2 291,
#: float8_e4m3fn 292).
QUANT_OUT_TYPE_CODES = {
    **{SCALAR_TYPE_CODES[name]: name for name in (QUANT_OUT_DEFAULT_TYPE, "float8_e5m2", "float8_e4m3fn")},
    **{TORCH_NPU_DTYPE_CODES[name]: name for name in QUANT_OUT_TYPES_950}}
#: int8 D alignment (32 bytes): the query's D for the full quant, value's D for a per-channel output quant.
INT8_D_ALIGN = 32


def fp19(bits: int) -> float:
    """The fp32 value of 32 scale bits with the low 13 cleared (:data:`FP19_MASK`)."""
    return float(np.array([bits & FP19_MASK], dtype=np.uint32).view(np.float32)[0])


def _one(x, name: str, dtypes: tuple[str, ...], what: str) -> np.ndarray:
    x = required(x, name)
    check_dtype(x, name, dtypes)
    if x.size != 1:
        raise arg_error(ShapeError, name, f"one value ({what}, per-tensor)", list(x.shape))
    return x


def _dequant_scale(x, name: str) -> float:
    """A per-tensor dequant scale (fp32 or uint64) -> its FP19 value (finite, checked)."""
    x = _one(x, name, DEQUANT_SCALE_DTYPES, "the BMM dequant scale")
    if x.dtype == np.uint64:
        word = int(x.reshape(-1)[0])
        if word >> 32 & ~(UINT64_FLAG_BIT >> 32):
            raise arg_error(ModeError, name, "a uint64 scale whose bits 32-63 are 0 but for bit 46 (the offset in "
                            "bits 37-45 is not emulated)", hex(word))
        bits = word & 0xFFFFFFFF
    else:
        bits = int(x.reshape(-1).view(np.uint32)[0])
    value = fp19(bits)
    if not np.isfinite(value):
        raise arg_error(DTypeError, name, "a finite scale", describe(x))
    return value


def check_quant(call, *, qdt: str, kv_dt: str, input_layout: str, s1: int, n: int, d: int, dv: int,
                paged: bool, packed: bool, lse_flag: bool) -> dict:
    """Validate the int8 quant arguments of a call of the MHA / GQA form.

    Args:
        call: the :class:`~ascend_emu.ops._fused_infer_attention_args.FusedInferAttentionCall`
            (``full_quant`` / ``quant_out``: the arguments by name, as passed; ``out_type``: the
            output quant's element type, :func:`check_out_dtype`).
        qdt, kv_dt: query / key dtype names; input_layout: as passed; s1: Q_S; n: N; d, dv:
            query's and value's D; paged: block_table given; packed: a TND / NTD query;
            lse_flag: the lse flag.

    Returns:
        ``full_quant`` / ``quant_out`` / ``quant_out_type`` / ``quant_given`` for
        :class:`~ascend_emu.ops._fused_infer_attention_args.FusedInferAttentionArgs` (empty dict
        when no quant argument is given and the query is not int8).

    Raises:
        ModeError: a required argument missing, a forbidden one given, a layout / paged cache /
            Q_S the quant does not take, a uint64 offset. DTypeError: a dtype outside the doc's,
            a non-finite scale. ShapeError: a scale that is neither per-tensor nor per-channel
            ``N * Dv``, an offset unlike its scale, D not 32-byte aligned.
    """
    fq = dict(call.full_quant or {})
    qo = dict(call.quant_out or {})
    full = qdt == FULL_QUANT_DTYPE
    given = {k: v for k, v in {**fq, **qo}.items() if v is not None}
    if not full and not given:
        return {}
    names_fq, names_qo = list(fq), list(qo)  # dequant_scale1, quant_scale1, dequant_scale2; scale, offset
    scale_name, offset_name = names_qo if names_qo else ("quant_scale2", "quant_offset2")
    if full and not fq:
        raise arg_error(ModeError, "query", "a float16 / bfloat16 query (int8 full quant is v1's: dequant_scale1, "
                        "quant_scale1, dequant_scale2)", "int8")
    first = next(iter(given), "query")
    if input_layout not in QUANT_LAYOUTS or packed:
        raise arg_error(ModeError, first, f"None with input_layout={input_layout} (int8 quant takes "
                        f"{list(QUANT_LAYOUTS)})", describe(given.get(first, "int8")))
    if paged:
        raise arg_error(ModeError, "block_table", "None with int8 quant (PageAttention with quant is not emulated)",
                        describe(call.block_table))
    out = {}
    if full:
        if kv_dt != FULL_QUANT_DTYPE:
            raise arg_error(DTypeError, "key", "int8 with an int8 query (full quant)", kv_dt)
        if s1 < 2:
            raise arg_error(ShapeError, "query", "Q_S >= 2 with an int8 query (the doc: Q_S = 1 takes no full "
                            "int8 query / key / value)", f"Q_S = {s1}")
        if d % INT8_D_ALIGN:
            raise arg_error(ShapeError, "query", f"D a multiple of {INT8_D_ALIGN} (int8: 32 bytes)", f"D = {d}")
        if dv != d:
            raise arg_error(ShapeError, "value", f"query's D = {d} (int8 full quant)", f"V_D = {dv}")
        ds1_name, qs1_name, ds2_name = names_fq
        for name in names_fq:
            if fq[name] is None:
                raise arg_error(ModeError, name, "a per-tensor scale (int8 query, key and value need "
                                "dequant_scale1, quant_scale1 and dequant_scale2)", None)
        ds1 = _dequant_scale(fq[ds1_name], ds1_name)
        qs1 = _one(fq[qs1_name], qs1_name, QUANT_SCALE1_DTYPES, "the P quant scale")
        qs1_f = float(qs1.reshape(-1)[0])
        if not np.isfinite(qs1_f):
            raise arg_error(DTypeError, qs1_name, "a finite scale", describe(qs1))
        ds2 = _dequant_scale(fq[ds2_name], ds2_name)
        out["full_quant"] = (ds1, qs1_f, ds2)
    else:
        for name, x in fq.items():
            if x is not None:
                raise arg_error(ModeError, name, f"None with a {qdt} query (the BMM dequant / P quant scales belong "
                                "to an int8 query)", describe(x))
    scale, offset = qo.get(scale_name), qo.get(offset_name)
    if scale is None:
        if offset is not None:
            raise arg_error(ModeError, offset_name, f"None without {scale_name} (the offset of the int8 output "
                            "quant)", describe(offset))
    else:
        if kv_dt == "int32":
            raise arg_error(ModeError, scale_name, "None with an int4 (int32) key / value (the v2 doc: int4 antiquant "
                            "takes no output quant)", describe(scale))
        out["quant_out"] = _quant_out(scale, offset, scale_name, offset_name, qdt, n, dv, lse_flag)
        out["quant_out_type"] = call.out_type
    out["quant_given"] = given
    return out


def _quant_out(scale, offset, scale_name: str, offset_name: str, qdt: str, n: int, dv: int, lse_flag: bool):
    """The output quant scale / offset -> fp32 ``[N, Dv]`` each (offset None when absent)."""
    scale = required(scale, scale_name)
    check_dtype(scale, scale_name, QUANT_OUT_DTYPES if qdt == "bfloat16" else ("float32",))
    per_channel = scale.size != 1
    if per_channel:
        if scale.size != n * dv:
            raise arg_error(ShapeError, scale_name, f"one value (per-tensor) or N * D = {n * dv} values (per-channel, "
                            f"e.g. [{n}, {dv}])", list(scale.shape))
        if dv % INT8_D_ALIGN:
            raise arg_error(ShapeError, scale_name, f"per-tensor with D = {dv} (per-channel needs D a multiple of "
                            f"{INT8_D_ALIGN})", list(scale.shape))
        if lse_flag:
            raise arg_error(ModeError, scale_name, "per-tensor with the lse flag (per-channel takes no softmax_lse)",
                            list(scale.shape))
    vals = []
    for name, x in ((scale_name, scale), (offset_name, offset)):
        if x is None:
            vals.append(None)
            continue
        x = required(x, name)
        if x.dtype != scale.dtype or x.shape != scale.shape:
            raise arg_error(ShapeError, name, f"{scale_name}'s dtype and shape {list(scale.shape)} "
                            f"{scale.dtype.name}", describe(x))
        f = x.astype(np.float32).reshape(-1)
        if not np.isfinite(f).all():
            raise arg_error(DTypeError, name, "finite values", describe(x))
        vals.append(np.ascontiguousarray(np.broadcast_to(f.reshape(n, dv) if per_channel else f.reshape(1, 1),
                                                         (n, dv))))
    return tuple(vals)


def check_offset_rows(quant_out, offset_name: str, act_q: np.ndarray, act_kv: np.ndarray, s1: int,
                      limits_of) -> None:
    """With an output quant offset, reject a call in which a row takes no part in the computation
    (a padding row past ``act_q``, a request with no kv token, a causal row with no position: the
    doc's interception). ``limits_of(nq, kv_len)``: the row limits of the call's rule."""
    if quant_out is None or quant_out[1] is None:
        return
    for b, (nq, kv) in enumerate(zip(act_q.tolist(), act_kv.tolist(), strict=True)):
        if nq < s1 or kv == 0 or (nq and int(limits_of(nq, kv).min()) <= 0):
            raise arg_error(ModeError, offset_name, "None when a row takes no part in the computation (the doc "
                            "intercepts it; quantise outside the op)", f"request {b}: {nq} of {s1} query tokens, "
                            f"{kv} kv tokens")


def check_out_dtype(out_dtype, scale, scale_name: str = "quant_scale_out") -> str:
    """Validate v2's ``out_dtype`` (a dtype code; a torch dtype crosses the drop-in as its
    ScalarType value) against the output quant scale.

    Args:
        out_dtype: None or a code of :data:`QUANT_OUT_TYPE_CODES` (a recorded call's dtype name,
            ``'torch.float8_e5m2'``, stands for its code).
        scale, scale_name: the output quant scale as passed and its name.

    Returns:
        The output quant's element type name (:data:`QUANT_OUT_DEFAULT_TYPE` for None).

    Raises:
        ModeError: ``out_dtype`` given without the scale (the out_dtype of an int8 / fp8 query is
            not emulated), a code outside :data:`QUANT_OUT_TYPE_CODES`, an FP8 / HiFloat8 type on
            a SoC other than the Ascend 950.
    """
    if out_dtype is None:
        return QUANT_OUT_DEFAULT_TYPE
    code = dtype_code(out_dtype, "out_dtype")
    if scale is None:
        raise arg_error(ModeError, "out_dtype", f"None without {scale_name} (out_dtype names the output quant's "
                        "type; the out_dtype of an int8 / fp8 query is not emulated)", code)
    name = QUANT_OUT_TYPE_CODES.get(code)
    if name is None:
        raise arg_error(ModeError, "out_dtype", "the output quant's type: a code among "
                        f"{sorted(QUANT_OUT_TYPE_CODES)} (int8 1, float8_e5m2 23 / 291, float8_e4m3fn 24 / 292, "
                        "hifloat8 290)", code)
    if name in QUANT_OUT_TYPES_950:
        soc.require_ascend950("out_dtype", code, name)
    return name


def quant_out_dtype(name: str) -> np.dtype:
    """The array dtype of an output quant element type: int8, the ml_dtypes FP8 type, uint8 for
    HiFloat8 codes."""
    if name in FP8_DTYPES:
        return FP8_DTYPES[name]
    return np.dtype(np.uint8 if name == "hifloat8" else np.int8)
