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

#: Offset of torch_npu's dtype codes over ACL's ``aclDataType`` values (``g_toAclOffset``).
ACL_OFFSET = 256
#: ``aclDataType`` value of each torch_npu dtype whose code the quant formats do not define
#: (CANN ``acl/acl_base_rt.h``, shipped in the torch_npu wheel).
_ACL_DATA_TYPES = {
    "float32": 0, "float16": 1, "int8": 2, "int32": 3, "uint8": 4, "int16": 6, "uint16": 7, "uint32": 8,
    "int64": 9, "uint64": 10, "float64": 11, "bool": 12, "string": 13, "complex64": 16, "complex128": 17,
    "bfloat16": 27, "uint1": 30, "complex32": 33, "float6_e3m2": 38, "float6_e2m3": 39,
}
#: ``torch_npu.<name>``: every member of torch_npu 2.14's ``DType`` (27 names, plain ints; the
#: low-precision ones from :data:`ascend_emu.quant.TORCH_NPU_DTYPE_CODES`: int4, hifloat8 and
#: float4 travel as uint8 tensors, float8_e8m0fnu scales as torch.float8_e8m0fnu where torch has
#: it). ``tests/reference/torch_npu_2_14_dtypes.txt`` is the list read from the real wheel.
NPU_DTYPE_CODES: dict[str, int] = {
    **{name: code + ACL_OFFSET for name, code in _ACL_DATA_TYPES.items()}, **TORCH_NPU_DTYPE_CODES}
#: Older names of three codes, still exported: the ``DType`` binding of earlier torch_npu releases
#: (``float8_e8m0``, ``float4_e2m1``, ``float4_e1m2``), which torch_npu's own error messages and
#: op docs keep using.
NPU_DTYPE_ALIASES: dict[str, str] = {
    "float8_e8m0": "float8_e8m0fnu", "float4_e2m1": "float4_e2m1fn_x2", "float4_e1m2": "float4_e1m2fn_x2"}
#: What ``import torch_npu`` exports: the codes and their aliases.
NPU_DTYPE_EXPORTS: dict[str, int] = {
    **NPU_DTYPE_CODES, **{alias: NPU_DTYPE_CODES[name] for alias, name in NPU_DTYPE_ALIASES.items()}}


def patch_torch() -> None:
    """Set ``torch.version.cann`` to the emulated CANN version (idempotent)."""
    torch.version.cann = CANN_VERSION
