"""Arguments of ``npu_fused_infer_attention_score`` / ``_v2``: the emulated subset's limits and
choices (named constants), the validated argument object backends take, and the validation.

The contract, its sources and numerics: :mod:`ascend_emu.ops.fused_infer_attention_score` (which
re-exports every name here that callers use). The caches are described by
:class:`~ascend_emu.layouts.CacheLayout`, as the writers' caches are: a paged read goes through the
block ids the lengths need (:attr:`FusedInferAttentionArgs.kv_blocks`), checked here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .. import checked_mode
from ..errors import DTypeError, ModeError, ShapeError, arg_error, describe
from ..layouts import NZ_ROW_BYTES, CacheLayout, blocks_from_block_table
from ..mla import D_ROPE, HCKV, NKV
from ._check import MAX_BATCH, check_dtype, check_float, dtype_name, prefix_lengths, required
from ._fused_infer_attention_quant import quant_out_dtype

#: input_layout values of the MLA callers -> (query layout, attention_out layout) (the meta
#: function's ``get_query_and_attention_out_layout`` map, restricted).
LAYOUTS = {"BSND": ("BSND", "BSND"), "BNSD": ("BNSD", "BNSD"), "TND": ("TND", "TND"),
           "BSND_NBSD": ("BSND", "NBSD"), "BNSD_NBSD": ("BNSD", "NBSD"), "TND_NTD": ("TND", "NTD")}
#: Query dtypes (key / value / rope in the same dtype).
QUERY_DTYPES = ("bfloat16", "float16")
#: Query head counts of the MLA path (a power of 2 up to 128, as the sparse attention ops).
QUERY_HEADS = (1, 2, 4, 8, 16, 32, 64, 128)
#: Head dims: absorbed decode (value = ckv) and the non-absorbed prefill / chunked form.
HEAD_DIM_ABSORBED = HCKV
HEAD_DIM_PREFILL = 128
HEAD_DIMS = (HEAD_DIM_ABSORBED, HEAD_DIM_PREFILL)
#: vllm-ascend's call without rope arguments (``_forward_prefill`` / ``_compute_prefill_context``
#: with ``head_padding > 0``): query / key D = 128 + 64 concatenated, value D = 128, TND; one of
#: the MHA / GQA form's TND head-dim pairs (:mod:`._fused_infer_attention_mha`), which validates it
#: (N up to its MAX_HEADS, exported by the op module as MAX_QUERY_HEADS_NO_ROPE).
HEAD_DIM_NO_ROPE = HEAD_DIM_PREFILL + D_ROPE
VALUE_DIM_NO_ROPE = HEAD_DIM_PREFILL
#: sparse_mode values: 0 (all tokens), 3 (causal, bottom-right aligned).
SPARSE_MODES = (0, 3)
#: The optimised causal mask the callers pass with sparse_mode 3: ``[2048, 2048]``, 1 above the diagonal.
CAUSAL_MASK_SIZE = 2048
MASK_DTYPES = ("bool", "int8", "uint8")
#: pre_tokens / next_tokens: the schemas' default (any int is taken; the emulated modes ignore them).
DEFAULT_TOKENS = 2147483647
#: block_size: a multiple of 16 in [16, 512].
BLOCK_SIZE_ALIGN = 16
MAX_BLOCK_SIZE = 512
#: Output of an empty row and its lse.
EMPTY_ROW_OUTPUT = 0.0
EMPTY_ROW_LSE = float("inf")
#: Rounding of P and of the output to the query dtype.
QUERY_DTYPE_ROUNDING = "half_even"
#: Which exp P rounds: the kernel's (unnormalised, divided by the sum after P @ V).
P_ROUNDING = "unnormalised"
#: Paged cache layouts by rank, as errors name them: 3-D ``[nb, bs, KV_N*D]`` (PA_BSND with KV_N
#: heads), 4-D ``[nb, KV_N, bs, D]`` (head-major PA_BNSD), 5-D NZ ``[nb, KV_N, D/C0, bs, C0]``
#: (head-major PA_NZ); each described by a :class:`~ascend_emu.layouts.CacheLayout` (:func:`_cache_layout`).
CACHE_LAYOUTS = {3: "PA_BSH", 4: "PA_BNSD", 5: "PA_NZ"}

#: v1 arguments not emulated: name -> the only value taken.
V1_REJECTED = {name: None for name in (
    "pse_shift", "antiquant_scale", "antiquant_offset", "query_padding_size", "kv_padding_size", "key_shared_prefix", "value_shared_prefix",
    "actual_shared_prefix_len", "key_rope_antiquant_scale")}
V1_REJECTED.update(antiquant_mode=0, inner_precise=0)
#: v2 arguments not emulated: name -> the only value taken.
V2_REJECTED = {name: None for name in (
    "pse_shift", "dequant_scale_key_rope", "quant_scale_p", "query_dtype", "key_dtype", "value_dtype", "query_rope_dtype", "key_rope_dtype",
    "key_shared_prefix_dtype", "value_shared_prefix_dtype", "dequant_scale_query_dtype", "dequant_scale_key_dtype",
    "dequant_scale_value_dtype", "dequant_scale_key_rope_dtype")}
V2_REJECTED.update(key_quant_mode=0, value_quant_mode=0, inner_precise=0)

#: v2 C8 decode (full quant, A2 / A3): int8 query / key / value, ``query_quant_mode`` 3
#: (per-token-head ``dequant_scale_query``), ``key_quant_mode`` / ``value_quant_mode`` 0 (per-tensor
#: fp32 ``dequant_scale_key`` / ``dequant_scale_value``), bf16 rope, bf16 output (the v2 doc's MLA
#: constraints, D = 512).
QUERY_QUANT_MODE_C8 = 3
C8_DTYPE = "int8"
C8_ROPE_DTYPES = ("bfloat16",)
C8_SCALE_DTYPE = "float32"
#: C8 kv block of the kernel's online softmax (``CalcInnerSize``: ``sInnerSize_ = 512`` with rope,
#: ``incre_flash_attention_tiling.cpp`` line 2306): P is quantised per block against its max.
C8_KV_BLOCK = 512
#: The kernel's P quantisation range (``scaleP1`` = 127, ``scaleP2`` = 1 / 127) and the fp16
#: staging of P @ V (fixpipe ``DEQF16`` scale 2**-10, undone by ``Muls(.., 1024)``).
C8_P_RANGE = 127.0
C8_PV_STAGE_SCALE = 2.0 ** -10
#: ``FLOAT_EPS`` added to the block's P max (``ifa_public_define.h`` line 158), as fp32.
C8_FLOAT_EPS = 2.220446049250313e-16
#: The int32 -> fp32 reinterpretation of the nope dot (``ifa_service_matmul_full_quant.h`` lines
#: 758-895): the int8 matmul accumulates onto the bias 0x4B200000 (fp32 2**23 + 2**21), the cube
#: then adds -2**21 * 5 in fp32 before the rope products: exact for |q . k| < 2**21.
C8_DOT_BIAS_BITS = 0x4B200000
C8_DOT_BIAS = 10485760.0


#: pre_tokens / next_tokens beyond this reach past any kv length (clipped before the int64 arithmetic).
TOKENS_CLIP = 1 << 40


def row_bounds(rule: str, nq: int, kv_len: int, pre_tokens: int = DEFAULT_TOKENS,
               next_tokens: int = DEFAULT_TOKENS) -> tuple[np.ndarray, np.ndarray]:
    """int64 ``([nq], [nq])``: the first and one past the last kv position query token ``s`` of a
    request with ``nq`` query and ``kv_len`` kv tokens sees under ``rule``
    (:attr:`FusedInferAttentionArgs.rule`): ``all``; ``top_left`` ``j <= s``; ``bottom_right``
    ``j <= kv_len - nq + s``; ``band`` (sparse_mode 4, bottom-right aligned) ``kv_len - nq + s -
    pre_tokens <= j <= kv_len - nq + s + next_tokens``. A row that sees no position gets ``(0, 0)``."""
    s = np.arange(nq, dtype=np.int64)
    lo = np.zeros(nq, np.int64)
    if rule == "top_left":
        hi = np.minimum(s + 1, kv_len)
    elif rule == "bottom_right":
        hi = np.clip(kv_len - nq + s + 1, 0, kv_len)
    elif rule == "band":
        pre = max(min(int(pre_tokens), TOKENS_CLIP), -TOKENS_CLIP)
        nxt = max(min(int(next_tokens), TOKENS_CLIP), -TOKENS_CLIP)
        diag = kv_len - nq + s
        lo = np.clip(diag - pre, 0, kv_len)
        hi = np.clip(diag + nxt + 1, 0, kv_len)
    else:
        hi = np.full(nq, kv_len, np.int64)
    empty = hi <= lo
    return np.where(empty, 0, lo), np.where(empty, 0, hi)


def row_limits(rule: str, nq: int, kv_len: int, pre_tokens: int = DEFAULT_TOKENS,
               next_tokens: int = DEFAULT_TOKENS) -> np.ndarray:
    """int64 ``[nq]``: one past the last kv position each query token sees (:func:`row_bounds`;
    0: an empty row)."""
    return row_bounds(rule, nq, kv_len, pre_tokens, next_tokens)[1]


@dataclass(frozen=True, kw_only=True)
class FusedInferAttentionArgs:
    """Normalised, validated arguments of both FIA names.

    Attributes:
        op: ``npu_fused_infer_attention_score`` or ``npu_fused_infer_attention_score_v2``.
        query, query_rope: the caller's arrays, ``[B, S1, N, D]`` / ``[B, N, S1, D]`` / ``[T, N, D]``
            (rope: D = 64).
        key, value, key_rope: the caller's caches (paged, or non-paged TND ``[T2, KV_N, D]``).
        atten_mask: the caller's mask (sparse_mode 3) or None.
        block_table: the caller's int32 table, or None (non-paged TND).
        actual_seq_lengths, actual_seq_lengths_kv: as passed (lists or arrays, or None).
        num_heads, num_kv_heads: N and KV_N; scale: the score scale (finite).
        input_layout: as passed; query_layout (BSND / BNSD / TND) and out_layout (BSND, BNSD,
            TND, NBSD, NTD) derived from it.
        key_layout, value_layout, rope_layout: the caches' :class:`~ascend_emu.layouts.CacheLayout`
            (PA_BSND with KV_N heads for ``[nb, bs, KV_N*D]``, head-major PA_BNSD, head-major
            PA_NZ; TND without block_table); rope_layout None without key_rope. block_size: rows
            per block (0 for TND).
        sparse_mode: 0 or 3; softmax_lse_flag: return the lse.
        batch, seq_q: B and S1 (TND: the longest request).
        head_dim: D of query / key / value.
        act_q, act_kv: int64 ``[B]`` query / kv tokens per request.
        q_start: int64 ``[B]`` first token of each request in token-major order (``b * S1``,
            TND: the prefix sums' starts).
        kv_blocks: paged: int64 ``[B, max_blocks_needed]``, the block_table entries each request's
            ``act_kv`` tokens read (checked), -1 past them; None without block_table.
        kv_rows: non-paged TND: int64 ``[B, W]`` the token row of kv position ``p`` of request ``b``
            (-1 past its length; W = max(max act_kv, 1)); None when paged.
        out_shape, lse_shape: output shapes (lse ``[0]`` without the flag).
        dequant_scale_query: C8 only: fp32 per-token-head scales as passed (``[B, S1, N]`` BSND,
            ``[B, N, S1]`` BNSD, ``[T, N]`` TND), else None; dequant_scale_key /
            dequant_scale_value: C8: the fp32 one-element per-tensor scales; query_quant_mode: 3
            under C8, else 0.
        value_dim: D of value and attention_out (= head_dim except the no-rope form's 128).
        row_rule: the MHA form's row rule (:attr:`rule`), "" for the MLA subset.
        mask: the MHA form's explicit mask (sparse_mode 0 / 1) as a bool view ``[Bm, S1, KV_S]``
            (Bm 1 or B, True masks a position out), else None.
        sink: v2's learnable_sink as fp32 ``[N]``, else None.
        pre_tokens, next_tokens: as passed (checked ints).
        kv_antiquant: the MHA form's separated kv antiquant, ``(key scale, key offset, value
            scale, value offset)`` fp32 ``[KV_N, D]`` (offsets None when absent), int8 / int32
            (8 int4 each) key and value; else None. kv_antiquant_given: those arguments as the
            caller passed them, by name (the hw backend passes them on).
        full_quant: the MHA form's int8 full quant (v1): ``(dequant_scale1, quant_scale1,
            dequant_scale2)`` as Python floats, the dequant scales already FP19-truncated
            (:mod:`._fused_infer_attention_quant`); else None.
        quant_out: the int8 output quant (v1 ``quant_scale2`` / ``quant_offset2``, v2
            ``quant_scale_out`` / ``quant_offset_out``): ``(scale, offset)`` fp32 ``[N, Dv]`` (a
            per-tensor value broadcast; offset None when absent); else None. quant_out_type: its
            element type (``'int8'``; v2 ``out_dtype`` on the Ascend 950: ``'float8_e4m3fn'``,
            ``'float8_e5m2'``, ``'hifloat8'``). quant_given: the
            caller's quant arguments by name (the hw backend passes them on).
    """

    op: str
    query: np.ndarray
    query_rope: np.ndarray
    key: np.ndarray
    value: np.ndarray
    key_rope: np.ndarray
    atten_mask: np.ndarray | None
    block_table: np.ndarray | None
    actual_seq_lengths: object
    actual_seq_lengths_kv: object
    num_heads: int
    num_kv_heads: int
    scale: float
    input_layout: str
    query_layout: str
    out_layout: str
    key_layout: CacheLayout
    value_layout: CacheLayout
    rope_layout: CacheLayout | None
    block_size: int
    sparse_mode: int
    softmax_lse_flag: bool
    batch: int
    seq_q: int
    head_dim: int
    act_q: np.ndarray
    act_kv: np.ndarray
    q_start: np.ndarray
    kv_blocks: np.ndarray | None
    kv_rows: np.ndarray | None
    out_shape: tuple[int, ...]
    lse_shape: tuple[int, ...]
    dequant_scale_query: np.ndarray | None = None
    dequant_scale_key: np.ndarray | None = None
    dequant_scale_value: np.ndarray | None = None
    query_quant_mode: int = 0
    value_dim: int = 0
    row_rule: str = ""
    mask: np.ndarray | None = None
    sink: np.ndarray | None = None
    pre_tokens: int = DEFAULT_TOKENS
    next_tokens: int = DEFAULT_TOKENS
    kv_antiquant: tuple | None = None
    kv_antiquant_given: dict | None = None
    full_quant: tuple | None = None
    quant_out: tuple | None = None
    quant_out_type: str = "int8"
    quant_given: dict | None = None

    @property
    def rule(self) -> str:
        """Which kv positions a row sees (:meth:`row_limits`): ``all``, ``top_left`` (causal,
        sparse_mode 2), ``bottom_right`` (causal, sparse_mode 3) or ``band`` (sparse_mode 4, with
        :attr:`pre_tokens` / :attr:`next_tokens`); the MLA subset derives it from sparse_mode (0 or
        3), the MHA form sets it (decode ignores the sparse modes)."""
        return self.row_rule or ("bottom_right" if self.sparse_mode == 3 else "all")

    def row_limits(self, nq: int, kv_len: int) -> np.ndarray:
        """int64 ``[nq]``: the kv positions ``0 .. limit - 1`` query token ``s`` of a request with
        ``nq`` query and ``kv_len`` kv tokens may see (before an explicit mask: :attr:`mask`; 0:
        an empty row; the band's first position: :meth:`row_starts`)."""
        return row_limits(self.rule, nq, kv_len, self.pre_tokens, self.next_tokens)

    def row_starts(self, nq: int, kv_len: int) -> np.ndarray:
        """int64 ``[nq]``: the first kv position each query token sees (0 but under the band)."""
        return row_bounds(self.rule, nq, kv_len, self.pre_tokens, self.next_tokens)[0]

    @property
    def rope(self) -> bool:
        """query_rope / key_rope given (every form but the no-rope D = 192 prefill)."""
        return self.query_rope is not None

    @property
    def quantised(self) -> bool:
        """The v2 C8 decode (int8 query / caches with their dequant scales)."""
        return self.dequant_scale_query is not None

    @property
    def out_dtype(self) -> np.dtype:
        """attention_out's dtype: the output quant's type with an output quant scale (int8, v2
        ``out_dtype``'s FP8 type, uint8 HiFloat8 codes); fp16 for an int8 query without one (full
        quant); query_rope's (bf16 / fp16; bf16 under C8); query's without rope."""
        if self.quant_out is not None:
            return quant_out_dtype(self.quant_out_type)
        if self.full_quant is not None:
            return np.dtype(np.float16)
        return self.query.dtype if self.query_rope is None else self.query_rope.dtype

    @property
    def group(self) -> int:
        """G = N / KV_N query heads per kv head."""
        return self.num_heads // self.num_kv_heads

    @property
    def query_dtype(self) -> np.dtype:
        """bf16 or fp16 (int8 under C8)."""
        return self.query.dtype

    @property
    def kv_width(self) -> int:
        """W: the most kv positions one request reads (max act_kv)."""
        return int(self.act_kv.max()) if self.act_kv.size else 0

    def cache_reads(self) -> checked_mode.CacheReads:
        """The cache rows the kernel reads (checked mode's read hook): for every request its first
        ``act_kv`` kv positions, through :attr:`kv_blocks` (paged) or :attr:`kv_rows`, in
        ``key``, ``key_rope`` and a separate ``value``."""
        if self.kv_blocks is None and not self.rope:
            return None  # the MHA / GQA form's dense key and value: activations, no cache the writers fill
        lens = self.act_kv
        b_idx = np.repeat(np.arange(lens.size), lens)
        pos = np.arange(b_idx.size) - np.repeat(np.cumsum(lens) - lens, lens)
        rows = self.kv_rows if self.kv_blocks is None else self.key_layout.slots_of_blocks(self.kv_blocks, lens)
        caches = [("key", self.key, self.key_layout)]
        if self.key_rope is not None:
            caches.append(("key_rope", self.key_rope, self.rope_layout))
        if self.value is not self.key:
            caches.append(("value", self.value, self.value_layout))
        return checked_mode.CacheReads(tuple(caches), rows[b_idx, pos].astype(np.int64),
                                       lambda i: f"request {int(b_idx[i])}, kv token {int(pos[i])}")


class FusedInferAttentionOutputs(NamedTuple):
    """What a backend returns (:mod:`ascend_emu.ops._backend`), torch_npu's order.

    Attributes:
        attention_out: ``args.out_shape``, ``args.out_dtype`` (query_rope's dtype).
        softmax_lse: fp32 ``args.lse_shape`` (``[0]`` without the lse flag).
    """

    attention_out: np.ndarray
    softmax_lse: np.ndarray




@dataclass(frozen=True, kw_only=True)
class FusedInferAttentionCall:
    """One call of either FIA name as the caller made it, before validation (what
    :func:`normalise` checks). The v2 names are carried with the values so errors name them.

    Attributes:
        op: the op's name.
        query, key, value, query_rope, key_rope, atten_mask, block_table: as passed.
        act_q, act_kv: the query / kv length arguments as passed; act_q_name, act_kv_name: their
            names (``actual_seq_lengths`` / ``actual_seq_lengths_kv``; v2 ``actual_seq_qlen`` /
            ``actual_seq_kvlen``).
        num_heads, heads_name: N and its name (v2 ``num_query_heads``).
        num_key_value_heads: KV_N (0: N).
        scale, scale_name: the score scale and its name (v2 ``softmax_scale``).
        pre_tokens, next_tokens, input_layout, sparse_mode, block_size: as passed.
        lse_flag, lse_name: the lse flag and its name (v2 ``return_softmax_lse``).
        quant: v2's ``(query_quant_mode, dequant_scale_query, dequant_scale_key,
            dequant_scale_value)``; None for v1.
        sink: v2's ``learnable_sink`` as passed (None for v1).
        antiquant: the separated kv antiquant arguments by name as passed (v1
            ``key_antiquant_scale`` / ``_offset`` / ``_mode`` and the value ones; v2
            ``dequant_scale_key`` / ``dequant_offset_key`` and the value ones).
        full_quant: v1's ``dequant_scale1`` / ``quant_scale1`` / ``dequant_scale2`` by name as
            passed (None for v2).
        quant_out: the output quant scale and offset by name as passed (v1 ``quant_scale2`` /
            ``quant_offset2``, v2 ``quant_scale_out`` / ``quant_offset_out``).
        out_type: the output quant's element type (v2 ``out_dtype`` checked by
            :func:`._fused_infer_attention_quant.check_out_dtype`; ``'int8'`` for v1).
    """

    op: str
    query: object
    key: object
    value: object
    query_rope: object
    key_rope: object
    atten_mask: object
    act_q: object
    act_q_name: str
    act_kv: object
    act_kv_name: str
    block_table: object
    num_heads: object
    heads_name: str
    num_key_value_heads: object
    scale: object
    scale_name: str
    pre_tokens: object
    next_tokens: object
    input_layout: object
    sparse_mode: object
    block_size: object
    lse_flag: object
    lse_name: str
    quant: tuple | None = None
    sink: object = None
    antiquant: dict | None = None
    full_quant: dict | None = None
    quant_out: dict | None = None
    out_type: str = "int8"

# ---------------------------------------------------------------------- validation
def reject(given: dict, allowed: dict, op: str) -> None:
    """Raise ModeError naming the first argument in ``given`` that is not its only allowed value
    (``allowed``: name -> the value taken, None for a tensor that must be absent)."""
    for name, value in given.items():
        want = allowed[name]
        if value is None and want is None:
            continue
        if want is not None and not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, np.integer)) \
                and int(value) == want:
            continue
        raise arg_error(ModeError, name, f"{want!r} ({op} in ascend_emu takes only {want!r} for "
                        f"{name}: not emulated yet)", value if not hasattr(value, "shape") else describe(value))


