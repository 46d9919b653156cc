"""DeepSeek-V4 cache number formats: the ``kv_compress_epilog`` rows and the indexer key quant.

Pure codecs (NumPy in, NumPy out, nothing written in place); the ops that scatter these rows
into caches build on them. docs/v4.md states the choices below in one place.

Sources (facts, read at the kernels' text):

- cann-recipes-infer ``ops/ascendc/docs/custom-npu_kv_compress_epilog.md`` (x ``[T, d]`` bf16,
  ``d`` 512, cache fp8 ``[T, d']``, ``d' = ceil(ySize / 128) * 128``; quant_mode 2, group 64) and
  its golden ``ops/ascendc/examples/test_npu_kv_compress_epilog.py`` (row layouts of quant_mode
  1 and 2, the HiF8 quant_mode 3, ``slot -1`` skips);
- vllm-ascend ``csrc/attention/kv_compress_epilog/op_kernel/kv_compress_epilog_common.h``
  (``VFProcessDynamicBlockQuant``: quant_mode 1; ``VFProcessDynamicMxFP8Quant``: quant_mode 2)
  and ``kv_compress_epilog.h`` (``SetMaxValue``: the constant ``fp32(1 / fp8_max)``);
- vllm-ascend ``csrc/attention/indexer_compress_epilog_v2/op_kernel/indexer_compress_epilog_v2_base.h``
  (``VFProcessDynamicBlockQuant``: one fp32 scale per 128 values, the constant ``0x3b124925``),
  ``..._single_row.h`` (the packed cache offsets) and ``op_host/indexer_compress_epilog_v2_tiling.cpp``
  (``scaleCol = ceil(d / 128)``, ``blockStride`` default ``cacheBs * cacheD``, ``layout`` 2 only).

The 640-byte row (quant_mode 2, ``d`` 512, "layout 1"): the LAST 64 values of x are the rope
part, copied as bf16 into bytes 0-127; the first 448 values are quantized in groups of 64 into
bytes 128-575 (fp8); bytes 576-582 hold the 7 E8M0 scale bytes (group j at 576 + j); bytes
583-639 are zero. For other ``d`` (the golden also runs 256 and 768): ``q = d - 64`` fp8 bytes
after the rope, ``ceil(q / 64)`` scale bytes, zero padding to a multiple of 128.

``quant_group_size`` 128 with quant_mode 2 (vllm-ascend's kernel only: its tiling accepts 64 or
128 for MXFP8, the recipes' doc fixes 64): one E8M0 scale per 128 values (the kernel's "fold-two"
path pairs two 64-lane registers; the last group may be short), ``ceil((d - 64) / 128)`` scale
bytes, the same row otherwise.

Layout 2 (vllm-ascend ``kv_compress_epilog.h`` ``Process`` and ``VFProcessDynamicMxFP8QuantLayout2``,
quant_mode 2 only): each token has a *value part* of ``q + 128`` bytes -- the ``q`` fp8 values
first, then the 64 rope values as bf16 (the reverse of the 640-byte row) -- and a *scale part*
of ``roundup(ceil(q / group), 8)`` bytes (the E8M0 bytes, then bytes the kernel copies out of
unset local memory: this codec writes them as zeros, a documented reading). A paged cache block
``b`` starts at ``b * block_stride``; row ``o`` of the block has its value part at
``o * (q + 128)`` and its scale part at ``block_size * (q + 128) + o * scale_part`` (all value
parts of a block first, then all its scale parts: 576 + 8 bytes a token for d 512).

The E8M0 scale of quant_mode 2 (``round_scale_flag`` True): ``amax = max(max |x_g|, 1e-4)``,
``s = fl32(amax * fl32(1 / fp8_max))``, then the kernel takes the biased exponent ``e`` of ``s``
and adds one where ``(e & 0x7FFFFF) != 0``: it masks the *exponent* field with the mantissa mask,
so for every normal ``s`` (``s >= 1e-4 / 57344`` is always normal) the byte is ``e + 1``. The
golden adds one only where the mantissa of ``s`` is non-zero: the two agree except where ``s`` is
an exact power of two (e.g. ``amax`` 448 for E4M3FN: ``s`` is exactly 1.0; golden byte 127,
kernel byte 128). **This codec follows the kernel** (:data:`KV_E8M0_RULE`). The values are
``fp8_rne(clip(x / 2**(byte - 127), +-fp8_max))`` (``Div``, then ``Maxs`` / ``Mins``, cast
``CAST_RINT``). ``round_scale_flag`` False (the kernel's ``roundScale = false`` template, which
the golden matches): values ``fp8_rne(clip(x / s, +-fp8_max))`` with the unrounded ``s`` and the
stored byte ``e`` (the exponent of ``s``, truncated).

quant_mode 1 (fp32 scales; kernel ``VFProcessDynamicBlockQuant``): groups of 128 over the first
``q = d - 64`` values (two 64-lane registers per group; the kernel has no other group size, so
``quant_group_size`` must be 128 here), ``s = fl32(max |x_g| * fl32(1 / fp8_max))`` (no 1e-4
clamp, no rounding), values ``fp8_rne(x / s)`` without clipping; row: ``q`` fp8 bytes, then the
64 rope values as bf16 (128 bytes), then ``ceil(q / 128)`` little-endian fp32 scales, then zeros
to a multiple of 128. A group of zeros: the kernel computes ``s = 0`` and ``0 / 0`` (NaN); the
golden stores ``s = inf`` and values 0. Neither is a value a reader can use; the codec follows the
kernel's scale (0.0) and, like the indexer kernel does, keeps the group's own (zero) values where
the quotient is not finite: value bytes ``+-0`` (choice, documented in docs/v4.md).

quant_mode 3 (HiF8, golden ``hifp8_block_quant``): ``hif8(fl32(x) * fl32(scale))`` over the whole
row of ``d`` values, the row ``d`` HiF8 bytes (no rope split, no scales), HiF8's own encoder
(:func:`~.hifloat8.to_hif8`).

The indexer key quant (950; ``indexer_compress_epilog`` / ``_v2``): per group of 128,
``amax = max |x_g|`` over the finite values, ``s = amax * fl32(1/448)`` (``0x3b124925``; an
E5M2 cache of the recipes' ``indexer_compress_epilog``: ``fl32(1/57344)``, ``0x37924925``) where
``amax != 0``, else ``s = 0``; values ``fp8_e4m3fn_rne(x / s)`` (``Div``, no clip), and where the
quotient is not finite (``s = 0``) the value is ``x`` itself (the kernel's ``Select``), so a group
of zeros stores its zeros with their signs. The v2 packed cache (one uint8 tensor ``[blocks, bs,
1, D']``, layout 2), as ``indexer_compress_epilog_v2_single_row.h`` addresses it: block ``b``
starts at byte ``b * block_stride`` (default ``bs * D'``); the fp8 values of in-block row ``o``
at ``o * d`` within the block; the fp32 scales (little-endian, ``ceil(d / 128)`` of them) of row
``o`` at ``bs * d + o * 4 * ceil(d / 128)``. So a block holds all its value rows first, then all
its scale rows; ``bs * (d + 4 * ceil(d / 128)) <= block_stride`` is required.

The recipes' ``indexer_compress_epilog`` quant_mode 0 (MX, cann-recipes-infer
``indexer_compress_epilog_base.h`` ``VFProcessDynamicMxFp8Quant``): quant_mode 2's arithmetic of
the kv rows (1e-4 clamp, the kernel's E8M0 rounding, clip, RNE) on groups of 128 of the whole row
(no rope part), one E8M0 byte per group.

The A2 / A3 indexer key cache is int8 with an fp16 scale cache: vllm-ascend quantizes the key
with ``npu_dynamic_quant`` (per-token symmetric int8, :func:`~.schemes.quantize_per_token_multiplier`,
scale form ``amax * fp32(1/127)``) and scatters the int8 rows and the scales, the scale cache
being fp16: this codec rounds the fp32 scale to fp16 (RNE). Groups of 128 (one scale per row of
the 128-wide indexer key).

NaN / Inf: the sources disagree (the kv golden zeroes NaN and ignores it in amax, the mode-2
kernel's ``Maxs`` / exponent arithmetic is undefined there, the indexer kernel excludes
non-finite values from amax and stores them cast as they are, its golden zeroes them). Every fp8
and int8 codec here rejects a NaN or Inf in the quantized values (stricter than the hardware);
the bf16 rope part is copied bit for bit, NaN included, and HiF8 (quant_mode 3) encodes NaN and
Inf as HiF8 does.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..errors import (DTypeError, IndexRangeError, ModeError, NonFiniteInputError, ShapeError, arg_error,
                      describe)
from .fp8 import FP8_DTYPES, FP8_MAX, fp8_name, to_fp8
from .hifloat8 import to_hif8
from .mx import E8M0_BIAS, E8M0_NAN, _check_int, e8m0_to_f32
from .rounding import BF16, INT8_MAX, f32_to_f16, real_to_f32
from .schemes import quantize_per_token_multiplier

#: Rope values at the end of each x row, stored first (bf16) in quant_mode 1 / 2 rows.
KV_ROPE_DIM = 64
KV_ROPE_BYTES = 2 * KV_ROPE_DIM
#: Values per E8M0 scale (quant_mode 2) and per fp32 scale (quant_mode 1).
KV_MX_GROUP = 64
#: quant_group_size values of quant_mode 2 (vllm-ascend's tiling: 64 or 128; the recipes' doc: 64).
KV_MX_GROUPS = (64, 128)
#: Layout 2: the scale part of a token is its E8M0 bytes rounded up to this many bytes.
KV_LAYOUT2_SCALE_ALIGN = 8
KV_FP32_GROUP = 128
#: Rows are padded with zeros to a multiple of this many bytes.
KV_ROW_ALIGN = 128
#: The lower clamp of a quant_mode 2 group's amax.
KV_MIN_AMAX = np.float32(1e-4)
#: quant_mode values: 1 fp8 with fp32 scales, 2 fp8 with E8M0 scales, 3 HiF8 with a fixed scale.
KV_QUANT_MODES = (1, 2, 3)
#: Which E8M0 rounding this codec applies (module docstring): the kernel's (``e + 1`` for every
#: normal scale), not the golden's (``e + 1`` only where the mantissa is non-zero).
KV_E8M0_RULE = "kernel"
#: Values per indexer key scale.
INDEXER_GROUP = 128
#: The indexer kernel's ``fp32(1/448)`` (``INV_FP8_E4M3_MAX_VALUE``).
INDEXER_INV_FP8_MAX = np.array([0x3B124925], np.uint32).view(np.float32)[0]

_F32_EXP_MASK = np.uint32(0xFF)
_F32_MANT_MASK = np.uint32(0x7FFFFF)


def _rows(x, name: str, *, min_width: int) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype not in (BF16, np.dtype(np.float16), np.dtype(np.float32)):
        raise arg_error(DTypeError, name, "bf16 (ml_dtypes.bfloat16), fp16 or fp32 values", x.dtype)
    if x.ndim != 2 or x.shape[1] < min_width:
        raise arg_error(ShapeError, name, f"a 2-D array [T, d] with d >= {min_width}", describe(x))
    return x


def _finite(v: np.ndarray, name: str, what: str) -> None:
    bad = ~np.isfinite(v)
    if bad.any():
        t, c = (int(i) for i in np.argwhere(bad)[0])
        raise arg_error(NonFiniteInputError, name, f"finite {what} (NaN / Inf have no defined bytes: docs/v4.md)",
                        f"{v[t, c]!r} at [{t}, {c}]")


def kv_group_size(quant_mode: int, quant_group_size: int | None = None) -> int:
    """The values per scale of a quant_mode: quant_mode 2: ``quant_group_size`` (None: 64; 64 or
    128, :data:`KV_MX_GROUPS`); quant_mode 1: 128 (the kernel's only size: None or 128 accepted);
    quant_mode 3: no groups (0, ``quant_group_size`` ignored).

    Raises:
        ModeError: a ``quant_group_size`` the mode does not have, or not an int.
    """
    if quant_mode == 3:
        return 0
    if quant_group_size is None:
        return KV_MX_GROUP if quant_mode == 2 else KV_FP32_GROUP
    g = _check_int("quant_group_size", quant_group_size)
    allowed = KV_MX_GROUPS if quant_mode == 2 else (KV_FP32_GROUP,)
    if g not in allowed:
        raise arg_error(ModeError, "quant_group_size", f"one of {allowed} for quant_mode {quant_mode} (the "
                        "kernel's group sizes)", g)
    return g


def kv_row_bytes(d: int, quant_mode: int = 2, quant_group_size: int | None = None) -> int:
    """Bytes of one ``kv_compress_epilog`` row for x rows of ``d`` values.

    Source: cann-recipes-infer ``custom-npu_kv_compress_epilog.md`` (``d'``) and the golden
    ``calc_kv_compress_layout``; module docstring.

    Args:
        d: values per x row (512 for DeepSeek-V4); > 64 for quant_mode 1 / 2, >= 1 for 3.
        quant_mode: 1, 2 or 3.
        quant_group_size: quant_mode 2's group (None: 64; or 128); checked by
            :func:`kv_group_size`.

    Returns:
        quant_mode 2: ``ceil((d - 64 + 128 + ceil((d - 64) / group)) / 128) * 128`` (640 for 512);
        quant_mode 1: ``ceil((d - 64 + 128 + 4 * ceil((d - 64) / 128)) / 128) * 128`` (640);
        quant_mode 3: ``d``.

    Raises:
        ModeError: another quant_mode, or ``d`` not an int. ShapeError: ``d`` too small.
    """
    d = _check_int("d", d)
    quant_mode = _check_int("quant_mode", quant_mode)
    if quant_mode not in KV_QUANT_MODES:
        raise arg_error(ModeError, "quant_mode", f"one of {KV_QUANT_MODES}", quant_mode)
    if quant_mode == 3:
        if d < 1:
            raise arg_error(ShapeError, "d", "at least 1 value per row", d)
        return d
    if d <= KV_ROPE_DIM:
        raise arg_error(ShapeError, "d", f"more than the {KV_ROPE_DIM} rope values per row", d)
    q = d - KV_ROPE_DIM
    group = kv_group_size(quant_mode, quant_group_size)
    scales = -(-q // group) if quant_mode == 2 else 4 * -(-q // group)
    used = q + KV_ROPE_BYTES + scales
    return -(-used // KV_ROW_ALIGN) * KV_ROW_ALIGN


def _kv_mode2_scale(amax: np.ndarray, name: str) -> np.ndarray:
    """The unrounded quant_mode 2 scale ``fl32(max(amax, 1e-4) * fl32(1 / fp8_max))``."""
    return (np.maximum(amax, KV_MIN_AMAX) * (np.float32(1.0) / np.float32(FP8_MAX[name]))).astype(np.float32)


def kv_e8m0_bytes(amax, dtype="float8_e4m3fn", *, round_scale: bool = True) -> np.ndarray:
    """The quant_mode 2 E8M0 scale byte of groups with the given ``max |x|``, as the kernel computes it.

    ``s = fl32(max(amax, 1e-4) * fl32(1 / fp8_max))``; ``e`` its biased exponent; the byte is
    ``e + 1`` where ``round_scale`` (the kernel adds one for every normal ``s``, exact powers of
    two included: :data:`KV_E8M0_RULE`), else ``e``.

    Source: vllm-ascend ``kv_compress_epilog_common.h`` ``VFProcessDynamicMxFP8Quant``.

    Args:
        amax: finite ``max |x|`` of each group (>= 0), any shape.
        dtype: the fp8 element type (``"float8_e4m3fn"`` / ``"float8_e5m2"``, dtype or code).
        round_scale: the op's ``round_scale_flag``.

    Returns:
        New uint8 array of ``amax``'s shape.

    Raises:
        ModeError: unknown ``dtype``, or a negative or non-finite ``amax``.
    """
    name = fp8_name(dtype)
    a = np.asarray(amax, dtype=np.float32)
    if a.size and (~np.isfinite(a) | (a < 0)).any():
        raise arg_error(ModeError, "amax", "finite values >= 0", describe(a))
    s = _kv_mode2_scale(a, name)
    exp = ((s.view(np.uint32) >> np.uint32(23)) & _F32_EXP_MASK).astype(np.int64)
    if round_scale:
        exp = exp + ((exp & np.int64(_F32_MANT_MASK)) != 0)
    return exp.astype(np.uint8)


def _groups(x32: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """fp32 rows ``[T, Q]`` as groups ``[T, ceil(Q / size), size]`` (a short last group padded
    with zeros, which never raise its amax) and each group's amax ``[T, groups]``."""
    t, q = x32.shape
    groups = -(-q // size)
    padded = np.zeros((t, groups * size), np.float32)
    padded[:, :q] = x32
    g = padded.reshape(t, groups, size)
    return g, (np.max(np.abs(g), axis=-1) if t else np.zeros((0, groups), np.float32))


def _kv_mode2(x32: np.ndarray, name: str, round_scale: bool, group: int = KV_MX_GROUP
              ) -> tuple[np.ndarray, np.ndarray]:
    t, q = x32.shape
    g, amax = _groups(x32, group)
    byte = kv_e8m0_bytes(amax, name, round_scale=round_scale)
    if round_scale:
        s = np.ldexp(np.float32(1.0), byte.astype(np.int32) - E8M0_BIAS).astype(np.float32)
    else:
        s = _kv_mode2_scale(amax, name)
    top = np.float32(FP8_MAX[name])
    v = np.clip(g / s[..., None], -top, top).reshape(t, -1)[:, :q]
    return to_fp8(v, name).view(np.uint8), byte


def _kv_mode1(x32: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    t, q = x32.shape
    g, amax = _groups(x32, KV_FP32_GROUP)
    s = (amax * (np.float32(1.0) / np.float32(FP8_MAX[name]))).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = g / s[..., None]
    v = np.where(np.isfinite(v), v, g).reshape(t, -1)[:, :q]
    return to_fp8(v, name).view(np.uint8), s


def encode_kv_rows(x, *, quant_mode: int = 2, dtype="float8_e4m3fn", round_scale: bool = True,
                   quant_group_size: int | None = None, scale: float = 1.0) -> np.ndarray:
    """Encode x rows as ``kv_compress_epilog`` cache rows (the bytes one token's slot receives).

    Source: module docstring (cann-recipes-infer doc and golden; vllm-ascend kernel).

    Args:
        x: ``[T, d]`` bf16 (the op's dtype; fp16 / fp32 are read as their fp32 values).
        quant_mode: 2 (E8M0 scales, the 640-byte row for d 512), 1 (fp32 scales) or 3 (HiF8).
        dtype: the fp8 element type for quant_mode 1 / 2 (``"float8_e4m3fn"``, ``"float8_e5m2"``).
        round_scale: quant_mode 2's ``round_scale_flag``.
        quant_group_size: None or a group size the mode has (:func:`kv_group_size`: 64 or 128
            for 2, 128 for 1; 3 ignores it).
        scale: quant_mode 3's multiplier (fp32).

    Returns:
        New uint8 array ``[T, kv_row_bytes(d, quant_mode)]``.

    Raises:
        DTypeError / ShapeError: bad ``x``. ModeError: bad ``quant_mode``, ``dtype`` or a
        ``quant_group_size`` the mode does not have, or a non-finite ``scale``.
        NonFiniteInputError: NaN / Inf in the quantized part (modes 1 / 2).
    """
    quant_mode = _check_int("quant_mode", quant_mode)
    if quant_mode not in KV_QUANT_MODES:
        raise arg_error(ModeError, "quant_mode", f"one of {KV_QUANT_MODES}", quant_mode)
    x = _rows(x, "x", min_width=1 if quant_mode == 3 else KV_ROPE_DIM + 1)
    t, d = x.shape
    width = kv_row_bytes(d, quant_mode)
    x32 = real_to_f32(x, "x")
    if quant_mode == 3:
        if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating)) or not np.isfinite(scale):
            raise arg_error(ModeError, "scale", "a finite float", describe(scale))
        return to_hif8(x32 * np.float32(scale))
    group = kv_group_size(quant_mode, quant_group_size)
    name = fp8_name(dtype)
    q = d - KV_ROPE_DIM
    _finite(x32[:, :q], "x", "values in the quantized columns")
    rope = np.ascontiguousarray(x[:, q:]).astype(BF16) if x.dtype != BF16 else np.ascontiguousarray(x[:, q:])
    rope_bytes = rope.view(np.uint8).reshape(t, KV_ROPE_BYTES)
    out = np.zeros((t, width), np.uint8)
    if quant_mode == 2:
        values, scales = _kv_mode2(x32[:, :q], name, bool(round_scale), group)
        out[:, :KV_ROPE_BYTES] = rope_bytes
        out[:, KV_ROPE_BYTES:KV_ROPE_BYTES + q] = values
        out[:, KV_ROPE_BYTES + q:KV_ROPE_BYTES + q + scales.shape[1]] = scales
    else:
        values, s = _kv_mode1(x32[:, :q], name)
        out[:, :q] = values
        out[:, q:q + KV_ROPE_BYTES] = rope_bytes
        sb = s.astype("<f4").view(np.uint8).reshape(t, -1)
        out[:, q + KV_ROPE_BYTES:q + KV_ROPE_BYTES + sb.shape[1]] = sb
    return out


def split_kv_rows(rows, d: int = 512, *, quant_mode: int = 2, dtype="float8_e4m3fn",
                  quant_group_size: int | None = None):
    """The parts of ``kv_compress_epilog`` rows: ``(rope, values, scales, pad)``.

    Args:
        rows: uint8 (or fp8 / HiF8-as-uint8, viewed as bytes) ``[T, W]`` with
            ``W == kv_row_bytes(d, quant_mode)``.
        d: values per x row the rows were encoded from.
        quant_mode: 1 or 2 (quant_mode 3 rows are plain HiF8 codes: :func:`decode_kv_rows`).
        dtype: the fp8 element type.
        quant_group_size: quant_mode 2's group the rows were encoded with (None: 64).

    Returns:
        ``rope`` bf16 ``[T, 64]``; ``values`` ml_dtypes fp8 ``[T, d - 64]``; ``scales`` uint8
        E8M0 bytes ``[T, ceil((d - 64) / group)]`` (mode 2) or fp32 ``[T, ceil((d - 64) / 128)]``
        (mode 1); ``pad`` uint8 ``[T, W - used]`` (zeros in rows this codec wrote).

    Raises:
        ShapeError / DTypeError: rows of another width or dtype. ModeError: bad mode / dtype.
    """
    quant_mode = _check_int("quant_mode", quant_mode)
    if quant_mode not in (1, 2):
        raise arg_error(ModeError, "quant_mode", "1 or 2 (quant_mode 3 rows hold only HiF8 codes)", quant_mode)
    width = kv_row_bytes(d, quant_mode, quant_group_size)
    group = kv_group_size(quant_mode, quant_group_size)
    name = fp8_name(dtype)
    rows = np.asarray(rows)
    if rows.dtype != np.uint8 and rows.dtype not in FP8_DTYPES.values():
        raise arg_error(DTypeError, "rows", "bytes (uint8 or an fp8 dtype)", rows.dtype)
    rows = rows.view(np.uint8)
    if rows.ndim != 2 or rows.shape[1] != width:
        raise arg_error(ShapeError, "rows", f"[T, {width}] (rows of d {d}, quant_mode {quant_mode})", describe(rows))
    t = rows.shape[0]
    q = d - KV_ROPE_DIM
    if quant_mode == 2:
        n = -(-q // group)
        rope = rows[:, :KV_ROPE_BYTES]
        values = rows[:, KV_ROPE_BYTES:KV_ROPE_BYTES + q]
        scales = rows[:, KV_ROPE_BYTES + q:KV_ROPE_BYTES + q + n].copy()
        used = KV_ROPE_BYTES + q + n
    else:
        n = -(-q // KV_FP32_GROUP)
        values = rows[:, :q]
        rope = rows[:, q:q + KV_ROPE_BYTES]
        scales = np.ascontiguousarray(rows[:, q + KV_ROPE_BYTES:q + KV_ROPE_BYTES + 4 * n]).view("<f4")
        scales = scales.astype(np.float32).reshape(t, n)
        used = q + KV_ROPE_BYTES + 4 * n
    rope = np.ascontiguousarray(rope).view(BF16).reshape(t, KV_ROPE_DIM)
    values = np.ascontiguousarray(values).view(FP8_DTYPES[name])
    return rope, values, scales, rows[:, used:].copy()


#: fp32 value of each of the 256 codes of an fp8 dtype, by dtype (ml_dtypes' own cast of each
#: code, made once: a table lookup gives the same values about ten times faster than the cast).
_FP8_TABLES: dict = {}


def _fp8_f32(values: np.ndarray) -> np.ndarray:
    """fp32 values of an ml_dtypes fp8 array (exact; ml_dtypes' cast, through a 256-entry table)."""
    return _fp8_table(values.dtype)[np.ascontiguousarray(values).view(np.uint8)]


def decode_kv_rows(rows, d: int = 512, *, quant_mode: int = 2, dtype="float8_e4m3fn",
                   scale: float = 1.0, quant_group_size: int | None = None) -> np.ndarray:
    """Dequantize ``kv_compress_epilog`` rows back to x's layout, as fp32 ``[T, d]``.

    quant_mode 2: ``value * 2**(byte - 127)`` per group (``0xFF`` gives NaN); quant_mode 1:
    ``value * scale`` (fp32 multiply); both put the rope part (exact bf16 -> fp32) back in the
    last 64 columns. quant_mode 3: ``hif8 / scale`` (fp32 divide).

    Raises:
        as :func:`split_kv_rows`; ModeError: quant_mode 3 with a zero or non-finite ``scale``.
    """
    quant_mode = _check_int("quant_mode", quant_mode)
    if quant_mode == 3:
        from .hifloat8 import hif8_to_f32
        rows = np.asarray(rows)
        if rows.dtype.itemsize != 1:
            raise arg_error(DTypeError, "rows", "HiF8 codes as uint8", rows.dtype)
        if rows.ndim != 2 or rows.shape[1] != kv_row_bytes(d, 3):
            raise arg_error(ShapeError, "rows", f"[T, {d}]", describe(rows))
        if not np.isfinite(scale) or scale == 0:
            raise arg_error(ModeError, "scale", "a finite non-zero float", describe(scale))
        return (hif8_to_f32(rows.view(np.uint8)) / np.float32(scale)).astype(np.float32)
    rope, values, scales, _ = split_kv_rows(rows, d, quant_mode=quant_mode, dtype=dtype,
                                            quant_group_size=quant_group_size)
    t = rope.shape[0]
    q = d - KV_ROPE_DIM
    v = _fp8_f32(values)
    group = kv_group_size(quant_mode, quant_group_size)
    factor = e8m0_to_f32(scales) if quant_mode == 2 else scales
    per_value = np.repeat(factor, group, axis=1)[:, :q]
    out = np.empty((t, d), np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        out[:, :q] = v * per_value
    if quant_mode == 2:
        out[:, :q][np.repeat(scales == E8M0_NAN, group, axis=1)[:, :q]] = np.nan
    out[:, q:] = rope.astype(np.float32)
    return out



@njit(cache=True, inline="always")
def _e4m3_bits(c):
    """fp32 bits of the FP8 E4M3FN code ``c`` (exact; ``0x7F`` / ``0xFF`` the NaN ``sign | 0x7FC00000``,
    as ml_dtypes' cast), branch-free so that the row loop vectorises."""
    c = np.uint32(c)
    sign = (c & np.uint32(0x80)) << np.uint32(24)
    e = (c >> np.uint32(3)) & np.uint32(0xF)
    m = c & np.uint32(7)
    normal = ((e + np.uint32(120)) << np.uint32(23)) | (m << np.uint32(20))
    sub = np.float32(np.float32(m) * np.float32(2.0 ** -9)).view(np.uint32)  # exact: m * 2**-9
    mag = normal if e != np.uint32(0) else sub
    mag = np.uint32(0x7FC00000) if (c & np.uint32(0x7F)) == np.uint32(0x7F) else mag
    return np.uint32(sign | mag)


@njit(cache=True, inline="always")
def _round_bf16_f32(v):
    """fp32 ``v`` rounded RNE to bf16 (canonical NaN ``sign | 0x7FC0``), as fp32 (exact widening)."""
    u = np.float32(v).view(np.uint32)
    r = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)) << np.uint32(16)
    nan = (u & np.uint32(0x80000000)) | np.uint32(0x7FC00000)
    return np.uint32(nan if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000) else r).view(np.float32)


#: E8M0 bytes whose products with every FP8 E4M3FN value are exact normal bf16 values (or 0, or
#: the fp8 NaN, already canonical): from ``2**-9 * 2**(10 - 127) = 2**-126`` to ``448 *
#: 2**(246 - 127) < 2**128``; a 3-bit mantissa fits bf16's 7, so the bf16 rounding changes nothing.
EXACT_BF16_SCALE_BYTES = (10, 246)


@njit(cache=True, nogil=True)
def _decode_mode2_rows(rows, slots, scales, q, out, col0):
    """Kernel of :func:`decode_kv_rows_bf16_into`: rows uint8 ``[R, >= 128 + q + q / 64]``, slots
    int64 ``[a, J]`` (each in ``[-1, R)``), scales fp32 ``[256]`` E8M0 values, out fp32
    ``[a, >= col0 + J, q + 64]``."""
    for t in range(slots.shape[0]):
        for i in range(slots.shape[1]):
            o = out[t, col0 + i]
            if slots[t, i] < 0:
                o[:] = 0.0
                continue
            row = rows[slots[t, i]]
            for g in range(q // KV_MX_GROUP):
                byte = row[KV_ROPE_BYTES + q + g]
                lo = g * KV_MX_GROUP
                if byte == E8M0_NAN:
                    for j in range(lo, lo + KV_MX_GROUP):
                        o[j] = np.uint32(0x7FC00000).view(np.float32)
                elif EXACT_BF16_SCALE_BYTES[0] <= byte <= EXACT_BF16_SCALE_BYTES[1]:  # the rounding is exact
                    f = scales[byte]
                    for j in range(lo, lo + KV_MX_GROUP):
                        o[j] = np.float32(_e4m3_bits(row[KV_ROPE_BYTES + j]).view(np.float32) * f)
                else:
                    f = scales[byte]
                    for j in range(lo, lo + KV_MX_GROUP):
                        o[j] = _round_bf16_f32(np.float32(_e4m3_bits(row[KV_ROPE_BYTES + j]).view(np.float32) * f))
            for j in range(KV_ROPE_DIM):
                h = np.uint32(row[2 * j]) | (np.uint32(row[2 * j + 1]) << np.uint32(8))
                o[q + j] = _round_bf16_f32(np.uint32(h << np.uint32(16)).view(np.float32))  # exact; NaN canonical


def decode_kv_rows_bf16_into(rows, slots, out: np.ndarray, col0: int = 0, d: int = 512) -> None:
    """The rows ``slots`` of quant_mode 2 ``kv_compress_epilog`` rows (FP8 E4M3FN nope, E8M0
    scales per 64 values, bf16 rope), decoded and rounded (RNE) to bf16, written as fp32 into
    ``out[t, col0 + i]``: ``to_bf16(decode_kv_rows(rows[slots], d, quant_mode=2))`` widened back,
    bit for bit (a scale byte ``0xFF`` gives the NaN ``0x7FC0``; a NaN rope value the canonical
    one), zeros where a slot is -1; one compiled pass over the rows read, no other row touched.

    Args:
        rows: uint8 ``[R, kv_row_bytes(d, 2)]`` rows (d 512: 640 bytes).
        slots: int ``[a, J]`` row numbers, each in ``[0, R)`` or -1 (a padded place).
        out: fp32 C-contiguous ``[a, >= col0 + J, d]``, written at ``[:, col0:col0 + J]`` only.
        col0: the first column of ``out`` written.
        d: values per row, ``d - 64`` a positive multiple of 64.

    Raises:
        DTypeError: rows not uint8, out not fp32. ShapeError: rows not 2-D, a width that is not
        a row's, a ``d`` this format has no rows for, slots not 2-D, or an ``out`` they do not
        fit. IndexRangeError: a slot outside ``[-1, R)``. Nothing is written then.
    """
    rows = np.asarray(rows)
    if rows.dtype != np.uint8:
        raise arg_error(DTypeError, "rows", "the rows' bytes as uint8", rows.dtype)
    if rows.ndim != 2:
        raise arg_error(ShapeError, "rows", "[R, row bytes]", describe(rows))
    q = d - KV_ROPE_DIM
    if q <= 0 or q % KV_MX_GROUP or rows.shape[1] != kv_row_bytes(d, 2):
        raise arg_error(ShapeError, "rows", f"[R, {kv_row_bytes(d, 2) if q > 0 else 'row bytes'}] (quant_mode 2 "
                        f"rows of d = {d}, d - 64 a multiple of 64)", describe(rows))
    slots = np.ascontiguousarray(slots, dtype=np.int64)
    if slots.ndim != 2:
        raise arg_error(ShapeError, "slots", "[a, J] row numbers", describe(slots))
    if slots.size and (int(slots.min()) < -1 or int(slots.max()) >= rows.shape[0]):
        bad = int(slots.min()) if int(slots.min()) < -1 else int(slots.max())
        raise arg_error(IndexRangeError, "slots", f"row numbers in [0, {rows.shape[0]}) or -1", bad)
    if not isinstance(out, np.ndarray) or out.dtype != np.float32:
        raise arg_error(DTypeError, "out", "an fp32 array", describe(out))
    if (out.ndim != 3 or not out.flags.c_contiguous or out.shape[0] != slots.shape[0] or out.shape[2] != d
            or not 0 <= col0 <= out.shape[1] - slots.shape[1]):
        raise arg_error(ShapeError, "out", f"C-contiguous fp32 [{slots.shape[0]}, >= {col0} + {slots.shape[1]}, "
                        f"{d}]", describe(out))
    _decode_mode2_rows(rows, slots, _E8M0_TABLE, q, out, col0)


def decode_kv_rows_bf16(rows, slots, d: int = 512) -> np.ndarray:
    """:func:`decode_kv_rows_bf16_into` of int ``slots`` ``[n]`` (each in ``[0, R)``) into a new
    fp32 ``[n, d]``: nope values in columns ``0 .. d - 65``, rope in the last 64.

    Raises:
        as :func:`decode_kv_rows_bf16_into`; IndexRangeError also for a slot -1.
    """
    slots = np.ascontiguousarray(slots, dtype=np.int64).reshape(1, -1)
    if slots.size and int(slots.min()) < 0:
        raise arg_error(IndexRangeError, "slots", "row numbers >= 0", int(slots.min()))
    out = np.empty((1, slots.shape[1], max(int(d), 0)), np.float32)
    decode_kv_rows_bf16_into(rows, slots, out, 0, d)
    return out[0]


def _fp8_table(dtype) -> np.ndarray:
    """fp32 value of each of the 256 codes of an fp8 dtype (the table :func:`_fp8_f32` reads)."""
    table = _FP8_TABLES.get(dtype)
    if table is None:
        table = _FP8_TABLES[dtype] = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)
    return table


#: fp32 value of each E8M0 byte (``0xFF``: NaN, replaced by the kernel).
_E8M0_TABLE = e8m0_to_f32(np.arange(256, dtype=np.uint8))

# ---------------------------------------------------------------------------- layout 2 (paged split)
def kv_layout2_geometry(d: int, block_size: int, block_stride: int, quant_group_size: int | None = None
                        ) -> dict[str, int]:
    """Byte geometry of a layout-2 ``kv_compress_epilog`` cache (quant_mode 2; module docstring).

    Source: vllm-ascend ``op_host/kv_compress_epilog_tiling_arch35.cpp`` (``valuePerToken``,
    ``scalePerToken``, ``blockStride >= blockSize * (valuePerToken + scalePerToken)``) and
    ``op_kernel/kv_compress_epilog.h`` (``valueGmOff`` / ``scaleGmOff``).

    Args:
        d: values per x row (> 64).
        block_size: rows per cache block (the cache's dim 1).
        block_stride: bytes between blocks (the cache's ``stride(0)``).
        quant_group_size: None (64) or 128.

    Returns:
        ``{"value_row", "scale_row", "scale_count", "scale_base", "block_stride"}``: value-part
        bytes a token (``d - 64`` fp8 + 128 rope), scale-part bytes a token, E8M0 bytes used of
        it, in-block offset of the scale parts (``block_size * value_row``), the stride.

    Raises:
        ShapeError: a block of ``block_stride`` bytes cannot hold ``block_size`` tokens, or
        ``d <= 64``. ModeError: a bad group.
    """
    d, bs, stride = (_check_int(n, v) for n, v in (("d", d), ("block_size", block_size), ("block_stride", block_stride)))
    if d <= KV_ROPE_DIM or bs < 1:
        raise arg_error(ShapeError, "d/block_size", f"d > {KV_ROPE_DIM} and block_size >= 1", f"{d}/{bs}")
    group = kv_group_size(2, quant_group_size)
    q = d - KV_ROPE_DIM
    count = -(-q // group)
    value_row = q + KV_ROPE_BYTES
    scale_row = -(-count // KV_LAYOUT2_SCALE_ALIGN) * KV_LAYOUT2_SCALE_ALIGN
    need = bs * (value_row + scale_row)
    if stride < need:
        raise arg_error(ShapeError, "kv_compress_cache", f"blocks of at least block_size * ({value_row} + {scale_row}) "
                        f"= {need} bytes (layout 2)", f"{stride} bytes a block")
    return {"value_row": value_row, "scale_row": scale_row, "scale_count": count, "scale_base": bs * value_row,
            "block_stride": stride}


def kv_layout2_parts(rows, d: int, quant_group_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The layout-2 value and scale parts of quant_mode 2 rows (the bytes of
    :func:`encode_kv_rows` rearranged: fp8 values then rope; E8M0 bytes then zeros).

    Args:
        rows: uint8 ``[T, kv_row_bytes(d, 2, quant_group_size)]``.
        d, quant_group_size: what the rows were encoded with.

    Returns:
        ``(value, scale)``: new uint8 ``[T, d - 64 + 128]`` and ``[T, roundup(scales, 8)]``.
    """
    rope, values, scales, _ = split_kv_rows(rows, d, quant_mode=2, quant_group_size=quant_group_size)
    t, q = values.shape
    count = scales.shape[1]
    value = np.empty((t, q + KV_ROPE_BYTES), np.uint8)
    value[:, :q] = values.view(np.uint8)
    value[:, q:] = rope.view(np.uint8).reshape(t, KV_ROPE_BYTES)
    scale = np.zeros((t, -(-count // KV_LAYOUT2_SCALE_ALIGN) * KV_LAYOUT2_SCALE_ALIGN), np.uint8)
    scale[:, :count] = scales
    return value, scale


# ---------------------------------------------------------------------------- indexer key quant
#: fp8 element types of the recipes' indexer cache (``indexer_compress_epilog``); the vllm-ascend
#: ``_v2`` packed cache holds E4M3FN.
INDEXER_FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")


def indexer_quant_mx(x, dtype="float8_e4m3fn", *, round_scale: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The recipes' indexer key MX quant (``indexer_compress_epilog`` quant_mode 0): fp8 values
    and one E8M0 byte per 128 values, quant_mode 2's arithmetic (module docstring).

    Source: cann-recipes-infer ``indexer_compress_epilog_base.h`` ``VFProcessDynamicMxFp8Quant``.

    Args:
        x: ``[T, d]`` bf16 / fp16 (fp32 read as is).
        dtype: ``"float8_e4m3fn"`` or ``"float8_e5m2"``.
        round_scale: the op's ``round_scale``.

    Returns:
        ``(values, scales)``: uint8 fp8 bytes ``[T, d]``, uint8 E8M0 ``[T, ceil(d / 128)]``.

    Raises:
        DTypeError / ShapeError: bad ``x``. ModeError: bad ``dtype``. NonFiniteInputError: NaN / Inf.
    """
    x = _rows(x, "x", min_width=1)
    name = fp8_name(dtype)
    x32 = real_to_f32(x, "x")
    _finite(x32, "x", "values")
    return _kv_mode2(x32, name, bool(round_scale), INDEXER_GROUP)


def indexer_quant_fp8(x, dtype="float8_e4m3fn") -> tuple[np.ndarray, np.ndarray]:
    """The 950 indexer key quant: fp8 E4M3FN values and one fp32 scale per 128 values.

    Per group of 128 (the last short): ``amax = max |x_g|``; ``s = fl32(amax * fl32(1/448))``
    where ``amax != 0``, else 0; values ``fp8_rne(x / s)``, or ``x`` itself where the quotient is
    not finite (a zero group keeps its signed zeros). No clip, no clamp, no rounding of ``s``.

    Source: vllm-ascend ``indexer_compress_epilog_v2_base.h`` ``VFProcessDynamicBlockQuant``
    (E4M3FN); cann-recipes-infer ``indexer_compress_epilog_base.h`` (E5M2: ``fl32(1/57344)``).

    Args:
        x: ``[T, d]`` bf16 (fp16 / fp32 read as their fp32 values).
        dtype: ``"float8_e4m3fn"`` (default) or ``"float8_e5m2"``.

    Returns:
        ``(values, scales)``: uint8 fp8 bytes ``[T, d]``, fp32 ``[T, ceil(d / 128)]``.

    Raises:
        DTypeError / ShapeError: bad ``x``. NonFiniteInputError: NaN / Inf in ``x`` (module
        docstring).
    """
    x = _rows(x, "x", min_width=1)
    name = fp8_name(dtype)
    if name not in INDEXER_FP8_DTYPES:
        raise arg_error(ModeError, "dtype", f"one of {INDEXER_FP8_DTYPES}", name)
    x32 = real_to_f32(x, "x")
    _finite(x32, "x", "values")
    t, d = x32.shape
    g, amax = _groups(x32, INDEXER_GROUP)
    # fl32(1 / max) is the kernels' constant: 0x3b124925 (E4M3FN), 0x37924925 (E5M2)
    inv = INDEXER_INV_FP8_MAX if name == "float8_e4m3fn" else np.float32(1.0) / np.float32(FP8_MAX[name])
    s = np.where(amax != 0, amax * inv, np.float32(0)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        v = g / s[..., None]
    v = np.where(np.isfinite(v), v, g).reshape(t, -1)[:, :d]
    return to_fp8(v, name).view(np.uint8), s


def indexer_quant_int8(x) -> tuple[np.ndarray, np.ndarray]:
    """The A2 / A3 indexer key quant: int8 values and one fp16 scale per 128 values.

    Per group of 128: ``npu_dynamic_quant``'s per-token arithmetic
    (:func:`~.schemes.quantize_per_token_multiplier`, scale form ``"amax_times_inverse"``:
    ``q = rint(x * fl32(127 / amax))``, ``s = amax * fl32(1/127)``), the scale rounded to fp16
    (RNE) for the fp16 scale cache; a zero group gives values 0 and scale 0.

    Source: module docstring (vllm-ascend indexer flow; ops-nn dynamic_quant kernels).

    Args:
        x: ``[T, d]`` bf16 / fp16 / fp32 with ``d % 128 == 0``.

    Returns:
        ``(values, scales)``: int8 ``[T, d]``, fp16 ``[T, d / 128]``.

    Raises:
        DTypeError / ShapeError: bad ``x`` (or ``d`` not a multiple of 128).
        NonFiniteInputError: NaN / Inf.
    """
    x = _rows(x, "x", min_width=INDEXER_GROUP)
    if x.shape[1] % INDEXER_GROUP:
        raise arg_error(ShapeError, "x", f"rows of a multiple of {INDEXER_GROUP} values", describe(x))
    x32 = real_to_f32(x, "x")
    _finite(x32, "x", "values")
    t, d = x32.shape
    q, s = quantize_per_token_multiplier(x32.reshape(t, d // INDEXER_GROUP, INDEXER_GROUP), INT8_MAX,
                                         scale_form="amax_times_inverse")
    return q.reshape(t, d), f32_to_f16(s)


def indexer_v2_geometry(d: int, block_size: int, row_bytes: int, block_stride: int = 0) -> dict[str, int]:
    """Byte geometry of the packed ``indexer_compress_epilog_v2`` cache (layout 2).

    Args:
        d: values per key (128 for DeepSeek-V4).
        block_size: the cache's dim 1 (rows per block).
        row_bytes: the cache's last dim ``D'``.
        block_stride: bytes between blocks; 0 means ``block_size * row_bytes``.

    Returns:
        ``{"scale_count", "block_stride", "scale_base", "value_row", "scale_row"}``: scales per
        row, bytes per block, the in-block offset of the scale region (``block_size * d``), and
        the value / scale bytes per row.

    Raises:
        ShapeError: the values and scales of a block do not fit ``block_stride`` bytes, or
        ``block_stride`` is below ``block_size * row_bytes``.
    """
    d, bs, rb, stride = (_check_int(n, v) for n, v in (("d", d), ("block_size", block_size),
                                                       ("row_bytes", row_bytes), ("block_stride", block_stride)))
    if d < 1 or bs < 1 or rb < 1 or stride < 0:
        raise arg_error(ShapeError, "d/block_size/row_bytes", "positive sizes", f"{d}/{bs}/{rb}/{stride}")
    scale_count = -(-d // INDEXER_GROUP)
    min_stride = bs * rb
    stride = stride or min_stride
    if stride < min_stride:
        raise arg_error(ShapeError, "block_stride", f"0 or at least block_size * D' = {min_stride}", stride)
    need = bs * (d + 4 * scale_count)
    if need > stride:
        raise arg_error(ShapeError, "row_bytes", f"room for {bs} rows of {d} fp8 values and {scale_count} fp32 "
                        f"scales ({need} bytes per block)", f"{rb} (block of {stride} bytes)")
    return {"scale_count": scale_count, "block_stride": stride, "scale_base": bs * d,
            "value_row": d, "scale_row": 4 * scale_count}


def indexer_v2_offsets(slots, d: int, block_size: int, row_bytes: int, block_stride: int = 0):
    """Flat byte offsets of each slot's values and scales in the packed v2 cache.

    Args:
        slots: flat slot ids (``block * block_size + offset``), int, >= 0, any shape.
        d, block_size, row_bytes, block_stride: as :func:`indexer_v2_geometry`.

    Returns:
        ``(value_offset, scale_offset)``: int64 arrays of ``slots``' shape: the first byte of the
        slot's ``d`` value bytes and of its ``4 * ceil(d / 128)`` scale bytes.
    """
    geo = indexer_v2_geometry(d, block_size, row_bytes, block_stride)
    s = np.asarray(slots, dtype=np.int64)
    if s.size and (s < 0).any():
        raise arg_error(ModeError, "slots", "slot ids >= 0 (-1 rows are skipped by the op, not addressed)",
                        describe(s))
    blk, off = s // block_size, s % block_size
    base = blk * geo["block_stride"]
    return base + off * d, base + geo["scale_base"] + off * geo["scale_row"]
