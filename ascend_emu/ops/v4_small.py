"""DeepSeek-V4's small ops on NumPy arrays: the contracts (family ``v4_small``).

``npu_rms_norm_dynamic_quant``, ``inplace_partial_rotary_mul`` and ``compressor_metadata`` /
``compressor_metadata_out``: ops of vllm-ascend's ``torch.ops._C_ascend`` and
cann-recipes-infer's ``torch.ops.custom`` (not torch_npu) that need no cache descriptor. Each
validates everything (shapes, dtypes, modes, index ranges, memory overlap) before any output is
written. docs/v4.md lists the choices below.

Sources:

- ``npu_rms_norm_dynamic_quant``: cann-recipes-infer ``ops/ascendc/docs/custom-npu_rms_norm_dynamic_quant.md``
  (``y = x / sqrt(mean(x^2) + eps) * gamma + beta``; ``input = y * smooth``; ``scale =
  rowmax|input| / 127``; ``yOut = round(input / scale)``; x / gamma / smooth / beta fp16 or bf16,
  1-D ``[H]`` of x's dtype; y int8 of x's shape, scale fp32 of ``x.shape[:-1]``) and its golden
  ``ops/ascendc/examples/test_npu_rms_norm_dynamic_quant.py`` (``npu_rms_norm`` then
  ``npu_dynamic_quant``, compared with a tolerance of 1 on y); the schemas in vllm-ascend
  ``csrc/torch_binding.cpp`` and cann-recipes-infer ``ops_def_registration.cpp``.
- ``inplace_partial_rotary_mul``: the golden ``ops/ascendc/examples/test_npu_inplace_partial_rotary_mul.py``
  (x ``[B, S, N, D]``; r1 / r2 ``[B|1, S|1, N|1, hi - lo]``, x's dtype or fp32; ``x[..., lo:hi] =
  cos * a + rotate_every_two(a) * sin`` in fp32, one rounding to x's dtype; the rest of x
  untouched; r1 / r2 of fp32 beside a bf16 / fp16 x on the A3 / 950), its doc
  ``ops/ascendc/docs/custom-inplace_partial_rotary_mul.md`` (x fp16 / bf16 / fp32 ``[b, s, n, d]``,
  d even and <= 1024, only ``"interleave"``), vllm-ascend's DeepSeek-V4 calls
  (``rotary_mode="interleave"``, ``partial_slice`` ``[448, 512]`` / ``[64, 128]``, the inverse RoPE
  with ``-sin``) and the newer schema's ``negate_sin``.
- ``compressor_metadata``: vllm-ascend's golden
  ``tests/e2e/nightly/single_node/ops/singlecard_ops/test_compressor_metadata.py``
  (``_reference_outputs``).

Choices where the sources leave room (stricter than the hardware, never looser):

- rms_norm_dynamic_quant: the doc's formula in fp32 throughout (the fused kernel's y is not
  staged through bf16 as the golden's two-op composition is; unverified); the sum of squares in
  the project's in-order 64-lane model (:data:`ascend_emu.emu.kernels.MLA_PROLOG_RMS`; the
  RmsNormDynamicQuant kernel source was not read), ``x / rms``, ``* gamma``, ``+ beta``,
  ``* smooth`` (each one fp32 operation); then ``npu_dynamic_quant``'s per-token arithmetic
  (:func:`ascend_emu.quant.quantize_per_token_multiplier`, scale ``amax * fp32(1/127)``). x at
  least 1-D with H >= 1; epsilon finite in fp32 and >= 0.
- inplace_partial_rotary_mul: ``rotary_mode`` ``"interleave"`` only (the golden's and every
  DeepSeek-V4 call's; ``"half"`` is rejected naming the gap); ``partial_slice`` two ints with
  ``0 <= lo < hi <= D`` and ``hi - lo`` even; x 4-D, C-contiguous and writable, fp16 / bf16 /
  fp32, D even and <= 1024; r1 / r2 4-D of one shape and dtype (x's, or fp32 as the golden's
  mixed-precision cases), each leading dim 1 or x's (the doc lists ``[b, 1, 1, slice]`` and
  ``[b, s, 1, slice]``; the golden also broadcasts S and N);
  ``negate_sin=True`` uses ``-sin`` (exact).
- compressor_metadata: ``cu_seqlens`` int32 ``[num_reqs_actual + 1]`` or longer, starting at 0 and
  non-decreasing over the first ``num_reqs_actual + 1`` entries (a non-monotone one ran off the
  end of memory on hardware); ``start_pos`` int32 with at least ``num_reqs_actual`` entries (a
  negative one: no compressed rows for that request, as the golden); ``kv_block_table`` int32
  ``[>= num_reqs_actual, W]``; rope tables 2-D ``[R, D]`` bf16 / fp16 / fp32 of one shape and
  dtype; ``slot_mapping_format`` 1 (flat) or 2 (``[block, offset]``); ``kv_block_size`` and
  ``compress_ratio`` >= 1; rows past the table's width, past the rope table, or with a negative
  block id are invalid rows (cos 1, sin 0, slot -1 / ``[-1, kv_block_size - 1]``), as the
  golden.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..errors import IndexRangeError, ModeError, ShapeError, arg_error, describe
from ..layouts import slot_of_block_row
from ._backend import get_backend
from ._check import (check_cache, check_cu_seqlens, check_disjoint, check_dtype, check_float, check_int, check_ndim,
                     dtype_name, optional, required)

#: x / gamma / smooth_scale / beta dtypes of npu_rms_norm_dynamic_quant (doc).
RMS_DQ_DTYPES = ("float16", "bfloat16")
#: inplace_partial_rotary_mul: x's dtypes; the modes taken.
PARTIAL_ROPE_X_DTYPES = ("float16", "bfloat16", "float32")
PARTIAL_ROPE_MODES = ("interleave",)
#: Largest last dim of x (doc: D <= 1024, even).
PARTIAL_ROPE_MAX_D = 1024
#: compressor_metadata: rope table dtypes; slot_mapping_format values (1 flat, 2 [block, offset]).
METADATA_ROPE_DTYPES = ("bfloat16", "float16", "float32")
SLOT_FORMAT_FLAT = 1
SLOT_FORMAT_BLOCK_OFFSET = 2
SLOT_FORMATS = (SLOT_FORMAT_FLAT, SLOT_FORMAT_BLOCK_OFFSET)
#: Bound on the rows / requests a call may ask for before anything is allocated.
MAX_METADATA_ROWS = 1 << 24
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class RmsNormDynamicQuantArgs:
    """Validated arguments of ``npu_rms_norm_dynamic_quant`` (x ``[..., H]``; the rest ``[H]``)."""

    x: np.ndarray
    gamma: np.ndarray
    smooth_scale: np.ndarray | None
    beta: np.ndarray | None
    epsilon: float


class RmsNormDynamicQuantOutputs(NamedTuple):
    """``y`` int8 of x's shape; ``scale`` fp32 of ``x.shape[:-1]``."""

    y: np.ndarray
    scale: np.ndarray


