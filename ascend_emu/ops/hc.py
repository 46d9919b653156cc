"""DeepSeek-V4's mHC (manifold-constrained hyper-connections) ops on NumPy arrays: the contract.

The residual stream of DeepSeek-V4 is ``hc_mult`` (4) copies of the hidden state, ``x [T, 4, D]``.
``hc_pre`` mixes them down to one stream for a sublayer, ``hc_post`` expands the sublayer's
output back (docs/ops.md "mHC"). The ops and where their schemas live:

- ``npu_hc_pre_v2`` (vllm-ascend ``torch.ops._C_ascend``, all arguments positional) and
  ``npu_hc_pre_v3`` (its later form: ``pre_mix`` replaces the weights of ``y``, and ``pre`` is a
  fourth output): the fused kernel ``aclnnHcPre``, whatever T is;
- ``npu_hc_pre`` (cann-recipes-infer ``torch.ops.custom``, keyword-only with defaults): the fused
  kernel for T <= 128 with T % 16 == 0, else the decomposed chain :func:`npu_hc_pre_inv_rms`,
  an fp32 ``linear`` and :func:`npu_hc_pre_sinkhorn` (the op doc's rule, :func:`fused_route`);
- ``npu_hc_post`` (both namespaces): ``out[i] = post[i] * x + sum_j comb[j, i] * residual[j]``.

What hc_pre computes, per token (K = hc_mult * D, mixes split 4 / 4 / 16):

- ``inv_rms = 1 / sqrt(sum(x^2) * fp32(1/K) + norm_eps)``;
- ``mixes = (HF32(x) @ HF32(hc_fn)^T)`` with HF32 = fp32 with its low 13 mantissa bits cleared
  (:func:`ascend_emu.quant.rounding.hf32_truncate`); the decomposed chain uses fp32 operands;
- ``pre = sigmoid(mixes[:4] * inv_rms * hc_scale[0] + hc_base[:4]) + hc_eps``;
  ``post = 2 * sigmoid(mixes[4:8] * inv_rms * hc_scale[1] + hc_base[4:8])``;
- ``comb = softmax_rows(mixes[8:] * inv_rms * hc_scale[2] + hc_base[8:]) + hc_eps``, then a
  column normalisation and ``hc_sinkhorn_iters - 1`` (row, column) normalisations, each
  ``v / (sum + hc_eps)``;
- ``y = sum_j w[j] * x[j]`` in fp32, rounded once to bf16, with ``w = pre`` (``pre_mix`` when
  v3 is given one).

Checks (stricter than the kernels where their docs are stricter, never looser): x bf16
``[T, hc, D]`` or ``[B, S, hc, D]`` with hc = ``hc_mult`` = 4 and D 4096 or 7168 (both adapters'
checks); hc_fn fp32 ``[24, hc * D]``; hc_scale fp32 ``[3]``; hc_base fp32 ``[24]``; every array
C-contiguous (the docs: non-contiguous tensors are not supported); ``hc_sinkhorn_iters`` in
1 .. :data:`MAX_SINKHORN_ITERS` (the docs fix it at 20; the kernel runs ``iters - 1`` loops);
epsilons finite in fp32 and >= 0 (the recipes' adapter: ``epsilon >= 0``); at most
:data:`MAX_TOKENS` tokens. No SoC gate: the kernels' op definitions list ascend910b, ascend910_93
and ascend950 (the recipes' docs list A3 and 950).

Sources: hicann/cann-recipes-infer ``ops/ascendc/docs/custom-npu_hc_pre*.md``,
``custom-npu_hc_post.md``, ``torch_ops_extension/custom_ops/csrc/npu_hc_pre.cpp``;
vllm-project/vllm-ascend ``csrc/torch_binding.cpp`` (checks, schemas), ``csrc/moe/hc_pre/``,
``csrc/moe/hc_post/`` (kernels), the official CPU golden
``tests/e2e/nightly/single_node/ops/singlecard_ops/test_npu_hc_pre.py`` (docs/sources.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..errors import ModeError, ShapeError, arg_error, describe
from ._backend import get_backend
from ._check import check_dtype, check_float, check_int, dtype_name, required

#: The only hc_mult the kernels take (both adapters check it).
HC_MULT = 4
#: Rows of hc_fn / hc_base: 2 * hc_mult + hc_mult ** 2 (pre, post, comb).
HC_MIX = 2 * HC_MULT + HC_MULT * HC_MULT
#: Hidden sizes the adapters accept (DeepSeek-V4-Flash 4096; the extended 7168).
HC_D = (4096, 7168)
#: hc_scale's length (pre, post, comb).
HC_SCALE_LEN = 3
#: Bound on ``hc_sinkhorn_iters`` (the docs fix it at 20): a call's cost stays bounded.
MAX_SINKHORN_ITERS = 100
#: Bound on the token count T (B * S), checked before anything is allocated (the recipes' 950
#: regression test goes to 64000).
MAX_TOKENS = 65536
#: custom.npu_hc_pre runs the fused kernel for T <= this and T % :data:`FUSED_T_ALIGN` == 0,
#: else the decomposed chain (custom-npu_hc_pre.md, constraints).
FUSED_MAX_T = 128
FUSED_T_ALIGN = 16
#: hc_post's x / residual dtypes, and its post / comb dtypes (custom-npu_hc_post.md).
HC_POST_DTYPES = ("bfloat16", "float16", "float32")
#: npu_hc_pre_inv_rms's x dtypes: bf16 (doc) and fp32 (the recipes' example test passes fp32).
INV_RMS_DTYPES = ("bfloat16", "float32")
#: hc_post's x layouts: ``'any'`` ([T, D] or [B, S, D], the recipes' doc) or ``'BSD'`` (vllm-ascend's
#: adapter checks a 3-D x).
HC_POST_LAYOUTS = ("any", "BSD")


@dataclass(frozen=True)
class HcPreArgs:
    """Normalised, validated arguments of the hc_pre family (the arrays as passed).

    Attributes:
        stage: ``'fused'`` (aclnnHcPre: HF32 mixes), ``'composite'`` (inv_rms, an fp32 linear,
            sinkhorn), ``'sinkhorn'`` (mixes and inv_rms given) or ``'inv_rms'``.
        x: bf16 ``[*lead, hc, D]`` (fp32 too for ``'inv_rms'``).
        lead: the token dims (``(T,)`` or ``(B, S)``).
        hc_fn: fp32 ``[24, hc * D]`` (fused / composite), else None.
        mixes: fp32 ``[*lead, 24]`` (sinkhorn), else None.
        inv_rms: fp32 ``[*lead, 1]`` (sinkhorn), else None.
        hc_scale, hc_base: fp32 ``[3]``, ``[24]`` (None for inv_rms).
        pre_mix: fp32 ``[*lead, hc]`` weights of y (v3), else None.
        hc_mult, hc_sinkhorn_iters: ints as checked.
        norm_eps, hc_eps: Python floats (the kernels use them as fp32).
    """

    stage: str
    x: np.ndarray
    lead: tuple
    hc_fn: np.ndarray | None = None
    mixes: np.ndarray | None = None
    inv_rms: np.ndarray | None = None
    hc_scale: np.ndarray | None = None
    hc_base: np.ndarray | None = None
    pre_mix: np.ndarray | None = None
    hc_mult: int = HC_MULT
    hc_sinkhorn_iters: int = 20
    norm_eps: float = 1e-6
    hc_eps: float = 1e-6


class HcPreOutputs(NamedTuple):
    """What a backend returns for the hc_pre family; an output the stage does not produce is None.

    Attributes:
        y: bf16 ``[*lead, D]``.
        post: fp32 ``[*lead, hc]``.
        comb_frag: fp32 ``[*lead, hc, hc]``.
        pre: fp32 ``[*lead, hc]`` (the sigmoid gates, also when pre_mix weighted y).
        inv_rms: fp32 ``[*lead, 1]`` (stage ``'inv_rms'``).
    """

    y: np.ndarray | None
    post: np.ndarray | None
    comb_frag: np.ndarray | None
    pre: np.ndarray | None
    inv_rms: np.ndarray | None = None


@dataclass(frozen=True)
class HcPostArgs:
    """Normalised, validated arguments of ``npu_hc_post`` (the arrays as passed).

    Attributes:
        x: ``[*lead, D]``; residual: ``[*lead, hc, D]`` of x's dtype.
        post: ``[*lead, hc]``; comb: ``[*lead, hc, hc]`` of post's dtype.
    """

    x: np.ndarray
    residual: np.ndarray
    post: np.ndarray
    comb: np.ndarray


class HcPostOutputs(NamedTuple):
    """What a backend returns for ``npu_hc_post``.

    Attributes:
        out: residual's shape, x's dtype.
    """

    out: np.ndarray


def _array(a, name: str, dtypes: tuple) -> np.ndarray:
    a = required(a, name)
    check_dtype(a, name, dtypes)
    if not a.flags.c_contiguous:
        raise arg_error(ShapeError, name, "a C-contiguous array (non-contiguous tensors are not supported)",
                        f"strides {a.strides}")
    return a


def _int(value, name: str, lo: int, hi: int, why: str) -> int:
    v = check_int(value, name)
    if not lo <= v <= hi:
        raise arg_error(ModeError, name, why, describe(value))
    return v


def _scalars(hc_mult, hc_sinkhorn_iters, eps: dict) -> tuple[int, int, dict]:
    """The int and float arguments, checked before any tensor is looked at."""
    mult = _int(hc_mult, "hc_mult", HC_MULT, HC_MULT, f"{HC_MULT} (the only value the kernels take)")
    iters = _int(hc_sinkhorn_iters, "hc_sinkhorn_iters", 1, MAX_SINKHORN_ITERS,
                 f"an int in 1..{MAX_SINKHORN_ITERS} (the docs fix it at 20)")
    return mult, iters, {name: check_float(v, name, nonnegative=True) for name, v in eps.items()}


def _x(x, name: str = "x", dtypes: tuple = ("bfloat16",)) -> tuple[np.ndarray, tuple, int]:
    """x ``[T, hc, D]`` / ``[B, S, hc, D]``: the array, its token dims and D."""
    x = _array(x, name, dtypes)
    if x.ndim not in (3, 4):
        raise arg_error(ShapeError, name, "a 3-D [T, hc, D] or 4-D [B, S, hc, D] array", f"shape {list(x.shape)}")
    lead, hc, d = x.shape[:-2], x.shape[-2], x.shape[-1]
    if hc != HC_MULT or d not in HC_D or min(lead) < 1:
        raise arg_error(ShapeError, name, f"hc (dim {x.ndim - 2}) = {HC_MULT}, D (last dim) one of {HC_D} and "
                        f"every token dim >= 1", f"shape {list(x.shape)}")
    tokens = math.prod(lead)
    if tokens > MAX_TOKENS:
        raise arg_error(ShapeError, name, f"at most {MAX_TOKENS} tokens (T = B * S)", f"shape {list(x.shape)}")
    return x, tuple(int(n) for n in lead), int(d)


def _shaped(a, name: str, shape: tuple, what: str) -> np.ndarray:
    a = _array(a, name, ("float32",))
    if a.shape != shape:
        raise arg_error(ShapeError, name, f"shape {list(shape)} ({what})", f"shape {list(a.shape)}")
    return a


def _weights(hc_fn, hc_scale, hc_base, d: int) -> tuple:
    hc_fn = _shaped(hc_fn, "hc_fn", (HC_MIX, HC_MULT * d), f"[{HC_MIX}, hc * D]") if hc_fn is not None else None
    return (hc_fn, _shaped(hc_scale, "hc_scale", (HC_SCALE_LEN,), "[3]: pre, post, comb"),
            _shaped(hc_base, "hc_base", (HC_MIX,), f"[{HC_MIX}]"))


def fused_route(tokens: int) -> bool:
    """Whether ``custom.npu_hc_pre`` runs the fused kernel for ``tokens`` (T = B * S): T <= 128
    and T % 16 == 0 (custom-npu_hc_pre.md); else the decomposed chain. The recipes' adapter
    source at one commit routes differently (every T fused on A2 / A3; on the 950 fused for
    T <= 512 or T % 8192 == 0): the doc's rule is the one emulated (docs/ops.md "mHC")."""
    return tokens <= FUSED_MAX_T and tokens % FUSED_T_ALIGN == 0


