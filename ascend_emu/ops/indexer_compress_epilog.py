"""DeepSeek-V4's indexer key writers on NumPy arrays: the contracts (family ``indexer_compress_epilog``).

``indexer_compress_epilog`` (cann-recipes-infer's ``torch.ops.custom``: fp8 keys into one tensor,
their fp32 or E8M0 scales into another) and ``indexer_compress_epilog_v2`` (vllm-ascend's
``torch.ops._C_ascend``: keys and fp32 scales in one packed uint8 paged cache). Each quantizes
the rows of ``x`` whose slot is not -1 (:mod:`ascend_emu.quant.v4`) and writes them in place;
every check runs before the first byte is written. Shared pieces: :mod:`._v4_writers`.

Sources (facts; docs/sources.md#kv_compress_epilog):

- cann-recipes-infer ``ops/ascendc/docs/custom-npu_indexer_compress_epilog.md`` (Ascend 950PR /
  950DT only; quant_mode 1: fp32 scales, 0: E8M0 scales; cache fp8 E4M3FN / E5M2 ``[T, d]``;
  scale ``[T, ceil(d / 128)]``; x fp16 / bf16; slot int32 in ``[-1, T)``; ``round_scale`` only
  for MX) and ``ops/ascendc/src/indexer_compress_epilog/`` (the quant, per cache type);
- vllm-ascend ``csrc/torch_binding.cpp`` (``indexer_compress_epilog_v2(cache, x, slot_mapping,
  layout=2)``, block stride ``cache.stride(0)``) and ``csrc/attention/indexer_compress_epilog_v2/``
  (cache uint8 4-D ``[blocks, bs, 1, D']``, x fp16 / bf16, slot_mapping int32, ``layout`` 2 only,
  ``ascend950`` only; the packed offsets).

Choices (stricter than the hardware, never looser): slots as every V4 writer
(:func:`._v4_writers.writer_slots`); ``indexer_compress_epilog``'s ``scale`` (in the schema, not
in the doc; the kernel's HiF8 mode is not documented) only 1.0, quant_mode 0 or 1 only;
``round_scale`` honoured in quant_mode 0 and ignored in quant_mode 1 (doc: "only for MX"); any
``d`` (the doc lists 4096; the kernel handles a short last group); cache and scale ``[N, w]`` or
``[N, 1, w]``. ``_v2``: x ``[..., d]`` with ``T`` rows in all, slot_mapping 1-D ``[T]``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from ..errors import ModeError, ShapeError, arg_error
from ..quant import v4 as codec
from ..soc import require_ascend950_op
from ._check import (ValidatedSignatures, check_cache, check_call_bytes, check_disjoint, check_dtype, check_float,
                     dtype_name, required, trusted)
from ._v4_writers import (WORK_BYTES, V4WriterArgs, check_bool, check_index_bytes, check_int, plan_rows, row_layout,
                          run_writer, slot_vector)

#: x dtypes (fp16 / bf16) and slot_mapping dtype (int32) of both indexer writers.
INDEXER_X_DTYPES = ("float16", "bfloat16")
INDEXER_SLOT_DTYPES = ("int32",)
#: indexer_compress_epilog quant_mode: 1 fp32 scales, 0 E8M0 scales (MX); the scale dtypes.
INDEXER_QUANT_MODES = (0, 1)
INDEXER_SCALE_DTYPES = {1: "float32", 0: "float8_e8m0fnu"}
#: indexer_compress_epilog_v2's only layout.
INDEXER_V2_LAYOUT = 2


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
    key, st, known = _VALIDATED_V1.lookup((indexer_compress_cache, indexer_compress_scale, x, slot_mapping, quant_mode,
                                           round_scale, scale), _v1_static)
    cache, sc, slot_mapping = indexer_compress_cache, indexer_compress_scale, slot_mapping
    if not known:  # a known signature: plain native arrays, as required() leaves them
        cache, sc = required(cache, "indexer_compress_cache"), required(sc, "indexer_compress_scale")
        x, slot_mapping = required(x, "x"), required(slot_mapping, "slot_mapping")
    check_disjoint([("indexer_compress_cache", cache), ("indexer_compress_scale", sc)],
                   [("x", x), ("slot_mapping", slot_mapping)])
    tokens, slots = plan_rows(slot_mapping, st.rows, x, st.cols)
    if not known:
        _VALIDATED_V1.put(key, st)
    args = trusted(V4WriterArgs, kind="indexer", x=x, tokens=tokens, slots=slots, cache=cache, scale_cache=sc,
                   quant_mode=st.mode, group=codec.INDEXER_GROUP, round_scale=st.round_scale, scale=1.0, fp8=st.fp8,
                   block_size=0, block_stride=0)
    run_writer("indexer_compress_epilog", "indexer_compress_epilog", args, ("cache", "scale_cache"), st.layouts)


class _IndexerStatic(NamedTuple):
    """What the indexer writers' static checks derive of a call signature."""

    mode: int
    round_scale: bool
    fp8: str
    rows: int
    cols: int
    block_size: int
    row_bytes: int
    layouts: tuple


