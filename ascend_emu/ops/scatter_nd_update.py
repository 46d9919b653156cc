"""DeepSeek-V4's row scatters on NumPy arrays: ``npu_scatter_nd_update_v2`` and
``npu_scatter_nd_update_sk`` (vllm-ascend ``torch.ops._C_ascend``) and ``scatter_nd_update_asc``
(cann-recipes-infer ``torch.ops.custom``). Pure data movement, byte-exact: row ``i`` of
``update`` is copied to the row of ``var`` that ``indices[i]`` names.

Sources (read for facts, nothing copied):

- vllm-ascend ``csrc/torch_binding.cpp`` (schema ``npu_scatter_nd_update_v2(Tensor(a!) var,
  Tensor indices, Tensor update) -> ()``; the adapter passes ``var.strides()`` on, so a strided
  ``var`` is written in place), ``csrc/moe/scatter_nd_update_v2/op_host/op_api/aclnn_scatter_nd_update_v2.cpp``
  (dtypes on Atlas A2 / A3: var and update fp32, fp16, bool, int16, bf16, int64, int8, int32,
  one dtype; indices int32 / int64) and ``op_host/scatter_nd_update_v2_tiling.cpp`` (ScatterNd:
  the last dim K of ``indices`` addresses var's first K dims; each index row writes
  ``prod(var.shape[K:])`` elements); ``vllm_ascend/device/device_op.py`` (``dsa_kv_compress_scatter``:
  the SWA / compressed caches ``[num_blocks, block_size, 1, D]`` with ``[n, 2]`` (block, offset)
  slot rows; the indexer key / scale caches the same way).
- vllm-ascend's golden ``tests/e2e/.../test_scatter_nd_update_sk.py`` ("CPU reference of
  npu_scatter_nd_update_sk": var ``[a, b]``, indices ``[n, 1]``, update ``[n, b]``, row copy;
  fp16 / bf16 / fp32 / int8 with int32 / int64 indices; a var whose rows are strided (row stride
  2b); duplicate indices only with identical updates) and its DeepSeek-V4.1 callers
  (``npu_scatter_nd_update_sk(cache, slot_mapping, x)`` on 4-D caches with ``[n, 2]`` rows, page
  padded so that the block stride exceeds ``block_size * row``). Its schema is read as v2's
  (the newer ``torch_binding.cpp`` declaring it was not read).
- cann-recipes-infer ``ops/ascendc/docs/custom-npu_scatter_nd_update_asc.md`` (var ``[b, s]``
  bf16 / fp16 / int8, indices ``[u, 1]`` int32 / int64, update ``[u, s]`` of var's dtype, no
  non-contiguous tensors; ``s`` 1, 128 or 512; ``u <= b``; no out-of-range index; negative
  indices skipped) and its adapter ``custom_ops/csrc/npu_scatter_nd_update_asc.cpp`` (var
  2-D, both dims >= 1, ``var.shape[1] <= 32768``; indices 2-D ``[c >= 1, 1]``; update ``[c, b]``).

Choices where the sources leave room (stricter than the hardware, never looser), docs/v4.md:

- The index policy of every V4 writer (:func:`ascend_emu.ops._check.writer_slots`): a row whose
  index is -1 (``[-1]``, or ``[-1, x]`` with x -1 or in range) is skipped; every other value
  outside var's dims is rejected before anything is written (ScatterNdUpdateV2 silently skips
  rows past the whole cache but writes ``[b, offset >= block_size]`` into a later block);
  duplicate rows: DuplicateSlotWarning, the last row wins (undefined on hardware unless the
  updates are identical).
- ``indices`` 2-D ``[n, K]``, K 1 or 2 (the forms the callers use; ``custom``: K = 1). A 1-D
  tensor is rejected (ScatterNd would read it as one index of K = n): pass ``slots.view(-1, 1)``.
- ``update`` ``[n, ...]`` with ``prod(update.shape[1:]) == prod(var.shape[K:])`` (the kernels read
  it as ``[n, row]``; vllm-ascend passes the indexer scales as ``[n, 1, 1, 1]`` for a
  ``[nb, bs, 1, 1]`` cache); ``custom``: exactly ``[n, s]``.
- ``_C_ascend``: var may be strided (a page-padded cache plane, a row-strided view) as long as
  each row is C-contiguous and rows do not overlap (leading strides at least a row / a block
  apart); ``custom``: every tensor C-contiguous, as its doc says. Every var dim >= 1; n may be 0
  in ``_C_ascend`` (a no-op), must be >= 1 and <= var.shape[0] in ``custom``.
- No SoC gating: ``_C_ascend``'s kernels are A2 / A3 ones (the 950 dtype list is disabled in the
  read source), ``custom``'s doc lists the A3 only; all run on the default A2 too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .. import checked_mode
from ..errors import ShapeError, arg_error
from ..layouts import CacheLayout
from ._backend import get_backend
from ._check import (ValidatedSignatures, check_call_bytes, check_disjoint, check_dtype, dtype_name, required,
                     signature, trusted, write_targets, writer_slots_and_duplicates)

V2 = "npu_scatter_nd_update_v2"
SK = "npu_scatter_nd_update_sk"
ASC = "scatter_nd_update_asc"

#: var / update dtypes per op (v2: aclnn_scatter_nd_update_v2.cpp's Atlas A2 list; sk: its golden;
#: asc: its doc).
VAR_DTYPES = {
    V2: ("float32", "float16", "bool", "int16", "bfloat16", "int64", "int8", "int32"),
    SK: ("float16", "bfloat16", "float32", "int8"),
    ASC: ("bfloat16", "float16", "int8"),
}
INDEX_DTYPES = ("int32", "int64")
#: custom.scatter_nd_update_asc: the row widths its doc allows, and its adapter's bound on var.shape[1].
ASC_ROW_WIDTHS = (1, 128, 512)
ASC_MAX_ROW = 32768


@dataclass(frozen=True)
class ScatterNdArgs:
    """Normalised, validated arguments of the row scatters.

    Attributes:
        op: :data:`V2`, :data:`SK` or :data:`ASC`.
        var: the table written in place, as passed (possibly a strided view, ``_C_ascend``).
        indices: ``[n, K]`` as passed.
        update: ``[n, ...]`` as passed (read).
        index_dims: ``var.shape[:K]``, the dims the index rows address.
        slots: int64 ``[n]``: row ``i``'s flat position in ``index_dims`` (``block * block_size +
            offset`` for K = 2), -1 for a skipped row.
        duplicates: two rows name one slot (the contract warned; the last row is written).
    """

    op: str
    var: np.ndarray
    indices: np.ndarray
    update: np.ndarray
    index_dims: tuple[int, ...]
    slots: np.ndarray
    duplicates: bool = False

    @property
    def written(self) -> tuple[np.ndarray]:
        """The array the op writes: ``var``."""
        return (self.var,)


class ScatterNdOutputs(NamedTuple):
    """What a backend returns: ``var``, written in place (the very object of :attr:`ScatterNdArgs.var`)."""

    var: np.ndarray


def _check_rows_layout(var: np.ndarray, k: int) -> None:
    """``_C_ascend``'s var: each row (``var.shape[k:]``) C-contiguous, rows and blocks apart.

    Raises:
        ShapeError: a row not C-contiguous, or two rows that overlap in memory.
    """
    row_bytes = math.prod(var.shape[k:]) * var.itemsize
    row = var[(0,) * k]
    if not (row.flags.c_contiguous if isinstance(row, np.ndarray) else True):
        raise arg_error(ShapeError, "var", f"rows (dims {k}:) C-contiguous (each index row writes one "
                        "contiguous run of elements)", f"strides {var.strides}")
    lead = var.strides[:k]
    step = lead[-1] if var.shape[k - 1] > 1 else row_bytes  # bytes from one index row to the next
    apart = step >= row_bytes
    if k == 2 and var.shape[0] > 1:
        apart = apart and lead[0] >= var.shape[1] * step
    if not apart:
        raise arg_error(ShapeError, "var", "rows that do not overlap (leading strides at least one row "
                        f"of {row_bytes} bytes apart, blocks at least one block apart)", f"strides {var.strides}")


#: Call signatures (op, var, indices, update) whose static checks passed, with var's index dims
#: and slot map; only for a C-contiguous var (the signature does not hold a strided var's strides).
_VALIDATED = ValidatedSignatures()


def _scatter_nd(op: str, var, indices, update) -> None:
    """The shared contract (module doc); writes ``var`` through the backend. The checks that
    read no value or address (:func:`_static`) run once per call signature of a C-contiguous
    var; the index values and the memory overlap on every call."""
    given = (op, var, indices, update)
    key = signature(*given) if type(var) is np.ndarray and var.flags.c_contiguous else None
    st = _VALIDATED.get(key)
    if st is None:
        var, indices, update = required(var, "var"), required(indices, "indices"), required(update, "update")
        st = _static(*given[:1], var, indices, update)
    dims, layout = st
    check_disjoint((("var", var),), (("indices", indices), ("update", update)))
    slots, duplicates = writer_slots_and_duplicates(indices, dims, name="indices")
    _VALIDATED.put(key, st)
    args = write_targets(trusted(ScatterNdArgs, op=op, var=var, indices=indices, update=update, index_dims=dims,
                                 slots=slots, duplicates=duplicates), ("var",))
    caches = ((args.var, layout, var),)
    checked_mode.will_write(*caches)
    get_backend().scatter_nd_update(args)
    checked_mode.wrote(op, slots, caches)


def _static(op: str, var: np.ndarray, indices: np.ndarray, update: np.ndarray) -> tuple:
    """The checks of :func:`_scatter_nd` that read no value or address, in its order: returns
    ``(index dims, slot map)`` (:func:`_rows_layout`). Raises as the ops document."""
    check_dtype(var, "var", VAR_DTYPES[op])
    check_dtype(update, "update", (dtype_name(var.dtype),))
    check_dtype(indices, "indices", INDEX_DTYPES)
    custom = op == ASC
    if indices.ndim != 2 or indices.shape[1] not in ((1,) if custom else (1, 2)):
        want = "[u, 1]" if custom else "[n, 1] (flat rows) or [n, 2] ((block, offset) rows)"
        hint = " (for flat slots pass slots.view(-1, 1))" if indices.ndim == 1 else ""
        raise arg_error(ShapeError, "indices", f"a 2-D {want} tensor{hint}", f"shape {list(indices.shape)}")
    n, k = indices.shape
    if var.ndim < max(k, 1) or min(var.shape) < 1 or (custom and var.ndim != 2):
        want = "a 2-D [b, s] tensor" if custom else f"at least {k}-D (indices address its first {k} dims)"
        raise arg_error(ShapeError, "var", f"{want}, every dim >= 1", f"shape {list(var.shape)}")
    row = math.prod(var.shape[k:])
    if custom:
        if var.shape[1] not in ASC_ROW_WIDTHS or var.shape[1] > ASC_MAX_ROW:
            raise arg_error(ShapeError, "var", f"[b, s] with s in {list(ASC_ROW_WIDTHS)} (the doc's row widths)",
                            f"shape {list(var.shape)}")
        if not 1 <= n <= var.shape[0]:
            raise arg_error(ShapeError, "indices", f"[u, 1] with 1 <= u <= b = {var.shape[0]} (var's rows)",
                            f"shape {list(indices.shape)}")
        if update.shape != (n, var.shape[1]):
            raise arg_error(ShapeError, "update", f"[u={n}, s={var.shape[1]}]", f"shape {list(update.shape)}")
        for name, a in (("var", var), ("indices", indices), ("update", update)):
            if not a.flags.c_contiguous:
                raise arg_error(ShapeError, name, "a C-contiguous tensor (the doc: no non-contiguous tensors)",
                                f"strides {a.strides}")
    else:
        if update.ndim < 1 or update.shape[0] != n or math.prod(update.shape[1:]) != row:
            raise arg_error(ShapeError, "update", f"[n={n}, ...] holding {row} element(s) per row (var.shape[{k}:] = "
                            f"{list(var.shape[k:])})", f"shape {list(update.shape)}")
        _check_rows_layout(var, k)
    if not var.flags.writeable:
        raise arg_error(ShapeError, "var", "a writable tensor (updated in place)", "a read-only array")
    check_call_bytes(update, "update", 2 * update.itemsize, "update working copies")  # a broadcast view?
    dims = tuple(int(d) for d in var.shape[:k])
    return dims, _rows_layout(var, dims)


def _rows_layout(var: np.ndarray, dims: tuple[int, ...]) -> CacheLayout | None:
    """var as checked mode's written-slot map and replay see it: a PA_BSND cache of
    ``prod(dims)`` rows (``[num_blocks, block_size]`` for K = 2, blocks of one row for K = 1),
    rows of bytes where the itemsize is not 1, 2 or 4. None for a strided var (the map and
    poisoning address a cache's whole contiguous memory)."""
    if not var.flags.c_contiguous:
        return None
    row = math.prod(var.shape[len(dims):])
    nb, bs = (dims[0], dims[1]) if len(dims) == 2 else (dims[0], 1)
    size = var.itemsize if var.itemsize in (1, 2, 4) else 1
    return CacheLayout(mode="PA_BSND", num_blocks=nb, block_size=bs, dim=row * var.itemsize // size,
                       itemsize=size, heads=1)


def npu_scatter_nd_update_v2(var, indices, update) -> None:
    """``torch.ops._C_ascend.npu_scatter_nd_update_v2``: copy row ``i`` of ``update`` to the row of
    ``var`` that ``indices[i]`` names, in place (module doc).

    ``indices[i] = [r]`` writes ``var[r]``; ``[b, o]`` writes ``var[b, o]`` (block, offset in the
    block). Rows with index -1 are skipped; byte-exact.

    Args:
        var: ``[d0, ...]`` (K = 1) or ``[num_blocks, block_size, ...]`` (K = 2); fp32, fp16, bf16,
            bool, int8, int16, int32 or int64; writable; each row (``var.shape[K:]``)
            C-contiguous, the leading dims may be strided (page padding); updated in place.
        indices: int32 / int64 ``[n, K]``, K 1 or 2; values in ``[0, var.shape[k])`` per column, or
            a row starting with -1 (skipped; the other column -1 or in range).
        update: ``[n, ...]`` of var's dtype, ``prod(update.shape[1:]) == prod(var.shape[K:])``.

    Returns:
        None; var is updated in place.

    Raises:
        DTypeError: a dtype other than the above.
        ShapeError: a shape other than the above, overlapping rows, a read-only var, var sharing
            memory with indices / update.
        IndexRangeError: an index out of range (the message names ``indices[i, k]``); nothing written.

    Warns:
        DuplicateSlotWarning: two rows name one row of var (the last one is kept).

    Source: vllm-ascend ``csrc/torch_binding.cpp`` and ``csrc/moe/scatter_nd_update_v2/``.
    """
    _scatter_nd(V2, var, indices, update)


def npu_scatter_nd_update_sk(var, indices, update) -> None:
    """``torch.ops._C_ascend.npu_scatter_nd_update_sk``: :func:`npu_scatter_nd_update_v2`'s contract
    (the later kernel DeepSeek-V4.1's vllm-ascend calls instead) with its golden's dtypes.

    Args:
        var: as :func:`npu_scatter_nd_update_v2`, fp16 / bf16 / fp32 / int8.
        indices: as :func:`npu_scatter_nd_update_v2`.
        update: as :func:`npu_scatter_nd_update_v2`.

    Returns:
        None; var is updated in place.

    Raises:
        DTypeError, ShapeError, IndexRangeError: as :func:`npu_scatter_nd_update_v2`.

    Warns:
        DuplicateSlotWarning: as :func:`npu_scatter_nd_update_v2`.

    Source: vllm-ascend ``tests/e2e/.../test_scatter_nd_update_sk.py`` (golden) and its callers.
    """
    _scatter_nd(SK, var, indices, update)


def scatter_nd_update_asc(var, indices, update) -> None:
    """``torch.ops.custom.scatter_nd_update_asc``: ``var[indices[i, 0]] = update[i]`` in place,
    rows with index -1 skipped (module doc); byte-exact.

    Args:
        var: ``[b, s]`` bf16 / fp16 / int8, s 1, 128 or 512, C-contiguous, writable.
        indices: int32 / int64 ``[u, 1]``, 1 <= u <= b, values in ``[0, b)`` or -1; C-contiguous.
        update: ``[u, s]`` of var's dtype, C-contiguous.

    Returns:
        None; var is updated in place.

    Raises:
        DTypeError, ShapeError, IndexRangeError: as :func:`npu_scatter_nd_update_v2`, with these
            shapes.

    Warns:
        DuplicateSlotWarning: two rows name one row of var (the last one is kept).

    Source: cann-recipes-infer ``ops/ascendc/docs/custom-npu_scatter_nd_update_asc.md``.
    """
    _scatter_nd(ASC, var, indices, update)
