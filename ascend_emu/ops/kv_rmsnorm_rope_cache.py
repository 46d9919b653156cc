"""``torch_npu.npu_kv_rmsnorm_rope_cache`` on NumPy arrays: the contract.

Sources: the op page (docs/sources.md#npu_kv_rmsnorm_rope_cache); docs/sources.md#rope (RoPE),
docs/sources.md#quant_rounding (``RoundFloat2Int8``), docs/sources.md#paged_nz (paged NZ), docs/sources.md#npu_kv_rmsnorm_rope_cache (this op), docs/sources.md#cache_index (index meanings); torch_npu's
``npu_kv_rmsnorm_rope_cache_meta`` (output shapes / dtypes); the A2/A3 kernel's host tiling and
``kv_rms_norm_rope_cache_b16_*`` kernels (which modes have a quant kernel, BlockSize alignment).

What the op does, per token ``t`` of ``kv [B, 1, S, 576] = [512 rms_in | 64 rope_in]``:

1. ``y = rms_in / sqrt(sum(rms_in^2) * (1/512) + eps) * gamma``, fp32 (docs/sources.md#rms_norm).
2. ``k = deinterleave(rope_in)`` then ``k_embed = k * cos + rotate_half(k) * sin``, fp32 (docs/sources.md#rope).
3. Non-quant: both rows are rounded once to the kv dtype (RNE) and written to the caches.
   Quant (int8): the caches get ``saturate(rint(k_embed * k_rope_scale))`` and
   ``saturate(rint(y * c_kv_scale))``, computed from the **fp32** values, not from the kv-dtype
   rounded ones (the kernel multiplies its fp32 result ``y0`` / ``xLocalFp32`` by the scale and
   calls ``RoundFloat2Int8``: fp32 -> int32 RINT -> half -> int8, i.e. half-to-even, saturated).
4. ``k_embed_out`` / ``y_out`` are the un-quantized rows in the kv dtype.

K/V-split mode (``v`` given; torch_npu 2.14, op-plugin ``test_npu_kv_rms_norm_rope_cache.py``
method_mode 1; kernels of hicann/ops-nn b927bff ``norm/kv_rms_norm_rope_cache``, host tiling
``kv_rms_norm_rope_cache_ds_tiling.cpp`` / ``_base_tiling.cpp``), per token of ``kv [B, 1, S, 192]``
(:data:`V_SPLIT_K_SIZE`) and ``v [B, 1, S, 128]`` (:data:`V_SPLIT_V_SIZE`):

1. ``y = kv / sqrt(sum(kv^2) * (1/192) + eps) * gamma`` over all 192 dims, fp32 (``RmsNormV2``;
   its summation order: :data:`~ascend_emu.emu.kernels.KV_CACHE_RMS` /
   :data:`~ascend_emu.emu.kernels.KV_CACHE_BLK_NZ_RMS`).
2. ``k = [rope(y[:64]) | y[64:]]``: the same interleaved RoPE, of the **fp32** normed values
   (``RopeKV2`` gathers from the fp32 row), then one rounding of the whole row to the kv dtype.
3. ``k_cache`` (last dim 192) gets ``k``; ``ckv_cache`` (last dim 128) gets ``v`` unchanged. Quant:
   ``saturate(rint(k_fp32 * k_rope_scale))`` (scale ``[192]``) and ``saturate(rint(v * c_kv_scale))``
   (scale ``[128]``), ``RoundFloat2Int8`` as above.
4. ``k_embed_out = k`` ``[B, 1, S, 192]`` and ``y_out = v`` ``[B, 1, S, 128]``, kv dtype.

Choices where the sources leave room (each lives in one named constant below):

- :data:`QUANT_CACHE_MODES`: the int8 path is legal in the five PA modes only. The A2/A3 kernel has
  quant kernels for PA / PA_BNSD (5011), PA_BLK_BNSD (5010), PA_NZ (4011) and PA_BLK_NZ (4010);
  ``Norm`` + scales would run the non-quant Norm kernel against int8 caches, so it is rejected.
- :data:`OUTPUT_KV_CACHE_MODES`: ``is_output_kv=True`` is rejected in ``Norm`` mode. The seed says
  the flag is only effective in the PA modes, and the Norm kernel never writes the two outputs.
- :data:`UNWRITTEN_OUTPUT_FILL`: with ``is_output_kv=False`` the hardware returns uninitialised
  ``[B, 1, S, 64]`` / ``[B, 1, S, 512]`` tensors (the meta function always allocates them); the
  emulator returns them filled with zeros, deterministically.
- ``k_rope_scale`` / ``c_kv_scale`` may be ``[D]``, ``[1, D]`` (the aclnn
  ``[N, D]`` with N = 1) or ``[1]`` (per-tensor; listed by the aclnn doc, broadcast here).
  Offsets are rejected: the seed says they are not supported, and the kernel has no offset add.
- Scales must be given both or neither (seed: "k_rope_scale和c_kv_scale必须同时非空"), even
  though the kernel has per-cache quant flags.
- ``cos`` / ``sin`` must be ``[B, 1, S, 64]`` exactly, as the seed states (the host tiling would
  also broadcast ``[B, 1, 1, 64]``; not accepted here).
- Index values must be int64 (seed). Out-of-range values raise :class:`IndexRangeError` (the
  hardware writes wherever they point); ``-1`` skips the token (PA_BLK: the page).
- Duplicate destination slots (undefined on hardware) warn; the last token wins.
- K/V-split mode: N = 1 only (the kernel also takes N = 2, 4, 8 with per-head cos / sin / scales:
  rejected here, :data:`V_SPLIT_HEADS`); kv's last dim must be 192 (the tiling checks gamma,
  cos and v, and the kernels read 192-wide rows); scales ``[D]`` or ``[1, D]`` only (the tiling
  rejects ``[1]`` in this mode); quant is accepted in ``Norm`` too (tiling keys 1010 / 3010), but
  ``is_output_kv=True`` still only in the PA modes. The v bytes reach ``ckv_cache`` / ``y_out``
  unchanged (the kernel copies them, no rounding).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np

from ..errors import DTypeError, ModeError, ShapeError, arg_error, describe
from ..layouts import (CacheLayout, cache_mode_traits, canonical_cache_mode, slots_from_cache_index, slots_from_pages,
                       slots_from_positions)
from .. import checked_mode
from ._backend import get_backend
from ._check import (ValidatedSignatures, check_cache, check_dtype, check_disjoint, check_float, check_shape,
                     dtype_name, optional, required, warn_duplicates, write_targets)

KvCacheMode = Literal["Norm", "PA", "PA_BNSD", "PA_NZ", "PA_BLK_BNSD", "PA_BLK_NZ"]

#: Cache-mode spellings the seed lists.
CACHE_MODES: tuple[str, ...] = ("Norm", "PA", "PA_BNSD", "PA_NZ", "PA_BLK_BNSD", "PA_BLK_NZ")
#: Modes with an int8 quant kernel (tiling keys 5011, 5010, 4011, 4010).
QUANT_CACHE_MODES: tuple[str, ...] = ("PA", "PA_BNSD", "PA_NZ", "PA_BLK_BNSD", "PA_BLK_NZ")
#: Modes in which ``is_output_kv=True`` is accepted (seed: only the PA modes).
OUTPUT_KV_CACHE_MODES: tuple[str, ...] = QUANT_CACHE_MODES
#: Value of ``k_embed_out`` / ``y_out`` when ``is_output_kv=False`` (uninitialised on hardware).
UNWRITTEN_OUTPUT_FILL = 0.0
#: kv / gamma / cos / sin dtypes; non-quant caches must match kv's.
KV_DTYPES = ("bfloat16", "float16")
#: rms_size, rope_size and hidden_size = rms_size + rope_size (seed: only these values).
from ..mla import D_QK as HIDDEN_SIZE  # noqa: E402
from ..mla import D_ROPE as ROPE_SIZE
from ..mla import HCKV as RMS_SIZE
#: K/V-split mode (``v`` given): kv / k_cache row width Dk and v / ckv_cache row width Dv
#: (ops-nn ``kv_rms_norm_rope_cache_ds_tiling.cpp``: ``RMS_NORM_LENGTHS = {512, 192}``,
#: ``V_LENGTH = 128``; ``kv_rms_norm_rope_cache_comm.h`` ``K_CACHE_SIZES`` / ``V_CACHE_SIZES``).
V_SPLIT_K_SIZE = 192
V_SPLIT_V_SIZE = 128
#: K/V-split heads N accepted here (the kernel: 1, 2, 4, 8).
V_SPLIT_HEADS = (1,)
#: Modes with an int8 quant kernel in K/V-split mode (Norm: tiling keys 1010 / 3010).
V_SPLIT_QUANT_CACHE_MODES: tuple[str, ...] = CACHE_MODES
#: BlockSize of a PA cache must fill whole 32-byte rows: 16 for bf16 / fp16, 32 for int8.
BLOCK_ALIGN_BYTES = 32


@dataclass(frozen=True, kw_only=True)
class KvRmsNormRopeCacheArgs:
    """Normalised, validated arguments of :func:`npu_kv_rmsnorm_rope_cache` (the caller's arrays
    as passed; the emu backend makes its own kernel operands of them).

    Attributes:
        kv: ``[B, 1, S, 576]`` kv dtype (any strides); K/V-split: ``[B, 1, S, 192]``.
        gamma: ``[512]`` kv dtype; K/V-split: ``[192]``.
        cos, sin: ``[B, 1, S, 64]`` kv dtype (any strides).
        index: the caller's int64 index tensor (its meaning per cache mode:
            :func:`npu_kv_rmsnorm_rope_cache`).
        k_cache, ckv_cache: the caller's caches, updated in place and returned.
        k_layout, ckv_layout: their :class:`CacheLayout` (canonical mode, geometry, itemsize).
        slots: int64 ``[T]`` destination slot per token (T = B * S, batch-major), validated;
            -1 = skip.
        unique_slots: no slot is written twice (else a DuplicateSlotWarning was issued).
        k_rope_scale, c_kv_scale: fp32 ``[D]``, ``[1, D]`` or ``[1]`` multipliers as given, or
            None (non-quant); D = the k_cache / ckv_cache row width.
        v: None, or (K/V-split mode) ``[B, 1, S, 128]`` kv dtype (any strides).
        epsilon: fp32 epsilon.
        cache_mode: the seed spelling the caller used.
        is_output_kv: whether ``k_embed_out`` / ``y_out`` carry the rows.
        batch, seq_len: B and S.
    """

    kv: np.ndarray
    gamma: np.ndarray
    cos: np.ndarray
    sin: np.ndarray
    index: np.ndarray
    k_cache: np.ndarray
    ckv_cache: np.ndarray
    k_layout: CacheLayout
    ckv_layout: CacheLayout
    slots: np.ndarray
    unique_slots: bool
    k_rope_scale: np.ndarray | None
    c_kv_scale: np.ndarray | None
    v: np.ndarray | None
    epsilon: np.float32
    cache_mode: str
    is_output_kv: bool
    batch: int
    seq_len: int

    @property
    def quant(self) -> bool:
        """True when the caches are int8 (both scales given)."""
        return self.k_rope_scale is not None

    @property
    def v_split(self) -> bool:
        """True in the K/V-split mode (``v`` given)."""
        return self.v is not None

    @property
    def kv_dtype(self) -> np.dtype:
        """bf16 or fp16."""
        return self.kv.dtype


class KvRmsNormRopeCacheOutputs(NamedTuple):
    """What a backend returns (:mod:`ascend_emu.ops._backend`), torch_npu's order.

    Attributes:
        k_cache, ckv_cache: ``args.k_cache`` / ``args.ckv_cache``, written in place.
        k_embed_out: ``[B, 1, S, 64]`` kv dtype (K/V-split: ``[B, 1, S, 192]``, the k rows).
        y_out: ``[B, 1, S, 512]`` kv dtype (K/V-split: ``[B, 1, S, 128]``, v).
    """

    k_cache: np.ndarray
    ckv_cache: np.ndarray
    k_embed_out: np.ndarray
    y_out: np.ndarray


def npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, k_rope_scale=None,
                              c_kv_scale=None, k_rope_offset=None, c_kv_offset=None, v=None, epsilon=1e-5,
                              cache_mode: KvCacheMode = "Norm", is_output_kv: bool = False):
    """RmsNorm + RoPE of MLA's compressed kv, scattered into two caches in place.

    Args:
        kv: ``[B, 1, S, 576]`` bf16 / fp16 (any strides) = ``[512 rms_in | 64 rope_in]``.
        gamma: ``[512]``, kv's dtype.
        cos, sin: ``[B, 1, S, 64]``, kv's dtype, half layout (``cos[i] = cos(theta_{i mod 32})``).
        index: int64. ``Norm``: ``[B, S]`` positions in ``[0, cache_length)``; ``PA`` /
            ``PA_BNSD`` / ``PA_NZ``: ``[B*S]`` global slots ``block * BlockSize + row``;
            ``PA_BLK_BNSD`` / ``PA_BLK_NZ``: ``[B*ceil(S/BlockSize)]`` token offsets of page
            starts (``block_id * BlockSize``; a batch's tokens fill its pages from row 0).
            ``-1`` skips the token (PA_BLK: the page).
        k_cache: C-contiguous, written in place. ``Norm``: ``[B, 1, cache_length, 64]``; PA
            modes: ``[BlockNum, BlockSize, 1, 64]``; NZ modes store
            ``[BlockNum, 64/C0, BlockSize, C0]`` bytes in it (C0 = 16 for bf16 / fp16, 32 for
            int8). dtype: kv's, or int8 with scales.
        ckv_cache: as ``k_cache`` with 512 instead of 64.
        k_rope_scale: fp32 ``[64]``, ``[1, 64]`` or ``[1]`` multiplier; with ``c_kv_scale``
            selects int8 caches.
        c_kv_scale: fp32 ``[512]``, ``[1, 512]`` or ``[1]`` multiplier.
        k_rope_offset, c_kv_offset: must be None (not supported by the kernel).
        v: None (default), or ``[B, 1, S, 128]`` in kv's dtype (any strides): the K/V-split mode
            (module doc). kv is then ``[B, 1, S, 192]``, gamma ``[192]``, k_cache's last dim 192,
            ckv_cache's 128, k_rope_scale ``[192]`` / ``[1, 192]``, c_kv_scale ``[128]`` /
            ``[1, 128]``; quant is accepted in every cache mode.
        epsilon: RmsNorm epsilon, a finite float >= 0 (used as fp32). Default 1e-5.
        cache_mode: ``Norm`` (default), ``PA``, ``PA_BNSD``, ``PA_NZ``, ``PA_BLK_BNSD``,
            ``PA_BLK_NZ``.
        is_output_kv: return the rows in ``k_embed_out`` / ``y_out`` (PA modes only). Default
            False: both are returned zero-filled.

    Returns:
        ``(k_cache, ckv_cache, k_embed_out, y_out)``: the same cache objects, updated in place;
        ``k_embed_out [B, 1, S, 64]`` and ``y_out [B, 1, S, 512]`` in kv's dtype (un-quantized);
        K/V-split: ``k_embed_out [B, 1, S, 192]`` (the k rows) and ``y_out [B, 1, S, 128]`` (v).

    Numerics: kv, gamma, cos, sin widened exactly to fp32; RmsNorm and RoPE in fp32 (no FMA);
    one RNE rounding to the kv dtype for the outputs and the non-quant caches; int8 caches from
    the fp32 values times the scale (fp32 multiply), round-half-even, saturated to [-128, 127].

    Raises:
        ShapeError: a shape, a cache geometry, BlockSize alignment, block count, a
            non-contiguous / read-only cache, or caches sharing memory with each other or with an
            input (``v`` inside ``ckv_cache``, say: it would be read after the scatter).
        DTypeError: a dtype (kv family, int64 index, fp32 scales, cache dtypes per quant mode), a
            non-bool ``is_output_kv``, an ``epsilon`` that is not a finite float >= 0.
        ModeError: unknown cache_mode, offsets given, only one scale given (or int8 caches with
            none), quant (without ``v``) or is_output_kv in Norm mode, ``v`` with N != 1.
        IndexRangeError: an index value outside its cache (or a misaligned PA_BLK page offset).

    Warns:
        DuplicateSlotWarning: two tokens write the same slot.
    """
    args = _normalise(kv, gamma, cos, sin, index, k_cache, ckv_cache, k_rope_scale, c_kv_scale,
                      k_rope_offset, c_kv_offset, v, epsilon, cache_mode, is_output_kv)
    k_in, ckv_in = args.k_cache, args.ckv_cache
    args = write_targets(args, ("k_cache", "ckv_cache"))  # copies in a functional form
    caches = ((args.k_cache, args.k_layout, k_in), (args.ckv_cache, args.ckv_layout, ckv_in))
    checked_mode.will_write(*caches)
    result = get_backend().kv_rmsnorm_rope_cache(args)
    checked_mode.wrote("npu_kv_rmsnorm_rope_cache", args.slots, caches,
                       (("k_embed_out", result.k_embed_out), ("y_out", result.y_out)))
    return tuple(result)


def written_slots(kv, gamma, cos, sin, index, k_cache, ckv_cache, *, k_rope_scale=None, c_kv_scale=None,
                  k_rope_offset=None, c_kv_offset=None, v=None, epsilon=1e-5, cache_mode: KvCacheMode = "Norm",
                  is_output_kv: bool = False) -> np.ndarray:
    """The cache slots :func:`npu_kv_rmsnorm_rope_cache` writes for these arguments, validated as
    the op validates them; nothing is written.

    Args:
        The op's (same shapes, dtypes and modes).

    Returns:
        int64 ``[B*S]``: the destination slot of each token (``block * BlockSize + row``), ``-1``
        for a skipped token. The other rows of a ``_functional`` form's returned caches are
        undefined on the device (torch_npu 2.14 ``npu_kv_rmsnorm_rope_cache_v2_functional``).

    Raises:
        What the op raises for these arguments.
    """
    return _normalise(kv, gamma, cos, sin, index, k_cache, ckv_cache, k_rope_scale, c_kv_scale, k_rope_offset,
                      c_kv_offset, v, epsilon, cache_mode, is_output_kv).slots


# ---------------------------------------------------------------------- validation


@dataclass(frozen=True)
class _Static:
    """What the shape / dtype / mode checks derive from a call signature (see :func:`_normalise`)."""

    mode: str
    batch: int
    seq_len: int
    k_layout: CacheLayout
    ckv_layout: CacheLayout
    epsilon: np.float32


#: Signatures whose static checks passed (:func:`ascend_emu.ops._check.signature`).
_VALIDATED = ValidatedSignatures()


def _normalise(kv, gamma, cos, sin, index, k_cache, ckv_cache, k_rope_scale, c_kv_scale, k_rope_offset,
               c_kv_offset, v, epsilon, cache_mode, is_output_kv) -> KvRmsNormRopeCacheArgs:
    """Validate every argument (nothing is written) and build the arguments object.

    The checks that read only types, shapes, dtypes, flags, modes and scalars run once per call
    signature (:func:`~ascend_emu.ops._check.signature`; a decode loop repeats one); the caches'
    overlap and the index values are checked on every call.
    """
    key, static, known = _VALIDATED.lookup(
        (kv, gamma, cos, sin, index, k_cache, ckv_cache, k_rope_scale, c_kv_scale, k_rope_offset, c_kv_offset, v,
         epsilon, cache_mode, is_output_kv),
        lambda kv, gamma, cos, sin, index, *rest: _check_static(kv, gamma, cos, sin, *rest))  # (index: per call)
    if key is None:  # lists and the like, accepted by the checks above: as arrays from here on
        kv, gamma, cos, sin, k_cache, ckv_cache, index = (
            x if isinstance(x, np.ndarray) else np.asarray(x) for x in (kv, gamma, cos, sin, k_cache, ckv_cache, index))
        k_rope_scale, c_kv_scale, v = (None if x is None else np.asarray(x) for x in (k_rope_scale, c_kv_scale, v))
    check_disjoint((("k_cache", k_cache), ("ckv_cache", ckv_cache)),
                   (("kv", kv), ("gamma", gamma), ("cos", cos), ("sin", sin), ("index", index),
                    ("k_rope_scale", k_rope_scale), ("c_kv_scale", c_kv_scale), ("v", v)))
    mode, b, s = static.mode, static.batch, static.seq_len
    slots = _slots(index, mode, cache_mode, b, s, static.k_layout)
    unique = slots.size < 2
    if not unique:
        live = np.sort(slots[slots >= 0])  # [T'] written slots, sorted
        unique = bool(np.all(live[1:] != live[:-1]))
        if not unique:
            warn_duplicates(slots, "index")
    if not known:
        _VALIDATED.put(key, static)
    return KvRmsNormRopeCacheArgs(
        kv=kv, gamma=gamma, cos=cos, sin=sin, index=index, k_cache=k_cache, ckv_cache=ckv_cache,
        k_layout=static.k_layout, ckv_layout=static.ckv_layout, slots=slots, unique_slots=unique,
        k_rope_scale=k_rope_scale, c_kv_scale=c_kv_scale, v=v, epsilon=static.epsilon, cache_mode=cache_mode,
        is_output_kv=bool(is_output_kv), batch=int(b), seq_len=int(s))


def _check_static(kv, gamma, cos, sin, k_cache, ckv_cache, k_rope_scale, c_kv_scale, k_rope_offset, c_kv_offset,
                  v, epsilon, cache_mode, is_output_kv) -> _Static:
    """Every check except the index values and the memory rule, in the contract's order.

    Raises:
        As :func:`npu_kv_rmsnorm_rope_cache`.
    """
    if not isinstance(cache_mode, str):
        raise arg_error(ModeError, "cache_mode", f"one of {list(CACHE_MODES)}", describe(cache_mode))
    mode = canonical_cache_mode(cache_mode, allowed=CACHE_MODES)
    for name, off in (("k_rope_offset", k_rope_offset), ("c_kv_offset", c_kv_offset)):
        if off is not None:
            raise arg_error(ModeError, name, "None (quant offsets are not supported by npu_kv_rmsnorm_rope_cache;"
                            " only symmetric quant with k_rope_scale / c_kv_scale)", describe(off))
    if not isinstance(is_output_kv, (bool, np.bool_)):
        raise arg_error(DTypeError, "is_output_kv", "a bool", describe(is_output_kv))
    if is_output_kv and cache_mode not in OUTPUT_KV_CACHE_MODES:
        raise arg_error(ModeError, "is_output_kv", f"False in cache_mode {cache_mode} (k_embed_out / y_out are "
                        f"only produced in {list(OUTPUT_KV_CACHE_MODES)})", is_output_kv)
    eps = np.float32(check_float(epsilon, "epsilon", nonnegative=True))

    # ---- token inputs
    v = optional(v, "v")
    split = v is not None
    # row widths: kv, gamma, k_cache, ckv_cache (module doc)
    kv_size, gamma_size, k_size, c_size = ((V_SPLIT_K_SIZE, V_SPLIT_K_SIZE, V_SPLIT_K_SIZE, V_SPLIT_V_SIZE) if split
                                           else (HIDDEN_SIZE, RMS_SIZE, ROPE_SIZE, RMS_SIZE))
    mode_note = " (K/V-split mode: v given)" if split else ""
    kv = required(kv, "kv")
    check_dtype(kv, "kv", KV_DTYPES)
    if split and kv.ndim == 4 and kv.shape[1] not in V_SPLIT_HEADS:
        raise arg_error(ModeError, "kv", f"N = kv.shape[1] in {list(V_SPLIT_HEADS)} in the K/V-split mode (the kernel's "
                        "N = 2, 4, 8 with per-head cos / sin / scales is not emulated)", list(kv.shape))
    check_shape(kv, "kv", [None, 1, None, kv_size], f"[B, 1, S, {kv_size}]{mode_note}")
    b, _, s, _ = kv.shape
    if b < 1 or s < 1:
        raise arg_error(ShapeError, "kv", "B >= 1 and S >= 1", list(kv.shape))
    kv_dtype = dtype_name(kv.dtype)
    gamma = required(gamma, "gamma")
    check_dtype(gamma, "gamma", (kv_dtype,))
    check_shape(gamma, "gamma", [gamma_size], mode_note.strip() if split else "[rms_size]")
    if split:
        check_dtype(v, "v", (kv_dtype,))
        check_shape(v, "v", [b, 1, s, V_SPLIT_V_SIZE], f"[B, 1, S, {V_SPLIT_V_SIZE}] (kv's B, N, S)")
    cos = required(cos, "cos")
    sin = required(sin, "sin")
    for name, x in (("cos", cos), ("sin", sin)):
        check_dtype(x, name, (kv_dtype,))
        check_shape(x, name, [b, 1, s, ROPE_SIZE], "[B, 1, S, rope_size]")

    # ---- quant mode and scales
    k_rope_scale = optional(k_rope_scale, "k_rope_scale")
    c_kv_scale = optional(c_kv_scale, "c_kv_scale")
    if (k_rope_scale is None) != (c_kv_scale is None):
        given, missing = ("k_rope_scale", "c_kv_scale") if c_kv_scale is None else ("c_kv_scale", "k_rope_scale")
        raise arg_error(ModeError, missing, f"a tensor when {given} is given (int8 quant needs both scales)", None)
    quant = k_rope_scale is not None
    quant_modes = V_SPLIT_QUANT_CACHE_MODES if split else QUANT_CACHE_MODES
    if quant and cache_mode not in quant_modes:
        raise arg_error(ModeError, "k_rope_scale / c_kv_scale",
                        f"None in cache_mode {cache_mode} (int8 quant only in {list(quant_modes)})", "tensors")
    if quant:
        _check_scale(k_rope_scale, "k_rope_scale", k_size, per_tensor=not split)
        _check_scale(c_kv_scale, "c_kv_scale", c_size, per_tensor=not split)
    cache_dtype = "int8" if quant else kv_dtype
    why = "(int8 quant: k_rope_scale / c_kv_scale given)" if quant else "(non-quant: the kv dtype)"

    # ---- caches
    k_cache = required(k_cache, "k_cache")
    ckv_cache = required(ckv_cache, "ckv_cache")
    int8_caches = [n for n, c in (("k_cache", k_cache), ("ckv_cache", ckv_cache)) if dtype_name(c.dtype) == "int8"]
    if int8_caches and not quant:
        raise arg_error(ModeError, "k_rope_scale, c_kv_scale",
                        f"fp32 multiplier tensors (int8 {' and '.join(int8_caches)}: int8 caches are quantized with "
                        f"k_rope_scale [{k_size}] and c_kv_scale [{c_size}]{mode_note})", "None")
    layouts = []
    per_batch = cache_mode_traits(mode).sequences == "per_batch"  # Norm: [B, 1, cache_length, D], block b = batch b
    for name, cache, dim in (("k_cache", k_cache, k_size), ("ckv_cache", ckv_cache, c_size)):
        if dtype_name(cache.dtype) != cache_dtype:
            raise arg_error(DTypeError, name, f"dtype {cache_dtype} {why}", dtype_name(cache.dtype))
        if per_batch:
            check_shape(cache, name, [b, 1, None, dim], f"[B, 1, cache_length, {dim}] for cache_mode Norm{mode_note}")
        else:
            check_shape(cache, name, [None, None, 1, dim],
                        f"[block_num, block_size, 1, {dim}] for cache_mode {cache_mode}{mode_note}")
        check_cache(cache, name)
        layouts.append(_layout(mode, cache.shape, cache.dtype.itemsize, name))
    k_layout, ckv_layout = layouts
    if (k_layout.num_blocks, k_layout.block_size) != (ckv_layout.num_blocks, ckv_layout.block_size):
        what = "cache_length" if per_batch else "block_num and block_size"
        raise arg_error(ShapeError, "ckv_cache", f"the same {what} as k_cache {list(k_cache.shape)}",
                        list(ckv_cache.shape))
    if per_batch:
        if k_layout.block_size < s:
            raise arg_error(ShapeError, "k_cache", f"cache_length >= S={s} (cache_mode Norm)", k_layout.block_size)
    else:
        bs, nb = k_layout.block_size, k_layout.num_blocks
        align = BLOCK_ALIGN_BYTES // k_cache.dtype.itemsize
        if bs < 1 or bs % align:
            raise arg_error(ShapeError, "k_cache", f"block_size a positive multiple of {align} for {cache_dtype} "
                            f"caches ({BLOCK_ALIGN_BYTES}-byte aligned)", bs)
        need = -(-s // bs) * b
        if nb < need:
            raise arg_error(ShapeError, "k_cache", f"block_num >= ceil(S/block_size)*B = ceil({s}/{bs})*{b} = {need}",
                            nb)

    return _Static(mode=mode, batch=int(b), seq_len=int(s), k_layout=k_layout, ckv_layout=ckv_layout, epsilon=eps)


@functools.lru_cache(maxsize=64)
def _layout(mode: str, shape: tuple[int, ...], itemsize: int, name: str) -> CacheLayout:
    """:meth:`CacheLayout.from_single_head` (the op's PA caches are ``[block_num, block_size, 1, D]``
    in every mode, PA_BNSD included), memoised (decode loops pass the same caches every step)."""
    return CacheLayout.from_single_head(mode, shape, itemsize, name=name)


def _check_scale(scale: np.ndarray, name: str, dim: int, *, per_tensor: bool) -> None:
    """Validate a static multiplier scale: fp32 ``[dim]``, ``[1, dim]``, or with ``per_tensor`` ``[1]``
    (K/V-split mode: ``[D]`` or ``[1, D]``, the tiling's CheckScaleValid for method mode 1)."""
    check_dtype(scale, name, ("float32",))
    shapes = ((dim,), (1, dim), (1,)) if per_tensor else ((dim,), (1, dim))
    if tuple(scale.shape) not in shapes:
        want = f"[{dim}], [1, {dim}] or [1]" if per_tensor else f"[{dim}] or [1, {dim}] (K/V-split mode)"
        raise arg_error(ShapeError, name, f"shape {want}", list(scale.shape))


def _slots(index, mode: str, cache_mode: str, b: int, s: int, layout: CacheLayout) -> np.ndarray:
    """Validated destination slot per token, int64 ``[B*S]`` (-1 = skip)."""
    index = required(index, "index")
    check_dtype(index, "index", ("int64",))
    kind = layout.index_kind
    if kind == "position":
        check_shape(index, "index", [b, s], "[B, S] for cache_mode Norm")
        return slots_from_positions(index, layout.block_size, name="index")
    if kind == "slot":
        check_shape(index, "index", [b * s], f"[B*S] for cache_mode {cache_mode}")
        return slots_from_cache_index(index, layout.num_rows, name="index")
    pages = -(-s // layout.block_size)
    check_shape(index, "index", [b * pages], f"[B*ceil(S/block_size)] = [{b}*{pages}] for cache_mode {cache_mode}")
    return slots_from_pages(index, [s] * b, layout.block_size, layout.num_blocks, page_offsets=True, name="index")
