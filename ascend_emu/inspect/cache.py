"""What a cache is to the inspector: its layout, its element dtype, its row format, its bytes.

Sources: docs/sources.md#paged_nz (paged NZ), docs/sources.md#per_tile_rows / docs/sources.md#npu_kv_quant_sparse_flash_attention (656-byte combined rows), docs/sources.md#cache_index / docs/sources.md#npu_kv_rmsnorm_rope_cache (cache
modes). The address arithmetic is :class:`ascend_emu.layouts.CacheLayout`'s; the row fields are
:data:`ascend_emu.quant.MLA_ROW`'s (the Ascend 950's HiF8 / FP8 rows:
:data:`ascend_emu.quant.combined.MLA_ROWS`, their k_nope bytes decoded by
:data:`~ascend_emu.quant.combined.NOPE_BYTE_VALUES`). This module only names them per byte,
vectorised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

from ..errors import DTypeError, ShapeError, arg_error
from ..layouts import CacheLayout
from ..quant import BF16, MLA_ROW, CombinedRowFormat
from ..quant.combined import MLA_ROWS, NOPE_BYTE_VALUES

#: Cache dtypes the inspector reads, by the names the seeds use.
CACHE_DTYPES = {
    "bfloat16": np.dtype(BF16),
    "float16": np.dtype(np.float16),
    "float32": np.dtype(np.float32),
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),  # HiF8 codes (torch_npu's hifloat8 tensors are uint8)
    "float8_e4m3fn": np.dtype(MLA_ROWS["float8_e4m3fn"].cache_dtype),
}
#: Short names accepted wherever the inspector takes a dtype name (``--dtype bf16``), each the
#: name of one of :data:`CACHE_DTYPES`.
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32",
                 "float": "float32", "fp8_e4m3fn": "float8_e4m3fn"}


def canonical_dtype_name(name: str) -> str:
    """``name`` with a short name (:data:`DTYPE_ALIASES`: ``bf16``, ``fp16``, ``fp32``...)
    replaced by its full one; any other string unchanged (the caller checks it)."""
    return DTYPE_ALIASES.get(name, name)
#: The k_nope element type of a 656-byte-row cache of each dtype (uint8: HiF8 codes, the Ascend 950).
ROW_ELEMENTS = {"int8": "int8", "uint8": "hifloat8", "float8_e4m3fn": "float8_e4m3fn"}
#: Bytes shown per dump line: one NZ fractal row (C0 elements), 32 bytes of an ND row.
LINE_BYTES = 32


class FieldKind(NamedTuple):
    """One kind of element a cache row holds."""

    name: str        #: "element" (plain caches) or "k_nope" / "k_rope" / "scale" (656-byte rows)
    dtype: np.dtype  #: its dtype
    offset: int      #: first byte of the field in the head's row
    count: int       #: elements of the field per row and head
    element: str = ""  #: k_nope of an Ascend 950 row: "hifloat8" / "float8_e4m3fn" (decoded by table)

    @property
    def size(self) -> int:
        """Bytes per element."""
        return self.dtype.itemsize

    @property
    def type_name(self) -> str:
        """How the inspector names the element type (``hifloat8`` for HiF8's uint8 codes)."""
        return self.element or self.dtype.name

    @property
    def is_float(self) -> bool:
        """A floating-point element (bf16, fp16, fp32, FP8, HiF8)."""
        return bool(self.element) or self.dtype.kind == "f" or self.dtype.name == "bfloat16"

    def values(self, raw: np.ndarray) -> np.ndarray:
        """The elements of ``raw`` (uint8 bytes, whole elements): decoded fp32 for a HiF8 / FP8
        k_nope, else a view in :attr:`dtype`."""
        if self.element:
            return NOPE_BYTE_VALUES[self.element][np.asarray(raw, np.uint8)]
        return np.asarray(raw).view(self.dtype)


def dtype_name(dtype) -> str:
    """Seed spelling of a cache dtype (``bfloat16`` for ml_dtypes' type)."""
    return np.dtype(dtype).name


def resolve_dtype(dtype, name: str = "dtype") -> np.dtype:
    """A cache dtype from a name (``bfloat16``, ``float16``, ``float32``, ``int8``, ``uint8``,
    ``float8_e4m3fn``, or a short name of :data:`DTYPE_ALIASES` such as ``bf16``) or dtype.

    Raises:
        DTypeError: any other dtype.
    """
    key = canonical_dtype_name(dtype) if isinstance(dtype, str) else dtype_name(dtype)
    if key not in CACHE_DTYPES:
        raise arg_error(DTypeError, name, f"one of {list(CACHE_DTYPES)} (or {list(DTYPE_ALIASES)})", key)
    return CACHE_DTYPES[key]


@dataclass(frozen=True)
class CacheSpec:
    """Geometry and meaning of a cache, without its bytes.

    Attributes:
        layout: the address map (mode, BlockNum, BlockSize, D, itemsize, Nkv).
        dtype: element dtype of the cache tensor.
        row_format: the 656-byte combined row format when each row is one (int8, ND mode,
            D = ``row_format.row_bytes``), else None.
    """

    layout: CacheLayout
    dtype: np.dtype
    row_format: CombinedRowFormat | None = None

    @classmethod
    def from_shape(cls, cache_mode: str, shape: Sequence[int], dtype, *, combined: bool | None = None,
                   name: str = "cache") -> "CacheSpec":
        """Spec of a cache from its declared or storage shape (:meth:`CacheLayout.from_shape`).

        Args:
            cache_mode: cache mode (aliases accepted).
            shape: declared (``[BlockNum, BlockSize, Nkv, D]``, ``[T, Nkv, D]``, ...) or NZ storage
                shape (``[BlockNum, D/C0, BlockSize, C0]``).
            dtype: cache dtype (name or dtype): bfloat16, float16, float32, int8, uint8 or
                float8_e4m3fn.
            combined: rows are 656-byte combined rows (:data:`~ascend_emu.quant.MLA_ROW`; uint8:
                HiF8, float8_e4m3fn: FP8 k_nope, the Ascend 950's); None (default): exactly when
                the cache is int8 / uint8 / float8_e4m3fn with D = 656 in an ND mode.
            name: argument name for errors.

        Raises:
            ModeError: unknown mode.
            DTypeError: unsupported dtype.
            ShapeError: a shape no op accepts (including the BlockSize rule,
                :func:`ascend_emu.layouts.check_block_size`), or ``combined=True`` on a cache that
                cannot hold combined rows.
        """
        dt = resolve_dtype(dtype)
        return cls.from_layout(CacheLayout.from_shape(cache_mode, shape, dt.itemsize, name=name), dt,
                               combined=combined)

    @classmethod
    def from_layout(cls, layout: CacheLayout, dtype, *, combined: bool | None = None) -> "CacheSpec":
        """Spec of a cache an op describes with its :class:`CacheLayout`: a written cache's (the
        writers' contracts) or a read one's (e.g. ``FusedInferAttentionArgs.key_layout``, a
        head-major PA_BNSD ``[nb, N, bs, D]`` or NZ ``[nb, N, D/C0, bs, C0]`` cache), the same object.

        Args:
            layout: the cache's layout.
            dtype: cache dtype (name or dtype) of ``layout.itemsize`` bytes.
            combined: see :meth:`from_shape`.

        Raises:
            DTypeError: unsupported dtype, or one whose itemsize is not the layout's.
            ShapeError: ``combined=True`` on a cache that cannot hold combined rows.
        """
        dt = resolve_dtype(dtype)
        if dt.itemsize != layout.itemsize:
            raise arg_error(DTypeError, "dtype", f"a {layout.itemsize}-byte dtype (the layout's itemsize)",
                            dtype_name(dt))
        element = ROW_ELEMENTS.get(dtype_name(dt))
        fits = (element is not None and layout.dim == MLA_ROW.row_bytes and not layout.nz
                and layout.heads == 1)
        if combined and not fits:
            raise arg_error(ShapeError, "combined", f"an int8 / uint8 (HiF8) / float8_e4m3fn ND-mode cache with "
                            f"Nkv=1 and D={MLA_ROW.row_bytes} (656-byte rows)", f"{dtype_name(dt)} D={layout.dim} "
                            f"Nkv={layout.heads} cache_mode {layout.mode}")
        use = fits if combined is None else bool(combined)
        return cls(layout=layout, dtype=dt, row_format=MLA_ROWS[element] if use else None)

    @property
    def fields(self) -> tuple[FieldKind, ...]:
        """The element kinds of one head's row, in byte order."""
        if self.row_format is None:
            return (FieldKind("element", self.dtype, 0, self.layout.dim),)
        f = self.row_format
        element = "" if f.nope_element == "int8" else f.nope_element
        return (FieldKind("k_nope", f.cache_dtype, f.nope_offset, f.d_nope, element),
                FieldKind("k_rope", np.dtype(BF16), f.rope_offset, f.d_rope),
                FieldKind("scale", np.dtype(np.float32), f.scale_offset, f.num_tiles))

    def field(self, name: str) -> FieldKind:
        """The field called ``name``.

        Raises:
            ShapeError: no such field in this cache.
        """
        for f in self.fields:
            if f.name == name:
                return f
        raise arg_error(ShapeError, "field", f"one of {[f.name for f in self.fields]}", repr(name))

    def describe(self) -> dict:
        """Plain-data summary: mode, dtype, geometry, storage shape, C0, row format."""
        lay = self.layout
        out = {"cache_mode": lay.mode, "dtype": dtype_name(self.dtype), "num_blocks": lay.num_blocks,
               "block_size": lay.block_size, "heads": lay.heads, "dim": lay.dim,
               "storage_shape": list(lay.storage_shape()), "nbytes": lay.nbytes}
        if lay.nz:
            out["C0"] = lay.c0
        if self.row_format is not None:
            f = self.row_format
            out["row_format"] = {"d_nope": f.d_nope, "d_rope": f.d_rope, "tile_size": f.tile_size,
                                 "row_bytes": f.row_bytes, "nope_element": f.nope_element}
        return out


@dataclass(frozen=True)
class Cache:
    """A cache's bytes with their spec.

    Attributes:
        spec: the :class:`CacheSpec`.
        raw: read-only uint8 ``[nbytes]``, the cache's memory from its first byte.
        shape: the shape the cache was given in (declared or storage).
    """

    spec: CacheSpec
    raw: np.ndarray
    shape: tuple[int, ...]

    @classmethod
    def from_array(cls, array, cache_mode: str | CacheLayout, *, combined: bool | None = None,
                   name: str = "cache") -> "Cache":
        """Wrap a cache array (NumPy, or a CPU torch tensor) for inspection.

        Args:
            array: the cache, in its declared or storage shape, C-contiguous; bf16 as
                ``ml_dtypes.bfloat16`` (torch bf16 tensors are viewed, not converted).
            cache_mode: cache mode (aliases accepted), or the :class:`CacheLayout` an op's contract
                describes the cache with (read or written; :meth:`CacheSpec.from_layout`), whatever
                the array's shape (its bytes must be the layout's).
            combined: see :meth:`CacheSpec.from_shape`.
            name: argument name for errors.

        Returns:
            A :class:`Cache` over a read-only copy of the bytes.

        Raises:
            DTypeError / ShapeError / ModeError: as :meth:`CacheSpec.from_shape`, or a
                non-contiguous array.
        """
        arr = _as_numpy(array, name)
        if isinstance(cache_mode, CacheLayout):
            spec = CacheSpec.from_layout(cache_mode, arr.dtype, combined=combined)
            if arr.nbytes != cache_mode.nbytes:
                raise arg_error(ShapeError, name, f"{cache_mode.nbytes} bytes (the layout's)",
                                f"{arr.nbytes} bytes, shape {list(arr.shape)}")
        else:
            spec = CacheSpec.from_shape(cache_mode, arr.shape, arr.dtype, combined=combined, name=name)
        if not arr.flags.c_contiguous:
            raise arg_error(ShapeError, name, "a C-contiguous cache (raw memory)", f"strides {arr.strides}")
        raw = arr.reshape(-1).view(np.uint8).copy()  # [nbytes]
        raw.flags.writeable = False
        return cls(spec=spec, raw=raw, shape=tuple(int(s) for s in arr.shape))

    @property
    def layout(self) -> CacheLayout:
        """The spec's layout."""
        return self.spec.layout

    def rows(self) -> np.ndarray:
        """Logical rows ``[num_rows, Nkv, D]`` in the cache dtype (NZ blocks re-ordered)."""
        return self.layout.to_rows(self.raw.view(self.spec.dtype))

    def array(self) -> np.ndarray:
        """The bytes as an array of the cache dtype in the shape it was given in (read-only)."""
        return self.raw.view(self.spec.dtype).reshape(self.shape)


def _as_numpy(array, name: str) -> np.ndarray:
    """NumPy view of a NumPy array or a CPU torch tensor (torch imported only if it is one)."""
    if type(array).__module__.startswith("torch"):
        from ..torch_npu._convert import to_numpy

        return to_numpy(array.contiguous(), name)
    return np.asarray(array)


# ---------------------------------------------------------------------- vectorised byte map
class ByteMap(NamedTuple):
    """Logical meaning of many cache bytes (all int64 arrays of the offsets' shape)."""

    block: np.ndarray
    row: np.ndarray
    slot: np.ndarray
    head: np.ndarray
    dim: np.ndarray          #: element of the head's row (byte of the row for combined rows)
    field: np.ndarray        #: index into :attr:`CacheSpec.fields`
    element: np.ndarray      #: element inside the field
    byte: np.ndarray         #: byte inside that element (little-endian)


def map_bytes(spec: CacheSpec, offsets) -> ByteMap:
    """Vectorised reverse map: each byte offset -> (block, row, slot, head, dim, field, element, byte).

    The same arithmetic as :meth:`CacheLayout.locate` (docs/sources.md#paged_nz), on arrays.

    Args:
        spec: the cache.
        offsets: integer byte offsets, each in ``[0, nbytes)`` (checked).

    Raises:
        IndexRangeError: an offset outside the cache.
    """
    from ..layouts import check_index_range

    lay = spec.layout
    off = np.asarray(offsets, dtype=np.int64)
    check_index_range(off, 0, lay.nbytes, name="byte_offset", what="byte", allow_skip=False)
    blk, row, head, dim, byte = lay.locate_many(off)
    slot = lay.slots_at(blk, row)
    rowbyte = dim * lay.itemsize + byte  # byte inside the head's row
    field = np.zeros_like(off)
    for i, f in enumerate(spec.fields[1:], start=1):
        field = np.where(rowbyte >= f.offset, i, field)
    starts = np.array([f.offset for f in spec.fields], dtype=np.int64)[field]
    sizes = np.array([f.size for f in spec.fields], dtype=np.int64)[field]
    element, in_elem = np.divmod(rowbyte - starts, sizes)
    return ByteMap(blk, row, slot, head, dim, field, element, in_elem)
