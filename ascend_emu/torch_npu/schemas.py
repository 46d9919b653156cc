"""torch_npu 2.14's operator schemas for the ops ascend_emu emulates, as data.

Each entry is the schema string exactly as torch_npu 2.14.0 declares it (read from the wheel,
``pip download --no-deps torch-npu==2.14.0``), with the file it comes from; one entry
(:data:`OP_PLUGIN_SOURCE`) is op-plugin master's, 2.14's with a trailing ``sinks`` keyword. :mod:`._registry`
registers them with ``torch.library`` under their namespace (``torch.ops.npu.<name>``,
``torch.ops.atb.npu_mla_preprocess``), alias annotations included; the Python signatures of
``torch_npu.<op>`` are these, not written a second time. Output shapes and dtypes of the fake
(meta) implementations follow ``torch_npu/op_plugin/meta/_meta_registrations.py`` (and
``op_plugin/atb/_atb_meta_registrations.py``), see :mod:`._fake`.

Note the schemas of ``npu_mla_prolog`` / ``_v2`` and ``npu_kv_rmsnorm_rope_cache`` carry no
alias annotation although the ops write their caches in place: torch_npu declares them so, and
the emulator keeps the declaration (their ``_v3`` / ``_v2`` successors are annotated, and have
``_functional`` variants that return the updated caches instead).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..install_hints import TORCH_NPU_VERSION  # noqa: F401  (the version the schemas are taken from)

#: Source files in the torch_npu wheel.
YAML_SOURCE = "torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml"
#: Where a schema is op-plugin master's instead (a later torch_npu's): 2.14's plus trailing
#: optional keywords, so every 2.14 call is still accepted. npu_kv_quant_sparse_flash_attention's
#: ``Tensor? sinks=None`` (the Ascend 950's attention sinks).
OP_PLUGIN_SOURCE = "Ascend/op-plugin@517f2e7d op_plugin/config/op_plugin_functions.yaml:6406"
ATB_SOURCE = "torch_npu/lib/libop_plugin_atb.so (registration string)"
#: The FIA infer_output ops' schemas (lines 6190 and 6207 of the same yaml).
FIA_INFER_OUTPUT_SOURCE = "Ascend/op-plugin@517f2e7d op_plugin/config/op_plugin_functions.yaml:6190"

#: Ops that write caches in place although torch_npu declares them without alias annotations:
#: qualified name -> the arguments written (the ``(a!)`` ones of the annotated ops are read from
#: the schemas).
WRITES_UNANNOTATED: dict[str, tuple[str, ...]] = {
    "npu_kv_rmsnorm_rope_cache": ("k_cache", "ckv_cache"),
    "npu_mla_prolog": ("kv_cache", "kr_cache"),
    "npu_mla_prolog_v2": ("kv_cache", "kr_cache"),
}


@dataclass(frozen=True)
class OpSchema:
    """One torch_npu operator overload.

    Attributes:
        namespace: ``torch.ops`` namespace (``npu`` or ``atb``).
        schema: the schema string, ``name[.overload](args) -> returns``, as torch_npu declares it.
        source: the wheel file it was read from.
    """

    namespace: str
    schema: str
    source: str = YAML_SOURCE

    @property
    def name(self) -> str:
        """Operator name without overload (``npu_format_cast``)."""
        return self.qualified.split(".")[0]

    @property
    def qualified(self) -> str:
        """Name with overload (``npu_format_cast.Tensor``)."""
        return self.schema.split("(", 1)[0]


SCHEMAS: tuple[OpSchema, ...] = (
    OpSchema("npu",
        'get_npu_format(Tensor self) -> int'),
    OpSchema("npu",
        'npu_dynamic_quant(Tensor input, *, Tensor? smooth_scales=None, Tensor? group_index=None, '
        'int? dst_type=None, str quant_mode="pertoken", float dst_type_max=0.0) -> (Tensor, Tensor)'),
    OpSchema("npu",
        'npu_dynamic_quant_asymmetric(Tensor input, *, Tensor? smooth_scales=None, Tensor? group_index=None, '
        'int? dst_type=None, str quant_mode="pertoken", float dst_type_max=0.0) -> (Tensor, Tensor, Tensor)'),
    OpSchema("npu",
        'npu_format_cast.Tensor(Tensor self, Tensor dst, *, int? customize_dtype=None, '
        'int? input_dtype=None) -> Tensor'),
    OpSchema("npu",
        'npu_format_cast_.acl_format(Tensor(a!) self, int acl_format, *, int? customize_dtype=None, '
        'int? input_dtype=None) -> Tensor(a!)'),
    OpSchema("npu",
        'npu_format_cast_(Tensor(a!) self, Tensor src, *, int? customize_dtype=None, '
        'int? input_dtype=None) -> Tensor(a!)'),
    OpSchema("npu",
        'npu_format_cast(Tensor self, int acl_format, *, int? customize_dtype=None, '
        'int? input_dtype=None) -> Tensor'),
    OpSchema("npu",
        'npu_fused_infer_attention_score(Tensor query, Tensor key, Tensor value, *, '
        'Tensor? pse_shift=None, Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, '
        'SymInt[]? actual_seq_lengths_kv=None, Tensor? dequant_scale1=None, '
        'Tensor? quant_scale1=None, Tensor? dequant_scale2=None, Tensor? quant_scale2=None, '
        'Tensor? quant_offset2=None, Tensor? antiquant_scale=None, Tensor? antiquant_offset=None, '
        'Tensor? key_antiquant_scale=None, Tensor? key_antiquant_offset=None, '
        'Tensor? value_antiquant_scale=None, Tensor? value_antiquant_offset=None, '
        'Tensor? block_table=None, Tensor? query_padding_size=None, Tensor? kv_padding_size=None, '
        'Tensor? key_shared_prefix=None, Tensor? value_shared_prefix=None, '
        'SymInt[]? actual_shared_prefix_len=None, Tensor? query_rope=None, Tensor? key_rope=None, '
        'Tensor? key_rope_antiquant_scale=None, int num_heads=1, float scale=1.0, '
        'int pre_tokens=2147483647, int next_tokens=2147483647, str input_layout="BSH", '
        'int num_key_value_heads=0, int sparse_mode=0, int inner_precise=0, int block_size=0, '
        'int antiquant_mode=0, int key_antiquant_mode=0, int value_antiquant_mode=0, '
        'bool softmax_lse_flag=False) -> (Tensor, Tensor)'),
    OpSchema("npu",
        'npu_fused_infer_attention_score.out(Tensor query, Tensor key, Tensor value, *, '
        'Tensor? pse_shift=None, Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, '
        'SymInt[]? actual_seq_lengths_kv=None, Tensor? dequant_scale1=None, '
        'Tensor? quant_scale1=None, Tensor? dequant_scale2=None, Tensor? quant_scale2=None, '
        'Tensor? quant_offset2=None, Tensor? antiquant_scale=None, Tensor? antiquant_offset=None, '
        'Tensor? key_antiquant_scale=None, Tensor? key_antiquant_offset=None, '
        'Tensor? value_antiquant_scale=None, Tensor? value_antiquant_offset=None, '
        'Tensor? block_table=None, Tensor? query_padding_size=None, Tensor? kv_padding_size=None, '
        'Tensor? key_shared_prefix=None, Tensor? value_shared_prefix=None, '
        'SymInt[]? actual_shared_prefix_len=None, Tensor? query_rope=None, Tensor? key_rope=None, '
        'Tensor? key_rope_antiquant_scale=None, int num_heads=1, float scale=1.0, '
        'int pre_tokens=2147483647, int next_tokens=2147483647, str input_layout="BSH", '
        'int num_key_value_heads=0, int sparse_mode=0, int inner_precise=0, int block_size=0, '
        'int antiquant_mode=0, int key_antiquant_mode=0, int value_antiquant_mode=0, '
        'bool softmax_lse_flag=False, Tensor? workspace=None, Tensor(a!) attention_out, '
        'Tensor(b!) softmax_lse) -> (Tensor(a!), Tensor(b!))'),
    OpSchema("npu",
        '_npu_fused_infer_attention_score_get_max_workspace(Tensor query, Tensor key, Tensor value, '
        '*, Tensor? pse_shift=None, Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, '
        'SymInt[]? actual_seq_lengths_kv=None, Tensor? dequant_scale1=None, '
        'Tensor? quant_scale1=None, Tensor? dequant_scale2=None, Tensor? quant_scale2=None, '
        'Tensor? quant_offset2=None, Tensor? antiquant_scale=None, Tensor? antiquant_offset=None, '
        'Tensor? key_antiquant_scale=None, Tensor? key_antiquant_offset=None, '
        'Tensor? value_antiquant_scale=None, Tensor? value_antiquant_offset=None, '
        'Tensor? block_table=None, Tensor? query_padding_size=None, Tensor? kv_padding_size=None, '
        'Tensor? key_shared_prefix=None, Tensor? value_shared_prefix=None, '
        'SymInt[]? actual_shared_prefix_len=None, Tensor? query_rope=None, Tensor? key_rope=None, '
        'Tensor? key_rope_antiquant_scale=None, int num_heads=1, float scale=1.0, '
        'int pre_tokens=2147483647, int next_tokens=2147483647, str input_layout="BSH", '
        'int num_key_value_heads=0, int sparse_mode=0, int inner_precise=0, int block_size=0, '
        'int antiquant_mode=0, int key_antiquant_mode=0, int value_antiquant_mode=0, '
        'bool softmax_lse_flag=False) -> Tensor'),
    OpSchema("npu",
        'npu_fused_infer_attention_score_v2(Tensor query, Tensor key, Tensor value, *, '
        'Tensor? query_rope=None, Tensor? key_rope=None, Tensor? pse_shift=None, '
        'Tensor? atten_mask=None, SymInt[]? actual_seq_qlen=None, SymInt[]? actual_seq_kvlen=None, '
        'Tensor? block_table=None, Tensor? dequant_scale_query=None, Tensor? dequant_scale_key=None, '
        'Tensor? dequant_offset_key=None, Tensor? dequant_scale_value=None, '
        'Tensor? dequant_offset_value=None, Tensor? dequant_scale_key_rope=None, '
        'Tensor? quant_scale_out=None, Tensor? quant_offset_out=None, Tensor? quant_scale_p=None, '
        'Tensor? learnable_sink=None, int num_query_heads=1, int num_key_value_heads=0, '
        'float softmax_scale=1.0, int pre_tokens=2147483647, int next_tokens=2147483647, '
        'str input_layout="BSH", int sparse_mode=0, int block_size=0, int query_quant_mode=0, '
        'int key_quant_mode=0, int value_quant_mode=0, int inner_precise=0, '
        'bool return_softmax_lse=False, int? query_dtype=None, int? key_dtype=None, '
        'int? value_dtype=None, int? query_rope_dtype=None, int? key_rope_dtype=None, '
        'int? key_shared_prefix_dtype=None, int? value_shared_prefix_dtype=None, '
        'int? dequant_scale_query_dtype=None, int? dequant_scale_key_dtype=None, '
        'int? dequant_scale_value_dtype=None, int? dequant_scale_key_rope_dtype=None, '
        'int? out_dtype=None) -> (Tensor, Tensor)'),
    OpSchema("npu",
        'npu_fused_infer_attention_score_v2.out(Tensor query, Tensor key, Tensor value, *, '
        'Tensor? query_rope=None, Tensor? key_rope=None, Tensor? pse_shift=None, '
        'Tensor? atten_mask=None, SymInt[]? actual_seq_qlen=None, SymInt[]? actual_seq_kvlen=None, '
        'Tensor? block_table=None, Tensor? dequant_scale_query=None, Tensor? dequant_scale_key=None, '
        'Tensor? dequant_offset_key=None, Tensor? dequant_scale_value=None, '
        'Tensor? dequant_offset_value=None, Tensor? dequant_scale_key_rope=None, '
        'Tensor? quant_scale_out=None, Tensor? quant_offset_out=None, Tensor? quant_scale_p=None, '
        'Tensor? learnable_sink=None, int num_query_heads=1, int num_key_value_heads=0, '
        'float softmax_scale=1.0, int pre_tokens=2147483647, int next_tokens=2147483647, '
        'str input_layout="BSH", int sparse_mode=0, int block_size=0, int query_quant_mode=0, '
        'int key_quant_mode=0, int value_quant_mode=0, int inner_precise=0, '
        'bool return_softmax_lse=False, int? query_dtype=None, int? key_dtype=None, '
        'int? value_dtype=None, int? query_rope_dtype=None, int? key_rope_dtype=None, '
        'int? key_shared_prefix_dtype=None, int? value_shared_prefix_dtype=None, '
        'int? dequant_scale_query_dtype=None, int? dequant_scale_key_dtype=None, '
        'int? dequant_scale_value_dtype=None, int? dequant_scale_key_rope_dtype=None, '
        'int? out_dtype=None, Tensor? workspace=None, Tensor(a!) attention_out, '
        'Tensor(b!) softmax_lse) -> (Tensor(a!), Tensor(b!))'),
    OpSchema("npu",
        '_npu_fused_infer_attention_score_v2_get_max_workspace(Tensor query, Tensor key, '
        'Tensor value, *, Tensor? query_rope=None, Tensor? key_rope=None, Tensor? pse_shift=None, '
        'Tensor? atten_mask=None, SymInt[]? actual_seq_qlen=None, SymInt[]? actual_seq_kvlen=None, '
        'Tensor? block_table=None, Tensor? dequant_scale_query=None, Tensor? dequant_scale_key=None, '
        'Tensor? dequant_offset_key=None, Tensor? dequant_scale_value=None, '
        'Tensor? dequant_offset_value=None, Tensor? dequant_scale_key_rope=None, '
        'Tensor? quant_scale_out=None, Tensor? quant_offset_out=None, Tensor? quant_scale_p=None, '
        'Tensor? learnable_sink=None, int num_query_heads=1, int num_key_value_heads=0, '
        'float softmax_scale=1.0, int pre_tokens=2147483647, int next_tokens=2147483647, '
        'str input_layout="BSH", int sparse_mode=0, int block_size=0, int query_quant_mode=0, '
        'int key_quant_mode=0, int value_quant_mode=0, int inner_precise=0, '
        'bool return_softmax_lse=False, int? query_dtype=None, int? key_dtype=None, '
        'int? value_dtype=None, int? query_rope_dtype=None, int? key_rope_dtype=None, '
        'int? key_shared_prefix_dtype=None, int? value_shared_prefix_dtype=None, '
        'int? dequant_scale_query_dtype=None, int? dequant_scale_key_dtype=None, '
        'int? dequant_scale_value_dtype=None, int? dequant_scale_key_rope_dtype=None, '
        'int? out_dtype=None) -> Tensor'),
    OpSchema("npu",
        '_npu_fused_infer_attention_score_infer_output(Tensor query, Tensor value, *, str input_layout="BSH", '
        'Tensor? quant_scale2=None, Tensor? block_table=None, int num_heads=1, int num_key_value_heads=0, '
        'bool softmax_lse_flag=False, Tensor? query_rope=None) -> (Tensor, Tensor)', FIA_INFER_OUTPUT_SOURCE),
    OpSchema("npu",
        '_npu_fused_infer_attention_score_v2_infer_output(Tensor query, Tensor value, *, int? query_dtype=None, '
        'int? value_dtype=None, str input_layout="BSH", Tensor? quant_scale_out=None, Tensor? block_table=None, '
        'int num_query_heads=1, int num_key_value_heads=0, bool return_softmax_lse=False, '
        'Tensor? query_rope=None, int? out_dtype=None) -> (Tensor, Tensor)', FIA_INFER_OUTPUT_SOURCE),
    OpSchema("npu",
        'npu_kv_rmsnorm_rope_cache(Tensor kv, Tensor gamma, Tensor cos, Tensor sin, Tensor index, '
        'Tensor k_cache, Tensor ckv_cache, *, Tensor? k_rope_scale=None, Tensor? c_kv_scale=None, '
        'Tensor? k_rope_offset=None, Tensor? c_kv_offset=None, Tensor? v=None, float epsilon=1e-5, '
        "str cache_mode='Norm', bool is_output_kv=False) -> (Tensor, Tensor, Tensor, Tensor)"),
    OpSchema("npu",
        'npu_kv_rmsnorm_rope_cache_v2(Tensor kv, Tensor gamma, Tensor cos, Tensor sin, Tensor index, '
        'Tensor(a!) k_cache, Tensor(b!) ckv_cache, *, Tensor? k_rope_scale=None, '
        'Tensor? c_kv_scale=None, Tensor? k_rope_offset=None, Tensor? c_kv_offset=None, Tensor? v=None, '
        "float epsilon=1e-5, str cache_mode='Norm', bool is_output_kv=False, int? k_cache_dtype=None, "
        'int? ckv_cache_dtype=None) -> (Tensor, Tensor)'),
    OpSchema("npu",
        'npu_kv_rmsnorm_rope_cache_v2_functional(Tensor kv, Tensor gamma, Tensor cos, Tensor sin, '
        'Tensor index, Tensor k_cache, Tensor ckv_cache, *, Tensor? k_rope_scale=None, '
        'Tensor? c_kv_scale=None, Tensor? k_rope_offset=None, Tensor? c_kv_offset=None, Tensor? v=None, '
        "float epsilon=1e-5, str cache_mode='Norm', bool is_output_kv=False, int? k_cache_dtype=None, "
        'int? ckv_cache_dtype=None) -> (Tensor, Tensor, Tensor, Tensor)'),
    OpSchema("npu",
        'npu_kv_quant_sparse_flash_attention(Tensor query, Tensor key, Tensor value, '
        'Tensor sparse_indices, float scale_value, int key_quant_mode, int value_quant_mode, *, '
        'Tensor? key_dequant_scale=None, Tensor? value_dequant_scale=None, Tensor? block_table=None, '
        'Tensor? actual_seq_lengths_query=None, Tensor? actual_seq_lengths_kv=None, '
        'int sparse_block_size=1, str layout_query="BSND", str layout_kv="BSND", int sparse_mode=3, '
        'int pre_tokens=9223372036854775807, int next_tokens=9223372036854775807, int attention_mode=0, '
        'int quant_scale_repo_mode=1, int tile_size=128, int rope_head_dim=64, int? key_dtype=None, '
        'int? value_dtype=None, Tensor? sinks=None) -> Tensor', OP_PLUGIN_SOURCE),
    OpSchema("npu",
        "npu_gather_pa_kv_cache(Tensor key_cache, Tensor value_cache, Tensor block_tables, Tensor seq_lens, "
        "Tensor(a!) key, Tensor(b!) value, *, Tensor? seq_offset=None, bool is_seq_lens_cumsum=False) -> ()"),
    OpSchema("npu",
        "npu_gather_pa_kv_cache_functional(Tensor key_cache, Tensor value_cache, Tensor block_tables, "
        "Tensor seq_lens, Tensor key, Tensor value, *, Tensor? seq_offset=None, bool is_seq_lens_cumsum=False) "
        "-> (Tensor, Tensor)"),
    OpSchema("npu",
        'npu_dtype_cast(Tensor self, int dtype, int? input_dtype=None) -> Tensor'),
    OpSchema("npu",
        'npu_dynamic_mx_quant(Tensor input, *, int axis=-1, str round_mode="rint", int dst_type=296, '
        'int block_size=32, int? scale_alg=0, float dst_type_max=0.0, float max_low_bound=0.0) -> (Tensor, Tensor)'),
    OpSchema("npu",
        'npu_dynamic_mx_quant_with_dual_axis(Tensor input, *, str round_mode="rint", int dst_type=296, '
        'int scale_alg=0, float? dst_type_max=0.0) -> (Tensor, Tensor, Tensor, Tensor)'),
    OpSchema("npu",
        'npu_interleave_rope(Tensor x, Tensor cos, Tensor sin) -> Tensor'),
    OpSchema("npu",
        'npu_lightning_indexer(Tensor query, Tensor key, Tensor weights, *, '
        'Tensor? actual_seq_lengths_query=None, Tensor? actual_seq_lengths_key=None, '
        'Tensor? block_table=None, str layout_query="BSND", str layout_key="BSND", '
        'int sparse_count=2048, int sparse_mode=3, int pre_tokens=9223372036854775807, '
        'int next_tokens=9223372036854775807, bool return_value=False) -> (Tensor, Tensor)'),
    OpSchema("npu",
        'npu_mla_prolog(Tensor token_x, Tensor weight_dq, Tensor weight_uq_qr, Tensor weight_uk, '
        'Tensor weight_dkv_kr, Tensor rmsnorm_gamma_cq, Tensor rmsnorm_gamma_ckv, Tensor rope_sin, '
        'Tensor rope_cos, Tensor cache_index, Tensor kv_cache, Tensor kr_cache, *, '
        'Tensor? dequant_scale_x=None, Tensor? dequant_scale_w_dq=None, '
        'Tensor? dequant_scale_w_uq_qr=None, Tensor? dequant_scale_w_dkv_kr=None, '
        'Tensor? quant_scale_ckv=None, Tensor? quant_scale_ckr=None, Tensor? smooth_scales_cq=None, '
        'float rmsnorm_epsilon_cq=1e-05, float rmsnorm_epsilon_ckv=1e-05, '
        'str cache_mode="PA_BSND") -> (Tensor, Tensor, Tensor, Tensor)'),
    OpSchema("npu",
        'npu_mla_prolog_v2(Tensor token_x, Tensor weight_dq, Tensor weight_uq_qr, Tensor weight_uk, '
        'Tensor weight_dkv_kr, Tensor rmsnorm_gamma_cq, Tensor rmsnorm_gamma_ckv, Tensor rope_sin, '
        'Tensor rope_cos, Tensor cache_index, Tensor kv_cache, Tensor kr_cache, *, '
        'Tensor? dequant_scale_x=None, Tensor? dequant_scale_w_dq=None, '
        'Tensor? dequant_scale_w_uq_qr=None, Tensor? dequant_scale_w_dkv_kr=None, '
        'Tensor? quant_scale_ckv=None, Tensor? quant_scale_ckr=None, Tensor? smooth_scales_cq=None, '
        'float rmsnorm_epsilon_cq=1e-05, float rmsnorm_epsilon_ckv=1e-05, '
        'str cache_mode="PA_BSND") -> (Tensor, Tensor, Tensor, Tensor, Tensor)'),
    OpSchema("npu",
        'npu_mla_prolog_v3(Tensor token_x, Tensor weight_dq, Tensor weight_uq_qr, Tensor weight_uk, '
        'Tensor weight_dkv_kr, Tensor rmsnorm_gamma_cq, Tensor rmsnorm_gamma_ckv, Tensor rope_sin, '
        'Tensor rope_cos, Tensor(a!) kv_cache, Tensor(b!) kr_cache, *, Tensor? cache_index=None, '
        'Tensor? dequant_scale_x=None, Tensor? dequant_scale_w_dq=None, '
        'Tensor? dequant_scale_w_uq_qr=None, Tensor? dequant_scale_w_dkv_kr=None, '
        'Tensor? quant_scale_ckv=None, Tensor? quant_scale_ckr=None, Tensor? smooth_scales_cq=None, '
        'Tensor? actual_seq_len=None, Tensor? k_nope_clip_alpha=None, float rmsnorm_epsilon_cq=1e-05, '
        'float rmsnorm_epsilon_ckv=1e-05, str cache_mode="PA_BSND", bool query_norm_flag=False, '
        'int weight_quant_mode=0, int kv_cache_quant_mode=0, int query_quant_mode=0, '
        'int ckvkr_repo_mode=0, int quant_scale_repo_mode=0, int tile_size=128, float qc_qr_scale=1.0, '
        'float kc_scale=1.0, int? token_x_dtype=None, int? weight_dq_dtype=None, '
        'int? weight_uq_qr_dtype=None, int? weight_dkv_kr_dtype=None, '
        'int? kv_cache_dtype=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor)'),
    OpSchema("npu",
        'npu_mla_prolog_v3_functional(Tensor token_x, Tensor weight_dq, Tensor weight_uq_qr, '
        'Tensor weight_uk, Tensor weight_dkv_kr, Tensor rmsnorm_gamma_cq, Tensor rmsnorm_gamma_ckv, '
        'Tensor rope_sin, Tensor rope_cos, Tensor kv_cache, Tensor kr_cache, *, '
        'Tensor? cache_index=None, Tensor? dequant_scale_x=None, Tensor? dequant_scale_w_dq=None, '
        'Tensor? dequant_scale_w_uq_qr=None, Tensor? dequant_scale_w_dkv_kr=None, '
        'Tensor? quant_scale_ckv=None, Tensor? quant_scale_ckr=None, Tensor? smooth_scales_cq=None, '
        'Tensor? actual_seq_len=None, Tensor? k_nope_clip_alpha=None, float rmsnorm_epsilon_cq=1e-05, '
        'float rmsnorm_epsilon_ckv=1e-05, str cache_mode="PA_BSND", bool query_norm_flag=False, '
        'int weight_quant_mode=0, int kv_cache_quant_mode=0, int query_quant_mode=0, '
        'int ckvkr_repo_mode=0, int quant_scale_repo_mode=0, int tile_size=128, float qc_qr_scale=1.0, '
        'float kc_scale=1.0, int? token_x_dtype=None, int? weight_dq_dtype=None, '
        'int? weight_uq_qr_dtype=None, int? weight_dkv_kr_dtype=None, '
        'int? kv_cache_dtype=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)'),
    OpSchema("npu",
        'npu_quant_lightning_indexer(Tensor query, Tensor key, Tensor weights, Tensor query_dequant_scale, '
        'Tensor key_dequant_scale, int query_quant_mode, int key_quant_mode, *, '
        'Tensor? actual_seq_lengths_query=None, Tensor? actual_seq_lengths_key=None, '
        'Tensor? block_table=None, str layout_query="BSND", str layout_key="BSND", '
        'int sparse_count=2048, int sparse_mode=3, int pre_tokens=9223372036854775807, '
        'int next_tokens=9223372036854775807, int? query_dtype=None, int? key_dtype=None) -> Tensor'),
    OpSchema("npu",
        "npu_rotary_mul(Tensor self, Tensor r1, Tensor r2, str rotary_mode='half', Tensor? rotate=None) -> Tensor"),
    OpSchema("npu",
        "npu_scatter_pa_kv_cache_functional(Tensor key, Tensor value, Tensor key_cache, Tensor value_cache, "
        "Tensor slot_mapping, *, Tensor? compress_lens=None, Tensor? compress_seq_offsets=None, "
        "Tensor? seq_lens=None, str? cache_mode='PA_NZ') -> (Tensor, Tensor)"),
    OpSchema("npu",
        "npu_scatter_pa_kv_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
        "Tensor slot_mapping, *, Tensor? compress_lens=None, Tensor? compress_seq_offsets=None, "
        "Tensor? seq_lens=None, str? cache_mode='PA_NZ') -> ()"),
    OpSchema("npu",
        'npu_sparse_flash_attention(Tensor query, Tensor key, Tensor? value, Tensor sparse_indices, '
        'float scale_value, *, Tensor? block_table=None, Tensor? actual_seq_lengths_query=None, '
        'Tensor? actual_seq_lengths_kv=None, Tensor? query_rope=None, Tensor? key_rope=None, '
        'int sparse_block_size=1, str layout_query="BSND", str layout_kv="BSND", int sparse_mode=3, '
        'int pre_tokens=9223372036854775807, int next_tokens=9223372036854775807, int attention_mode=0, '
        'bool return_softmax_lse=False, Tensor? sinks=None) -> (Tensor, Tensor, Tensor)'),
    OpSchema("atb",
        'npu_mla_preprocess(Tensor input, Tensor gamma0, Tensor beta0, Tensor wdqkv, Tensor descale0, '
        'Tensor gamma1, Tensor beta1, Tensor wuq, Tensor descale1, Tensor gamma2, Tensor cos, '
        'Tensor sin, Tensor wuk, Tensor kv_cache, Tensor kv_cache_rope, Tensor slotmapping, *, '
        ' Tensor? quant_scale0=None, Tensor? quant_offset0=None, Tensor? bias0=None, '
        'Tensor? quant_scale1=None, Tensor? quant_offset1=None, Tensor? bias1=None, '
        'Tensor? ctkv_scale=None, Tensor? q_nope_scale=None, str? cache_mode=None, '
        'str? quant_mode=None) -> (Tensor, Tensor, Tensor, Tensor)',
        ATB_SOURCE),
    OpSchema("atb",
        'npu_mla_preprocess.out(Tensor input, Tensor gamma0, Tensor beta0, Tensor wdqkv, '
        'Tensor descale0, Tensor gamma1, Tensor beta1, Tensor wuq, Tensor descale1, Tensor gamma2, '
        'Tensor cos, Tensor sin, Tensor wuk, Tensor kv_cache, Tensor kv_cache_rope, Tensor slotmapping, '
        '*,  Tensor? quant_scale0=None, Tensor? quant_offset0=None, Tensor? bias0=None, '
        'Tensor? quant_scale1=None, Tensor? quant_offset1=None, Tensor? bias1=None, '
        'Tensor? ctkv_scale=None, Tensor? q_nope_scale=None, str? cache_mode=None, str? quant_mode=None, '
        'Tensor(a!) q_out0, Tensor(b!) kv_cache_out0, Tensor(c!) q_out1, '
        'Tensor(d!) kv_cache_out1) -> (Tensor(a!), Tensor(b!), Tensor(c!), Tensor(d!))',
        ATB_SOURCE),
)
