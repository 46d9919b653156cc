"""``torch_npu.atb``: the ATB ops the emulator has (``npu_mla_preprocess``).

``npu_mla_preprocess`` calls ``torch.ops.atb.npu_mla_preprocess`` (its ``op``), registered from torch_npu 2.14's
two schemas (:mod:`.schemas`): without the out= tensors (``q_out0``, ``kv_cache_out0``,
``q_out1``, ``kv_cache_out1``, all four by keyword) it returns new tensors and leaves
``kv_cache`` / ``kv_cache_rope`` unchanged; with them (the ``.out`` overload) it writes into
them and returns those same tensor objects (pass ``kv_cache`` / ``kv_cache_rope`` themselves
to update the caches in place). Shapes, dtypes, modes, numerics and errors:
:func:`ascend_emu.ops.npu_mla_preprocess`.
"""

from __future__ import annotations

from . import _registry

_registry.register()

npu_mla_preprocess = _registry.public_op("atb", "npu_mla_preprocess")

__all__ = ["npu_mla_preprocess"]
