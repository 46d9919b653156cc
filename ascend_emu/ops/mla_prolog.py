"""``npu_mla_prolog``, ``npu_mla_prolog_v2`` and ``npu_mla_prolog_v3``: the MLA prolog contract.

Sources: the v1 and v3 op pages (docs/sources.md#npu_mla_prolog); docs/sources.md#rope, docs/sources.md#rms_norm,
docs/sources.md#paged_nz, docs/sources.md#npu_mla_prolog_v3, docs/sources.md#per_tile_rows, docs/sources.md#cache_index, docs/sources.md#assert_rtol_equal; torch_npu's meta functions ``npu_mla_prolog_forward`` /
``npu_mla_prolog_v2_forward`` / ``npu_mla_prolog_v3_forward`` (signatures, keyword-only
boundaries, output shapes and dtypes); the ops-transformer MlaProlog host checks (legal mode
combinations, He / Hcq / N / BlockSize ranges, per-scenario dtypes).

One contract serves all three entry points: v1 and v2 map their arguments onto v3's (v1/v2 have
no ``qc_qr_scale`` / ``kc_scale`` / ``query_norm_flag``, and select their quant scenario from
dtypes and the scales given rather than from explicit modes), :func:`_normalise` validates
everything and builds one :class:`MlaPrologArgs`, the backend computes, and each entry point
packs its own outputs.

Every legal quant scenario of the v3 seed's table is emulated (:data:`QUANT_SCENARIOS`); the
numerics of each are stated step by step in :func:`ascend_emu.emu.mla_prolog.mla_prolog`.

The scenario and limits tables, and the checks that read only them, are
:mod:`ascend_emu.ops.mla_prolog_scenarios` (the Ascend 950's modes and wider shapes included).

Contract highlights (be stricter than the hardware):

- ``weight_dq``, ``weight_uq_qr``, ``weight_dkv_kr`` must be FRACTAL_NZ (``npu_format_cast(w, 29)``);
  ``weight_uk`` must be ND.
- ``token_x`` is ``[T, He]`` or ``[B, S, He]``; ``rope_sin`` / ``rope_cos`` have the same rank and
  leading dims with last dim Dr = 64. Non-contiguous inputs are accepted (copied).
- Caches are C-contiguous, writable, separate (kv_cache and kr_cache may not share memory, nor
  may any argument the call reads share memory with either: ``_check.check_disjoint``),
  updated in place and returned as the same objects.
- ``cache_index`` values outside the cache raise :class:`IndexRangeError` (the hardware does not
  check them and corrupts memory); ``-1`` skips the token (PA_BSND / PA_NZ) or the block
  (PA_BLK_*): the kernel's scatter returns early on a negative index; two tokens writing one slot
  warn (:class:`DuplicateSlotWarning`) and the last one wins.
- B / S / T = 0: query and query_rope are empty and the caches are not touched (paged modes;
  BSND / TND caches may not be empty, seed v3). BlockNum = 0 (Skv = 0): queries are computed,
  nothing is written, and ``cache_index`` values are not range-checked (no index reaches memory).

Choices where the sources are silent or disagree: v1 / v2 infer their v3 modes as
:func:`infer_legacy_modes` says; an inferred illegal combination (e.g. int8 caches with bf16
weights) is a ModeError. ``-1`` in a PA_BLK ``cache_index`` skips that block's tokens. The legal
mode combinations are the rows of the v3 seed's scenario table read through its dtype columns
(see :data:`QUANT_SCENARIOS`); the scale shapes each scenario accepts are
:func:`expected_scale_shapes`. ``k_nope_clip_alpha`` must be finite and > 0 (a zero or negative
clip limit gives a zero or negative dequant scale) and keep the largest clip limit finite in fp32
(:func:`check_alpha`: 3e38 would give +inf tile scales and zero k_nope).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np

from ..errors import DTypeError, FormatError, ModeError, ShapeError, arg_error, describe
from ..layouts import (FRACTAL_NZ, CacheLayout, cache_mode_traits, canonical_cache_mode, get_npu_format,
                       slots_from_cache_index, slots_from_pages)
from .. import checked_mode
from ..mla import D_NOPE, D_ROPE, HCKV, NKV  # noqa: F401  (D_NOPE, D_ROPE, HCKV: re-exported for the backends)
from ..soc import soc_name
from ._backend import get_backend
from ._check import (ValidatedSignatures, check_cache, check_disjoint, check_dtype, check_float, check_ndim,
                     check_nz_weight, check_shape, dtype_name, optional, required, transposed_hint,
                     trusted, warn_duplicates, write_targets)
from .mla_prolog_scenarios import (  # noqa: F401  (the tables are re-exported: the entry points' docs name them)
    E8M0_DTYPE, HEAD_NUMS, MODE_NAMES, OP_NAMES, QUANT_SCENARIOS, QUANT_SCENARIOS_950, SCALE_ARGS, TILE_SIZES,
    V3_ASCEND950_LIMITS, VERSION_LIMITS, QuantScenario, VersionLimits, check_alpha, check_dtype_tags,
    check_scale_shapes, check_scales, expected_scale_shapes, infer_legacy_modes, select_scenario, version_limits)

CacheModeV3 = Literal["PA_BSND", "PA_NZ", "PA_BLK_BSND", "PA_BLK_NZ", "BSND", "TND"]

#: Shape of an output the scenario does not produce: v3 (torch_npu meta, CANN >= 8.5.0) gives an
#: empty ``[0]`` tensor; the v2 meta always declares ``dequant_scale_q_nope`` as ``[1]`` outside
#: the kv-quant scenario (its value is not defined there; the emulator writes 0).
UNUSED_OUTPUT_SHAPE = {2: (1,), 3: (0,)}


# ---------------------------------------------------------------------- normalised arguments
@dataclass(frozen=True, kw_only=True)
class MlaPrologArgs:
    """Validated, normalised arguments of every MLA prolog entry point (v3's argument set).

    Attributes:
        version: entry point (1, 2, 3); only output packing depends on it.
        scenario: the quant scenario selected by the modes.
        token_x: ``[T, He]`` (a 2-D view of the input; bf16, int8 in full quant).
        weight_dq: FRACTAL_NZ ``[He, Hcq]``.
        weight_uq_qr: FRACTAL_NZ ``[Hcq, N*(D+Dr)]``, per head ``[D nope | Dr rope]`` columns.
        weight_uk: ND ``[N, D, Hckv]``.
        weight_dkv_kr: FRACTAL_NZ ``[He, Hckv+Dr]``.
        rmsnorm_gamma_cq: ``[Hcq]``.
        rmsnorm_gamma_ckv: ``[Hckv]``.
        rope_sin, rope_cos: ``[T, Dr]``.
        kv_cache, kr_cache: the caller's caches, written in place.
        kv_layout, kr_layout: their :class:`CacheLayout` (``kr_layout`` None when kr_cache is the
            empty tensor of the combined per-tile rows).
        slots: int64 ``[T]`` validated cache rows (-1 = skip), or None when nothing is written
            (T = 0 or an empty cache).
        cache_index, actual_seq_len: the caller's index tensors (kept for other backends).
        batch_shape: ``(B, S)`` for 3-D ``token_x``, ``(T,)`` for 2-D.
        num_heads: N.
        cache_mode: canonical cache mode.
        rmsnorm_epsilon_cq, rmsnorm_epsilon_ckv: RmsNorm epsilons.
        qc_qr_scale, kc_scale: v3 scale factors (1.0 for v1 / v2).
        query_norm_flag: return query_norm.
        weight_quant_mode, kv_cache_quant_mode, query_quant_mode, ckvkr_repo_mode,
            quant_scale_repo_mode, tile_size: v3 modes (inferred for v1 / v2).
        dequant_scale_x ... k_nope_clip_alpha: the optional scale tensors (fp32; the four
            dequant scales E8M0 in weight_quant_mode 3), shapes as :func:`expected_scale_shapes`
            accepts them (None when absent).
    """

    version: int
    scenario: QuantScenario
    token_x: np.ndarray
    weight_dq: np.ndarray
    weight_uq_qr: np.ndarray
    weight_uk: np.ndarray
    weight_dkv_kr: np.ndarray
    rmsnorm_gamma_cq: np.ndarray
    rmsnorm_gamma_ckv: np.ndarray
    rope_sin: np.ndarray
    rope_cos: np.ndarray
    kv_cache: np.ndarray
    kr_cache: np.ndarray
    kv_layout: CacheLayout
    kr_layout: CacheLayout | None
    slots: np.ndarray | None
    cache_index: np.ndarray | None
    actual_seq_len: np.ndarray | None
    batch_shape: tuple[int, ...]
    num_heads: int
    cache_mode: str
    rmsnorm_epsilon_cq: float
    rmsnorm_epsilon_ckv: float
    qc_qr_scale: float
    kc_scale: float
    query_norm_flag: bool
    weight_quant_mode: int
    kv_cache_quant_mode: int
    query_quant_mode: int
    ckvkr_repo_mode: int
    quant_scale_repo_mode: int
    tile_size: int
    dequant_scale_x: np.ndarray | None = None
    dequant_scale_w_dq: np.ndarray | None = None
    dequant_scale_w_uq_qr: np.ndarray | None = None
    dequant_scale_w_dkv_kr: np.ndarray | None = None
    quant_scale_ckv: np.ndarray | None = None
    quant_scale_ckr: np.ndarray | None = None
    smooth_scales_cq: np.ndarray | None = None
    k_nope_clip_alpha: np.ndarray | None = None

    @property
    def num_tokens(self) -> int:
        """T = B * S."""
        return int(self.token_x.shape[0])

    @property
    def d_nope(self) -> int:
        """D = weight_uk.shape[1] (128; 128 or 192 on an Ascend 950)."""
        return int(self.weight_uk.shape[1])


class MlaPrologOutputs(NamedTuple):
    """What a backend returns (:mod:`ascend_emu.ops._backend`): v3's outputs in torch_npu's order,
    per token (T = B * S); None for an output the scenario does not produce. The caches are
    written in place (``args.kv_cache`` / ``args.kr_cache``); each entry point reshapes and packs.

    Attributes:
        query: ``[T, N, 512]``, bf16 (with query_quant_mode 1: int8, or the 950 mode's element
            type: float8_e4m3fn, hifloat8 as uint8).
        query_rope: bf16 ``[T, N, 64]``.
        dequant_scale_q_nope: fp32 ``[T, N, 1]`` with query_quant_mode 1, else None.
        query_norm: ``[T, Hcq]`` of weight_uq_qr's dtype with ``query_norm_flag``, else None.
        dequant_scale_q_norm: with ``query_norm_flag`` and weight_quant_mode > 0: fp32 ``[T, 1]``,
            or E8M0 ``[T, Hcq/32]`` in weight_quant_mode 3; else None.
    """

    query: np.ndarray
    query_rope: np.ndarray
    dequant_scale_q_nope: np.ndarray | None
    query_norm: np.ndarray | None
    dequant_scale_q_norm: np.ndarray | None


# ---------------------------------------------------------------------- entry points
def npu_mla_prolog(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
                   rmsnorm_gamma_ckv, rope_sin, rope_cos, cache_index, kv_cache, kr_cache, *,
                   dequant_scale_x=None, dequant_scale_w_dq=None, dequant_scale_w_uq_qr=None,
                   dequant_scale_w_dkv_kr=None, quant_scale_ckv=None, quant_scale_ckr=None,
                   smooth_scales_cq=None, rmsnorm_epsilon_cq: float = 1e-05, rmsnorm_epsilon_ckv: float = 1e-05,
                   cache_mode: str = "PA_BSND"):
    """MLA prolog v1 (seed ``npu_mla_prolog.md``): queries out, kv / kr caches updated in place.

    Numerics: :func:`ascend_emu.emu.mla_prolog.mla_prolog` (docs/sources.md#npu_mla_prolog_v3 steps 1-8 and its
    quantized variants) with ``qc_qr_scale = kc_scale = 1``. The scenario follows from dtypes and
    the scales given (seed, weight_uq_qr): bf16 weight_uq_qr = non-quant; int8 weight_uq_qr =
    partial quant (v3 weight_quant_mode=1), with bf16 caches (kv non-quant) or int8 kv_cache and
    kr_cache (per-channel kv quant, v3 kv_cache_quant_mode=2). v1 has no full quant.

    Args:
        token_x: bf16 ``[T, He]`` or ``[B, S, He]``; He = 7168.
        weight_dq: bf16 FRACTAL_NZ ``[He, Hcq]``; Hcq = 1536.
        weight_uq_qr: bf16 or int8 FRACTAL_NZ ``[Hcq, N*(D+Dr)]``; N in 1, 2, 4, ..., 128;
            D = 128, Dr = 64.
        weight_uk: bf16 ND ``[N, D, Hckv]``; Hckv = 512.
        weight_dkv_kr: bf16 FRACTAL_NZ ``[He, Hckv+Dr]``.
        rmsnorm_gamma_cq: bf16 ``[Hcq]``.
        rmsnorm_gamma_ckv: bf16 ``[Hckv]``.
        rope_sin, rope_cos: bf16 ``[T, Dr]`` / ``[B, S, Dr]`` (same rank as token_x).
        cache_index: int64 ``[T]`` / ``[B, S]`` global cache rows in ``[0, BlockNum*BlockSize)``,
            -1 = skip.
        kv_cache: bf16 or int8 ``[BlockNum, BlockSize, 1, Hckv]``, updated in place; BlockSize 16
            or 128.
        kr_cache: bf16 or int8 (with an int8 kv_cache) ``[BlockNum, BlockSize, 1, Dr]``, updated
            in place.
        dequant_scale_x, dequant_scale_w_dq, dequant_scale_w_dkv_kr: reserved; must be None.
        dequant_scale_w_uq_qr: fp32 ``[1, N*(D+Dr)]`` per-channel dequant scale of the int8
            weight_uq_qr; required exactly in partial quant.
        quant_scale_ckv: fp32 ``[1, Hckv]`` static per-channel kv quant multiplier; required
            exactly with int8 caches.
        quant_scale_ckr: fp32 ``[1, Dr]`` static per-channel kr quant multiplier; likewise.
        smooth_scales_cq: fp32 ``[1, Hcq]``, optional in partial quant: multiplies the cq RmsNorm
            output before its dynamic quant.
        rmsnorm_epsilon_cq, rmsnorm_epsilon_ckv: RmsNorm epsilons (default 1e-5).
        cache_mode: ``"PA_BSND"`` (default) or ``"PA_NZ"``.

    Returns:
        ``(query, query_rope, kv_cache, kr_cache)``: bf16 ``[T, N, Hckv]`` / ``[B, S, N, Hckv]``,
        bf16 ``[T, N, Dr]`` / ``[B, S, N, Dr]``, and the cache objects passed in.

    Raises:
        ShapeError, DTypeError, FormatError, ModeError, IndexRangeError: the contract (module
            doc); caches are untouched. A scale given outside its scenario, or an inferred
            combination v1 does not have (e.g. int8 caches with a bf16 weight_uq_qr), is a
            ModeError naming what selected it.
    """
    args = _normalise(1, locals())
    query, query_rope, _ = _run(args)
    return query, query_rope, args.kv_cache, args.kr_cache


def npu_mla_prolog_v2(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
                      rmsnorm_gamma_ckv, rope_sin, rope_cos, cache_index, kv_cache, kr_cache, *,
                      dequant_scale_x=None, dequant_scale_w_dq=None, dequant_scale_w_uq_qr=None,
                      dequant_scale_w_dkv_kr=None, quant_scale_ckv=None, quant_scale_ckr=None,
                      smooth_scales_cq=None, rmsnorm_epsilon_cq: float = 1e-05, rmsnorm_epsilon_ckv: float = 1e-05,
                      cache_mode: str = "PA_BSND"):
    """MLA prolog v2 (its torch_npu doc): v1's arguments and results plus ``dequant_scale_q_nope``.

    Same contract and numerics as :func:`npu_mla_prolog`, plus full quant (v3
    weight_quant_mode=2), selected by int8 token_x or its dequant scales: int8 token_x /
    weight_dq / weight_uq_qr / weight_dkv_kr with fp32 ``dequant_scale_x`` ``[T, 1]``,
    ``dequant_scale_w_dq`` ``[1, Hcq]``, ``dequant_scale_w_uq_qr`` ``[1, N*(D+Dr)]`` and
    ``dequant_scale_w_dkv_kr`` ``[1, Hckv+Dr]``; bf16 caches (kv non-quant), or an int8
    kv_cache with a bf16 kr_cache and ``quant_scale_ckv`` (per-tensor: ``[1, Hckv]`` as the v2
    doc gives it, of which element 0 is used, or ``[1]``), which also quantizes the query per
    token and head (v3 kv_cache_quant_mode=1, query_quant_mode=1).

    Returns:
        ``(query, query_rope, kv_cache, kr_cache, dequant_scale_q_nope)``; with kv quant under full
        quant ``query`` is int8 and ``dequant_scale_q_nope`` fp32 ``[T, N, 1]`` (``[B*S, N, 1]``),
        otherwise ``dequant_scale_q_nope`` is fp32 ``[1]`` (torch_npu meta), holding 0.

    Raises:
        As :func:`npu_mla_prolog`.
    """
    args = _normalise(2, locals())
    query, query_rope, rest = _run(args)
    return query, query_rope, args.kv_cache, args.kr_cache, rest[0]


def npu_mla_prolog_v3(token_x, weight_dq, weight_uq_qr, weight_uk, weight_dkv_kr, rmsnorm_gamma_cq,
                      rmsnorm_gamma_ckv, rope_sin, rope_cos, kv_cache, kr_cache, *, cache_index=None,
                      dequant_scale_x=None, dequant_scale_w_dq=None, dequant_scale_w_uq_qr=None,
                      dequant_scale_w_dkv_kr=None, quant_scale_ckv=None, quant_scale_ckr=None,
                      smooth_scales_cq=None, actual_seq_len=None, k_nope_clip_alpha=None,
                      rmsnorm_epsilon_cq: float = 1e-05, rmsnorm_epsilon_ckv: float = 1e-05,
                      cache_mode: CacheModeV3 = "PA_BSND", query_norm_flag: bool = False,
                      weight_quant_mode: int = 0, kv_cache_quant_mode: int = 0, query_quant_mode: int = 0,
                      ckvkr_repo_mode: int = 0, quant_scale_repo_mode: int = 0, tile_size: int = 128,
                      qc_qr_scale: float = 1.0, kc_scale: float = 1.0, token_x_dtype=None, weight_dq_dtype=None,
                      weight_uq_qr_dtype=None, weight_dkv_kr_dtype=None, kv_cache_dtype=None):
    """MLA prolog v3 (seed ``npu_mla_prolog_v3.md``): queries and query_norm out, caches in place.

    Numerics: :func:`ascend_emu.emu.mla_prolog.mla_prolog` (docs/sources.md#npu_mla_prolog_v3 steps 1-8 and its
    quantized variants, docs/sources.md#per_tile_rows per-tile rows, with ``qc_qr_scale`` after the cq RmsNorm and
    ``kc_scale`` after the ckv RmsNorm).

    The scenario is chosen by ``(weight_quant_mode, kv_cache_quant_mode, query_quant_mode)``, one
    of :data:`QUANT_SCENARIOS` (the seed's scenario table), which fixes every tensor's dtype, the
    scales that must / may be given (shapes: :func:`expected_scale_shapes`) and, for per-tile,
    the repo modes and cache modes:

    - (0, 0, 0) non-quant; (1, 0, 0) partial quant (int8 weight_uq_qr); (1, 2, 0) partial quant
      with int8 per-channel kv_cache and kr_cache; (2, 0, 0) full quant (int8 token_x and
      weights); (2, 1, 1) full quant with an int8 per-tensor kv_cache and int8 query.
    - Per-tile (1, 3, 0), (2, 3, 0): ``ckvkr_repo_mode = quant_scale_repo_mode = 1``,
      kv_cache int8 with Dtile = 656 combined rows ``[512 int8 | 64 bf16 k_rope | 4 fp32 dequant
      scales]`` (read them back with :func:`ascend_emu.quant.read_combined_cache`), kr_cache an
      empty tensor, cache_mode PA_BSND, BSND or TND, ``k_nope_clip_alpha`` required.

    Args:
        token_x: bf16 (int8 in full quant; Ascend 950: float8_e4m3fn in weight_quant_mode 3 / 4,
            hifloat8 codes as uint8 in 5) ``[T, He]`` or ``[B, S, He]``; He in {7168, 7680} (Ascend
            950: 1024, 2048, ..., 6144, 7168, 7680, 8192; Hcq 1536 or 2048; D 128 or 192).
        weight_dq, weight_dkv_kr: FRACTAL_NZ, bf16 (int8 in full quant), as :func:`npu_mla_prolog`.
        weight_uq_qr: FRACTAL_NZ, bf16 (int8 in partial and full quant).
        weight_uk, rmsnorm_gamma_cq, rmsnorm_gamma_ckv, rope_sin, rope_cos: bf16, as
            :func:`npu_mla_prolog`.
        kv_cache: updated in place: ``[BlockNum, BlockSize, 1, Dtile]`` (PA_* modes; BlockSize a
            multiple of 16 in [16, 1024]), ``[B, S, 1, Dtile]`` (BSND) or ``[T, 1, Dtile]``
            (TND); bf16 with Dtile 512, int8 with Dtile 512 (kv quant) or 656 (per-tile).
        kr_cache: same leading dims with last dim 64; bf16 (int8 with per-channel kv quant);
            empty (any shape with no element, bf16) in the per-tile scenarios.
        cache_index: int64. PA_BSND / PA_NZ: ``[T]`` / ``[B, S]`` global rows in
            ``[0, BlockNum*BlockSize)``; PA_BLK_BSND / PA_BLK_NZ: BLOCK IDS in ``[0, BlockNum)``,
            ``[B, ceil(S/BlockSize)]`` (3-D token_x) or ``[sum_b ceil(S_b/BlockSize)]`` (2-D,
            with ``actual_seq_len``); a batch's tokens fill its blocks from row 0. -1 skips
            the token (PA) or block (PA_BLK). Must be None for BSND / TND (token t is written
            at its own position).
        actual_seq_len: int32 ``[B]`` prefix sums of the per-batch lengths; required exactly for
            2-D token_x with PA_BLK_*; last value = T.
        dequant_scale_x: fp32 ``[T, 1]`` (``[B*S, 1]``) or ``[T]``, per-token dequant scale of
            the int8 token_x (full quant).
        dequant_scale_w_dq, dequant_scale_w_uq_qr, dequant_scale_w_dkv_kr: fp32 ``[1, Hcq]``,
            ``[1, N*(D+Dr)]``, ``[1, Hckv+Dr]`` per-channel weight dequant scales.
        quant_scale_ckv: fp32 static kv quant multiplier: ``[1, Hckv]`` per-channel (1, 2, 0),
            ``[1]`` per-tensor (2, 1, 1).
        quant_scale_ckr: fp32 ``[1, Dr]`` static kr quant multiplier (1, 2, 0).
        smooth_scales_cq: fp32 ``[1, Hcq]`` or ``[1]``, optional whenever weight_uq_qr is int8.
        k_nope_clip_alpha: fp32 ``[1]``, finite and > 0, per-tile clip factor (1.0: no clip);
            ``alpha * sqrt(512) * max|rmsnorm_gamma_ckv| * |kc_scale|`` finite in fp32.
        rmsnorm_epsilon_cq, rmsnorm_epsilon_ckv: RmsNorm epsilons (default 1e-5).
        cache_mode: PA_BSND (default), PA_NZ, PA_BLK_BSND, PA_BLK_NZ, BSND (3-D token_x) or TND
            (2-D token_x).
        query_norm_flag: also return query_norm (default False).
        weight_quant_mode, kv_cache_quant_mode, query_quant_mode: one of the combinations in
            :data:`QUANT_SCENARIOS` (above).
        ckvkr_repo_mode, quant_scale_repo_mode: 1 exactly in the per-tile scenarios, else 0.
        tile_size: per-tile quant tile, 128.
        qc_qr_scale: multiplier after the cq RmsNorm (default 1.0).
        kc_scale: multiplier after the ckv RmsNorm (default 1.0).
        token_x_dtype, weight_dq_dtype, weight_uq_qr_dtype, weight_dkv_kr_dtype, kv_cache_dtype:
            torch_npu dtype codes: 290 (``torch_npu.hifloat8``) for the uint8 inputs of Ascend
            950's weight_quant_mode 5 (kv_cache_dtype with its per-tensor kv quant), else None
            (:func:`check_dtype_tags`).

    Ascend 950 modes (:data:`QUANT_SCENARIOS_950`; numerics in
    :func:`ascend_emu.emu.mla_prolog.mla_prolog`): (3, 0, 0) / (3, 1, 1) MXFP8: float8_e4m3fn
    token_x and NZ weights (``npu_format_cast(w, 29, customize_dtype=292)``), E8M0
    (``ml_dtypes.float8_e8m0fnu``) ``dequant_scale_x`` ``[T, He/32]``, ``dequant_scale_w_dq``
    ``[Hcq, He/32]``, ``dequant_scale_w_uq_qr`` ``[N*(D+Dr), Hcq/32]``,
    ``dequant_scale_w_dkv_kr`` ``[Hckv+Dr, He/32]``, no smooth_scales_cq; query_norm
    float8_e4m3fn with E8M0 ``dequant_scale_q_norm`` ``[T, Hcq/32]``. (4, 0, 0) / (4, 1, 1) FP8
    and (5, 0, 0) / (5, 1, 1) HiF8: the int8 full quant's fp32 scales; query_norm of the element
    type with fp32 ``[T, 1]``. With kv_cache_quant_mode 1 kv_cache and query are of the element
    type (query per token and head, fp32 ``dequant_scale_q_nope``); kr_cache stays bf16. With
    kv_cache_quant_mode 3 (``ckvkr_repo_mode = quant_scale_repo_mode = 1``; PA_BSND, BSND, TND)
    kv_cache holds 656-byte rows ``[512 element codes | 64 bf16 k_rope | 4 fp32 scales]`` of the
    element type, kr_cache is empty, the query bf16; ``k_nope_clip_alpha`` is required in modes
    4 / 5 and optional in 3 (checked, not applied: the kernel's 8-bit tile quant has no clip).

    Returns:
        ``(query, query_rope, dequant_scale_q_nope, query_norm, dequant_scale_q_norm)``, shapes
        and dtypes as torch_npu's meta function gives them (CANN >= 8.5; an output the scenario
        does not produce is an empty ``[0]`` tensor):

        - query: ``[T, N, 512]`` / ``[B, S, N, 512]``, with query_quant_mode=1 int8 (Ascend
          950: float8_e4m3fn, or hifloat8 as uint8), else bf16.
        - query_rope: bf16 ``[T, N, 64]`` / ``[B, S, N, 64]``.
        - dequant_scale_q_nope: fp32 ``[T, N, 1]`` (``[B*S, N, 1]``) with query_quant_mode=1.
        - query_norm: ``[T, Hcq]`` / ``[B, S, Hcq]`` when ``query_norm_flag``, of weight_uq_qr's
          dtype (int8: the dynamically quantized cq that feeds the weight_uq_qr matmul);
          otherwise ``[0]`` of that dtype.
        - dequant_scale_q_norm: fp32 ``[T, 1]`` (``[B*S, 1]``) when ``query_norm_flag`` and
          weight_quant_mode is 1, 2, 4 or 5; E8M0 ``[T, Hcq/32]`` in 3 (an empty ``[0]`` E8M0
          tensor without ``query_norm_flag``).

    Raises:
        ShapeError, DTypeError, FormatError, ModeError, IndexRangeError: the contract (module
            doc); caches are untouched. An illegal mode combination is a ModeError naming the
            modes and listing the legal ones; an Ascend 950 mode or dtype tag on another SoC is a
            ModeError naming the SoC and the mode.
    """
    values = dict(locals())
    modes = {name: values.pop(name) for name in _V3_MODE_ARGS}
    args = _normalise(3, values, modes, soc=soc_name())  # the SoC sets the limits
    query, query_rope, rest = _run(args)
    return (query, query_rope) + rest


#: The v3 arguments that select the scenario (:func:`select_scenario`), apart from the values.
_V3_MODE_ARGS = MODE_NAMES + ("ckvkr_repo_mode", "quant_scale_repo_mode")


# ---------------------------------------------------------------------- the contract
class _Plan(NamedTuple):
    """What the static checks of a call signature fixed (see :func:`_normalise`)."""

    fields: dict  #: the :data:`_STATIC_FIELDS` of :class:`MlaPrologArgs`
    num_tokens: int  #: T
    max_b: int  #: the version's largest B
    paged_blocks: bool  #: PA_BLK_* (slots depend on actual_seq_len's values: the full mapping)
    read: tuple  #: the :data:`_READ_TENSORS` given (not None: part of the signature), for :func:`_check_memory`


#: Signatures whose static checks passed, each with its :class:`_Plan`.
_VALIDATED = ValidatedSignatures()
#: The :class:`MlaPrologArgs` fields that depend only on a call signature.
_STATIC_FIELDS = ("version", "scenario", "kv_layout", "kr_layout", "batch_shape", "num_heads", "cache_mode",
                  "rmsnorm_epsilon_cq", "rmsnorm_epsilon_ckv", "qc_qr_scale", "kc_scale", "query_norm_flag",
                  "weight_quant_mode", "kv_cache_quant_mode", "query_quant_mode", "ckvkr_repo_mode",
                  "quant_scale_repo_mode", "tile_size")


def _normalise(version: int, values: dict, modes: dict | None = None, *, soc: str | None = None) -> MlaPrologArgs:
    """Validate every argument (nothing is written) and build :class:`MlaPrologArgs`.

    ``values``: the entry point's arguments by name (the names are fixed by the entry point, so
    the values and the version, with v3's ``modes`` and ``soc``, make the call's
    :func:`~ascend_emu.ops._check.signature`). ``modes`` None (v1 / v2): mapped onto v3's
    arguments, the modes inferred (:func:`~.mla_prolog_scenarios.infer_legacy_modes`, which reads
    only dtypes and which scales are given) and v3-only arguments at their defaults.

    The checks that read only types, shapes, dtypes, flags, modes and scalars run once per call
    signature (a decode loop repeats one; a known signature skips the inference too);
    ``k_nope_clip_alpha``'s value, the memory rule and the index values are checked on every
    call, in the same order (:func:`_finish_planned`).
    """
    given = (version, *values.values()) if modes is None else (version, soc, *values.values(), *modes.values())
    key, plan, known = _VALIDATED.lookup(given)  # no check: a first call takes the full path below
    if known:
        return _finish_planned(plan, values)
    reason = ""
    if modes is None:
        values = dict(values)
        modes, reason = infer_legacy_modes(values)
        values.update(actual_seq_len=None, k_nope_clip_alpha=None, query_norm_flag=False, tile_size=TILE_SIZES[0],
                      qc_qr_scale=1.0, kc_scale=1.0)
    args = _normalise_full(version, values, modes, reason=reason)
    num_tokens = args.num_tokens
    _VALIDATED.put(key, _Plan(fields={name: getattr(args, name) for name in _STATIC_FIELDS}, num_tokens=num_tokens,
                              max_b=VERSION_LIMITS[version].max_b,
                              paged_blocks=args.kv_layout.page_indexed,
                              read=tuple(name for name in _READ_TENSORS if values.get(name) is not None)))
    return args


def _finish_planned(plan: _Plan, values: dict) -> MlaPrologArgs:
    """The per-call checks of a call whose signature passed the static checks before: the clip
    factor's value, the memory rule (:func:`_check_memory`), the index values (mapped to slots, duplicates warned);
    then the arguments object, built from the plan. ``values``: the entry point's arguments by
    name (v1 / v2 lack the v3-only ones: absent means None)."""
    fields = plan.fields
    scales = {name: values.get(name) for name in SCALE_ARGS}
    check_alpha(scales["k_nope_clip_alpha"], values["rmsnorm_gamma_ckv"], fields["kc_scale"])
    _check_memory(values, plan.read)
    if plan.paged_blocks:
        return _finish(fields, values, scales, plan.max_b)
    # PA_BSND / PA_NZ / BSND / TND: cache_index's dtype and shape (and None where it must be) are
    # part of the signature; only its values are left to check, by the mapping
    cache_index, t = values.get("cache_index"), plan.num_tokens
    slots = _map_slots(fields["cache_mode"], cache_index, None, fields["kv_layout"], t)
    return _args(fields, values, scales, t, slots, cache_index, values.get("actual_seq_len"))


#: Every tensor argument the prolog reads (the caches are written: :func:`_check_memory`).
_READ_TENSORS = ("token_x", "weight_dq", "weight_uq_qr", "weight_uk", "weight_dkv_kr", "rmsnorm_gamma_cq",
                 "rmsnorm_gamma_ckv", "rope_sin", "rope_cos", "cache_index", "actual_seq_len") + SCALE_ARGS


def _check_memory(values: dict, read: tuple[str, ...] | None = None) -> None:
    """The memory rule (:func:`~ascend_emu.ops._check.check_disjoint`): kv_cache and kr_cache
    apart, and no argument the call reads inside either. ``values``: the arguments by name (v1 /
    v2 lack the v3-only ones: absent means None). ``read``: the names of :data:`_READ_TENSORS`
    given (a memoised signature's :attr:`_Plan.read`; None: every one, absent ones skipped).

    Raises:
        ShapeError: naming both arrays.
    """
    check_disjoint((("kv_cache", values["kv_cache"]), ("kr_cache", values["kr_cache"])),
                   [(name, values.get(name)) for name in _READ_TENSORS] if read is None
                   else [(name, values[name]) for name in read])


def _finish(static: dict, t: dict, scales: dict, max_b: int) -> MlaPrologArgs:
    """The per-call part of the contract: cache_index / actual_seq_len checked and mapped to slots
    (duplicates warned), arrays shaped for the backend.

    Args:
        static: the :data:`_STATIC_FIELDS` of the call.
        t: the tensor arguments by name (arrays), cache_index / actual_seq_len as given.
        scales: the scale arguments by name, checked.
        max_b: the version's largest B.
    """
    batch_shape, kv_layout = static["batch_shape"], static["kv_layout"]
    cache_index = optional(t.get("cache_index"), "cache_index")
    actual_seq_len = optional(t.get("actual_seq_len"), "actual_seq_len")
    seq_lens = _check_index_args(static["cache_mode"], cache_index, actual_seq_len, batch_shape, kv_layout,
                                 max_b=max_b)
    num_tokens = math.prod(batch_shape)
    slots = _map_slots(static["cache_mode"], cache_index, seq_lens, kv_layout, num_tokens)
    return _args(static, t, scales, num_tokens, slots, cache_index, actual_seq_len)


def _args(static: dict, t: dict, scales: dict, num_tokens: int, slots: np.ndarray | None, cache_index,
          actual_seq_len) -> MlaPrologArgs:
    """:class:`MlaPrologArgs` from checked parts: the static fields, the tensors by name (shaped
    for the backend here: ``[T, He]`` tokens, ``[T, Dr]`` sin / cos), the scales, the slots."""
    x = t["token_x"]
    return trusted(
        MlaPrologArgs, static, scales, token_x=x.reshape(num_tokens, x.shape[-1]), weight_dq=t["weight_dq"],
        weight_uq_qr=t["weight_uq_qr"], weight_uk=t["weight_uk"], weight_dkv_kr=t["weight_dkv_kr"],
        rmsnorm_gamma_cq=t["rmsnorm_gamma_cq"], rmsnorm_gamma_ckv=t["rmsnorm_gamma_ckv"],
        rope_sin=t["rope_sin"].reshape(num_tokens, D_ROPE), rope_cos=t["rope_cos"].reshape(num_tokens, D_ROPE),
        kv_cache=t["kv_cache"], kr_cache=t["kr_cache"], slots=slots, cache_index=cache_index,
        actual_seq_len=actual_seq_len)


def _normalise_full(version: int, values: dict, modes: dict, *, reason: str) -> MlaPrologArgs:
    """:func:`_normalise` with every check."""
    limits = version_limits(version)
    scenario = select_scenario(version, modes, values["tile_size"], reason)
    if not isinstance(values["cache_mode"], str):
        raise arg_error(ModeError, "cache_mode", f"one of {list(limits.cache_modes)}", describe(values["cache_mode"]))
    cache_mode = canonical_cache_mode(values["cache_mode"], allowed=limits.cache_modes)
    if scenario.cache_modes is not None and cache_mode not in scenario.cache_modes:
        raise arg_error(ModeError, "cache_mode", f"one of {list(scenario.cache_modes)} in the {scenario.name} "
                        "scenario (combined 656-byte rows)", repr(cache_mode))
    names = ("token_x", "weight_dq", "weight_uq_qr", "weight_uk", "weight_dkv_kr", "rmsnorm_gamma_cq",
             "rmsnorm_gamma_ckv", "rope_sin", "rope_cos", "kv_cache", "kr_cache")
    for name in ("kv_cache", "kr_cache"):
        if values[name] is not None and not isinstance(values[name], np.ndarray):
            raise arg_error(DTypeError, name, "a NumPy array (updated in place)", type(values[name]).__name__)
    t = {name: required(values[name], name) for name in names}
    key = tuple(int(modes[n]) for n in MODE_NAMES)
    shown = ", ".join(f"{n}={v}" for n, v in zip(MODE_NAMES, key, strict=True))
    for name in names:  # before the scales: a bf16 weight in a quant mode is a dtype error
        want = scenario.dtypes[name]
        if dtype_name(t[name].dtype) != want:
            raise arg_error(DTypeError, name, f"dtype {want} with {shown} ({scenario.name}"
                            + (f", selected by {reason})" if reason else ")"), dtype_name(t[name].dtype))
    if version == 3:
        check_dtype_tags(values, scenario, key[1])
    scales = check_scales(scenario, values)
    for name in ("weight_dq", "weight_uq_qr", "weight_dkv_kr"):
        check_nz_weight(t[name], name)
    if get_npu_format(t["weight_uk"]) == FRACTAL_NZ:
        raise FormatError("weight_uk: expected an ND weight (format 2), got FRACTAL_NZ (29); pass the ND "
                          "tensor (npu_format_cast(weight_uk, 2))")
    query_norm_flag = values["query_norm_flag"]
    if not isinstance(query_norm_flag, (bool, np.bool_)):
        raise arg_error(DTypeError, "query_norm_flag", "a bool", describe(query_norm_flag))
    eps_cq = check_float(values["rmsnorm_epsilon_cq"], "rmsnorm_epsilon_cq", nonnegative=True)
    eps_ckv = check_float(values["rmsnorm_epsilon_ckv"], "rmsnorm_epsilon_ckv", nonnegative=True)
    qc_qr_scale = check_float(values["qc_qr_scale"], "qc_qr_scale")
    kc_scale = check_float(values["kc_scale"], "kc_scale")

    # ---- tokens: [T, He] / [B, S, He]; rope_sin / rope_cos alike
    x = t["token_x"]
    check_ndim(x, "token_x", (2, 3), "[T, He] or [B, S, He]")
    batch_shape = tuple(int(s) for s in x.shape[:-1])
    for name in ("rope_sin", "rope_cos"):
        check_shape(t[name], name, batch_shape + (D_ROPE,), "(token_x's leading dims, Dr)")
    num_tokens = math.prod(batch_shape)
    if len(batch_shape) == 2:
        _check_max(batch_shape[0], limits.max_b, "B (token_x.shape[0])")
        _check_max(batch_shape[1], limits.max_s, "S (token_x.shape[1])")
    else:
        _check_max(num_tokens, limits.max_t, "T (token_x.shape[0])")

    # ---- weights
    he = int(x.shape[-1])
    if he not in limits.he:
        raise arg_error(ShapeError, "token_x", f"He = token_x.shape[-1] in {list(limits.he)}", he)
    check_ndim(t["weight_dq"], "weight_dq", (2,), "[He, Hcq]")
    hcq = int(t["weight_dq"].shape[1])
    if hcq not in limits.hcq:
        hint = transposed_hint(t["weight_dq"].shape, (he, limits.hcq[0]), "weight_dq")
        raise arg_error(ShapeError, "weight_dq", f"Hcq = weight_dq.shape[1] in {list(limits.hcq)}", f"{hcq}{hint}")
    check_shape(t["weight_dq"], "weight_dq", (he, hcq), "[He, Hcq]")
    check_ndim(t["weight_uk"], "weight_uk", (3,), "[N, D, Hckv]")
    num_heads = int(t["weight_uk"].shape[0])
    if num_heads not in HEAD_NUMS:
        raise arg_error(ShapeError, "weight_uk", f"N = weight_uk.shape[0] in {list(HEAD_NUMS)}", num_heads)
    d_nope = int(t["weight_uk"].shape[1])
    if d_nope not in limits.d_nope:
        hint = transposed_hint(t["weight_uk"].shape, (num_heads, limits.d_nope[0], HCKV), "weight_uk")
        raise arg_error(ShapeError, "weight_uk", f"D = weight_uk.shape[1] in {list(limits.d_nope)}"
                        + ("" if len(limits.d_nope) > 1 else " (192 on an Ascend 950)"), f"{d_nope}{hint}")
    check_shape(t["weight_uk"], "weight_uk", (num_heads, d_nope, HCKV), f"[N, D={d_nope}, Hckv=512]")
    check_shape(t["weight_uq_qr"], "weight_uq_qr", (hcq, num_heads * (d_nope + D_ROPE)), "[Hcq, N*(D+Dr)]")
    check_shape(t["weight_dkv_kr"], "weight_dkv_kr", (he, HCKV + D_ROPE), "[He, Hckv+Dr]")
    check_shape(t["rmsnorm_gamma_cq"], "rmsnorm_gamma_cq", (hcq,), "[Hcq]")
    check_shape(t["rmsnorm_gamma_ckv"], "rmsnorm_gamma_ckv", (HCKV,), "[Hckv]")
    check_scale_shapes(scales, expected_scale_shapes(version, key, num_tokens, num_heads, hcq, he, d_nope),
                        scenario)
    check_alpha(scales["k_nope_clip_alpha"], t["rmsnorm_gamma_ckv"], kc_scale)

    # ---- caches and where each token goes
    kv_layout, kr_layout = _check_caches(t["kv_cache"], t["kr_cache"], cache_mode, batch_shape, limits,
                                         kv_dtile=scenario.kv_dtile, combined=scenario.combined)
    _check_memory(values)
    static = dict(version=version, scenario=scenario, kv_layout=kv_layout, kr_layout=kr_layout,
                  batch_shape=batch_shape, num_heads=num_heads, cache_mode=cache_mode, rmsnorm_epsilon_cq=eps_cq,
                  rmsnorm_epsilon_ckv=eps_ckv, qc_qr_scale=qc_qr_scale, kc_scale=kc_scale,
                  query_norm_flag=bool(query_norm_flag), tile_size=int(values["tile_size"]),
                  **{name: int(v) for name, v in modes.items()})
    t.update(cache_index=values.get("cache_index"), actual_seq_len=values.get("actual_seq_len"))
    return _finish(static, t, scales, limits.max_b)


def _check_max(value: int, limit: int | None, what: str) -> None:
    if limit is not None and value > limit:
        raise arg_error(ShapeError, what, f"at most {limit}", value)


def _check_caches(kv_cache: np.ndarray, kr_cache: np.ndarray, cache_mode: str, batch_shape: tuple[int, ...],
                  limits: VersionLimits, *, kv_dtile: int, combined: bool
                  ) -> tuple[CacheLayout, CacheLayout | None]:
    """Shapes of kv_cache / kr_cache for ``cache_mode``; their layouts.

    With ``combined`` (per-tile, 656-byte rows holding k_rope too) kr_cache must be empty and
    has no layout (None).

    Raises:
        ShapeError: rank / dims / BlockSize / contiguity, token_x's rank does not fit BSND / TND,
            or a non-empty kr_cache with combined rows (the caches' memory: :func:`_check_memory`).
    """
    num_tokens = math.prod(batch_shape)
    mode = cache_mode_traits(cache_mode)
    if mode.sequences == "per_batch":  # BSND: the caches are [B, S, Nkv, D] like token_x
        if len(batch_shape) != 2:
            raise arg_error(ShapeError, "token_x", f"3-D [B, S, He] for cache_mode {cache_mode}",
                            f"{len(batch_shape) + 1}-D")
        lead, what = batch_shape, "[B, S, Nkv=1, {}]"
    elif mode.sequences == "packed":  # TND: [T, Nkv, D]
        if len(batch_shape) != 1:
            raise arg_error(ShapeError, "token_x", f"2-D [T, He] for cache_mode {cache_mode}",
                            f"{len(batch_shape) + 1}-D")
        lead, what = batch_shape, "[T, Nkv=1, {}]"
    else:
        check_ndim(kv_cache, "kv_cache", (4,), "[BlockNum, BlockSize, Nkv, Dtile]")
        lead, what = tuple(int(s) for s in kv_cache.shape[:2]), "[BlockNum, BlockSize, Nkv=1, {}]"
        if lead[1] not in limits.block_sizes:
            shown = (f"a multiple of 16 in [16, {limits.block_sizes[-1]}]" if len(limits.block_sizes) > 2
                     else f"one of {list(limits.block_sizes)}")
            raise arg_error(ShapeError, "kv_cache", f"BlockSize = kv_cache.shape[1] {shown}", lead[1])
    if not mode.paged and num_tokens == 0:
        raise arg_error(ShapeError, "token_x", f"at least one token for cache_mode {cache_mode} (its caches "
                        "cannot be empty)", list(batch_shape))
    layouts = {}
    caches = [(kv_cache, "kv_cache", kv_dtile, f"Dtile={kv_dtile}")]
    if combined:
        if kr_cache.size:
            raise arg_error(ShapeError, "kr_cache", "an empty tensor (k_rope is stored in kv_cache's combined "
                            "656-byte rows)", f"shape {list(kr_cache.shape)}")
    else:
        caches.append((kr_cache, "kr_cache", D_ROPE, f"Dr={D_ROPE}"))
    for cache, name, dim, dim_name in caches:
        check_shape(cache, name, lead + (NKV, dim), what.format(dim_name))
        check_cache(cache, name)
        # NZ modes: D (512 or 64 here; 656-byte rows are never NZ) must be a multiple of C0, which
        # CacheLayout checks.
        layouts[name] = CacheLayout.from_declared(cache_mode, cache.shape, cache.dtype.itemsize, name=name)
    return layouts["kv_cache"], layouts.get("kr_cache")


def _check_index_args(cache_mode: str, cache_index, actual_seq_len, batch_shape: tuple[int, ...],
                      layout: CacheLayout, *, max_b: int) -> np.ndarray | None:
    """Check cache_index / actual_seq_len for ``cache_mode`` (presence, dtype, shape; the index
    values are :func:`_map_slots`'s); the per-batch token counts ``[B]`` of the PA_BLK modes, else
    None.

    Raises:
        ShapeError, DTypeError: cache_index / actual_seq_len missing, extra or malformed.
    """
    num_tokens = math.prod(batch_shape)
    merged = len(batch_shape) == 1
    blk = layout.page_indexed
    if not (blk and merged) and actual_seq_len is not None:
        raise arg_error(ShapeError, "actual_seq_len", "None unless token_x is 2-D and cache_mode is PA_BLK_BSND "
                        "or PA_BLK_NZ", describe(actual_seq_len))
    if layout.index_kind == "own":
        if cache_index is not None:
            raise arg_error(ShapeError, "cache_index", f"None for cache_mode {cache_mode} (tokens are written at "
                            "their own position)", describe(cache_index))
        return None
    if cache_index is None:
        raise arg_error(ShapeError, "cache_index", f"an int64 tensor for cache_mode {cache_mode}", None)
    check_dtype(cache_index, "cache_index", ("int64",))
    if not blk:
        check_shape(cache_index, "cache_index", batch_shape, "([T] or [B, S], like token_x)")
        return None
    bs = layout.block_size
    if merged:
        if actual_seq_len is None:
            raise arg_error(ShapeError, "actual_seq_len", f"an int32 [B] prefix-sum tensor for 2-D token_x with "
                            f"cache_mode {cache_mode}", None)
        check_dtype(actual_seq_len, "actual_seq_len", ("int32",))
        check_ndim(actual_seq_len, "actual_seq_len", (1,), "[B]")
        _check_max(int(actual_seq_len.shape[0]), max_b, "B (actual_seq_len.shape[0])")  # before any copy
        ends = actual_seq_len.astype(np.int64)
        seq_lens = np.diff(ends, prepend=0)  # [B]
        if ends.size and (seq_lens < 0).any():
            b = int(np.argmax(seq_lens < 0))
            raise arg_error(ShapeError, f"actual_seq_len[{b}]", "non-decreasing prefix sums >= 0", int(ends[b]))
        total = int(ends[-1]) if ends.size else 0
        if total != num_tokens:
            raise arg_error(ShapeError, "actual_seq_len", f"prefix sums ending at T = {num_tokens}",
                            f"last value {total}")
        pages = int((-(-seq_lens // bs)).sum())
        check_shape(cache_index, "cache_index", (pages,), "[sum(ceil(S_b/BlockSize))] for 2-D token_x, "
                    "S_b from actual_seq_len")
    else:
        b, s = batch_shape
        check_shape(cache_index, "cache_index", (b, -(-s // bs)), "[B, ceil(S/BlockSize)]")
        seq_lens = np.full(b, s, dtype=np.int64)
    return seq_lens


def _map_slots(cache_mode: str, cache_index, seq_lens: np.ndarray | None, layout: CacheLayout,
               num_tokens: int) -> np.ndarray | None:
    """The one mapping of checked index arguments to the global cache row of every token (-1 =
    skip; int64 ``[T]``; two tokens on one row warned), for the first call of a signature and for
    every later one: BSND / TND token t at row t, PA_BLK_* through the blocks (``seq_lens`` from
    :func:`_check_index_args`), PA_BSND / PA_NZ ``cache_index`` itself. None when nothing is
    written (T = 0 or an empty cache: no index value reaches memory, none is range-checked).

    Raises:
        IndexRangeError: an index outside the cache.
    """
    if num_tokens == 0 or layout.num_rows == 0:
        return None
    if layout.index_kind == "own":  # BSND / TND: token t at row t
        slots = np.arange(num_tokens, dtype=np.int64)
    elif seq_lens is not None:  # PA_BLK_BSND / PA_BLK_NZ
        slots = slots_from_pages(cache_index, seq_lens, layout.block_size, layout.num_blocks, page_offsets=False,
                                 name="cache_index")
    else:
        slots = slots_from_cache_index(cache_index, layout.num_rows, name="cache_index")
    if num_tokens > 1:
        warn_duplicates(slots, "cache_index")
    return slots


# ---------------------------------------------------------------------- backend call, outputs
def _empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    return np.zeros(shape, dtype=np.dtype(dtype))


def _run(args: MlaPrologArgs) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, ...]]:
    """Call the backend (on copies of the caches inside :func:`._check.copying_caches`); shape
    its results as the entry point returns them.

    Returns:
        ``(query, query_rope, rest)``: v2 ``rest = (dequant_scale_q_nope,)``, v3 ``rest =
        (dequant_scale_q_nope, query_norm, dequant_scale_q_norm)``, v1 ``()``.
    """
    kv_in, kr_in = args.kv_cache, args.kr_cache
    args = write_targets(args, ("kv_cache", "kr_cache"))  # copies in a functional form
    caches = ((args.kv_cache, args.kv_layout, kv_in), (args.kr_cache, args.kr_layout, kr_in))
    checked_mode.will_write(*caches)
    query, query_rope, dq_nope, query_norm, dq_norm = get_backend().mla_prolog(args)
    checked_mode.wrote(OP_NAMES[args.version], args.slots, caches,
                       (("query", query), ("query_rope", query_rope), ("query_norm", query_norm)))
    n, lead = args.num_heads, args.batch_shape
    query = query.reshape(lead + (n, HCKV))  # [T | B, S, N, Hckv]
    query_rope = query_rope.reshape(lead + (n, D_ROPE))  # [T | B, S, N, Dr]
    if args.version == 1:
        return query, query_rope, ()
    unused = UNUSED_OUTPUT_SHAPE[args.version]
    t = args.num_tokens
    dq_nope = _empty(unused, np.float32) if dq_nope is None else dq_nope.reshape(t, n, 1)  # [T, N, 1]
    if args.version == 2:
        return query, query_rope, (dq_nope,)
    if args.query_norm_flag:
        query_norm = query_norm.reshape(lead + (args.weight_dq.shape[1],))  # [T | B, S, Hcq]
    else:
        query_norm = _empty(unused, args.weight_uq_qr.dtype)
    scale_dtype = E8M0_DTYPE if args.scenario.mx else np.float32
    dq_norm = _empty(unused, scale_dtype) if dq_norm is None else dq_norm.reshape(t, dq_norm.shape[-1])  # [T, 1|Hcq/32]
    return query, query_rope, (dq_nope, query_norm, dq_norm)
