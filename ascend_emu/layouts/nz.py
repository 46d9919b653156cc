"""FRACTAL_NZ: the matrix storage format torch_npu produces with ``npu_format_cast(x, 29)``.

Source: docs/sources.md#fractal_nz (torch_npu ``FormatHelper.cpp::InferShapeNDToNZ``; the
``npu_format_cast`` doc). For ND dims ``[..., M, N]`` of itemsize ``s``:

- ``C0 = 32 // min(s, 2)``: 16 for fp16 / bf16, 32 for int8, and 16 for fp32 / int32 too
  (torch_npu sizes 4-byte types as if they were 2-byte).
- storage shape ``[..., ceil(N/C0), ceil(M/16), 16, C0]``; batch dims are kept;
- a 1-D input ``[L]`` is treated as ``[L, 1]``, a 0-D input as ``[1, 1]``;
- element ``(..., m, n)`` lives at storage ``[..., n // C0, m // 16, m % 16, n % C0]``;
- padding elements are zero (unverified on hardware; docs/sources.md#unverified).

This is *matrix* NZ over a whole tensor. The paged-cache NZ layout (per block
``[D/C0, BlockSize, C0]`` with ``C0 = 32 bytes / itemsize``) lives in :mod:`.paged`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from ..errors import DTypeError, ShapeError, arg_error

#: ACL format ids as torch_npu numbers them.
ND = 2
FRACTAL_NZ = 29
ACL_FORMAT_NAMES = {ND: "ND", FRACTAL_NZ: "FRACTAL_NZ"}

#: Rows per fractal.
M0 = 16
#: Bytes per fractal row.
FRACTAL_ROW_BYTES = 32

#: Element types with a FRACTAL_NZ layout on every SoC.
NZ_DTYPES = ("bfloat16", "float16", "float32", "int32", "int8")
#: 8-bit types whose FRACTAL_NZ layout exists on the Ascend 950 only: float8_e4m3fn and hifloat8
#: (carried as uint8), cast with a ``customize_dtype`` of the same type (ops-math
#: ``conversion/npu_format_cast/docs/aclnnNpuFormatCast.md``, the 950 table); C0 = 32, as int8.
NZ_950_DTYPES = ("uint8", "float8_e4m3fn")
_SUPPORTED = NZ_DTYPES + NZ_950_DTYPES


def _check_dtype(dtype: np.dtype, name: str = "x") -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype.name not in _SUPPORTED:
        raise arg_error(DTypeError, name, f"one of {', '.join(_SUPPORTED)} for FRACTAL_NZ", dtype)
    return dtype


def c0_for(dtype) -> int:
    """Columns per fractal, C0, of matrix FRACTAL_NZ for ``dtype``.

    Returns ``32 // min(itemsize, 2)``: 16 for bf16 / fp16 / fp32 / int32, 32 for int8 (and for
    the Ascend 950's :data:`NZ_950_DTYPES`).

    Raises:
        DTypeError: dtype not one of bf16, fp16, fp32, int32, int8, uint8, float8_e4m3fn.
    """
    dtype = _check_dtype(dtype, "dtype")
    return FRACTAL_ROW_BYTES // min(dtype.itemsize, 2)


def _as_matrix_shape(shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(int(s) for s in shape)
    if len(shape) == 0:
        return (1, 1)
    if len(shape) == 1:
        return (shape[0], 1)
    return shape


def nz_shape(shape: Sequence[int], dtype) -> tuple[int, ...]:
    """Storage shape of an ND tensor of ``shape`` / ``dtype`` cast to FRACTAL_NZ.

    Args:
        shape: logical ND shape ``[..., M, N]`` (1-D and 0-D follow the rules in the module doc).
        dtype: element dtype.

    Returns:
        ``(..., ceil(N/C0), ceil(M/16), 16, C0)``.

    Raises:
        DTypeError: unsupported dtype.
    """
    c0 = c0_for(dtype)
    *batch, m, n = _as_matrix_shape(shape)
    return (*batch, -(-n // c0), -(-m // M0), M0, c0)


def nd_to_nz(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    """Lay an ND array out as FRACTAL_NZ storage (zero padded), as ``npu_format_cast(x, 29)``
    stores it (docs/sources.md#fractal_nz).

    Element ``(..., m, n)`` goes to storage ``[..., n // C0, m // 16, m % 16, n % C0]``; the
    padding rows ``m >= M`` and columns ``n >= N`` of the last fractals are zero.

    Args:
        x: ``[..., M, N]`` array of bf16 / fp16 / fp32 / int32 / int8, any strides; a 1-D ``[L]``
            is laid out as ``[L, 1]`` and a 0-D as ``[1, 1]``.
        out: optional C-contiguous array of ``x.dtype`` and shape
            :func:`nz_shape` ``(x.shape, x.dtype)`` to write into (every byte is written).

    Returns:
        ``out``, or a new C-contiguous array of that dtype and shape.

    Raises:
        DTypeError: unsupported dtype, or ``out`` of another dtype.
        ShapeError: ``out`` of the wrong shape, or not C-contiguous / writable.
    """
    x = np.asarray(x)
    c0 = c0_for(x.dtype)
    want = nz_shape(x.shape, x.dtype)
    if out is None:
        out = np.empty(want, dtype=x.dtype)
    else:
        _check_out(out, want, x.dtype)
    mat = x.reshape(_as_matrix_shape(x.shape))  # [..., M, N]
    if out.size == 0:
        return out
    if not _nd_to_nz_parallel(mat, out, c0):
        _nd_to_nz_numpy(mat, out, c0)
    return out


def _check_out(out, want: tuple[int, ...], dtype: np.dtype) -> None:
    if not isinstance(out, np.ndarray) or out.dtype != dtype:
        raise arg_error(DTypeError, "out", f"an array of dtype {dtype.name}",
                        getattr(out, "dtype", type(out).__name__))
    if out.shape != want:
        raise arg_error(ShapeError, "out", f"NZ storage shape {want}", out.shape)
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise arg_error(ShapeError, "out", "a C-contiguous writable array", f"strides {out.strides}")


def _nd_to_nz_numpy(mat: np.ndarray, out: np.ndarray, c0: int) -> None:
    """NumPy path of :func:`nd_to_nz`: any dtype, shape and strides. ``mat`` is ``[..., M, N]``."""
    *batch, m, n = mat.shape
    nb = len(batch)
    dst = out.reshape(*batch, out.shape[-4], out.shape[-3] * M0, c0)  # [..., N/C0, M_pad, C0]
    full = n // c0
    if full:
        # [..., M, full, C0] -> [..., full, M, C0]
        src = mat[..., : full * c0].reshape(*batch, m, full, c0)
        dst[..., :full, :m, :] = np.moveaxis(src, nb + 1, nb)
    if n % c0:
        dst[..., full, :m, : n % c0] = mat[..., full * c0:]
        dst[..., full, :m, n % c0:] = 0
    dst[..., m:, :] = 0


#: Arrays smaller than this take the NumPy path (no thread start-up for tiny weights).
PARALLEL_MIN_BYTES = 1 << 16
#: Source rows one parallel task moves (one fractal: 16 rows x 32 B = 512 contiguous bytes per
#: column block); 16 concurrent read streams also suit the hardware prefetchers best.
TILE_ROWS = 16
_WORD = 8  # the parallel copy moves uint64 words; a fractal row is 4 (32 B) or 8 (64 B) words


def _nd_to_nz_parallel(mat: np.ndarray, out: np.ndarray, c0: int) -> bool:
    """Parallel Numba copy for the common case; returns False (nothing written) when it does
    not apply: small arrays, N not a multiple of C0, or buffers not 8-byte aligned."""
    *batch, m, n = mat.shape
    if mat.nbytes < PARALLEL_MIN_BYTES or n % c0:
        return False
    src = np.ascontiguousarray(mat)
    if src.ctypes.data % _WORD or out.ctypes.data % _WORD:
        return False
    row_words = n * src.itemsize // _WORD
    chunk_words = c0 * src.itemsize // _WORD
    nbatch = int(np.prod(batch, dtype=np.int64)) if batch else 1
    _nd_to_nz_words(src.reshape(-1).view(np.uint64), out.reshape(-1).view(np.uint64),
                    nbatch, m, out.shape[-3] * M0, row_words, n // c0, chunk_words)
    return True


@intrinsic
def _store_streaming(typingctx, arr, idx, val):
    """``arr[idx] = val`` as a non-temporal (streaming) store, for 1-D arrays inside Numba.

    The written cache lines bypass the cache hierarchy, so a large layout copy moves one read
    and one write stream (as memcpy does) instead of also reading every destination line first.
    Streaming stores are weakly ordered: a task ends with :func:`_store_fence`.
    """
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and isinstance(idx, types.Integer)
            and val == arr.dtype):
        return None

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        store = builder.store(args[2], builder.gep(ary.data, [args[1]]))
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return types.void(arr, idx, val), codegen


@intrinsic
def _store_fence(typingctx):
    """A full memory fence inside Numba: earlier streaming stores become visible to every thread."""

    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return types.void(), codegen


@njit(cache=True, parallel=True)
def _nd_to_nz_words(src, dst, nbatch, m, m_pad, row_words, n1, chunk_words):
    """src: flat uint64 ``[nbatch * M * row_words]`` (ND rows); dst: flat uint64
    ``[nbatch * n1 * m_pad * chunk_words]`` (NZ). One task = TILE_ROWS rows of one batch."""
    tiles = (m_pad + TILE_ROWS - 1) // TILE_ROWS
    for task in prange(nbatch * tiles):
        b = task // tiles
        i0 = (task % tiles) * TILE_ROWS
        i1 = min(i0 + TILE_ROWS, m_pad)
        i_data = max(min(i1, m), i0)  # rows [i0, i_data) hold data, [i_data, i1) are padding
        for j in range(n1):
            d = (b * n1 + j) * m_pad * chunk_words + i0 * chunk_words
            s = b * m * row_words + i0 * row_words + j * chunk_words
            for _ in range(i0, i_data):
                for k in range(0, chunk_words, 4):
                    _store_streaming(dst, d + k, src[s + k])
                    _store_streaming(dst, d + k + 1, src[s + k + 1])
                    _store_streaming(dst, d + k + 2, src[s + k + 2])
                    _store_streaming(dst, d + k + 3, src[s + k + 3])
                s += row_words
                d += chunk_words
            for k in range((i1 - i_data) * chunk_words):
                _store_streaming(dst, d + k, np.uint64(0))
        _store_fence()


def nz_to_nd(storage: np.ndarray, shape: Sequence[int]) -> np.ndarray:
    """Read FRACTAL_NZ storage back as the ND array of logical ``shape`` (inverse of
    :func:`nd_to_nz`, docs/sources.md#fractal_nz).

    Args:
        storage: bf16 / fp16 / fp32 / int32 / int8 array of shape :func:`nz_shape`
            ``(shape, storage.dtype)``, any strides.
        shape: the logical ND shape ``[..., M, N]`` (or 1-D / 0-D).

    Returns:
        New C-contiguous array of ``shape`` and ``storage.dtype`` (padding dropped).

    Raises:
        DTypeError: unsupported dtype.
        ShapeError: ``storage.shape`` is not the NZ shape of ``shape``.
    """
    storage = np.asarray(storage)
    want = nz_shape(shape, storage.dtype)
    if storage.shape != want:
        raise arg_error(ShapeError, "storage", f"NZ storage shape {want} for ND shape {tuple(shape)}",
                        storage.shape)
    mat_shape = _as_matrix_shape(shape)
    *batch, m, n = mat_shape
    n1, m1, _, c0 = want[-4:]
    nb = len(batch)
    s = storage.reshape(*batch, n1, m1 * M0, c0)[..., :m, :]  # [..., N/C0, M, C0]
    nd = np.moveaxis(s, nb, nb + 1).reshape(*batch, m, n1 * c0)[..., :n]
    return np.ascontiguousarray(nd).reshape(tuple(int(v) for v in shape))


def nz_offset(shape: Sequence[int], dtype, index: Sequence[int]) -> int:
    """Flat element offset, in the NZ storage, of logical element ``index`` of an ND tensor.

    ``(..., m, n)`` -> row-major offset of storage ``[..., n // C0, m // 16, m % 16, n % C0]``
    in :func:`nz_shape` (docs/sources.md#fractal_nz).

    Args:
        shape: logical ND shape.
        dtype: element dtype (bf16 / fp16 / fp32 / int32 / int8).
        index: logical coordinates, one per dim of ``shape`` (1-D: ``(m,)``; 0-D: ``()``).

    Returns:
        Offset in elements from the start of the storage (multiply by itemsize for bytes).

    Raises:
        DTypeError: unsupported dtype.
        ShapeError: ``index`` has the wrong length or lies outside ``shape``.
    """
    shape = tuple(int(s) for s in shape)
    index = tuple(int(i) for i in index)
    if len(index) != len(shape) or any(not 0 <= i < s for i, s in zip(index, shape, strict=True)):
        raise arg_error(ShapeError, "index", f"coordinates inside {shape}", index)
    st = nz_shape(shape, dtype)
    mat_index = index + (0,) * (len(_as_matrix_shape(shape)) - len(index))
    *bidx, m, n = mat_index
    c0 = st[-1]
    coords = (*bidx, n // c0, m // M0, m % M0, n % c0)
    return int(np.ravel_multi_index(coords, st))


def nz_coords(shape: Sequence[int], dtype, offset: int) -> tuple[int, ...] | None:
    """Reverse of :func:`nz_offset`: logical coordinates stored at element ``offset``.

    Every storage element is either exactly one logical element or padding (rows ``m >= M`` or
    columns ``n >= N`` of the last fractals).

    Args:
        shape: logical ND shape.
        dtype: element dtype (bf16 / fp16 / fp32 / int32 / int8).
        offset: element offset in ``[0, prod(nz_shape(shape, dtype)))``.

    Returns:
        The logical index tuple (``len(shape)`` entries), or ``None`` when ``offset`` holds
        padding.

    Raises:
        DTypeError: unsupported dtype.
        ShapeError: ``offset`` outside the storage.
    """
    shape = tuple(int(s) for s in shape)
    st = nz_shape(shape, dtype)
    size = int(np.prod(st))
    if not 0 <= int(offset) < size:
        raise arg_error(ShapeError, "offset", f"an element offset in [0, {size})", offset)
    *bidx, n1, m1, m0, c = np.unravel_index(int(offset), st)
    c0 = st[-1]
    m, n = m1 * M0 + m0, n1 * c0 + c
    mat = _as_matrix_shape(shape)
    if m >= mat[-2] or n >= mat[-1]:
        return None
    full = (*(int(b) for b in bidx), int(m), int(n))
    return full[: len(shape)]  # 1-D [L] was [L, 1]; 0-D was [1, 1]


class NZArray(np.ndarray):
    """A weight that has been cast to FRACTAL_NZ (docs/sources.md#fractal_nz,
    docs/layouts.md).

    Like a torch_npu tensor after ``npu_format_cast(x, 29)``, it shows its logical ND values
    (indexing, ``np.asarray``, shape ``[..., M, N]``) and knows its device storage
    (:meth:`storage`). Ops that require FRACTAL_NZ weights check for this type
    (:func:`get_npu_format`). Views and ufunc results of an NZArray are NZArrays too; use
    ``np.asarray`` for a plain array.
    """

    npu_format = FRACTAL_NZ

    def storage(self) -> np.ndarray:
        """The FRACTAL_NZ storage bytes as the NPU holds them (shape :func:`nz_shape`)."""
        return nd_to_nz(np.asarray(self))

    def __array_finalize__(self, obj):  # views of a cast weight stay tagged
        pass


def as_nz(x: np.ndarray) -> NZArray:
    """Copy ``x`` into a new :class:`NZArray` (the numpy form of ``npu_format_cast(x, 29)``).

    Args:
        x: bf16 / fp16 / fp32 / int32 / int8 array (uint8 / float8_e4m3fn: the Ascend 950's; the
            op contract, :func:`ascend_emu.ops.npu_format_cast`, gates them), any shape and strides.

    Returns:
        A new C-contiguous :class:`NZArray` with ``x``'s logical values.

    Raises:
        DTypeError: dtype without a FRACTAL_NZ layout.
    """
    x = np.asarray(x)
    _check_dtype(x.dtype)
    return np.array(x, copy=True, order="C").view(NZArray)


def get_npu_format(x) -> int:
    """ACL format id of ``x`` (torch_npu ``get_npu_format``): 29 (FRACTAL_NZ) for an
    :class:`NZArray`, else 2 (ND). Never raises."""
    return FRACTAL_NZ if isinstance(x, NZArray) else ND
