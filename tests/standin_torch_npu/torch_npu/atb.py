"""``torch_npu.atb`` of the test stand-in."""

import ascend_emu.torch_npu.atb as _emu_atb

from . import _op

npu_mla_preprocess = _op("npu_mla_preprocess", _emu_atb.npu_mla_preprocess)
