"""The ``hw`` backend: the op contract's normalised arguments run by the real torch_npu on an NPU.

Select it with ``ops.set_backend("hw")``, ``with ops.backend("hw"): ...`` or
``ASCEND_EMU_BACKEND=hw``. :data:`BACKEND` implements :class:`ascend_emu.ops._backend.Backend`:
each function takes the same argument object as its ``emu`` counterpart (built and validated by
:mod:`ascend_emu.ops`; it holds the caller's arrays as passed) and returns the same ``...Outputs``
tuple:

- host arrays become NPU tensors (``torch.from_numpy(a).npu()``; bf16 through an int16 view);
- FRACTAL_NZ weights go through the real ``torch_npu.npu_format_cast(w, 29)``;
- caches (and out= tensors) are copied to the device, the op runs, and they are copied back into
  the caller's arrays in place; outputs come back as host arrays.

Targets the torch_npu 2.14 API (argument names of its meta registrations; every argument is
passed by keyword). The module is :func:`runtime`'s real ``torch_npu``, never the
:mod:`ascend_emu.torch_npu` drop-in. Without torch_npu or an NPU each op raises
:class:`~ascend_emu.errors.BackendUnavailable`.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys

import numpy as np

from ..errors import BackendUnavailable
from ..install_hints import TORCH_NPU_HINT as INSTALL_HINT
from ..layouts import FRACTAL_NZ, get_npu_format
from ..mla import D_ROPE, HCKV, TILE_SIZE
from ..quant import TORCH_NPU_DTYPE_CODES
from ..ops.dynamic_quant import DynamicQuantArgs, DynamicQuantOutputs
from ..ops.fused_infer_attention_score import FusedInferAttentionArgs, FusedInferAttentionOutputs
from ..ops.kv_rmsnorm_rope_cache import KvRmsNormRopeCacheArgs, KvRmsNormRopeCacheOutputs
from ..ops.lightning_indexer import LightningIndexerArgs, LightningIndexerOutputs
from ..ops.mla_preprocess import MlaPreprocessArgs, MlaPreprocessOutputs
from ..ops.mla_prolog import MlaPrologArgs, MlaPrologOutputs
from ..ops.paged_cache import SCATTER, PagedCacheArgs, PagedCacheOutputs
from ..ops.quant_lightning_indexer import QuantLightningIndexerArgs, QuantLightningIndexerOutputs
from ..ops.quant_950 import Quant950Args, Quant950Outputs
from ..ops.rope import RopeArgs, RopeOutputs
from ..ops.sparse_flash_attention import SparseFlashAttentionArgs, SparseFlashAttentionOutputs
from ..quant import INT4_PER_INT32
from ..quant.rounding import BF16


def _is_drop_in(mod) -> bool:
    return getattr(mod, "__name__", "").startswith("ascend_emu")


def runtime():
    """``(torch, torch_npu)`` of the real torch_npu with an NPU available.

    The drop-in (``ascend-emu run`` installs it as ``sys.modules["torch_npu"]``) is never used:
    then the real module cannot be imported beside it, and this fails.

    Raises:
        BackendUnavailable: torch_npu is not installed, cannot be imported, is the drop-in in this
            process, or no NPU device is available; the message says what to do.
    """
    mod = sys.modules.get("torch_npu")
    if mod is None or _is_drop_in(mod):
        spec = importlib.machinery.PathFinder.find_spec("torch_npu")
        if mod is not None:
            where = f"the real one at {spec.origin}" if spec is not None else "no real torch_npu is installed"
            raise BackendUnavailable(
                "hw backend: `torch_npu` in this process is the ascend_emu drop-in (ascend-emu run installs it); "
                f"{where}, and it cannot be loaded beside the drop-in: run the script with `python`, not "
                f"`ascend-emu run`" + ("" if spec is not None else f"; to install it: {INSTALL_HINT}"))
        if spec is None:
            raise BackendUnavailable(f"hw backend: torch_npu is not installed; {INSTALL_HINT}")
        try:
            mod = importlib.import_module("torch_npu")
        except Exception as exc:  # noqa: BLE001  (CANN missing, version mismatch, ...)
            raise BackendUnavailable(f"hw backend: `import torch_npu` failed ({type(exc).__name__}: {exc}); "
                                     f"{INSTALL_HINT}") from exc
    import torch

    npu = getattr(torch, "npu", None)
    if npu is None or not npu.is_available():
        raise BackendUnavailable("hw backend: torch_npu is installed but no NPU device is available "
                                 "(torch.npu.is_available() is False): check the driver (npu-smi info) and "
                                 "ASCEND_RT_VISIBLE_DEVICES")
    return torch, mod


# ------------------------------------------------------------------------------ conversions
def to_device(a, torch):
    """Host array -> new NPU tensor (a copy; bf16 through an int16 view; NZArray -> its ND values).
    None stays None."""
    if a is None:
        return None
    a = np.ascontiguousarray(np.asarray(a))
    if not a.flags.writeable:  # torch.from_numpy wants writable memory
        a = a.copy()
    if a.dtype == BF16:
        t = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    elif a.dtype.name in _BYTE_TYPES:  # ml_dtypes float8 (e4m3fn / e5m2 / e8m0fnu): through uint8
        t = torch.from_numpy(a.view(np.uint8)).view(getattr(torch, a.dtype.name))
    else:
        t = torch.from_numpy(a)
    return t.npu()


#: One-byte ml_dtypes types whose torch twin has the same name (Ascend 950 data and scales).
_BYTE_TYPES = ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu")


def to_nz(a, torch, torch_npu, element: str | None = None):
    """Host ND array -> NPU tensor cast to FRACTAL_NZ by the real ``npu_format_cast(t, 29)``;
    Ascend 950 8-bit data (``element`` ``"float8_e4m3fn"``, or ``"hifloat8"`` uint8 codes) with
    its ``customize_dtype`` (and ``input_dtype`` for hifloat8), as the doc's 8-bit rows need."""
    if element is None:
        return torch_npu.npu_format_cast(to_device(a, torch), FRACTAL_NZ)
    code = TORCH_NPU_DTYPE_CODES[element]
    extra = {"input_dtype": code} if element == "hifloat8" else {}
    return torch_npu.npu_format_cast(to_device(a, torch), FRACTAL_NZ, customize_dtype=code, **extra)


