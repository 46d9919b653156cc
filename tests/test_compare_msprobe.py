"""Loopback through msprobe's own PrecisionDebugger (mindstudio-probe, pinned in the ``test``
extra, so CI runs these; skipped where it is not installed): a run on the stand-in torch_npu
dumped by msprobe on the CPU, replayed by ``ascend-emu replay``: zero differences in our report
and in ``msprobe compare``'s table. Each dump compiles its kernels in a fresh process (about
40 s of CPU), hence the long subprocess timeouts."""

from __future__ import annotations

import csv
import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

from tests.standin_torch_npu import DIR as STANDIN_DIR

ROOT = pathlib.Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {standin!r})
    import torch, torch_npu
    from msprobe.pytorch import PrecisionDebugger

    debugger = PrecisionDebugger(task="tensor", dump_path="dump", level="L1")
    g = torch.Generator().manual_seed(0)
    b, s = 2, 1
    kv = torch.randn(b, 1, s, 576, generator=g).to(torch.bfloat16).npu()
    gamma = torch.ones(512, dtype=torch.bfloat16).npu()
    cos = torch.randn(b, 1, s, 64, generator=g).to(torch.bfloat16).npu()
    sin = torch.randn(b, 1, s, 64, generator=g).to(torch.bfloat16).npu()
    index = torch.tensor([3, 17], dtype=torch.int64).npu()
    k_cache = torch.zeros(4, 16, 1, 64, dtype=torch.bfloat16).npu()
    ckv_cache = torch.zeros(4, 16, 1, 512, dtype=torch.bfloat16).npu()
    debugger.start()
    torch_npu.npu_kv_rmsnorm_rope_cache(kv, gamma, cos, sin, index, k_cache, ckv_cache, cache_mode="PA_NZ",
                                        is_output_kv=True)
    debugger.stop()
    debugger.step()
""")


def test_msprobe_precision_debugger_loopback(tmp_path):
    pytest.importorskip("msprobe")
    pytest.importorskip("torch")
    env = {"PYTHONPATH": str(ROOT), "PATH": str(pathlib.Path(sys.executable).parent)}
    (tmp_path / "run.py").write_text(SCRIPT.format(standin=str(STANDIN_DIR)))
    proc = subprocess.run([sys.executable, "run.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = subprocess.run([sys.executable, "-m", "ascend_emu", "replay", "dump", "-o", "emu", "--json", "r.json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rep = json.loads((tmp_path / "r.json").read_text())
    assert {k: rep["summary"][k] for k in ("calls", "by_status", "identical", "ok", "first_divergence")} == {
        "calls": 1, "by_status": {"identical": 1}, "identical": True, "ok": True, "first_divergence": None}
    (npu_json,) = (tmp_path / "dump").rglob("dump.json")
    (emu_json,) = (tmp_path / "emu").rglob("dump.json")
    cli = "import sys; from msprobe.msprobe import main; sys.argv[0] = 'msprobe'; sys.exit(main())"
    proc = subprocess.run([sys.executable, "-c", cli, "compare", "-tp", str(npu_json), "-gp", str(emu_json), "-o", "cmp"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result,) = (tmp_path / "cmp").glob("compare_result_*.csv")
    rows = {r["NPU Name"]: r for r in csv.DictReader(result.open())}
    outs = [r for name, r in rows.items() if ".forward.output." in name]
    assert len(outs) == 4 and all(r["Cosine"] == "1.0" and r["MaxAbsErr"] == "0.0" for r in outs), rows


def test_msprobe_wraps_the_drop_in_under_ascend_emu_run(tmp_path):
    """``ascend-emu run`` (the drop-in as torch_npu) with msprobe's PrecisionDebugger wrapping the
    module attributes by ``(*args, **kwargs)`` functions: the ops behave as unwrapped (positional
    npu_kv_rmsnorm_rope_cache, npu_lightning_indexer), and the dump replays identical."""
    pytest.importorskip("msprobe")
    pytest.importorskip("torch")
    env = {"PYTHONPATH": str(ROOT), "PATH": str(pathlib.Path(sys.executable).parent)}
    script = SCRIPT.replace("sys.path.insert(0, {standin!r})\n", "").replace("debugger.stop()", textwrap.dedent("""\
        q = torch.randn(1, 2, 64, 128, generator=g).to(torch.bfloat16).npu()
        k = torch.randn(1, 9, 1, 128, generator=g).to(torch.bfloat16).npu()
        w = torch.randn(1, 2, 64, generator=g).to(torch.bfloat16).npu()
        assert torch_npu.npu_lightning_indexer.__module__ != "torch_npu"  # msprobe's wrapper
        torch_npu.npu_lightning_indexer(q, k, w, sparse_count=4, return_value=True)
        debugger.stop()"""))
    (tmp_path / "run.py").write_text(script)
    proc = subprocess.run([sys.executable, "-m", "ascend_emu", "run", "run.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    proc = subprocess.run([sys.executable, "-m", "ascend_emu", "replay", "dump", "-o", "emu", "--json", "r.json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rep = json.loads((tmp_path / "r.json").read_text())
    assert {k: rep["summary"][k] for k in ("calls", "by_status", "identical", "ok", "first_divergence")} == {
        "calls": 2, "by_status": {"identical": 2}, "identical": True, "ok": True, "first_divergence": None}
