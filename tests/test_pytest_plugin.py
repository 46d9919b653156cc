"""``ascend_emu.pytest_plugin``: opt-in only; with it, ``import torch_npu`` is the emulator for a
whole pytest session and the fixtures build caches, block tables and NZ weights whose bytes match
the independent layouts of ``tests/reference/layouts.py``.

The plugin replaces ``sys.modules["torch_npu"]`` for the process it runs in, so every check runs
pytest in a child process (this suite's own tests, e.g. ``test_hw``'s stand-in torch_npu, must not
see it).
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: This tree's ascend_emu and tests.reference first, wherever another ascend_emu is installed.
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def _pytest(cwd, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=600)


def _passed(proc: subprocess.CompletedProcess, count: int) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"pytest exited {proc.returncode}\n{out[-4000:]}"
    assert re.search(rf"\b{count} passed\b", out) and not re.search(r"\b(failed|error|skipped)\b", out), out[-4000:]


def test_no_entry_point_loads_it_on_its_own():
    """No ``pytest11`` entry point: projects that never name the plugin never load it."""
    text = (ROOT / "pyproject.toml").read_text()
    assert "pytest11" not in text and "entry-points" not in text


def test_without_opting_in_torch_npu_is_untouched(tmp_path):
    """A session that does not name the plugin gets no torch_npu from ascend_emu."""
    (tmp_path / "test_plain.py").write_text(textwrap.dedent("""
        import importlib.util
        import sys

        def test_no_emulated_torch_npu():
            assert "ascend_emu.pytest_plugin" not in sys.modules
            mod = sys.modules.get("torch_npu")
            assert mod is None or not mod.__name__.startswith("ascend_emu")
            spec = importlib.util.find_spec("torch_npu")
            assert spec is None or "ascend_emu" not in (spec.origin or "")
        """))
    _passed(_pytest(tmp_path), 1)


#: Run under ``-p ascend_emu.pytest_plugin``; ``import torch_npu`` at module level happens while
#: pytest collects, so it proves the install comes first.
PLUGIN_CHECKS = '''
import numpy as np
import pytest
import torch
import torch_npu

from tests.reference import layouts as ref

MODES = ["PA_BSND", "PA_NZ"]
DTYPES = [torch.bfloat16, torch.int8]


def test_torch_npu_is_the_emulator_for_the_session():
    import ascend_emu.torch_npu
    import torch_npu.npu.utils
    assert torch_npu is ascend_emu.torch_npu and "ascend_emu" in torch_npu.__version__
    assert torch.npu.is_available() and torch.npu.current_device() == 0
    assert torch.zeros(2, device="npu").device == torch.device("npu", 0)
    assert torch_npu.npu.utils.get_cann_version() == torch.version.cann
    # the codes vllm-ascend's tests/ut conftest sets by hand (op-plugin _meta_registrations.py: 290, 293, 296)
    assert (torch_npu.hifloat8, torch_npu.float8_e8m0fnu, torch_npu.float4_e2m1fn_x2) == (290, 293, 296)
    # and the other two codes without a torch dtype (op-plugin _meta_registrations.py: 285, 297)
    assert (torch_npu.int4, torch_npu.float4_e1m2fn_x2) == (285, 297)


def test_npu_generator_is_seeded(npu_generator):
    assert npu_generator.device == torch.device("npu", 0)
    assert torch.equal(torch.randn(4, generator=npu_generator), torch.randn(4, generator=torch.Generator().manual_seed(0)))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_cache_bytes_follow_the_mode(paged_cache, mode, dtype):
    """Every element of the logical rows sits where the reference layout puts it, and cache_rows
    reads the rows back."""
    from ascend_emu.pytest_plugin import cache_rows
    nb, bs, dim = 3, 32, 64
    rows = (torch.arange(nb * bs * dim) % 251 - 125).to(dtype).view(nb * bs, 1, dim)
    cache = paged_cache(nb, bs, dim, dtype=dtype, mode=mode, rows=rows)
    assert tuple(cache.shape) == (nb, bs, 1, dim) and cache.dtype == dtype and cache.device.type == "npu"
    itemsize = cache.element_size()
    offsets = [ref.element_offset(mode, (nb, bs, 1, dim), itemsize, blk, r, 0, d)
               for blk in range(nb) for r in range(bs) for d in range(dim)]  # logical order
    assert sorted(offsets) == list(range(nb * bs * dim))
    assert torch.equal(cache.cpu().reshape(-1)[torch.tensor(offsets)], rows.reshape(-1))
    assert torch.equal(cache_rows(cache, mode), rows)
    random = paged_cache(nb, bs, dim, dtype=dtype, mode=mode, rows="random")
    assert cache_rows(random, mode).float().std() > 0.5


def test_paged_cache_head_major_pa_bnsd(paged_cache):
    """PA_BNSD is torch_npu's head-major [blocks, N, block_size, D]: with N = 2 the factory lays each
    block out head after head, where the reference puts every element, and cache_rows reads back."""
    from ascend_emu.pytest_plugin import cache_rows
    nb, bs, n, dim = 3, 16, 2, 8
    rows = (torch.arange(nb * bs * n * dim) % 251 - 125).to(torch.bfloat16).view(nb * bs, n, dim)
    cache = paged_cache(nb, bs, dim, mode="PA_BNSD", heads=n, rows=rows)
    assert tuple(cache.shape) == (nb, n, bs, dim)
    offsets = [ref.element_offset("PA_BNSD", (nb, n, bs, dim), 2, blk, r, h, d)
               for blk in range(nb) for r in range(bs) for h in range(n) for d in range(dim)]  # logical order
    assert sorted(offsets) == list(range(nb * bs * n * dim))
    assert torch.equal(cache.cpu().reshape(-1)[torch.tensor(offsets)], rows.reshape(-1))
    assert torch.equal(cache_rows(cache, "PA_BNSD"), rows)


def test_mla_caches(mla_caches):
    ckv, krope = mla_caches(2, 16, dtype=torch.int8, mode="PA_NZ")
    assert tuple(ckv.shape) == (2, 16, 1, 512) and tuple(krope.shape) == (2, 16, 1, 64)
    assert ckv.dtype == krope.dtype == torch.int8 and not ckv.any() and not krope.any()


def test_block_table_from_seq_lens(block_table):
    seq_lens = [5, 40, 0, 17]
    t = block_table(seq_lens, 16, num_blocks=9)
    table = t.block_table.cpu().numpy()
    assert t.block_table.dtype == torch.int32 and table.shape == (4, 3) and t.num_blocks == 9
    for b, n in enumerate(seq_lens):  # vLLM pads a row past its blocks with 0, never -1
        assert (table[b, -(-n // 16):] == 0).all(), table
    used = [int(v) for b, n in enumerate(seq_lens) for v in table[b, :-(-n // 16)]]
    assert len(set(used)) == len(used) == 1 + 3 + 0 + 2 and all(0 <= v < 9 for v in used)
    want = ref.slots_block_table(table, seq_lens, 16)
    assert t.slot_mapping.dtype == torch.int64 and t.slot_mapping.cpu().tolist() == sum(want, [])
    for b, n in enumerate(seq_lens):
        assert t.slots[b, :n].tolist() == want[b] and (t.slots[b, n:] == -1).all()
    assert t.seq_lens.cpu().tolist() == seq_lens


def test_nz_weight_is_cast_to_fractal_nz(nz_weight):
    from ascend_emu.torch_npu import nz_of
    w = nz_weight([48, 40])
    assert torch_npu.get_npu_format(w) == 29 and w.dtype == torch.bfloat16 and w.device.type == "npu"
    storage = nz_of(w).storage().view(np.int16)
    assert np.array_equal(storage.reshape(-1), ref.nd_to_nz_loops(w.cpu().view(torch.int16).numpy()).reshape(-1))
    assert 0.05 < w.float().std() < 0.3  # normal / sqrt(48)
    q = nz_weight([32, 16], dtype=torch.int8)
    assert q.dtype == torch.int8 and torch_npu.get_npu_format(q) == 29 and q.abs().max() <= 127
'''


@pytest.mark.slow
def test_plugin_installs_the_drop_in_and_its_fixtures_build_the_reference_layouts(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "test_with_plugin.py").write_text(PLUGIN_CHECKS)
    proc = _pytest(tmp_path, "-v", "-p", "ascend_emu.pytest_plugin")  # -q -v: the header, one dot per test
    _passed(proc, 10)
    assert "ascend_emu: torch_npu is the CPU emulator" in proc.stdout


@pytest.mark.slow
def test_a_conftest_mock_replacing_the_emulator_stops_the_session(tmp_path):
    """vllm-ascend's conftest swaps a MagicMock module in for torch_npu when npu-smi is missing:
    under the plugin that stops the session with a usage error, nothing runs against the mock."""
    pytest.importorskip("torch")
    (tmp_path / "conftest.py").write_text("import sys, types\nsys.modules['torch_npu'] = types.ModuleType('torch_npu')\n")
    (tmp_path / "test_mocked.py").write_text("def test_never_runs():\n    raise AssertionError('ran')\n")
    proc = _pytest(tmp_path, "-p", "ascend_emu.pytest_plugin")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    out = proc.stderr + proc.stdout
    assert "torch_npu: expected the emulator" in out and "after the conftest files loaded" in out
    assert "ran" not in proc.stdout


#: A test calling an emulated op with a wrong argument (cos 63 wide), one whose fixture call is
#: wrong, and one failing in its own code (nothing of the emulator's to hide).
BAD_CALLS = textwrap.dedent("""
    import torch
    import torch_npu

    def test_wrong_argument():
        x = torch.ones(2, 1, 1, 64, dtype=torch.bfloat16)
        cos = torch.ones(2, 1, 1, 63, dtype=torch.bfloat16)
        torch_npu.npu_interleave_rope(x, cos, x.clone())

    def test_wrong_fixture_argument(paged_cache):
        paged_cache(2, 16, 64, mode="PA_NOPE")

    def test_own_failure():
        assert 1 == 2
    """)


@pytest.mark.slow
def test_errors_through_the_plugin_stop_at_the_call_into_the_emulator(tmp_path):
    """As `ascend-emu run` does: the test's frames, the error, one line counting the hidden
    emulator frames and how to see them; all of them with ASCEND_EMU_TRACEBACK=1 or --fulltrace."""
    pytest.importorskip("torch")
    (tmp_path / "test_bad_calls.py").write_text(BAD_CALLS)
    env = dict(ENV, COLUMNS="120")
    env.pop("ASCEND_EMU_TRACEBACK", None)

    def run(*args, **extra):
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                               "ascend_emu.pytest_plugin", *args], cwd=tmp_path, env=dict(env, **extra),
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 1 and "3 failed" in proc.stdout, proc.stdout[-3000:]
        return proc.stdout

    short = run()
    hints = re.findall(r"^E +(\d+) frame\(s\) inside ascend_emu hidden; `pytest --fulltrace` \(or "
                       r"ASCEND_EMU_TRACEBACK=1\) shows them$", short, flags=re.M)
    assert len(hints) == 2 and all(int(n) >= 2 for n in hints), short
    assert "ascend_emu/ops/" not in short and "ascend_emu/pytest_plugin.py" not in short, short
    assert "E       ascend_emu.errors.ShapeError: cos: expected shape" in short
    assert ">       torch_npu.npu_interleave_rope(x, cos, x.clone())" in short
    assert len(short.splitlines()) < 60, f"{len(short.splitlines())} lines:\n{short}"
    for full in (run(ASCEND_EMU_TRACEBACK="1"), run("--fulltrace")):
        assert "ascend_emu/ops/rope.py" in full and "inside ascend_emu hidden" not in full
        assert len(full.splitlines()) > len(short.splitlines()) + 40



@pytest.mark.slow
def test_a_test_module_mocking_torch_npu_at_import_stops_the_session(tmp_path):
    """A test module (not a conftest) that swaps a mock in for torch_npu when it is imported is
    caught once collection ends, before any test runs (its own or another module's)."""
    pytest.importorskip("torch")
    (tmp_path / "test_a_first.py").write_text("def test_never_runs():\n    raise AssertionError('a test ran')\n")
    (tmp_path / "test_b_mocks.py").write_text(
        "import sys\nfrom unittest.mock import MagicMock\nsys.modules['torch_npu'] = MagicMock()\n\n"
        "def test_never_runs_either():\n    raise AssertionError('a test ran')\n")
    proc = _pytest(tmp_path, "-p", "ascend_emu.pytest_plugin")
    out = proc.stderr + proc.stdout
    assert proc.returncode == 4, out
    assert "torch_npu: expected the emulator" in out and "after collection" in out and "MagicMock" in out
    assert "a test ran" not in out and "passed" not in out
