"""Backend selection and the backend interface: what every backend implements, and how.

The op contract lives in :mod:`ascend_emu.ops`; a backend receives what the contract validated.
Select one with :func:`set_backend`, for a block of code with ``with backend("hw"): ...`` (per
thread / async context; it wins over :func:`set_backend`), or the ``ASCEND_EMU_BACKEND``
environment variable (default ``emu``).

The interface (:class:`Backend`), the same for every backend:

- one method per op family (the methods of :class:`Backend`: ``mla_prolog``, ``rope``, ...),
  taking that family's frozen argument object (``MlaPrologArgs``, ... in the family's ``ops``
  module): the caller's validated arrays as passed (NZ weights as cast, scales and index tensors
  as given), the derived slots / rows, the cache layouts, modes and scenario. Backends never
  validate user input again;
- returning that family's ``...Outputs`` NamedTuple (defined once, in the family's ``ops``
  module): one field per output of the family, in torch_npu's order. Outputs written in place
  (caches, out= tensors) are written into the arrays the argument object holds and returned as
  those same objects; the MLA prolog's caches are written in place but are not fields (its v3
  entry point does not return them);
- conversions only one backend needs stay in that backend: the CPU's fp32 widening, NZ
  read-back and descale decoding in :mod:`ascend_emu.emu`, device copies and real NZ casts in
  :mod:`ascend_emu.hw`.

Backends: ``emu`` (the CPU, :mod:`ascend_emu.emu`) and ``hw`` (the real torch_npu on an Atlas
machine, :mod:`ascend_emu.hw`; without torch_npu or an NPU its ops raise
:class:`~ascend_emu.errors.BackendUnavailable`). Each package exposes its implementation as
``BACKEND``.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
from typing import TYPE_CHECKING, Iterator, Protocol, runtime_checkable

from .. import _deterministic
from .._env import getenv
from ..errors import ModeError, arg_error, describe

if TYPE_CHECKING:  # the families' modules import this one
    from .compressor import CompressorArgs, CompressorOutputs
    from .dynamic_quant import DynamicQuantArgs, DynamicQuantOutputs
    from .fused_infer_attention_score import FusedInferAttentionArgs, FusedInferAttentionOutputs
    from .hc import HcPostArgs, HcPostOutputs, HcPreArgs, HcPreOutputs
    from .kv_rmsnorm_rope_cache import KvRmsNormRopeCacheArgs, KvRmsNormRopeCacheOutputs
    from .lightning_indexer import LightningIndexerArgs, LightningIndexerOutputs
    from .mla_preprocess import MlaPreprocessArgs, MlaPreprocessOutputs
    from .mla_prolog import MlaPrologArgs, MlaPrologOutputs
    from .paged_cache import PagedCacheArgs, PagedCacheOutputs
    from .quant_lightning_indexer import QuantLightningIndexerArgs, QuantLightningIndexerOutputs
    from .quant_950 import Quant950Args, Quant950Outputs
    from .rope import RopeArgs, RopeOutputs
    from .scatter_nd_update import ScatterNdArgs, ScatterNdOutputs
    from .sparse_attn_sharedkv import SharedKvArgs, SharedKvOutputs
    from .sparse_flash_attention import SparseFlashAttentionArgs, SparseFlashAttentionOutputs
    from ._v4_writers import V4WriterArgs, V4WriterOutputs
    from .v4_small import (CompressorMetadataArgs, CompressorMetadataOutputs, PartialRotaryArgs, PartialRotaryOutputs,
                           RmsNormDynamicQuantArgs, RmsNormDynamicQuantOutputs)


@runtime_checkable
class Backend(Protocol):
    """What a backend implements (module doc): one method per op family."""

    name: str

    def mla_prolog(self, args: MlaPrologArgs) -> MlaPrologOutputs:
        """``npu_mla_prolog`` / ``_v2`` / ``_v3``; caches written in place."""

    def mla_preprocess(self, args: MlaPreprocessArgs) -> MlaPreprocessOutputs:
        """``atb.npu_mla_preprocess``; every output written into ``args``' destinations."""

    def kv_rmsnorm_rope_cache(self, args: KvRmsNormRopeCacheArgs) -> KvRmsNormRopeCacheOutputs:
        """``npu_kv_rmsnorm_rope_cache``; caches written in place."""

    def sparse_flash_attention(self, args: SparseFlashAttentionArgs) -> SparseFlashAttentionOutputs:
        """``npu_sparse_flash_attention`` and ``npu_kv_quant_sparse_flash_attention``."""

    def lightning_indexer(self, args: LightningIndexerArgs) -> LightningIndexerOutputs:
        """``npu_lightning_indexer``."""

    def rope(self, args: RopeArgs) -> RopeOutputs:
        """``npu_interleave_rope`` and ``npu_rotary_mul``."""

    def paged_cache(self, args: PagedCacheArgs) -> PagedCacheOutputs:
        """``npu_scatter_pa_kv_cache`` and ``npu_gather_pa_kv_cache``."""

    def quant(self, args: DynamicQuantArgs) -> DynamicQuantOutputs:
        """``npu_dynamic_quant``."""

    def quant_lightning_indexer(self, args: QuantLightningIndexerArgs) -> QuantLightningIndexerOutputs:
        """``npu_quant_lightning_indexer``."""

    def fused_infer_attention_score(self, args: FusedInferAttentionArgs) -> FusedInferAttentionOutputs:
        """``npu_fused_infer_attention_score`` and ``_v2`` (and their ``.out`` forms)."""

    def quant_950(self, args: Quant950Args) -> Quant950Outputs:
        """``npu_dtype_cast`` and ``npu_dynamic_mx_quant`` (Ascend 950 types)."""

    def rms_norm_dynamic_quant(self, args: RmsNormDynamicQuantArgs) -> RmsNormDynamicQuantOutputs:
        """DeepSeek-V4's ``npu_rms_norm_dynamic_quant`` (``_C_ascend`` / ``custom``)."""

    def inplace_partial_rotary_mul(self, args: PartialRotaryArgs) -> PartialRotaryOutputs:
        """DeepSeek-V4's ``inplace_partial_rotary_mul``; x written in place."""

    def compressor_metadata(self, args: CompressorMetadataArgs) -> CompressorMetadataOutputs:
        """DeepSeek-V4's ``compressor_metadata`` / ``_out`` (out arrays written in place)."""
    # ---- DeepSeek-V4 mHC (ops.hc)
    def hc_pre(self, args: HcPreArgs) -> HcPreOutputs:
        """``npu_hc_pre_v2`` / ``_v3``, ``custom.npu_hc_pre`` and its two decomposed stages."""

    def hc_post(self, args: HcPostArgs) -> HcPostOutputs:
        """``npu_hc_post``."""
    # ---- DeepSeek-V4 shared-KV attention (ops.sparse_attn_sharedkv)
    def sparse_attn_sharedkv(self, args: SharedKvArgs) -> SharedKvOutputs:
        """``npu_sparse_attn_sharedkv`` (A2 / A3)."""

    def compressor(self, args: CompressorArgs) -> CompressorOutputs:
        """DeepSeek-V4's ``compressor`` (the state cache written in place)."""

    def vllm_quant_lightning_indexer(self, args: QuantLightningIndexerArgs) -> QuantLightningIndexerOutputs:
        """``_C_ascend.npu_vllm_quant_lightning_indexer`` (compressed keys; the quant indexer's numerics)."""
    # ---- DeepSeek-V4 cache writers (ops.kv_compress_epilog, ops.indexer_compress_epilog)
    def kv_compress_epilog(self, args: V4WriterArgs) -> V4WriterOutputs:
        """``kv_compress_epilog`` (Ascend 950); the cache written in place."""

    def indexer_compress_epilog(self, args: V4WriterArgs) -> V4WriterOutputs:
        """``indexer_compress_epilog`` / ``_v2`` (Ascend 950); caches written in place."""
    # ---- DeepSeek-V4 row scatters (ops.scatter_nd_update)
    def scatter_nd_update(self, args: ScatterNdArgs) -> ScatterNdOutputs:
        """``npu_scatter_nd_update_v2`` / ``_sk`` and ``custom.scatter_nd_update_asc``; var written in place."""