@dataclass(frozen=True)
class PartialRotaryArgs:
    """Validated arguments of ``inplace_partial_rotary_mul`` (x written in place on ``[lo, hi)``)."""

    x: np.ndarray
    r1: np.ndarray
    r2: np.ndarray
    lo: int
    hi: int
    negate_sin: bool


class PartialRotaryOutputs(NamedTuple):
    """``x``: the caller's array, updated in place."""

    x: np.ndarray


@dataclass(frozen=True)
class CompressorMetadataArgs:
    """Validated arguments of ``compressor_metadata`` (int arrays widened to int64).

    Attributes:
        rope_cos, rope_sin: ``[R, D]``.
        cu_seqlens: ``[num_reqs + 1]`` non-decreasing from 0; start_pos ``[num_reqs]``.
        block_table: ``[num_reqs, W]``.
        block_size, slot_format, ratio, rows, num_reqs: the ints.
        out: None, or ``(cos_out, sin_out, slot_out)`` to write (the ``_out`` form).
    """

    rope_cos: np.ndarray
    rope_sin: np.ndarray
    cu_seqlens: np.ndarray
    start_pos: np.ndarray
    block_table: np.ndarray
    block_size: int
    slot_format: int
    ratio: int
    rows: int
    num_reqs: int
    out: tuple[np.ndarray, np.ndarray, np.ndarray] | None


