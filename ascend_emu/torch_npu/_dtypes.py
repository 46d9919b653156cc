"""``torch_npu.<dtype>`` codes and ``torch.version.cann``, as the real ``import torch_npu`` sets them.

torch_npu exports the members of its C enum ``torch_npu._C._cd.DType`` as module attributes
(``torch_npu/_init/core/_exports.py``, ``_export_dtype_symbols``): plain ints that ops take in
their ``int? *_dtype`` arguments for the types torch has no dtype for. The codes are those of
torch_npu 2.14's meta functions (``op_plugin/meta/_meta_registrations.py`` lines 56-70,
``TORCH_NPU_DTYPE_TO_STRING_MAP``); vllm-ascend's CPU unit tests hard-code three of them on their
mocked module (``tests/ut/_310p/conftest.py``: ``float4_e2m1fn_x2 = 296``, ``hifloat8 = 290``,
``float8_e8m0fnu = 293``).

``import torch_npu`` also sets ``torch.version.cann`` to the CANN version
(``torch_npu/_init/patches/api_patches.py`` -> ``utils/collect_env.py``
``_add_collect_env_methods``); here it is the emulated one, :data:`~ascend_emu.torch_npu.npu.utils.CANN_VERSION`.
"""

from __future__ import annotations

import torch

from ..quant import TORCH_NPU_DTYPE_CODES
from .npu.utils import CANN_VERSION

#: ``torch_npu.<name>``: the torch_npu dtype codes without a torch dtype (int4, hifloat8 and
#: float4 travel as uint8 tensors, float8_e8m0fnu scales as torch.float8_e8m0fnu where torch has
#: it); the codes are :data:`ascend_emu.quant.TORCH_NPU_DTYPE_CODES`.
NPU_DTYPE_CODES: dict[str, int] = {name: TORCH_NPU_DTYPE_CODES[name] for name in (
    "int4", "hifloat8", "float8_e8m0fnu", "float4_e2m1fn_x2", "float4_e1m2fn_x2")}


def patch_torch() -> None:
    """Set ``torch.version.cann`` to the emulated CANN version (idempotent)."""
    torch.version.cann = CANN_VERSION
