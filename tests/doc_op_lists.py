"""The op lists of ``docs/torch_npu.md`` and ``docs/pytest_plugin.md``, generated from the drop-in's
registry so that they cannot go stale.

Each list sits in its page between ``<!-- ops:NAME -->`` and ``<!-- /ops:NAME -->``;
``tests/test_readme.py`` checks that every region holds what :func:`regions` generates now.
After adding or removing an op, rewrite them with::

    python -m tests.doc_op_lists --write

Needs torch (the lists are what ``import torch_npu`` registers under the emulator).
"""

from __future__ import annotations

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: Pages holding generated regions.
PAGES = ("docs/torch_npu.md", "docs/pytest_plugin.md")
REGION = re.compile(r"(<!-- ops:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /ops:(?P=name) -->)", re.S)

#: What vllm-ascend's ``tests/ut/conftest.py`` mocks on ``torch_npu`` and the SFA path calls
#: through ``torch_npu`` / ``torch.ops._C_ascend`` (docs/pytest_plugin.md): the ones the registry
#: does not have are listed as "not emulated", the others drop out of that list by themselves.
MOCKED_BY_VLLM_ASCEND = (
    "npu_fusion_attention", "_npu_flash_attention", "_npu_paged_attention_splitfuse", "_npu_reshape_and_cache",
    "npu_fused_infer_attention_score", "_npu_fused_infer_attention_score_get_max_workspace",
    "npu_moe_gating_top_k_softmax", "npu_quant_matmul", "npu_rms_norm", "npu_swiglu",
    "npu_convert_weight_to_int4pack", "npu_scatter_nd_update_", "npu_dynamic_block_quant", "npu_dynamic_mx_quant",
    "npu_transpose_batchmatmul", "_C_ascend.batch_matmul_transpose", "_C_ascend.mla_preprocess",
    "_C_ascend.store_kv_block", "_C_ascend.store_kv_block_metadata", "_C_ascend.npu_scatter_nd_update_v2",
)


def registered() -> dict[str, list[str]]:
    """Namespace -> sorted op names the drop-in registers (``npu``, ``atb``, ``_C_ascend``, ``custom``)."""
    import ascend_emu.torch_npu  # noqa: F401  (registers everything)
    from ascend_emu.torch_npu import namespaces
    from ascend_emu.torch_npu.schemas import SCHEMAS

    out: dict[str, set[str]] = {}
    for spec in SCHEMAS:
        out.setdefault(spec.namespace, set()).add(spec.name)
    done = namespaces.report()
    for spec in namespaces.NAMESPACE_SCHEMAS:
        if done.get(f"{spec.namespace}::{spec.qualified}") == "registered":
            out.setdefault(spec.namespace, set()).add(spec.name)
    return {ns: sorted(names) for ns, names in sorted(out.items())}


def _names(names) -> str:
    return ", ".join(f"`{n}`" for n in names)


def regions() -> dict[str, str]:
    """Region name -> its markdown (ending in a newline)."""
    ops = registered()
    emulated = [f"- `torch_npu.<op>` / `torch.ops.npu.<op>` ({len(ops['npu'])}): {_names(ops['npu'])}"]
    emulated += [f"- `torch.ops.{ns}.<op>` ({len(names)}): {_names(names)}" for ns, names in ops.items() if ns != "npu"]
    have = {f"_C_ascend.{n}" for n in ops.get("_C_ascend", ())} | set(ops["npu"])
    missing = [n for n in MOCKED_BY_VLLM_ASCEND if n not in have]
    not_emulated = (f"Of what vllm-ascend's conftest mocks and its SFA path calls, not emulated ({len(missing)}): "
                    f"{_names(missing)}.")
    return {"emulated": "\n".join(emulated) + "\n", "not-emulated": not_emulated + "\n"}


def rewrite(text: str, generated: dict[str, str]) -> str:
    """``text`` with every region's body replaced by its generated markdown."""
    return REGION.sub(lambda m: m.group(1) + generated[m.group("name")] + m.group(4), text)


def main(argv: list[str]) -> int:
    generated = regions()
    stale = []
    for page in PAGES:
        path = ROOT / page
        text = path.read_text()
        new = rewrite(text, generated)
        if new != text:
            stale.append(page)
            if "--write" in argv:
                path.write_text(new)
    print(("rewrote " if "--write" in argv else "stale: ") + (", ".join(stale) or "nothing"))
    return 0 if not stale or "--write" in argv else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
