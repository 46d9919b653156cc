"""``torch_npu.npu_quant_lightning_indexer`` on NumPy arrays: the contract of the Atlas A2 / A3
int8 path and of the Ascend 950's FP8 E4M3 / HiFloat8 paths.

Sources: torch_npu 2.14's schema (``npu_native_functions_by_codegen.yaml``, the
``npu_quant_lightning_indexer`` entry) and meta function ``npu_quant_lightning_indexer_forward``
(``op_plugin/meta/_meta_registrations.py``: int32 ``[B, S1, N2, k]`` / ``[T, N2, k]``); the op doc
(op-plugin ``docs/zh/custom_APIs/torch_npu/torch_npu-npu_quant_lightning_indexer.md``: layouts,
shapes, N1 in [1, 64], sparse_count [1, 2048], sparse_mode 0 / 3, quant modes 0, "A3: int8 query
and key, weights / query_dequant_scale / key_dequant_scale float16, float16, float16", "W * Scale_Q
must lie in the fp16 range"); ops-transformer ``aclnnQuantLightningIndexer.md`` (key_dequant_scale
``[B, S2, N2]`` / ``[T2, N2]`` / ``[blocks, block_size, N2]``); op-plugin's binding
``op_plugin/ops/opapi/QuantLightningIndexerKernelNpuOpApi.cpp`` (``query_dtype`` / ``key_dtype``
only for hifloat8, TORCH_CHECK otherwise); the golden (op-plugin
``test/test_custom_ops/test_npu_quant_lightning_indexer.py``); vllm-ascend's C8 call site
(``vllm_ascend/device/device_op.py`` ``indexer_select_post_process`` and the ``indexer_quant_scatter``
/ ``prepare_dsa_indexer_*`` helpers: TND query, PA_BSND int8 key, weights and both scales cast
to fp16, key scale ``[blocks, block_size, 1]``) and the A2 / A3 kernel
(ops-transformer ``attention/quant_lightning_indexer/op_kernel/arch22/``: the numerics chain is in
:mod:`ascend_emu.emu.quant_lightning_indexer`).

What the op computes, per query token ``t`` of batch ``b`` (key head N2 = 1, G = N1 heads)::

    ws[h]    = fp16(w[t, h] * qs[t, h])                          fp16 product, RNE
    s[h, p]  = fp16(relu(q[t, h] . k[b, p]) / 1024)              exact int32 dot, RNE
    score[p] = fp32(sum_h ws[h] * s[h, p]) * fp32(ks[b, p])      fp32
    sparse_indices[t, 0, :] = the sparse_count positions p < limit(t) with the largest score,
                              descending, equal scores lower p first, then -1

with ``limit(t)`` and the rows that are skipped exactly as :mod:`.lightning_indexer` defines
them: the lengths, block_table, layouts, sparse modes and top-k order are that contract's, validated
by its code (:func:`ascend_emu.ops.lightning_indexer._normalise` with :data:`QUANT_DTYPES`).

The Ascend 950 (``ASCEND_EMU_SOC_NAME`` starting with ``Ascend950``; the doc's "Ascend
950PR/Ascend 950DT" constraints): query and key both FP8 E4M3 (ml_dtypes / torch
``float8_e4m3fn``, no tag) or both HiF8 (uint8 codes with ``query_dtype = key_dtype = 290``), with
(weights, query_dequant_scale, key_dequant_scale) bf16 / fp32 / fp32, or for FP8 also fp16 / fp16
/ fp16 (:data:`ELEMENT_DTYPES`, :data:`SCALE_DTYPES`); every query dtype there takes N1 in
:data:`QUERY_HEADS_950` only. On Atlas A2 / A3 the FP8 / HiF8 inputs are rejected naming the
argument and the SoC. The numerics of those paths: :mod:`ascend_emu.emu.quant_lightning_indexer`.

Choices where the sources leave room (each in one named constant below):

- :data:`QUANT_MODES`: ``query_quant_mode`` / ``key_quant_mode`` 0 only (per-token-head).
- :data:`SCALE_DTYPES`: int8: fp16 weights and scales only (the A3 constraint; the A2 doc
  lists no other int8 combination; the 950's int8 row says the same).
- ``query_dtype`` / ``key_dtype``: None or 290 (hifloat8), both alike: op-plugin's binding rejects
  any other value ("only used to support hifloat8"), so an FP8 query / key is recognised by its
  dtype; a HiF8 query / key must be uint8 (torch_npu carries hifloat8 as uint8).
- ``W * Scale_Q`` overflowing fp16 (the doc's constraint) is rejected naming ``weights``.
- Key and key_dequant_scale must be C-contiguous (the doc allows a non-contiguous axis 0 for
  PA_BSND; stricter).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..errors import DTypeError, ModeError, ShapeError, arg_error
from ..quant.fp8 import TORCH_NPU_DTYPE_CODES
from ..soc import is_ascend950, require_ascend950
from .. import checked_mode
from ._backend import get_backend
from ._check import ValidatedSignatures, check_dtype, check_shape, dtype_name, required
from .lightning_indexer import (UNBOUNDED_TOKENS, IndexerDtypes, LayoutKey, LayoutQuery,
                                LightningIndexerArgs, _int_arg, _normalise)

#: query / key dtype (the A2 / A3 path).
QUERY_DTYPE = "int8"
#: weights dtype (int8 path: FLOAT16 only).
WEIGHTS_DTYPE = "float16"
#: query_dequant_scale / key_dequant_scale dtype (int8 path: FLOAT16 only).
SCALE_DTYPE = "float16"
#: query_quant_mode / key_quant_mode values (0: per-token-head).
QUANT_MODES: tuple[int, ...] = (0,)
#: The checks shared with npu_lightning_indexer: int8 query / key, fp16 weights, k up to 2048.
QUANT_DTYPES = IndexerDtypes(query=(QUERY_DTYPE,), weights=(WEIGHTS_DTYPE,), sparse_counts_large=())
#: The same per query / key element type: int8 (any SoC), and the Ascend 950's float8_e4m3fn and
#: hifloat8 (carried as uint8), with the weights dtypes the doc pairs with each.
ELEMENT_DTYPES = {
    "int8": QUANT_DTYPES,
    "float8_e4m3fn": IndexerDtypes(query=("float8_e4m3fn",), weights=("bfloat16", "float16"), sparse_counts_large=()),
    "hifloat8": IndexerDtypes(query=("uint8",), weights=("bfloat16",), sparse_counts_large=()),
}
#: query_dequant_scale / key_dequant_scale dtype per (element type, weights dtype) (the doc's combinations).
SCALE_DTYPES = {("int8", "float16"): SCALE_DTYPE, ("float8_e4m3fn", "float16"): "float16",
                ("float8_e4m3fn", "bfloat16"): "float32", ("hifloat8", "bfloat16"): "float32"}
#: N1 values on the Ascend 950 (the doc: "query N1仅支持8、16、24、32、64").
QUERY_HEADS_950 = (8, 16, 24, 32, 64)
#: torch_npu's code of ``hifloat8``: the only query_dtype / key_dtype (op-plugin's binding).
HIFLOAT8_CODE = TORCH_NPU_DTYPE_CODES["hifloat8"]

#: Signatures whose shared static checks passed (separate from npu_lightning_indexer's).
_VALIDATED = ValidatedSignatures()


@dataclass(frozen=True, kw_only=True)
class QuantLightningIndexerArgs:
    """Validated arguments of :func:`npu_quant_lightning_indexer`.

    Attributes:
        indexer: the shared part (:class:`~ascend_emu.ops.lightning_indexer.LightningIndexerArgs`
            with int8 query / key, fp16 weights, ``return_value`` False).
        query_dequant_scale: fp16, weights' shape ``[B, S1, N1]`` / ``[T, N1]``, C-contiguous.
        key_dequant_scale: fp16, key's shape without D (``[B, S2, N2]`` / ``[T2, N2]`` /
            ``[blocks, block_size, N2]``), C-contiguous; row ``r`` scales key row ``r``.
            (Both fp32 with bf16 weights on the Ascend 950.)
        element: the query / key element type: ``int8``, ``float8_e4m3fn`` or ``hifloat8``
            (then ``indexer.query`` / ``indexer.key`` hold uint8 codes).
    """

    indexer: LightningIndexerArgs
    query_dequant_scale: np.ndarray
    key_dequant_scale: np.ndarray
    element: str = "int8"


class QuantLightningIndexerOutputs(NamedTuple):
    """What a backend returns (:mod:`ascend_emu.ops._backend`).

    Attributes:
        sparse_indices: int32 ``args.indexer.out_shape``.
    """

    sparse_indices: np.ndarray


def npu_quant_lightning_indexer(query, key, weights, query_dequant_scale, key_dequant_scale, query_quant_mode,
                                key_quant_mode, *, actual_seq_lengths_query=None, actual_seq_lengths_key=None,
                                block_table=None, layout_query: LayoutQuery = "BSND", layout_key: LayoutKey = "BSND",
                                sparse_count: int = 2048, sparse_mode: int = 3, pre_tokens: int = UNBOUNDED_TOKENS,
                                next_tokens: int = UNBOUNDED_TOKENS, query_dtype=None, key_dtype=None):
    """Top-``sparse_count`` kv positions per query token by the int8 lightning-indexer score.

    Args:
        query: int8 ``[B, S1, N1, D]`` (BSND) or ``[T, N1, D]`` (TND), C-contiguous; N1 in
            ``[1, 64]`` (Ascend 950: 8, 16, 24, 32 or 64), D = 128. Ascend 950 also: float8_e4m3fn,
            or uint8 HiF8 codes with ``query_dtype=290``.
        key: query's dtype, ``[B, S2, N2, D]`` (BSND), ``[T2, N2, D]`` (TND) or
            ``[blocks, block_size, N2, D]`` (PA_BSND, block_size a multiple of 16 up to 1024),
            C-contiguous; N2 = 1.
        weights: fp16 ``[B, S1, N1]`` / ``[T, N1]``, C-contiguous (Ascend 950, FP8 / HiF8: bf16;
            FP8 also fp16).
        query_dequant_scale: fp16 (fp32 with bf16 weights), weights' shape, C-contiguous;
            ``weights * query_dequant_scale`` must be finite in fp16.
        key_dequant_scale: query_dequant_scale's dtype, key's shape without D, C-contiguous.
        query_quant_mode, key_quant_mode: 0 (per-token-head).
        actual_seq_lengths_query, actual_seq_lengths_key, block_table, layout_query, layout_key,
        sparse_mode, pre_tokens, next_tokens: as :func:`ascend_emu.ops.npu_lightning_indexer`.
        sparse_count: k in ``[1, 2048]``. Default 2048.
        query_dtype, key_dtype: None, or both 290 (``torch_npu.hifloat8``: uint8 HiF8 query and
            key; Ascend 950 only).

    Returns:
        int32 ``[B, S1, N2, sparse_count]`` (BSND query) or ``[T, N2, sparse_count]`` (TND
        query): kv positions within the batch's sequence by score descending (equal scores lower
        position first), -1 after the last selected one and in rows the kernel skips.

    Raises:
        ShapeError, DTypeError, ModeError, IndexRangeError: as npu_lightning_indexer for the
            shared arguments (query / key must be int8, weights fp16, sparse_count at most 2048);
            a scale's dtype (DTypeError) or shape (ShapeError); a quant mode other than 0, a
            ``query_dtype`` / ``key_dtype`` other than None / 290 or unlike each other, an FP8 /
            HiF8 query on a SoC that is not an Ascend 950 (naming it), or
            ``weights * query_dequant_scale`` beyond the fp16 range (ModeError); N1 outside
            :data:`QUERY_HEADS_950` on the Ascend 950 (ShapeError).
    """
    for name, value in (("query_quant_mode", query_quant_mode), ("key_quant_mode", key_quant_mode)):
        if _int_arg(value, name) not in QUANT_MODES:
            raise arg_error(ModeError, name, f"one of {list(QUANT_MODES)} (per-token-head, the only mode the doc "
                            "allows)", value)
    element = _element(query, query_dtype, key_dtype)
    indexer = _normalise(query, key, weights, actual_seq_lengths_query, actual_seq_lengths_key, block_table,
                         layout_query, layout_key, sparse_count, sparse_mode, pre_tokens, next_tokens, False,
                         dtypes=ELEMENT_DTYPES[element], validated=_VALIDATED)
    n1 = indexer.query.shape[-2]
    if is_ascend950() and n1 not in QUERY_HEADS_950:
        raise arg_error(ShapeError, "query", f"N1 in {list(QUERY_HEADS_950)} (the Ascend 950's query heads)",
                        f"N1={n1} (shape {list(indexer.query.shape)})")
    scale_dtype = SCALE_DTYPES[element, dtype_name(indexer.weights.dtype)]
    qs = _scale(query_dequant_scale, "query_dequant_scale", indexer.weights.shape,
                "weights' shape [B, S1, N1] (BSND) / [T, N1] (TND)", scale_dtype)
    ks = _scale(key_dequant_scale, "key_dequant_scale", indexer.key.shape[:-1],
                "key's shape without D ([B, S2, N2] / [T2, N2] / [blocks, block_size, N2])", scale_dtype)
    _check_weight_scale_range(indexer.weights, qs)
    args = QuantLightningIndexerArgs(indexer=indexer, query_dequant_scale=qs, key_dequant_scale=ks, element=element)
    checked_mode.read("npu_quant_lightning_indexer", indexer.cache_reads)
    return get_backend().quant_lightning_indexer(args).sparse_indices


def _element(query, query_dtype, key_dtype) -> str:
    """The query / key element type: ``hifloat8`` for ``query_dtype = key_dtype = 290``,
    ``float8_e4m3fn`` for an FP8 E4M3 query, else ``int8`` (the shared checks then reject other
    dtypes); the Ascend 950 ones only on an Ascend 950 (checked on every call).

    Raises:
        DTypeError: a tag that is not an int. ModeError: a tag other than None / 290, tags unlike
        each other, or an FP8 / HiF8 input on another SoC (:func:`~ascend_emu.soc.require_ascend950`).
    """
    for name, value in (("query_dtype", query_dtype), ("key_dtype", key_dtype)):
        if value is not None and _int_arg(value, name) != HIFLOAT8_CODE:
            raise arg_error(ModeError, name, f"None or {HIFLOAT8_CODE} (hifloat8): {name} is only used to support "
                            "hifloat8, and is left at its default for an int8 / float8_e4m3fn tensor", repr(value))
    if query_dtype != key_dtype:
        raise arg_error(ModeError, "key_dtype", f"query_dtype's value ({query_dtype!r}): query and key share one "
                        "dtype", repr(key_dtype))
    if query_dtype is not None:
        require_ascend950("query_dtype", int(query_dtype), "hifloat8")
        if dtype_name(getattr(query, "dtype", np.int8)) != "uint8":
            raise arg_error(DTypeError, "query", "uint8 HiF8 codes with query_dtype=290",
                            dtype_name(getattr(query, "dtype", np.int8)))
        return "hifloat8"
    if dtype_name(getattr(query, "dtype", np.int8)) == "float8_e4m3fn":
        require_ascend950("query", "float8_e4m3fn", "FP8 E4M3 query / key")
        return "float8_e4m3fn"
    return "int8"


def _scale(x, name: str, shape: tuple[int, ...], what: str, dtype: str = SCALE_DTYPE) -> np.ndarray:
    """A dequant scale checked: given, ``dtype`` (:data:`SCALE_DTYPES`), ``shape``, C-contiguous."""
    x = required(x, name)
    check_dtype(x, name, (dtype,))
    check_shape(x, name, list(shape), what)
    if not x.flags.c_contiguous:
        raise arg_error(ShapeError, name, "a C-contiguous tensor (non-contiguous input is not supported)",
                        f"strides {x.strides}")
    return x


def _check_weight_scale_range(weights: np.ndarray, qs: np.ndarray) -> None:
    """The doc's constraint: ``weights * query_dequant_scale`` lies in the fp16 range (the kernel
    multiplies them in fp16; an overflow would score every key +-inf or NaN).

    Raises:
        ModeError: some product of finite factors rounds to +-inf in fp16.
    """
    w32, q32 = weights.astype(np.float32), qs.astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        prod = (w32 * q32).astype(np.float16)  # exact fp32 product (11 x 11 bits), rounded once
    bad = np.isinf(prod) & np.isfinite(w32) & np.isfinite(q32)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise arg_error(ModeError, "weights", "weights * query_dequant_scale within the fp16 range (|x| <= 65504; "
                        "doc constraint)", f"weights{list(at)} = {float(w32[at]):.6g} times query_dequant_scale"
                        f"{list(at)} = {float(q32[at]):.6g} (and {int(bad.sum()) - 1} more)")

