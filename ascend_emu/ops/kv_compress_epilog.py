"""DeepSeek-V4's ``kv_compress_epilog`` on NumPy arrays: the contract (family ``kv_compress_epilog``).

The writer of the Ascend 950's SWA and compressed kv caches (fp8 rows with E8M0 or fp32
scales, or HiF8 rows): it quantizes the rows of ``x`` whose slot is not -1 with the codecs of
:mod:`ascend_emu.quant.v4` and writes them in place. Every check (SoC, modes, shapes, dtypes,
every slot, NaN / Inf in the values quantized, memory overlap) runs before the first byte is
written; a rejected call leaves the cache byte-identical. The indexer writers are
:mod:`.indexer_compress_epilog`; the shared pieces (slot policy, SoC gate) :mod:`._v4_writers`.
docs/v4.md lists the choices below.

Sources (facts; docs/sources.md#kv_compress_epilog):

- vllm-ascend ``csrc/torch_binding.cpp`` (``kv_compress_epilog``: positional ``quant_group_size,
  quant_mode, round_scale_flag, layout``; a 4-D cache's dim 2 must be 1 and is squeezed; the
  row / block stride passed to the kernel is the cache's ``stride(0)``; x bf16 2-D; slot_mapping
  int32 / int64 ``[T]``; cache fp8 E4M3FN / E5M2), ``csrc/attention/kv_compress_epilog/``
  (``op_host/kv_compress_epilog_tiling_arch35.cpp``: quant_group_size 64 or 128 for MXFP8, row
  width, layout 2's ``valuePerToken`` / ``scalePerToken`` / block stride; ``op_kernel/
  kv_compress_epilog.h``: slot ``-1`` skipped, layout 1 rows at ``slot * stride(0)``, layout 2's
  offsets; the op is registered for ``ascend950`` only);
- cann-recipes-infer ``ops/ascendc/docs/custom-npu_kv_compress_epilog.md`` (Ascend 950PR / 950DT
  only; x bf16 ``[T, d]``, slot ``-1`` skips; quant_group_size 64), its golden
  ``ops/ascendc/examples/test_npu_kv_compress_epilog.py`` (quant_mode 1 with group 128, quant_mode
  3 HiF8 with ``scale`` into a uint8 cache of ``d`` bytes a row) and ``ops/ascendc/src/
  kv_compress_epilog/`` (rows at ``slot * row width``).

Choices where the sources leave room (stricter than the hardware, never looser):

- SoC: an Ascend 950 op; on another emulated SoC (:mod:`ascend_emu.soc`) the call is rejected
  first, with the hint to set ``ASCEND_EMU_SOC_NAME``.
- Slots: the V4 writers' one policy (:func:`._v4_writers.writer_slots`: -1 skips without reading
  the row, other out-of-range values rejected, duplicates last-wins with a warning).
- ``kv_compress_epilog`` layout 1: the cache's last dim is the row width
  (:func:`~ascend_emu.quant.v4.kv_row_bytes`) and every dim between the first and the last is
  1 (``[N, W]``, ``[N, 1, W]``, ``[N, 1, 1, W]``): vllm-ascend's kernel writes row ``slot`` at
  ``slot * stride(0)``, the recipes' at ``slot * W``; the two agree on exactly these shapes (a
  paged ``[blocks, bs, 1, W]`` cache is rejected: view it as ``[-1, 1, W]``, as vllm-ascend
  does). Layout 2 (quant_mode 2 only; the kernel writes quant_mode 1 rows at ``slot * W`` into
  a layout-2 cache, which is no layout-2 cache: rejected): a 3-D ``[blocks, bs, D']`` or 4-D
  ``[blocks, bs, 1, D']`` fp8 cache whose blocks of ``bs * D'`` bytes hold ``bs`` tokens.
- Two kernels, told apart by ``scale``: None is vllm-ascend's (what the ``_C_ascend`` binding
  passes: its schema has no ``scale``), a float the recipes' (the ``custom`` schema's default is
  1.0). ``quant_group_size``: quant_mode 2: 64, or 128 with vllm-ascend's kernel (its tiling takes
  64 or 128; the recipes' kernel groups by 64 whatever it is given and its doc fixes 64, so 128
  with a scale is rejected); quant_mode 1: 128 (the kernels' only size); quant_mode 3 has no
  groups: 64 or 128 (the schema default and the golden's value) accepted and ignored.
  Layout 2 is vllm-ascend's only; quant_mode 3 the recipes' only.
- ``round_scale_flag`` False: the kernel's ``roundScale = false`` template (quant/v4.py).
- ``scale``: quant_mode 3's multiplier; other quant_modes take only 1.0.
- NaN / Inf in the values quantized: rejected (quant/v4.py); the bf16 rope part is copied.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..errors import ModeError, ShapeError, arg_error
from ..layouts import CacheLayout
from ..quant import v4 as codec
from ..soc import require_ascend950_op
from ._check import (ValidatedSignatures, check_cache, check_call_bytes, check_disjoint, check_dtype, check_float,
                     dtype_name, required, trusted)
from ._v4_writers import (WORK_BYTES, V4WriterArgs, check_bool, check_index_bytes, check_int, plan_rows, row_layout,
                          run_writer, slot_vector)

#: Element types of a kv_compress_epilog cache for quant_mode 1 / 2 (fp8) and 3 (HiF8 codes).
KV_FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")
KV_HIF8_DTYPE = "uint8"
#: x (both bindings check BF16); slot_mapping (int32 / int64).
KV_X_DTYPES = ("bfloat16",)
KV_SLOT_DTYPES = ("int32", "int64")
#: layouts: 1 (one row a slot), 2 (the paged split, quant_mode 2).
KV_LAYOUTS = (1, 2)


def _row_cache(cache: np.ndarray, width: int, what: str) -> int:
    """A cache of rows ``[N, (1, ...), width]``: returns N."""
    if cache.ndim < 2 or cache.shape[-1] != width or any(d != 1 for d in cache.shape[1:-1]):
        raise arg_error(ShapeError, "kv_compress_cache", f"[N, {width}] (or [N, 1, {width}], [N, 1, 1, {width}]): "
                        f"{what}; a paged [blocks, bs, 1, W] cache is addressed by stride(0) in layout 1: view it "
                        f"as [-1, 1, W]", f"shape {list(cache.shape)}")
    return int(cache.shape[0])




def kv_compress_epilog(kv_compress_cache, x, slot_mapping, quant_group_size: int = 64, quant_mode: int = 2,
                       round_scale_flag: bool = True, layout: int = 1, scale: float | None = None) -> None:
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
        quant_group_size: quant_mode 2: 64, or 128 without ``scale``; quant_mode 1: 128;
            quant_mode 3: 64 / 128 (ignored).
        quant_mode: 1, 2 or 3 (3: ``scale`` required, layout 1).
        round_scale_flag: quant_mode 2's E8M0 rounding (False: the kernel's unrounded template).
        layout: 1 or 2 (2: quant_mode 2, without ``scale``).
        scale: None: vllm-ascend's kernel (the ``_C_ascend`` form: quant_mode 1 / 2, groups 64 /
            128, layouts 1 / 2); a float: cann-recipes-infer's (the ``custom`` form, whose schema
            default is 1.0: quant_mode 1 / 2 / 3, group 64, layout 1), the fp32 multiplier of
            quant_mode 3 and 1.0 otherwise.

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
    key, st, known = _VALIDATED.lookup((kv_compress_cache, x, slot_mapping, quant_group_size, quant_mode,
                                        round_scale_flag, layout, scale), _kv_static)
    cache, x, slot_mapping = kv_compress_cache, x, slot_mapping
    if not known:  # a known signature: plain native arrays, as required() leaves them
        cache, x, slot_mapping = required(cache, "kv_compress_cache"), required(x, "x"), required(slot_mapping,
                                                                                                  "slot_mapping")
    check_disjoint([("kv_compress_cache", cache)], [("x", x), ("slot_mapping", slot_mapping)])
    tokens, slots = plan_rows(slot_mapping, st.rows, x, st.cols)
    if not known:
        _VALIDATED.put(key, st)
    args = trusted(V4WriterArgs, kind=st.kind, x=x, tokens=tokens, slots=slots, cache=cache, scale_cache=None,
                   quant_mode=st.mode, group=st.group, round_scale=st.round_scale, scale=st.value, fp8=st.fp8,
                   block_size=st.block_size, block_stride=st.block_stride)
    run_writer("kv_compress_epilog", "kv_compress_epilog", args, ("cache",), (st.layout,))


class _KvStatic(NamedTuple):
    """What :func:`_kv_static` derives of a call signature (:class:`~._check.ValidatedSignatures`)."""

    kind: str
    mode: int
    group: int
    round_scale: bool
    value: float
    fp8: str
    rows: int
    cols: int
    block_size: int
    block_stride: int
    layout: CacheLayout


#: Call signatures of kv_compress_epilog whose static checks passed.
_VALIDATED = ValidatedSignatures()


def _kv_static(kv_compress_cache, x, slot_mapping, quant_group_size, quant_mode, round_scale_flag, layout,
               scale) -> _KvStatic:
    """Every check of :func:`kv_compress_epilog` that reads no value or address (modes, dtypes,
    shapes, flags, size bounds), in the op's order; raises as the op documents."""
    mode = check_int(quant_mode, "quant_mode", codec.KV_QUANT_MODES)
    if mode == 3 and scale is None:
        raise arg_error(ModeError, "quant_mode", "1 or 2 (quant_mode 3, HiF8 with a scale, is the recipes' kernel: "
                        "custom.kv_compress_epilog; vllm-ascend's has no scale)", mode)
    lay = check_int(layout, "layout", KV_LAYOUTS)
    if lay == 2 and scale is not None:
        raise arg_error(ModeError, "layout", "1 with scale (the recipes' kernel, custom.kv_compress_epilog, writes "
                        "layout 1 only; layout 2 is vllm-ascend's, without scale)", lay)
    round_scale = check_bool(round_scale_flag, "round_scale_flag")
    if mode == 3:
        check_int(quant_group_size, "quant_group_size", codec.KV_MX_GROUPS)  # no groups: accepted, ignored
        group = 0
        if lay != 1:
            raise arg_error(ModeError, "layout", "1 for quant_mode 3 (HiF8 rows of d bytes)", lay)
    else:
        group = codec.kv_group_size(mode, quant_group_size)
        if group != codec.KV_MX_GROUP and mode == 2 and scale is not None:
            raise arg_error(ModeError, "quant_group_size", f"{codec.KV_MX_GROUP} with scale (the recipes' kernel, "
                            "custom.kv_compress_epilog, groups quant_mode 2 by 64 whatever it is given; 128 is "
                            "vllm-ascend's, without scale)", group)
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
    slot_mapping = slot_vector(slot_mapping, t, KV_SLOT_DTYPES)
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
    check_call_bytes(x, "x", WORK_BYTES)
    check_index_bytes(slot_mapping)
    return _KvStatic(kind, mode, group, round_scale, value, "hifloat8" if mode == 3 else dtype_name(cache.dtype),
                     rows, 0 if mode == 3 else d - codec.KV_ROPE_DIM, block_size, block_stride,
                     row_layout(rows, cache.nbytes // max(rows, 1)))