class CompressorMetadataOutputs(NamedTuple):
    """``cos`` / ``sin`` ``[n, 1, 1, D]`` of the rope dtype; ``slot_mapping`` int32 ``[n]`` / ``[n, 2]``."""

    cos: np.ndarray
    sin: np.ndarray
    slot_mapping: np.ndarray


def _int(value, name: str, lo: int, hi: int | None = None) -> int:
    v = check_int(value, name, error=ModeError)
    if v < lo or (hi is not None and v > hi):
        raise arg_error(ModeError, name, f"an int in [{lo}, {hi if hi is not None else 'inf'}]", v)
    return v


# ------------------------------------------------------------------------ rms_norm_dynamic_quant
def npu_rms_norm_dynamic_quant(x, gamma, smooth_scale=None, beta=None, epsilon: float = 1e-6):
    """``npu_rms_norm_dynamic_quant``: RmsNorm, then per-token symmetric int8 (module doc).

    Args:
        x: ``[..., H]`` fp16 / bf16 (at least 1-D, H >= 1).
        gamma: ``[H]``, x's dtype.
        smooth_scale: None or ``[H]``, x's dtype (multiplies the normalised row before the quant).
        beta: None or ``[H]``, x's dtype (added after ``* gamma``).
        epsilon: finite in fp32, >= 0.

    Returns:
        ``(y, scale)``: int8 of x's shape; fp32 ``x.shape[:-1]`` (the dequant scale per row).

    Raises:
        ShapeError / DTypeError: shapes or dtypes other than the above. DTypeError: a bad epsilon.

    Source: cann-recipes-infer ``custom-npu_rms_norm_dynamic_quant.md`` and its golden.
    """
    x, gamma = required(x, "x"), required(gamma, "gamma")
    smooth_scale, beta = optional(smooth_scale, "smooth_scale"), optional(beta, "beta")
    check_dtype(x, "x", RMS_DQ_DTYPES)
    if x.ndim < 1 or x.shape[-1] < 1:
        raise arg_error(ShapeError, "x", "at least 1-D with a non-empty last dim [..., H]", f"shape {list(x.shape)}")
    h = x.shape[-1]
    for name, a in (("gamma", gamma), ("smooth_scale", smooth_scale), ("beta", beta)):
        if a is None:
            continue
        check_dtype(a, name, (dtype_name(x.dtype),))
        if a.shape != (h,):
            raise arg_error(ShapeError, name, f"1-D shape [{h}] (x's last dim)", f"shape {list(a.shape)}")
    eps = check_float(epsilon, "epsilon", nonnegative=True)
    args = RmsNormDynamicQuantArgs(x, gamma, smooth_scale, beta, eps)
    return tuple(get_backend().rms_norm_dynamic_quant(args))


