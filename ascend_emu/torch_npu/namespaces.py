"""The serving frameworks' own op namespaces, as data: ``torch.ops._C_ascend.*`` (vllm-ascend)
and ``torch.ops.custom.*`` (cann-recipes-infer's custom_ops package, which sglang's NPU
backend loads too).

vllm-ascend's A2 / A3 DeepSeek-V3.2 path (``vllm_ascend/device/device_op.py``) calls
``torch.ops._C_ascend.npu_sparse_flash_attention`` / ``npu_kv_quant_sparse_flash_attention`` /
``npu_lightning_indexer`` / ``npu_lightning_indexer_quant``, declared by its own library
(``csrc/torch_binding.cpp``, kernels in ``csrc/attention/*/*_torch_adpt.h``) with other defaults,
keyword-only quant modes and three outputs where torch_npu has one. cann-recipes-infer's
DeepSeek-V3.2 recipe registers ``torch.ops.custom.*`` (``ops/ascendc/torch_ops_extension/
custom_ops/csrc/ops_def_registration.cpp``) with yet other schemas, and its ``custom_ops``
package then assigns every ``torch.ops.custom.<op>`` onto ``torch_npu`` (``custom_ops/__init__.py``).

Each :class:`NamespaceSchema` is the schema string as that file declares it, the file and line it
comes from, and the *binding*: the :mod:`ascend_emu.ops` function that runs it (the same one the
torch_npu schema of :mod:`.schemas` runs) and the output mapping. :mod:`._registry` registers
them with ``torch.library`` (schema, CPU kernel, fake kernel) when ``ascend_emu.torch_npu`` is
imported (:func:`register`); arguments pass to the op by their schema names (every name here is
the op's own, so errors name the argument as the namespace's schema names it), defaults are the
namespace's; an argument the op does not take is accepted at the schema's default only
(ModeError naming it otherwise), as for the torch_npu schemas.

An entry whose op :mod:`ascend_emu.ops` does not have yet (``npu_quant_lightning_indexer``) is
kept as data and skipped, and :func:`report` says so. A namespace op that already exists in the
process (a real vllm-ascend ``_C_ascend`` library or the recipes' ``custom_ops`` loaded first) is
left alone, with a :class:`NamespaceWarning`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from .schemas import OpSchema

#: vllm-ascend snapshot the ``_C_ascend`` schemas are read from (vllm-project/vllm-ascend,
#: commit 182b75ea, 2026-08-22).
VLLM_ASCEND = "vllm-project/vllm-ascend@182b75ea csrc/torch_binding.cpp"
#: cann-recipes-infer's DeepSeek-V3.2 custom ops (hicann/cann-recipes-infer, commit fce5418b,
#: 2026-03-10, the last before commit af01a94 removed them for the DeepSeek-V4 set).
RECIPES_V32 = "hicann/cann-recipes-infer@fce5418b ops/ascendc/torch_ops_extension/custom_ops/csrc/ops_def_registration.cpp"
#: cann-recipes-infer's current custom ops (commit fbc225d2, 2026-08-21).
RECIPES_HEAD = "hicann/cann-recipes-infer@fbc225d2 ops/ascendc/torch_ops_extension/custom_ops/csrc/ops_def_registration.cpp"
#: A later vllm-ascend ``csrc/torch_binding.cpp`` (commit 001c5b56, date unknown; the V4.1-era
#: ``_C_ascend`` set: npu_hc_pre_v3).
VLLM_ASCEND_V41 = "vllm-project/vllm-ascend@001c5b56 csrc/torch_binding.cpp"


@dataclass(frozen=True)
class Placeholder:
    """An output the namespace's schema has and the emulated op does not produce: an empty
    ``[0]`` tensor of ``dtype`` on the emulated NPU, what the real op returns there in the modes
    the emulator accepts (e.g. softmax_max / softmax_sum without ``return_softmax_lse``)."""

    dtype: str = "float32"


#: The fp32 ``[0]`` softmax_max / softmax_sum / sparse_values the real ops return when not asked
#: for them (vllm-ascend ``kv_quant_sparse_flash_attention_torch_adpt.h``: ``softmax_size = {0}``,
#: ``at::kFloat``; the recipes' ``npu_quant_lightning_indexer.cpp``: ``at::empty({0}, kFloat)``).
EMPTY_F32 = Placeholder("float32")


@dataclass(frozen=True)
class NamespaceSchema(OpSchema):
    """One framework-namespace op overload bound to an :mod:`ascend_emu.ops` function.

    Attributes:
        namespace: ``_C_ascend`` or ``custom``.
        schema: the schema string as the source declares it.
        source: repository@commit, file and line (``char~N``: the character offset, where the
            file was read without line numbers).
        op: the :mod:`ascend_emu.ops` function that runs it.
        outputs: the output mapping, one entry per schema output: an int picks that output of
            the op (its only output is 0), a :class:`Placeholder` is an empty tensor; empty:
            the op's outputs as they are.
        functional: caches the op writes in place that this variant copies instead and returns
            after the op's outputs (the ``_functional`` variants).
        fixed: ``(argument, value)`` pairs the op gets for arguments the namespace's schema does
            not have (what its kernel call implies).
        caller: where the framework calls it.
        untagged_uint8: tensor arguments whose 8-bit data the op tells apart by ``*_dtype`` tags
            this schema lacks (``_C_ascend.npu_mla_prolog_v3``): a uint8 tensor there (HiFloat8
            on the Ascend 950) is rejected with that reason (DTypeError naming the argument).
    """

    op: str = ""
    outputs: tuple = ()
    functional: tuple[str, ...] = ()
    fixed: tuple[tuple[str, object], ...] = ()
    caller: str = ""
    untagged_uint8: tuple[str, ...] = ()


NAMESPACE_SCHEMAS: tuple[NamespaceSchema, ...] = (
    # ---------------------------------------------------------------- vllm-ascend, _C_ascend
    NamespaceSchema("_C_ascend",
        'npu_lightning_indexer(Tensor query, Tensor key, Tensor weights, *, '
        'Tensor? actual_seq_lengths_query=None, Tensor? actual_seq_lengths_key=None, '
        'Tensor? block_table=None, str layout_query="BSND", str layout_key="BSND", '
        'int sparse_count=2048, int sparse_mode=3, int pre_tokens=9223372036854775807, '
        'int next_tokens=9223372036854775807, bool return_value=False'
        ') -> (Tensor sparse_indices, Tensor sparse_values)',
        f"{VLLM_ASCEND}:2056", op="npu_lightning_indexer",
        caller="vllm_ascend/device/device_op.py:509 (indexer_select_post_process)"),
    NamespaceSchema("_C_ascend",
        'npu_sparse_flash_attention(Tensor query, Tensor key, Tensor value, '
        "Tensor sparse_indices, float scale_value, *, Tensor? block_table=None, "
        'Tensor? actual_seq_lengths_query=None, Tensor? actual_seq_lengths_kv=None, '
        'Tensor? query_rope=None, Tensor? key_rope=None, int sparse_block_size=1, '
        "str layout_query='BSND', str layout_kv='BSND', int sparse_mode=3, "
        'int pre_tokens=9223372036854775807, int next_tokens=9223372036854775807, '
        'int attention_mode=2, bool return_softmax_lse=False'
        ') -> (Tensor attention_out, Tensor softmax_max, Tensor softmax_sum)',
        f"{VLLM_ASCEND}:2091", op="npu_sparse_flash_attention",
        caller="vllm_ascend/device/device_op.py:567 (execute_sparse_flash_attention_process)"),
    NamespaceSchema("_C_ascend",
        'npu_kv_quant_sparse_flash_attention(Tensor query, Tensor key, Tensor value, '
        'Tensor sparse_indices, float scale_value, *, int key_quant_mode=1, int value_quant_mode=1, '
        'Tensor? key_dequant_scale=None, Tensor? value_dequant_scale=None, Tensor? block_table=None, '
        'Tensor? actual_seq_lengths_query=None, Tensor? actual_seq_lengths_kv=None, '
        "int sparse_block_size=1, str layout_query='BSND', str layout_kv='BSND', int sparse_mode=3, "
        'int pre_tokens=9223372036854775807, int next_tokens=9223372036854775807, '
        'int attention_mode=2, int quant_scale_repo_mode=1, int tile_size=128, int rope_head_dim=64, '
        'bool return_softmax_lse=False'
        ') -> (Tensor attention_out, Tensor softmax_max, Tensor softmax_sum)',
        f"{VLLM_ASCEND}:2104", op="npu_kv_quant_sparse_flash_attention", outputs=(0, EMPTY_F32, EMPTY_F32),
        caller="vllm_ascend/device/device_op.py:609 (_execute_kv_quant_sparse_flash_attention)"),
    NamespaceSchema("_C_ascend",
        'npu_lightning_indexer_quant(Tensor query, Tensor key, Tensor weights, Tensor query_dequant_scale, '
        'Tensor key_dequant_scale, *, Tensor? actual_seq_lengths_query=None, '
        'Tensor? actual_seq_lengths_key=None, Tensor? block_table=None, '
        'int query_quant_mode=0, int key_quant_mode=0, '
        "str layout_query='BSND', str layout_key='BSND', "
        'int sparse_count=2048, int sparse_mode=3) -> Tensor',
        f"{VLLM_ASCEND}:2524", op="npu_quant_lightning_indexer", outputs=(0,),
        caller="vllm_ascend/device/device_op.py:479 (indexer_select_post_process, C8 indexer)"),
    # ------------------------------------------- cann-recipes-infer DeepSeek-V3.2, custom
    NamespaceSchema("custom",
        "npu_sparse_flash_attention(Tensor query, Tensor key, Tensor value, Tensor sparse_indices, "
        "float scale_value, int sparse_block_size, *, Tensor? block_table=None, "
        "Tensor? actual_seq_lengths_query=None, Tensor? actual_seq_lengths_kv=None, "
        "Tensor? query_rope=None, Tensor? key_rope=None, str layout_query='BSND', "
        "str layout_kv='BSND', int sparse_mode=3) -> Tensor",
        f"{RECIPES_V32}:17", op="npu_sparse_flash_attention", outputs=(0,),
        # no attention_mode: the recipe's adapter (csrc/npu_sparse_flash_attention.cpp:56) calls
        # aclnnSparseFlashAttention without one, the MLA-absorb kernel (the doc's only mode, 2)
        fixed=(("attention_mode", 2),),
        caller="models/deepseek-v3.2-exp/models/modeling_deepseek.py:1408"),
    NamespaceSchema("custom",
        "npu_sparse_flash_attention_antiquant(Tensor query, Tensor key, Tensor value, Tensor sparse_indices, "
        "float scale_value, int sparse_block_size, int key_quant_mode, int value_quant_mode, *, "
        "Tensor? key_dequant_scale=None, Tensor? value_dequant_scale=None, Tensor? block_table=None, "
        "Tensor? actual_seq_lengths_query=None, Tensor? actual_seq_lengths_kv=None, "
        "str layout_query='BSND', str layout_kv='BSND', int sparse_mode=3, int attention_mode=0, "
        "int quant_scale_repo_mode=0, int tile_size=0, int rope_head_dim=0) -> Tensor",
        f"{RECIPES_V32}:18", op="npu_kv_quant_sparse_flash_attention",
        caller="models/deepseek-v3.2-exp/models/modeling_deepseek.py:1401 (kv_cache_quant_mode int8)"),
    NamespaceSchema("custom",
        "npu_lightning_indexer(Tensor query, Tensor key, Tensor weights, *, "
        "Tensor? actual_seq_lengths_query=None, Tensor? actual_seq_lengths_key=None, "
        "Tensor? block_table=None, str layout_query='BSND', str layout_key='BSND', "
        "int sparse_count=2048, int sparse_mode=3) -> Tensor",
        f"{RECIPES_V32}:19", op="npu_lightning_indexer", outputs=(0,),
        caller="models/deepseek-v3.2-exp/models/indexer.py:450"),
    NamespaceSchema("custom",
        "npu_lightning_indexer_quant(Tensor query, Tensor key, Tensor weights, Tensor query_dequant_scale, "
        "Tensor key_dequant_scale, *, Tensor? actual_seq_lengths_query=None, "
        "Tensor? actual_seq_lengths_key=None, Tensor? block_table=None, int query_quant_mode=0, "
        "int key_quant_mode=0, str layout_query='BSND', str layout_key='BSND', int sparse_count=2048, "
        "int sparse_mode=3) -> Tensor",
        f"{RECIPES_V32}:20", op="npu_quant_lightning_indexer", outputs=(0,),
        caller="models/deepseek-v3.2-exp/models/indexer.py:448 (kv_cache_quant_mode int8)"),
    NamespaceSchema("custom",
        "npu_mla_prolog_v3(Tensor token_x, Tensor weight_dq, Tensor weight_uq_qr, Tensor weight_uk, "
        "Tensor weight_dkv_kr, Tensor rmsnorm_gamma_cq, Tensor rmsnorm_gamma_ckv, Tensor rope_sin, "
        "Tensor rope_cos, Tensor(a!) kv_cache, Tensor(b!) kr_cache, *, Tensor? cache_index=None, "
        "Tensor? dequant_scale_x=None, Tensor? dequant_scale_w_dq=None, Tensor? dequant_scale_w_uq_qr=None, "
        "Tensor? dequant_scale_w_dkv_kr=None, Tensor? quant_scale_ckv=None, Tensor? quant_scale_ckr=None, "
        "Tensor? smooth_scales_cq=None, Tensor? actual_seq_len=None, Tensor? k_nope_clip_alpha=None, "
        "float rmsnorm_epsilon_cq=1e-05, float rmsnorm_epsilon_ckv=1e-05, str cache_mode='PA_BSND', "
        "bool query_norm_flag=False, int weight_quant_mode=0, int kv_cache_quant_mode=0, "
        "int query_quant_mode=0, int ckvkr_repo_mode=0, int quant_scale_repo_mode=0, int tile_size=128, "
        "float qc_qr_scale=1.0, float kc_scale=1.0) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
        f"{RECIPES_V32}:23", op="npu_mla_prolog_v3",
        caller="models/deepseek-v3.2-exp/models/modeling_deepseek.py:1133"),
    NamespaceSchema("custom",
        "npu_mla_prolog_v3_functional(Tensor token_x, Tensor weight_dq, Tensor weight_uq_qr, "
        "Tensor weight_uk, Tensor weight_dkv_kr, Tensor rmsnorm_gamma_cq, Tensor rmsnorm_gamma_ckv, "
        "Tensor rope_sin, Tensor rope_cos, Tensor kv_cache, Tensor kr_cache, *, Tensor? cache_index=None, "
        "Tensor? dequant_scale_x=None, Tensor? dequant_scale_w_dq=None, Tensor? dequant_scale_w_uq_qr=None, "
        "Tensor? dequant_scale_w_dkv_kr=None, Tensor? quant_scale_ckv=None, Tensor? quant_scale_ckr=None, "
        "Tensor? smooth_scales_cq=None, Tensor? actual_seq_len=None, Tensor? k_nope_clip_alpha=None, "
        "float rmsnorm_epsilon_cq=1e-05, float rmsnorm_epsilon_ckv=1e-05, str cache_mode='PA_BSND', "
        "bool query_norm_flag=False, int weight_quant_mode=0, int kv_cache_quant_mode=0, "
        "int query_quant_mode=0, int ckvkr_repo_mode=0, int quant_scale_repo_mode=0, "
        "int tile_size=128, float qc_qr_scale=1.0, float kc_scale=1.0) -> "
        "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
        f"{RECIPES_V32}:33", op="npu_mla_prolog_v3", functional=("kv_cache", "kr_cache"),
        caller="models/deepseek-v3.2-exp/models/model_infer.py:87 (graph-mode functionalisation)"),
    # --------------------------------------- cann-recipes-infer current (DeepSeek-V4 set)
    NamespaceSchema("custom",
        "npu_quant_lightning_indexer(Tensor query, Tensor key, Tensor weights, Tensor query_dequant_scale, "
        "Tensor key_dequant_scale, int query_quant_mode, int key_quant_mode, *, "
        "Tensor? actual_seq_lengths_query=None, Tensor? actual_seq_lengths_key=None, "
        "Tensor? block_table=None, Tensor? metadata=None, str layout_query='BSND', str layout_key='PA_BSND', "
        "int sparse_count=2048, int sparse_mode=3, int pre_tokens=9223372036854775807, "
        "int next_tokens=9223372036854775807, int cmp_ratio=1, bool return_value=False, "
        "int? query_dtype=None, int? key_dtype=None) -> (Tensor, Tensor)",
        f"{RECIPES_HEAD}:84", op="custom_npu_quant_lightning_indexer",
        caller="sglang's DeepSeek-V4 Ascend attention backend (python/sglang/srt/hardware_backend/npu/attention/, "
        "through the recipes' custom_ops package)"),
    NamespaceSchema("custom",
        "npu_quant_lightning_indexer_metadata(int num_heads_q, int num_heads_k, int head_dim, int query_quant_mode, "
        "int key_quant_mode, *, Tensor? actual_seq_lengths_query=None, Tensor? actual_seq_lengths_key=None, "
        "int batch_size=0, int max_seqlen_q=0, int max_seqlen_k=0, str layout_query='BSND', "
        "str layout_key='BSND', int sparse_count=2048, int sparse_mode=3, int pre_tokens=9223372036854775807, "
        "int next_tokens=9223372036854775807, int cmp_ratio=1, str device='npu:0') -> Tensor",
        f"{RECIPES_HEAD}:102", op="npu_vllm_quant_lightning_indexer_metadata",
        caller="cann-recipes-infer ops/ascendc/docs/custom-npu_quant_lightning_indexer.md (example)"),
    # --------------------------------------- DeepSeek-V4 small ops (docs/v4.md), both namespaces
    NamespaceSchema("_C_ascend",
        "npu_rms_norm_dynamic_quant(Tensor x, Tensor gamma, Tensor? smooth_scale=None, Tensor? beta=None, "
        "float epsilon=1e-6) -> (Tensor y_out, Tensor scale_out)",
        f"{VLLM_ASCEND}:2385", op="npu_rms_norm_dynamic_quant",
        caller="vllm_ascend/attention/dsa_v1.py (_mla_prolog_single_stream, W8A8 q_a norm)"),
    NamespaceSchema("_C_ascend",
        # a later torch_binding.cpp (001c5b56) adds ``bool negate_sin=False``; its line is not
        # known here, so the binding keeps this snapshot's schema (ascend_emu.ops takes negate_sin)
        "inplace_partial_rotary_mul(Tensor(a!) x, Tensor r1, Tensor r2, str rotary_mode, int[] partial_slice) -> ()",
        f"{VLLM_ASCEND}:2378", op="inplace_partial_rotary_mul",
        caller="vllm_ascend/models/deepseek_v4/indexer.py (q rope, partial_slice [64, 128]); "
        "vllm_ascend/attention/dsa_v1.py (q / kv rope and the inverse rope of the output, [448, 512])"),
    NamespaceSchema("_C_ascend",
        "compressor_metadata(Tensor rope_cos, Tensor rope_sin, Tensor cu_seqlens, Tensor start_pos, "
        "Tensor kv_block_table, int kv_block_size, int slot_mapping_format, int compress_ratio, "
        "int num_compressed_tokens, int num_reqs_actual) -> (Tensor, Tensor, Tensor)",
        f"{VLLM_ASCEND}:2239", op="compressor_metadata",
        caller="vllm_ascend/attention/dsa_v1.py (_update_compressed_caches_and_select_topk)"),
    NamespaceSchema("_C_ascend",
        # argument names of the out tensors: a reading (the golden passes them by position)
        "compressor_metadata_out(Tensor rope_cos, Tensor rope_sin, Tensor cu_seqlens, Tensor start_pos, "
        "Tensor kv_block_table, int kv_block_size, int slot_mapping_format, int compress_ratio, "
        "int num_reqs_actual, Tensor(a!) cos_out, Tensor(b!) sin_out, Tensor(c!) slot_mapping_out) "
        "-> (Tensor(a!), Tensor(b!), Tensor(c!))",
        f"{VLLM_ASCEND}:2249", op="compressor_metadata_out",
        caller="vllm-ascend tests/e2e/nightly/single_node/ops/singlecard_ops/test_compressor_metadata.py"),
    NamespaceSchema("custom",
        "npu_rms_norm_dynamic_quant(Tensor x, Tensor gamma, *, Tensor? smooth_scale=None, Tensor? beta=None, "
        "float epsilon=1e-6) -> (Tensor, Tensor)",
        f"{RECIPES_HEAD}:117", op="npu_rms_norm_dynamic_quant",
        caller="cann-recipes-infer ops/ascendc/examples/test_npu_rms_norm_dynamic_quant.py"),
    NamespaceSchema("custom",
        "inplace_partial_rotary_mul(Tensor(a!) x, Tensor r1, Tensor r2, *, str rotary_mode, "
        "int[2] partial_slice) -> ()",
        f"{RECIPES_HEAD}:47", op="inplace_partial_rotary_mul",
        caller="cann-recipes-infer ops/ascendc/examples/test_npu_inplace_partial_rotary_mul.py"),
    # ------------------------------------------------ DeepSeek-V4 mHC (ops.hc), both namespaces
    NamespaceSchema("_C_ascend",
        "npu_hc_pre_v2(Tensor x, Tensor hc_fn, Tensor hc_scale, Tensor hc_base, int hc_mult, "
        "int hc_sinkhorn_iters, float norm_eps, float hc_eps) -> (Tensor out0, Tensor out1, Tensor out2)",
        f"{VLLM_ASCEND}:2369", op="npu_hc_pre_v2",
        caller="vllm_ascend/models/deepseek_v4/model.py (hc_pre before attention and FFN)"),
    NamespaceSchema("_C_ascend",
        "npu_hc_pre_v3(Tensor x, Tensor hc_fn, Tensor hc_scale, Tensor hc_base, Tensor? pre_mix=None, *, "
        "int hc_mult=4, int hc_sinkhorn_iters=20, float norm_eps=1e-6, float hc_eps=1e-6"
        ") -> (Tensor y, Tensor post, Tensor comb_frag, Tensor pre)",
        f"{VLLM_ASCEND_V41}:char~174300", op="npu_hc_pre_v3",
        caller="DeepSeek-V4.1 lagged hyper-connections (the golden test_npu_hc_pre.py passes pre_mix)"),
    NamespaceSchema("_C_ascend",
        "npu_hc_post(Tensor x, Tensor residual, Tensor post, Tensor comb) -> (Tensor out)",
        f"{VLLM_ASCEND}:2359", op="npu_hc_post",
        # vllm-ascend's adapter (check_hc_post_shape_and_dtype) takes a 3-D x [B, S, D] only
        fixed=(("x_layout", "BSD"),),
        caller="vllm_ascend/models/deepseek_v4/model.py (hc_post after attention and FFN)"),
    NamespaceSchema("custom",
        "npu_hc_pre(Tensor x, Tensor hc_fn, Tensor hc_scale, Tensor hc_base, *, int hc_mult=4, "
        "int hc_sinkhorn_iters=20, float norm_eps=1e-6, float hc_eps=1e-6) -> (Tensor, Tensor, Tensor)",
        f"{RECIPES_HEAD}:78", op="npu_hc_pre",
        caller="ops/ascendc/examples/test_npu_hc_pre.py; the V4 model through the custom_ops package"),
    NamespaceSchema("custom",
        "npu_hc_pre_inv_rms(Tensor x, *, float epsilon=1e-20) -> Tensor",
        f"{RECIPES_HEAD}:76", op="npu_hc_pre_inv_rms",
        caller="custom_ops/csrc/npu_hc_pre.cpp (the decomposed chain)"),
    NamespaceSchema("custom",
        "npu_hc_pre_sinkhorn(Tensor mixes, Tensor rsqrt, Tensor hc_scale, Tensor hc_base, Tensor x, "
        "int hc_mult=4, int hc_sinkhorn_iters=20, float hc_eps=1e-5) -> (Tensor, Tensor, Tensor)",
        f"{RECIPES_HEAD}:73", op="npu_hc_pre_sinkhorn",
        caller="custom_ops/csrc/npu_hc_pre.cpp (the decomposed chain)"),
    NamespaceSchema("custom",
        "npu_hc_post(Tensor x, Tensor residual, Tensor post, Tensor comb) -> Tensor",
        f"{RECIPES_HEAD}:44", op="npu_hc_post",
        caller="ops/ascendc/examples/test_npu_hc_post.py; the V4 model through the custom_ops package"),
    # ------------------------- DeepSeek-V4 shared-KV attention (ops.sparse_attn_sharedkv), both namespaces
    NamespaceSchema("_C_ascend",
        "npu_sparse_attn_sharedkv(Tensor q, *, Tensor? ori_kv=None, Tensor? cmp_kv=None, "
        "Tensor? ori_sparse_indices=None, Tensor? cmp_sparse_indices=None, Tensor? ori_block_table=None, "
        "Tensor? cmp_block_table=None, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_ori_kv=None, "
        "Tensor? cu_seqlens_cmp_kv=None, Tensor? seqused_q=None, Tensor? seqused_kv=None, Tensor? sinks=None, "
        "Tensor? metadata=None, float softmax_scale=0, int cmp_ratio=0, int ori_mask_mode=4, "
        "int cmp_mask_mode=3, int ori_win_left=128, int ori_win_right=0, str layout_q=\"BSND\", "
        "str layout_kv=\"PA_ND\", bool return_softmax_lse=False) -> (Tensor out, Tensor softmax_lse)",
        f"{VLLM_ASCEND}:2277", op="npu_sparse_attn_sharedkv",
        caller="vllm_ascend/attention/dsa_v1.py (the V4 attention, ori_win_left=127 passed explicitly)"),
    NamespaceSchema("_C_ascend",
        "npu_sparse_attn_sharedkv_metadata(int num_heads_q, int num_heads_kv, int head_dim, "
        "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_ori_kv=None, Tensor? cu_seqlens_cmp_kv=None, "
        "Tensor? seqused_q=None, Tensor? seqused_kv=None, int batch_size=0, int max_seqlen_q=0, "
        "int max_seqlen_kv=0, int ori_topk=0, int cmp_topk=0, int cmp_ratio=4, int ori_mask_mode=4, "
        "int cmp_mask_mode=3, int ori_win_left=128, int ori_win_right=0, str layout_q=\"BSND\", "
        "str layout_kv=\"PA_ND\", bool has_ori_kv=True, bool has_cmp_kv=True, str device=\"npu\""
        ") -> (Tensor metadata)",
        f"{VLLM_ASCEND}:2306", op="npu_sparse_attn_sharedkv_metadata",
        caller="vllm_ascend/attention/dsa_v1.py (_build_sas_metadata)"),
    NamespaceSchema("custom",
        "npu_sparse_attn_sharedkv(Tensor q, *, Tensor? ori_kv=None, Tensor? cmp_kv=None, "
        "Tensor? ori_sparse_indices=None, Tensor? cmp_sparse_indices=None, Tensor? ori_block_table=None, "
        "Tensor? cmp_block_table=None, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_ori_kv=None, "
        "Tensor? cu_seqlens_cmp_kv=None, Tensor? seqused_q=None, Tensor? seqused_kv=None, Tensor? sinks=None, "
        "Tensor? metadata=None, float softmax_scale=0, int cmp_ratio=0, int ori_mask_mode=4, "
        "int cmp_mask_mode=3, int ori_win_left=127, int ori_win_right=0, str layout_q='BSND', "
        "str layout_kv='PA_ND', bool return_softmax_lse=False) -> (Tensor, Tensor)",
        f"{RECIPES_HEAD}:98", op="npu_sparse_attn_sharedkv",
        caller="cann-recipes-infer ops/ascendc/docs/custom-npu_sparse_attn_sharedkv.md (example)"),
    NamespaceSchema("custom",
        "npu_sparse_attn_sharedkv_metadata(int num_heads_q, int num_heads_kv, int head_dim, *, "
        "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_ori_kv=None, Tensor? cu_seqlens_cmp_kv=None, "
        "Tensor? seqused_q=None, Tensor? seqused_kv=None, int batch_size=0, int max_seqlen_q=0, "
        "int max_seqlen_kv=0, int ori_topk=0, int cmp_topk=0, int cmp_ratio=-1, int ori_mask_mode=4, "
        "int cmp_mask_mode=3, int ori_win_left=127, int ori_win_right=0, str layout_q='BSND', "
        "str layout_kv='PA_ND', bool has_ori_kv=True, bool has_cmp_kv=True, str device='npu:0') -> Tensor",
        f"{RECIPES_HEAD}:90", op="npu_sparse_attn_sharedkv_metadata",
        caller="cann-recipes-infer ops/ascendc/docs/custom-npu_sparse_attn_sharedkv_metadata.md"),
    # ------------------------- DeepSeek-V4 cache writers (ops.kv_compress_epilog, ops.indexer_compress_epilog; Ascend 950)
    NamespaceSchema("_C_ascend",
        "kv_compress_epilog(Tensor(a!) kv_compress_cache, Tensor x, Tensor slot_mapping, int quant_group_size, "
        "int quant_mode, bool round_scale_flag, int layout) -> ()",
        f"{VLLM_ASCEND}:2396", op="kv_compress_epilog",
        # no scale in this schema: None selects vllm-ascend's kernel (no HiF8; groups 64 / 128; layouts 1 / 2)
        fixed=(("scale", None),),
        caller="vllm_ascend/device/device_op.py (A5 dsa_kv_compress_scatter: cache.view(-1, 1, 640), layout=1)"),
    NamespaceSchema("_C_ascend",
        "indexer_compress_epilog_v2(Tensor(a!) indexer_compress_cache, Tensor x, Tensor slot_mapping, "
        "int layout=2) -> ()",
        f"{VLLM_ASCEND}:2485", op="indexer_compress_epilog_v2",
        caller="vllm_ascend/device/device_op.py (A5 indexer_quant_scatter: indexer_full_cache.view(torch.uint8))"),
    NamespaceSchema("custom",
        "kv_compress_epilog(Tensor(a!) kv_compress_cache, Tensor x, Tensor slot_mapping, "
        " *, int quant_group_size=64, int quant_mode = 2, bool round_scale_flag=True, float scale=1.0) -> ()",
        f"{RECIPES_HEAD}:95", op="kv_compress_epilog",
        fixed=(("layout", 1),),  # the recipes' kernel has layout 1 only (rows at slot * row width)
        caller="cann-recipes-infer ops/ascendc/examples/test_npu_kv_compress_epilog.py"),
    NamespaceSchema("custom",
        "indexer_compress_epilog(Tensor(a!) indexer_compress_cache, Tensor(b!) indexer_compress_scale, Tensor x, "
        "Tensor slot_mapping, *, int quant_mode=1, bool round_scale=True, float scale=1.0) -> ()",
        f"{RECIPES_HEAD}:45", op="indexer_compress_epilog",
        caller="cann-recipes-infer ops/ascendc/examples/test_npu_indexer_compress_epilog.py"),
    # ------------------------------- DeepSeek-V4 row scatters (ops.scatter_nd_update), both namespaces
    NamespaceSchema("_C_ascend",
        "npu_scatter_nd_update_v2(Tensor(a!) var, Tensor indices, Tensor update) -> ()",
        f"{VLLM_ASCEND}:2515", op="npu_scatter_nd_update_v2",
        caller="vllm_ascend/device/device_op.py:694 (dsa_kv_compress_scatter: [n, 2] (block, offset) rows); "
        ":720-721 (the indexer's int8 key and fp16 scale caches)"),
    NamespaceSchema("_C_ascend",
        "npu_scatter_nd_update_sk(Tensor(a!) var, Tensor indices, Tensor update) -> ()",
        f"{VLLM_ASCEND_V41}:char~180700", op="npu_scatter_nd_update_sk",
        caller="DeepSeek-V4.1's cache writers (npu_scatter_nd_update_sk(cache, slot_mapping, x) on A2 / A3); "
        "tests/e2e/nightly/single_node/ops/singlecard_ops/test_scatter_nd_update_sk.py"),
    NamespaceSchema("custom",
        "scatter_nd_update_asc(Tensor(a!) var, Tensor indices, Tensor update) -> ()",
        f"{RECIPES_HEAD}:71", op="scatter_nd_update_asc",
        caller="cann-recipes-infer models/deepseek_v4 (update_win_kv: the bf16 / int8 window cache as "
        "[rows, D] with slot_mapping.view(-1, 1); the indexer's int8 keys and fp16 scales)"),
    # ------------------------- torch_npu ops that vllm-ascend's later torch_binding.cpp also declares
    NamespaceSchema("_C_ascend",
        "npu_scatter_pa_kv_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
        "Tensor slot_mapping, *, str cache_mode='Norm', str scatter_mode='None') -> ()",
        f"{VLLM_ASCEND_V41}:char~165800", op="npu_scatter_pa_kv_cache",
        caller="vllm-ascend's V4.1-era cache writes (cache_mode 'Norm' by default, where torch_npu's is 'PA_NZ'; "
        "scatter_mode only 'None', torch_npu's adapter's one value)"),
    NamespaceSchema("_C_ascend",
        "npu_mla_prolog_v3(Tensor token_x, Tensor weight_dq, Tensor weight_uq_qr, Tensor weight_uk, "
        "Tensor weight_dkv_kr, Tensor rmsnorm_gamma_cq, Tensor rmsnorm_gamma_ckv, Tensor rope_sin, "
        "Tensor rope_cos, Tensor(a!) kv_cache, Tensor(b!) kr_cache, *, Tensor? cache_index=None, "
        "Tensor? dequant_scale_x=None, Tensor? dequant_scale_w_dq=None, Tensor? dequant_scale_w_uq_qr=None, "
        "Tensor? dequant_scale_w_dkv_kr=None, Tensor? quant_scale_ckv=None, Tensor? quant_scale_ckr=None, "
        "Tensor? smooth_scales_cq=None, Tensor? actual_seq_len=None, Tensor? k_nope_clip_alpha=None, "
        "float rmsnorm_epsilon_cq=1e-05, float rmsnorm_epsilon_ckv=1e-05, str cache_mode=\"PA_BSND\", "
        "bool query_norm_flag=False, int weight_quant_mode=0, int kv_cache_quant_mode=0, "
        "int query_quant_mode=0, int ckvkr_repo_mode=0, int quant_scale_repo_mode=0, int tile_size=128, "
        "float qc_qr_scale=1.0, float kc_scale=1.0) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
        f"{VLLM_ASCEND_V41}:char~145900", op="npu_mla_prolog_v3",
        untagged_uint8=("token_x", "weight_dq", "weight_uq_qr", "weight_dkv_kr", "kv_cache"),
        caller="torch_npu's schema without the five *_dtype tags (the binding's comment: aligned with "
        "torch_npu, the underlying aclnn op MlaPrologV3 of the Ascend 950)"),
    # ----------------------------------------- DeepSeek-V4 KV compressor (ops.compressor), both namespaces
    NamespaceSchema("_C_ascend",
        "compressor(Tensor x, Tensor wkv, Tensor wgate, Tensor(a!) state_cache, Tensor ape, Tensor norm_weight, "
        "Tensor rope_sin, Tensor rope_cos, Tensor? state_block_table, Tensor? cu_seqlens, Tensor? seqused, "
        "Tensor? start_pos, int rope_head_dim, int cmp_ratio, int coff, float norm_eps, int rotary_mode, "
        "int cache_mode) -> Tensor",
        f"{VLLM_ASCEND}:2226", op="compressor",
        caller="vllm_ascend/models/deepseek_v4/compressor.py (Compressor.forward: rotary_mode=2, cache_mode=1)"),
    NamespaceSchema("custom",
        "compressor(Tensor x, Tensor wkv, Tensor wgate, Tensor(a!) state_cache, Tensor ape, Tensor norm_weight, "
        "Tensor rope_sin, Tensor rope_cos, int rope_head_dim, int cmp_ratio, *, Tensor? state_block_table=None, "
        "Tensor? cu_seqlens=None, Tensor? seqused=None, Tensor? start_pos=None, int coff=1, float norm_eps=1e-6, "
        "int rotary_mode=1, int cache_mode=1) -> (Tensor)",
        f"{RECIPES_HEAD}:60", op="compressor",
        caller="cann-recipes-infer ops/ascendc/docs/custom-npu_compressor.md (example)"),
    # ------- DeepSeek-V4 shared-KV attention, Ascend 950 (ops.kv_quant_sparse_attn_sharedkv), both namespaces
    NamespaceSchema("_C_ascend",
        # not keyword-only after kv_quant_mode (the torch_npu-style custom schema is)
        "npu_kv_quant_sparse_attn_sharedkv(Tensor q, int kv_quant_mode, Tensor? ori_kv=None, Tensor? cmp_kv=None, "
        "Tensor? ori_sparse_indices=None, Tensor? cmp_sparse_indices=None, Tensor? ori_block_table=None, "
        "Tensor? cmp_block_table=None, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_ori_kv=None, "
        "Tensor? cu_seqlens_cmp_kv=None, Tensor? seqused_q=None, Tensor? seqused_kv=None, Tensor? sinks=None, "
        "Tensor? metadata=None, int tile_size=0, int rope_head_dim=0, float softmax_scale=0.0, int cmp_ratio=0, "
        "int ori_mask_mode=4, int cmp_mask_mode=3, int ori_win_left=127, int ori_win_right=0, "
        "str layout_q='BSND', str layout_kv='PA_ND', bool return_softmax_lse=False"
        ") -> (Tensor out, Tensor softmax_lse)",
        f"{VLLM_ASCEND}:2409", op="npu_kv_quant_sparse_attn_sharedkv",
        caller="vllm_ascend/device/device_op.py (A5: kv_quant_mode=1, tile_size=64, rope_head_dim=64) through "
        "vllm_ascend/attention/dsa_v1.py"),
    NamespaceSchema("_C_ascend",
        "npu_kv_quant_sparse_attn_sharedkv_metadata(int num_heads_q, int num_heads_kv, int head_dim, "
        "int kv_quant_mode, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_ori_kv=None, "
        "Tensor? cu_seqlens_cmp_kv=None, Tensor? seqused_q=None, Tensor? seqused_kv=None, int batch_size=0, "
        "int max_seqlen_q=0, int max_seqlen_kv=0, int ori_topk=0, int cmp_topk=0, int tile_size=0, "
        "int rope_head_dim=0, int cmp_ratio=-1, int ori_mask_mode=4, int cmp_mask_mode=3, int ori_win_left=127, "
        "int ori_win_right=0, str layout_q='BSND', str layout_kv='PA_ND', bool has_ori_kv=True, "
        "bool has_cmp_kv=True, str device='npu') -> Tensor",
        f"{VLLM_ASCEND}:2442", op="npu_kv_quant_sparse_attn_sharedkv_metadata",
        caller="vllm_ascend/attention/dsa_v1.py (_build_sas_metadata; A5 passes kv_quant_mode=1 only)"),
    NamespaceSchema("custom",
        "npu_kv_quant_sparse_attn_sharedkv(Tensor q, int kv_quant_mode, *, Tensor? ori_kv=None, "
        "Tensor? cmp_kv=None, Tensor? ori_sparse_indices=None, Tensor? cmp_sparse_indices=None, "
        "Tensor? ori_block_table=None, Tensor? cmp_block_table=None, Tensor? cu_seqlens_q=None, "
        "Tensor? cu_seqlens_ori_kv=None, Tensor? cu_seqlens_cmp_kv=None, Tensor? seqused_q=None, "
        "Tensor? seqused_kv=None, Tensor? sinks=None, Tensor? metadata=None, int tile_size=0, "
        "int rope_head_dim=0, float softmax_scale=0, int cmp_ratio=0, int ori_mask_mode=4, int cmp_mask_mode=3, "
        "int ori_win_left=127, int ori_win_right=0, str layout_q='BSND', str layout_kv='PA_ND', "
        "bool return_softmax_lse=False) -> (Tensor, Tensor)",
        f"{RECIPES_HEAD}:106", op="npu_kv_quant_sparse_attn_sharedkv",
        caller="cann-recipes-infer's DeepSeek-V4 Ascend 950 path through the custom_ops package"),
    NamespaceSchema("custom",
        "npu_kv_quant_sparse_attn_sharedkv_metadata(int num_heads_q, int num_heads_kv, int head_dim, "
        "int kv_quant_mode, *, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_ori_kv=None, "
        "Tensor? cu_seqlens_cmp_kv=None, Tensor? seqused_q=None, Tensor? seqused_kv=None, int batch_size=0, "
        "int max_seqlen_q=0, int max_seqlen_kv=0, int ori_topk=0, int cmp_topk=0, int tile_size=0, "
        "int rope_head_dim=0, int cmp_ratio=-1, int ori_mask_mode=4, int cmp_mask_mode=3, int ori_win_left=127, "
        "int ori_win_right=0, str layout_q='BSND', str layout_kv='PA_ND', bool has_ori_kv=True, "
        "bool has_cmp_kv=True, str device='npu:0') -> Tensor",
        f"{RECIPES_HEAD}:113", op="npu_kv_quant_sparse_attn_sharedkv_metadata",
        caller="cann-recipes-infer's DeepSeek-V4 Ascend 950 path through the custom_ops package"),
    # ----------------- DeepSeek-V4 indexer over compressed keys (ops.vllm_quant_lightning_indexer), _C_ascend
    NamespaceSchema("_C_ascend",
        "npu_vllm_quant_lightning_indexer(Tensor query, Tensor key, Tensor weights, Tensor query_dequant_scale, "
        "Tensor key_dequant_scale, int query_quant_mode=0, int key_quant_mode=0, "
        "Tensor? actual_seq_lengths_query=None, Tensor? actual_seq_lengths_key=None, Tensor? block_table=None, "
        "Tensor? metadata=None, str layout_query=\"BSND\", str layout_key=\"BSND\", int sparse_count=2048, "
        "int sparse_mode=3, int pre_tokens=9223372036854775807, int next_tokens=9223372036854775807, "
        "int cmp_ratio=1, bool return_value=False) -> (Tensor sparse_indices, Tensor sparse_values)",
        f"{VLLM_ASCEND}:2259", op="npu_vllm_quant_lightning_indexer",
        caller="vllm_ascend/models/deepseek_v4/indexer.py (select_topk: TND, PA_BSND, cmp_ratio 4)"),
    NamespaceSchema("_C_ascend",
        "npu_vllm_quant_lightning_indexer_metadata(int num_heads_q, int num_heads_k, int head_dim, "
        "int query_quant_mode, int key_quant_mode, Tensor? actual_seq_lengths_query=None, "
        "Tensor? actual_seq_lengths_key=None, int batch_size=0, int max_seqlen_q=0, int max_seqlen_k=0, "
        "str layout_query=\"BSND\", str layout_key=\"BSND\", int sparse_count=2048, int sparse_mode=3, "
        "int pre_tokens=9223372036854775807, int next_tokens=9223372036854775807, int cmp_ratio=1, "
        "str device=\"npu\") -> (Tensor metadata)",
        f"{VLLM_ASCEND}:2335", op="npu_vllm_quant_lightning_indexer_metadata",
        caller="vllm_ascend/attention/dsa_v1.py (_build_qli_metadata)"),
)


@dataclass(frozen=True)
class PendingSchema:
    """A framework-namespace op registered with its schema and a kernel that raises
    :class:`~ascend_emu.errors.NotEmulatedError` naming what is missing (no
    :mod:`ascend_emu.ops` function; listed as not emulated in docs/v4.md).

    Attributes:
        namespace, schema, source: as :class:`NamespaceSchema`.
        missing: what the public sources do not define (the error's text).
        caller: where the framework calls it.
    """

    namespace: str
    schema: str
    source: str
    missing: str
    caller: str = ""

    @property
    def name(self) -> str:
        """The op's name (the schema up to its argument list)."""
        return self.schema.split("(", 1)[0]


_V41_GAP = ("no public README, golden or kernel source of it was found (only the schema in "
            "csrc/torch_binding.cpp), so the emulator does not know ")
#: DeepSeek-V4.1 ops of a later vllm-ascend (:data:`VLLM_ASCEND_V41`): registered to fail by name.
PENDING_SCHEMAS: tuple[PendingSchema, ...] = (
    PendingSchema("_C_ascend",
        "npu_quant_lightning_indexer_v2(Tensor query, Tensor key, Tensor weights, Tensor query_dequant_scale, "
        "Tensor key_dequant_scale, int topk, int quant_mode, *, Tensor? cu_seqlens_q=None, "
        "Tensor? cu_seqlens_k=None, Tensor? seqused_q=None, Tensor? seqused_k=None, Tensor? cmp_residual_k=None, "
        "Tensor? block_table=None, Tensor? output_idx_offset=None, Tensor? metadata=None, int max_seqlen_q=-1, "
        "str layout_q=\"TND\", str layout_k=\"PA_BBND\", int mask_mode=3, int cmp_ratio=4, int return_value=0"
        ") -> (Tensor sparse_indices, Tensor sparse_values)",
        f"{VLLM_ASCEND_V41}:char~170500",
        _V41_GAP + "the PA_BBND key layout, what cmp_residual_k (the unfinished compression group's keys) and "
        "output_idx_offset add to the indices, nor the quant_mode values (the V4 indexer with compressed keys "
        "is emulated as _C_ascend.npu_vllm_quant_lightning_indexer)",
        caller="DeepSeek-V4.1 serving in vllm-ascend (indexer keys derived from the compressor latent)"),
    PendingSchema("_C_ascend",
        "npu_quant_lightning_indexer_v2_metadata(int num_heads_q, int num_heads_k, int head_dim, int topk, "
        "int quant_mode, *, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, Tensor? seqused_q=None, "
        "Tensor? seqused_k=None, Tensor? cmp_residual_k=None, int batch_size=0, int max_seqlen_q=0, "
        "int max_seqlen_k=0, str layout_q='TND', str layout_k='PA_BBND', int mask_mode=3, int cmp_ratio=1, "
        "str device='npu') -> Tensor",
        f"{VLLM_ASCEND_V41}:char~158000",
        _V41_GAP + "the checks of the indexer this plan is for (npu_quant_lightning_indexer_v2 / _v3 are not "
        "emulated either)",
        caller="DeepSeek-V4.1 serving in vllm-ascend (the v2 / v3 indexers' plan)"),
    PendingSchema("_C_ascend",
        "npu_quant_lightning_indexer_v3(Tensor query, Tensor key, Tensor weights, Tensor query_dequant_scale, "
        "Tensor key_dequant_scale, int topk, int quant_mode, *, Tensor? candidate_topk_index=None, "
        "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, Tensor? seqused_q=None, Tensor? seqused_k=None, "
        "Tensor? cmp_residual_k=None, Tensor? block_table=None, Tensor? output_idx_offset=None, "
        "Tensor? metadata=None, int max_seqlen_q=-1, str layout_q='TND', str layout_k='PA_BBND', int mask_mode=3, "
        "int cmp_ratio=1, int candidate_mode=3, int candidate_topk_blocks=2048, int candidate_block_size=8"
        ") -> (Tensor, Tensor, Tensor)",
        f"{VLLM_ASCEND_V41}:char~158600",
        _V41_GAP + "the two-level top-k (how candidate_topk_index, candidate_mode, candidate_topk_blocks and "
        "candidate_block_size select the candidate blocks), what its three outputs hold, nor the v2 indexer's "
        "PA_BBND keys, cmp_residual_k and output_idx_offset",
        caller="DeepSeek-V4.1 serving in vllm-ascend (two-level top-k)"),
    PendingSchema("_C_ascend",
        "npu_sparse_flash_mla_metadata(int num_heads_q, int num_heads_kv, int head_dim, *, "
        "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_ori_kv=None, Tensor? cu_seqlens_cmp_kv=None, "
        "Tensor? seqused_q=None, Tensor? seqused_ori_kv=None, Tensor? seqused_cmp_kv=None, "
        "Tensor? cmp_residual_kv=None, Tensor? ori_topk_length=None, Tensor? cmp_topk_length=None, "
        "int batch_size=0, int max_seqlen_q=0, int max_seqlen_ori_kv=0, int max_seqlen_cmp_kv=0, int ori_topk=0, "
        "int cmp_topk=0, int cmp_ratio=0, int ori_mask_mode=0, int cmp_mask_mode=0, int ori_win_left=-1, "
        "int ori_win_right=-1, str layout_q='BSND', str layout_kv='BSND', bool has_ori_kv=True, "
        "bool has_cmp_kv=True) -> Tensor",
        f"{VLLM_ASCEND_V41}:char~159500",
        _V41_GAP + "the checks of the attention this plan is for (npu_sparse_flash_mla is not emulated either)",
        caller="DeepSeek-V4.1 serving in vllm-ascend (the sparse flash MLA's plan)"),
    PendingSchema("_C_ascend",
        "npu_sparse_flash_mla(Tensor q, *, Tensor? ori_kv=None, Tensor? cmp_kv=None, "
        "Tensor? ori_sparse_indices=None, Tensor? cmp_sparse_indices=None, Tensor? ori_block_table=None, "
        "Tensor? cmp_block_table=None, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_ori_kv=None, "
        "Tensor? cu_seqlens_cmp_kv=None, Tensor? seqused_q=None, Tensor? seqused_ori_kv=None, "
        "Tensor? seqused_cmp_kv=None, Tensor? cmp_residual_kv=None, Tensor? ori_topk_length=None, "
        "Tensor? cmp_topk_length=None, Tensor? sinks=None, Tensor? metadata=None, float softmax_scale=1.0, "
        "int cmp_ratio=0, int ori_mask_mode=0, int cmp_mask_mode=0, int ori_win_left=-1, int ori_win_right=-1, "
        "str layout_q='BSND', str layout_kv='BSND', int topk_value_mode=1, bool return_softmax_lse=False"
        ") -> (Tensor, Tensor)",
        f"{VLLM_ASCEND_V41}:char~160300",
        _V41_GAP + "its mask modes (defaults 0 here, where the shared-KV attentions take 4 / 3), what "
        "ori_topk_length / cmp_topk_length, cmp_residual_kv and topk_value_mode do, nor its cache layouts "
        "(the V4 shared-KV attentions are emulated as npu_sparse_attn_sharedkv / npu_kv_quant_sparse_attn_sharedkv)",
        caller="DeepSeek-V4.1 serving in vllm-ascend (ori / cmp kv with per-token top-k lengths)"),
)


def _pending_kernel(spec: PendingSchema):
    from ..errors import NotEmulatedError

    def kernel(*_args, **_kwargs):
        raise NotEmulatedError(f"torch.ops.{spec.namespace}.{spec.name} is registered but not emulated by "
                               f"ascend_emu: {spec.missing} (source: {spec.source}; docs/v4.md)")

    kernel.__name__ = f"{spec.namespace}_{spec.name}_not_emulated"
    return kernel


class NamespaceWarning(UserWarning):
    """A framework-namespace op was not registered: it already exists in this process (the
    framework's own library is loaded), so the emulator leaves it alone."""


#: What :func:`register` did with each entry, by ``namespace::name``: ``"registered"`` or
#: ``"skipped: <why>"``.
_REPORT: dict[str, str] = {}


def report() -> dict[str, str]:
    """What the drop-in did with each entry of :data:`NAMESPACE_SCHEMAS`, by
    ``namespace::name``: ``"registered"``, or ``"skipped: <why>"`` (the op is not in
    :mod:`ascend_emu.ops` yet, or the namespace op already existed in the process). A copy."""
    return dict(_REPORT)


def _exists(spec: NamespaceSchema) -> bool:
    import torch

    return hasattr(getattr(torch.ops, spec.namespace), spec.name)


def register() -> dict[str, str]:
    """Register every entry of :data:`NAMESPACE_SCHEMAS` with ``torch.library`` (once per process;
    :mod:`ascend_emu.torch_npu` calls it on import), each one a binding to its
    :mod:`ascend_emu.ops` function (:func:`._registry.register_spec`). Skipped, and said so in
    :func:`report`: an entry whose op :mod:`ascend_emu.ops` does not have; an op the process
    already has (warns :class:`NamespaceWarning`: a real ``_C_ascend`` / ``custom`` library is
    loaded and is left as it is). Returns :func:`report`."""
    import torch

    from .. import ops
    from . import _registry

    for spec in NAMESPACE_SCHEMAS:
        key = f"{spec.namespace}::{spec.qualified}"
        if key in _REPORT:
            continue
        if not hasattr(ops, spec.op):
            _REPORT[key] = f"skipped: ascend_emu.ops has no {spec.op} (not emulated by this version)"
        elif _exists(spec):
            _REPORT[key] = "skipped: already defined in this process (left as it is)"
            warnings.warn(f"torch.ops.{spec.namespace}.{spec.name} already exists in this process (the framework's "
                          f"own op library is loaded): left as it is, not emulated", NamespaceWarning, stacklevel=2)
        else:
            _registry.register_spec(spec)
            _REPORT[key] = "registered"
    _registry.check_packets({(s.namespace, s.name) for s in NAMESPACE_SCHEMAS
                             if _REPORT[f"{s.namespace}::{s.qualified}"] == "registered"})
    for spec in PENDING_SCHEMAS:
        key = f"{spec.namespace}::{spec.name}"
        if key in _REPORT:
            continue
        if _exists(spec):
            _REPORT[key] = "skipped: already defined in this process (left as it is)"
            continue
        lib = _registry._LIBS.get(spec.namespace)
        if lib is None:
            lib = _registry._LIBS[spec.namespace] = torch.library.Library(spec.namespace, "FRAGMENT")
        lib.define(spec.schema)
        lib.impl(spec.name, _pending_kernel(spec), "CompositeExplicitAutograd")
        _REPORT[key] = "not emulated: registered to raise NotEmulatedError"
    return report()
