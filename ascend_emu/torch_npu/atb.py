"""``torch_npu.atb``: the ATB ops over CPU torch tensors (``npu_mla_preprocess``).

torch_npu registers ``atb::npu_mla_preprocess`` and its ``.out`` overload (op-plugin); both are
exposed here as one function: without the out= tensors it returns new tensors, with them it
writes into them and returns those same tensor objects.
"""

from __future__ import annotations

from ._convert import call_emulated


def npu_mla_preprocess(input, gamma0, beta0, wdqkv, descale0, gamma1, beta1, wuq, descale1, gamma2, cos, sin,
                       wuk, kv_cache, kv_cache_rope, slotmapping, *, quant_scale0=None, quant_offset0=None,
                       bias0=None, quant_scale1=None, quant_offset1=None, bias1=None, ctkv_scale=None,
                       q_nope_scale=None, cache_mode=None, quant_mode=None, q_out0=None, kv_cache_out0=None,
                       q_out1=None, kv_cache_out1=None):
    """``torch_npu.atb.npu_mla_preprocess`` on CPU tensors (MlaPreprocessV2).

    Shapes, dtypes, modes, numerics and errors: :func:`ascend_emu.ops.npu_mla_preprocess`.
    ``wdqkv`` / ``wuq`` must come from ``npu_format_cast(w, 29)`` (logical ``[N, K]`` or, as in the
    torch_npu doc example, the 4-D ``[1, K/32, N, 32]`` storage-shaped tensor). ``cache_mode``:
    'krope_ctkv' (default), 'int8_nzcache', 'nzcache' (torch_npu's map; aclnn's 'kvcache' is
    rejected, as torch_npu rejects it); ``quant_mode``:
    'per_token_quant_symm' (default), 'per_tensor_quant_asymm'.

    Out= form: pass ``q_out0``, ``kv_cache_out0``, ``q_out1`` and ``kv_cache_out1``; they are
    written in place and returned (pass ``kv_cache`` / ``kv_cache_rope`` themselves to update the
    caches in place). Without them, new tensors are returned and ``kv_cache`` / ``kv_cache_rope``
    are left unchanged.

    Returns:
        ``(q_out0, kv_cache_out0, q_out1, kv_cache_out1)``.
    """
    return call_emulated("npu_mla_preprocess", npu_mla_preprocess, locals(),
                         public_name="torch_npu.atb.npu_mla_preprocess")