def _int(value, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise arg_error(DTypeError, name, "an int", repr(value))
    return int(value)


def _lengths(x, name: str) -> np.ndarray:
    """A SymInt[] length argument (list / tuple of ints, or a 1-D int32 / int64 array) as int64 ``[B]``."""
    if isinstance(x, np.ndarray):
        check_dtype(x, name, ("int32", "int64"))
        if x.ndim != 1 or not 1 <= x.size <= MAX_BATCH:  # counted before the int64 copy is made
            raise arg_error(ShapeError, name, f"a 1-D array of 1 to {MAX_BATCH} lengths", list(x.shape))
        return x.astype(np.int64)
    if not isinstance(x, (list, tuple)) or not 1 <= len(x) <= MAX_BATCH:
        raise arg_error(DTypeError, name, f"a list of 1 to {MAX_BATCH} ints or a 1-D int32 / int64 array",
                        describe(x))
    for i, v in enumerate(x):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise arg_error(DTypeError, f"{name}[{i}]", "an int", repr(v))
        if not -(1 << 63) <= int(v) < 1 << 63:
            raise arg_error(DTypeError, f"{name}[{i}]", "an int in int64's range", repr(v))
    return np.array([int(v) for v in x], dtype=np.int64)


def _cache_layout(x: np.ndarray, name: str, layout_ndim: int | None, kv_n: int) -> CacheLayout:
    """The :class:`CacheLayout` of a paged cache: 3-D ``[nb, bs, KV_N*D]`` (PA_BSND with KV_N heads),
    4-D ``[nb, KV_N, bs, D]`` (head-major PA_BNSD), 5-D FRACTAL_NZ ``[nb, KV_N, D/C0, bs, C0]``
    (head-major PA_NZ)."""
    if x.ndim not in CACHE_LAYOUTS or x.size == 0:
        raise arg_error(ShapeError, name, "a non-empty paged cache [nb, bs, KV_N*D], [nb, KV_N, bs, D] or FRACTAL_NZ "
                        "[nb, KV_N, D/C0, bs, C0]", list(x.shape))
    if layout_ndim is not None and x.ndim != layout_ndim:
        raise arg_error(ShapeError, name, f"key's cache layout {CACHE_LAYOUTS[layout_ndim]} ({layout_ndim}-D)",
                        list(x.shape))
    itemsize = x.dtype.itemsize
    if x.ndim == 3:
        nb, bs, hd = x.shape
        if hd % kv_n:
            raise arg_error(ShapeError, name, f"last dim KV_N*D a multiple of KV_N={kv_n}", list(x.shape))
        return CacheLayout(mode="PA_BSND", num_blocks=nb, block_size=bs, dim=hd // kv_n, itemsize=itemsize, heads=kv_n)
    if x.ndim == 4:
        return CacheLayout.from_declared("PA_BNSD", x.shape, itemsize, name=name)
    nb, n, d1, bs, c0 = x.shape
    want_c0 = NZ_ROW_BYTES // itemsize
    if c0 != want_c0:
        raise arg_error(ShapeError, name, f"FRACTAL_NZ [nb, KV_N, D/C0, bs, C0] with C0 = {want_c0} (32 bytes of "
                        f"{x.dtype.name})", list(x.shape))
    return CacheLayout(mode="PA_NZ", num_blocks=nb, block_size=bs, dim=d1 * c0, itemsize=itemsize, heads=n,
                       head_major=True)


def normalise_mla(call: FusedInferAttentionCall) -> FusedInferAttentionArgs:
    """Validate every argument of either name (nothing is read from a cache before all pass).

    Raises:
        As :func:`ascend_emu.ops.fused_infer_attention_score.npu_fused_infer_attention_score`.
    """
    op, query, key, value, query_rope, key_rope = call.op, call.query, call.key, call.value, call.query_rope, \
        call.key_rope
    atten_mask, block_table, quant, input_layout, lse_flag = call.atten_mask, call.block_table, call.quant, \
        call.input_layout, call.lse_flag
    act_q_in, act_q_name, act_kv_in, act_kv_name = call.act_q, call.act_q_name, call.act_kv, call.act_kv_name
    heads_name = call.heads_name
    for name, x in {**(call.full_quant or {}), **(call.quant_out or {})}.items():
        if x is not None:
            raise arg_error(ModeError, name, "None with query_rope / key_rope (int8 full quant and the int8 output "
                            "quant are emulated in the MHA / GQA form)", describe(x))
    if call.sink is not None:
        raise arg_error(ModeError, "learnable_sink", "None with query_rope / key_rope (the sink belongs to the "
                        "MHA / GQA form's TND layouts)", describe(call.sink))
    for name, x in (call.antiquant or {}).items():  # v2's C8 reads dequant_scale_key / _value from call.quant
        if name in ("dequant_scale_key", "dequant_scale_value") or x is None or (
                "mode" in name and not isinstance(x, (bool, np.bool_)) and isinstance(x, (int, np.integer))
                and int(x) == 0):
            continue
        raise arg_error(ModeError, name, f"{'0' if 'mode' in name else 'None'} with query_rope / key_rope (kv "
                        "antiquant is emulated in the MHA / GQA form)", describe(x) if hasattr(x, "shape") else x)
    # ---- modes and scalars
    if input_layout not in LAYOUTS:
        raise arg_error(ModeError, "input_layout", f"one of {list(LAYOUTS)} (the MLA callers' layouts)",
                        repr(input_layout))
    q_layout, out_layout = LAYOUTS[input_layout]
    sm = _int(call.sparse_mode, "sparse_mode")
    if sm not in SPARSE_MODES:
        raise arg_error(ModeError, "sparse_mode", "0 (no mask) or 3 (causal, bottom-right aligned)", call.sparse_mode)
    for name, got in (("pre_tokens", call.pre_tokens), ("next_tokens", call.next_tokens)):
        _int(got, name)  # an int; its value is ignored by both emulated modes (module docstring)
    if not isinstance(lse_flag, (bool, np.bool_)):
        raise arg_error(DTypeError, call.lse_name, "a bool", type(lse_flag).__name__)
    scale_f = check_float(call.scale, call.scale_name)
    n = _int(call.num_heads, heads_name)
    kv_n = _int(call.num_key_value_heads, "num_key_value_heads")
    kv_n = n if kv_n == 0 else kv_n

    # ---- query, query_rope
    query = required(query, "query")
    c8 = _c8_mode(query, quant)
    check_dtype(query, "query", (C8_DTYPE,) if c8 else QUERY_DTYPES)
    q_nd = 3 if q_layout == "TND" else 4
    shown = {"BSND": "[B, S1, N, D]", "BNSD": "[B, N, S1, D]", "TND": "[T, N, D]"}[q_layout]
    if query.ndim != q_nd or query.size == 0:
        raise arg_error(ShapeError, "query", f"a non-empty {shown} for input_layout={input_layout}",
                        list(query.shape))
    q_n = query.shape[2] if q_layout == "BSND" else query.shape[1]
    d = int(query.shape[-1])
    if q_n != n:
        raise arg_error(ShapeError, heads_name, f"query's N = {q_n} ({shown})", n)
    if n not in QUERY_HEADS:
        raise arg_error(ShapeError, heads_name, f"one of {list(QUERY_HEADS)} (MLA)", n)
    elif d not in HEAD_DIMS:
        raise arg_error(ShapeError, "query", f"D in {list(HEAD_DIMS)} (absorbed MLA 512, prefill 128 + 64 rope)",
                        list(query.shape))
    if kv_n < 1 or n % kv_n or (d == HEAD_DIM_ABSORBED and kv_n != NKV):
        want = f"{NKV} (D = {HEAD_DIM_ABSORBED}: absorbed MLA)" if d == HEAD_DIM_ABSORBED else f"a divisor of N={n}"
        raise arg_error(ShapeError, "num_key_value_heads", want, call.num_key_value_heads)
    if c8 and (d != HEAD_DIM_ABSORBED or kv_n != NKV):
        raise arg_error(ShapeError, "query", f"D = {HEAD_DIM_ABSORBED} with num_key_value_heads = {NKV} (the C8 "
                        "decode is absorbed MLA only)", list(query.shape))
    query_rope = required(query_rope, "query_rope")
    check_dtype(query_rope, "query_rope", C8_ROPE_DTYPES if c8 else (dtype_name(query.dtype),))
    qdt, dv = dtype_name(query_rope.dtype), d  # the rope / output dtype
    if query_rope.shape != (*query.shape[:-1], D_ROPE):
        raise arg_error(ShapeError, "query_rope", f"query's shape with D = {D_ROPE} "
                        f"{[*query.shape[:-1], D_ROPE]}", list(query_rope.shape))

    # ---- caches
    key, value = required(key, "key"), required(value, "value")
    key_rope = required(key_rope, "key_rope")
    for name, x in (("key", key), ("value", value), ("key_rope", key_rope)):
        if x is not None:
            check_dtype(x, name, (C8_DTYPE if c8 and name != "key_rope" else qdt,))
    bsz = _int(call.block_size, "block_size")
    if c8 and block_table is None:
        raise arg_error(ModeError, "block_table", "a table (the C8 decode reads paged caches)", None)
    if block_table is None:  # non-paged: TND key / value / key_rope [T2, KV_N, D]
        if q_layout != "TND":
            raise arg_error(ModeError, "block_table", f"a table for input_layout={input_layout} (without "
                            "PageAttention only TND is emulated)", None)
        for name, x, want_d in (("key", key, d), ("value", value, dv), ("key_rope", key_rope, D_ROPE)):
            if x is None:
                continue
            if x.ndim != 3 or x.shape[1:] != (kv_n, want_d) or x.shape[0] != key.shape[0]:
                raise arg_error(ShapeError, name, f"[T2, KV_N={kv_n}, {want_d}] (TND without block_table; T2 of "
                                "key)", list(x.shape))
        if bsz != 0:
            raise arg_error(ModeError, "block_size", "0 without block_table", bsz)
        nb, bs = 0, 0
        layouts = {name: CacheLayout.from_declared("TND", x.shape, x.dtype.itemsize, name=name)
                   for name, x in (("key", key), ("value", value), ("key_rope", key_rope)) if x is not None}
    else:
        k_lay = _cache_layout(key, "key", None, kv_n)
        nb, bs = k_lay.num_blocks, k_lay.block_size
        if k_lay.heads != kv_n or k_lay.dim != d:
            raise arg_error(ShapeError, "key", f"KV_N = {kv_n} kv heads of D = {d} (query's D)", list(key.shape))
        layouts = {"key": k_lay}
        for name, x, want_d in (("value", value, d), ("key_rope", key_rope, D_ROPE)):
            lay = layouts[name] = _cache_layout(x, name, key.ndim, kv_n)
            if (lay.num_blocks, lay.heads, lay.block_size, lay.dim) != (nb, kv_n, bs, want_d):
                raise arg_error(ShapeError, name, f"key's cache layout with nb={nb}, KV_N={kv_n}, bs={bs}, "
                                f"D={want_d}", list(x.shape))
        if bsz != bs:
            raise arg_error(ShapeError, "block_size", f"the caches' block dim bs = {bs}", bsz)
        if bs % BLOCK_SIZE_ALIGN or not BLOCK_SIZE_ALIGN <= bs <= MAX_BLOCK_SIZE:
            raise arg_error(ShapeError, "block_size", f"a multiple of {BLOCK_SIZE_ALIGN} in [{BLOCK_SIZE_ALIGN}, "
                            f"{MAX_BLOCK_SIZE}]", bs)

    # ---- mask
    if atten_mask is not None:
        if sm == 0:
            raise arg_error(ModeError, "atten_mask", "None with sparse_mode=0 (masks other than sparse_mode 3's "
                            "causal one are not emulated)", describe(atten_mask))
        if not isinstance(atten_mask, np.ndarray):
            raise arg_error(DTypeError, "atten_mask", "None or a bool / int8 / uint8 array", describe(atten_mask))
        check_dtype(atten_mask, "atten_mask", MASK_DTYPES)
        size = CAUSAL_MASK_SIZE
        if atten_mask.shape != (size, size):
            raise arg_error(ShapeError, "atten_mask", f"the optimised causal mask [{size}, {size}] (sparse_mode 3)",
                            list(atten_mask.shape))
        if not np.array_equal(atten_mask.astype(bool), _causal_mask()):
            raise arg_error(ModeError, "atten_mask", "1 strictly above the diagonal, 0 elsewhere (sparse_mode 3's "
                            "causal mask)", describe(atten_mask))

    c8_fields = _c8_scales(query, q_layout, quant) if c8 else {}

    # ---- lengths, block_table
    if q_layout == "TND":
        if act_q_in is None:
            raise arg_error(ShapeError, act_q_name, "prefix sums [B] (required for TND)", None)
        q_sums = _lengths(act_q_in, act_q_name)
        too_big = np.abs(q_sums) > np.iinfo(np.int32).max
        if too_big.any():
            i = int(np.argmax(too_big))
            raise arg_error(ShapeError, f"{act_q_name}[{i}]", f"a prefix sum <= T={query.shape[0]}", int(q_sums[i]))
        act_q = prefix_lengths(q_sums.astype(np.int32), act_q_name, int(query.shape[0]))
        b = int(act_q.size)
        s1 = int(act_q.max())
        q_start = np.cumsum(act_q) - act_q
    else:
        b, s1 = int(query.shape[0]), int(query.shape[2] if q_layout == "BNSD" else query.shape[1])
        if act_q_in is None:
            act_q = np.full(b, s1, np.int64)
        else:
            act_q = _lengths(act_q_in, act_q_name)
            if act_q.size != b:
                raise arg_error(ShapeError, act_q_name, f"{b} lengths (query's B)", act_q.size)
            bad = (act_q < 0) | (act_q > s1)
            if bad.any():
                i = int(np.argmax(bad))
                raise arg_error(ShapeError, f"{act_q_name}[{i}]", f"a query length in [0, S1={s1}]", int(act_q[i]))
        q_start = np.arange(b, dtype=np.int64) * s1
    if act_kv_in is None:
        raise arg_error(ShapeError, act_kv_name, "per-request kv lengths [B] (required)", None)
    act_kv = _lengths(act_kv_in, act_kv_name)
    if act_kv.size != b:
        raise arg_error(ShapeError, act_kv_name, f"{b} lengths (one per request)", act_kv.size)
    if block_table is None:
        table, kv_blocks = None, None
        act_kv, kv_rows = _tnd_kv(act_kv, act_kv_name, int(key.shape[0]))
    else:
        table = required(block_table, "block_table")
        check_dtype(table, "block_table", ("int32",))
        if table.ndim != 2 or table.shape[0] != b or table.shape[1] == 0:
            raise arg_error(ShapeError, "block_table", f"[B={b}, max_blocks >= 1]", list(table.shape))
        cap = int(table.shape[1]) * bs
        bad = (act_kv < 0) | (act_kv > cap)
        if bad.any():
            i = int(np.argmax(bad))
            raise arg_error(ShapeError, f"{act_kv_name}[{i}]", f"a kv length in [0, {cap}] (block_table's "
                            f"{table.shape[1]} blocks of {bs})", int(act_kv[i]))
        kv_rows = None
        kv_blocks = blocks_from_block_table(table, act_kv, bs, nb, name="block_table")  # IndexRangeError naming it

    # ---- output shapes
    t = int(query.shape[0]) if q_layout == "TND" else b * s1
    out_shape = {"BSND": (b, s1, n, dv), "BNSD": (b, n, s1, dv), "TND": (t, n, dv), "NBSD": (n, b, s1, dv),
                 "NTD": (n, t, dv)}[out_layout]
    lse_shape = ((t, n, 1) if q_layout == "TND" else (b, n, s1, 1)) if lse_flag else (0,)
    return FusedInferAttentionArgs(
        op=op, query=query, query_rope=query_rope, key=key, value=value, key_rope=key_rope, atten_mask=atten_mask,
        block_table=table, actual_seq_lengths=act_q_in, actual_seq_lengths_kv=act_kv_in, num_heads=n,
        num_kv_heads=kv_n, scale=scale_f, input_layout=input_layout, query_layout=q_layout, out_layout=out_layout,
        key_layout=layouts["key"], value_layout=layouts["value"], rope_layout=layouts.get("key_rope"), block_size=bs,
        sparse_mode=sm, softmax_lse_flag=bool(lse_flag), batch=b, seq_q=s1, head_dim=d, act_q=act_q, act_kv=act_kv,
        q_start=q_start.astype(np.int64), kv_blocks=kv_blocks, kv_rows=kv_rows, out_shape=out_shape,
        lse_shape=lse_shape, value_dim=dv, **c8_fields)


def _c8_mode(query, quant) -> bool:
    """Whether a v2 call is the C8 decode: an int8 query, which needs query_quant_mode 3 (and mode 3
    needs an int8 query); v1 (``quant`` None) and float queries keep the plain path."""
    if quant is None:
        return False
    qqm = _int(quant[0], "query_quant_mode")
    is_int8 = isinstance(query, np.ndarray) and query.dtype == np.int8
    if is_int8 and qqm != QUERY_QUANT_MODE_C8:
        raise arg_error(ModeError, "query_quant_mode", f"{QUERY_QUANT_MODE_C8} (per-token-head) with an int8 query "
                        "(the C8 decode)", qqm)
    if not is_int8:
        if qqm != 0:
            raise arg_error(ModeError, "query_quant_mode", "0 with a float query (3 only with an int8 query: the C8 "
                            "decode)", qqm)
        for name, x in zip(("dequant_scale_query", "dequant_scale_key", "dequant_scale_value"), quant[1:], strict=True):
            if x is not None:
                raise arg_error(ModeError, name, "None with a float query (the dequant scales belong to the int8 C8 "
                                "decode)", describe(x))
    return is_int8


def _c8_scales(query: np.ndarray, q_layout: str, quant) -> dict:
    """The C8 scales checked: dequant_scale_query fp32 of query's shape without D, key / value fp32
    with one element (per-tensor)."""
    _, dq, dk, dv = quant
    dq = required(dq, "dequant_scale_query")
    check_dtype(dq, "dequant_scale_query", (C8_SCALE_DTYPE,))
    want = query.shape[:-1]
    if dq.shape != want:
        shown = {"BSND": "[B, S1, N]", "BNSD": "[B, N, S1]", "TND": "[T, N]"}[q_layout]
        raise arg_error(ShapeError, "dequant_scale_query", f"{shown} = {list(want)} (per token and head, query's "
                        "shape without D)", list(dq.shape))
    for name, x in (("dequant_scale_key", dk), ("dequant_scale_value", dv)):
        x = required(x, name)
        check_dtype(x, name, (C8_SCALE_DTYPE,))
        if x.size != 1 or x.ndim not in (1, 2):
            raise arg_error(ShapeError, name, "one fp32 value, [1] or [1, 1] (per-tensor: key_quant_mode / "
                            "value_quant_mode 0)", list(x.shape))
    for name, x in (("dequant_scale_query", dq), ("dequant_scale_key", dk), ("dequant_scale_value", dv)):
        if not np.isfinite(x).all():
            raise arg_error(DTypeError, name, "finite scales", describe(x))
    return dict(dequant_scale_query=dq, dequant_scale_key=np.asarray(dk), dequant_scale_value=np.asarray(dv),
                query_quant_mode=QUERY_QUANT_MODE_C8)


def _tnd_kv(sums: np.ndarray, name: str, t2: int) -> tuple[np.ndarray, np.ndarray]:
    """Non-paged TND kv: prefix sums ``[B]`` (last = T2) -> (lengths ``[B]``, rows ``[B, W]``, -1 past each length)."""
    too_big = np.abs(sums) > np.iinfo(np.int32).max
    if too_big.any():
        i = int(np.argmax(too_big))
        raise arg_error(ShapeError, f"{name}[{i}]", f"a prefix sum <= T2={t2}", int(sums[i]))
    lens = prefix_lengths(sums.astype(np.int32), name, t2)
    width = max(int(lens.max()), 1)
    pos = np.arange(width)[None, :]
    rows = np.where(pos < lens[:, None], (np.cumsum(lens) - lens)[:, None] + pos, -1)
    return lens, rows.astype(np.int64)


_CAUSAL: list[np.ndarray] = []


def _causal_mask() -> np.ndarray:
    """The sparse_mode 3 mask: bool ``[2048, 2048]``, True strictly above the diagonal (built once)."""
    if not _CAUSAL:
        _CAUSAL.append(np.triu(np.ones((CAUSAL_MASK_SIZE, CAUSAL_MASK_SIZE), dtype=bool), k=1))
    return _CAUSAL[0]
