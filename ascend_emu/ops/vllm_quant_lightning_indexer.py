"""DeepSeek-V4's ``npu_vllm_quant_lightning_indexer`` (+ ``_metadata``), A2 / A3 int8 path: the contract.

vllm-ascend's ``torch.ops._C_ascend.npu_vllm_quant_lightning_indexer`` scores a **compressed**
key cache (``cmp_ratio`` original tokens per key row) with the int8 lightning-indexer score of
:func:`ascend_emu.ops.npu_quant_lightning_indexer` (``TopK(sum_g W * ReLU(scale_q * scale_k * q.k))``,
its numerics, its tie order: equal scores lower row first, then -1) and returns, per query token,
the top-``sparse_count`` compressed rows. What ``cmp_ratio`` changes (the A2 / A3 kernel,
``op_kernel/arch32/quant_lightning_indexer_kernel.h`` ``GetS1S2ActualSeqLen`` and
``quant_lightning_indexer_service_vector.h``):

- ``actual_seq_lengths_key[b]`` is the request's **original** token count S2; the key rows read
  are the ``S2 // cmp_ratio`` compressed rows (through ``block_table``, PA_BSND);
- sparse_mode 3 (right-down causal): query ``i`` of ``S1`` queries sits at original position
  ``p = S2 - S1 + i`` and sees compressed rows ``[0, (p + 1) // cmp_ratio)``; a row that sees none
  is all -1. sparse_mode 0: every token sees all ``S2 // cmp_ratio`` rows.

The Ascend 950 (an emulated ``Ascend950*`` SoC; README: "query, key: no INT8; weights, scales:
no FLOAT16" there): FP8 E4M3FN query and key with fp32 weights and scales, scored by the FP8 chain
of :mod:`ascend_emu.emu.quant_lightning_indexer` (``ws = fp32(w * qs)``, ``s = relu(q . k)`` in fp32,
no fp16 staging); ``cmp_ratio`` 1, 4 or 128 and ``sparse_count`` 512 only; ``weights *
query_dequant_scale`` within fp32. A query that sees fewer than ``sparse_count`` rows gets them in
row order, then -1 (the arch35 kernel's ``CreateVecIndex``: no scoring); one that sees more gets
its top rows by score in the A2 / A3 order (the arch35 histogram top-k's own order is not
reproduced: **unverified**).

Checks (never looser than the README, ``csrc/attention/vllm_quant_lightning_indexer/README.md``):
int8 query / key, fp16 weights and scales on Atlas A2 / A3 (the 950: above);
N1 64, N2 1, D 128; ``layout_key`` PA_BSND only, ``actual_seq_lengths_key`` required;
``cmp_ratio`` in 1, 2, 4, ..., 128; ``return_value`` False only (README: not supported);
``metadata`` required, the plan of :func:`npu_vllm_quant_lightning_indexer_metadata` for this
call (:data:`PLAN_FIELDS`; a zero-filled tensor fails); everything else as
:func:`~ascend_emu.ops.npu_quant_lightning_indexer` checks it (a block-table width error counts
compressed rows).

Sources: vllm-project/vllm-ascend ``csrc/attention/vllm_quant_lightning_indexer/README.md``,
``csrc/torch_binding.cpp`` (schemas), ``vllm_ascend/models/deepseek_v4/indexer.py`` (the caller)
(docs/sources.md).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import DTypeError, ModeError, ShapeError, arg_error, describe
from ..soc import is_ascend950, soc_name
from ._backend import get_backend
from ._check import ValidatedSignatures, dtype_name, required, seq_lengths
from ._plan import PlanFormat, crc
from .lightning_indexer import SKIPPED_ROW, UNBOUNDED_TOKENS, IndexerDtypes, _int_arg, _normalise
from .quant_lightning_indexer import (QUANT_DTYPES, SCALE_DTYPE, QuantLightningIndexerArgs, _check_weight_scale_range,
                                      _scale)

#: cmp_ratio values on Atlas A3 (README).
CMP_RATIOS = (1, 2, 4, 8, 16, 32, 64, 128)
#: cmp_ratio values and the only sparse_count on the Ascend 950 (README).
CMP_RATIOS_950 = (1, 4, 128)
SPARSE_COUNT_950 = 512
#: The Ascend 950's element types: FP8 E4M3FN query and key, fp32 weights and scales (README:
#: "query, key: no INT8; weights, scales: no FLOAT16" on the 950, the opposite on A2 / A3).
FP8_DTYPES_950 = IndexerDtypes(query=("float8_e4m3fn",), weights=("float32",), sparse_counts_large=())
#: Query heads, key heads, head dim (README).
NUM_HEADS_Q, NUM_HEADS_K, HEAD_DIM = 64, 1, 128
#: First word of the plan (ASCII "VQL1").
PLAN_MAGIC = 0x56514C31
PLAN_VERSION = 1
#: The plan's words, in order (docs/ops.md); the rest of the 1024 words are 0.
PLAN_FIELDS = ("magic", "version", "num_heads_q", "num_heads_k", "head_dim", "query_quant_mode", "key_quant_mode",
               "batch_size", "layout_query", "layout_key", "sparse_count", "sparse_mode", "cmp_ratio",
               "max_seqlen_q", "max_seqlen_k", "crc_actual_seq_lengths_query", "crc_actual_seq_lengths_key",
               "checksum")
PLAN = PlanFormat(PLAN_MAGIC, PLAN_VERSION, PLAN_FIELDS,
                  "npu_vllm_quant_lightning_indexer_metadata (custom: npu_quant_lightning_indexer_metadata)",
                  "README: it cannot be empty", ("max_seqlen_q", "max_seqlen_k"))
LAYOUT_CODES = {"BSND": 1, "TND": 2, "PA_BSND": 3}
_VALIDATED = ValidatedSignatures()


def _int(value, name: str, allowed=None, why: str = "") -> int:
    v = _int_arg(value, name)
    if allowed is not None and v not in allowed:
        raise arg_error(ModeError, name, f"one of {list(allowed)}{' (' + why + ')' if why else ''}", v)
    return v


#: Key cache layouts the README supports.
KEY_LAYOUTS = ("PA_BSND",)

def _modes(layout_query, layout_key, query_quant_mode, key_quant_mode, sparse_mode, pre_tokens, next_tokens,
           cmp_ratio, sparse_count) -> None:
    if layout_query not in ("BSND", "TND"):
        raise arg_error(ModeError, "layout_query", "one of ['BSND', 'TND']", describe(layout_query))
    if layout_key not in KEY_LAYOUTS:
        raise arg_error(ModeError, "layout_key", "'PA_BSND' (README: the only key layout)", describe(layout_key))
    _int(query_quant_mode, "query_quant_mode", (0,), "per-token-head, the only mode")
    _int(key_quant_mode, "key_quant_mode", (0,), "per-token-head, the only mode")
    _int(sparse_mode, "sparse_mode", (0, 3), "0 no mask, 3 right-down causal")
    for name, v in (("pre_tokens", pre_tokens), ("next_tokens", next_tokens)):
        _int(v, name, (UNBOUNDED_TOKENS,), "README: only the default")
    if is_ascend950():
        _int(cmp_ratio, "cmp_ratio", CMP_RATIOS_950, "README: the Ascend 950's values")
        _int(sparse_count, "sparse_count", (SPARSE_COUNT_950,), "README: the Ascend 950 supports 512")
        return
    _int(cmp_ratio, "cmp_ratio", CMP_RATIOS, "README: Atlas A3's values")
    _int(sparse_count, "sparse_count")
    if not 1 <= sparse_count <= 2048:
        raise arg_error(ModeError, "sparse_count", "an int in [1, 2048] (Atlas A3)", sparse_count)


def npu_vllm_quant_lightning_indexer_metadata(num_heads_q: int, num_heads_k: int, head_dim: int,
                                              query_quant_mode: int, key_quant_mode: int,
                                              actual_seq_lengths_query=None, actual_seq_lengths_key=None,
                                              batch_size: int = 0, max_seqlen_q: int = 0, max_seqlen_k: int = 0,
                                              layout_query: str = "BSND", layout_key: str = "BSND",
                                              sparse_count: int = 2048, sparse_mode: int = 3,
                                              pre_tokens: int = UNBOUNDED_TOKENS, next_tokens: int = UNBOUNDED_TOKENS,
                                              cmp_ratio: int = 1, device: str = "npu") -> np.ndarray:
    """``npu_vllm_quant_lightning_indexer_metadata``: the int32 ``[1024]`` plan the indexer requires.

    Words (:data:`PLAN_FIELDS`): magic ``0x56514C31``, version 1, the arguments as checked (layout
    codes :data:`LAYOUT_CODES`), CRC-32s of both length tensors (0 when absent), a CRC-32 of the
    words before it; the rest 0.

    Args:
        num_heads_q, num_heads_k, head_dim: 64, 1, 128. query_quant_mode, key_quant_mode: 0.
        actual_seq_lengths_query: int32 (TND: required prefix sums). actual_seq_lengths_key:
            int32 ``[B]`` original token counts (required).
        batch_size: B (the key lengths' count). max_seqlen_q, max_seqlen_k: >= the actual maxima.
        layout_query: BSND / TND; layout_key: PA_BSND; sparse_count 1..2048; sparse_mode 0 / 3;
        pre_tokens, next_tokens: the defaults; cmp_ratio: :data:`CMP_RATIOS`; device: a str.

    Returns:
        int32 ``[1024]``.

    Raises:
        ModeError, ShapeError, DTypeError: naming the argument.
    """
    _int(num_heads_q, "num_heads_q", (NUM_HEADS_Q,), "README")
    _int(num_heads_k, "num_heads_k", (NUM_HEADS_K,), "README")
    _int(head_dim, "head_dim", (HEAD_DIM,), "README")
    _modes(layout_query, layout_key, query_quant_mode, key_quant_mode, sparse_mode, pre_tokens, next_tokens,
           cmp_ratio, sparse_count)
    if not isinstance(device, str):
        raise arg_error(ModeError, "device", "a str", describe(device))
    act_k = seq_lengths(required(actual_seq_lengths_key, "actual_seq_lengths_key"), "actual_seq_lengths_key")
    b = act_k.size
    _int(batch_size, "batch_size", (b,), "the length of actual_seq_lengths_key")
    if (act_k < 0).any():
        i = int(np.argmax(act_k < 0))
        raise arg_error(ShapeError, f"actual_seq_lengths_key[{i}]", "a token count >= 0", int(act_k[i]))
    q_max = 0
    if actual_seq_lengths_query is not None or layout_query == "TND":
        act_q = seq_lengths(required(actual_seq_lengths_query, "actual_seq_lengths_query"),
                            "actual_seq_lengths_query", b)
        if layout_query == "TND":
            steps = np.diff(act_q, prepend=0)
            if (steps < 0).any():
                i = int(np.argmax(steps < 0))
                raise arg_error(ShapeError, f"actual_seq_lengths_query[{i}]", "a non-decreasing prefix sum >= 0 (TND)",
                                f"{int(act_q[i])} after {int(act_q[i - 1]) if i else 0}")
            q_max = int(steps.max())
        else:
            q_max = int(act_q.max())
    if _int(max_seqlen_q, "max_seqlen_q") < max(q_max, 1):
        raise arg_error(ModeError, "max_seqlen_q", f"an int >= {max(q_max, 1)} (the longest query run)", max_seqlen_q)
    if _int(max_seqlen_k, "max_seqlen_k") < int(act_k.max()):
        raise arg_error(ModeError, "max_seqlen_k", f"an int >= max(actual_seq_lengths_key) = {int(act_k.max())}",
                        max_seqlen_k)
    words = [PLAN_MAGIC, PLAN_VERSION, num_heads_q, num_heads_k, head_dim, query_quant_mode, key_quant_mode, b,
             LAYOUT_CODES[layout_query], LAYOUT_CODES[layout_key], sparse_count, sparse_mode, cmp_ratio,
             int(max_seqlen_q), int(max_seqlen_k), crc(actual_seq_lengths_query), crc(actual_seq_lengths_key)]
    return PLAN.encode(words)


def npu_vllm_quant_lightning_indexer(query, key, weights, query_dequant_scale, key_dequant_scale,
                                     query_quant_mode: int = 0, key_quant_mode: int = 0, actual_seq_lengths_query=None,
                                     actual_seq_lengths_key=None, block_table=None, metadata=None,
                                     layout_query: str = "BSND", layout_key: str = "BSND", sparse_count: int = 2048,
                                     sparse_mode: int = 3, pre_tokens: int = UNBOUNDED_TOKENS,
                                     next_tokens: int = UNBOUNDED_TOKENS, cmp_ratio: int = 1,
                                     return_value: bool = False):
    """Top-``sparse_count`` compressed key rows per query token (module doc).

    Args:
        query: int8 ``[B, S1, 64, 128]`` (BSND) / ``[T, 64, 128]`` (TND).
        key: int8 ``[blocks, block_size, 1, 128]`` compressed rows (PA_BSND).
        weights, query_dequant_scale: fp16 ``[B, S1, 64]`` / ``[T, 64]``; key_dequant_scale: fp16
            ``[blocks, block_size, 1]``.
        query_quant_mode, key_quant_mode: 0.
        actual_seq_lengths_query: as npu_quant_lightning_indexer (TND: prefix sums, required).
        actual_seq_lengths_key: int32 ``[B]`` original token counts (required).
        block_table: int32 ``[B, >= ceil(max(S2 // cmp_ratio) / block_size)]``.
        metadata: the plan for this call (required).
        layout_query: BSND / TND; layout_key: PA_BSND; sparse_count: 1..2048; sparse_mode: 0 / 3;
        pre_tokens, next_tokens: the defaults; cmp_ratio: :data:`CMP_RATIOS`; return_value: False.

    Returns:
        ``(sparse_indices, sparse_values)``: int32 ``[B, S1, 1, k]`` / ``[T, 1, k]`` compressed
        row numbers (score descending, equal scores lower row first, -1 after); fp32 ``[0]``.

    Raises:
        ModeError, ShapeError, DTypeError, IndexRangeError: naming the argument.
    """
    return _compressed(query, key, weights, query_dequant_scale, key_dequant_scale, query_quant_mode, key_quant_mode,
                       actual_seq_lengths_query, actual_seq_lengths_key, block_table, metadata, layout_query,
                       layout_key, sparse_count, sparse_mode, pre_tokens, next_tokens, cmp_ratio, return_value, True)


def _compressed(query, key, weights, query_dequant_scale, key_dequant_scale, query_quant_mode, key_quant_mode,
                actual_seq_lengths_query, actual_seq_lengths_key, block_table, metadata, layout_query, layout_key,
                sparse_count, sparse_mode, pre_tokens, next_tokens, cmp_ratio, return_value, metadata_required: bool):
    """The compressed-key indexer of both namespaces (module doc); ``metadata_required``: False for
    the custom binding, whose doc makes the plan optional (checked when given)."""
    _modes(layout_query, layout_key, query_quant_mode, key_quant_mode, sparse_mode, pre_tokens, next_tokens,
           cmp_ratio, sparse_count)
    if not isinstance(return_value, (bool, np.bool_)) or return_value:
        raise arg_error(ModeError, "return_value", "False (README: returning sparse_values is not supported yet)",
                        describe(return_value))
    q = required(query, "query")
    fp8 = is_ascend950()
    want = "float8_e4m3fn" if fp8 else "int8"
    if dtype_name(q.dtype) != want:
        raise arg_error(DTypeError, "query", f"dtype {want} (README: the Ascend 950 takes FP8 E4M3FN only, Atlas "
                        f"A2 / A3 int8 only; the emulated SoC is {soc_name()})", dtype_name(q.dtype))
    if q.ndim < 2 or q.shape[-2:] != (NUM_HEADS_Q, HEAD_DIM):
        raise arg_error(ShapeError, "query", f"N1 = {NUM_HEADS_Q}, D = {HEAD_DIM} in the last two dims (README)",
                        f"shape {list(q.shape)}")
    act_k = seq_lengths(required(actual_seq_lengths_key, "actual_seq_lengths_key"), "actual_seq_lengths_key")
    if (act_k < 0).any():
        i = int(np.argmax(act_k < 0))
        raise arg_error(ShapeError, f"actual_seq_lengths_key[{i}]", "a token count >= 0", int(act_k[i]))
    cmp_lens = (act_k // cmp_ratio).astype(np.int32)  # compressed rows per request
    indexer = _normalise(q, key, weights, actual_seq_lengths_query, cmp_lens, block_table, layout_query, layout_key,
                         sparse_count, 0, pre_tokens, next_tokens, False,
                         dtypes=FP8_DTYPES_950 if fp8 else QUANT_DTYPES, validated=_VALIDATED)
    # right-down causal in original positions: query i of S1 at p = S2 - S1 + i sees (p + 1) // cmp_ratio rows
    tb = indexer.token_batch
    t = tb.size
    if layout_query == "TND":
        q_lens = np.diff(seq_lengths(actual_seq_lengths_query, "actual_seq_lengths_query"), prepend=0)
    else:
        q_lens = np.full(act_k.size, q.shape[1], np.int64) if actual_seq_lengths_query is None else \
            seq_lengths(actual_seq_lengths_query, "actual_seq_lengths_query")
    starts = np.cumsum(q_lens) - q_lens if layout_query == "TND" else np.arange(act_k.size) * q.shape[1]
    i_in = np.arange(t, dtype=np.int64) - starts[tb]  # [T] index of the token within its request
    limit = indexer.limit.copy()
    if sparse_mode == 3:
        p1 = act_k[tb] - q_lens[tb] + i_in + 1
        causal = np.where(p1 > 0, p1 // cmp_ratio, 0)
        limit = np.where(indexer.limit == SKIPPED_ROW, SKIPPED_ROW, causal)
    indexer = dataclasses.replace(indexer, limit=limit, sparse_mode=int(sparse_mode))
    scale_dtype = "float32" if fp8 else SCALE_DTYPE
    qs = _scale(query_dequant_scale, "query_dequant_scale", indexer.weights.shape,
                "weights' shape [B, S1, N1] (BSND) / [T, N1] (TND)", scale_dtype)
    ks = _scale(key_dequant_scale, "key_dequant_scale", indexer.key.shape[:-1],
                "key's shape without D ([blocks, block_size, 1])", scale_dtype)
    if fp8:
        _check_fp32_product(indexer.weights, qs)
    else:
        _check_weight_scale_range(indexer.weights, qs)
    expect = {"num_heads_q": NUM_HEADS_Q, "num_heads_k": NUM_HEADS_K, "head_dim": HEAD_DIM, "query_quant_mode": 0,
              "key_quant_mode": 0, "batch_size": int(act_k.size), "layout_query": LAYOUT_CODES[layout_query],
              "layout_key": LAYOUT_CODES[layout_key], "sparse_count": int(sparse_count),
              "sparse_mode": int(sparse_mode), "cmp_ratio": int(cmp_ratio),
              "crc_actual_seq_lengths_key": crc(actual_seq_lengths_key)}
    if layout_query == "TND":
        expect["crc_actual_seq_lengths_query"] = crc(actual_seq_lengths_query)
    if metadata_required or metadata is not None:
        PLAN.check(metadata, expect, (int(q_lens.max(initial=0)), int(act_k.max())))
    args = QuantLightningIndexerArgs(indexer=indexer, query_dequant_scale=qs, key_dequant_scale=ks,
                                     element="float8_e4m3fn" if fp8 else "int8")
    idx = get_backend().vllm_quant_lightning_indexer(args).sparse_indices
    if fp8:  # the 950 kernel lists a query's rows in row order when it sees fewer than sparse_count (module doc)
        flat = idx.reshape(t, -1)
        short = (limit >= 0) & (limit < flat.shape[1])
        if short.any():
            cols = np.arange(flat.shape[1])[None, :]
            flat[short] = np.where(cols < limit[short, None], cols, -1)
        idx = flat.reshape(idx.shape)
    return idx, np.empty((0,), np.float32)


def _check_fp32_product(weights: np.ndarray, qs: np.ndarray) -> None:
    """The README's 950 constraint: ``weights * query_dequant_scale`` within the fp32 range.

    Raises:
        ModeError: a product of finite factors is +-inf in fp32.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        prod = weights.astype(np.float32) * qs.astype(np.float32)
    bad = np.isinf(prod) & np.isfinite(weights) & np.isfinite(qs)
    if bad.any():
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        raise arg_error(ModeError, "weights", "weights * query_dequant_scale within the fp32 range (README, Ascend "
                        "950)", f"weights{list(at)} = {float(weights[at]):.6g} times query_dequant_scale{list(at)} = "
                        f"{float(qs[at]):.6g}")


def custom_npu_quant_lightning_indexer(query, key, weights, query_dequant_scale, key_dequant_scale,
                                       query_quant_mode: int, key_quant_mode: int, *, actual_seq_lengths_query=None,
                                       actual_seq_lengths_key=None, block_table=None, metadata=None,
                                       layout_query: str = "BSND", layout_key: str = "PA_BSND",
                                       sparse_count: int = 2048, sparse_mode: int = 3,
                                       pre_tokens: int = UNBOUNDED_TOKENS, next_tokens: int = UNBOUNDED_TOKENS,
                                       cmp_ratio: int = 1, return_value: bool = False, query_dtype=None,
                                       key_dtype=None):
    """cann-recipes-infer's ``torch.ops.custom.npu_quant_lightning_indexer`` (the DeepSeek-V4 set):
    the same name as torch_npu's op, another schema and more behaviour, kept apart from it.

    - ``cmp_ratio`` 1 without ``metadata``: torch_npu's op,
      :func:`ascend_emu.ops.npu_quant_lightning_indexer` (the package's, looked up at the call:
      a mock of it applies here too), with ``query_dtype`` / ``key_dtype`` (its Ascend 950 FP8 /
      HiF8 keys) and the outputs ``(indices, fp32 [0])``.
    - ``cmp_ratio`` > 1, or a ``metadata`` plan given: the compressed-key indexer of
      :func:`npu_vllm_quant_lightning_indexer` (the recipes' doc gives the same contract: int8,
      N1 64, D 128, PA_BSND keys, fp16 weights and scales, ``cmp_ratio`` 1, 2, 4, .., 128,
      ``actual_seq_lengths_key`` the original token counts, the causal limit ``(p + 1) //
      cmp_ratio``), except that ``metadata`` is optional (doc: "可选参数"; checked when given, a
      plan of ``npu_quant_lightning_indexer_metadata``); ``query_dtype`` / ``key_dtype`` None only.

    Args / Returns: as the two functions above (``sparse_values`` fp32 ``[0]``).

    Raises:
        ModeError, ShapeError, DTypeError, IndexRangeError: naming the argument.

    Source: hicann/cann-recipes-infer ``ops/ascendc/docs/custom-npu_quant_lightning_indexer.md``,
    ``ops/ascendc/torch_ops_extension/custom_ops/csrc/ops_def_registration.cpp`` (docs/sources.md).
    """
    ratio = _int(cmp_ratio, "cmp_ratio", CMP_RATIOS, "the recipes' doc: 1/2/4/8/16/32/64/128")
    if ratio == 1 and metadata is None:
        from . import npu_quant_lightning_indexer  # the package's (a mock of it included)

        if not isinstance(return_value, (bool, np.bool_)) or return_value:
            raise arg_error(ModeError, "return_value", "False (the doc: only the default)", describe(return_value))
        idx = npu_quant_lightning_indexer(query, key, weights, query_dequant_scale, key_dequant_scale,
                                          query_quant_mode, key_quant_mode,
                                          actual_seq_lengths_query=actual_seq_lengths_query,
                                          actual_seq_lengths_key=actual_seq_lengths_key, block_table=block_table,
                                          layout_query=layout_query, layout_key=layout_key,
                                          sparse_count=sparse_count, sparse_mode=sparse_mode, pre_tokens=pre_tokens,
                                          next_tokens=next_tokens, query_dtype=query_dtype, key_dtype=key_dtype)
        return idx, np.empty((0,), np.float32)
    for name, v in (("query_dtype", query_dtype), ("key_dtype", key_dtype)):
        if v is not None:
            raise arg_error(ModeError, name, f"None with cmp_ratio {ratio} or a metadata plan (the compressed-key "
                            "indexer is int8: the recipes' doc)", describe(v))
    return _compressed(query, key, weights, query_dequant_scale, key_dequant_scale, query_quant_mode, key_quant_mode,
                       actual_seq_lengths_query, actual_seq_lengths_key, block_table, metadata, layout_query,
                       layout_key, sparse_count, sparse_mode, pre_tokens, next_tokens, ratio, return_value, False)
