"""``torch_npu.npu_lightning_indexer`` on NumPy arrays: the contract.

Sources: torch_npu 2.14's schema and meta function ``npu_lightning_indexer_forward`` (argument
names, defaults, output shapes / dtypes); its op doc (``_op_plugin_docs.py``: dtypes, layouts,
``actual_seq_lengths_*`` semantics, ``sparse_count`` values, sparse_mode 0 / 3) and the doc's
constraints (key N = 1, D = 128, block_size a multiple of 16 up to 1024); the current doc
(ops-transformer ``attention/lightning_indexer/README.md``: weights FLOAT16 / BFLOAT16 / FLOAT) and
op definition (``op_host/lightning_indexer_def.cpp``: fp32 weights with bf16 / fp16 query and key)
with the A2 / A3 tiling, which take query heads N1 <= 64 (2.14's doc: N1 = 64 only); docs/sources.md#npu_lightning_indexer; the official golden
(op-plugin ``test/test_custom_ops/test_npu_lightning_indexer.py``) and the A2/A3 kernel
(ops-transformer ``lightning_indexer``: ``lightning_indexer_vector.h`` / ``_service_vector.h``).

What the op computes, per query token ``t`` (batch ``b``, position ``s1`` in the batch) and key
head ``n2`` (heads ``h`` of its group, ``G = N1 / N2``)::

    score[p] = sum_h w[t, h] * relu(q[t, h] . k[b, p])        p < limit(t)
    limit(t) = act_kv[b]                                      sparse_mode 0
             = min(act_kv[b], act_kv[b] - act_q[b] + s1 + 1)  sparse_mode 3 (right-down causal)
    sparse_indices[t, n2, :] = the sparse_count positions p with the largest score, by score
                               descending, equal scores lower p first, then -1

``p`` is the kv token position inside batch ``b``'s sequence: exactly the ``sparse_indices``
(sparse_block_size 1) that ``npu_sparse_flash_attention`` / ``npu_kv_quant_sparse_flash_attention``
take. The numerics chain is in :mod:`ascend_emu.emu.lightning_indexer`.

Choices where the sources leave room (each in one named constant below):

- :data:`PAD_VALUE`: with ``return_value``, slots past the last selected key hold ``-inf`` (the
  kernel initialises its sort buffer to ``-inf`` / index ``-1``); this includes computed rows with
  no visible key (causal ``limit <= 0``).
- :data:`SKIPPED_ROW_VALUE`: rows the kernel never computes (BSND query rows at or past
  ``actual_seq_lengths_query[b]``, batches whose query or key length is 0) get indices ``-1`` and
  values ``0`` (the kernel's ``CleanInvalidOutput``).
- :data:`EMPTY_VALUE_SHAPE`: without ``return_value`` the second output is empty ``[0]`` in the
  query dtype (the meta function).
- :data:`TIES`: equal scores (float equality, so ``0.0 == -0.0``) keep the lower position first.
  The golden's ``torch.sort`` is unstable and the kernel's hardware sort order for ties is not
  documented; docs/sources.md#npu_lightning_indexer asks for lower index first.
- :data:`SPARSE_MODES`, :data:`SPARSE_COUNTS`: only the values the doc lists.
- ``pre_tokens`` / ``next_tokens`` must keep their default ``2**63 - 1`` (:data:`UNBOUNDED_TOKENS`):
  the doc does not describe them for this op and sparse_mode 0 / 3 do not use them.
- ``actual_seq_lengths_key`` is required for ``PA_BSND`` (the cache has no sequence axis) and for
  ``TND`` keys (prefix sums); TND prefix sums must end at the token count (``T`` / ``T2``), so no
  token row is left unaddressed.
- query, key and weights must be C-contiguous (doc: non-contiguous tensors are not supported).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
from numba import njit

from ..errors import DTypeError, ModeError, ShapeError, arg_error
from ..layouts import CacheLayout, cache_mode_traits
from ..mla import INDEXER_HEAD_DIM, INDEXER_KEY_HEADS
from .. import checked_mode
from ._backend import get_backend
from ._check import (ValidatedSignatures, batched_query, check_dtype, check_shape, dtype_name, known_per_batch_lengths,
                     optional,
                     per_batch_lengths, prefix_lengths, required, seq_lengths)

LayoutQuery = Literal["BSND", "TND"]
LayoutKey = Literal["BSND", "TND", "PA_BSND"]

#: layout_query values the doc lists.
LAYOUTS_QUERY: tuple[str, ...] = ("BSND", "TND")
#: layout_key values the doc lists (PA_BSND: paged through block_table).
LAYOUTS_KEY: tuple[str, ...] = ("BSND", "TND", "PA_BSND")
#: query / key dtypes (one dtype for both; weights: that dtype or :data:`WEIGHTS_FP32`).
DTYPES: tuple[str, ...] = ("bfloat16", "float16")
#: The weights dtype the current doc allows besides the query dtype (used as it is: no rounding).
WEIGHTS_FP32 = "float32"
#: Largest query head count N1 (current doc and A2 / A3 tiling: N1 <= 64; N2 = 1, so G = N1).
MAX_QUERY_HEADS = 64
#: sparse_mode 0 (no mask) and 3 (right-down causal).
SPARSE_MODES: tuple[int, ...] = (0, 3)
#: sparse_count values the doc lists: 1-2048 and 3072 ... 8192 in steps of 1024.
SPARSE_COUNT_MAX_DENSE = 2048
SPARSE_COUNTS_LARGE: tuple[int, ...] = (3072, 4096, 5120, 6144, 7168, 8192)
#: The only accepted pre_tokens / next_tokens (their default).
UNBOUNDED_TOKENS = 9223372036854775807
#: PA_BSND block_size: a multiple of 16, at most 1024 (doc constraint).
BLOCK_SIZE_ALIGN = 16
BLOCK_SIZE_MAX = 1024
#: Value (return_value) of unfilled slots of a computed row.
PAD_VALUE = float("-inf")
#: Value (return_value) of every slot of a row the kernel skips.
SKIPPED_ROW_VALUE = 0.0
#: Shape of the second output without return_value.
EMPTY_VALUE_SHAPE = (0,)
#: Tie order among equal scores.
TIES = "lower index first"
#: ``limit`` of a row the kernel skips (see :class:`LightningIndexerArgs`).
SKIPPED_ROW = -1


@dataclass(frozen=True)
class IndexerDtypes:
    """What differs between the contracts of ``npu_lightning_indexer`` and
    ``npu_quant_lightning_indexer`` in the checks they share (:func:`_check_static`).

    Attributes:
        query: accepted query dtypes (key: the query's dtype).
        weights: accepted weights dtypes, or None for the query dtype or :data:`WEIGHTS_FP32`.
        sparse_counts_large: sparse_count values accepted above :data:`SPARSE_COUNT_MAX_DENSE`.
    """

    query: tuple[str, ...]
    weights: tuple[str, ...] | None
    sparse_counts_large: tuple[int, ...]


#: ``npu_lightning_indexer``'s dtypes and sparse counts.
PLAIN_DTYPES = IndexerDtypes(query=DTYPES, weights=None, sparse_counts_large=SPARSE_COUNTS_LARGE)


@dataclass(frozen=True, kw_only=True)
class LightningIndexerArgs:
    """Normalised, validated arguments of :func:`npu_lightning_indexer`: the caller's arrays as
    passed and the key rows each query token scores.

    Attributes:
        query: ``[B, S1, N1, D]`` (BSND) / ``[T, N1, D]`` (TND), C-contiguous bf16 / fp16
            (int8 for ``npu_quant_lightning_indexer``, :class:`IndexerDtypes`).
        key: ``[B, S2, N2, D]`` / ``[T2, N2, D]`` / ``[blocks, block_size, N2, D]`` (PA_BSND),
            C-contiguous, the query dtype; as rows ``[R, N2, D]`` (R = key slots; BSND row
            ``b * S2 + p``, PA_BSND row ``block * block_size + r``).
        weights: ``[B, S1, N1]`` / ``[T, N1]``, C-contiguous, the query dtype or fp32 (fp16 for
            the quant op).
        actual_seq_lengths_query, actual_seq_lengths_key, block_table: the caller's int32
            tensors, or None.
        slots: int64 ``[B, max_kv]``: key row holding kv position ``p`` of batch ``b``; every
            entry ``p < limit`` of any token of ``b`` is in ``[0, R)`` (checked); -1 past
            ``act_kv[b]``.
        token_batch: int64 ``[T]`` batch of each query token (T = B * S1 for BSND, batch-major).
        limit: int64 ``[T]`` visible kv positions ``[0, limit)`` per token (>= 0), or
            :data:`SKIPPED_ROW` for a row the kernel does not compute.
        sparse_count: top-k per row.
        return_value: whether the scores are returned.
        out_shape: ``[B, S1, N2, sparse_count]`` (BSND query) or ``[T, N2, sparse_count]`` (TND).
        layout_query, layout_key: the caller's layouts.
        sparse_mode: 0 or 3.
    """

    query: np.ndarray
    key: np.ndarray
    weights: np.ndarray
    actual_seq_lengths_query: np.ndarray | None
    actual_seq_lengths_key: np.ndarray | None
    block_table: np.ndarray | None
    slots: np.ndarray
    token_batch: np.ndarray
    limit: np.ndarray
    sparse_count: int
    return_value: bool
    out_shape: tuple[int, ...]
    layout_query: str
    layout_key: str
    sparse_mode: int

    @property
    def dtype(self) -> np.dtype:
        """The query dtype (bf16 or fp16): the dtype of the returned scores."""
        return self.query.dtype

    @property
    def num_key_slots(self) -> int:
        """R: key rows (every key dim but N2 and D)."""
        return math.prod(self.key.shape[:-2])

    def cache_reads(self) -> checked_mode.CacheReads:
        """The key rows the kernel scores (checked mode's read hook): for every query token its
        first ``limit`` kv tokens' slots (:attr:`slots` of its batch), ``key`` described by its
        :class:`~ascend_emu.layouts.CacheLayout` in ``layout_key``."""
        limit = np.where(self.limit > 0, self.limit, 0)  # SKIPPED_ROW < 0
        t_idx = np.repeat(np.arange(limit.size), limit)
        pos = np.arange(t_idx.size) - np.repeat(np.cumsum(limit) - limit, limit)
        batch = self.token_batch[t_idx]
        slots = self.slots[batch, pos].astype(np.int64)

        def where(i: int) -> str:
            t = int(t_idx[i])
            q_at = f"query token {t % self.out_shape[1]}" if batched_query(self.layout_query) else \
                f"query token {t} (TND)"
            return f"batch {int(batch[i])}, {q_at}, kv token {int(pos[i])}"

        layout = CacheLayout.from_declared(self.layout_key, self.key.shape, self.key.dtype.itemsize, name="key")
        return checked_mode.CacheReads((("key", self.key, layout),), slots, where)


class LightningIndexerOutputs(NamedTuple):
    """What a backend returns (:mod:`ascend_emu.ops._backend`), torch_npu's order.

    Attributes:
        sparse_indices: int32 ``args.out_shape``.
        sparse_values: the query dtype, ``args.out_shape`` with ``args.return_value``, else
            :data:`EMPTY_VALUE_SHAPE`.
    """

    sparse_indices: np.ndarray
    sparse_values: np.ndarray


def npu_lightning_indexer(query, key, weights, *, actual_seq_lengths_query=None, actual_seq_lengths_key=None,
                          block_table=None, layout_query: LayoutQuery = "BSND", layout_key: LayoutKey = "BSND",
                          sparse_count: int = 2048, sparse_mode: int = 3, pre_tokens: int = UNBOUNDED_TOKENS,
                          next_tokens: int = UNBOUNDED_TOKENS, return_value: bool = False):
    """Top-``sparse_count`` kv positions per query token by the lightning-indexer score.

    Args:
        query: ``[B, S1, N1, D]`` (BSND) or ``[T, N1, D]`` (TND), bf16 / fp16, C-contiguous;
            N1 in ``[1, MAX_QUERY_HEADS]`` (64; DeepSeek-V3.2 uses 64), D = 128.
        key: ``[B, S2, N2, D]`` (BSND), ``[T2, N2, D]`` (TND) or ``[blocks, block_size, N2, D]``
            (PA_BSND, block_size a multiple of 16 up to 1024); query's dtype, C-contiguous; N2 = 1.
        weights: ``[B, S1, N1]`` / ``[T, N1]``, query's dtype or fp32 (widened exactly to fp32
            either way, so fp32 weights are used as they are), C-contiguous.
        actual_seq_lengths_query: int32 ``[B]``. BSND: query tokens per batch, each in
            ``[0, S1]`` (default: all S1). TND (required): prefix sums, non-decreasing, the last
            equal to T; its length is B, at most ``_check.MAX_BATCH`` = 65536.
        actual_seq_lengths_key: int32 ``[B]``. BSND: kv tokens per batch in ``[0, S2]`` (default:
            all S2). TND (required): prefix sums ending at T2. PA_BSND (required): kv tokens per
            batch.
        block_table: int32 ``[B, >= ceil(max kv length / block_size)]`` block ids, PA_BSND only;
            the entries covering each batch's kv tokens must lie in ``[0, blocks)``.
        layout_query: ``"BSND"`` (default) or ``"TND"``.
        layout_key: ``"BSND"`` (default), ``"TND"`` or ``"PA_BSND"``; without paging it must
            equal ``layout_query``.
        sparse_count: k, 1-2048 or one of 3072, 4096, 5120, 6144, 7168, 8192. Default 2048.
        sparse_mode: 0 (every kv token visible) or 3 (right-down causal, default).
        pre_tokens, next_tokens: must keep the default ``2**63 - 1``.
        return_value: also return the selected scores. Default False.

    Returns:
        ``(sparse_indices, sparse_values)``: int32 ``[B, S1, N2, sparse_count]`` (BSND query) or
        ``[T, N2, sparse_count]`` (TND query), kv positions within the batch's sequence, -1 after
        the last selected one; the scores of those positions rounded (RNE) to the query dtype,
        same shape, with :data:`PAD_VALUE` / :data:`SKIPPED_ROW_VALUE` fills, or an empty ``[0]``
        array of the query dtype without ``return_value``.

    Raises:
        ShapeError: a rank or size (N1, N2, D, batch counts, block_size), a non-contiguous input,
            an actual length out of range or prefix sums that decrease / do not end at T.
        DTypeError: a dtype (query family, one dtype for query and key, weights of that dtype
            or fp32, int32 lengths and block_table), a non-int mode / count, a non-bool ``return_value``.
        ModeError: unknown layout, mismatched non-paged layouts, a missing required or an
            unexpected ``actual_seq_lengths_*`` / ``block_table``, sparse_mode, sparse_count,
            non-default pre_tokens / next_tokens.
        IndexRangeError: a needed block_table entry outside the cache (message names
            ``block_table[b, j]``, its value and the kv tokens it covers).
    """
    args = _normalise(query, key, weights, actual_seq_lengths_query, actual_seq_lengths_key, block_table,
                      layout_query, layout_key, sparse_count, sparse_mode, pre_tokens, next_tokens, return_value)
    checked_mode.read("npu_lightning_indexer", args.cache_reads)
    return tuple(get_backend().lightning_indexer(args))


# ---------------------------------------------------------------------- validation
def _int_arg(value, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise arg_error(DTypeError, name, "an int", repr(value))
    return int(value)


def _tensor(x, name: str, dtype: str | tuple[str, ...]) -> np.ndarray:
    """``x`` checked: given, of ``dtype`` (one or several names), non-empty, C-contiguous."""
    x = required(x, name)
    check_dtype(x, name, (dtype,) if isinstance(dtype, str) else dtype)
    if x.size == 0:
        raise arg_error(ShapeError, name, "a non-empty tensor", f"shape {list(x.shape)}")
    if not x.flags.c_contiguous:
        raise arg_error(ShapeError, name, "a C-contiguous tensor (non-contiguous input is not supported)",
                        f"strides {x.strides}")
    return x


@dataclass(frozen=True)
class _Static:
    """What :func:`_check_static` derives from a call signature."""

    sparse_count: int
    sparse_mode: int
    b_q: int | None
    s1: int | None
    t_rows: int
    batch: int
    out_shape: tuple[int, ...]
    key_layout: CacheLayout


#: Signatures whose static checks passed (:func:`ascend_emu.ops._check.signature`).
_VALIDATED = ValidatedSignatures()


def _normalise(query, key, weights, act_q, act_k, block_table, layout_query, layout_key, sparse_count,
               sparse_mode, pre_tokens, next_tokens, return_value, *, dtypes: IndexerDtypes | None = None,
               validated: ValidatedSignatures | None = None) -> LightningIndexerArgs:
    """Validate every argument and build :class:`LightningIndexerArgs`.

    The checks :func:`_check_static` makes run once per call signature
    (:func:`~ascend_emu.ops._check.signature`; a decode loop repeats one); the lengths and the
    block_table entries a batch reads are checked on every call, after them.

    ``dtypes`` (default :data:`PLAIN_DTYPES`) and ``validated`` (default this op's
    signatures) let ``npu_quant_lightning_indexer`` share every check but the dtypes; each op
    keeps its own :class:`ValidatedSignatures`, since the same signature passes one and not the
    other.
    """
    dtypes = PLAIN_DTYPES if dtypes is None else dtypes
    validated = _VALIDATED if validated is None else validated
    given = (query, key, weights, act_q, act_k, block_table, layout_query, layout_key, sparse_count, sparse_mode,
             pre_tokens, next_tokens, return_value)
    sig, st, known = validated.lookup(given, functools.partial(_check_static, dtypes=dtypes))  # known: the
    # lengths' dtypes and shapes passed too
    lengths_of = known_per_batch_lengths if known else per_batch_lengths
    query, key, weights = required(query, "query"), required(key, "key"), required(weights, "weights")
    act_q, act_k = optional(act_q, "actual_seq_lengths_query"), optional(act_k, "actual_seq_lengths_key")
    block_table = optional(block_table, "block_table")
    b_q, s1, t_rows, batch = st.b_q, st.s1, st.t_rows, st.batch

    # ---- query lengths
    if batched_query(layout_query):
        if act_q is None:
            q_len = np.full(b_q, s1, np.int64)
        else:
            q_len = lengths_of(act_q, "actual_seq_lengths_query", b_q, s1, "a query token count (BSND)")
        q_start = np.arange(b_q, dtype=np.int64) * s1
    else:
        q_len = prefix_lengths(act_q, "actual_seq_lengths_query", t_rows)
        q_start = np.cumsum(q_len) - q_len

    # ---- key lengths and slots
    key_layout = st.key_layout
    if key_layout.sequences == "per_batch":  # [B, S2, N2, D]
        s2 = key_layout.block_size
        if act_k is None:
            kv_len = np.full(batch, s2, np.int64)
        else:
            kv_len = lengths_of(act_k, "actual_seq_lengths_key", batch, s2, "a kv token count (BSND)")
    elif key_layout.sequences == "packed":  # [T2, N2, D]
        kv_len = prefix_lengths(act_k, "actual_seq_lengths_key", key_layout.block_size, batch)
    else:
        kv_len = lengths_of(act_k, "actual_seq_lengths_key", batch, None, "a kv token count")
    slots = key_layout.sequence_slots(kv_len, block_table, name="block_table")  # [B, max kv_len]

    # ---- per-token batch and visible length
    token_batch = np.zeros(t_rows, np.int64)  # [T]
    limit = np.empty(t_rows, np.int64)  # [T]
    _token_limits(q_start, q_len, kv_len, -1 if s1 is None else s1, st.sparse_mode, token_batch, limit)
    if not known:
        validated.put(sig, st)
    return LightningIndexerArgs(
        query=query, key=key, weights=weights, actual_seq_lengths_query=act_q, actual_seq_lengths_key=act_k,
        block_table=block_table, slots=np.ascontiguousarray(slots, dtype=np.int64), token_batch=token_batch, limit=limit,
        sparse_count=st.sparse_count, return_value=bool(return_value), out_shape=st.out_shape,
        layout_query=layout_query, layout_key=layout_key, sparse_mode=st.sparse_mode)


def _check_static(query, key, weights, act_q, act_k, block_table, layout_query, layout_key, sparse_count,
                  sparse_mode, pre_tokens, next_tokens, return_value, *, dtypes: IndexerDtypes) -> _Static:
    """Every check that reads only types, shapes, dtypes, modes and scalars, in the contract's
    order (length values and block_table entries: :func:`_normalise`); ``dtypes``: the op's
    :class:`IndexerDtypes`.

    Raises:
        As :func:`npu_lightning_indexer` (ShapeError, DTypeError, ModeError).
    """
    # ---- modes
    if layout_query not in LAYOUTS_QUERY:
        raise arg_error(ModeError, "layout_query", f"one of {list(LAYOUTS_QUERY)}", repr(layout_query))
    if layout_key not in LAYOUTS_KEY:
        raise arg_error(ModeError, "layout_key", f"one of {list(LAYOUTS_KEY)}", repr(layout_key))
    key_mode = cache_mode_traits(layout_key, allowed=LAYOUTS_KEY, name="layout_key")
    paged = key_mode.paged
    if not paged and layout_key != layout_query:
        raise arg_error(ModeError, "layout_key", f"layout_query {layout_query!r} or 'PA_BSND' (without paging "
                        "the key layout must equal the query layout)", repr(layout_key))
    sparse_mode = _int_arg(sparse_mode, "sparse_mode")
    if sparse_mode not in SPARSE_MODES:
        raise arg_error(ModeError, "sparse_mode", f"one of {list(SPARSE_MODES)} (0: no mask, 3: right-down causal)",
                        sparse_mode)
    sparse_count = _int_arg(sparse_count, "sparse_count")
    if not (1 <= sparse_count <= SPARSE_COUNT_MAX_DENSE or sparse_count in dtypes.sparse_counts_large):
        large = f" or one of {list(dtypes.sparse_counts_large)}" if dtypes.sparse_counts_large else ""
        raise arg_error(ModeError, "sparse_count", f"1-{SPARSE_COUNT_MAX_DENSE}{large}", sparse_count)
    for name, v in (("pre_tokens", pre_tokens), ("next_tokens", next_tokens)):
        if _int_arg(v, name) != UNBOUNDED_TOKENS:
            raise arg_error(ModeError, name, f"the default {UNBOUNDED_TOKENS} (sparse_mode 0 / 3 take no token "
                            "window)", v)
    if not isinstance(return_value, (bool, np.bool_)):
        raise arg_error(DTypeError, "return_value", "a bool", type(return_value).__name__)

    # ---- query / weights
    query = _tensor(query, "query", dtypes.query)
    dt = dtype_name(query.dtype)
    if batched_query(layout_query):
        check_shape(query, "query", [None, None, None, INDEXER_HEAD_DIM], "[B, S1, N1, D=128] (BSND)")
        b_q, s1 = query.shape[:2]
    else:
        check_shape(query, "query", [None, None, INDEXER_HEAD_DIM], "[T, N1, D=128] (TND)")
        b_q, s1 = None, None
    if not 1 <= query.shape[-2] <= MAX_QUERY_HEADS:
        raise arg_error(ShapeError, "query", f"N1 (dim {query.ndim - 2}) in [1, {MAX_QUERY_HEADS}] (the A2 / A3 "
                        "limit on query heads)", f"N1={query.shape[-2]} (shape {list(query.shape)})")
    t_rows = query.shape[0] * (s1 if s1 is not None else 1)
    weights = _tensor(weights, "weights", (dt, WEIGHTS_FP32) if dtypes.weights is None else dtypes.weights)
    w_shape = [*query.shape[:-1]]
    check_shape(weights, "weights", w_shape, "[B, S1, N1] (BSND)" if batched_query(layout_query) else "[T, N1] (TND)")

    act_q = optional(act_q, "actual_seq_lengths_query")
    if batched_query(layout_query):
        batch = b_q
    else:
        if act_q is None:
            raise arg_error(ModeError, "actual_seq_lengths_query", "a tensor of prefix sums (required for "
                            "layout_query 'TND')", None)
        batch = seq_lengths(act_q, "actual_seq_lengths_query").size

    # ---- key
    key = _tensor(key, "key", dt)
    if key_mode.sequences == "per_batch":
        check_shape(key, "key", [batch, None, INDEXER_KEY_HEADS, INDEXER_HEAD_DIM],
                    f"[B={batch}, S2, N2=1, D=128] (BSND)")
    elif key_mode.sequences == "packed":
        check_shape(key, "key", [None, INDEXER_KEY_HEADS, INDEXER_HEAD_DIM], "[T2, N2=1, D=128] (TND)")
    else:
        check_shape(key, "key", [None, None, INDEXER_KEY_HEADS, INDEXER_HEAD_DIM],
                    "[blocks, block_size, N2=1, D=128] (PA_BSND)")
        bs = key.shape[1]
        if bs % BLOCK_SIZE_ALIGN or bs > BLOCK_SIZE_MAX:
            raise arg_error(ShapeError, "key", f"block_size (dim 1) a multiple of {BLOCK_SIZE_ALIGN} up to "
                            f"{BLOCK_SIZE_MAX} (PA_BSND)", bs)

    # ---- which of the key lengths and block_table are required
    block_table = optional(block_table, "block_table")
    if block_table is not None and not paged:
        raise arg_error(ModeError, "block_table", f"None for layout_key {layout_key!r} (only PA_BSND is paged)",
                        f"a tensor of shape {list(block_table.shape)}")
    if act_k is None and key_mode.sequences == "packed":
        raise arg_error(ModeError, "actual_seq_lengths_key", "a tensor of prefix sums (required for "
                        "layout_key 'TND')", None)
    if paged:
        if act_k is None:
            raise arg_error(ModeError, "actual_seq_lengths_key", "a tensor of kv lengths (required for layout_key "
                            "'PA_BSND')", None)
        if block_table is None:
            raise arg_error(ModeError, "block_table", "an int32 [B, max_blocks] tensor (required for layout_key "
                            "'PA_BSND')", None)
        check_dtype(block_table, "block_table", ("int32",))

    if batched_query(layout_query):
        out_shape = (b_q, s1, INDEXER_KEY_HEADS, sparse_count)
    else:
        out_shape = (t_rows, INDEXER_KEY_HEADS, sparse_count)
    key_layout = CacheLayout.from_declared(layout_key, key.shape, key.dtype.itemsize, name="key")
    return _Static(sparse_count=sparse_count, sparse_mode=sparse_mode, b_q=b_q, s1=s1, t_rows=t_rows, batch=batch,
                   out_shape=out_shape, key_layout=key_layout)


@njit(cache=True)
def _token_limits(q_start, q_len, kv_len, s1, sparse_mode, token_batch, limit):
    """Batch and visible kv length of every query token (:class:`LightningIndexerArgs`).

    Args:
        q_start, q_len, kv_len: int64 ``[B]`` first query row, query tokens and kv tokens of each
            batch (validated).
        s1: BSND query rows per batch (every row of a batch belongs to it), or -1 for TND.
        sparse_mode: 0 (``limit = kv``) or 3 (``min(max(kv - q + s + 1, 0), kv)`` for position s).
        token_batch: out, int64 ``[T]`` (zero-filled by the caller: TND rows outside every batch
            stay 0).
        limit: out, int64 ``[T]``; :data:`SKIPPED_ROW` for rows the kernel does not compute.
    """
    limit[:] = SKIPPED_ROW
    for b in range(q_len.shape[0]):
        n_q, n_k, start = q_len[b], kv_len[b], q_start[b]
        for t in range(start, start + (s1 if s1 >= 0 else n_q)):
            token_batch[t] = b
        if n_q == 0 or n_k == 0:
            continue  # the kernel skips the batch: rows stay SKIPPED_ROW
        for s in range(n_q):
            limit[start + s] = n_k if sparse_mode == 0 else min(max(n_k - n_q + s + 1, 0), n_k)