# ------------------------------------------------------------------------ inplace_partial_rotary_mul
def inplace_partial_rotary_mul(x, r1, r2, rotary_mode: str, partial_slice, negate_sin: bool = False) -> None:
    """``inplace_partial_rotary_mul``: interleaved RoPE on ``x[..., lo:hi]``, in place (module doc).

    For each pair ``(a, b) = (x[2i], x[2i + 1])`` of the slice (``i`` counted from ``lo``), in
    fp32 and rounded once to x's dtype: ``a' = a * r1[2i] - b * s[2i]``, ``b' = b * r1[2i+1] +
    a * s[2i+1]`` with ``s = r2`` (``-r2`` with ``negate_sin``); DeepSeek-V4's tables hold each
    frequency twice (``[c0, c0, c1, c1, ...]``), which the op does not require.

    Args:
        x: ``[B, S, N, D]`` fp16 / bf16 / fp32 (D even, <= 1024), C-contiguous, writable; updated
            in place.
        r1: the cos table ``[B|1, S|1, N|1, hi - lo]``, x's dtype or fp32.
        r2: the sin table, r1's shape and dtype.
        rotary_mode: ``"interleave"``.
        partial_slice: ``[lo, hi]``, ``0 <= lo < hi <= D``, ``hi - lo`` even.
        negate_sin: rotate by ``-r2`` (the inverse RoPE).

    Returns:
        None (x holds the result).

    Raises:
        ModeError: another rotary_mode, a bad partial_slice or negate_sin. ShapeError /
        DTypeError: shapes or dtypes other than the above, or r1 / r2 overlapping x.

    Source: cann-recipes-infer ``ops/ascendc/examples/test_npu_inplace_partial_rotary_mul.py``.
    """
    if rotary_mode not in PARTIAL_ROPE_MODES:
        raise arg_error(ModeError, "rotary_mode", f"one of {list(PARTIAL_ROPE_MODES)} (the only mode the sources "
                        "define for this op)", describe(rotary_mode))
    if not isinstance(negate_sin, (bool, np.bool_)):
        raise arg_error(ModeError, "negate_sin", "a bool", describe(negate_sin))
    x, r1, r2 = required(x, "x"), required(r1, "r1"), required(r2, "r2")
    check_ndim(x, "x", (4,), "[B, S, N, D]")
    check_dtype(x, "x", PARTIAL_ROPE_X_DTYPES)
    check_cache(x, "x")
    d = x.shape[3]
    if d % 2 or d > PARTIAL_ROPE_MAX_D:
        raise arg_error(ShapeError, "x", f"D (dim 3) even and <= {PARTIAL_ROPE_MAX_D}", f"shape {list(x.shape)}")
    try:
        parts = list(partial_slice)
    except TypeError:
        parts = None
    if parts is None or len(parts) != 2:
        raise arg_error(ModeError, "partial_slice", "two ints [lo, hi]", describe(partial_slice))
    lo = _int(parts[0], "partial_slice[0]", 0, d)
    hi = _int(parts[1], "partial_slice[1]", 0, d)
    if not lo < hi or (hi - lo) % 2:
        raise arg_error(ModeError, "partial_slice", f"0 <= lo < hi <= D ({d}) with hi - lo even (pairs)", [lo, hi])
    for name, a in (("r1", r1), ("r2", r2)):
        check_ndim(a, name, (4,), "[B|1, S|1, N|1, hi - lo]")
        check_dtype(a, name, (dtype_name(x.dtype), "float32"))
        if a.shape[3] != hi - lo or any(a.shape[i] not in (1, x.shape[i]) for i in range(3)):
            raise arg_error(ShapeError, name, f"[B|1, S|1, N|1, {hi - lo}] over x {list(x.shape)}",
                            f"shape {list(a.shape)}")
    if r2.shape != r1.shape or r2.dtype != r1.dtype:
        raise arg_error(ShapeError, "r2", f"r1's shape {list(r1.shape)} and dtype {dtype_name(r1.dtype)}",
                        f"shape {list(r2.shape)} dtype {dtype_name(r2.dtype)}")
    check_disjoint([("x", x)], [("r1", r1), ("r2", r2)])
    get_backend().inplace_partial_rotary_mul(PartialRotaryArgs(x, r1, r2, lo, hi, bool(negate_sin)))