def to_host(t) -> np.ndarray:
    """NPU tensor -> new host array (bf16 as ``ml_dtypes.bfloat16``)."""
    import torch

    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BF16).copy()
    name = str(t.dtype).removeprefix("torch.")
    if name in _BYTE_TYPES:
        return t.view(torch.uint8).numpy().view(np.dtype(name)).copy()
    return t.numpy().copy()


def copy_back(t, out: np.ndarray) -> None:
    """Write NPU tensor ``t`` into the caller's array ``out`` in place (same element count)."""
    if t is None or out is None:
        return
    np.copyto(out, to_host(t).reshape(out.shape))


# ------------------------------------------------------------------------------ ops
def mla_prolog(args: MlaPrologArgs) -> MlaPrologOutputs:
    """``npu_mla_prolog`` / ``_v2`` / ``_v3`` (by ``args.version``) on the NPU.

    Args:
        args: :class:`ascend_emu.ops.mla_prolog.MlaPrologArgs`.

    Returns:
        :class:`~ascend_emu.ops.mla_prolog.MlaPrologOutputs`, as the emu backend;
        ``args.kv_cache`` / ``args.kr_cache`` updated in place.

    Raises:
        BackendUnavailable: see :func:`runtime`.
    """
    torch, tnpu = runtime()
    dev = lambda a: to_device(a, torch)  # noqa: E731
    t, n, lead = args.num_tokens, args.num_heads, args.batch_shape
    he, hcq = int(args.token_x.shape[1]), int(args.weight_dq.shape[1])
    kv, kr = dev(args.kv_cache), dev(args.kr_cache)
    el = args.scenario.element  # Ascend 950 8-bit weights: None elsewhere
    kw = dict(token_x=dev(args.token_x.reshape(lead + (he,))), weight_dq=to_nz(args.weight_dq, torch, tnpu, el),
              weight_uq_qr=to_nz(args.weight_uq_qr, torch, tnpu, el), weight_uk=dev(args.weight_uk),
              weight_dkv_kr=to_nz(args.weight_dkv_kr, torch, tnpu, el), rmsnorm_gamma_cq=dev(args.rmsnorm_gamma_cq),
              rmsnorm_gamma_ckv=dev(args.rmsnorm_gamma_ckv), rope_sin=dev(args.rope_sin.reshape(lead + (D_ROPE,))),
              rope_cos=dev(args.rope_cos.reshape(lead + (D_ROPE,))), kv_cache=kv, kr_cache=kr,
              cache_index=dev(args.cache_index), rmsnorm_epsilon_cq=float(args.rmsnorm_epsilon_cq),
              rmsnorm_epsilon_ckv=float(args.rmsnorm_epsilon_ckv), cache_mode=args.cache_mode)
    for name in ("dequant_scale_x", "dequant_scale_w_dq", "dequant_scale_w_uq_qr", "dequant_scale_w_dkv_kr",
                 "quant_scale_ckv", "quant_scale_ckr", "smooth_scales_cq"):
        kw[name] = dev(getattr(args, name))
    if args.version == 3:
        kw.update(actual_seq_len=dev(args.actual_seq_len), k_nope_clip_alpha=dev(args.k_nope_clip_alpha),
                  query_norm_flag=bool(args.query_norm_flag), weight_quant_mode=args.weight_quant_mode,
                  kv_cache_quant_mode=args.kv_cache_quant_mode, query_quant_mode=args.query_quant_mode,
                  ckvkr_repo_mode=args.ckvkr_repo_mode, quant_scale_repo_mode=args.quant_scale_repo_mode,
                  tile_size=args.tile_size, qc_qr_scale=float(args.qc_qr_scale), kc_scale=float(args.kc_scale))
        if args.scenario.element == "hifloat8":  # Ascend 950: uint8 data tagged torch_npu.hifloat8
            hif8 = TORCH_NPU_DTYPE_CODES["hifloat8"]
            kw.update(token_x_dtype=hif8, weight_dq_dtype=hif8, weight_uq_qr_dtype=hif8, weight_dkv_kr_dtype=hif8,
                      kv_cache_dtype=hif8 if args.kv_cache_quant_mode else None)
    fn = {1: tnpu.npu_mla_prolog, 2: tnpu.npu_mla_prolog_v2, 3: tnpu.npu_mla_prolog_v3}[args.version]
    out = fn(**kw)
    if args.version == 3:
        query, query_rope, dq_nope, query_norm, dq_norm = out
    else:
        query, query_rope = out[0], out[1]
        dq_nope = out[4] if args.version == 2 else None
        query_norm = dq_norm = None
    copy_back(kv, args.kv_cache)
    copy_back(kr, args.kr_cache)
    qq = args.query_quant_mode == 1
    has_norm = args.version == 3 and args.query_norm_flag
    return MlaPrologOutputs(
        to_host(query).reshape(t, n, HCKV), to_host(query_rope).reshape(t, n, D_ROPE),
        to_host(dq_nope).reshape(t, n, 1) if qq and dq_nope is not None else None,
        to_host(query_norm).reshape(t, hcq) if has_norm else None,
        to_host(dq_norm).reshape(t, -1) if has_norm and args.weight_quant_mode else None)