#: Registered backends: name -> package exposing ``BACKEND``.
BACKENDS: dict[str, str] = {"emu": "ascend_emu.emu", "hw": "ascend_emu.hw"}
_ENV = "ASCEND_EMU_BACKEND"
_selected: str | None = None
_scoped: contextvars.ContextVar[str | None] = contextvars.ContextVar("ascend_emu_backend", default=None)
_loaded: dict[str, Backend] = {}


def set_backend(name: str) -> None:
    """Select the backend for every following op call.

    Raises:
        ModeError: ``name`` is not registered.
    """
    global _selected
    if name not in BACKENDS:
        raise arg_error(ModeError, "backend", f"one of {sorted(BACKENDS)}", describe(name))
    _selected = name


def backend_name() -> str:
    """Name of the selected backend."""
    name = _scoped.get() or _selected or getenv(_ENV, "emu")
    if name not in BACKENDS:
        raise arg_error(ModeError, _ENV, f"one of {sorted(BACKENDS)}", describe(name))
    return name


def get_backend() -> Backend:
    """The selected backend (its package's ``BACKEND``; the package is imported on first use).

    Raises:
        ModeError: ``ASCEND_EMU_BACKEND`` or ``ASCEND_EMU_DETERMINISTIC`` set to a value that is
            not one of theirs (checked here, before the backend writes anything).
    """
    _deterministic.enabled()  # a bad ASCEND_EMU_DETERMINISTIC rejected before any write
    name = backend_name()
    impl = _loaded.get(name)
    if impl is None:
        impl = _loaded[name] = importlib.import_module(BACKENDS[name]).BACKEND
    return impl


@contextlib.contextmanager
def backend(name: str) -> Iterator[str]:
    """Select backend ``name`` for the op calls inside the ``with`` block (this thread / async
    context only; blocks nest), then restore the previous selection.

    >>> from ascend_emu import ops
    >>> with ops.backend("emu"):
    ...     ops.backend_name()
    'emu'

    Raises:
        ModeError: ``name`` is not registered.
    """
    if name not in BACKENDS:
        raise arg_error(ModeError, "backend", f"one of {sorted(BACKENDS)}", repr(name))
    token = _scoped.set(name)
    try:
        yield name
    finally:
        _scoped.reset(token)