# ------------------------------------------------------------------------ compressor_metadata
def _metadata_inputs(rope_cos, rope_sin, cu_seqlens, start_pos, kv_block_table, kv_block_size,
                     slot_mapping_format, compress_ratio, num_reqs_actual):
    rope_cos, rope_sin = required(rope_cos, "rope_cos"), required(rope_sin, "rope_sin")
    for name, a in (("rope_cos", rope_cos), ("rope_sin", rope_sin)):
        check_ndim(a, name, (2,), "[R, D]")
        check_dtype(a, name, METADATA_ROPE_DTYPES)
    if rope_sin.shape != rope_cos.shape or rope_sin.dtype != rope_cos.dtype:
        raise arg_error(ShapeError, "rope_sin", f"rope_cos's shape {list(rope_cos.shape)} and dtype "
                        f"{dtype_name(rope_cos.dtype)}",
                        f"shape {list(rope_sin.shape)} dtype {dtype_name(rope_sin.dtype)}")
    block_size = _int(kv_block_size, "kv_block_size", 1)
    slot_format = _int(slot_mapping_format, "slot_mapping_format", 0)
    if slot_format not in SLOT_FORMATS:
        raise arg_error(ModeError, "slot_mapping_format", "1 (flat slots) or 2 ([block, offset] pairs)", slot_format)
    ratio = _int(compress_ratio, "compress_ratio", 1)
    num_reqs = _int(num_reqs_actual, "num_reqs_actual", 0, MAX_METADATA_ROWS)
    cu, sp, table = required(cu_seqlens, "cu_seqlens"), required(start_pos, "start_pos"), \
        required(kv_block_table, "kv_block_table")
    for name, a, nd in (("cu_seqlens", cu, 1), ("start_pos", sp, 1), ("kv_block_table", table, 2)):
        check_ndim(a, name, (nd,))
        check_dtype(a, name, ("int32",))
    if cu.shape[0] < num_reqs + 1:
        raise arg_error(ShapeError, "cu_seqlens", f"at least num_reqs_actual + 1 = {num_reqs + 1} entries",
                        f"shape {list(cu.shape)}")
    if sp.shape[0] < num_reqs or table.shape[0] < num_reqs:
        bad, a = ("start_pos", sp) if sp.shape[0] < num_reqs else ("kv_block_table", table)
        raise arg_error(ShapeError, bad, f"at least num_reqs_actual = {num_reqs} rows", f"shape {list(a.shape)}")
    cu64 = cu[:num_reqs + 1].astype(np.int64)
    check_cu_seqlens(cu64, "cu_seqlens", IndexRangeError)
    table64 = table[:num_reqs].astype(np.int64)
    top_block = int(table64.max()) if table64.size else 0
    if slot_format == SLOT_FORMAT_FLAT and int(slot_of_block_row(top_block, block_size - 1, block_size)) > INT32_MAX:
        raise arg_error(IndexRangeError, "kv_block_table", f"block ids whose flat slots (block * {block_size} + "
                        f"offset) fit int32", top_block)
    return (rope_cos, rope_sin, cu64, sp[:num_reqs].astype(np.int64), table64,
            block_size, slot_format, ratio, num_reqs)


def compressor_metadata(rope_cos, rope_sin, cu_seqlens, start_pos, kv_block_table, kv_block_size: int,
                        slot_mapping_format: int, compress_ratio: int, num_compressed_tokens: int,
                        num_reqs_actual: int):
    """``compressor_metadata``: each compressed row's rope cos / sin row and its cache slot.

    Request ``i`` (of ``num_reqs_actual``) with ``L = cu_seqlens[i+1] - cu_seqlens[i]`` new tokens
    from position ``p = start_pos[i]`` completes ``(p + L) // ratio - p // ratio`` compressed rows
    (0 when ``p < 0`` or ``L == 0``); the rows of all requests, in request order, are the output
    rows ``0 .. n - 1`` (``n = num_compressed_tokens``; extra rows are cut, missing ones invalid).
    Row ``r`` of request ``i``, the ``k``-th of its rows: compressed position ``c = p // ratio +
    k``; cos / sin = ``rope_*[c * ratio]``; slot ``(block_table[i][c // bs], c % bs)`` (flat:
    ``block * bs + offset``). Invalid rows: cos 1, sin 0, slot -1 (flat) or ``[-1, bs - 1]``.

    Args:
        rope_cos, rope_sin: ``[R, D]`` bf16 / fp16 / fp32, one shape and dtype.
        cu_seqlens: int32 ``[>= num_reqs_actual + 1]``, from 0, non-decreasing.
        start_pos: int32 ``[>= num_reqs_actual]``.
        kv_block_table: int32 ``[>= num_reqs_actual, W]``.
        kv_block_size: rows per compressed-cache block (>= 1).
        slot_mapping_format: 1 (flat) or 2 (``[block, offset]``).
        compress_ratio: original tokens per compressed row (>= 1).
        num_compressed_tokens: n, the output rows (>= 0).
        num_reqs_actual: requests to read (>= 0).

    Returns:
        ``(cos, sin, slot_mapping)``: ``[n, 1, 1, D]`` of the rope dtype (twice), int32 ``[n]``
        (format 1) or ``[n, 2]`` (format 2).

    Raises:
        ShapeError / DTypeError / ModeError: arguments other than the above.
        IndexRangeError: a cu_seqlens that does not start at 0 or decreases.

    Source: vllm-ascend ``tests/e2e/nightly/single_node/ops/singlecard_ops/test_compressor_metadata.py``.
    """
    cos, sin, cu, sp, table, bs, fmt, ratio, reqs = _metadata_inputs(
        rope_cos, rope_sin, cu_seqlens, start_pos, kv_block_table, kv_block_size, slot_mapping_format,
        compress_ratio, num_reqs_actual)
    rows = _int(num_compressed_tokens, "num_compressed_tokens", 0, MAX_METADATA_ROWS)
    args = CompressorMetadataArgs(cos, sin, cu, sp, table, bs, fmt, ratio, rows, reqs, None)
    return tuple(get_backend().compressor_metadata(args))


