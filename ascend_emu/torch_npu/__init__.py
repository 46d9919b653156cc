"""A drop-in for ``import torch_npu`` that runs the emulated ops on CPU torch tensors.

Use it as ``import ascend_emu.torch_npu as torch_npu``, or run an unmodified script with
``ascend-emu run script.py`` (which makes ``import torch_npu`` resolve here, see :func:`install`).

Importing this module does to torch what the real ``import torch_npu`` does:

- registers torch_npu 2.14's schemas of the emulated ops (:mod:`.schemas`) as
  ``torch.ops.npu.<op>`` / ``torch.ops.atb.npu_mla_preprocess`` with CPU, fake (meta) and
  autograd kernels (:mod:`._registry`); ``torch_npu.<op>`` calls ``torch.ops.npu.<op>`` (its
  ``op`` attribute) after checking argument kinds against the schema, so a wrong kind is an
  ascend_emu error naming the argument (the Python signatures are the schemas, not written
  again here);
- ``torch.npu`` exists (:mod:`.npu`), ``Tensor.npu()`` copies a host tensor to the (emulated)
  NPU and ``.cpu()`` copies it back, so host and device tensors never alias; ``device="npu"``
  strings work in factories and ``.to()`` (:mod:`._device`);
- format tags follow tensors the way weight loading expects (:mod:`._format`);
- the serving frameworks' own namespaces, ``torch.ops._C_ascend.*`` (vllm-ascend) and
  ``torch.ops.custom.*`` (cann-recipes-infer, sglang), are registered with their schemas as
  bindings to the same ops (:mod:`.namespaces`; :func:`.namespaces.report` says what was
  registered and what was left alone);
- ``torch_npu.hifloat8`` / ``float8_e5m2`` (291) / ``float8_e4m3fn`` (292) / ``float8_e8m0fnu``
  (alias ``float8_e8m0``) / ... are torch_npu's dtype codes and
  ``torch.version.cann`` is the emulated CANN version (:mod:`._dtypes`).

Errors are ascend_emu's (``ValueError`` / ``TypeError`` subclasses naming the argument) raised
as their ``RuntimeError`` variants (:func:`ascend_emu.errors.runtime_error_class`), as torch_npu
rejects calls with a ``RuntimeError``. Graph mode (torchair) is not emulated; ``torch.compile``
works through the fake kernels.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

from ..install_hints import TORCH_HINT, TORCH_NPU_VERSION

try:
    import torch  # noqa: F401  (the error below when torch is missing)
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
    raise ModuleNotFoundError(f"ascend_emu.torch_npu needs torch; {TORCH_HINT}", name=exc.name) from exc

from .._version import __version__ as _emu_version
from . import _device, _format, _registry, namespaces, npu
from ._dtypes import NPU_DTYPE_EXPORTS
from ._format import Format
from ._dtypes import patch_torch as _patch_version
from ._convert import nz_of, tag_nz, to_numpy, to_torch  # noqa: F401  (public)
from .schemas import SCHEMAS

npu.patch_torch()
_device.patch_torch()
_format.patch_torch()
_registry.register()
namespaces.register()  # torch.ops._C_ascend.* / torch.ops.custom.*: the frameworks' schemas, the same ops
_patch_version()
globals().update(NPU_DTYPE_EXPORTS)  # torch_npu.hifloat8, float8_e5m2, ... (ints, as torch_npu exports them)

#: The emulated torch_npu release; the local label says this is the emulator.
__version__ = f"{TORCH_NPU_VERSION}+ascend_emu.{_emu_version}"
version = __version__

_NPU_OPS = sorted({spec.name for spec in SCHEMAS if spec.namespace == "npu"})


def _explain_missing_ops() -> None:
    """``torch.ops.<namespace>.<op>`` of a namespace the emulator registers, for an op it does not
    have: the not-emulated ``AttributeError`` (:func:`ascend_emu.errors.not_emulated`) instead of
    torch's "'_OpNamespace' object has no attribute". The namespace objects keep their class's
    behaviour for every registered op (a subclass that only rewrites that error)."""
    from torch._ops import _OpNamespace

    from ..errors import not_emulated

    registered: dict[str, set[str]] = {}
    for spec in SCHEMAS:
        registered.setdefault(spec.namespace, set()).add(spec.name)
    done = namespaces.report()
    for spec in namespaces.NAMESPACE_SCHEMAS:
        if done.get(f"{spec.namespace}::{spec.qualified}") == "registered":
            registered.setdefault(spec.namespace, set()).add(spec.name)

    class _EmulatedNamespace(_OpNamespace):
        def __getattr__(self, op_name):
            try:
                return super().__getattr__(op_name)
            except AttributeError:
                if op_name.startswith("_"):
                    raise
                raise not_emulated(f"torch.ops.{self.name}", op_name, registered.get(self.name, ()),
                                   listed_in="docs/torch_npu.md", mock=f"torch.ops.{self.name}") from None

    for ns_name in registered:
        ns = getattr(torch.ops, ns_name)
        if type(ns) is _OpNamespace:
            ns.__class__ = _EmulatedNamespace


_explain_missing_ops()

for _name in _NPU_OPS:  # torch_npu.<op>: the registered op, through a thin argument-kind check
    globals()[_name] = _registry.public_op("npu", _name)
del _name


def install() -> None:
    """Make ``import torch_npu`` and its submodules (``torch_npu.npu``, ``torch_npu.npu.utils``,
    ``torch_npu.atb``, ``torch_npu.testing.testcase``, ...) resolve to this package.

    ``ascend-emu run`` calls it before running a script; call it yourself (e.g. in a
    ``conftest.py``) to run code that imports ``torch_npu`` in-process.
    """
    this = sys.modules[__name__]
    sys.modules["torch_npu"] = this
    for info in pkgutil.walk_packages(this.__path__, prefix=f"{__name__}."):
        if info.name.rsplit(".", 1)[-1].startswith("_"):
            continue
        module = importlib.import_module(info.name)
        sys.modules["torch_npu" + info.name[len(__name__):]] = module


from . import atb, testing  # noqa: E402


def __getattr__(name: str):
    """``torch_npu.<op>`` for an op the emulator does not have: an ``AttributeError`` saying so,
    where the emulated ops are listed and how to mock it (:func:`ascend_emu.errors.not_emulated`)."""
    if name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}", name=name)
    from ..errors import not_emulated

    raise not_emulated("torch_npu", name, _NPU_OPS, listed_in="torch_npu.__all__ and docs/torch_npu.md",
                       mock="torch_npu")

__all__ = ["atb", "npu", "testing", "install", "__version__", "Format", *_NPU_OPS, *NPU_DTYPE_EXPORTS]