def kv_rmsnorm_rope_cache(args: KvRmsNormRopeCacheArgs) -> KvRmsNormRopeCacheOutputs:
    """``npu_kv_rmsnorm_rope_cache`` on the NPU, with the caller's arrays (``index`` included).

    Args:
        args: :class:`ascend_emu.ops.kv_rmsnorm_rope_cache.KvRmsNormRopeCacheArgs`.

    Returns:
        :class:`~ascend_emu.ops.kv_rmsnorm_rope_cache.KvRmsNormRopeCacheOutputs`, as the emu
        backend: the caller's caches updated in place (the same objects), ``k_embed_out``, ``y_out``.

    Raises:
        BackendUnavailable: see :func:`runtime`.
    """
    torch, tnpu = runtime()
    dev = lambda a: to_device(a, torch)  # noqa: E731
    k_cache, ckv_cache = dev(args.k_cache), dev(args.ckv_cache)
    out = tnpu.npu_kv_rmsnorm_rope_cache(
        kv=dev(args.kv), gamma=dev(args.gamma), cos=dev(args.cos), sin=dev(args.sin), index=dev(args.index),
        k_cache=k_cache, ckv_cache=ckv_cache, k_rope_scale=dev(args.k_rope_scale), c_kv_scale=dev(args.c_kv_scale),
        v=dev(args.v), epsilon=float(args.epsilon), cache_mode=args.cache_mode, is_output_kv=bool(args.is_output_kv))
    copy_back(k_cache, args.k_cache)
    copy_back(ckv_cache, args.ckv_cache)
    return KvRmsNormRopeCacheOutputs(args.k_cache, args.ckv_cache, to_host(out[2]), to_host(out[3]))