def compressor_metadata_out(rope_cos, rope_sin, cu_seqlens, start_pos, kv_block_table, kv_block_size: int,
                            slot_mapping_format: int, compress_ratio: int, num_reqs_actual: int,
                            cos_out, sin_out, slot_mapping_out):
    """``compressor_metadata_out``: :func:`compressor_metadata` written into given arrays.

    ``n`` is the out arrays' row count (the schema has no ``num_compressed_tokens``).

    Args:
        rope_cos ... num_reqs_actual: as :func:`compressor_metadata`.
        cos_out, sin_out: ``[n, 1, 1, D]`` of the rope dtype, C-contiguous, writable.
        slot_mapping_out: int32 ``[n]`` (format 1) or ``[n, 2]`` (format 2), C-contiguous, writable.

    Returns:
        ``(cos_out, sin_out, slot_mapping_out)``, the same objects, written.

    Raises:
        as :func:`compressor_metadata`; ShapeError: out arrays of another shape or overlapping
        each other or an input (nothing is written then).
    """
    rope, sin_table, cu, sp, table, bs, fmt, ratio, reqs = _metadata_inputs(
        rope_cos, rope_sin, cu_seqlens, start_pos, kv_block_table, kv_block_size, slot_mapping_format,
        compress_ratio, num_reqs_actual)
    cos_out, sin_out = required(cos_out, "cos_out"), required(sin_out, "sin_out")
    slot_out = required(slot_mapping_out, "slot_mapping_out")
    n = cos_out.shape[0] if cos_out.ndim == 4 else -1
    d = rope.shape[1]
    for name, a in (("cos_out", cos_out), ("sin_out", sin_out)):
        if a.shape != (n, 1, 1, d) or a.dtype != rope.dtype:
            raise arg_error(ShapeError, name, f"shape [n, 1, 1, {d}] and dtype {dtype_name(rope.dtype)}"
                            + (f" (n = {n} from cos_out)" if n >= 0 else ""),
                            f"shape {list(a.shape)} dtype {dtype_name(a.dtype)}")
        check_cache(a, name)
    want = (n,) if fmt == SLOT_FORMAT_FLAT else (n, 2)
    check_dtype(slot_out, "slot_mapping_out", ("int32",))
    if slot_out.shape != want:
        raise arg_error(ShapeError, "slot_mapping_out", f"shape {list(want)} (slot_mapping_format {fmt})",
                        f"shape {list(slot_out.shape)}")
    check_cache(slot_out, "slot_mapping_out")
    check_disjoint([("cos_out", cos_out), ("sin_out", sin_out), ("slot_mapping_out", slot_out)],
                   [("rope_cos", rope_cos), ("rope_sin", rope_sin), ("cu_seqlens", cu_seqlens),
                    ("start_pos", start_pos), ("kv_block_table", kv_block_table)])
    args = CompressorMetadataArgs(rope, sin_table, cu, sp, table, bs, fmt, ratio, n, reqs, (cos_out, sin_out, slot_out))
    return tuple(get_backend().compressor_metadata(args))
