"""``ascend-emu warmup`` / :func:`ascend_emu.warmup.warmup`: every op runs once per scenario, the
threaded kernel variants are compiled too, and the thresholds it lowers are restored."""

from __future__ import annotations

import importlib

import numba
import pytest

from ascend_emu import warmup as warmup_mod
from ascend_emu._kernel_cache import kernel_cache_dir
from ascend_emu.cli import build_parser, main

kernels = importlib.import_module("ascend_emu.emu.kernels")
kv_emu = importlib.import_module("ascend_emu.emu.kv_rmsnorm_rope_cache")
prolog_emu = importlib.import_module("ascend_emu.emu.mla_prolog")

OPS = ("npu_format_cast", "npu_kv_rmsnorm_rope_cache", "npu_mla_prolog_v3", "npu_mla_preprocess",
       "npu_lightning_indexer", "npu_sparse_flash_attention", "npu_kv_quant_sparse_flash_attention")


def test_warmup_runs_every_op_and_restores_thresholds():
    saved = (kernels.ELEMENTS_PER_PART, kernels.SCATTER_BYTES_PER_THREAD, kv_emu.TOKENS_PER_PART)
    threads = numba.get_num_threads()
    seen = []
    try:
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        results = warmup_mod.warmup(report=seen.append)
    finally:
        numba.set_num_threads(threads)
    assert results == seen
    names = [r.op for r in results]
    assert {name.split()[0] for name in names} == set(OPS)
    assert sum(name.startswith("npu_mla_prolog_v3") for name in names) == 5  # every A2 / A3 scenario family
    assert all(r.seconds >= 0 for r in results)
    assert (kernels.ELEMENTS_PER_PART, kernels.SCATTER_BYTES_PER_THREAD, kv_emu.TOKENS_PER_PART) == saved
    if numba.config.NUMBA_NUM_THREADS >= 2:  # the threaded variants were compiled (or loaded) as well
        for kernel in (prolog_emu._cq_norm_parts, prolog_emu._kv_kr_parts, prolog_emu._query_bits_parts,
                       kernels._scatter_parallel, kv_emu._kv_rmsnorm_rope_parallel):
            assert kernel.signatures, kernel


def test_cli_registers_warmup(capsys):
    ns = build_parser().parse_args(["warmup", "--quiet", "--serial-only"])
    assert ns.quiet and ns.serial_only
    assert main(["warmup", "--quiet", "--serial-only"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("warmed up ")
    cache = kernel_cache_dir()  # where the kernels went, and what to delete to clear them
    assert out[0].endswith(f"kernel cache: {cache} (delete {cache.parent} to clear it and older versions' caches)")
    assert list((cache / "emu").glob("kv_rmsnorm_rope_cache.*.nbi"))


@pytest.mark.parametrize("argv", [["warmup", "--bogus"]])
def test_cli_warmup_rejects_unknown_options(argv):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