def mla_preprocess(args: MlaPreprocessArgs) -> MlaPreprocessOutputs:
    """``torch_npu.atb.npu_mla_preprocess`` (out= form) on the NPU, with the caller's arrays:
    weights ``wdqkv`` / ``wuq`` (and an NZ ``wuk``) cast to FRACTAL_NZ as given (logical or
    storage shape), descales, ``[1]`` scales and ``slotmapping`` as passed.

    Args:
        args: :class:`ascend_emu.ops.mla_preprocess.MlaPreprocessArgs`.

    Returns:
        :class:`~ascend_emu.ops.mla_preprocess.MlaPreprocessOutputs`: ``q_out0``, ``kv_cache_out0``,
        ``q_out1``, ``kv_cache_out1`` of ``args``, written in place (as the emu backend).

    Raises:
        BackendUnavailable: see :func:`runtime`.
    """
    torch, tnpu = runtime()
    dev = lambda a: to_device(a, torch)  # noqa: E731
    kv, rope = dev(args.kv_cache_out0), dev(args.kv_cache_out1)
    q0, q1 = dev(args.q_out0), dev(args.q_out1)
    wuk = to_nz(args.wuk, torch, tnpu) if get_npu_format(args.wuk) == FRACTAL_NZ else dev(args.wuk)
    tnpu.atb.npu_mla_preprocess(
        input=dev(args.input), gamma0=dev(args.gamma0), beta0=dev(args.beta0),
        wdqkv=to_nz(args.wdqkv, torch, tnpu), descale0=dev(args.descale0), gamma1=dev(args.gamma1),
        beta1=dev(args.beta1), wuq=to_nz(args.wuq, torch, tnpu), descale1=dev(args.descale1),
        gamma2=dev(args.gamma2), cos=dev(args.cos), sin=dev(args.sin), wuk=wuk, kv_cache=kv, kv_cache_rope=rope,
        slotmapping=dev(args.slotmapping), quant_scale0=dev(args.quant_scale0),
        quant_offset0=dev(args.quant_offset0), bias0=dev(args.bias0), quant_scale1=dev(args.quant_scale1),
        quant_offset1=dev(args.quant_offset1), bias1=dev(args.bias1), ctkv_scale=dev(args.ctkv_scale),
        q_nope_scale=dev(args.q_nope_scale), cache_mode=args.cache_mode, quant_mode=args.quant_mode, q_out0=q0,
        kv_cache_out0=kv, q_out1=q1, kv_cache_out1=rope)
    copy_back(q0, args.q_out0)
    copy_back(q1, args.q_out1)
    copy_back(kv, args.kv_cache_out0)
    copy_back(rope, args.kv_cache_out1)
    return MlaPreprocessOutputs(args.q_out0, args.kv_cache_out0, args.q_out1, args.kv_cache_out1)


def _on_device(kwargs: dict, torch) -> dict:
    """``kwargs`` with every host array as a new NPU tensor, one per array (the KV-quant op's
    ``value`` may be ``key`` itself: one device tensor for both)."""
    seen: dict[int, object] = {}
    out = {}
    for k, v in kwargs.items():
        if isinstance(v, np.ndarray):
            if id(v) not in seen:
                seen[id(v)] = to_device(v, torch)
            v = seen[id(v)]
        out[k] = v
    return out