def _hc_pre(x, hc_fn, hc_scale, hc_base, pre_mix, hc_mult, hc_sinkhorn_iters, norm_eps, hc_eps,
            stage: str) -> HcPreOutputs:
    mult, iters, eps = _scalars(hc_mult, hc_sinkhorn_iters, {"norm_eps": norm_eps, "hc_eps": hc_eps})
    x, lead, d = _x(x)
    hc_fn = required(hc_fn, "hc_fn")
    hc_fn, hc_scale, hc_base = _weights(hc_fn, hc_scale, hc_base, d)
    if pre_mix is not None:
        pre_mix = _shaped(pre_mix, "pre_mix", (*lead, HC_MULT), "x's shape without D")
    if stage == "route":
        stage = "fused" if fused_route(math.prod(lead)) else "composite"
    return get_backend().hc_pre(HcPreArgs(stage, x, lead, hc_fn=hc_fn, hc_scale=hc_scale, hc_base=hc_base,
                                          pre_mix=pre_mix, hc_mult=mult, hc_sinkhorn_iters=iters, **eps))


def npu_hc_pre_v2(x, hc_fn, hc_scale, hc_base, hc_mult, hc_sinkhorn_iters, norm_eps, hc_eps) -> tuple:
    """``torch.ops._C_ascend.npu_hc_pre_v2``: the fused hc_pre kernel (module doc), any T.

    Args:
        x: bf16 ``[T, 4, D]`` or ``[B, S, 4, D]``, D 4096 or 7168.
        hc_fn: fp32 ``[24, 4 * D]``.
        hc_scale: fp32 ``[3]``; hc_base: fp32 ``[24]``.
        hc_mult: 4. hc_sinkhorn_iters: 1..100 (20 in DeepSeek-V4).
        norm_eps: the inv-RMS epsilon; hc_eps: the gate / Sinkhorn epsilon (used as fp32, >= 0).

    Returns:
        ``(y bf16 [*lead, D], post fp32 [*lead, 4], comb_frag fp32 [*lead, 4, 4])``.

    Raises:
        ShapeError / DTypeError / ModeError: naming the argument (module doc's checks).

    Source: vllm-ascend ``csrc/torch_binding.cpp`` (``npu_hc_pre_v2``, its checks), ``csrc/moe/hc_pre/``.
    """
    out = _hc_pre(x, hc_fn, hc_scale, hc_base, None, hc_mult, hc_sinkhorn_iters, norm_eps, hc_eps, "fused")
    return out.y, out.post, out.comb_frag


