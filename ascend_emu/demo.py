"""A DeepSeek-V3.2 decode step on the NumPy API: prefill, then prolog -> indexer -> sparse attention.

What ``ascend-emu demo`` runs (the CLI only renders the :class:`DecodeStepReport` this module
returns). Two paths over the same weights, the same context and the same new token:

- **int8 path** (what DeepSeek-V3.2 deployments on Atlas A2/A3 run): ``npu_mla_prolog_v3`` with
  partial quant (int8 ``weight_uq_qr``) and per-tile kv quant (``kv_cache_quant_mode=3``) writes
  656-byte rows into a PA_BSND cache; ``npu_lightning_indexer`` picks the top-k context tokens;
  ``npu_kv_quant_sparse_flash_attention`` attends over them in the int8 cache.
- **bf16 path**: non-quant ``npu_mla_prolog_v3`` writes bf16 ``kv_cache`` / ``kr_cache``;
  ``npu_sparse_flash_attention`` attends over the same indices.

The difference between the two outputs is what quantization costs (max abs error, cosine).

Scale (:class:`DecodeStepConfig`): the model's per-layer shapes are kept (He = 7168, Hcq = 1536,
Hckv = 512, D = 128, Dr = 64, indexer 64 heads x 128, top-2048), the query heads are those of one
of 8 tensor-parallel ranks (128 / 8 = 16), and the context is 4096 tokens (the model serves up to
128 K); one layer, one sequence, random weights scaled ``randn / sqrt(fan_in)``. The indexer's own
projections (its query from ``query_norm``, its key and head weights from the hidden state) are
plain NumPy matmuls here: they are not among the emulated ops. The softmax scale is ``(D + Dr) ** -0.5``, DeepSeek's (without its YaRN factor).

First run: with a cold kernel cache the ops' first calls compile 26 Numba kernels (41-43 s on
one core). ``run_decode_step(jobs=N)`` (``ascend-emu demo -j N``, by default the cores) has up
to N worker processes compile them, one op family at a time (:data:`WORKER_FAMILIES`: the
family's first calls on stand-in inputs of the demo's shapes and dtypes, so the same kernels and
no others), into the one on-disk cache; the demo runs meanwhile and waits for a family's worker
before that op's first call, which then loads the kernels. With a warm cache no worker starts.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field, fields
from typing import Callable

import numpy as np

from . import ops
from ._kernel_cache import kernel_cache_dir
from .checked_mode import mark_written
from .errors import ModeError, ShapeError, arg_error
from .layouts import slots_from_block_table
from .mla import D_NOPE, D_ROPE, HCKV, INDEXER_HEAD_DIM, INDEXER_HEADS
from .ops import lightning_indexer as _indexer_op
from .ops import sparse_flash_attention as _sfa_op
from .ops.mla_prolog import VERSION_LIMITS
from .progress import CompileWatch
from .quant import BF16, MLA_ROW, read_combined_cache

#: DeepSeek-V3.2's query heads per layer; a config's ``heads`` are one tensor-parallel rank's share.
MODEL_HEADS = 128
#: The longest sequence DeepSeek-V3.2 serves (128 K tokens): ``context + 1`` is at most this.
MODEL_MAX_TOKENS = 131072
#: Runs of each decode step after its first call; the step's time is their median (steady state).
DECODE_REPEATS = 5
#: The attention's softmax scale: DeepSeek's ``(D + Dr) ** -0.5`` (without its YaRN factor).
SCALE_VALUE = float((D_NOPE + D_ROPE) ** -0.5)


def _ints_text(values) -> str:
    """``a multiple of 16 in [16, 1024]`` for an arithmetic run from its step, else ``one of [...]``."""
    values = sorted(values)
    if len(values) > 2 and values == list(range(values[0], values[-1] + 1, values[0])):
        return f"a multiple of {values[0]} in [{values[0]}, {values[-1]}]"
    return f"one of {values}"


#: PA_BSND block sizes all four ops of the step accept (npu_mla_prolog_v3's table, the indexer's and
#: the sparse attentions' "a multiple of 16 up to 1024").
BLOCK_SIZES = tuple(b for b in VERSION_LIMITS[3].block_sizes
                    if not b % _indexer_op.BLOCK_SIZE_ALIGN and b <= _indexer_op.BLOCK_SIZE_MAX
                    and not b % _sfa_op.BLOCK_SIZE_ALIGN and b <= _sfa_op.MAX_BLOCK_SIZE)
#: What each :class:`DecodeStepConfig` field must be: (error class, test, expectation text).
_FIELD_RULES: dict[str, tuple[type, Callable[[int], bool], str]] = {
    "he": (ShapeError, lambda v: v in VERSION_LIMITS[3].he,
           f"{_ints_text(VERSION_LIMITS[3].he)} (npu_mla_prolog_v3's He)"),
    "hcq": (ShapeError, lambda v: v in VERSION_LIMITS[3].hcq,
            f"{_ints_text(VERSION_LIMITS[3].hcq)} (npu_mla_prolog_v3's Hcq)"),
    "heads": (ShapeError, lambda v: v in _sfa_op.QUERY_HEADS,
              f"{_ints_text(_sfa_op.QUERY_HEADS)} (the sparse attentions' N1)"),
    "context": (ShapeError, lambda v: 1 <= v <= MODEL_MAX_TOKENS - 1,
                f"1 to {MODEL_MAX_TOKENS - 1} tokens (the model serves {MODEL_MAX_TOKENS} with the decoded one)"),
    "block_size": (ShapeError, lambda v: v in BLOCK_SIZES,
                   f"{_ints_text(BLOCK_SIZES)} (PA_BSND BlockSize of npu_mla_prolog_v3, the indexer and the "
                   "sparse attentions)"),
    "sparse_count": (ModeError, lambda v: 1 <= v <= _indexer_op.SPARSE_COUNT_MAX_DENSE
                     or v in _indexer_op.SPARSE_COUNTS_LARGE,
                     f"1-{_indexer_op.SPARSE_COUNT_MAX_DENSE} or one of {list(_indexer_op.SPARSE_COUNTS_LARGE)} "
                     "(npu_lightning_indexer's sparse_count)"),
    "indexer_heads": (ShapeError, lambda v: v == INDEXER_HEADS, f"{INDEXER_HEADS} (npu_lightning_indexer's N1)"),
    "indexer_dim": (ShapeError, lambda v: v == INDEXER_HEAD_DIM, f"{INDEXER_HEAD_DIM} (npu_lightning_indexer's D)"),
    "seed": (ModeError, lambda v: v >= 0, "a non-negative int (numpy.random.default_rng)"),
}


def config_problem(name: str, value: object) -> str | None:
    """What :class:`DecodeStepConfig` field ``name`` must be, if ``value`` is not that; else None.

    The demo's one definition of its shape rules (taken from the ops' own limits), used by the
    config itself and by the CLI's argument parsing (``ascend-emu demo --block-size 100``).
    """
    _, ok, expected = _FIELD_RULES[name]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        return f"an int: {expected}"
    return None if ok(int(value)) else expected


def heads_share(heads: int) -> str:
    """What ``heads`` query heads are of DeepSeek-V3.2's :data:`MODEL_HEADS`: ``one TP-8 rank of 128``."""
    if heads == MODEL_HEADS:
        return f"all {MODEL_HEADS} of the model, no tensor parallelism"
    return f"one TP-{MODEL_HEADS // heads} rank of the model's {MODEL_HEADS}"


