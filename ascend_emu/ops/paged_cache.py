"""``torch_npu.npu_scatter_pa_kv_cache`` and ``torch_npu.npu_gather_pa_kv_cache`` on NumPy arrays:
the contract of the ``paged_cache`` family (pure data movement, byte-exact).

Sources (read for facts, nothing copied):

- Ascend/op-plugin ``docs/zh/custom_APIs/torch_npu/torch_npu-npu_scatter_pa_kv_cache.md``
  (scenarios, dtypes, constraints); its golden ``test/test_custom_ops/test_scatter_pa_kv_cache.py``
  (``supported_op_exec``: PA_NZ, token row cut into ``last_dim`` pieces, piece ``k`` at
  ``cache[block][k][row]``; ``supported_op_exec_nd``: Norm, ``cache[block][row] = key[i]``;
  ``slot < 0`` skipped); ``op_plugin/ops/opapi/ScatterPaKvCacheNpuOpApi.cpp`` (scatter_mode
  ``"None"`` always; the ``_functional`` variant clones the caches, contiguous, and writes the
  clones).
- ops-transformer ``attention/scatter_pa_kv_cache/docs/aclnnScatterPaKvCache.md`` (English
  edition): PA_NZ caches 4-D ``[num_blocks, N*D // C0, block_size, C0]`` or 5-D
  ``[num_blocks, N, D // C0, block_size, C0]`` (the same bytes; vllm-ascend's
  ``AscendAttentionBackendImpl._nz_5d_view`` passes the 5-D view); k and v head sizes may
  differ; PA_NZ ``block_size < UINT16_MAX``; A2 / A3 dtypes fp16 / bf16 / int8.
- ops-transformer ``attention/gather_pa_kv_cache/docs/aclnnGatherPaKvCache.md`` (shapes per
  cache mode, block_tables / seq_lens / seq_offset int32 on A2 / A3, ``keyRef[dim0]`` =
  ``sum(seqLens)`` or ``seqLens[-1]`` for cumulative sums whose first value is 0, block start
  ``seqOffset[i] / block_size``); op-plugin ``op_plugin/ops/opapi/GatherPaKvCacheKernelNpuOpApi.cpp``
  (no cache_mode argument: ``PA_NZ`` when ``key_cache`` is FRACTAL_NZ, else ``Norm``; the
  ``_functional`` variant clones key / value and writes the clones) and the golden of
  ``test/test_custom_ops/test_npu_gather_pa_kv_cache.py`` (token ``j`` of batch ``i`` from block
  ``block_tables[i, seq_offset[i] // block_size + j // block_size]``, row ``j % block_size``).
- torch_npu 2.14's schemas (``npu_native_functions_by_codegen.yaml`` lines 771-781) and meta
  functions (``npu_scatter_pa_kv_cache_functional_meta``: caches like the inputs;
  ``npu_gather_pa_kv_cache_functional_meta``: key / value like the inputs).

The layouts are the paged-cache layouts of :mod:`ascend_emu.layouts` (one definition):
``Norm`` here is a ``[num_blocks, block_size, N, D]`` cache, i.e. :class:`CacheLayout` mode
``PA_BSND`` with ``N`` heads; ``PA_NZ`` is :class:`CacheLayout` mode ``PA_NZ`` with the token's
``N * D`` elements as one row (C0 = :data:`ascend_emu.layouts.NZ_ROW_BYTES` / itemsize, :attr:`CacheLayout.c0`).
A slot is ``block * block_size + row``.

Choices where the sources leave room (stricter than the hardware, never looser):

- scatter: only the doc's scenario 1 (PA_NZ) and 2 (Norm): key / value 3-D. The compressed
  scenario (4-D key with ``compress_lens`` / ``seq_lens`` / ``compress_seq_offsets``) is
  rejected: the docs give its shapes and a capacity formula but not where each compressed token
  is written, so it cannot be emulated faithfully. A non-None value of any of the three is a
  ModeError naming it.
- ``slot_mapping`` -1 skips the token (vLLM's pad slot; the golden skips every negative slot);
  other negative values, and slots >= ``num_blocks * block_size``, are rejected before anything
  is written (IndexRangeError naming ``slot_mapping``). Duplicate slots (undefined per the doc)
  warn; the last token wins.
- A ``Norm`` cache must be ND (a FRACTAL_NZ-cast ``[nb, bs, N, D]`` tensor's storage is not the
  ND memory the kernel addresses): FormatError. A ``PA_NZ`` cache may be FRACTAL_NZ-cast or not:
  with its last dim C0 and a block_size that is a multiple of 16 (required,
  :func:`ascend_emu.layouts.check_block_size`) both hold the same bytes.
- gather: block ids and the block-table columns the tokens need are validated (IndexRangeError
  naming ``block_tables[b, j]``, or ShapeError naming ``seq_lens`` / ``seq_offset`` when a
  sequence runs past the table); the golden's zero fill for such tokens is not taken.
  ``key.shape[0]`` must equal the token total; ``seq_offset`` values >= 0. In ``PA_NZ`` key /
  value are 2-D ``[T, N*D]`` (aclnn doc) or 3-D ``[T, N, D]`` (the op-plugin golden).
- All tensors C-contiguous (the docs: no non-contiguous tensors); caches (scatter) and key /
  value (gather) writable and separate from every argument the call reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..errors import FormatError, IndexRangeError, ModeError, ShapeError, arg_error, describe
from ..layouts import (FRACTAL_NZ, NZ_ROW_BYTES, CacheLayout, cache_mode_traits, check_block_size, get_npu_format,
                       slots_from_cache_index)
from ..layouts.paged import PAGED_KV_LAYOUT_MODES
from ._backend import get_backend
from ._check import (check_cache, check_disjoint, check_dtype, check_ndim, dtype_name, optional, required,
                     warn_duplicates, write_targets)

#: Data dtypes on Atlas A2 / A3 (both docs), one for key, value and both caches.
DATA_DTYPES = ("float16", "bfloat16", "int8")
#: slot_mapping dtypes (scatter doc); block_tables / seq_lens / seq_offset on A2 / A3 (gather doc).
SLOT_DTYPES = ("int32", "int64")
GATHER_INDEX_DTYPES = ("int32",)
#: cache_mode values of npu_scatter_pa_kv_cache (None means Norm, doc).
SCATTER_CACHE_MODES = ("Norm", "PA_NZ")
#: PA_NZ caches: the block_size dim must be below UINT16_MAX (aclnnScatterPaKvCache constraints).
MAX_NZ_BLOCK_SIZE = 65535

SCATTER = "npu_scatter_pa_kv_cache"
GATHER = "npu_gather_pa_kv_cache"


@dataclass(frozen=True)
class PagedCacheArgs:
    """Normalised, validated arguments of the paged_cache family.

    Attributes:
        op: :data:`SCATTER` or :data:`GATHER`.
        cache_mode: ``'Norm'`` or ``'PA_NZ'``.
        key, value: scatter: the tokens ``[T, N, Dk]`` / ``[T, N, Dv]`` (read); gather: the
            outputs (``[T, N, D]`` or, PA_NZ, ``[T, N*D]``) written in place.
        key_cache, value_cache: the caches as passed (scatter writes them in place).
        k_layout, v_layout: their :class:`~ascend_emu.layouts.CacheLayout`.
        slots: int64 ``[T]``: scatter: the destination slot of each token (-1: skip); gather:
            the source slot of each output token (all valid).
        slot_mapping: scatter's index tensor as passed (None for gather).
        block_tables, seq_lens, seq_offset, is_seq_lens_cumsum: gather's arguments as passed
            (None / False for scatter).
    """

    op: str
    cache_mode: str
    key: np.ndarray
    value: np.ndarray
    key_cache: np.ndarray
    value_cache: np.ndarray
    k_layout: CacheLayout
    v_layout: CacheLayout
    slots: np.ndarray
    slot_mapping: np.ndarray | None = None
    block_tables: np.ndarray | None = None
    seq_lens: np.ndarray | None = None
    seq_offset: np.ndarray | None = None
    is_seq_lens_cumsum: bool = False

    @property
    def written(self) -> tuple[np.ndarray, np.ndarray]:
        """The two arrays the op writes: the caches (scatter) or key / value (gather)."""
        if self.op == SCATTER:
            return self.key_cache, self.value_cache
        return self.key, self.value


class PagedCacheOutputs(NamedTuple):
    """What a backend returns (:mod:`ascend_emu.ops._backend`): the two arrays written in place,
    the very objects of :attr:`PagedCacheArgs.written`.

    Attributes:
        k: key_cache (scatter) or key (gather).
        v: value_cache (scatter) or value (gather).
    """

    k: np.ndarray
    v: np.ndarray


def _c0(cache: np.ndarray) -> int:
    """Elements per 32-byte NZ row of a paged cache (the rule of :attr:`CacheLayout.c0`)."""
    return NZ_ROW_BYTES // cache.dtype.itemsize


def _contiguous(a: np.ndarray, name: str) -> None:
    if not a.flags.c_contiguous:
        raise arg_error(ShapeError, name, "a C-contiguous tensor (the op does not take non-contiguous tensors)",
                        f"strides {a.strides}")


def _nz(mode: str | None) -> bool:
    """True when the op's cache mode ``mode`` (``'Norm'``, ``'PA_NZ'`` or None) stores FRACTAL_NZ
    blocks (:data:`~ascend_emu.layouts.paged.PAGED_KV_LAYOUT_MODES` names its cache layout)."""
    return cache_mode_traits(PAGED_KV_LAYOUT_MODES[mode]).nz


def _cache_layout(cache: np.ndarray, name: str, mode: str, heads: int, dim: int) -> CacheLayout:
    """The layout of one cache for ``heads`` x ``dim`` token rows.

    Norm: ``[nb, bs, heads, dim]``. PA_NZ: ``[nb, heads*dim // C0, bs, C0]`` or
    ``[nb, heads, dim // C0, bs, C0]``, bs a multiple of 16 and < :data:`MAX_NZ_BLOCK_SIZE`.

    Raises:
        ShapeError: another shape.
        FormatError: a FRACTAL_NZ-cast Norm cache.
    """
    shape = tuple(cache.shape)
    itemsize = cache.dtype.itemsize
    layout_mode = PAGED_KV_LAYOUT_MODES[mode]
    if not _nz(mode):
        if get_npu_format(cache) == FRACTAL_NZ:
            raise FormatError(f"{name}: expected an ND cache for cache_mode 'Norm' (its memory is addressed as "
                              f"[num_blocks, block_size, N, D]), got a FRACTAL_NZ tensor; pass the cache "
                              f"without npu_format_cast, or use cache_mode 'PA_NZ'")
        if len(shape) != 4 or shape[2] != heads or shape[3] != dim or min(shape[1:]) < 1:
            raise arg_error(ShapeError, name, f"a 4-D [num_blocks, block_size, N={heads}, D={dim}] cache, block_size, "
                            "N and D >= 1 (cache_mode 'Norm')", f"shape {list(shape)}")
        return CacheLayout(mode=layout_mode, num_blocks=shape[0], block_size=shape[1], dim=dim,
                           itemsize=itemsize, heads=heads)
    c0 = _c0(cache)
    row = heads * dim
    ok4 = len(shape) == 4 and shape[3] == c0 and shape[1] * c0 == row
    ok5 = len(shape) == 5 and shape[4] == c0 and shape[1] == heads and shape[2] * c0 == dim
    if row < 1 or row % c0 or not (ok4 or ok5):
        raise arg_error(ShapeError, name, f"a PA_NZ cache [num_blocks, N*D/C0={row / c0:g}, block_size, C0={c0}] or "
                        f"[num_blocks, N={heads}, D/C0={dim / c0:g}, block_size, C0={c0}] (N*D = {row}, a multiple of "
                        f"C0 = 32 bytes / itemsize, at least 1)", f"shape {list(shape)}")
    bs = shape[-2]
    check_block_size(layout_mode, bs, name=f"{name} block_size (dim {len(shape) - 2})")
    if bs >= MAX_NZ_BLOCK_SIZE:
        raise arg_error(ShapeError, f"{name} block_size (dim {len(shape) - 2})",
                        f"less than {MAX_NZ_BLOCK_SIZE} (UINT16_MAX) for cache_mode 'PA_NZ'", bs)
    return CacheLayout(mode=layout_mode, num_blocks=shape[0], block_size=bs, dim=row,
                       itemsize=itemsize)


def _same_geometry(k_layout: CacheLayout, v_layout: CacheLayout) -> None:
    if (v_layout.num_blocks, v_layout.block_size) != (k_layout.num_blocks, k_layout.block_size):
        raise arg_error(ShapeError, "value_cache", f"key_cache's num_blocks={k_layout.num_blocks} and "
                        f"block_size={k_layout.block_size}",
                        f"num_blocks={v_layout.num_blocks}, block_size={v_layout.block_size}")


def npu_scatter_pa_kv_cache(key, value, key_cache, value_cache, slot_mapping, *, compress_lens=None,
                            compress_seq_offsets=None, seq_lens=None, cache_mode="PA_NZ") -> None:
    """``torch_npu.npu_scatter_pa_kv_cache``: write each token's key and value rows into the
    paged caches at its slot, in place (module doc).

    Token ``t`` with ``s = slot_mapping[t]`` (``s = -1``: skipped) goes to block ``s // bs``, row
    ``s % bs``: Norm ``key_cache[s // bs, s % bs] = key[t]``; PA_NZ: the ``N*Dk`` elements of
    ``key[t]`` in C0-element pieces, piece ``k`` at ``key_cache[s // bs, k, s % bs, :]`` (4-D
    form). The same for value. Byte-exact.

    Args:
        key: ``[T, N, Dk]`` fp16 / bf16 / int8, C-contiguous.
        value: ``[T, N, Dv]``, key's dtype, C-contiguous.
        key_cache: Norm ``[num_blocks, block_size, N, Dk]`` (ND); PA_NZ
            ``[num_blocks, N*Dk/C0, block_size, C0]`` or ``[num_blocks, N, Dk/C0, block_size, C0]``
            with C0 = 32 bytes / itemsize and block_size a multiple of 16, < 65535. key's dtype,
            C-contiguous, writable; updated in place.
        value_cache: the same with Dv, key_cache's num_blocks and block_size.
        slot_mapping: int32 / int64 ``[T]``, each in ``[0, num_blocks * block_size)`` or -1.
        compress_lens, compress_seq_offsets, seq_lens: the compressed scenario: must be None.
        cache_mode: ``'PA_NZ'`` (default), ``'Norm'`` or None (= ``'Norm'``).

    Returns:
        None; key_cache and value_cache are updated in place.

    Raises:
        ModeError: another cache_mode, or a non-None compressed-scenario argument.
        ShapeError: a shape or layout other than the above, overlapping arrays.
        DTypeError: a dtype other than the above.
        FormatError: a FRACTAL_NZ cache with cache_mode 'Norm'.
        IndexRangeError: a slot out of range (the message names ``slot_mapping[t]``); nothing written.

    Source: op-plugin ``torch_npu-npu_scatter_pa_kv_cache.md`` and
    ``test/test_custom_ops/test_scatter_pa_kv_cache.py``; ops-transformer ``aclnnScatterPaKvCache.md``.
    """
    mode = "Norm" if cache_mode is None else cache_mode
    if not isinstance(mode, str) or mode not in SCATTER_CACHE_MODES:
        raise arg_error(ModeError, "cache_mode", f"one of {list(SCATTER_CACHE_MODES)} or None", describe(cache_mode))
    for name, val in (("compress_lens", compress_lens), ("compress_seq_offsets", compress_seq_offsets),
                      ("seq_lens", seq_lens)):
        if val is not None:
            raise arg_error(ModeError, name, "None (the compressed scenario is not emulated: the docs give its "
                            "shapes but not where each compressed token is written)", describe(val))
    key, value = required(key, "key"), required(value, "value")
    key_cache, value_cache = required(key_cache, "key_cache"), required(value_cache, "value_cache")
    slot_mapping = required(slot_mapping, "slot_mapping")
    check_ndim(key, "key", (3,), "[T, N, Dk] (4-D keys are the compressed scenario, not emulated)")
    check_dtype(key, "key", DATA_DTYPES)
    dt = (dtype_name(key.dtype),)
    check_ndim(value, "value", (3,), "[T, N, Dv]")
    for name, a in (("value", value), ("key_cache", key_cache), ("value_cache", value_cache)):
        check_dtype(a, name, dt)
    t, n, dk = key.shape
    if value.shape[:2] != (t, n):
        raise arg_error(ShapeError, "value", f"[T={t}, N={n}, Dv] (key's first two dims)", f"shape {list(value.shape)}")
    check_dtype(slot_mapping, "slot_mapping", SLOT_DTYPES)
    if slot_mapping.ndim != 1 or slot_mapping.shape[0] != t:
        raise arg_error(ShapeError, "slot_mapping", f"a 1-D [T={t}] tensor", f"shape {list(slot_mapping.shape)}")
    k_layout = _cache_layout(key_cache, "key_cache", mode, n, dk)
    v_layout = _cache_layout(value_cache, "value_cache", mode, n, value.shape[2])
    _same_geometry(k_layout, v_layout)
    for name, a in (("key", key), ("value", value), ("slot_mapping", slot_mapping)):
        _contiguous(a, name)
    for name, a in (("key_cache", key_cache), ("value_cache", value_cache)):
        check_cache(a, name)
    check_disjoint((("key_cache", key_cache), ("value_cache", value_cache)),
                   (("key", key), ("value", value), ("slot_mapping", slot_mapping)))
    slots = slots_from_cache_index(slot_mapping, k_layout.num_rows, name="slot_mapping")
    warn_duplicates(slots, "slot_mapping")
    args = PagedCacheArgs(SCATTER, mode, key, value, key_cache, value_cache, k_layout, v_layout, slots,
                          slot_mapping=slot_mapping)
    get_backend().paged_cache(write_targets(args, ("key_cache", "value_cache")))


def _gather_lengths(seq_lens: np.ndarray, batch: int, cumsum: bool) -> np.ndarray:
    """Per-batch token counts ``[B]`` from seq_lens ``[B]`` (or ``[B + 1]`` cumulative sums)."""
    check_dtype(seq_lens, "seq_lens", GATHER_INDEX_DTYPES)
    want = batch + 1 if cumsum else batch
    if seq_lens.ndim != 1 or seq_lens.shape[0] != want:
        what = f"[B + 1 = {want}] cumulative sums (is_seq_lens_cumsum=True)" if cumsum else f"[B = {want}]"
        raise arg_error(ShapeError, "seq_lens", f"a 1-D tensor {what}, B = block_tables' rows",
                        f"shape {list(seq_lens.shape)}")
    v = seq_lens.astype(np.int64)
    if cumsum:
        if v[0] != 0:
            raise arg_error(ShapeError, "seq_lens[0]", "0 (the first cumulative sum)", int(v[0]))
        lens = np.diff(v)
        if (lens < 0).any():
            i = int(np.argmax(lens < 0)) + 1
            raise arg_error(ShapeError, f"seq_lens[{i}]", "a non-decreasing cumulative sum",
                            f"{int(v[i])} after {int(v[i - 1])}")
        return lens
    if (v < 0).any():
        i = int(np.argmax(v < 0))
        raise arg_error(ShapeError, f"seq_lens[{i}]", "a token count >= 0", int(v[i]))
    return v


def _gather_slots(table: np.ndarray, lens: np.ndarray, starts: np.ndarray, layout: CacheLayout) -> np.ndarray:
    """Source slot of every output token, batch-major: token ``j`` of batch ``b`` reads block
    ``table[b, starts[b] + j // bs]``, row ``j % bs``. Every column used and every block id is
    checked.

    Raises:
        ShapeError: a sequence needs more columns than the table has.
        IndexRangeError: a block id used is outside ``[0, num_blocks)``.
    """
    block_size, num_blocks = layout.block_size, layout.num_blocks
    b_of = np.repeat(np.arange(lens.size, dtype=np.int64), lens)  # [T]
    first = np.concatenate(([0], np.cumsum(lens)[:-1])) if lens.size else np.zeros(0, np.int64)  # [B]
    j = np.arange(b_of.size, dtype=np.int64) - first[b_of]  # [T] position inside its batch
    col = starts[b_of] + j // block_size  # [T]
    over = col >= table.shape[1]
    if over.any():
        t = int(np.argmax(over))
        b = int(b_of[t])
        raise arg_error(ShapeError, f"seq_lens[{b}]", f"a length whose blocks fit block_tables' {table.shape[1]} "
                        f"columns (seq_offset // block_size = {int(starts[b])}, block_size {block_size})",
                        f"{int(lens[b])} tokens, token {int(j[t])} needs column {int(col[t])}")
    blk = table[b_of, col].astype(np.int64)  # [T]
    bad = (blk < 0) | (blk >= num_blocks)
    if bad.any():
        t = int(np.argmax(bad))
        raise IndexRangeError(f"block_tables[{int(b_of[t])}, {int(col[t])}] = {int(blk[t])}: expected a block id in "
                              f"[0, {num_blocks}) (read for token {int(j[t])} of batch {int(b_of[t])}); "
                              f"{int(bad.sum())} token(s) read out-of-range block ids")
    return layout.slots_at(blk, j % block_size)


def npu_gather_pa_kv_cache(key_cache, value_cache, block_tables, seq_lens, key, value, *, seq_offset=None,
                           is_seq_lens_cumsum: bool = False) -> None:
    """``torch_npu.npu_gather_pa_kv_cache``: copy each sequence's tokens out of the paged caches
    into contiguous key / value rows, in place (module doc).

    The cache mode is key_cache's format, as torch_npu decides it: ``PA_NZ`` for a FRACTAL_NZ
    key_cache (``npu_format_cast(cache, 29)``; with NumPy an :class:`~ascend_emu.layouts.NZArray`,
    e.g. ``cache.view(NZArray)``), else ``Norm``. Output token ``sum(len[:b]) + j`` is token ``j``
    of batch ``b``, read from block ``block_tables[b, seq_offset[b] // block_size + j // block_size]``
    (start 0 without seq_offset), row ``j % block_size``. Byte-exact.

    Args:
        key_cache: Norm ``[num_blocks, block_size, N, Dk]``; PA_NZ ``[num_blocks, N*Dk/C0,
            block_size, C0]`` (C0 = 32 bytes / itemsize, block_size a multiple of 16). fp16 / bf16
            / int8, C-contiguous.
        value_cache: the same with Dv; key_cache's dtype, num_blocks and block_size.
        block_tables: int32 ``[B, max_blocks]``; the entries the tokens read in ``[0, num_blocks)``.
        seq_lens: int32 ``[B]`` token counts, or ``[B + 1]`` cumulative sums starting at 0 when
            ``is_seq_lens_cumsum``.
        key: ``[T, N, Dk]`` (PA_NZ also ``[T, N*Dk]``), T the token total; key_cache's dtype,
            C-contiguous, writable; written in place.
        value: the same with Dv.
        seq_offset: None or int32 ``[B]``, each >= 0: batch b's blocks start at column
            ``seq_offset[b] // block_size``.
        is_seq_lens_cumsum: whether seq_lens holds cumulative sums.

    Returns:
        None; key and value are written in place.

    Raises:
        ShapeError: a shape other than the above, a sequence past its table row, overlapping arrays.
        DTypeError: a dtype other than the above.
        FormatError: value_cache FRACTAL_NZ while key_cache is not.
        IndexRangeError: a block id read out of range (the message names ``block_tables[b, j]``);
            nothing written.

    Source: ops-transformer ``aclnnGatherPaKvCache.md``; op-plugin
    ``GatherPaKvCacheKernelNpuOpApi.cpp`` and ``test/test_custom_ops/test_npu_gather_pa_kv_cache.py``.
    """
    if not isinstance(is_seq_lens_cumsum, (bool, np.bool_)):
        raise arg_error(ModeError, "is_seq_lens_cumsum", "a bool", describe(is_seq_lens_cumsum))
    key_cache, value_cache = required(key_cache, "key_cache"), required(value_cache, "value_cache")
    block_tables, seq_lens = required(block_tables, "block_tables"), required(seq_lens, "seq_lens")
    key, value = required(key, "key"), required(value, "value")
    seq_offset = optional(seq_offset, "seq_offset")
    mode = "PA_NZ" if get_npu_format(key_cache) == FRACTAL_NZ else "Norm"
    check_dtype(key_cache, "key_cache", DATA_DTYPES)
    dt = (dtype_name(key_cache.dtype),)
    for name, a in (("value_cache", value_cache), ("key", key), ("value", value)):
        check_dtype(a, name, dt)
    nz = _nz(mode)
    if not nz:
        check_ndim(key_cache, "key_cache", (4,), "[num_blocks, block_size, N, Dk] (cache_mode Norm: key_cache is ND)")
        check_ndim(value_cache, "value_cache", (4,), "[num_blocks, block_size, N, Dv]")
        heads = key_cache.shape[2]
        k_layout = _cache_layout(key_cache, "key_cache", mode, heads, key_cache.shape[3])
        v_layout = _cache_layout(value_cache, "value_cache", mode, heads, value_cache.shape[3])
        want = {"key": (heads, k_layout.dim), "value": (heads, v_layout.dim)}
    else:
        c0 = _c0(key_cache)
        for name, a in (("key_cache", key_cache), ("value_cache", value_cache)):
            check_ndim(a, name, (4,), f"[num_blocks, N*D/C0, block_size, C0={c0}] (PA_NZ: key_cache is FRACTAL_NZ)")
        k_layout = _cache_layout(key_cache, "key_cache", mode, 1, key_cache.shape[1] * c0)
        v_layout = _cache_layout(value_cache, "value_cache", mode, 1, value_cache.shape[1] * c0)
        want = {"key": (k_layout.dim,), "value": (v_layout.dim,)}
    _same_geometry(k_layout, v_layout)
    check_ndim(block_tables, "block_tables", (2,), "[B, max_blocks]")
    check_dtype(block_tables, "block_tables", GATHER_INDEX_DTYPES)
    batch = block_tables.shape[0]
    lens = _gather_lengths(seq_lens, batch, bool(is_seq_lens_cumsum))
    total = int(lens.sum())
    for name, a in (("key", key), ("value", value)):
        row = want[name]
        ok = a.ndim >= 2 and a.shape[0] == total and (
            a.shape[1:] == row or (nz and a.ndim == 3 and a.shape[1] * a.shape[2] == row[0]))
        if not ok:
            shown = f"[T={total}, N={row[0]}, D={row[1]}]" if not nz else \
                f"[T={total}, N*D={row[0]}] or [T={total}, N, D] with N*D = {row[0]}"
            raise arg_error(ShapeError, name, f"{shown} (T = the token total of seq_lens)", f"shape {list(a.shape)}")
    starts = np.zeros(batch, np.int64)
    if seq_offset is not None:
        check_dtype(seq_offset, "seq_offset", GATHER_INDEX_DTYPES)
        if seq_offset.shape != (batch,):
            raise arg_error(ShapeError, "seq_offset", f"a 1-D [B={batch}] tensor", f"shape {list(seq_offset.shape)}")
        if (seq_offset < 0).any():
            i = int(np.argmax(seq_offset < 0))
            raise arg_error(ShapeError, f"seq_offset[{i}]", "an offset >= 0", int(seq_offset[i]))
        starts = seq_offset.astype(np.int64) // k_layout.block_size
    for name, a in (("key_cache", key_cache), ("value_cache", value_cache), ("block_tables", block_tables),
                    ("seq_lens", seq_lens)) + ((("seq_offset", seq_offset),) if seq_offset is not None else ()):
        _contiguous(a, name)
    for name, a in (("key", key), ("value", value)):
        check_cache(a, name)
    check_disjoint((("key", key), ("value", value)),
                   (("key_cache", key_cache), ("value_cache", value_cache), ("block_tables", block_tables),
                    ("seq_lens", seq_lens), ("seq_offset", seq_offset)))
    slots = _gather_slots(block_tables, lens, starts, k_layout)
    args = PagedCacheArgs(GATHER, mode, key, value, key_cache, value_cache, k_layout, v_layout, slots,
                          block_tables=block_tables, seq_lens=seq_lens, seq_offset=seq_offset,
                          is_seq_lens_cumsum=bool(is_seq_lens_cumsum))
    get_backend().paged_cache(write_targets(args, ("key", "value")))