def npu_hc_pre_v3(x, hc_fn, hc_scale, hc_base, pre_mix=None, *, hc_mult=4, hc_sinkhorn_iters=20,
                  norm_eps=1e-6, hc_eps=1e-6) -> tuple:
    """``torch.ops._C_ascend.npu_hc_pre_v3``: :func:`npu_hc_pre_v2` with ``pre_mix`` and ``pre``.

    Args:
        pre_mix: None, or fp32 ``[*lead, 4]`` (x's shape without D): the weights of y instead of
            the computed ``pre`` (DeepSeek-V4.1's lagged hyper-connections).
        others: as :func:`npu_hc_pre_v2`.

    Returns:
        ``(y, post, comb_frag, pre fp32 [*lead, 4])``; ``pre`` is the computed gates either way.

    Raises:
        ShapeError / DTypeError / ModeError: naming the argument.

    Source: vllm-ascend ``csrc/torch_binding.cpp`` @ 001c5b56 (schema), the official golden
    ``test_npu_hc_pre.py`` (``pre_mix`` weights y; ``pre`` returned).
    """
    out = _hc_pre(x, hc_fn, hc_scale, hc_base, pre_mix, hc_mult, hc_sinkhorn_iters, norm_eps, hc_eps, "fused")
    return out.y, out.post, out.comb_frag, out.pre


