"""``torch_npu.atb.npu_mla_preprocess`` (ATB MlaPreprocess / aclnnMlaPreprocessV2) on NumPy arrays:
the contract.

Sources: the aclnn page (docs/sources.md#npu_mla_preprocess); torch_npu's
``op_plugin/atb/_atb_api_docs.py`` (signature, doc example, out= form),
``_atb_meta_registrations.py`` (output shapes / dtypes) and op-plugin's ``npu_mla_preprocess``
(the cache_mode / quant_mode spellings); docs/sources.md#rope (plain rotate_half), docs/sources.md#quant_rounding (RmsNormQuant
rounding), docs/sources.md#fractal_nz (NZ weights), docs/sources.md#npu_mla_preprocess (flow, cacheMode table), docs/sources.md#unverified; the A2/A3 kernel
(``mla_preprocess_bf16.h`` / ``mla_preprocess_fp16.h``, ``mla_kernel_utils.h``) and the ATB kernel
test ``test_mla_preprocess.py`` where the docs are silent.

What the op computes, per token (``T`` tokens, ``He`` hidden, ``N`` heads; step by step in
:func:`ascend_emu.emu.mla_preprocess`):

1. RmsNormQuant0 (fp32): ``y = x / rms(x) * gamma0 + beta0``, ``rms = sqrt(sum(x^2)/He + eps)``;
   ``quant_mode='per_tensor_quant_asymm'``: ``y * (1/quant_scale0) + quant_offset0``;
   ``'per_token_quant_symm'``: ``s = max|y| / 127``, ``y * (1/s)`` (``s`` kept as the row's
   dequant scale). Then fp32 -> fp16 (RNE) -> clamp [-128, 127] -> int8 (RINT) (docs/sources.md#quant_rounding).
2. ``int8 @ wdqkv^T`` exact in int32, ``+ bias0`` (per-tensor), to fp32, ``* descale0[col]``
   (per-token: ``* s``), rounded once to the input dtype: ``[T, 2112] = [ckv 512 | krope 64 | q_a 1536]``.
3. q path: RmsNormQuant1 on ``q_a`` (gamma1, beta1, quant_scale1 / offset1), ``@ wuq^T``,
   ``+ bias1``, ``* descale1`` (per-token: ``* s``), rounded: per head ``[q_nope 128 | q_pe 64]``.
   ``q_nope @ wuk[n]`` (fp32 accumulate, rounded once) -> ``q_out0``; ``int8_nzcache``:
   ``int8(fp16(q_nope_out * q_nope_scale[n]))``. ``q_pe`` -> plain rotate_half RoPE (no
   de-interleave, docs/sources.md#rope) -> ``q_out1``.
4. kv path: ``ckv = rms_norm(ckv) * gamma2`` (no beta), ``krope`` -> RoPE; written to the caches at
   ``slotmapping[t]`` (a global slot ``block * BlockSize + row``; -1 skips the token).
   ``int8_nzcache``: ``int8(fp16(ckv_fp32 * (1/ctkv_scale)))``.

Modes (aclnn cacheMode number; caches are raw memory, written where the NPU writes them):

============== == ========================================= ============================== ==============
cache_mode     #  kv_cache                                  kv_cache_rope                  q_out0
============== == ========================================= ============================== ==============
'krope_ctkv'   1  ``[BlockNum, BlockSize, 1, 512]`` ND       ``[BlockNum, BlockSize, 1, 64]`` ``[T, N, 512]``
'int8_nzcache' 2  int8 PA_NZ, D=512, C0=32                  PA_NZ, D=64, C0=16             int8 ``[T, N, 512]``
'nzcache'      3  PA_NZ, D=512, C0=16                       PA_NZ, D=64, C0=16             ``[T, N, 512]``
============== == ========================================= ============================== ==============

An NZ cache (modes 2 / 3) may be declared in its storage shape ``[BlockNum, D/C0, 128, C0]``, in
the docs' ``[BlockNum, head_num*D/C0, 128, C0]`` (then it holds ``head_num`` times the blocks:
the kernel addresses it as raw memory in blocks of ``128 * D`` elements) or in the logical shape
``[BlockNum, 128, 1, D]`` (ATB kernel test, vllm-ascend). Token ``slot`` element ``d`` lands at
element ``slot//128*128*D + d//C0*128*C0 + slot%128*C0 + d%C0``.

Weights ``wdqkv`` (int8, logical ``[2112, He]``, Linear layout) and ``wuq`` (int8, logical
``[N*192, 1536]``) must be FRACTAL_NZ (:func:`~ascend_emu.ops.npu_format_cast` ``(w, 29)``), given
either with their logical shape or, as in the torch_npu doc example, as the 4-D storage-shaped
tensor ``[1, K/32, N, 32]`` (``[1, He/32, 2112, 32]`` / ``[1, 48, N*192, 32]``) that was itself
cast; the emu backend reads the latter back as logical with :func:`~ascend_emu.layouts.nz_to_nd`
(once per tensor: the result is kept on the array, like the NZ copy torch_npu makes). ``wuk`` (input dtype)
is ND ``[N, 128, 512]``, or FRACTAL_NZ with that logical shape or its storage shape
``[N, 32, 128, 16]``.

Choices where the sources are silent or disagree (each in one named constant below):

- :data:`EPSILON`: the RmsNorm epsilon is **1e-6**. torch_npu passes ``epsilon=1e-5`` to ATB, but
  the kernel ignores it: ``RmsNormQuant::Init`` and ``MLAOperation`` hard-code ``epsilon_ = 1e-6``
  (the ATB kernel test's golden uses 1e-6 too).
- cacheMode 2 quant: the kernel computes
  ``scale3 = 1 / (float)ctkv_scale`` and multiplies the **fp32** RmsNorm output by it (before any
  rounding to the input dtype), while ``q_nope_scale`` is a multiplier on the einsum output already
  rounded to the input dtype (``EinSumQuant``). Both then go fp32 -> fp16 -> int8 like step 1.
- :data:`CACHE_MODES`: torch_npu's own map; the aclnn cacheMode 0 ('kvcache', ``[.., 576]`` rows
  and a ``[T, N, 576]`` q_out0) is not in it, so it is rejected with the evidence
  (:data:`KVCACHE_REJECTED`), as torch_npu rejects it.
- fp16 ``descale0`` / ``descale1`` are int64 holding the fp32 scale's bits in the low 32 bits (high
  32 bits 0 or their sign extension), as the ATB kernel test packs them (``process_deq_scale``);
  the fp16 kernel dequantizes in the fixpipe, emulated as an fp32 multiply then one RNE to fp16.
  bf16 takes fp32 descales. The fp16 kernel has no per-token path, so fp16 + 'per_token_quant_symm'
  is rejected (:data:`PER_TOKEN_DTYPES`).
- :data:`HEAD_NUMS`: the aclnn doc lists N in {16, 32, 64, 128}; vllm-ascend runs the op with
  N = 128 / TP (its smoke test uses 2), so any N in [1, 128] is accepted.
- Block size: the kernel addresses NZ caches with a hard-coded 128 rows per block
  (:data:`NZ_BLOCK_SIZE`); ND caches take torch_npu's ``BlockSize <= 128 or 256``.
- Arguments the kernel never reads in the selected mode are rejected rather than ignored:
  quant scales / offsets / biases with 'per_token_quant_symm', ``ctkv_scale`` / ``q_nope_scale``
  outside 'int8_nzcache'. In 'per_tensor_quant_asymm' a missing bias means zero (aclnn: "支持传入空tensor").
- Functional form (no out= arrays): torch_npu allocates fresh outputs and the kernel writes only
  the tokens' rows, so the rest of ``kv_cache_out0/1`` is uninitialised on hardware. Here they
  start as copies of ``kv_cache`` / ``kv_cache_rope`` (the aclnn contract: "kvCache and kvCacheOut
  are the same tensor"), and ``kv_cache`` itself is not modified. Pass the caches themselves as
  ``kv_cache_out0`` / ``kv_cache_out1`` to update them in place.
- ``slotmapping``: -1 skips the token (kernel ``if (slotValue == -1) continue``); any other value
  outside the cache is an :class:`~ascend_emu.errors.IndexRangeError`; duplicate slots warn, the
  last token wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np

from ..errors import DTypeError, FormatError, ModeError, ShapeError, arg_error, describe
from ..layouts import NZ_ROW_BYTES, CacheLayout, nz_shape, slots_from_cache_index
from .. import checked_mode
from ._backend import get_backend
from ._check import (ValidatedSignatures, check_cache, check_dtype, check_disjoint, check_nz_weight, check_shape,
                     dtype_name, required, transposed_hint, trusted, warn_duplicates)

CacheModeName = Literal["krope_ctkv", "int8_nzcache", "nzcache"]
QuantModeName = Literal["per_tensor_quant_asymm", "per_token_quant_symm"]

#: torch_npu spelling -> aclnn cacheMode: op-plugin's ``cache_mode_map`` of atb ``npu_mla_preprocess``.
CACHE_MODES: dict[str, int] = {"krope_ctkv": 1, "int8_nzcache": 2, "nzcache": 3}
#: Why 'kvcache' (aclnn cacheMode 0) is rejected although aclnn has it: torch_npu cannot pass it.
KVCACHE_REJECTED = (
    "torch_npu does not support cache_mode='kvcache' (aclnn cacheMode 0): its cache-mode map (op-plugin, "
    "atb npu_mla_preprocess cache_mode_map) knows only 'krope_ctkv', 'int8_nzcache' and 'nzcache', and its "
    "meta function (op_plugin/atb/_atb_meta_registrations.py, npu_mla_preprocess_meta) allocates q_out0 as "
    "[T, N, 512], not the [T, N, 576] cacheMode 0 writes; use 'krope_ctkv' (separate 512 / 64 caches)")
#: torch_npu spelling -> aclnn quantMode.
QUANT_MODES: dict[str, int] = {"per_tensor_quant_asymm": 0, "per_token_quant_symm": 1}
#: torch_npu's defaults for ``cache_mode=None`` / ``quant_mode=None``.
DEFAULT_CACHE_MODE = "krope_ctkv"
DEFAULT_QUANT_MODE = "per_token_quant_symm"
#: RmsNorm epsilon the kernel hard-codes (torch_npu's ``epsilon=1e-5`` is not read).
EPSILON = 1e-6

#: Fixed widths: wdqkv output ``[ckv 512 | krope 64 | q_a 1536]``, per-head ``[nope 128 | rope 64]``.
from ..mla import D_QK as KV_A_DIM  # noqa: E402  (576)
from ..mla import D_ROPE as ROPE_DIM
from ..mla import HCKV as KV_LORA_RANK
Q_LORA_RANK = 1536
WDQKV_DIM = KV_A_DIM + Q_LORA_RANK  # 2112
from ..mla import D_NOPE as QK_NOPE_DIM  # noqa: E402
QK_HEAD_DIM = QK_NOPE_DIM + ROPE_DIM  # 192
#: hiddenSize range (aclnn doc: 2048..10240, multiple of 256).
HIDDEN_MIN, HIDDEN_MAX, HIDDEN_ALIGN = 2048, 10240, 256
#: tokenNum limit (torch_npu doc: tokenNum <= 1024).
TOKEN_NUM_MAX = 1024
#: Accepted head counts (see module doc).
HEAD_NUMS = range(1, 129)
#: Rows per block of an NZ cache (hard-coded in the kernel's NZ addressing).
NZ_BLOCK_SIZE = 128
#: ND caches: BlockSize <= 128 or == 256 (torch_npu doc).
ND_BLOCK_SIZE_MAX, ND_BLOCK_SIZE_LARGE = 128, 256
INPUT_DTYPES = ("bfloat16", "float16")
#: descale dtype per input dtype (torch_npu doc).
DESCALE_DTYPES = {"bfloat16": "float32", "float16": "int64"}
#: Input dtypes with a per-token quant kernel.
PER_TOKEN_DTYPES = ("bfloat16",)


@dataclass(frozen=True, kw_only=True)
class MlaPreprocessArgs:
    """Normalised, validated arguments of :func:`npu_mla_preprocess`: the caller's arrays as passed
    (weights as cast, descales and ``[1]`` scales as given), the validated slots, the prepared
    destinations and the caches' layouts. The emu backend reads the weights back to their
    logical shapes and decodes the descales itself.

    Attributes:
        input: ``[T, He]`` bf16 / fp16 (any strides).
        gamma0, beta0: ``[He]`` input dtype.
        wdqkv: int8 FRACTAL_NZ, logical ``[2112, He]`` or storage ``[1, He/32, 2112, 32]``.
        descale0: ``[2112]``: fp32 (bf16 input) or int64 holding the fp32 bits (fp16 input).
        bias0: int32 ``[2112]``, or None (zero / per-token).
        quant_scale0: ``[1]`` input dtype (per-tensor), or None (per-token).
        quant_offset0: int8 ``[1]`` (per-tensor), or None.
        gamma1, beta1: ``[1536]`` input dtype.
        wuq: int8 FRACTAL_NZ, logical ``[N*192, 1536]`` or storage ``[1, 48, N*192, 32]``.
        descale1: ``[N*192]``, as descale0.
        bias1: int32 ``[N*192]`` or None.
        quant_scale1, quant_offset1: as quant_scale0 / quant_offset0.
        gamma2: ``[512]`` input dtype.
        cos, sin: ``[T, 64]`` input dtype.
        wuk: input dtype, ND ``[N, 128, 512]``, or FRACTAL_NZ with that shape or storage
            ``[N, 32, 128, 16]``.
        slotmapping: the caller's int32 ``[T]``.
        slots: int64 ``[T]`` validated global slots; -1 = skip.
        ctkv_scale: ``[1]`` input dtype ('int8_nzcache') or None.
        q_nope_scale: ``[N]`` input dtype ('int8_nzcache') or None.
        cache_mode, quant_mode: torch_npu spellings.
        epsilon: fp32 RmsNorm epsilon.
        q_out0: destination ``[T, N, 512]``; int8 for 'int8_nzcache', else input dtype.
        q_out1: destination ``[T, N, 64]`` input dtype.
        kv_cache_out0: destination cache, a plain C-contiguous view of the caller's memory.
        kv_cache_out1: destination rope cache, likewise.
        kv_layout, krope_layout: their :class:`CacheLayout`.
        head_num: N.
    """

    input: np.ndarray
    gamma0: np.ndarray
    beta0: np.ndarray
    wdqkv: np.ndarray
    descale0: np.ndarray
    bias0: np.ndarray | None
    quant_scale0: np.ndarray | None
    quant_offset0: np.ndarray | None
    gamma1: np.ndarray
    beta1: np.ndarray
    wuq: np.ndarray
    descale1: np.ndarray
    bias1: np.ndarray | None
    quant_scale1: np.ndarray | None
    quant_offset1: np.ndarray | None
    gamma2: np.ndarray
    cos: np.ndarray
    sin: np.ndarray
    wuk: np.ndarray
    slotmapping: np.ndarray
    slots: np.ndarray
    ctkv_scale: np.ndarray | None
    q_nope_scale: np.ndarray | None
    cache_mode: CacheModeName
    quant_mode: QuantModeName
    epsilon: np.float32
    q_out0: np.ndarray
    q_out1: np.ndarray
    kv_cache_out0: np.ndarray
    kv_cache_out1: np.ndarray
    kv_layout: CacheLayout
    krope_layout: CacheLayout
    head_num: int

    @property
    def token_num(self) -> int:
        """T."""
        return int(self.input.shape[0])

    @property
    def dtype(self) -> np.dtype:
        """Input dtype (bf16 or fp16)."""
        return self.input.dtype

    @property
    def per_token(self) -> bool:
        """True for 'per_token_quant_symm'."""
        return self.quant_mode == "per_token_quant_symm"


class MlaPreprocessOutputs(NamedTuple):
    """What a backend returns (:mod:`ascend_emu.ops._backend`), torch_npu's order: the destinations
    of the argument object (``args.q_out0``, ...), written in place.

    Attributes:
        q_out0: ``[T, N, 512]`` (int8 for 'int8_nzcache').
        kv_cache_out0: the kv cache after the write.
        q_out1: ``[T, N, 64]``.
        kv_cache_out1: the rope cache after the write.
    """

    q_out0: np.ndarray
    kv_cache_out0: np.ndarray
    q_out1: np.ndarray
    kv_cache_out1: np.ndarray


# ---------------------------------------------------------------------- helpers
def _mode(value, name: str, table: dict[str, int], default: str) -> str:
    value = default if value is None else value
    if name == "cache_mode" and isinstance(value, str) and value == "kvcache":
        raise arg_error(ModeError, name, f"one of {list(table)} or None ({KVCACHE_REJECTED})", describe(value))
    if not isinstance(value, str) or value not in table:
        raise arg_error(ModeError, name, f"one of {list(table)} or None (default {default!r})", describe(value))
    return value


def _vector(x, name: str, size: int, dtype: str) -> np.ndarray:
    x = required(x, name)
    check_dtype(x, name, (dtype,))
    check_shape(x, name, (size,))
    return x


def _scalar(x, name: str, dtype: str) -> np.ndarray:
    """A ``[1]`` tensor of ``dtype``, validated."""
    return _vector(x, name, 1, dtype)


def _reject(values: dict, why: str) -> None:
    for name, v in values.items():
        if v is not None:
            raise arg_error(ModeError, name, f"None ({why}; the kernel does not read it)", describe(v))


def _check_weight(w, name: str, logical: tuple[int, ...], dtype: str, *, nz_required: bool) -> np.ndarray:
    """A weight in its logical shape or, cast to FRACTAL_NZ, in its storage shape
    (:func:`storage_shape`); returned as given.

    Raises:
        DTypeError, ShapeError, FormatError: dtype, shape, or an ND weight where NZ is needed.
    """
    w = required(w, name)
    check_dtype(w, name, (dtype,))
    if w.shape == logical:
        if nz_required:
            check_nz_weight(w, name)
        return w
    storage = storage_shape(logical, w.dtype)
    if w.shape != storage:
        raise arg_error(ShapeError, name, f"the logical shape {list(logical)} or the FRACTAL_NZ storage shape "
                        f"{list(storage)}", f"{list(w.shape)}{transposed_hint(w.shape, logical, name)}")
    check_nz_weight(w, name)  # a storage-shaped weight is meaningful only once cast
    return w


def storage_shape(logical: tuple[int, ...], dtype) -> tuple[int, ...]:
    """The storage-shaped form of a weight of logical shape ``[..., M, K]``: ``[B, K/C0, M_pad16,
    C0]`` (``B`` = the batch, 1 for a matrix), i.e. :func:`nz_shape` with the two row dims merged."""
    nz = nz_shape(logical, dtype)  # [..., K/C0, M_pad/16, 16, C0]
    return (*(logical[:-2] or (1,)), nz[-4], nz[-3] * nz[-2], nz[-1])


def _descale(d, name: str, size: int, in_dtype: str) -> np.ndarray:
    """A ``[size]`` descale as given: fp32 (bf16 input), or int64 holding an fp32 scale's bits
    in its low 32 bits (fp16 input; those checked by :func:`_check_descale_bits`).

    Raises:
        DTypeError, ShapeError: dtype / shape.
    """
    want = DESCALE_DTYPES[in_dtype]
    d = required(d, name)
    if dtype_name(d.dtype) != want:
        raise arg_error(DTypeError, name, f"dtype {want} with {in_dtype} input", dtype_name(d.dtype))
    check_shape(d, name, (size,))
    return d


def _check_descale_bits(d: np.ndarray, name: str) -> None:
    """An int64 descale holds an fp32 scale's bits in its low 32 bits: the high 32 bits must be 0
    or their sign extension.

    Raises:
        FormatError: naming the first bad element.
    """
    high = d.view(np.uint64) >> np.uint64(32)
    bad = (high != 0) & (high != np.uint64(0xFFFFFFFF))
    if bad.any():
        i = int(np.argmax(bad))
        raise FormatError(f"{name}[{i}] = {int(d[i])}: expected an fp32 scale's bits in the low 32 bits of the "
                          f"int64 (high 32 bits 0 or their sign extension), as the ATB kernel test packs it")


def _cache_layout(cache: np.ndarray, name: str, *, dim: int, dtype: str, nz: bool, head_num: int) -> CacheLayout:
    """Validate a cache (raw memory) and describe where the kernel writes in it."""
    check_dtype(cache, name, (dtype,))
    check_cache(cache, name)
    shape = tuple(cache.shape)
    itemsize = cache.dtype.itemsize
    if not nz:
        if len(shape) != 4 or shape[2:] != (1, dim):
            raise arg_error(ShapeError, name, f"[BlockNum, BlockSize, 1, {dim}]", list(shape))
        nb, bs = shape[:2]
        if not (1 <= bs <= ND_BLOCK_SIZE_MAX or bs == ND_BLOCK_SIZE_LARGE):
            raise arg_error(ShapeError, f"{name} BlockSize", f"1..{ND_BLOCK_SIZE_MAX} or {ND_BLOCK_SIZE_LARGE}", bs)
        return CacheLayout(mode="PA_BSND", num_blocks=nb, block_size=bs, dim=dim, itemsize=itemsize)
    c0 = NZ_ROW_BYTES // itemsize
    bs = NZ_BLOCK_SIZE
    per_block = {dim // c0 * k: k for k in (1, head_num)}  # storage dim 1 -> blocks per declared block
    if len(shape) == 4 and shape[1:] == (bs, 1, dim):
        return CacheLayout(mode="PA_NZ", num_blocks=shape[0], block_size=bs, dim=dim, itemsize=itemsize)
    if len(shape) == 4 and shape[2:] == (bs, c0) and shape[1] in per_block:
        return CacheLayout(mode="PA_NZ", num_blocks=shape[0] * per_block[shape[1]], block_size=bs, dim=dim,
                           itemsize=itemsize)
    storage = " or ".join(f"[BlockNum, {d1}, {bs}, {c0}]" for d1 in per_block)
    raise arg_error(ShapeError, name, f"an NZ cache of BlockSize {bs}: logical [BlockNum, {bs}, 1, {dim}] or "
                    f"storage {storage}", list(shape))


def _plain(a: np.ndarray) -> np.ndarray:
    """The same memory as a plain ndarray (NZArray tags dropped; Numba types plain arrays)."""
    return a.view(np.ndarray)


def _same_as(out, name: str, ref: np.ndarray, ref_name: str) -> np.ndarray:
    out = required(out, name)
    if out.dtype != ref.dtype:
        raise arg_error(DTypeError, name, f"the dtype of {ref_name}, {dtype_name(ref.dtype)}", dtype_name(out.dtype))
    check_shape(out, name, ref.shape, f"(the shape of {ref_name})")
    check_cache(out, name)
    return out


def _q_out(out, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    out = required(out, name)
    if out.dtype != dtype:
        raise arg_error(DTypeError, name, f"dtype {dtype_name(dtype)}", dtype_name(out.dtype))
    check_shape(out, name, shape)
    if not out.flags.writeable:
        raise arg_error(ShapeError, name, "a writable array", "a read-only array")
    return out


# ---------------------------------------------------------------------- the op
def npu_mla_preprocess(input, gamma0, beta0, wdqkv, descale0, gamma1, beta1, wuq, descale1, gamma2, cos, sin,
                       wuk, kv_cache, kv_cache_rope, slotmapping, *, quant_scale0=None, quant_offset0=None,
                       bias0=None, quant_scale1=None, quant_offset1=None, bias1=None, ctkv_scale=None,
                       q_nope_scale=None, cache_mode: CacheModeName | None = None,
                       quant_mode: QuantModeName | None = None, q_out0=None, kv_cache_out0=None, q_out1=None,
                       kv_cache_out1=None):
    """MLA preprocessing: RmsNormQuant, two int8 matmuls, the W^UK einsum, RoPE, and the cache write.

    Numerics, modes, layouts and every choice made where the sources are silent: module doc.

    Args:
        input: ``[T, He]`` bf16 / fp16, ``0 <= T <= 1024``, He in 2048..10240 and a multiple of 256.
        gamma0, beta0: ``[He]`` input dtype.
        wdqkv: int8 FRACTAL_NZ, logical ``[2112, He]`` or storage ``[1, He/32, 2112, 32]``.
        descale0: ``[2112]`` fp32 (bf16 input) or int64 (fp16 input; fp32 bits in the low word).
        gamma1, beta1: ``[1536]`` input dtype.
        wuq: int8 FRACTAL_NZ, logical ``[N*192, 1536]`` or storage ``[1, 48, N*192, 32]``.
        descale1: ``[N*192]``, dtype as ``descale0``.
        gamma2: ``[512]`` input dtype.
        cos, sin: ``[T, 64]`` input dtype (half layout, shared by all heads).
        wuk: ``[N, 128, 512]`` input dtype, ND or FRACTAL_NZ (also storage ``[N, 32, 128, 16]``);
            N in 1..128.
        kv_cache: the kv cache of ``cache_mode`` (module doc table); C-contiguous.
        kv_cache_rope: the rope cache (module doc table).
        slotmapping: int32 ``[T]``; global slot ``block * BlockSize + row`` or -1 (skip).
        quant_scale0, quant_offset0: ``[1]`` input dtype / int8; required with
            'per_tensor_quant_asymm', rejected with 'per_token_quant_symm'.
        bias0: int32 ``[2112]`` or None (zero); rejected with 'per_token_quant_symm'.
        quant_scale1, quant_offset1, bias1: as above for the q path (``bias1`` ``[N*192]``).
        ctkv_scale: ``[1]`` input dtype, 'int8_nzcache' only (the ckv is multiplied by its inverse).
        q_nope_scale: ``[N]`` input dtype, 'int8_nzcache' only (multiplier).
        cache_mode: 'krope_ctkv' (default), 'int8_nzcache' or 'nzcache' (torch_npu's map; the
            aclnn cacheMode 0, 'kvcache', is rejected: :data:`KVCACHE_REJECTED`).
        quant_mode: 'per_token_quant_symm' (default, bf16 only) or 'per_tensor_quant_asymm'.
        q_out0, kv_cache_out0, q_out1, kv_cache_out1: the out= form: all four given, they are
            written in place and returned; ``kv_cache`` / ``kv_cache_rope`` are then only
            checked, never read or written. Pass the caches themselves to update them in place.
            The cache outputs must match the caches' shape and dtype; ``q_out0`` / ``q_out1`` the
            shapes / dtypes of the Returns. No two of the four may share memory, nor any of
            them with an input (``kv_cache`` / ``kv_cache_rope`` excepted: not read).

    Returns:
        ``(q_out0, kv_cache_out0, q_out1, kv_cache_out1)``: ``q_out0`` ``[T, N, 512]`` (int8 for
        'int8_nzcache'), the kv cache after the write, ``q_out1`` ``[T, N, 64]`` (q_rope), the
        rope cache after the write. Out= form: the given arrays. Functional form: new arrays (the
        caches' copies, see module doc).

    Raises:
        ShapeError, DTypeError: a shape / dtype off the table above; out= arrays that overlap
            each other or an input.
        ModeError: unknown mode ('kvcache' included), fp16 with per-token quant, an argument the
            mode does not read, or an incomplete out= set.
        FormatError: an int8 weight not cast to FRACTAL_NZ; a badly packed int64 descale.
        IndexRangeError: a slot outside the cache (other than -1).
    """
    values = dict(locals())
    args, result = _normalise(values)
    caches = ((args.kv_cache_out0, args.kv_layout, values["kv_cache"]),
              (args.kv_cache_out1, args.krope_layout, values["kv_cache_rope"]))
    checked_mode.will_write(*caches)
    get_backend().mla_preprocess(args)
    checked_mode.wrote("npu_mla_preprocess", args.slots, caches, (("q_out0", args.q_out0), ("q_out1", args.q_out1)))
    return result


# ---------------------------------------------------------------------- the contract
@dataclass(frozen=True)
class _Static:
    """What the shape / dtype / mode checks derive from a call signature (see :func:`_normalise`)."""

    cache_mode: str
    quant_mode: str
    head_num: int
    kv_layout: CacheLayout
    krope_layout: CacheLayout
    q0_shape: tuple[int, ...]
    q0_dtype: np.dtype
    q1_shape: tuple[int, ...]
    out_form: bool
    int64_descales: bool


#: Signatures whose static checks passed (:func:`ascend_emu.ops._check.signature`).
_VALIDATED = ValidatedSignatures()
#: The out= arrays, in the order their overlap is checked.
_OUT_NAMES = ("kv_cache_out0", "kv_cache_out1", "q_out0", "q_out1")
#: The tensor arguments the op reads (the out= form reads neither kv_cache nor kv_cache_rope).
_READ_NAMES = ("input", "gamma0", "beta0", "wdqkv", "descale0", "gamma1", "beta1", "wuq", "descale1", "gamma2", "cos",
               "sin", "wuk", "slotmapping", "quant_scale0", "quant_offset0", "bias0", "quant_scale1", "quant_offset1",
               "bias1", "ctkv_scale", "q_nope_scale")


def _normalise(v: dict) -> tuple[MlaPreprocessArgs, tuple]:
    """Validate every argument of :func:`npu_mla_preprocess` (by name in ``v``; nothing is written)
    and build the arguments object and the op's result tuple (out= arrays or new ones).

    The checks that read only types, shapes, dtypes, formats and modes run once per call
    signature (:func:`~ascend_emu.ops._check.signature`; a decode loop repeats one); the int64
    descales' high bits, the slots and the out= arrays' overlap are checked on every call, after
    them, in that order.
    """
    key, static, known = _VALIDATED.lookup(tuple(v.values()), lambda *_: _check_static(v))
    if not known:
        if key is None:  # lists and the like, accepted by the checks above: as arrays from here on
            v = {k: x if x is None or isinstance(x, (np.ndarray, str)) else np.asarray(x) for k, x in v.items()}
    if static.int64_descales:
        for name in ("descale0", "descale1"):
            _check_descale_bits(v[name], name)
    slots = slots_from_cache_index(v["slotmapping"], static.kv_layout.num_rows, name="slotmapping")  # [T] int64
    kv_in, rope_in = v["kv_cache"], v["kv_cache_rope"]
    if static.out_form:
        # every output is written by the call: none may share memory with another (a cache write
        # would corrupt the returned query, or the other cache) nor with an input (ctkv_scale inside
        # q_out0 would be read after q_out0 is written)
        check_disjoint([(name, v[name]) for name in _OUT_NAMES], [(name, v[name]) for name in _READ_NAMES])
        q0, kv_out, q1, rope_out = (v[k] for k in ("q_out0", "kv_cache_out0", "q_out1", "kv_cache_out1"))
    else:
        q0 = np.empty(static.q0_shape, dtype=static.q0_dtype)
        q1 = np.empty(static.q1_shape, dtype=v["input"].dtype)
        kv_out = np.array(_plain(kv_in), copy=True)
        rope_out = np.array(_plain(rope_in), copy=True)
    if slots.shape[0] > 1:  # one token cannot write a slot twice
        warn_duplicates(slots, "slotmapping")
    if not known:
        _VALIDATED.put(key, static)
    per_tensor = static.quant_mode == "per_tensor_quant_asymm"
    nz8 = static.cache_mode == "int8_nzcache"
    args = trusted(
        MlaPreprocessArgs, input=v["input"], gamma0=v["gamma0"], beta0=v["beta0"], wdqkv=v["wdqkv"], descale0=v["descale0"],
        bias0=v["bias0"] if per_tensor else None, quant_scale0=v["quant_scale0"] if per_tensor else None,
        quant_offset0=v["quant_offset0"] if per_tensor else None, gamma1=v["gamma1"], beta1=v["beta1"],
        wuq=v["wuq"], descale1=v["descale1"], bias1=v["bias1"] if per_tensor else None,
        quant_scale1=v["quant_scale1"] if per_tensor else None,
        quant_offset1=v["quant_offset1"] if per_tensor else None, gamma2=v["gamma2"], cos=v["cos"], sin=v["sin"],
        wuk=v["wuk"], slotmapping=v["slotmapping"], slots=slots, ctkv_scale=v["ctkv_scale"] if nz8 else None,
        q_nope_scale=v["q_nope_scale"] if nz8 else None, cache_mode=static.cache_mode, quant_mode=static.quant_mode,
        epsilon=_EPSILON_F32, q_out0=q0, q_out1=q1, kv_cache_out0=_plain(kv_out), kv_cache_out1=_plain(rope_out),
        kv_layout=static.kv_layout, krope_layout=static.krope_layout, head_num=static.head_num)
    return args, (q0, kv_out, q1, rope_out)


_EPSILON_F32 = np.float32(EPSILON)


def _check_static(v: dict) -> _Static:
    """Every check of :func:`npu_mla_preprocess` except the values and addresses :func:`_normalise`
    checks on every call, in the contract's order.

    Raises:
        As :func:`npu_mla_preprocess`.
    """
    cache_mode = _mode(v["cache_mode"], "cache_mode", CACHE_MODES, DEFAULT_CACHE_MODE)
    quant_mode = _mode(v["quant_mode"], "quant_mode", QUANT_MODES, DEFAULT_QUANT_MODE)
    per_token = quant_mode == "per_token_quant_symm"

    x = required(v["input"], "input")
    check_dtype(x, "input", INPUT_DTYPES)
    dt = dtype_name(x.dtype)
    check_shape(x, "input", (None, None), "[tokenNum, hiddenSize]")
    t, hidden = x.shape
    if t > TOKEN_NUM_MAX:
        raise arg_error(ShapeError, "input tokenNum", f"0..{TOKEN_NUM_MAX}", t)
    if not (HIDDEN_MIN <= hidden <= HIDDEN_MAX and hidden % HIDDEN_ALIGN == 0):
        raise arg_error(ShapeError, "input hiddenSize",
                        f"{HIDDEN_MIN}..{HIDDEN_MAX} and a multiple of {HIDDEN_ALIGN}", hidden)
    if per_token and dt not in PER_TOKEN_DTYPES:
        raise arg_error(ModeError, "quant_mode", f"'per_tensor_quant_asymm' with {dt} input (the {dt} kernel has "
                        f"no per-token quant)", repr(quant_mode))

    wuk_in = required(v["wuk"], "wuk")
    if wuk_in.ndim not in (3, 4) or wuk_in.shape[0] not in HEAD_NUMS:
        raise arg_error(ShapeError, "wuk", f"[N, 128, 512] (ND / NZ) or [N, 32, 128, 16] (NZ storage) with N in "
                        f"1..{HEAD_NUMS[-1]}", list(wuk_in.shape))
    n = int(wuk_in.shape[0])
    _check_weight(wuk_in, "wuk", (n, QK_NOPE_DIM, KV_LORA_RANK), dt, nz_required=False)
    _check_weight(v["wdqkv"], "wdqkv", (WDQKV_DIM, hidden), "int8", nz_required=True)
    _check_weight(v["wuq"], "wuq", (n * QK_HEAD_DIM, Q_LORA_RANK), "int8", nz_required=True)

    _vector(v["gamma0"], "gamma0", hidden, dt)
    _vector(v["beta0"], "beta0", hidden, dt)
    _vector(v["gamma1"], "gamma1", Q_LORA_RANK, dt)
    _vector(v["beta1"], "beta1", Q_LORA_RANK, dt)
    _vector(v["gamma2"], "gamma2", KV_LORA_RANK, dt)
    _descale(v["descale0"], "descale0", WDQKV_DIM, dt)
    _descale(v["descale1"], "descale1", n * QK_HEAD_DIM, dt)
    for name in ("cos", "sin"):
        a = required(v[name], name)
        check_dtype(a, name, (dt,))
        check_shape(a, name, (t, ROPE_DIM))

    quant = {k: v[k] for k in ("quant_scale0", "quant_offset0", "bias0", "quant_scale1", "quant_offset1", "bias1")}
    if per_token:
        _reject(quant, f"quant_mode={quant_mode!r}")
    else:
        _scalar(v["quant_scale0"], "quant_scale0", dt)
        _scalar(v["quant_scale1"], "quant_scale1", dt)
        _scalar(v["quant_offset0"], "quant_offset0", "int8")
        _scalar(v["quant_offset1"], "quant_offset1", "int8")
        if v["bias0"] is not None:
            _vector(v["bias0"], "bias0", WDQKV_DIM, "int32")
        if v["bias1"] is not None:
            _vector(v["bias1"], "bias1", n * QK_HEAD_DIM, "int32")
    if cache_mode == "int8_nzcache":
        _scalar(v["ctkv_scale"], "ctkv_scale", dt)
        _vector(v["q_nope_scale"], "q_nope_scale", n, dt)
    else:
        _reject({"ctkv_scale": v["ctkv_scale"], "q_nope_scale": v["q_nope_scale"]}, f"cache_mode={cache_mode!r}")

    # caches: (dtype, nz) of kv_cache and kv_cache_rope per mode
    nz = cache_mode in ("int8_nzcache", "nzcache")
    kv_dt = "int8" if cache_mode == "int8_nzcache" else dt
    kv_in = required(v["kv_cache"], "kv_cache")
    kv_layout = _cache_layout(kv_in, "kv_cache", dim=KV_LORA_RANK, dtype=kv_dt, nz=nz, head_num=n)
    rope_in = required(v["kv_cache_rope"], "kv_cache_rope")
    krope_layout = _cache_layout(rope_in, "kv_cache_rope", dim=ROPE_DIM, dtype=dt, nz=nz, head_num=n)
    if krope_layout.num_rows != kv_layout.num_rows:
        raise arg_error(ShapeError, "kv_cache_rope", f"as many slots as kv_cache ({kv_layout.num_rows})",
                        f"{krope_layout.num_rows} slots (shape {list(rope_in.shape)})")

    sm = required(v["slotmapping"], "slotmapping")
    check_dtype(sm, "slotmapping", ("int32",))
    check_shape(sm, "slotmapping", (t,))

    q0_shape = (t, n, KV_LORA_RANK)
    q0_dtype = np.dtype(np.int8) if cache_mode == "int8_nzcache" else x.dtype
    q1_shape = (t, n, ROPE_DIM)
    outs = {k: v[k] for k in ("q_out0", "kv_cache_out0", "q_out1", "kv_cache_out1")}
    out_form = any(o is not None for o in outs.values())
    if out_form:
        for k, o in outs.items():
            if o is None:
                raise arg_error(ModeError, k, "a tensor (the out= form takes q_out0, kv_cache_out0, q_out1 and "
                                "kv_cache_out1 together)", None)
        _q_out(outs["q_out0"], "q_out0", q0_shape, q0_dtype)
        _q_out(outs["q_out1"], "q_out1", q1_shape, x.dtype)
        _same_as(outs["kv_cache_out0"], "kv_cache_out0", kv_in, "kv_cache")
        _same_as(outs["kv_cache_out1"], "kv_cache_out1", rope_in, "kv_cache_rope")
    return _Static(cache_mode=cache_mode, quant_mode=quant_mode, head_num=n, kv_layout=kv_layout,
                   krope_layout=krope_layout, q0_shape=q0_shape, q0_dtype=q0_dtype, q1_shape=q1_shape,
                   out_form=out_form, int64_descales=DESCALE_DTYPES[dt] == "int64")