#: Call signatures of each indexer writer whose static checks passed.
_VALIDATED_V1 = ValidatedSignatures()
_VALIDATED_V2 = ValidatedSignatures()


def _v1_static(indexer_compress_cache, indexer_compress_scale, x, slot_mapping, quant_mode, round_scale,
               scale) -> _IndexerStatic:
    """Every check of :func:`indexer_compress_epilog` that reads no value or address, in the op's
    order; raises as the op documents."""
    mode = check_int(quant_mode, "quant_mode", INDEXER_QUANT_MODES)
    rs = check_bool(round_scale, "round_scale")
    if check_float(scale, "scale") != 1.0:
        raise arg_error(ModeError, "scale", "1.0 (the doc does not define another value)", scale)
    x = required(x, "x")
    check_dtype(x, "x", INDEXER_X_DTYPES)
    if x.ndim != 2 or min(x.shape) < 1:
        raise arg_error(ShapeError, "x", "2-D [T, d] with T, d >= 1", f"shape {list(x.shape)}")
    t, d = x.shape
    slot_mapping = slot_vector(slot_mapping, t, INDEXER_SLOT_DTYPES)
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
    check_call_bytes(x, "x", WORK_BYTES)
    check_index_bytes(slot_mapping)
    n = int(cache.shape[0])
    return _IndexerStatic(mode, rs, dtype_name(cache.dtype), n, d, 0, 0,
                          (row_layout(n, cache.nbytes // max(n, 1)), row_layout(n, sc.nbytes // max(n, 1))))


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
    key, st, known = _VALIDATED_V2.lookup((indexer_compress_cache, x, slot_mapping, layout), _v2_static)
    cache = indexer_compress_cache
    if not known:  # a known signature: plain native arrays, as required() leaves them
        cache, x, slot_mapping = (required(cache, "indexer_compress_cache"), required(x, "x"),
                                  required(slot_mapping, "slot_mapping"))
    check_disjoint([("indexer_compress_cache", cache)], [("x", x), ("slot_mapping", slot_mapping)])
    x2 = x.reshape(-1, st.cols)
    tokens, slots = plan_rows(slot_mapping, st.rows, x2, st.cols)
    if not known:
        _VALIDATED_V2.put(key, st)
    args = trusted(V4WriterArgs, kind="indexer_v2", x=x2, tokens=tokens, slots=slots, cache=cache, scale_cache=None,
                   quant_mode=1, group=codec.INDEXER_GROUP, round_scale=True, scale=1.0, fp8="float8_e4m3fn",
                   block_size=st.block_size, block_stride=st.block_size * st.row_bytes)
    run_writer("indexer_compress_epilog_v2", "indexer_compress_epilog", args, ("cache",), st.layouts)


def _v2_static(indexer_compress_cache, x, slot_mapping, layout) -> _IndexerStatic:
    """Every check of :func:`indexer_compress_epilog_v2` that reads no value or address, in the
    op's order; raises as the op documents."""
    check_int(layout, "layout", (INDEXER_V2_LAYOUT,))
    x = required(x, "x")
    check_dtype(x, "x", INDEXER_X_DTYPES)
    if x.ndim < 2 or x.shape[-1] < 1 or x.size == 0:
        raise arg_error(ShapeError, "x", "[..., d] with at least one row and d >= 1", f"shape {list(x.shape)}")
    d = int(x.shape[-1])
    t = x.size // d
    slot_mapping = slot_vector(slot_mapping, t, INDEXER_SLOT_DTYPES)
    cache = required(indexer_compress_cache, "indexer_compress_cache")
    check_dtype(cache, "indexer_compress_cache", ("uint8",))
    if cache.ndim != 4 or cache.shape[2] != 1:
        raise arg_error(ShapeError, "indexer_compress_cache", "4-D [blocks, bs, 1, D'] uint8 (the kernel's only rank)",
                        f"shape {list(cache.shape)}")
    check_cache(cache, "indexer_compress_cache")
    bs, row_bytes = int(cache.shape[1]), int(cache.shape[3])
    codec.indexer_v2_geometry(d, bs, row_bytes)
    x2 = x.reshape(t, d)
    check_call_bytes(x2, "x", WORK_BYTES)
    check_index_bytes(slot_mapping)
    rows = int(cache.shape[0]) * bs
    return _IndexerStatic(1, True, "float8_e4m3fn", rows, d, bs, row_bytes, (row_layout(rows, row_bytes),))