def npu_hc_pre(x, hc_fn, hc_scale, hc_base, *, hc_mult=4, hc_sinkhorn_iters=20, norm_eps=1e-6,
               hc_eps=1e-6) -> tuple:
    """``torch.ops.custom.npu_hc_pre``: the fused kernel for T <= 128 with T % 16 == 0, the
    decomposed chain otherwise (:func:`fused_route`; its mixes are an fp32 ``linear``, no HF32).

    Args and Returns: as :func:`npu_hc_pre_v2` (keyword-only ints and floats with defaults).

    Raises:
        ShapeError / DTypeError / ModeError: naming the argument.

    Source: cann-recipes-infer ``ops/ascendc/docs/custom-npu_hc_pre.md``, ``custom_ops/csrc/npu_hc_pre.cpp``.
    """
    out = _hc_pre(x, hc_fn, hc_scale, hc_base, None, hc_mult, hc_sinkhorn_iters, norm_eps, hc_eps, "route")
    return out.y, out.post, out.comb_frag


def npu_hc_pre_inv_rms(x, *, epsilon=1e-20) -> np.ndarray:
    """``torch.ops.custom.npu_hc_pre_inv_rms``: ``1 / sqrt(sum(x^2) * fp32(1/K) + epsilon)`` per
    token over its ``K = 4 * D`` values (the fused kernel's order; this kernel's own source was
    not read: docs/ops.md "mHC").

    Args:
        x: bf16 (doc) or fp32 (the recipes' example test) ``[T, 4, D]`` / ``[B, S, 4, D]``.
        epsilon: finite in fp32, >= 0.

    Returns:
        fp32 ``[*lead, 1]``.

    Raises:
        ShapeError / DTypeError: naming the argument.

    Source: cann-recipes-infer ``ops/ascendc/docs/custom-npu_hc_pre_inv_rms.md``.
    """
    eps = check_float(epsilon, "epsilon", nonnegative=True)
    x, lead, _ = _x(x, dtypes=INV_RMS_DTYPES)
    return get_backend().hc_pre(HcPreArgs("inv_rms", x, lead, norm_eps=eps)).inv_rms