@dataclass(frozen=True, kw_only=True)
class DecodeStepConfig:
    """Shapes of the demo's decode step (defaults: DeepSeek-V3.2 per layer, one TP-8 rank).

    Every field is checked when the config is made (:func:`config_problem`): a value the ops would
    reject is a :class:`~ascend_emu.errors.ShapeError` / :class:`~ascend_emu.errors.ModeError`
    naming the field, before anything runs.

    Attributes:
        he: hidden size He (the prolog accepts 7168 or 7680).
        hcq: query low-rank dim Hcq.
        heads: query heads N of this rank (:func:`heads_share`).
        context: tokens already in the cache before the decode step (at most
            ``MODEL_MAX_TOKENS - 1``).
        block_size: rows per cache block (PA_BSND).
        sparse_count: top-k of the indexer, the tokens each query attends to.
        indexer_heads: indexer query heads.
        indexer_dim: indexer head dim.
        seed: the random seed of weights and inputs.
    """

    he: int = 7168
    hcq: int = 1536
    heads: int = 16
    context: int = 4096
    block_size: int = 128
    sparse_count: int = 2048
    indexer_heads: int = 64
    indexer_dim: int = 128
    seed: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            problem = config_problem(f.name, getattr(self, f.name))
            if problem is not None:
                raise arg_error(_FIELD_RULES[f.name][0], f.name, problem, getattr(self, f.name))


@dataclass(frozen=True)
class FirstCall:
    """The first call of a step's op: Numba compiles (or loads from its cache) the kernels it uses.

    Attributes:
        step: the step's name.
        seconds: wall time of the call, compiling included.
        kernels: Numba kernels it compiled (0 when the on-disk cache had them all).
        compile_seconds: the part of ``seconds`` spent compiling them.
        worker_kernels, worker_compile_seconds: kernels of its op family that a worker process
            compiled for it (``jobs``, :func:`run_decode_step`) and that worker's compile time;
            ``seconds`` then includes waiting for the worker.
    """

    step: str
    seconds: float
    kernels: int
    compile_seconds: float
    worker_kernels: int = 0
    worker_compile_seconds: float = 0.0