def sparse_flash_attention(args: SparseFlashAttentionArgs) -> SparseFlashAttentionOutputs:
    """``npu_sparse_flash_attention`` or ``npu_kv_quant_sparse_flash_attention`` (by
    ``args.quant``) on the NPU, with the caller's arrays.

    Args:
        args: :class:`ascend_emu.ops.sparse_flash_attention.SparseFlashAttentionArgs`.

    Returns:
        :class:`~ascend_emu.ops.sparse_flash_attention.SparseFlashAttentionOutputs`, as the emu
        backend (softmax_max / softmax_sum fp32 ``[0]`` without ``return_softmax_lse``, always for
        the KV-quant op, which returns only attention_out).

    Raises:
        BackendUnavailable: see :func:`runtime`.
    """
    from ..ops import sparse_flash_attention as sfa

    torch, tnpu = runtime()
    kw = dict(query=args.query, key=args.key, value=args.value, sparse_indices=args.sparse_indices,
              scale_value=float(args.scale_value), block_table=args.block_table,
              actual_seq_lengths_query=args.actual_seq_lengths_query,
              actual_seq_lengths_kv=args.actual_seq_lengths_kv, sparse_block_size=args.sparse_block_size,
              layout_query=args.layout_query, layout_kv=args.layout_kv, sparse_mode=args.sparse_mode,
              attention_mode=sfa.ATTENTION_MODE)
    empty = np.empty(0, dtype=np.float32)  # [0]
    if args.quant:
        if args.nope_element == "hifloat8":  # HiF8 codes travel as uint8, tagged by the dtype code
            kw.update(key_dtype=sfa.HIFLOAT8_CODE, value_dtype=sfa.HIFLOAT8_CODE)
        if args.sinks is not None:
            kw.update(sinks=args.sinks)
        out = tnpu.npu_kv_quant_sparse_flash_attention(**_on_device(kw, torch), key_quant_mode=sfa.KEY_QUANT_MODE,
                                                       value_quant_mode=sfa.VALUE_QUANT_MODE,
                                                       quant_scale_repo_mode=sfa.QUANT_SCALE_REPO_MODE,
                                                       tile_size=TILE_SIZE, rope_head_dim=D_ROPE)
        return SparseFlashAttentionOutputs(to_host(out).reshape(args.out_shape), empty, empty.copy())
    kw.update(query_rope=args.query_rope, key_rope=args.key_rope, return_softmax_lse=args.return_softmax_lse)
    out = tnpu.npu_sparse_flash_attention(**_on_device(kw, torch))
    if not args.return_softmax_lse:
        return SparseFlashAttentionOutputs(to_host(out[0]).reshape(args.out_shape), empty, empty.copy())
    return SparseFlashAttentionOutputs(to_host(out[0]).reshape(args.out_shape), to_host(out[1]), to_host(out[2]))


def lightning_indexer(args: LightningIndexerArgs) -> LightningIndexerOutputs:
    """``npu_lightning_indexer`` on the NPU, with the caller's arrays.

    Args:
        args: :class:`ascend_emu.ops.lightning_indexer.LightningIndexerArgs`.

    Returns:
        :class:`~ascend_emu.ops.lightning_indexer.LightningIndexerOutputs`, as the emu backend
        (sparse_values ``[0]`` without ``return_value``).

    Raises:
        BackendUnavailable: see :func:`runtime`.
    """
    from ..ops.lightning_indexer import EMPTY_VALUE_SHAPE

    torch, tnpu = runtime()
    idx, val = tnpu.npu_lightning_indexer(**_on_device(dict(
        query=args.query, key=args.key, weights=args.weights, actual_seq_lengths_query=args.actual_seq_lengths_query,
        actual_seq_lengths_key=args.actual_seq_lengths_key, block_table=args.block_table,
        layout_query=args.layout_query, layout_key=args.layout_key, sparse_count=args.sparse_count,
        sparse_mode=args.sparse_mode, return_value=args.return_value), torch))
    values = to_host(val).reshape(args.out_shape if args.return_value else EMPTY_VALUE_SHAPE)
    return LightningIndexerOutputs(to_host(idx).reshape(args.out_shape), values)


def rope(args: RopeArgs) -> RopeOutputs:
    """``npu_interleave_rope`` / ``npu_rotary_mul`` on the NPU, with the caller's arrays (the
    rotary_mul input passed by position: the schema's ``self``).

    Raises:
        BackendUnavailable: see :func:`runtime`.
    """
    torch, tnpu = runtime()
    x, cos, sin = (to_device(a, torch) for a in (args.x, args.cos, args.sin))
    if args.op == "npu_interleave_rope":
        y = tnpu.npu_interleave_rope(x, cos, sin)
    else:
        rotate = None if args.rotate is None else to_device(args.rotate, torch)
        y = tnpu.npu_rotary_mul(x, cos, sin, rotary_mode=args.mode, rotate=rotate)
    return RopeOutputs(to_host(y).reshape(args.x.shape))