def npu_hc_pre_sinkhorn(mixes, rsqrt, hc_scale, hc_base, x, hc_mult=4, hc_sinkhorn_iters=20,
                        hc_eps=1e-5) -> tuple:
    """``torch.ops.custom.npu_hc_pre_sinkhorn``: hc_pre after the mixes (module doc), with the
    mixes and the inverse RMS given.

    Args:
        mixes: fp32 ``[*lead, 24]`` (``x @ hc_fn^T``, not yet scaled by ``rsqrt``).
        rsqrt: fp32 ``[*lead, 1]`` (:func:`npu_hc_pre_inv_rms`).
        hc_scale: fp32 ``[3]``; hc_base: fp32 ``[24]``.
        x: bf16 ``[*lead, 4, D]``, D 4096 or 7168.
        hc_mult: 4; hc_sinkhorn_iters: 1..100; hc_eps: >= 0 (this schema's default is 1e-5).

    Returns:
        ``(y bf16 [*lead, D], post fp32 [*lead, 4], comb_frag fp32 [*lead, 4, 4])``.

    Raises:
        ShapeError / DTypeError / ModeError: naming the argument.

    Source: cann-recipes-infer ``ops/ascendc/docs/custom-npu_hc_pre_sinkhorn.md``.
    """
    mult, iters, eps = _scalars(hc_mult, hc_sinkhorn_iters, {"hc_eps": hc_eps})
    x, lead, d = _x(x)
    mixes = _shaped(mixes, "mixes", (*lead, HC_MIX), f"x's token dims, {HC_MIX}")
    rsqrt = _shaped(rsqrt, "rsqrt", (*lead, 1), "x's token dims, 1")
    _, hc_scale, hc_base = _weights(None, hc_scale, hc_base, d)
    out = get_backend().hc_pre(HcPreArgs("sinkhorn", x, lead, mixes=mixes, inv_rms=rsqrt, hc_scale=hc_scale,
                                         hc_base=hc_base, hc_mult=mult, hc_sinkhorn_iters=iters, **eps))
    return out.y, out.post, out.comb_frag


