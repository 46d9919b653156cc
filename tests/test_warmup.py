"""``ascend-emu warmup`` / :func:`ascend_emu.warmup.warmup`: every op runs once per scenario, the
threaded kernel variants are compiled too, and the thresholds it lowers are restored; progress
(:mod:`ascend_emu.progress`) names each kernel as it compiles."""

from __future__ import annotations

import dataclasses
import importlib
import os
import io
import re

import numba
import numpy as np
import pytest

from ascend_emu import warmup as warmup_mod
from ascend_emu._kernel_cache import kernel_cache_dir
from ascend_emu.cli import build_parser, main
from ascend_emu.progress import Progress

kernels = importlib.import_module("ascend_emu.emu.kernels")
kv_emu = importlib.import_module("ascend_emu.emu.kv_rmsnorm_rope_cache")
prolog_emu = importlib.import_module("ascend_emu.emu.mla_prolog")

OPS = ("npu_format_cast", "npu_kv_rmsnorm_rope_cache", "npu_mla_prolog_v3", "npu_mla_preprocess",
       "npu_lightning_indexer", "npu_sparse_flash_attention", "npu_kv_quant_sparse_flash_attention",
       "npu_quant_lightning_indexer", "npu_fused_infer_attention_score", "npu_fused_infer_attention_score_v2",
       "compressor", "npu_scatter_nd_update_v2", "kv_compress_epilog", "indexer_compress_epilog",
       "indexer_compress_epilog_v2", "npu_kv_quant_sparse_attn_sharedkv")


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
    assert ns.quiet and ns.serial_only and ns.jobs is None
    assert main(["warmup", "--quiet", "--serial-only", "-j", "2"]) == 0  # two worker processes
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("warmed up ") and "(2 processes, " in out[0]
    cache = kernel_cache_dir()  # where the kernels went, and what to delete to clear them
    assert out[0].endswith(f"kernel cache: {cache} (delete {cache.parent} to clear it and older versions' caches)")
    assert list((cache / "emu").glob("kv_rmsnorm_rope_cache.*.nbi"))


@pytest.mark.parametrize("argv", [["warmup", "--bogus"], ["warmup", "-j", "0"], ["warmup", "--jobs", "two"]])
def test_cli_warmup_rejects_unknown_options(argv):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2


def test_default_jobs_are_the_cores_only_for_an_empty_kernel_cache(monkeypatch, tmp_path):
    monkeypatch.setattr(warmup_mod, "kernel_cache_dir", lambda: tmp_path)
    monkeypatch.setattr("ascend_emu.workers.default_workers", lambda: 3)
    assert warmup_mod.default_jobs() == 3
    (tmp_path / "emu").mkdir()
    (tmp_path / "emu" / "kernels._scatter-1.py311.nbi").write_bytes(b"")
    assert warmup_mod.default_jobs() == 1


def test_warmup_in_worker_processes_runs_every_call_once_in_order(monkeypatch):
    """``jobs=2``: every call runs in one of two spawned workers (none in this process without
    ``load``); the results come back in call order whatever order the workers finish in."""
    ran_here = []
    monkeypatch.setattr(warmup_mod, "_run", lambda call, split: ran_here.append(call.name))
    seen = []
    results = warmup_mod.warmup(jobs=2, load=False, parallel=False, report=seen.append)
    assert ran_here == []
    names = [c.name for c in warmup_mod._calls()]
    assert [r.op for r in results] == names and sorted(r.op for r in seen) == sorted(names)
    assert all(r.seconds > 0 for r in results)
    with pytest.raises(ValueError, match=r"jobs: expected an int >= 1, got 0"):
        warmup_mod.warmup(jobs=0)


def test_prolog_scenarios_are_named():
    """Each npu_mla_prolog_v3 warm-up names its quant scenario (docs/sources.md#npu_mla_prolog_v3: partial / full
    quant, per-tensor / per-channel / per-tile kv_cache), not a bare mode tuple."""
    names = [c.name for c in warmup_mod._prolog_calls(np.random.default_rng(0))]
    assert all(re.search(r"\(\d, \d, \d\)", name) is None for name in names), names
    joined = " | ".join(names)
    for scenario in ("non-quant", "partial quant, kv_cache per-channel", "partial quant, kv_cache per-tile",
                     "full quant, kv_cache per-tensor", "full quant, kv_cache per-tile"):
        assert scenario in joined