def paged_cache(args: PagedCacheArgs) -> PagedCacheOutputs:
    """``npu_scatter_pa_kv_cache`` / ``npu_gather_pa_kv_cache`` on the NPU, with the caller's
    arrays: PA_NZ caches cast to FRACTAL_NZ by the real ``npu_format_cast`` (a cache whose last
    dim is C0 holds the same bytes either way), the written arrays copied back in place.

    Raises:
        BackendUnavailable: see :func:`runtime`.
    """
    torch, tnpu = runtime()
    dev = lambda a: to_device(a, torch)  # noqa: E731
    cache = (lambda a: to_nz(a, torch, tnpu)) if args.k_layout.nz else dev
    key_cache, value_cache = cache(args.key_cache), cache(args.value_cache)
    key, value = dev(args.key), dev(args.value)
    if args.op == SCATTER:
        tnpu.npu_scatter_pa_kv_cache(key, value, key_cache, value_cache, dev(args.slot_mapping),
                                     cache_mode=args.cache_mode)
        copy_back(key_cache, args.key_cache)
        copy_back(value_cache, args.value_cache)
    else:
        tnpu.npu_gather_pa_kv_cache(key_cache, value_cache, dev(args.block_tables), dev(args.seq_lens), key, value,
                                    seq_offset=dev(args.seq_offset), is_seq_lens_cumsum=args.is_seq_lens_cumsum)
        copy_back(key, args.key)
        copy_back(value, args.value)
    return PagedCacheOutputs(*args.written)