def npu_hc_post(x, residual, post, comb, *, x_layout: str = "any") -> np.ndarray:
    """``npu_hc_post`` (``_C_ascend`` and ``custom``): ``out[i] = post[i] * x + sum_j comb[j, i] *
    residual[j]``, fp32 compute, one rounding to x's dtype (docs/ops.md "mHC": the A2 / A3
    kernel's order).

    Args:
        x: ``[T, D]`` or ``[B, S, D]``, bf16 / fp16 / fp32, D 4096 or 7168.
        residual: ``[*lead, 4, D]``, x's dtype.
        post: ``[*lead, 4]``, bf16 / fp16 / fp32.
        comb: ``[*lead, 4, 4]``, post's dtype.
        x_layout: ``'any'`` or ``'BSD'`` (a 3-D x only: vllm-ascend's adapter; its binding fixes it).

    Returns:
        residual's shape, x's dtype.

    Raises:
        ModeError: another x_layout. ShapeError / DTypeError: naming the argument.

    Source: cann-recipes-infer ``ops/ascendc/docs/custom-npu_hc_post.md``; vllm-ascend
    ``csrc/torch_binding.cpp`` (``check_hc_post_shape_and_dtype``), ``csrc/moe/hc_post/op_kernel/``.
    """
    if x_layout not in HC_POST_LAYOUTS:
        raise arg_error(ModeError, "x_layout", f"one of {HC_POST_LAYOUTS}", describe(x_layout))
    x = _array(x, "x", HC_POST_DTYPES)
    ndims = (3,) if x_layout == "BSD" else (2, 3)
    if x.ndim not in ndims:
        raise arg_error(ShapeError, "x", " or ".join("[B, S, D]" if n == 3 else "[T, D]" for n in ndims),
                        f"shape {list(x.shape)}")
    lead, d = x.shape[:-1], x.shape[-1]
    if d not in HC_D or min(lead) < 1:
        raise arg_error(ShapeError, "x", f"D (last dim) one of {HC_D} and every token dim >= 1",
                        f"shape {list(x.shape)}")
    if math.prod(lead) > MAX_TOKENS:
        raise arg_error(ShapeError, "x", f"at most {MAX_TOKENS} tokens", f"shape {list(x.shape)}")
    residual = _array(residual, "residual", (dtype_name(x.dtype),))
    post = _array(post, "post", HC_POST_DTYPES)
    comb = _array(comb, "comb", (dtype_name(post.dtype),))
    for name, a, shape, what in (("residual", residual, (*lead, HC_MULT, d), "x's token dims, hc, D"),
                                 ("post", post, (*lead, HC_MULT), "x's token dims, hc"),
                                 ("comb", comb, (*lead, HC_MULT, HC_MULT), "x's token dims, hc, hc")):
        if a.shape != shape:
            raise arg_error(ShapeError, name, f"shape {list(shape)} ({what})", f"shape {list(a.shape)}")
    return get_backend().hc_post(HcPostArgs(x, residual, post, comb)).out