@dataclass
class DecodeStepReport:
    """What the demo measured.

    Attributes:
        config: the shapes used.
        timings: ``[(step, seconds)]`` in the order run, steady state (compiling excluded): a
            decode step's time is the median of :data:`DECODE_REPEATS` runs after its first call,
            a prefill step runs once after a first call of its op on two tokens.
        first_calls: the first call of each op step (:class:`FirstCall`), in the order run.
        kernels_compiled, compile_seconds: Numba kernels compiled in this process during the whole
            run and the time spent on it (first run only: they are cached on disk).
        workers: worker processes that compiled op families' kernels meanwhile (0: none, the cache
            had them or ``jobs`` was 1); worker_families: those families (:data:`WORKER_FAMILIES`);
            worker_kernels, worker_compile_seconds: the kernels they compiled and the compile time
            summed over the workers (it ran in parallel with this process); worker_failures: a
            line per family whose worker failed (this process then compiled it).
        kv_int8: the int8 path's cache after the step, ``[BlockNum, BlockSize, 1, 656]`` int8 PA_BSND.
        blocks_used, num_blocks: cache blocks holding the ``context + 1`` tokens, and the cache size.
        block_table: the sequence's blocks ``[ceil((context + 1) / block_size)]`` (a shuffled pool).
        cache_bytes: ``{"int8 kv_cache": n, "bf16 kv_cache + kr_cache": n}``.
        input_bytes: ``{"weights": n, "caches": n, "tokens": n}``: the step's inputs (one layer's
            weights as given, every cache, the hidden states and RoPE tables), for memory figures.
        row_slot: the cache slot of the decoded token (the new one).
        row: its 656 raw bytes (uint8 ``[656]``).
        row_k_nope, row_k_rope, row_scales: the row decoded: dequantized k_nope fp32 ``[512]``,
            k_rope bf16 ``[64]``, the 4 tile scales fp32 ``[4]``.
        selected: tokens the indexer selected (``min(sparse_count, context + 1)``).
        out_int8, out_bf16: attention outputs bf16 ``[N, 512]`` of the two paths.
        max_abs, cosine: their difference.
        decode_int8: runs the int8 path's decode step again (prolog -> indexer -> KV-quant sparse
            attention, the new token's row rewritten in place); returns its attention output.
        floor_int8: the bare work of that step, for benchmarks, each product on the engine the
            op uses for it: the prolog's bf16 matmuls as fp32 BLAS on the weights' widening the
            ops keep (``emu.matmul.weight_f32``: no second copy), its
            int8 ``cq @ W_uq_qr`` on the op's int8 engine (``emu.matmul.matmul_int8``: an fp32
            product there would bound the op by a slower engine than its own), every fp32
            product through ``emu.matmul.matmul_f32`` (the ops' rule: a small one on one BLAS
            thread); the indexer's q . k product over the context and its top-k (``np.partition``, then a sort of the kept values), the gather of the
            selected 656-byte rows and the attention's two fp32 products.
        floor_operands: the operands of that step's products in the dtypes its ops multiply
            (``{label: (a, w)}`` with ``a @ w`` the product: bf16 x bf16, the partial-quant
            ``cq @ W_uq_qr`` int8 x int8), for benchmarks that time them on other engines
            (``benchmarks/_floor.py``): ``x@Wdq`` ``[1, He] x [He, Hcq]``, ``cq@Wuq_qr``
            ``[1, Hcq] x [Hcq, N*192]``, ``q@Wuk`` ``[N, 1, 128] x [N, 128, Hckv]``, ``x@Wdkv_kr``
            ``[1, He] x [He, Hckv+Dr]``, ``indexer q.k`` ``[64, 128] x [128, context+1]``, ``q@K``
            ``[N, 576] x [576, K]`` and ``P@V`` ``[N, K] x [K, Hckv]`` (K: tokens selected; the
            K / V values are stand-ins of the right dtype and shape).
        floor_gather_bytes: bytes of the selected 656-byte rows the attention gathers.
    """

    config: DecodeStepConfig
    timings: list[tuple[str, float]] = field(default_factory=list)
    first_calls: list[FirstCall] = field(default_factory=list)
    kernels_compiled: int = 0
    compile_seconds: float = 0.0
    workers: int = 0
    worker_families: tuple[str, ...] = ()
    worker_kernels: int = 0
    worker_compile_seconds: float = 0.0
    worker_failures: list[str] = field(default_factory=list)
    kv_int8: np.ndarray | None = None
    blocks_used: int = 0
    num_blocks: int = 0
    block_table: np.ndarray | None = None
    cache_bytes: dict[str, int] = field(default_factory=dict)
    input_bytes: dict[str, int] = field(default_factory=dict)
    row_slot: int = 0
    row: np.ndarray | None = None
    row_k_nope: np.ndarray | None = None
    row_k_rope: np.ndarray | None = None
    row_scales: np.ndarray | None = None
    selected: int = 0
    out_int8: np.ndarray | None = None
    out_bf16: np.ndarray | None = None
    max_abs: float = 0.0
    cosine: float = 0.0
    decode_int8: Callable[[], np.ndarray] | None = None
    floor_int8: Callable[[], object] | None = None
    floor_operands: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    floor_gather_bytes: int = 0