def quant(args: DynamicQuantArgs) -> DynamicQuantOutputs:
    """``npu_dynamic_quant`` on the NPU, with the caller's arrays (``dst_type`` as the doc's
    torch dtype: None for int8, ``torch.quint4x2`` for int4).

    Raises:
        BackendUnavailable: see :func:`runtime`.
    """
    torch, tnpu = runtime()
    x, smooth, groups = (to_device(a, torch) for a in (args.x, args.smooth_scales, args.group_index))
    op = tnpu.npu_dynamic_quant_asymmetric if args.asymmetric else tnpu.npu_dynamic_quant
    outs = op(x, smooth_scales=smooth, group_index=groups, dst_type=torch.quint4x2 if args.dst == "int4" else None,
              quant_mode=args.mode)
    h = args.x.shape[-1]
    y_shape = (*args.x.shape[:-1], h // INT4_PER_INT32) if args.dst == "int4" else args.x.shape
    scale_shape = (*args.x.shape[:-2], h) if args.mode == "perchannel" else args.x.shape[:-1]
    scale = to_host(outs[1]).reshape(scale_shape)
    offset = to_host(outs[2]).reshape(scale_shape) if args.asymmetric else None
    return DynamicQuantOutputs(to_host(outs[0]).reshape(y_shape), scale, offset)


def quant_lightning_indexer(args: QuantLightningIndexerArgs) -> QuantLightningIndexerOutputs:
    """``npu_quant_lightning_indexer`` on the NPU, with the caller's arrays (quant modes 0; the
    hifloat8 tags for HiF8 codes, none otherwise: the contract takes no other values).

    Raises:
        BackendUnavailable: see :func:`runtime`.
    """
    torch, tnpu = runtime()
    ia = args.indexer
    idx = tnpu.npu_quant_lightning_indexer(**_on_device(dict(
        query=ia.query, key=ia.key, weights=ia.weights, query_dequant_scale=args.query_dequant_scale,
        key_dequant_scale=args.key_dequant_scale, query_quant_mode=0, key_quant_mode=0,
        actual_seq_lengths_query=ia.actual_seq_lengths_query, actual_seq_lengths_key=ia.actual_seq_lengths_key,
        block_table=ia.block_table, layout_query=ia.layout_query, layout_key=ia.layout_key,
        sparse_count=ia.sparse_count, sparse_mode=ia.sparse_mode,
        **(dict(query_dtype=290, key_dtype=290) if args.element == "hifloat8" else {})), torch))
    return QuantLightningIndexerOutputs(to_host(idx).reshape(ia.out_shape))


def _int_list(x):
    """A SymInt[] length argument as torch_npu takes it: a list of ints (None stays None)."""
    return None if x is None else [int(v) for v in np.asarray(x).reshape(-1)]


def fused_infer_attention_score(args: FusedInferAttentionArgs) -> FusedInferAttentionOutputs:
    """``npu_fused_infer_attention_score`` / ``_v2`` (by ``args.op``) on the NPU, with the caller's
    arrays and lengths (as lists of ints).

    Returns:
        :class:`~ascend_emu.ops.fused_infer_attention_score.FusedInferAttentionOutputs`, as the
        emu backend (softmax_lse fp32 ``[0]`` without the lse flag).

    Raises:
        BackendUnavailable: see :func:`runtime`.
    """
    torch, tnpu = runtime()
    tensors = _on_device(dict(query=args.query, key=args.key, value=args.value, query_rope=args.query_rope,
                              key_rope=args.key_rope, atten_mask=args.atten_mask, block_table=args.block_table),
                         torch)
    common = dict(input_layout=args.input_layout, num_key_value_heads=args.num_kv_heads,
                  sparse_mode=args.sparse_mode, block_size=args.block_size, pre_tokens=args.pre_tokens,
                  next_tokens=args.next_tokens)
    if args.kv_antiquant_given:  # the caller's kv antiquant scales / offsets, by the op's own names
        common.update(_on_device(dict(args.kv_antiquant_given), torch))
    if args.quant_given:  # the caller's int8 (full / output) quant scales and offsets, by the op's own names
        common.update(_on_device(dict(args.quant_given), torch))
    q_lens, kv_lens = _int_list(args.actual_seq_lengths), _int_list(args.actual_seq_lengths_kv)
    if args.op == "npu_fused_infer_attention_score":
        out, lse = tnpu.npu_fused_infer_attention_score(
            **tensors, **common, actual_seq_lengths=q_lens, actual_seq_lengths_kv=kv_lens, num_heads=args.num_heads,
            scale=float(args.scale), softmax_lse_flag=args.softmax_lse_flag)
    else:
        c8 = {}
        if args.quantised:  # the C8 decode: per-token-head query scales, per-tensor kv scales
            c8 = _on_device(dict(dequant_scale_query=args.dequant_scale_query, dequant_scale_key=args.dequant_scale_key,
                                 dequant_scale_value=args.dequant_scale_value), torch)
            c8.update(query_quant_mode=args.query_quant_mode, key_quant_mode=0, value_quant_mode=0)
        if args.sink is not None:  # the caller's bf16 [N] learnable_sink
            c8.update(_on_device(dict(learnable_sink=args.sink.astype(BF16)), torch))
        if args.quant_out is not None and args.quant_out_type != "int8":  # out_dtype: an Ascend 950 8-bit float
            c8.update(out_dtype=TORCH_NPU_DTYPE_CODES[args.quant_out_type])
        out, lse = tnpu.npu_fused_infer_attention_score_v2(
            **tensors, **common, **c8, actual_seq_qlen=q_lens, actual_seq_kvlen=kv_lens,
            num_query_heads=args.num_heads, softmax_scale=float(args.scale), return_softmax_lse=args.softmax_lse_flag)
    lse_host = to_host(lse).reshape(args.lse_shape) if args.softmax_lse_flag else np.empty(0, dtype=np.float32)
    if out.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):  # back as its bytes, viewed as ml_dtypes FP8
        return FusedInferAttentionOutputs(to_host(out.view(torch.uint8)).view(args.out_dtype).reshape(args.out_shape),
                                          lse_host)
    return FusedInferAttentionOutputs(to_host(out).reshape(args.out_shape), lse_host)