# ------------------------------------------------------------------------------ progress
def _fresh_kernels():
    """Two new jitted functions, the outer calling the inner, never compiled (no disk cache)."""
    @numba.njit(cache=False)
    def inner(x):
        return x * 3

    @numba.njit(cache=False)
    def outer(x):
        return inner(x) + 1

    return outer


def test_progress_names_each_kernel_as_it_compiles_in_plain_lines():
    """Piped (not a terminal): the step, the first-run note and one flushed line per kernel compiled;
    the helper compiled inside a kernel is part of it; a second call compiles nothing."""
    stream = io.StringIO()
    outer = _fresh_kernels()
    with Progress(stream) as progress:
        progress.step("step one")
        assert outer(2) == 7
        progress.step("step two")
        assert outer(5) == 16  # compiled already: no line
    lines = stream.getvalue().splitlines()
    assert lines[0] == "step one"
    assert "first run only" in lines[1]
    assert lines[2].strip() == "compiling Numba kernel 1: tests.test_warmup._fresh_kernels.<locals>.outer"
    assert lines[3:] == ["step two"]
    assert progress.watch.kernels == 1 and progress.watch.seconds > 0


def test_progress_quiet_prints_nothing_and_still_counts():
    stream = io.StringIO()
    with Progress(stream, quiet=True) as progress:
        progress.step("step")
        _fresh_kernels()(1)
    assert stream.getvalue() == "" and progress.watch.kernels == 1


def test_cli_warmup_piped_shows_each_call_and_what_it_compiles(monkeypatch, capsys):
    """``ascend-emu warmup | tee log``: a call that compiles is named ([i/n]) above its kernels,
    before its result line; one that compiles nothing adds no line."""
    outer = _fresh_kernels()

    def family(rng):
        yield warmup_mod.Call("first fresh call", "npu_format_cast", (), {})
        yield warmup_mod.Call("second call", "npu_format_cast", (), {})

    monkeypatch.setattr(warmup_mod, "CALLS", (family,))
    monkeypatch.setattr(warmup_mod.Call, "__call__", lambda self: outer(1))
    assert main(["warmup", "--serial-only", "-j", "1"]) == 0
    lines = [ln.strip() for ln in capsys.readouterr().out.splitlines()]
    assert "first run only" in lines[0]
    assert lines[1] == "[1/2] first fresh call:"
    assert lines[2].startswith("compiling Numba kernel 1: ") and lines[2].endswith(".outer")
    assert lines[3].endswith("s  first fresh call") and lines[4].endswith("s  second call")
    assert lines[5].startswith("warmed up 2 op calls")


def test_v4_calls_run_on_their_soc_and_restore_it(monkeypatch):
    """The 950-only V4 calls set the emulated SoC for the call alone: they run in a process whose
    SoC is an A2, which is an A2 again after each (and the same calls fail without it)."""
    from ascend_emu import soc
    from ascend_emu.errors import ModeError

    monkeypatch.setenv(soc.SOC_NAME_ENV, soc.DEFAULT_SOC_NAME)
    calls = list(warmup_mod._v4_calls(np.random.default_rng(0)))
    assert {c.op for c in calls} == set(OPS[-6:])
    for call in calls:
        call()
        assert os.environ[soc.SOC_NAME_ENV] == soc.DEFAULT_SOC_NAME, call.name
    on_950 = [c for c in calls if c.soc is not None]
    assert {c.op for c in on_950} >= {"kv_compress_epilog", "indexer_compress_epilog_v2",
                                      "npu_kv_quant_sparse_attn_sharedkv"}
    with pytest.raises(ModeError, match="950"):
        dataclasses.replace(next(c for c in on_950 if c.op == "kv_compress_epilog"), soc=None)()
