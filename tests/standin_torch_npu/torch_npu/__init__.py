"""Test stand-in for the real torch_npu: loopback onto the emulator, optional faults.

Not the drop-in: it is a separate module named ``torch_npu`` (found on ``sys.path``) that
forwards to :mod:`ascend_emu.torch_npu` with the ``emu`` backend forced, so that the ``hw``
backend can run on it. ``STANDIN_FAULT`` (see README.md) injects one device fault.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import torch

import ascend_emu.torch_npu as _emu
from ascend_emu import ops as _ops
from ascend_emu.layouts import FRACTAL_NZ, nz_shape, nz_to_nd
from ascend_emu.quant import MLA_ROW

__version__ = "2.14.0+standin"
STANDIN = True
FAULT = os.environ.get("STANDIN_FAULT", "")
_NZ_WEIGHTS = ("weight_dq", "weight_uq_qr", "weight_dkv_kr", "wdqkv", "wuq")
_INDEX = {"npu_kv_rmsnorm_rope_cache": "index", "npu_mla_prolog": "cache_index", "npu_mla_prolog_v2": "cache_index",
          "npu_mla_prolog_v3": "cache_index", "npu_mla_preprocess": "slotmapping"}
_POSITIONAL_INDEX = {"npu_kv_rmsnorm_rope_cache": 4, "npu_mla_prolog": 9, "npu_mla_prolog_v2": 9,
                     "npu_mla_preprocess": 15}


Format = _emu.Format


def get_npu_format(t) -> int:
    return _emu.get_npu_format(t)


def npu_format_cast(t, acl_format, customize_dtype=None):
    if FAULT == "skip_nz" and int(acl_format) == FRACTAL_NZ:
        return t
    return _emu.npu_format_cast(t, acl_format, customize_dtype=customize_dtype)


def _as_device_nz(w):
    """What the device computes with when handed ND memory as an NZ weight: the bytes read as
    FRACTAL_NZ storage."""
    if w is None or get_npu_format(w) == FRACTAL_NZ:
        return w
    from ascend_emu.torch_npu._convert import to_numpy, to_torch

    a = np.ascontiguousarray(to_numpy(w.cpu()))
    shape = a.shape[-2:] if a.ndim == 2 else a.shape
    storage = np.zeros(int(np.prod(nz_shape(shape, a.dtype))), a.dtype)
    storage[: a.size] = a.reshape(-1)
    logical = nz_to_nd(storage.reshape(nz_shape(shape, a.dtype)), shape)
    out = to_torch(np.ascontiguousarray(logical))
    return _emu.npu_format_cast(out.npu() if w.device.type == "npu" else out, FRACTAL_NZ)


def _fault_inputs(name, args, kwargs):
    args = list(args)
    if FAULT == "skip_nz":
        for w in _NZ_WEIGHTS:
            if w in kwargs:
                kwargs[w] = _as_device_nz(kwargs[w])
        if name.startswith("npu_mla_prolog"):
            for i in (1, 2, 4):
                if i < len(args):
                    args[i] = _as_device_nz(args[i])
        if name == "npu_mla_preprocess":
            for i in (3, 7):
                if i < len(args):
                    args[i] = _as_device_nz(args[i])
    if FAULT == "slot_off" and name in _INDEX:
        key, pos = _INDEX[name], _POSITIONAL_INDEX.get(name)
        idx = kwargs.get(key) if key in kwargs else (args[pos] if pos is not None and pos < len(args) else None)
        if idx is not None and idx.numel():
            idx = idx.clone()
            idx.view(-1)[0] += 1
            if key in kwargs:
                kwargs[key] = idx
            else:
                args[pos] = idx
    return args, kwargs


def _fault_outputs(name, args, kwargs, result):
    if FAULT == "round_bf16":
        for r in result if isinstance(result, (tuple, list)) else [result]:
            if isinstance(r, torch.Tensor) and r.dtype == torch.bfloat16 and r.numel():
                r.view(-1).view(torch.int16)[0] += 1  # one ulp away from the correctly rounded value
                break
    if FAULT == "scale_byte" and name == "npu_mla_prolog_v3":
        kv = kwargs.get("kv_cache", args[9] if len(args) > 9 else None)
        idx = kwargs.get("cache_index")
        if kv is not None and kv.dtype == torch.int8 and kv.shape[-1] == MLA_ROW.row_bytes and idx is not None:
            slot = int(idx.view(-1)[0])
            rows = kv.view(-1, MLA_ROW.row_bytes).view(torch.uint8)
            rows[slot, MLA_ROW.scale_offset + 2] ^= 0x10
    return result


def _op(name, fn):
    @functools.wraps(fn)
    def standin(*args, **kwargs):
        args, kwargs = _fault_inputs(name, args, kwargs)
        with _ops.backend("emu"):
            result = fn(*args, **kwargs)
        return _fault_outputs(name, args, kwargs, result)
    return standin


npu_kv_rmsnorm_rope_cache = _op("npu_kv_rmsnorm_rope_cache", _emu.npu_kv_rmsnorm_rope_cache)
npu_mla_prolog = _op("npu_mla_prolog", _emu.npu_mla_prolog)
npu_mla_prolog_v2 = _op("npu_mla_prolog_v2", _emu.npu_mla_prolog_v2)
npu_mla_prolog_v3 = _op("npu_mla_prolog_v3", _emu.npu_mla_prolog_v3)
for _name in ("npu_sparse_flash_attention", "npu_kv_quant_sparse_flash_attention", "npu_lightning_indexer",
              "npu_interleave_rope", "npu_rotary_mul", "npu_scatter_pa_kv_cache", "npu_gather_pa_kv_cache",
              "npu_dynamic_quant", "npu_quant_lightning_indexer",
              "npu_fused_infer_attention_score", "npu_fused_infer_attention_score_v2",
              "npu_dtype_cast", "npu_dynamic_mx_quant", "npu_dynamic_quant_asymmetric",
              "npu_dynamic_mx_quant_with_dual_axis"):
    if hasattr(_emu, _name):
        globals()[_name] = _op(_name, getattr(_emu, _name))

npu = _emu.npu
from . import atb  # noqa: E402, F401  (torch_npu.atb)