def quant_950(args: Quant950Args) -> Quant950Outputs:
    """``npu_dtype_cast`` / ``npu_dynamic_mx_quant`` on the NPU, with the caller's codes (an FP8
    array crosses as its uint8 bytes viewed as the torch FP8 dtype; FP8 outputs come back as
    ml_dtypes arrays, HiF8 codes and E8M0 scales as uint8).

    Raises:
        BackendUnavailable: see :func:`runtime`.
    """
    torch, tnpu = runtime()
    from ..quant import FP8_DTYPES

    x = args.x
    if x.dtype in FP8_DTYPES.values():
        t = to_device(np.ascontiguousarray(x).view(np.uint8), torch).view(getattr(torch, x.dtype.name))
    else:
        t = to_device(x, torch)

    def host(out):
        if out.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            return to_host(out.view(torch.uint8)).view(FP8_DTYPES[str(out.dtype)[len("torch."):]])
        return to_host(out)

    if args.op == "npu_dtype_cast":
        kw = {} if args.input_code is None else {"input_dtype": args.input_code}
        shape = (*x.shape[:-1], x.shape[-1] // 2) if args.dst == "int4" else x.shape
        return Quant950Outputs(host(tnpu.npu_dtype_cast(t, args.dtype_code, **kw)).reshape(shape))
    y, scale = tnpu.npu_dynamic_mx_quant(t, axis=args.axis, round_mode="rint", dst_type=args.dtype_code,
                                         block_size=args.block_size, scale_alg=args.scale_alg)
    return Quant950Outputs(host(y).reshape(x.shape), host(scale))


def _not_in_torch_npu(family: str):
    """The hw backend's method for a DeepSeek-V4 family whose ops are not torch_npu's (they live
    in vllm-ascend's ``torch.ops._C_ascend`` and the recipes' ``torch.ops.custom`` libraries):
    raises :class:`~ascend_emu.errors.BackendUnavailable` saying so."""

    def unavailable(args):
        raise BackendUnavailable(f"hw backend: {family} is not a torch_npu op (it is in vllm-ascend's "
                                 f"torch.ops._C_ascend / cann-recipes-infer's torch.ops.custom); this backend "
                                 f"runs torch_npu only: use the emu backend")

    unavailable.__name__ = family
    return unavailable


class HwBackend:
    """The ``hw`` backend (:class:`ascend_emu.ops._backend.Backend`): the functions above."""

    name = "hw"
    mla_prolog = staticmethod(mla_prolog)
    mla_preprocess = staticmethod(mla_preprocess)
    kv_rmsnorm_rope_cache = staticmethod(kv_rmsnorm_rope_cache)
    sparse_flash_attention = staticmethod(sparse_flash_attention)
    lightning_indexer = staticmethod(lightning_indexer)
    rope = staticmethod(rope)
    paged_cache = staticmethod(paged_cache)
    quant = staticmethod(quant)
    quant_lightning_indexer = staticmethod(quant_lightning_indexer)
    fused_infer_attention_score = staticmethod(fused_infer_attention_score)
    quant_950 = staticmethod(quant_950)
    rms_norm_dynamic_quant = staticmethod(_not_in_torch_npu("npu_rms_norm_dynamic_quant"))
    inplace_partial_rotary_mul = staticmethod(_not_in_torch_npu("inplace_partial_rotary_mul"))
    compressor_metadata = staticmethod(_not_in_torch_npu("compressor_metadata"))
    # DeepSeek-V4 mHC: not torch_npu ops
    hc_pre = staticmethod(_not_in_torch_npu("hc_pre"))
    hc_post = staticmethod(_not_in_torch_npu("hc_post"))
    sparse_attn_sharedkv = staticmethod(_not_in_torch_npu("npu_sparse_attn_sharedkv / npu_kv_quant_sparse_attn_sharedkv"))
    vllm_quant_lightning_indexer = staticmethod(_not_in_torch_npu("npu_vllm_quant_lightning_indexer"))
    kv_compress_epilog = staticmethod(_not_in_torch_npu("kv_compress_epilog"))
    indexer_compress_epilog = staticmethod(_not_in_torch_npu("indexer_compress_epilog"))
    scatter_nd_update = staticmethod(_not_in_torch_npu("npu_scatter_nd_update_v2"))
    compressor = staticmethod(_not_in_torch_npu("compressor"))


#: The backend object :func:`ascend_emu.ops.get_backend` returns for ``hw``.
BACKEND = HwBackend()


def __getattr__(name: str):
    """An op family this version of the hw backend does not implement: say so by name."""
    if name.startswith("__"):
        raise AttributeError(name)
    implemented = ", ".join(n for n in vars(HwBackend) if not n.startswith("_") and n != "name")
    raise NotImplementedError(f"hw backend: no implementation of {name!r} in this version of ascend_emu "
                              f"(implemented: {implemented}); use the emu backend")
