"""DeepSeek-V4's cache writers on NumPy arrays: the contracts (family ``v4_writers``).

``kv_compress_epilog`` (the SWA / compressed kv caches of the Ascend 950: fp8 rows with E8M0 or
fp32 scales, or HiF8), ``indexer_compress_epilog`` (cann-recipes-infer's ``torch.ops.custom``:
fp8 indexer keys and a separate scale tensor) and ``indexer_compress_epilog_v2`` (vllm-ascend's
``torch.ops._C_ascend``: one packed uint8 cache). Each quantizes the rows of ``x`` whose slot is
not -1 with the codecs of :mod:`ascend_emu.quant.v4` and writes them in place. Every check
(SoC, modes, shapes, dtypes, every slot, NaN / Inf in the values quantized, memory overlap)
runs before the first byte is written; a rejected call leaves every cache byte-identical.
docs/v4.md lists the choices below.

Sources (facts):

- vllm-ascend ``csrc/torch_binding.cpp`` (``kv_compress_epilog``: positional ``quant_group_size,
  quant_mode, round_scale_flag, layout``; a 4-D cache's dim 2 must be 1 and is squeezed; the
  row / block stride passed to the kernel is the cache's ``stride(0)``; x bf16 2-D; slot_mapping
  int32 / int64 ``[T]``; cache fp8 E4M3FN / E5M2), ``csrc/attention/kv_compress_epilog/``
  (``op_host/kv_compress_epilog_tiling_arch35.cpp``: quant_group_size 64 or 128 for MXFP8, row
  width, layout 2's ``valuePerToken`` / ``scalePerToken`` / block stride; ``op_kernel/
  kv_compress_epilog.h``: slot ``-1`` skipped, layout 1 rows at ``slot * stride(0)``, layout 2's
  offsets; the op is registered for ``ascend950`` only) and ``csrc/attention/
  indexer_compress_epilog_v2/`` (cache uint8 4-D ``[blocks, bs, 1, D']``, x fp16 / bf16,
  slot_mapping int32, ``layout`` 2 only, ``ascend950`` only);
- cann-recipes-infer ``ops/ascendc/docs/custom-npu_kv_compress_epilog.md`` (Ascend 950PR / 950DT
  only; x bf16 ``[T, d]``, slot ``-1`` skips; quant_group_size 64), its golden
  ``ops/ascendc/examples/test_npu_kv_compress_epilog.py`` (quant_mode 1 with group 128, quant_mode
  3 HiF8 with ``scale`` into a uint8 cache of ``d`` bytes a row) and ``ops/ascendc/src/
  kv_compress_epilog/`` (rows at ``slot * row width``); ``custom-npu_indexer_compress_epilog.md``
  (quant_mode 1: fp32 scales, 0: E8M0 scales; cache fp8 ``[T, d]``; scale ``[T, ceil(d / 128)]``;
  x fp16 / bf16; slot int32 in ``[-1, T)``) and ``ops/ascendc/src/indexer_compress_epilog/``.

Choices where the sources leave room (stricter than the hardware, never looser):

- SoC: every writer here is an Ascend 950 op; on another emulated SoC (:mod:`ascend_emu.soc`) the
  call is rejected first, with the hint to set ``ASCEND_EMU_SOC_NAME``.
- Slots (the one policy of the V4 writers, :func:`writer_slots`): ``-1`` skips the row (its x
  values are not read: padding rows may hold anything); any other value outside ``[0, rows)`` is
  rejected before anything is written; two rows with one slot: the last row wins, with
  :class:`~ascend_emu.errors.DuplicateSlotWarning` (an error in checked mode), as
  ``npu_scatter_pa_kv_cache``.
- ``kv_compress_epilog`` layout 1: the cache's last dim is the row width
  (:func:`~ascend_emu.quant.v4.kv_row_bytes`) and every dim between the first and the last is
  1 (``[N, W]``, ``[N, 1, W]``, ``[N, 1, 1, W]``): vllm-ascend's kernel writes row ``slot`` at
  ``slot * stride(0)``, the recipes' at ``slot * W``; the two agree on exactly these shapes (a
  paged ``[blocks, bs, 1, W]`` cache is rejected: view it as ``[-1, 1, W]``, as vllm-ascend
  does). Layout 2 (quant_mode 2 only; the kernel writes quant_mode 1 rows at ``slot * W`` into
  a layout-2 cache, which is no layout-2 cache: rejected): a 3-D ``[blocks, bs, D']`` or 4-D
  ``[blocks, bs, 1, D']`` fp8 cache whose blocks of ``bs * D'`` bytes hold ``bs`` tokens.
- ``quant_group_size``: quant_mode 2: 64 or 128 (vllm-ascend's kernel; the custom binding passes
  what it is given, its doc fixes 64); quant_mode 1: 128 (the kernel's only size); quant_mode 3
  has no groups: 64 or 128 (the schema default and the golden's value) accepted and ignored.
- ``round_scale_flag`` False: the kernel's ``roundScale = false`` template (quant/v4.py).
- ``scale``: quant_mode 3's multiplier; ``None`` (what the ``_C_ascend`` binding passes: its
  schema has no ``scale``) rejects quant_mode 3, which the vllm-ascend kernel does not have.
  Other quant_modes take only the default 1.0.
- ``indexer_compress_epilog``: ``scale`` (in the schema, not in the doc) only 1.0;
  ``round_scale`` honoured in quant_mode 0 and ignored in quant_mode 1 (doc: "only for MX");
  any ``d`` (the doc lists 4096; the kernel handles a short last group).
- NaN / Inf in the values quantized: rejected (quant/v4.py); the bf16 rope part is copied.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .. import soc
from ..errors import ModeError, NonFiniteInputError, ShapeError, arg_error, describe
from ..layouts import slots_from_cache_index
from ..quant import v4 as codec
from ._backend import get_backend
from ._check import (check_cache, check_call_bytes, check_disjoint, check_dtype, check_float, dtype_name, required,
                     warn_duplicates)

#: Element types of a kv_compress_epilog cache for quant_mode 1 / 2 (fp8) and 3 (HiF8 codes).
KV_FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")
KV_HIF8_DTYPE = "uint8"
#: x of kv_compress_epilog (both bindings check BF16); of the indexer writers (fp16 / bf16).
KV_X_DTYPES = ("bfloat16",)
INDEXER_X_DTYPES = ("float16", "bfloat16")
#: slot_mapping dtypes: kv_compress_epilog int32 / int64; the indexer writers int32.
KV_SLOT_DTYPES = ("int32", "int64")
INDEXER_SLOT_DTYPES = ("int32",)
#: kv_compress_epilog layouts: 1 (one row a slot), 2 (the paged split, quant_mode 2).
KV_LAYOUTS = (1, 2)
#: indexer_compress_epilog quant_mode: 1 fp32 scales, 0 E8M0 scales (MX).
INDEXER_QUANT_MODES = (0, 1)
INDEXER_SCALE_DTYPES = {1: "float32", 0: "float8_e8m0fnu"}
#: indexer_compress_epilog_v2's only layout.
INDEXER_V2_LAYOUT = 2
#: Bytes of working memory per x element a writer may take (fp32 copies, encoded rows).
_WORK_BYTES = 16


@dataclass(frozen=True)
class V4WriterArgs:
    """Validated arguments of one V4 cache writer call.

    Attributes:
        kind: ``"kv_rows"`` (kv_compress_epilog layout 1 / quant_mode 3), ``"kv_layout2"``,
            ``"indexer"`` (custom: values + scales) or ``"indexer_v2"`` (packed uint8).
        x: ``[T, d]`` (a 2-D view of the caller's x).
        tokens: int64 ``[L]`` rows of x to write (slot not -1; of duplicates the last).
        slots: int64 ``[L]`` their slots, all distinct and in range.
        cache: the caller's cache, written in place.
        scale_cache: the custom indexer's scale tensor, else None.
        quant_mode, group, round_scale, scale, fp8: the quant (``fp8``: the element type name).
        block_size, block_stride: layout 2 / v2 geometry (bytes), else 0.
    """

    kind: str
    x: np.ndarray
    tokens: np.ndarray
    slots: np.ndarray
    cache: np.ndarray
    scale_cache: np.ndarray | None
    quant_mode: int
    group: int
    round_scale: bool
    scale: float
    fp8: str
    block_size: int = 0
    block_stride: int = 0


class V4WriterOutputs(NamedTuple):
    """The caches written (the caller's arrays)."""

    caches: tuple


# ------------------------------------------------------------------------ shared checks
def require_ascend950_op(op: str) -> None:
    """Reject an Ascend 950-only op on another emulated SoC (first, before anything is read).

    Raises:
        ModeError: ``"<op>: an Ascend 950 op (...), not supported on this soc version <SoC>: set
            ASCEND_EMU_SOC_NAME=Ascend950PR_9599 to emulate one"``.
    """
    name = soc.soc_name()
    if not soc.is_ascend950(name):
        raise ModeError(f"{op}: an Ascend 950 op (its kernel is built for ascend950 only), not supported on this "
                        f"soc version {name}: set {soc.SOC_NAME_ENV}={soc.ASCEND950_EXAMPLE} to emulate one")


def _int(value, name: str, allowed: tuple) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise arg_error(ModeError, name, f"an int, one of {allowed}", describe(value))
    v = int(value)
    if v not in allowed:
        raise arg_error(ModeError, name, f"one of {allowed}", v)
    return v


def _bool(value, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise arg_error(ModeError, name, "a bool", describe(value))
    return bool(value)


def writer_slots(slot_mapping: np.ndarray, rows: int, name: str = "slot_mapping") -> tuple[np.ndarray, np.ndarray]:
    """The V4 writers' slot policy: which rows of x are written where.

    ``-1`` skips the row; any other value outside ``[0, rows)`` raises (before anything is
    written); a slot named twice is written by the last row naming it, with a
    :class:`~ascend_emu.errors.DuplicateSlotWarning` (checked mode: an error).

    Args:
        slot_mapping: integer ``[T]``.
        rows: slots the cache has.
        name: the argument's name for messages.

    Returns:
        ``(tokens, slots)``: int64 ``[L]`` row indices of x (increasing) and their distinct slots.

    Raises:
        DTypeError: not an integer array. IndexRangeError: a slot out of range (naming it).
    """
    slots = slots_from_cache_index(slot_mapping, rows, name=name)
    warn_duplicates(slots, name)
    live = np.flatnonzero(slots >= 0)
    s = slots[live]
    if s.size > 1:
        _, first_from_end = np.unique(s[::-1], return_index=True)
        keep = np.sort(s.size - 1 - first_from_end)
        live, s = live[keep], s[keep]
    return live.astype(np.int64), s.astype(np.int64)


def _slot_vector(slot_mapping, t: int, dtypes: tuple[str, ...]) -> np.ndarray:
    slot_mapping = required(slot_mapping, "slot_mapping")
    check_dtype(slot_mapping, "slot_mapping", dtypes)
    if slot_mapping.shape != (t,):
        raise arg_error(ShapeError, "slot_mapping", f"1-D [T] with T = {t} (x's rows)", f"shape {list(slot_mapping.shape)}")
    return slot_mapping


def _finite_rows(x: np.ndarray, tokens: np.ndarray, cols: int) -> None:
    """NaN / Inf in the quantized columns of the rows written: rejected (quant/v4.py)."""
    if not tokens.size or not cols:
        return
    part = x[tokens, :cols].astype(np.float32)
    bad = ~np.isfinite(part)
    if bad.any():
        i, c = (int(v) for v in np.argwhere(bad)[0])
        raise arg_error(NonFiniteInputError, "x", "finite values in the quantized columns of the rows written "
                        "(NaN / Inf have no defined bytes: docs/v4.md)", f"{part[i, c]!r} at x[{int(tokens[i])}, {c}]")


def _row_cache(cache: np.ndarray, width: int, what: str) -> int:
    """A cache of rows ``[N, (1, ...), width]``: returns N."""
    if cache.ndim < 2 or cache.shape[-1] != width or any(d != 1 for d in cache.shape[1:-1]):
        raise arg_error(ShapeError, "kv_compress_cache", f"[N, {width}] (or [N, 1, {width}], [N, 1, 1, {width}]): "
                        f"{what}; a paged [blocks, bs, 1, W] cache is addressed by stride(0) in layout 1: view it "
                        f"as [-1, 1, W]", f"shape {list(cache.shape)}")
    return int(cache.shape[0])


# ------------------------------------------------------------------------ kv_compress_epilog
def kv_compress_epilog(kv_compress_cache, x, slot_mapping, quant_group_size: int = 64, quant_mode: int = 2,
                       round_scale_flag: bool = True, layout: int = 1, scale: float | None = 1.0) -> None:
    """``kv_compress_epilog``: quantize x's rows and write them into the 950 kv cache, in place.

    For each row ``i`` with ``slot_mapping[i] != -1``: quant_mode 2 (E8M0 scales, the 640-byte
    row for d 512), 1 (fp32 scales) or 3 (HiF8 ``x * scale``) bytes of
    :func:`ascend_emu.quant.v4.encode_kv_rows`, written to row ``slot`` (layout 1) or split into
    the value and scale parts of a paged block (layout 2,
    :func:`ascend_emu.quant.v4.kv_layout2_geometry`). The other bytes are untouched.

    Args:
        kv_compress_cache: layout 1: fp8 E4M3FN / E5M2 (quant_mode 1 / 2) or uint8 HiF8
            (quant_mode 3) ``[N, W]`` / ``[N, 1, W]`` / ``[N, 1, 1, W]``, ``W`` the row width
            (640 for d 512; ``d`` for quant_mode 3); layout 2: fp8 ``[blocks, bs, D']`` or
            ``[blocks, bs, 1, D']`` with ``bs * D' >= bs * (d + 64 + roundup(scales, 8))``.
            C-contiguous, writable.
        x: bf16 ``[T, d]``, d > 64 (quant_mode 1 / 2; the last 64 values are the rope part).
        slot_mapping: int32 / int64 ``[T]``: row (layout 1) or ``block * bs + offset``
            (layout 2); -1 skips.
        quant_group_size: quant_mode 2: 64 or 128; quant_mode 1: 128; quant_mode 3: 64 / 128 (ignored).
        quant_mode: 1, 2 or 3 (3: ``scale`` required, layout 1).
        round_scale_flag: quant_mode 2's E8M0 rounding (False: the kernel's unrounded template).
        layout: 1 or 2 (2: quant_mode 2 only).
        scale: quant_mode 3's fp32 multiplier; None: the ``_C_ascend`` form (no quant_mode 3).

    Returns:
        None (the cache holds the result).

    Raises:
        ModeError: not an Ascend 950 SoC; a mode / group / layout / flag / scale other than above.
        DTypeError / ShapeError: dtypes or shapes other than the above, or overlapping arrays.
        IndexRangeError: a slot other than -1 outside the cache. NonFiniteInputError: NaN / Inf
        in a quantized value of a row written.

    Source: module docstring (vllm-ascend kernel and binding; cann-recipes-infer doc and golden).
    """
    require_ascend950_op("kv_compress_epilog")
    mode = _int(quant_mode, "quant_mode", codec.KV_QUANT_MODES)
    if mode == 3 and scale is None:
        raise arg_error(ModeError, "quant_mode", "1 or 2 (quant_mode 3, HiF8 with a scale, is the custom binding's; "
                        "this schema has no scale)", mode)
    lay = _int(layout, "layout", KV_LAYOUTS)
    round_scale = _bool(round_scale_flag, "round_scale_flag")
    if mode == 3:
        _int(quant_group_size, "quant_group_size", codec.KV_MX_GROUPS)  # no groups: accepted, ignored
        group = 0
        if lay != 1:
            raise arg_error(ModeError, "layout", "1 for quant_mode 3 (HiF8 rows of d bytes)", lay)
    else:
        group = codec.kv_group_size(mode, quant_group_size)
        if lay == 2 and mode != 2:
            raise arg_error(ModeError, "layout", "1 for quant_mode 1 (the kernel writes layout 2 for quant_mode 2 "
                            "only)", lay)
    if scale is None:
        value = 1.0
    else:
        value = check_float(scale, "scale")
        if mode != 3 and value != 1.0:
            raise arg_error(ModeError, "scale", "1.0 outside quant_mode 3 (only HiF8 rows are scaled)", value)
    x = required(x, "x")
    check_dtype(x, "x", KV_X_DTYPES)
    min_d = 1 if mode == 3 else codec.KV_ROPE_DIM + 1
    if x.ndim != 2 or x.shape[1] < min_d or x.shape[0] < 1:
        raise arg_error(ShapeError, "x", f"2-D [T, d] with T >= 1 and d >= {min_d}", f"shape {list(x.shape)}")
    t, d = x.shape
    slot_mapping = _slot_vector(slot_mapping, t, KV_SLOT_DTYPES)
    cache = required(kv_compress_cache, "kv_compress_cache")
    check_dtype(cache, "kv_compress_cache", (KV_HIF8_DTYPE,) if mode == 3 else KV_FP8_DTYPES)
    check_cache(cache, "kv_compress_cache")
    block_size = block_stride = 0
    if lay == 1:
        width = codec.kv_row_bytes(d, mode, group or None)
        rows = _row_cache(cache, width, f"rows of {width} bytes (d {d}, quant_mode {mode})")
        kind = "kv_rows"
    else:
        if cache.ndim not in (3, 4) or (cache.ndim == 4 and cache.shape[2] != 1):
            raise arg_error(ShapeError, "kv_compress_cache", "[blocks, bs, D'] or [blocks, bs, 1, D'] (layout 2)",
                            f"shape {list(cache.shape)}")
        block_size = int(cache.shape[1])
        block_stride = int(cache.shape[1]) * int(cache.shape[-1])
        codec.kv_layout2_geometry(d, block_size, block_stride, group)
        rows = int(cache.shape[0]) * block_size
        kind = "kv_layout2"
    check_call_bytes(x, "x", _WORK_BYTES)
    check_disjoint([("kv_compress_cache", cache)], [("x", x), ("slot_mapping", slot_mapping)])
    tokens, slots = writer_slots(slot_mapping, rows)
    _finite_rows(x, tokens, 0 if mode == 3 else d - codec.KV_ROPE_DIM)
    get_backend().v4_writer(V4WriterArgs(kind, x, tokens, slots, cache, None, mode, group, round_scale, value,
                                         "hifloat8" if mode == 3 else dtype_name(cache.dtype), block_size,
                                         block_stride))


# ------------------------------------------------------------------------ indexer_compress_epilog
def indexer_compress_epilog(indexer_compress_cache, indexer_compress_scale, x, slot_mapping, quant_mode: int = 1,
                            round_scale: bool = True, scale: float = 1.0) -> None:
    """``indexer_compress_epilog`` (cann-recipes-infer ``custom``): fp8 indexer keys and their
    scales, written in place into two tensors.

    For each row ``i`` with ``slot_mapping[i] != -1``: quant_mode 1:
    :func:`ascend_emu.quant.v4.indexer_quant_fp8` (fp32 scale per 128 values); quant_mode 0:
    :func:`ascend_emu.quant.v4.indexer_quant_mx` (E8M0 per 128 values); the values to
    ``indexer_compress_cache[slot]``, the scales to ``indexer_compress_scale[slot]``.

    Args:
        indexer_compress_cache: fp8 E4M3FN / E5M2 ``[N, d]`` (or ``[N, 1, d]``), C-contiguous.
        indexer_compress_scale: ``[N, ceil(d / 128)]`` (or ``[N, 1, ...]``): fp32 (quant_mode 1)
            or ``float8_e8m0fnu`` (quant_mode 0), C-contiguous.
        x: fp16 / bf16 ``[T, d]``.
        slot_mapping: int32 ``[T]``, in ``[-1, N)``.
        quant_mode: 1 or 0.
        round_scale: quant_mode 0's E8M0 rounding (ignored by quant_mode 1).
        scale: only 1.0 (the doc does not define it).

    Returns:
        None.

    Raises:
        ModeError / DTypeError / ShapeError / IndexRangeError / NonFiniteInputError: as
        :func:`kv_compress_epilog`.

    Source: cann-recipes-infer ``custom-npu_indexer_compress_epilog.md`` and its kernel.
    """
    require_ascend950_op("indexer_compress_epilog")
    mode = _int(quant_mode, "quant_mode", INDEXER_QUANT_MODES)
    rs = _bool(round_scale, "round_scale")
    if check_float(scale, "scale") != 1.0:
        raise arg_error(ModeError, "scale", "1.0 (the doc does not define another value)", scale)
    x = required(x, "x")
    check_dtype(x, "x", INDEXER_X_DTYPES)
    if x.ndim != 2 or min(x.shape) < 1:
        raise arg_error(ShapeError, "x", "2-D [T, d] with T, d >= 1", f"shape {list(x.shape)}")
    t, d = x.shape
    slot_mapping = _slot_vector(slot_mapping, t, INDEXER_SLOT_DTYPES)
    cache = required(indexer_compress_cache, "indexer_compress_cache")
    sc = required(indexer_compress_scale, "indexer_compress_scale")
    check_dtype(cache, "indexer_compress_cache", codec.INDEXER_FP8_DTYPES)
    check_dtype(sc, "indexer_compress_scale", (INDEXER_SCALE_DTYPES[mode],))
    n_scale = math.ceil(d / codec.INDEXER_GROUP)
    for name, a, w in (("indexer_compress_cache", cache, d), ("indexer_compress_scale", sc, n_scale)):
        if a.ndim not in (2, 3) or a.shape[-1] != w or (a.ndim == 3 and a.shape[1] != 1):
            raise arg_error(ShapeError, name, f"[N, {w}] (or [N, 1, {w}])", f"shape {list(a.shape)}")
        check_cache(a, name)
    if sc.shape[0] != cache.shape[0]:
        raise arg_error(ShapeError, "indexer_compress_scale", f"{cache.shape[0]} rows (indexer_compress_cache's)",
                        f"shape {list(sc.shape)}")
    check_call_bytes(x, "x", _WORK_BYTES)
    check_disjoint([("indexer_compress_cache", cache), ("indexer_compress_scale", sc)],
                   [("x", x), ("slot_mapping", slot_mapping)])
    tokens, slots = writer_slots(slot_mapping, int(cache.shape[0]))
    _finite_rows(x, tokens, d)
    get_backend().v4_writer(V4WriterArgs("indexer", x, tokens, slots, cache, sc, mode, codec.INDEXER_GROUP, rs, 1.0,
                                         dtype_name(cache.dtype)))


def indexer_compress_epilog_v2(indexer_compress_cache, x, slot_mapping, layout: int = 2) -> None:
    """``indexer_compress_epilog_v2`` (vllm-ascend ``_C_ascend``): fp8 E4M3FN indexer keys and
    fp32 scales in one packed uint8 paged cache, in place.

    For each row ``i`` with ``slot_mapping[i] != -1``: :func:`ascend_emu.quant.v4.indexer_quant_fp8`,
    the ``d`` value bytes and ``4 * ceil(d / 128)`` scale bytes at the offsets of
    :func:`ascend_emu.quant.v4.indexer_v2_offsets` (a block: all its value rows, then all its
    scale rows).

    Args:
        indexer_compress_cache: uint8 ``[blocks, bs, 1, D']``, C-contiguous, with
            ``bs * (d + 4 * ceil(d / 128)) <= bs * D'``.
        x: fp16 / bf16 ``[..., d]`` with ``T`` rows in all (``[T, d]``, ``[T, 1, d]``).
        slot_mapping: int32 ``[T]``: ``block * bs + offset``; -1 skips.
        layout: 2 (the only layout).

    Returns:
        None.

    Raises:
        as :func:`kv_compress_epilog`.

    Source: vllm-ascend ``csrc/attention/indexer_compress_epilog_v2/`` (tiling, ``_single_row.h``).
    """
    require_ascend950_op("indexer_compress_epilog_v2")
    _int(layout, "layout", (INDEXER_V2_LAYOUT,))
    x = required(x, "x")
    check_dtype(x, "x", INDEXER_X_DTYPES)
    if x.ndim < 2 or x.shape[-1] < 1 or x.size == 0:
        raise arg_error(ShapeError, "x", "[..., d] with at least one row and d >= 1", f"shape {list(x.shape)}")
    d = int(x.shape[-1])
    t = x.size // d
    slot_mapping = _slot_vector(slot_mapping, t, INDEXER_SLOT_DTYPES)
    cache = required(indexer_compress_cache, "indexer_compress_cache")
    check_dtype(cache, "indexer_compress_cache", ("uint8",))
    if cache.ndim != 4 or cache.shape[2] != 1:
        raise arg_error(ShapeError, "indexer_compress_cache", "4-D [blocks, bs, 1, D'] uint8 (the kernel's only rank)",
                        f"shape {list(cache.shape)}")
    check_cache(cache, "indexer_compress_cache")
    bs, row_bytes = int(cache.shape[1]), int(cache.shape[3])
    codec.indexer_v2_geometry(d, bs, row_bytes)
    x2 = x.reshape(t, d)
    check_call_bytes(x2, "x", _WORK_BYTES)
    check_disjoint([("indexer_compress_cache", cache)], [("x", x), ("slot_mapping", slot_mapping)])
    tokens, slots = writer_slots(slot_mapping, int(cache.shape[0]) * bs)
    _finite_rows(x2, tokens, d)
    get_backend().v4_writer(V4WriterArgs("indexer_v2", x2, tokens, slots, cache, None, 1, codec.INDEXER_GROUP, True,
                                         1.0, "float8_e4m3fn", bs, bs * row_bytes))
