"""The MLA prolog's scenario and limits tables, and the checks that read only them.

What :mod:`ascend_emu.ops.mla_prolog` (the contract of ``npu_mla_prolog`` / ``_v2`` / ``_v3``)
validates against: the per-version shape limits (:data:`VERSION_LIMITS`,
:data:`V3_ASCEND950_LIMITS`), every legal ``(weight_quant_mode, kv_cache_quant_mode,
query_quant_mode)`` with the dtypes and scales it fixes (:data:`QUANT_SCENARIOS`), the scale
shapes each accepts (:func:`expected_scale_shapes`), and the checks of the modes, scales, dtype
tags and clip factor against them (:func:`select_scenario`, :func:`check_scales`,
:func:`check_scale_shapes`, :func:`check_dtype_tags`, :func:`check_alpha`); v1 / v2 infer their
v3 modes with :func:`infer_legacy_modes`.

Sources: seeds ``npu_mla_prolog.md`` and ``npu_mla_prolog_v3.md`` (scenario table, "约束说明"),
the v2 torch_npu doc; the ops-transformer MlaProlog host checks (legal mode combinations, He /
Hcq / N / BlockSize ranges, per-scenario dtypes); torch_npu's meta functions.

Ascend 950 (``ASCEND_EMU_SOC_NAME`` starting with ``Ascend950``, :mod:`ascend_emu.soc`): v3 also
takes weight_quant_mode 3 (MXFP8), 4 (FP8 E4M3FN) and 5 (HiFloat8, uint8 with the ``*_dtype``
tags = 290) with a non-quant, per-tensor or per-tile kv_cache (:data:`QUANT_SCENARIOS_950`, the
current torch_npu doc's scenario and dtype tables) and the doc's wider shapes
(:data:`V3_ASCEND950_LIMITS`).
On any other SoC those modes, the tags and the wider shapes are rejected before anything is
written, with torch_npu's kind of message ("weight_quant_mode: When weight_quant_mode is 3 (mxfp8
full quant), not support on this soc version Ascend910B2 ..."; op-plugin
``MlaPrologV3KernelNpuOpApi.cpp`` / meta ``npu_mla_prolog_v3_forward`` L516).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

import ml_dtypes
import numpy as np

from ..errors import ModeError, ShapeError, arg_error, describe
from ..mla import D_NOPE, D_ROPE, HCKV
from ..quant.fp8 import TORCH_NPU_DTYPE_CODES
from ..quant.mx import MX_BLOCK_SIZE
from ..soc import is_ascend950, require_ascend950
from ._check import MAX_BATCH, check_dtype, dtype_name, optional

# ---------------------------------------------------------------------- fixed dims (docs/sources.md#npu_mla_prolog_v3)
#: Legal head counts N.
HEAD_NUMS = (1, 2, 4, 8, 16, 32, 64, 128)
#: Legal per-tile quant tile sizes.
TILE_SIZES = (128,)
#: Entry point name of each version.
OP_NAMES = {1: "npu_mla_prolog", 2: "npu_mla_prolog_v2", 3: "npu_mla_prolog_v3"}


# ---------------------------------------------------------------------- per-version limits
@dataclass(frozen=True, kw_only=True)
class VersionLimits:
    """Shape values and modes one entry point accepts (its seed doc; v2 follows v1's).

    Attributes:
        he: legal He.
        hcq: legal Hcq.
        block_sizes: legal BlockSize of the paged modes.
        cache_modes: accepted ``cache_mode`` strings.
        quant_modes: legal ``(weight_quant_mode, kv_cache_quant_mode, query_quant_mode)``.
        max_b: largest B.
        max_s: largest S (None: unlimited).
        max_t: largest T (None: unlimited).
        d_nope: legal D (weight_uk.shape[1]).
    """

    he: tuple[int, ...]
    hcq: tuple[int, ...]
    block_sizes: tuple[int, ...]
    cache_modes: tuple[str, ...]
    quant_modes: tuple[tuple[int, int, int], ...]
    d_nope: tuple[int, ...] = (D_NOPE,)
    max_b: int = MAX_BATCH
    max_s: int | None = None
    max_t: int | None = None


_V12_LIMITS = dict(he=(7168,), hcq=(1536,), block_sizes=(16, 128), cache_modes=("PA_BSND", "PA_NZ"),
                   max_s=16, max_t=1048576)
#: One table for every version-specific value (seeds: v1 "约束说明", v3 "约束说明"; v2: its
#: torch_npu doc). v1 has no full quant (its dequant_scale_x / _w_dq / _w_dkv_kr are "reserved").
VERSION_LIMITS: Mapping[int, VersionLimits] = MappingProxyType({
    1: VersionLimits(**_V12_LIMITS, quant_modes=((0, 0, 0), (1, 0, 0), (1, 2, 0))),
    2: VersionLimits(**_V12_LIMITS, quant_modes=((0, 0, 0), (1, 0, 0), (1, 2, 0), (2, 0, 0), (2, 1, 1))),
    3: VersionLimits(he=(7168, 7680), hcq=(1536,), block_sizes=tuple(range(16, 1025, 16)),
                     cache_modes=("PA_BSND", "PA_NZ", "PA_BLK_BSND", "PA_BLK_NZ", "BSND", "TND"),
                     quant_modes=((0, 0, 0), (1, 0, 0), (1, 2, 0), (1, 3, 0), (2, 0, 0), (2, 1, 1), (2, 3, 0))),
})
#: The Ascend 950's own v3 modes (torch_npu doc "支持场景": mxfp8 / fp8 / hif8 full quant with a
#: non-quant, per-tensor or per-tile kv_cache).
ASCEND950_QUANT_MODES = ((3, 0, 0), (3, 1, 1), (3, 3, 0), (4, 0, 0), (4, 1, 1), (4, 3, 0), (5, 0, 0), (5, 1, 1),
                         (5, 3, 0))
#: v3 on an emulated Ascend 950 (:func:`ascend_emu.soc.is_ascend950`): the widened shape table of
#: the current torch_npu doc (He 1024 .. 8192, Hcq 1536 / 2048, D 128 / 192; N and BlockSize as
#: before) and the 950 modes. A2 / A3 keep :data:`VERSION_LIMITS` (choice: the doc's table carries
#: no SoC note, but the A2 / A3 host check this contract followed accepts only He 7168 / 7680,
#: Hcq 1536 and D 128, and the emulator is never looser than the hardware).
V3_ASCEND950_LIMITS = dataclasses.replace(
    VERSION_LIMITS[3], he=(1024, 2048, 3072, 4096, 5120, 6144, 7168, 7680, 8192), hcq=(1536, 2048),
    d_nope=(128, 192), quant_modes=VERSION_LIMITS[3].quant_modes + ASCEND950_QUANT_MODES)


def version_limits(version: int) -> VersionLimits:
    """The limits of one entry point on the emulated SoC (:data:`V3_ASCEND950_LIMITS` for v3 on
    an Ascend 950, else :data:`VERSION_LIMITS`)."""
    return V3_ASCEND950_LIMITS if version == 3 and is_ascend950() else VERSION_LIMITS[version]


# ---------------------------------------------------------------------- quant scenarios
#: The optional scale tensors, in signature order.
SCALE_ARGS = ("dequant_scale_x", "dequant_scale_w_dq", "dequant_scale_w_uq_qr", "dequant_scale_w_dkv_kr",
              "quant_scale_ckv", "quant_scale_ckr", "smooth_scales_cq", "k_nope_clip_alpha")
_FULL_QUANT_SCALES = ("dequant_scale_x", "dequant_scale_w_dq", "dequant_scale_w_uq_qr", "dequant_scale_w_dkv_kr")
_FULL_QUANT_DTYPES = dict(token_x="int8", weight_dq="int8", weight_uq_qr="int8", weight_dkv_kr="int8")
#: Cache modes of the combined-row (per-tile) scenarios (aclnn v3 doc: no NZ, no PA_BLK).
COMBINED_CACHE_MODES = ("PA_BSND", "BSND", "TND")


def _dtypes(**override: str) -> Mapping[str, str]:
    base = dict(token_x="bfloat16", weight_dq="bfloat16", weight_uq_qr="bfloat16", weight_uk="bfloat16",
                weight_dkv_kr="bfloat16", rmsnorm_gamma_cq="bfloat16", rmsnorm_gamma_ckv="bfloat16",
                rope_sin="bfloat16", rope_cos="bfloat16", kv_cache="bfloat16", kr_cache="bfloat16",
                query="bfloat16")
    base.update(override)
    return MappingProxyType(base)


@dataclass(frozen=True, kw_only=True)
class QuantScenario:
    """One legal combination of v3 quant modes.

    Attributes:
        name: the seed's name of the scenario.
        dtypes: dtype (seed spelling) of every tensor argument, and of the ``query`` output
            (``query_norm`` has weight_uq_qr's dtype, as torch_npu's meta function says).
        required: scale arguments that must be given.
        optional: scale arguments that may be given; every other scale must be None.
        repo_mode: the value both ``ckvkr_repo_mode`` and ``quant_scale_repo_mode`` must have
            (1 = combined 656-byte rows, only with per-tile kv quant).
        kv_dtile: last dim Dtile of kv_cache (512, or 656 for combined per-tile rows).
        cache_modes: the cache modes the scenario allows (None: all of the version's).
        element: the Ascend 950's 8-bit type of token_x and the three NZ weights
            (``"float8_e4m3fn"``, or ``"hifloat8"`` carried as uint8); None in the A2 / A3 modes.
        mx: MXFP8 (weight_quant_mode 3): the four dequant scales are E8M0 per 32-element block.
    """

    name: str
    dtypes: Mapping[str, str]
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    repo_mode: int = 0
    kv_dtile: int = 512
    cache_modes: tuple[str, ...] | None = None
    element: str | None = None
    mx: bool = False

    @property
    def scale_dtype(self) -> str:
        """dtype of the four dequant scales (:data:`_FULL_QUANT_SCALES`): E8M0 in MXFP8, else fp32."""
        return E8M0 if self.mx else "float32"

    @property
    def combined(self) -> bool:
        """kv_cache holds combined ``[512 int8 | 64 bf16 | 4 fp32]`` rows; kr_cache is empty."""
        return self.repo_mode == 1


#: Legal ``(weight_quant_mode, kv_cache_quant_mode, query_quant_mode)`` on Atlas A2 / A3 (the rows
#: of the v3 seed's scenario table) and what each requires. The table contradicts itself twice and
#: its dtype columns are followed: the partial-quant per-channel row prints weight_quant_mode=2 and
#: the partial-quant per-tile row 3 (3 is Ascend 950's mxfp8 mode), while their dtypes (bf16
#: token_x, only weight_uq_qr int8) are partial quant, mode 1. The full-quant per-tile row also
#: prints query_quant_mode=1 and an int8 query; the hardware rejects that, so it is rejected here
#: (:data:`HARDWARE_REJECTED_MODES`) and the row is emulated as (2, 3, 0), bf16 query. The per-tile
#: rows need k_nope_clip_alpha (dtype columns; the kernel reads it unconditionally) and no
#: quant_scale_ckv (dtype columns, although the scenario text lists it).
QUANT_SCENARIOS: Mapping[tuple[int, int, int], QuantScenario] = MappingProxyType({
    (0, 0, 0): QuantScenario(name="non-quant", dtypes=_dtypes()),
    (1, 0, 0): QuantScenario(
        name="partial quant, kv_cache non-quant", dtypes=_dtypes(weight_uq_qr="int8"),
        required=("dequant_scale_w_uq_qr",), optional=("smooth_scales_cq",)),
    (1, 2, 0): QuantScenario(
        name="partial quant, kv_cache per-channel quant",
        dtypes=_dtypes(weight_uq_qr="int8", kv_cache="int8", kr_cache="int8"),
        required=("dequant_scale_w_uq_qr", "quant_scale_ckv", "quant_scale_ckr"), optional=("smooth_scales_cq",)),
    (1, 3, 0): QuantScenario(
        name="partial quant, kv_cache per-tile quant", dtypes=_dtypes(weight_uq_qr="int8", kv_cache="int8"),
        required=("dequant_scale_w_uq_qr", "k_nope_clip_alpha"), optional=("smooth_scales_cq",), repo_mode=1,
        kv_dtile=656, cache_modes=COMBINED_CACHE_MODES),
    (2, 0, 0): QuantScenario(
        name="full quant, kv_cache non-quant", dtypes=_dtypes(**_FULL_QUANT_DTYPES),
        required=_FULL_QUANT_SCALES, optional=("smooth_scales_cq",)),
    (2, 1, 1): QuantScenario(
        name="full quant, kv_cache per-tensor quant",
        dtypes=_dtypes(**_FULL_QUANT_DTYPES, kv_cache="int8", query="int8"),
        required=_FULL_QUANT_SCALES + ("quant_scale_ckv",), optional=("smooth_scales_cq",)),
    (2, 3, 0): QuantScenario(
        name="full quant, kv_cache per-tile quant", dtypes=_dtypes(**_FULL_QUANT_DTYPES, kv_cache="int8"),
        required=_FULL_QUANT_SCALES + ("k_nope_clip_alpha",), optional=("smooth_scales_cq",), repo_mode=1,
        kv_dtile=656, cache_modes=COMBINED_CACHE_MODES),
})
#: ml_dtypes' E8M0 type (the NumPy side of ``torch.float8_e8m0fnu``).
E8M0_DTYPE = np.dtype(ml_dtypes.float8_e8m0fnu)
#: Element and scale dtype names of the Ascend 950 modes (hifloat8 data is uint8, as torch_npu
#: carries it; E8M0 scales are ``ml_dtypes.float8_e8m0fnu`` / ``torch.float8_e8m0fnu``).
FP8, HIF8_CARRIER, E8M0 = "float8_e4m3fn", "uint8", "float8_e8m0fnu"
_FP8_INPUTS = dict(token_x=FP8, weight_dq=FP8, weight_uq_qr=FP8, weight_dkv_kr=FP8)
_HIF8_INPUTS = {name: HIF8_CARRIER for name in _FP8_INPUTS}
_KV_PER_TENSOR = _FULL_QUANT_SCALES + ("quant_scale_ckv",)
#: The Ascend 950 scenarios (torch_npu doc "支持场景" and its dtype table; ops-transformer arch35
#: ``mla_prolog_comm_arch35.h`` quantMode 7-15): fp8 / hif8 full quant take the int8 full
#: quant's scales (fp32, smooth_scales_cq optional); MXFP8 takes E8M0 block scales and no
#: smooth_scales_cq. With per-tensor kv quant the query is quantized per token and head to the
#: element type. Per-tile kv quant writes 656-byte rows ``[512 codes | 64 bf16 | 4 fp32]`` (the
#: int8 rows' layout: arch35 ``ScatterCkv`` / ``ScatterKr`` offsets) with a bf16 query;
#: ``k_nope_clip_alpha`` is required in fp8 / hif8 (the doc's dtype table) and optional in
#: mxfp8 (the table: "无需赋值"; vllm-ascend's ``sfa_v1.py`` ``_sfa_preprocess_prolog_v3`` passes
#: it with every C8 call); the kernel never applies it to 8-bit tiles (``QuantPerTile8Bit``).
QUANT_SCENARIOS_950: Mapping[tuple[int, int, int], QuantScenario] = MappingProxyType({
    (3, 0, 0): QuantScenario(name="mxfp8 full quant, kv_cache non-quant", dtypes=_dtypes(**_FP8_INPUTS),
                             required=_FULL_QUANT_SCALES, element=FP8, mx=True),
    (3, 1, 1): QuantScenario(name="mxfp8 full quant, kv_cache per-tensor quant",
                             dtypes=_dtypes(**_FP8_INPUTS, kv_cache=FP8, query=FP8), required=_KV_PER_TENSOR,
                             element=FP8, mx=True),
    (4, 0, 0): QuantScenario(name="fp8 full quant, kv_cache non-quant", dtypes=_dtypes(**_FP8_INPUTS),
                             required=_FULL_QUANT_SCALES, optional=("smooth_scales_cq",), element=FP8),
    (4, 1, 1): QuantScenario(name="fp8 full quant, kv_cache per-tensor quant",
                             dtypes=_dtypes(**_FP8_INPUTS, kv_cache=FP8, query=FP8), required=_KV_PER_TENSOR,
                             optional=("smooth_scales_cq",), element=FP8),
    (5, 0, 0): QuantScenario(name="hif8 full quant, kv_cache non-quant", dtypes=_dtypes(**_HIF8_INPUTS),
                             required=_FULL_QUANT_SCALES, optional=("smooth_scales_cq",), element="hifloat8"),
    (5, 1, 1): QuantScenario(name="hif8 full quant, kv_cache per-tensor quant",
                             dtypes=_dtypes(**_HIF8_INPUTS, kv_cache=HIF8_CARRIER, query=HIF8_CARRIER),
                             required=_KV_PER_TENSOR, optional=("smooth_scales_cq",), element="hifloat8"),
    (3, 3, 0): QuantScenario(name="mxfp8 full quant, kv_cache per-tile quant",
                             dtypes=_dtypes(**_FP8_INPUTS, kv_cache=FP8),
                             required=_FULL_QUANT_SCALES, optional=("k_nope_clip_alpha",), repo_mode=1, kv_dtile=656,
                             cache_modes=COMBINED_CACHE_MODES, element=FP8, mx=True),
    (4, 3, 0): QuantScenario(name="fp8 full quant, kv_cache per-tile quant",
                             dtypes=_dtypes(**_FP8_INPUTS, kv_cache=FP8),
                             required=_FULL_QUANT_SCALES + ("k_nope_clip_alpha",), optional=("smooth_scales_cq",),
                             repo_mode=1, kv_dtile=656, cache_modes=COMBINED_CACHE_MODES, element=FP8),
    (5, 3, 0): QuantScenario(name="hif8 full quant, kv_cache per-tile quant",
                             dtypes=_dtypes(**_HIF8_INPUTS, kv_cache=HIF8_CARRIER),
                             required=_FULL_QUANT_SCALES + ("k_nope_clip_alpha",), optional=("smooth_scales_cq",),
                             repo_mode=1, kv_dtile=656, cache_modes=COMBINED_CACHE_MODES, element="hifloat8"),
})
QUANT_SCENARIOS = MappingProxyType({**QUANT_SCENARIOS, **QUANT_SCENARIOS_950})
#: weight_quant_mode -> what torch_npu calls it (the SoC gate's message).
ASCEND950_WEIGHT_MODES = {3: "mxfp8 full quant", 4: "fp8 full quant", 5: "hif8 full quant"}
#: The ``*_dtype`` tag arguments (torch_npu dtype codes; hifloat8 = 290 in weight_quant_mode 5).
DTYPE_TAGS = ("token_x_dtype", "weight_dq_dtype", "weight_uq_qr_dtype", "weight_dkv_kr_dtype", "kv_cache_dtype")

#: Mode combinations a seed table prints but torch_npu / CANN on Atlas A2 / A3 rejects, with the
#: evidence: a call with one is a ModeError quoting it (docs/numerics.md#stricter_than_hardware).
HARDWARE_REJECTED_MODES: Mapping[tuple[int, int, int], str] = MappingProxyType({
    (2, 3, 1): (
        "the v3 seed's full-quant per-tile row prints query_quant_mode=1 and an int8 query, but Atlas A2 / A3 "
        "rejects it: torch_npu's meta function (op_plugin/meta/_meta_registrations.py, "
        "npu_mla_prolog_v3_forward) declares an int8 query only when kv_cache_quant_mode=1 and a bf16 query "
        "with an empty dequant_scale_q_nope otherwise, and the A2 / A3 host check (ops-transformer "
        "attention/mla_prolog/op_host/mla_prolog_tiling_check.cpp, CheckScenarParam) requires "
        "query_quant_mode=0 outside per-tensor kv quant; use (2, 3, 0) (bf16 query) without quant_scale_ckv"),
})
MODE_NAMES = ("weight_quant_mode", "kv_cache_quant_mode", "query_quant_mode")
#: Ranges of the other integer mode attributes.
_MODE_RANGES = {"ckvkr_repo_mode": (0, 1), "quant_scale_repo_mode": (0, 1)}
#: Why a weight_quant_mode combination no table of the emulated SoC lists is rejected.
_WEIGHT_MODE_HINTS = {
    m: f"Ascend 950's {name} mode takes (kv_cache_quant_mode, query_quant_mode) (0, 0), (1, 1) or (3, 0)"
    for m, name in ((3, "mxfp8"), (4, "fp8"), (5, "hifloat8"))}


def expected_scale_shapes(version: int, modes: tuple[int, int, int], num_tokens: int, num_heads: int,
                          hcq: int, he: int = 7168, d_nope: int = D_NOPE) -> dict[str, tuple[tuple[int, ...], ...]]:
    """Accepted shapes of every scale argument in one scenario (dtypes: :func:`check_scale_shapes`).

    Sources: seed v3 参数说明 (dequant_scale_x ``[T]`` or ``[B*S, 1]``; quant_scale_ckv ``[1, Hckv]``
    in partial quant, ``[1]`` in full quant; smooth_scales_cq ``[1, Hcq]`` or ``[1]``), the v1 seed
    and the v2 doc (2-D shapes only; v2's quant_scale_ckv is ``[1, Hckv]``, of which the per-tensor
    kernel reads element 0: ``[1]`` is accepted too); the current torch_npu doc for the Ascend
    950's weight_quant_mode 3 (E8M0 blocks of 32 along each matmul's K: dequant_scale_x
    ``[T, He/32]``, dequant_scale_w_dq ``[Hcq, He/32]``, dequant_scale_w_uq_qr
    ``[N*(D+Dr), Hcq/32]``, dequant_scale_w_dkv_kr ``[Hckv+Dr, He/32]``); modes 4 / 5 take mode 2's.

    Args:
        version: entry point (1, 2, 3).
        modes: ``(weight_quant_mode, kv_cache_quant_mode, query_quant_mode)``.
        num_tokens: T (= B*S).
        num_heads: N.
        hcq: Hcq.
        he: He (read in weight_quant_mode 3).
        d_nope: D.

    Returns:
        ``{scale name: accepted shapes}``.
    """
    v3 = version == 3
    ckv = {1: ((1,), (1, HCKV)) if version == 2 else ((1,),), 2: ((1, HCKV),)}.get(modes[1], ())
    qk = num_heads * (d_nope + D_ROPE)
    if modes[0] == 3:
        dequant = {"dequant_scale_x": ((num_tokens, he // MX_BLOCK_SIZE),),
                   "dequant_scale_w_dq": ((hcq, he // MX_BLOCK_SIZE),),
                   "dequant_scale_w_uq_qr": ((qk, hcq // MX_BLOCK_SIZE),),
                   "dequant_scale_w_dkv_kr": ((HCKV + D_ROPE, he // MX_BLOCK_SIZE),)}
    else:
        dequant = {"dequant_scale_x": ((num_tokens, 1),) + (((num_tokens,),) if v3 else ()),
                   "dequant_scale_w_dq": ((1, hcq),),
                   "dequant_scale_w_uq_qr": ((1, qk),),
                   "dequant_scale_w_dkv_kr": ((1, HCKV + D_ROPE),)}
    return {
        **dequant,
        "quant_scale_ckv": ckv,
        "quant_scale_ckr": ((1, D_ROPE),),
        "smooth_scales_cq": ((1, hcq),) + (((1,),) if v3 else ()),
        "k_nope_clip_alpha": ((1,),),
    }


# ---------------------------------------------------------------------- checks against the tables
def _is_int8(x) -> bool:
    return x is not None and dtype_name(np.asarray(x).dtype) == "int8"


def infer_legacy_modes(values: dict) -> tuple[dict, str]:
    """v1 / v2 select their scenario from dtypes and the scales given (seed v1 weight_uq_qr).

    Full quant (v3 weight_quant_mode=2): int8 token_x or x / w_dq / w_dkv_kr dequant scales.
    Partial (1): int8 weight_uq_qr, dequant_scale_w_uq_qr or smooth_scales_cq. kv quant: int8
    caches or quant_scale_ckv / ckr; per-tensor (1, with per-token-head query quant) under full
    quant, per-channel (2) otherwise.
    """
    def triggers(tensors, scales):
        return ([f"{n} int8" for n in tensors if _is_int8(values[n])]
                + [f"{n} given" for n in scales if values.get(n) is not None])

    full = triggers(("token_x",), ("dequant_scale_x", "dequant_scale_w_dq", "dequant_scale_w_dkv_kr"))
    partial = triggers(("weight_uq_qr",), ("dequant_scale_w_uq_qr", "smooth_scales_cq"))
    kv = triggers(("kv_cache", "kr_cache"), ("quant_scale_ckv", "quant_scale_ckr"))
    wq = 2 if full else 1 if partial else 0
    kvq = (1 if wq == 2 else 2) if kv else 0
    modes = dict(weight_quant_mode=wq, kv_cache_quant_mode=kvq, query_quant_mode=int(wq == 2 and kvq == 1),
                 ckvkr_repo_mode=0, quant_scale_repo_mode=0)
    return modes, ", ".join(full + partial + kv)


def select_scenario(version: int, modes: dict, tile_size, reason: str) -> QuantScenario:
    """Check the mode integers and their combination; the scenario they select.

    Raises:
        ModeError: a mode that is not an int, an illegal combination (the message names the
            modes and lists the legal ones), or repo modes / tile_size the scenario does not take.
    """
    op = OP_NAMES[version]
    why = f" (selected by {reason})" if reason else ""
    for name in MODE_NAMES:
        value = modes[name]
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise arg_error(ModeError, name, "an int", describe(value))
    checks = [(n, modes[n], allowed) for n, allowed in _MODE_RANGES.items()] + [("tile_size", tile_size, TILE_SIZES)]
    for name, value, allowed in checks:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value not in allowed:
            raise arg_error(ModeError, name, f"one of {list(allowed)}", describe(value))
    key = tuple(int(modes[n]) for n in MODE_NAMES)
    shown = ", ".join(f"{n}={v}" for n, v in zip(MODE_NAMES, key, strict=True))
    if version == 3 and key[0] in ASCEND950_WEIGHT_MODES:
        require_ascend950("weight_quant_mode", key[0], ASCEND950_WEIGHT_MODES[key[0]])
    legal = version_limits(version).quant_modes
    if key not in legal:
        hint = (f" ({HARDWARE_REJECTED_MODES[key]})" if key in HARDWARE_REJECTED_MODES
                else f" ({_WEIGHT_MODE_HINTS[key[0]]})" if key[0] in _WEIGHT_MODE_HINTS else "")
        listed = "; ".join(f"{k} {QUANT_SCENARIOS[k].name}" for k in legal)
        raise ModeError(f"{op}: ({shown}){why} is not a legal mode combination{hint}; the legal "
                        f"(weight_quant_mode, kv_cache_quant_mode, query_quant_mode) are: {listed}")
    scenario = QUANT_SCENARIOS[key]
    for name in ("ckvkr_repo_mode", "quant_scale_repo_mode"):
        if modes[name] != scenario.repo_mode:
            raise arg_error(ModeError, name, f"{scenario.repo_mode} in the {scenario.name} scenario {key}",
                            modes[name])
    return scenario


def check_scales(scenario: QuantScenario, values: dict) -> dict:
    """Scale tensors as arrays; raise when a required one is missing or a forbidden one given.

    Raises:
        ShapeError: a required scale is None.
        ModeError: a scale the scenario does not take is given.
    """
    out = {}
    for name in SCALE_ARGS:
        x = optional(values.get(name), name)
        if x is None and name in scenario.required:
            raise arg_error(ShapeError, name, f"a tensor in the {scenario.name} scenario", None)
        if x is not None and name not in scenario.required + scenario.optional:
            raise arg_error(ModeError, name, f"None in the {scenario.name} scenario", describe(x))
        out[name] = x
    return out


def check_scale_shapes(scales: dict, accepted: dict, scenario: QuantScenario) -> None:
    """Dtype (fp32; the dequant scales :attr:`QuantScenario.scale_dtype`) and shape of every
    given scale (``k_nope_clip_alpha``'s value: :func:`check_alpha`).

    Raises:
        DTypeError: another dtype.
        ShapeError: a shape :func:`expected_scale_shapes` does not list.
    """
    for name, x in scales.items():
        if x is None:
            continue
        check_dtype(x, name, (scenario.scale_dtype if name in _FULL_QUANT_SCALES else "float32",))
        if tuple(x.shape) not in accepted[name]:
            shown = " or ".join(str(list(a)) for a in accepted[name])
            raise arg_error(ShapeError, name, f"shape {shown}", list(x.shape))


#: fp32's largest finite value, less a margin for the fp32 rounding of the RmsNorm output (its
#: bound :func:`check_alpha` uses is exact in real arithmetic; a few fp32 roundings add < 1e-6).
_FP32_CLIP_MAX = float(np.finfo(np.float32).max) * (1 - 2 ** -10)


def check_dtype_tags(values: dict, scenario: QuantScenario, kv_quant: int) -> None:
    """The v3 ``*_dtype`` tags (torch_npu dtype codes): torch_npu's meta function requires
    ``token_x_dtype``, ``weight_dq_dtype``, ``weight_uq_qr_dtype`` and ``weight_dkv_kr_dtype``
    = ``torch_npu.hifloat8`` (290) when weight_quant_mode 5 takes uint8 inputs, and
    ``kv_cache_dtype`` = 290 with kv_cache_quant_mode 1 (or 3); the doc: None in every other
    scenario. Stricter than the meta function: ``kv_cache_dtype`` must be None with a bf16
    kv_cache, and a tag on an A2 / A3 is rejected as the 950 mode it announces.

    Raises:
        ModeError: a tag missing, of another value, or given where it must be None.
    """
    hif8 = TORCH_NPU_DTYPE_CODES["hifloat8"]
    for tag in DTYPE_TAGS:
        value = values.get(tag)
        if value is not None and (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer))):
            raise arg_error(ModeError, tag, "None or a torch_npu dtype code (an int)", describe(value))
        if value is not None:
            require_ascend950(tag, int(value), "hifloat8 input tag")
        want = hif8 if scenario.element == "hifloat8" and (tag != "kv_cache_dtype" or kv_quant) else None
        if (None if value is None else int(value)) != want:
            where = (f"torch_npu.hifloat8 ({hif8}) in the {scenario.name} scenario (uint8 data holds hifloat8)"
                     if want is not None else f"None in the {scenario.name} scenario")
            raise arg_error(ModeError, tag, where, describe(value))


def check_alpha(alpha: np.ndarray | None, gamma_ckv: np.ndarray, kc_scale: float) -> None:
    """``k_nope_clip_alpha`` (when given): finite, > 0, and small enough that the per-tile clip
    limit ``lim = alpha * amax`` (and with it the dequant scale ``lim / 127``) stays finite in
    fp32 for every kv row the call can produce. A tile's ``amax`` is at most
    ``sqrt(Hckv) * max|rmsnorm_gamma_ckv| * |kc_scale|`` (an RmsNorm output element is at most
    ``sqrt(H)`` times its gamma), so ``alpha`` times that must be finite (when that bound is
    itself finite: a non-finite gamma is not the clip factor's fault). ``alpha = 3e38`` with
    ``gamma = 1`` would give +inf tile scales and zero k_nope.

    Raises:
        ModeError: it is not.
    """
    if alpha is None:
        return
    a = float(alpha[0])
    if not (math.isfinite(a) and a > 0):
        raise arg_error(ModeError, "k_nope_clip_alpha", "a finite clip factor > 0", a)
    with np.errstate(over="ignore", invalid="ignore"):
        bound = math.sqrt(HCKV) * float(np.abs(np.asarray(gamma_ckv, dtype=np.float32)).max()) * abs(kc_scale)
    if math.isfinite(bound) and a * bound > _FP32_CLIP_MAX:
        raise arg_error(ModeError, "k_nope_clip_alpha",
                        f"a clip factor whose per-tile clip limit stays finite in fp32 (alpha * sqrt({HCKV}) * "
                        f"max|rmsnorm_gamma_ckv| * |kc_scale| = alpha * {bound:.6g} <= "
                        f"{float(np.finfo(np.float32).max):.7g})", a)