def _rope_tables(positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """bf16 sin / cos ``[len(positions), Dr]`` in the half layout the MLA ops take."""
    inv_freq = 10000.0 ** (-np.arange(D_ROPE // 2, dtype=np.float32) / (D_ROPE // 2))  # [Dr/2]
    angle = positions.astype(np.float32)[:, None] * inv_freq  # [P, Dr/2]
    angle = np.concatenate([angle, angle], axis=-1)  # [P, Dr]
    return np.sin(angle).astype(BF16), np.cos(angle).astype(BF16)


def _quant_per_channel(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per output channel: int8 ``[K, C]`` and its fp32 dequant scale ``[1, C]``."""
    scale = np.abs(w).max(axis=0, keepdims=True) / 127  # [1, C]
    return np.rint(w / scale).astype(np.int8), scale.astype(np.float32)


def _blocks(c: DecodeStepConfig) -> tuple[int, int, int]:
    """``(tokens, blocks_used, num_blocks)``: the context and the decoded token, the cache blocks
    they fill, and the pool (larger than the sequence needs)."""
    total = c.context + 1
    blocks_used = -(-total // c.block_size)
    return total, blocks_used, blocks_used + 8


def _weights(c: DecodeStepConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One layer's random weights, ``randn / sqrt(fan_in)`` (module doc): the prolog's (NZ, bf16 and
    an int8 ``weight_uq_qr`` with its per-channel dequant scale) and the indexer's projections."""
    def randn(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(BF16)

    n = c.heads
    w_uq_qr = randn(c.hcq, n * (D_NOPE + D_ROPE), scale=c.hcq ** -0.5)  # [Hcq, N*(D+Dr)]
    w_uq_qr_int8, w_uq_qr_scale = _quant_per_channel(w_uq_qr.astype(np.float32))
    return dict(
        weight_dq=ops.npu_format_cast(randn(c.he, c.hcq, scale=c.he ** -0.5), 29),  # [He, Hcq] NZ
        weight_uq_qr=ops.npu_format_cast(w_uq_qr, 29),
        weight_uq_qr_int8=ops.npu_format_cast(w_uq_qr_int8, 29),
        dequant_scale_w_uq_qr=w_uq_qr_scale,  # [1, N*(D+Dr)]
        weight_uk=randn(n, D_NOPE, HCKV, scale=D_NOPE ** -0.5),  # [N, D, Hckv]
        weight_dkv_kr=ops.npu_format_cast(randn(c.he, HCKV + D_ROPE, scale=c.he ** -0.5), 29),
        rmsnorm_gamma_cq=(1 + 0.1 * rng.standard_normal(c.hcq, dtype=np.float32)).astype(BF16),
        rmsnorm_gamma_ckv=(1 + 0.1 * rng.standard_normal(HCKV, dtype=np.float32)).astype(BF16),
        w_iq=randn(c.hcq, c.indexer_heads * c.indexer_dim, scale=c.hcq ** -0.5),  # indexer projections
        w_ik=randn(c.he, c.indexer_dim, scale=c.he ** -0.5),
        w_iw=randn(c.he, c.indexer_heads, scale=c.he ** -0.5),
    )


def _prolog_call(int8: bool, w: dict, x, sin, cos, kv_cache, kr_cache, slots, tok: slice):
    """The demo's ``npu_mla_prolog_v3`` on tokens ``tok`` of x ``[1, context + 1, He]`` (sin / cos
    ``[context + 1, Dr]``, slots int64 ``[context + 1]``): the int8 path (partial quant, per-tile
    656-byte rows into ``kv_cache``; ``kr_cache`` unused) or the bf16 path (bf16 kv / kr caches)."""
    common = dict(weight_dq=w["weight_dq"], weight_uk=w["weight_uk"], weight_dkv_kr=w["weight_dkv_kr"],
                  rmsnorm_gamma_cq=w["rmsnorm_gamma_cq"], rmsnorm_gamma_ckv=w["rmsnorm_gamma_ckv"],
                  rope_sin=sin[None, tok], rope_cos=cos[None, tok], cache_index=slots[None, tok],
                  cache_mode="PA_BSND")
    if int8:
        return ops.npu_mla_prolog_v3(
            x[:, tok], weight_uq_qr=w["weight_uq_qr_int8"], kv_cache=kv_cache, kr_cache=np.zeros(0, BF16),
            dequant_scale_w_uq_qr=w["dequant_scale_w_uq_qr"], k_nope_clip_alpha=np.ones(1, np.float32),
            weight_quant_mode=1, kv_cache_quant_mode=3, query_quant_mode=0, ckvkr_repo_mode=1,
            quant_scale_repo_mode=1, tile_size=MLA_ROW.tile_size, **common)
    return ops.npu_mla_prolog_v3(x[:, tok], weight_uq_qr=w["weight_uq_qr"], kv_cache=kv_cache, kr_cache=kr_cache,
                                 query_norm_flag=True, **common)


def _first_tokens(prolog: Callable[[slice], object], context: int) -> None:
    """The prolog on the first context tokens (two: enough to split), plainly and with its work
    split across threads: the serial and the threaded kernels a long prefill uses (the rows it
    writes are written again, with the same bytes, by the prefill)."""
    from .warmup import TOKENS, split_every_kernel

    tok = slice(0, min(TOKENS, context))
    prolog(tok)
    with split_every_kernel():
        prolog(tok)


def _prolog_first_calls(c: DecodeStepConfig) -> None:
    """The prefill's first calls of both prologs (:func:`_first_tokens`) on stand-in weights, tokens
    and caches of the demo's shapes and dtypes (constant weights: cheaper to make than random ones)."""
    total, blocks_used, num_blocks = _blocks(c)
    n = c.heads * (D_NOPE + D_ROPE)

    def nz(rows: int, cols: int, dtype=BF16, value: float = 0.01):
        return ops.npu_format_cast(np.full((rows, cols), value, dtype), 29)

    w = dict(weight_dq=nz(c.he, c.hcq), weight_uq_qr=nz(c.hcq, n), weight_uq_qr_int8=nz(c.hcq, n, np.int8, 1),
             dequant_scale_w_uq_qr=np.full((1, n), 1e-3, np.float32),
             weight_uk=np.full((c.heads, D_NOPE, HCKV), 0.01, BF16), weight_dkv_kr=nz(c.he, HCKV + D_ROPE),
             rmsnorm_gamma_cq=np.ones(c.hcq, BF16), rmsnorm_gamma_ckv=np.ones(HCKV, BF16))
    x = np.zeros((1, total, c.he), BF16)  # [1, context + 1, He]
    x[:, :2] = np.random.default_rng(c.seed).standard_normal((1, min(2, total), c.he), dtype=np.float32).astype(BF16)
    sin, cos = _rope_tables(np.arange(total))  # [context + 1, Dr]
    slots = slots_from_block_table(np.arange(blocks_used, dtype=np.int32)[None, :], [total], c.block_size,
                                   num_blocks)[0]  # [context + 1]
    kv_int8 = np.zeros((num_blocks, c.block_size, 1, MLA_ROW.row_bytes), np.int8)
    kv_bf16 = np.zeros((num_blocks, c.block_size, 1, HCKV), BF16)
    kr_bf16 = np.zeros((num_blocks, c.block_size, 1, D_ROPE), BF16)
    _first_tokens(lambda tok: _prolog_call(True, w, x, sin, cos, kv_int8, None, slots, tok), c.context)
    _first_tokens(lambda tok: _prolog_call(False, w, x, sin, cos, kv_bf16, kr_bf16, slots, tok), c.context)


def _indexer_call(c: DecodeStepConfig, q_idx, k_indexer, w_idx, block_table, seq_q, seq_kv):
    """The decode step's ``npu_lightning_indexer``: bf16 q ``[1, 1, 64, 128]``, PA_BSND keys
    ``[BlockNum, BlockSize, 1, 128]``, weights ``[1, 1, 64]``; int32 ``[1, 1, 1, sparse_count]`` top-k."""
    return ops.npu_lightning_indexer(
        q_idx, k_indexer, w_idx, actual_seq_lengths_query=seq_q, actual_seq_lengths_key=seq_kv,
        block_table=block_table, layout_query="BSND", layout_key="PA_BSND", sparse_count=c.sparse_count,
        sparse_mode=3)


def _kv_quant_attention_call(q576, kv_int8, sparse_indices, block_table, seq_q, seq_kv):
    """The int8 path's ``npu_kv_quant_sparse_flash_attention`` over 656-byte per-tile rows."""
    return ops.npu_kv_quant_sparse_flash_attention(
        q576, kv_int8, kv_int8, sparse_indices, SCALE_VALUE, 2, 2, block_table=block_table,
        actual_seq_lengths_query=seq_q, actual_seq_lengths_kv=seq_kv, layout_query="BSND", layout_kv="PA_BSND",
        sparse_mode=3, attention_mode=2, quant_scale_repo_mode=1, tile_size=MLA_ROW.tile_size,
        rope_head_dim=D_ROPE)


def _attention_call(query, query_rope, kv_bf16, kr_bf16, sparse_indices, block_table, seq_q, seq_kv):
    """The bf16 path's ``npu_sparse_flash_attention`` over bf16 kv_cache / kr_cache."""
    return ops.npu_sparse_flash_attention(
        query, kv_bf16, kv_bf16, sparse_indices, SCALE_VALUE, block_table=block_table,
        actual_seq_lengths_query=seq_q, actual_seq_lengths_kv=seq_kv, query_rope=query_rope, key_rope=kr_bf16,
        layout_query="BSND", layout_kv="PA_BSND", sparse_mode=3, attention_mode=2)


def _stand_in_tables(c: DecodeStepConfig):
    """A worker's ``(block_table, seq_q, seq_kv)``: the demo's shapes and dtypes (blocks in order)."""
    total, blocks_used, _ = _blocks(c)
    return (np.arange(blocks_used, dtype=np.int32)[None, :], np.array([1], np.int32),
            np.array([total], np.int32))


def _indexer_first_call(c: DecodeStepConfig) -> None:
    """The decode step's indexer call on stand-in inputs of the demo's shapes, dtypes and lengths
    (what selects its kernels; the values do not)."""
    rng = np.random.default_rng(c.seed)
    _, _, num_blocks = _blocks(c)
    randn = lambda *shape: rng.standard_normal(shape, dtype=np.float32).astype(BF16)  # noqa: E731
    _indexer_call(c, randn(1, 1, c.indexer_heads, c.indexer_dim),
                  randn(num_blocks, c.block_size, 1, c.indexer_dim), randn(1, 1, c.indexer_heads),
                  *_stand_in_tables(c))


def _attention_first_calls(c: DecodeStepConfig) -> None:
    """Both decode attentions on stand-in inputs of the demo's shapes and dtypes, selecting as many
    tokens as the demo's indexer does (``min(sparse_count, context + 1)``), on zero caches."""
    rng = np.random.default_rng(c.seed)
    total, _, num_blocks = _blocks(c)
    randn = lambda *shape: rng.standard_normal(shape, dtype=np.float32).astype(BF16)  # noqa: E731
    indices = np.full((1, 1, 1, c.sparse_count), -1, np.int32)  # [B, S1, N2, K]
    selected = min(c.sparse_count, total)
    indices[..., :selected] = np.arange(selected, dtype=np.int32)
    tables = _stand_in_tables(c)
    _kv_quant_attention_call(randn(1, 1, c.heads, HCKV + D_ROPE),
                             np.zeros((num_blocks, c.block_size, 1, MLA_ROW.row_bytes), np.int8), indices, *tables)
    _attention_call(randn(1, 1, c.heads, HCKV), randn(1, 1, c.heads, D_ROPE),
                    np.zeros((num_blocks, c.block_size, 1, HCKV), BF16),
                    np.zeros((num_blocks, c.block_size, 1, D_ROPE), BF16), indices, *tables)


#: The op families whose kernels the demo can have worker processes compile (``jobs``), the longest
#: to compile first (cold, one at a time on a quiet 2-core machine: both prologs' serial and
#: threaded kernels 15 s, the two sparse attentions 14 s, the indexer 4.4 s): each with its emu
#: module (a kernel of it in the cache means the family is not cold, :func:`cold_families`) and its
#: first calls on stand-in inputs of the demo's shapes and dtypes.
WORKER_FAMILIES: dict[str, tuple[str, Callable[[DecodeStepConfig], None]]] = {
    "npu_mla_prolog_v3": ("mla_prolog", _prolog_first_calls),
    "sparse attention": ("sparse_flash_attention", _attention_first_calls),
    "npu_lightning_indexer": ("lightning_indexer", _indexer_first_call),
}


def family_names(families) -> str:
    """``a, b and c``: op families in a sentence."""
    families = list(families)
    return " and ".join([", ".join(families[:-1]), families[-1]] if len(families) > 1 else families)


def cold_families() -> tuple[str, ...]:
    """The :data:`WORKER_FAMILIES` the kernel cache (:func:`~ascend_emu._kernel_cache.kernel_cache_dir`)
    holds no kernel of: a glob per family, no kernel loaded. A family with some kernels cached (an
    earlier demo at other shapes, ``ascend-emu warmup``) is not cold: its first call here compiles
    what is missing."""
    emu = kernel_cache_dir() / "emu"
    return tuple(family for family, (module, _) in WORKER_FAMILIES.items()
                 if not any(emu.glob(f"{module}.*.nbi")))


def _compile_family(item: tuple[str, DecodeStepConfig]) -> tuple[int, float]:
    """A worker's unit: family ``item[0]``'s first calls at config ``item[1]``'s shapes, compiling
    its kernels into the on-disk cache; returns the kernels compiled and the seconds it took."""
    family, config = item
    with CompileWatch() as watch:
        WORKER_FAMILIES[family][1](config)
    return watch.kernels, watch.seconds


class _Workers:
    """Worker processes (``spawn``, :class:`~ascend_emu.workers.ProcessPool`) compiling
    ``families``' kernels into the shared on-disk cache, collected by a background thread, so
    the demo runs meanwhile and :meth:`wait` s for a family before its first call."""

    def __init__(self, config: DecodeStepConfig, families: tuple[str, ...], jobs: int):
        from .workers import ProcessPool

        self.families = families
        self.processes = min(jobs, len(families))
        self.results: dict[str, object] = {}
        self._done = {family: threading.Event() for family in families}
        self._claimed: set[str] = set()
        items = [(family, config) for family in families]
        self._thread = threading.Thread(target=self._collect, args=(ProcessPool(self.processes), items),
                                        daemon=True)
        self._thread.start()

    def _collect(self, pool, items) -> None:
        from .workers import TaskFailure

        try:
            for i, result in pool.run(_compile_family, items, None):
                self.results[self.families[i]] = result
                self._done[self.families[i]].set()
        except Exception as exc:  # noqa: BLE001  (the demo's own first calls compile what is missing)
            for family in self.families:
                self.results.setdefault(family, TaskFailure("error", f"{type(exc).__name__}: {exc}"))
        finally:
            for event in self._done.values():
                event.set()

    def pending(self, family: str | None) -> bool:
        """Whether ``family`` is one of the workers' and still compiling."""
        return family in self._done and not self._done[family].is_set()

    def wait(self, family: str | None):
        """Wait for ``family``'s worker; its result (``(kernels, seconds)`` or a
        :class:`~ascend_emu.workers.TaskFailure`) the first time, else None."""
        if family not in self._done or family in self._claimed:
            return None
        self._done[family].wait()
        self._claimed.add(family)
        return self.results[family]


def run_decode_step(config: DecodeStepConfig = DecodeStepConfig(), *,
                    on_step: Callable[[str], None] | None = None, jobs: int = 1) -> DecodeStepReport:
    """Run the demo's prefill and decode step on both paths (module doc) and measure them.

    Each op step's first call (which compiles or loads its Numba kernels) is timed apart from the
    step (:class:`FirstCall`); the kernels compiled are counted with a
    :class:`~ascend_emu.progress.CompileWatch` (wrap the call in a
    :class:`~ascend_emu.progress.Progress` to show them as they compile).

    With ``jobs`` > 1 and a cold kernel cache (:func:`cold_families`), the kernels of the ops the
    demo reaches last (:data:`WORKER_FAMILIES`, the longest to compile first) are compiled
    meanwhile in up to ``jobs`` worker processes sharing the on-disk cache, each family's first
    calls made there on stand-in inputs of the config's shapes; this process compiles the prolog's
    and, before the first call of such an op, waits for its worker, then loads its kernels from
    the cache. Results do not depend on ``jobs``: the same kernels run on the same inputs.

    Args:
        config: the shapes.
        on_step: called with each step's name before it runs, with ``"<step>: first call"``
            before a first call (then with ``"<step>: first call: waiting for ..."`` while its
            family's worker still compiles), and once with what the workers compile when they
            start (progress display).
        jobs: worker processes that may compile (1: everything in this process, as on a warm cache).

    Returns:
        The :class:`DecodeStepReport`.

    Raises:
        ValueError: ``jobs`` is not an int >= 1.
        Nothing else for a valid config: :class:`DecodeStepConfig` rejects the shapes the ops would.
        (A worker that fails leaves its family to this process, named in ``worker_failures``.)
    """
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise ValueError(f"jobs: expected an int >= 1, got {jobs!r}")
    families = cold_families() if jobs > 1 else ()
    workers = _Workers(config, families, jobs) if families else None
    if workers is not None and on_step is not None:
        on_step(f"compiling the kernels of {family_names(families)} in {workers.processes} worker "
                f"process{'es' if workers.processes > 1 else ''} (first run only)")
    with CompileWatch() as watch:
        rep = _run_decode_step(config, on_step, watch, workers)
    rep.kernels_compiled, rep.compile_seconds = watch.kernels, watch.seconds
    return rep


def _run_decode_step(c: DecodeStepConfig, on_step, watch: CompileWatch, workers: _Workers | None) -> DecodeStepReport:
    from .emu.matmul import matmul_f32, matmul_int8, weight_f32
    from .workers import TaskFailure

    rep = DecodeStepReport(config=c)
    if workers is not None:
        rep.workers, rep.worker_families = workers.processes, workers.families
    rng = np.random.default_rng(c.seed)

    def first_call(name: str, fn: Callable[[], object], family: str | None = None) -> None:
        start = time.perf_counter()
        if on_step is not None:
            on_step(f"{name}: first call")
            if workers is not None and workers.pending(family):
                on_step(f"{name}: first call: waiting for the worker process compiling {family}")
        result = workers.wait(family) if workers is not None else None
        if isinstance(result, TaskFailure):
            rep.worker_failures.append(f"{family}: {result.kind}: {result.message}")
            result = None
        kernels, compiling = watch.kernels, watch.seconds
        fn()
        in_worker = result or (0, 0.0)
        rep.worker_kernels += in_worker[0]
        rep.worker_compile_seconds += in_worker[1]
        rep.first_calls.append(FirstCall(name, time.perf_counter() - start, watch.kernels - kernels,
                                         watch.seconds - compiling, *in_worker))

    def step(name: str, fn: Callable[[], object], repeats: int = 1):
        if on_step is not None:
            on_step(name)
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            out = fn()
            seconds.append(time.perf_counter() - start)
        rep.timings.append((name, statistics.median(seconds)))
        return out

    def op_step(name: str, fn: Callable[[], object], first: Callable[[], object] | None = None,
                repeats: int = DECODE_REPEATS, family: str | None = None):
        first_call(name, first or fn, family)
        return step(name, fn, repeats)

    def randn(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(BF16)

    n, ctx, bs = c.heads, c.context, c.block_size
    total, blocks_used, num_blocks = _blocks(c)
    block_table = rng.permutation(num_blocks)[:blocks_used].astype(np.int32)[None, :]  # [1, blocks_used]
    slots = slots_from_block_table(block_table, [total], bs, num_blocks)[0]  # [context + 1]
    rep.blocks_used, rep.num_blocks, rep.block_table = blocks_used, num_blocks, block_table[0]

    # ---- weights
    w = step("weights: random, cast to FRACTAL_NZ, int8 weight_uq_qr", lambda: _weights(c, rng))
    x = randn(1, total, c.he)  # [1, context + 1, He]: the context, then the decoded token
    sin, cos = _rope_tables(np.arange(total))  # [context + 1, Dr]
    kv_int8 = np.zeros((num_blocks, bs, 1, MLA_ROW.row_bytes), np.int8)  # [BlockNum, BlockSize, 1, 656]
    kv_bf16 = np.zeros((num_blocks, bs, 1, HCKV), BF16)  # [BlockNum, BlockSize, 1, Hckv]
    kr_bf16 = np.zeros((num_blocks, bs, 1, D_ROPE), BF16)  # [BlockNum, BlockSize, 1, Dr]
    k_indexer = np.zeros((num_blocks, bs, 1, c.indexer_dim), BF16)  # [BlockNum, BlockSize, 1, 128]

    def prolog_int8(tok: slice):
        return _prolog_call(True, w, x, sin, cos, kv_int8, None, slots, tok)

    def prolog_bf16(tok: slice):
        return _prolog_call(False, w, x, sin, cos, kv_bf16, kr_bf16, slots, tok)

    def indexer_keys(tok: slice):
        k = (x[0, tok].astype(np.float32) @ w["w_ik"].astype(np.float32)).astype(BF16)  # [T, 128]
        k_indexer.reshape(-1, c.indexer_dim)[slots[tok]] = k  # PA_BSND rows
        mark_written(k_indexer, slots[tok])  # a plain scatter, not an op: declared for checked mode

    prefill, decode = slice(0, ctx), slice(ctx, total)
    op_step(f"prefill {ctx} tokens: npu_mla_prolog_v3, int8 per-tile cache", lambda: prolog_int8(prefill),
            lambda: _first_tokens(prolog_int8, ctx), repeats=1, family="npu_mla_prolog_v3")
    op_step(f"prefill {ctx} tokens: npu_mla_prolog_v3, bf16 cache", lambda: prolog_bf16(prefill),
            lambda: _first_tokens(prolog_bf16, ctx), repeats=1)
    step(f"prefill {ctx} tokens: indexer keys", lambda: indexer_keys(prefill))

    # ---- decode step: the new token at position `context` (each run writes its row again, same bytes)
    query8, query_rope8, *_ = op_step("decode: npu_mla_prolog_v3 (int8 per-tile)", lambda: prolog_int8(decode))
    query16, query_rope16, _, query_norm, _ = op_step("decode: npu_mla_prolog_v3 (bf16)",
                                                      lambda: prolog_bf16(decode))
    indexer_keys(decode)
    xt = x[0, decode].astype(np.float32)  # [1, He]
    q_idx = (query_norm.reshape(1, c.hcq).astype(np.float32) @ w["w_iq"].astype(np.float32)).astype(BF16).reshape(
        1, 1, c.indexer_heads, c.indexer_dim)  # [B, S1, 64, 128]: from query_norm, as DeepSeek-V3.2's indexer
    w_idx = (xt @ w["w_iw"].astype(np.float32) * c.indexer_heads ** -0.5).astype(BF16).reshape(
        1, 1, c.indexer_heads)  # [B, S1, N1]
    seq_q, seq_kv = np.array([1], np.int32), np.array([total], np.int32)
    sparse_indices, _ = op_step("decode: npu_lightning_indexer", lambda: _indexer_call(
        c, q_idx, k_indexer, w_idx, block_table, seq_q, seq_kv), family="npu_lightning_indexer")  # [1, 1, 1, sparse_count] int32
    rep.selected = int((sparse_indices >= 0).sum())
    q576 = np.concatenate([query8, query_rope8], axis=-1)  # [1, 1, N, 576]
    out8 = op_step("decode: npu_kv_quant_sparse_flash_attention", lambda: _kv_quant_attention_call(
        q576, kv_int8, sparse_indices, block_table, seq_q, seq_kv), family="sparse attention")  # [1, 1, N, 512]
    out16, *_ = op_step("decode: npu_sparse_flash_attention (bf16)", lambda: _attention_call(
        query16, query_rope16, kv_bf16, kr_bf16, sparse_indices, block_table, seq_q, seq_kv))  # [1, 1, N, 512]

    def decode_int8():
        q, qr, *_ = prolog_int8(decode)
        idx, _ = _indexer_call(c, q_idx, k_indexer, w_idx, block_table, seq_q, seq_kv)
        return _kv_quant_attention_call(np.concatenate([q, qr], axis=-1), kv_int8, idx, block_table, seq_q, seq_kv)

    f32 = {name: weight_f32(w[name]) for name in ("weight_dq", "weight_dkv_kr")}  # the ops' kept widening
    w_uq_qr8 = np.asarray(w["weight_uq_qr_int8"])  # [Hcq, N*192] int8, ND view of the NZ bytes
    cq8 = np.ones((1, c.hcq), np.int8)  # stand-in for the quantized query latent
    w_uk32 = w["weight_uk"].astype(np.float32)  # [N, D, Hckv]
    q_idx32 = q_idx.reshape(c.indexer_heads, c.indexer_dim).astype(np.float32)  # [64, 128]
    k_idx32 = k_indexer.reshape(-1, c.indexer_dim)[slots].astype(np.float32)  # [context + 1, 128]
    q576_32 = q576.reshape(n, -1).astype(np.float32)  # [N, 576]
    rows_flat = kv_int8.reshape(-1, MLA_ROW.row_bytes)  # [BlockNum * BlockSize, 656]
    picked = slots[sparse_indices.reshape(-1)[sparse_indices.reshape(-1) >= 0]]  # [K] slots

    def floor_int8():
        # fp32 products through matmul_f32: the ops' BLAS thread rule (a small product on one thread)
        matmul_f32(xt, f32["weight_dq"])  # [1, Hcq]
        qcqr = matmul_int8(cq8, w_uq_qr8).reshape(n, D_NOPE + D_ROPE)  # [N, 192] int32: the op's int8 engine
        matmul_f32(qcqr[:, None, :D_NOPE], w_uk32)  # [N, 1, Hckv]
        matmul_f32(xt, f32["weight_dkv_kr"])  # [1, Hckv + Dr]
        score = np.maximum(matmul_f32(q_idx32, k_idx32.T), 0).sum(0)  # [context + 1]
        kept = min(c.sparse_count, score.size)
        np.sort(np.partition(-score, kept - 1)[:kept])  # the top-k, sorted (the op returns them so)
        k = rows_flat[picked].astype(np.float32)  # [K, 656]: the gather
        p = matmul_f32(q576_32, k[:, :HCKV + D_ROPE].T)  # [N, K]
        return matmul_f32(p, k[:, :HCKV])  # [N, Hckv]

    rep.decode_int8, rep.floor_int8 = decode_int8, floor_int8
    x16 = np.ascontiguousarray(x[0, decode])  # [1, He] bf16
    k16 = rows_flat[picked, :HCKV + D_ROPE].astype(np.float32).astype(BF16)  # [K, 576] stand-in keys
    rep.floor_operands = {
        "x@Wdq": (x16, np.asarray(w["weight_dq"])),
        "cq@Wuq_qr": (np.ones((1, c.hcq), np.int8), np.asarray(w["weight_uq_qr_int8"])),
        "q@Wuk": (np.ascontiguousarray(query16[0, 0, :, None, :D_NOPE]), w["weight_uk"]),  # stand-in q_nope
        "x@Wdkv_kr": (x16, np.asarray(w["weight_dkv_kr"])),
        "indexer q.k": (q_idx.reshape(c.indexer_heads, c.indexer_dim), k_indexer.reshape(-1, c.indexer_dim)[slots].T),
        "q@K": (q576.reshape(n, -1).astype(BF16), k16.T),
        "P@V": (np.ones((n, picked.size), BF16), np.ascontiguousarray(k16[:, :HCKV])),
    }
    rep.floor_gather_bytes = int(picked.size) * MLA_ROW.row_bytes

    # ---- what it shows
    rep.cache_bytes = {"int8 kv_cache (656-byte rows)": kv_int8.nbytes,
                       "bf16 kv_cache + kr_cache": kv_bf16.nbytes + kr_bf16.nbytes}
    rep.input_bytes = {"weights": sum(np.asarray(a).nbytes for a in w.values()),
                       "caches": sum(a.nbytes for a in (kv_int8, kv_bf16, kr_bf16, k_indexer)),
                       "tokens": x.nbytes + sin.nbytes + cos.nbytes}
    rep.kv_int8 = kv_int8
    rep.row_slot = int(slots[ctx])
    rep.row = kv_int8.reshape(-1, MLA_ROW.row_bytes)[rep.row_slot].view(np.uint8).copy()  # [656]
    k_nope, k_rope, scales = read_combined_cache(kv_int8, slot=rep.row_slot)
    rep.row_k_nope, rep.row_k_rope, rep.row_scales = k_nope[0], k_rope[0], scales[0]
    rep.out_int8 = np.asarray(out8).reshape(n, HCKV)
    rep.out_bf16 = np.asarray(out16).reshape(n, HCKV)
    a = rep.out_int8.astype(np.float64)
    b = rep.out_bf16.astype(np.float64)
    rep.max_abs = float(np.abs(a - b).max())
    rep.cosine = float((a * b).sum() / (np.linalg.norm(a) * np.linalg.norm(b)))
    return rep
