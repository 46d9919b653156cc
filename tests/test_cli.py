"""The ``ascend-emu`` command line: ``run`` (in subprocesses, on tiny temp scripts), ``locate``,
``inspect``, ``demo`` and ``python -m ascend_emu``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ascend_emu.cli import main

RUN = [sys.executable, "-m", "ascend_emu", "run"]


def _script(tmp_path, body: str, name: str = "script.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def _run(cmd, cwd, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------------------ run
def test_run_resolves_torch_npu_to_the_emulator_with_argv_and_main(tmp_path):
    pytest.importorskip("torch")
    script = _script(tmp_path, """
        import json, sys
        import torch, torch_npu
        import helper_mod  # next to the script: its directory is on sys.path
        x = torch.ones(2).npu()
        print(json.dumps({"name": __name__, "argv": sys.argv, "module": torch_npu.__name__,
                          "npu": torch.npu is torch_npu.npu, "helper": helper_mod.VALUE}))
    """)
    _script(tmp_path, "VALUE = 42\n", "helper_mod.py")
    proc = _run(RUN + [script, "a b", "--force", "-x"], cwd=str(tmp_path.parent))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"name": "__main__", "argv": [script, "a b", "--force", "-x"],
                   "module": "ascend_emu.torch_npu", "npu": True, "helper": 42}


def test_run_sets_file_and_sys_path_as_python_does(tmp_path):
    """``python SCRIPT``: ``__file__`` absolute, the script's directory replaces sys.path[0] (the
    current directory is not importable unless it holds the script)."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "cwd").mkdir()
    _script(tmp_path / "cwd", "VALUE = 1\n", "only_in_cwd.py")
    body = """
        import json, sys
        try:
            import only_in_cwd
            found = True
        except ModuleNotFoundError:
            found = False
        print(json.dumps({"file": __file__, "argv0": sys.argv[0], "path0": sys.path[0], "cwd_module": found}))
    """
    _script(tmp_path / "scripts", body)
    script = os.path.join("..", "scripts", "script.py")  # relative, as typed
    plain = _run([sys.executable, script], cwd=str(tmp_path / "cwd"))
    emu = _run(RUN + [script], cwd=str(tmp_path / "cwd"))
    assert plain.returncode == emu.returncode == 0, emu.stderr
    want = json.loads(plain.stdout.strip().splitlines()[-1])
    assert json.loads(emu.stdout.strip().splitlines()[-1]) == want
    assert os.path.isabs(want["file"]) and os.path.samefile(want["file"], tmp_path / "scripts" / "script.py")
    assert want["argv0"] == script and want["cwd_module"] is False


@pytest.mark.parametrize("code, expected", [("sys.exit(3)", 3), ("sys.exit('bye')", 1), ("pass", 0)])
def test_run_propagates_exit_codes(tmp_path, code, expected):
    script = _script(tmp_path, f"import sys\n{code}\n")
    proc = _run(RUN + [script], cwd=str(tmp_path))
    assert proc.returncode == expected, proc.stderr


def test_run_shows_script_traceback_like_python(tmp_path):
    _script(tmp_path, """
        def inner():
            raise ValueError("boom in script")
        inner()
    """)
    proc = _run(RUN + ["script.py"], cwd=str(tmp_path))  # relative: the traceback still names the absolute path
    plain = _run([sys.executable, "script.py"], cwd=str(tmp_path))
    assert proc.returncode == plain.returncode == 1
    assert proc.stderr == plain.stderr
    assert proc.stderr.startswith("Traceback (most recent call last):")
    assert "ValueError: boom in script" in proc.stderr
    assert f'File "{tmp_path / "script.py"}", line 3, in inner' in proc.stderr
    assert "cli.py" not in proc.stderr and "runpy" not in proc.stderr


def test_run_traceback_stops_at_the_scripts_call_into_the_emulator(tmp_path):
    """An op's error under ``ascend-emu run``: the script's frames and the exception line exactly
    as ``python SCRIPT`` prints them, the emulator's validation frames below the call hidden (one
    line counts them); ``--traceback`` or ASCEND_EMU_TRACEBACK=1 gives Python's whole traceback."""
    import ascend_emu

    _script(tmp_path, """
        import numpy as np
        from ascend_emu import ops

        def step():
            return ops.npu_kv_rmsnorm_rope_cache(np.zeros((1, 1, 2, 576), np.float32), *[None] * 6)

        step()
    """)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(ascend_emu.__file__)))
    env.pop("ASCEND_EMU_TRACEBACK", None)
    plain = _run([sys.executable, "script.py"], cwd=str(tmp_path), env=env)
    short = _run(RUN + ["script.py"], cwd=str(tmp_path), env=env)
    assert plain.returncode == short.returncode == 1
    lines = plain.stderr.splitlines()
    first_internal = next(i for i, ln in enumerate(lines) if ln.startswith('  File "') and "ascend_emu" in ln)
    hidden = sum(ln.startswith('  File "') for ln in lines[first_internal:])
    assert hidden >= 3 and lines[-1] == "ascend_emu.errors.DTypeError: kv: expected dtype bfloat16 or float16, got float32"
    assert short.stderr.splitlines() == lines[:first_internal] + [lines[-1], (
        f"ascend-emu: {hidden} frame(s) inside ascend_emu hidden; `ascend-emu run --traceback` (or "
        "ASCEND_EMU_TRACEBACK=1) shows them")]
    assert short.stderr.startswith("Traceback (most recent call last):")
    full = _run(RUN + ["--traceback", "script.py"], cwd=str(tmp_path), env=env)
    by_env = _run(RUN + ["script.py"], cwd=str(tmp_path), env=dict(env, ASCEND_EMU_TRACEBACK="1"))
    assert full.returncode == by_env.returncode == 1
    assert full.stderr == by_env.stderr == plain.stderr


def test_run_missing_script_exits_2(tmp_path):
    proc = _run(RUN + [str(tmp_path / "nope.py")], cwd=str(tmp_path))
    assert proc.returncode == 2 and "nope.py" in proc.stderr


@pytest.mark.parametrize("blocker", [
    "sys.modules['torch'] = None",  # import torch raises ModuleNotFoundError
    "sys.meta_path.insert(0, Blocker())",  # a finder that refuses torch, as when it is not installed
])
def test_run_stops_with_the_install_hint_without_torch(tmp_path, blocker):
    """Without torch the script must not run on (it would fail later at ``import torch_npu``, or
    worse, run half-way): exit 2 with the install hint."""
    script = _script(tmp_path, "print('SCRIPT RAN')\n")
    shim = textwrap.dedent(f"""
        import sys

        class Blocker:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        {blocker}
        from ascend_emu.cli import main
        sys.exit(main(["run", {script!r}]))
    """)
    proc = _run([sys.executable, "-c", shim], cwd=str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert "SCRIPT RAN" not in proc.stdout
    assert "torch is not installed" in proc.stderr and 'pip install -e ".[torch]"' in proc.stderr
    # the pinned CPU wheel, not the CUDA one
    assert "pip install torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu" in proc.stderr


def test_drop_in_import_error_names_the_cpu_wheel(tmp_path):
    import ascend_emu

    root = os.path.dirname(os.path.dirname(ascend_emu.__file__))
    proc = _run([sys.executable, "-c", "import sys; sys.modules['torch'] = None; import ascend_emu.torch_npu"],
                cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=root))
    assert proc.returncode == 1 and "ModuleNotFoundError: ascend_emu.torch_npu needs torch" in proc.stderr
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in proc.stderr


def test_every_install_hint_is_defined_once_and_names_the_cpu_wheel():
    """PyPI's default torch on Linux is the CUDA build: every hint that installs torch (or torch-npu,
    which pulls torch in) gives the CPU index; the texts live in ascend_emu.install_hints only."""
    import ascend_emu
    from ascend_emu import install_hints

    package = os.path.dirname(ascend_emu.__file__)
    for root, _, files in os.walk(package):
        for name in files:
            path = os.path.join(root, name)
            if name.endswith(".py") and path != install_hints.__file__:
                with open(path, encoding="utf-8") as f:
                    assert "pip install" not in f.read(), f"{path}: import the hint from ascend_emu.install_hints"
    for hint in (install_hints.TORCH_HINT, install_hints.TORCH_NPU_HINT):
        assert "--extra-index-url https://download.pytorch.org/whl/cpu" in hint
    assert "torch-npu 2.14.0" in install_hints.TORCH_NPU_HINT


def test_run_prefers_a_real_torch_npu_unless_forced(tmp_path):
    pytest.importorskip("torch")
    fake = tmp_path / "site" / "torch_npu"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("REAL = True\n")
    script = _script(tmp_path, "import torch_npu\nprint(getattr(torch_npu, 'REAL', False), torch_npu.__name__)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(fake.parent), os.environ.get("PYTHONPATH")) if p))
    real = _run(RUN + [script], cwd=str(tmp_path), env=env)
    assert real.returncode == 0, real.stderr
    assert real.stdout.split() == ["True", "torch_npu"]
    assert "real torch_npu is installed" in real.stderr and "--force" in real.stderr
    forced = _run(RUN + ["--force", script], cwd=str(tmp_path), env=env)
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.split() == ["False", "ascend_emu.torch_npu"]


def test_module_help_lists_commands():
    proc = _run([sys.executable, "-m", "ascend_emu", "--help"], cwd=None)
    assert proc.returncode == 0
    for cmd in ("run", "demo", "locate"):
        assert cmd in proc.stdout


def test_console_script_is_installed():
    exe = shutil.which("ascend-emu")
    if exe is None:
        pytest.skip("the ascend-emu console script is not on PATH (package not installed with pip)")
    proc = _run([exe, "--version"], cwd=None)
    assert proc.returncode == 0 and proc.stdout.startswith("ascend-emu ")


@pytest.mark.slow
def test_layout_demo_runs_and_checks_pass():
    pytest.importorskip("torch")
    proc = _run([sys.executable, "-m", "ascend_emu", "demo", "--layout"], cwd=None, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "query      (2, 4, 8, 512) torch.bfloat16" in proc.stdout
    assert "== PA_BSND kr_cache row" in proc.stdout and ": True" in proc.stdout
    assert "False" not in proc.stdout


@pytest.mark.slow
def test_decode_step_demo_runs_without_torch_and_reports(tmp_path, capsys):
    """``ascend-emu demo`` (a small context) in a process where torch cannot be imported, piped: each
    step is a plain line as it starts (first calls apart), the table gives steady-state times,
    figures have a sensible precision, and the saved cache answers the closing hint's command."""
    saved = tmp_path / "kv"
    code = ("import sys; sys.modules['torch'] = None; from ascend_emu.cli import main; "
            "sys.exit(main(['demo', '--context', '300', '--sparse-count', '128', '--heads', '8', "
            f"'--save-cache', {str(saved)!r}]))")
    proc = _run([sys.executable, "-c", code], cwd=None, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for step in ("prefill 300 tokens: npu_mla_prolog_v3, int8 per-tile cache: first call",
                 "decode: npu_lightning_indexer: first call", "decode: npu_lightning_indexer",
                 "decode: npu_kv_quant_sparse_flash_attention: first call"):
        assert step in lines, step  # progress: a line of its own, printed as the step starts
    out = " ".join(proc.stdout.split())
    for step in ("npu_mla_prolog_v3, int8 per-tile cache", "npu_lightning_indexer",
                 "npu_kv_quant_sparse_flash_attention", "npu_sparse_flash_attention (bf16)"):
        assert step in out
    assert "first call ms" in out and "median of 5 runs" in out and "first calls: " in out
    assert "N=8 query heads (one TP-16 rank of the model's 128)" in out
    assert "indexer selected │ 128 of 301 tokens" in out
    assert "656-byte row (slot" in out and "cosine 0.99" in out
    scales = re.search(r"fp32 tile scales: \[([^]]*)\]", out).group(1).split(", ")
    assert len(scales) == 4 and all(len(v.lstrip("0.").replace(".", "")) <= 4 for v in scales), scales
    assert re.search(r"max abs error 0\.0\d+, cosine 0\.99\d\d\b", out)
    slot = int(re.search(r"656-byte row \(slot (\d+)", out).group(1))
    hint = re.search(r"(ascend-emu inspect dump (\S+) --slot (\d+))", out)
    assert hint.group(2) == str(saved) + ".npz" and int(hint.group(3)) == slot
    assert main(["inspect", "dump", hint.group(2), "--slot", hint.group(3)]) == 0
    dumped = " ".join(capsys.readouterr().out.split())
    assert "k_nope" in dumped and "scale" in dumped and f"{slot} (" in dumped


def test_decode_step_report_is_consistent():
    from ascend_emu.demo import DecodeStepConfig, run_decode_step
    from ascend_emu.quant import MLA_ROW

    rep = run_decode_step(DecodeStepConfig(context=200, sparse_count=64, heads=4, block_size=64))
    assert [name.split(":")[0] for name, _ in rep.timings].count("decode") == 5
    # every op step has a first call timed apart; what compiled is counted (and is 0 when cached)
    ops_steps = [name for name, _ in rep.timings if "npu_" in name]
    assert [f.step for f in rep.first_calls] == ops_steps and len(ops_steps) == 7
    assert sum(f.kernels for f in rep.first_calls) <= rep.kernels_compiled
    assert rep.kv_int8.shape == (rep.num_blocks, 64, 1, MLA_ROW.row_bytes)
    assert rep.blocks_used == 4 and rep.block_table.shape == (4,) and len(set(rep.block_table.tolist())) == 4
    assert rep.row_slot == int(rep.block_table[200 // 64]) * 64 + 200 % 64  # token 200 through the table
    assert np.array_equal(rep.row[MLA_ROW.scale_offset:].view("<f4"), rep.row_scales)
    assert rep.selected == 64 and rep.out_int8.shape == rep.out_bf16.shape == (4, 512)
    # the int8 path attends to the same tokens as the bf16 path: close, not equal
    assert 0 < rep.max_abs < 0.1 and rep.cosine > 0.999
    # the benchmark's re-run of the int8 decode step reproduces the demo's output byte for byte
    again = np.asarray(rep.decode_int8()).reshape(4, 512)
    assert again.view(np.uint16).tobytes() == rep.out_int8.view(np.uint16).tobytes()
    assert rep.floor_int8().shape == (4, 512)
    # the machine floor's operands: the step's products at their shapes, in the dtypes the ops multiply
    shapes = {name: (a.shape, w.shape, a.dtype.name, w.dtype.name) for name, (a, w) in rep.floor_operands.items()}
    assert shapes == {"x@Wdq": ((1, 7168), (7168, 1536), "bfloat16", "bfloat16"),
                      "cq@Wuq_qr": ((1, 1536), (1536, 4 * 192), "int8", "int8"),
                      "q@Wuk": ((4, 1, 128), (4, 128, 512), "bfloat16", "bfloat16"),
                      "x@Wdkv_kr": ((1, 7168), (7168, 576), "bfloat16", "bfloat16"),
                      "indexer q.k": ((64, 128), (128, 201), "bfloat16", "bfloat16"),
                      "q@K": ((4, 576), (576, 64), "bfloat16", "bfloat16"),
                      "P@V": ((4, 64), (64, 512), "bfloat16", "bfloat16")}
    assert rep.floor_gather_bytes == 64 * MLA_ROW.row_bytes


def test_decode_step_times_are_steady_state_with_the_first_call_apart(monkeypatch):
    """On a clock that only the indexer advances (its first call 100 s, the next ones 1..5 s), the
    indexer step reports the median of the 5 runs after the first call, and the first call apart."""
    from types import SimpleNamespace

    from ascend_emu import demo, ops

    now = [0.0]
    costs = iter([100.0, 1.0, 5.0, 3.0, 2.0, 4.0])
    real = ops.npu_lightning_indexer

    def indexer(*args, **kwargs):
        now[0] += next(costs)
        return real(*args, **kwargs)

    monkeypatch.setattr(demo, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(ops, "npu_lightning_indexer", indexer)
    rep = demo.run_decode_step(demo.DecodeStepConfig(context=40, sparse_count=16, heads=1, block_size=16))
    assert dict(rep.timings)["decode: npu_lightning_indexer"] == 3.0
    first = {f.step: f.seconds for f in rep.first_calls}
    assert first["decode: npu_lightning_indexer"] == 100.0
    assert next(costs, None) is None  # called 1 + DECODE_REPEATS times, no more


BAD_DEMO_ARGS = [
    (["--block-size", "100"], "--block-size", "a multiple of 16 in [16, 1024]"),
    (["--block-size", "1040"], "--block-size", "a multiple of 16 in [16, 1024]"),
    (["--block-size", "8"], "--block-size", "a multiple of 16 in [16, 1024]"),
    (["--block-size", "x"], "--block-size", "an int"),
    (["--context", "0"], "--context", "1 to 131071"),
    (["--context", "131072"], "--context", "1 to 131071"),
    (["--heads", "3"], "--heads", "[1, 2, 4, 8, 16, 32, 64, 128]"),
    (["--sparse-count", "0"], "--sparse-count", "1-2048"),
    (["--sparse-count", "3000"], "--sparse-count", "1-2048"),
    (["--save-cache", "/no/such/dir/kv"], "--save-cache", "existing, writable directory"),
]


@pytest.mark.parametrize("args, option, expected", BAD_DEMO_ARGS)
def test_demo_argument_errors_exit_2_naming_the_argument(capsys, args, option, expected):
    """A value the ops would reject stops ``ascend-emu demo`` before any work: exit 2 and one
    error line naming the option, what it must be and the value (no traceback)."""
    with pytest.raises(SystemExit) as exc:
        main(["demo", *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"ascend-emu demo: error: argument {option}: expected ")
    assert expected in err[-1] and repr(args[-1]) in err[-1]
    assert not any("Traceback" in line for line in err)


@pytest.mark.parametrize("args", [["--block-size", "16"], ["--block-size", "1024"], ["--context", "1"],
                                  ["--heads", "128"], ["--sparse-count", "8192"], ["--sparse-count", "2048"]])
def test_demo_accepts_the_limits(args):
    from ascend_emu.cli import build_parser

    ns = build_parser().parse_args(["demo", *args])
    assert getattr(ns, args[0][2:].replace("-", "_")) == int(args[1])


def test_decode_step_config_rejects_what_the_ops_would():
    from ascend_emu.demo import DecodeStepConfig
    from ascend_emu.errors import ShapeError

    with pytest.raises(ShapeError, match=r"^block_size: expected a multiple of 16 in \[16, 1024\].*got 100$"):
        DecodeStepConfig(block_size=100)


@pytest.mark.parametrize("heads, share", [(16, "one TP-8 rank"), (128, "all 128"), (8, "one TP-16 rank"),
                                          (1, "one TP-128 rank")])
def test_demo_names_the_heads_share(heads, share):
    from ascend_emu.demo import heads_share

    assert heads_share(heads).startswith(share)


# ------------------------------------------------------------------------------ locate
def _locate(capsys, *args) -> dict:
    assert main(["locate", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _nz_offset_by_hand(slot, d, block_size, dim, itemsize):
    """docs/sources.md#paged_nz paged NZ: blk*bs*D + (d//C0)*bs*C0 + r*C0 + d%C0 elements."""
    c0 = 32 // itemsize
    blk, r = divmod(slot, block_size)
    return (blk * block_size * dim + (d // c0) * block_size * c0 + r * c0 + d % c0) * itemsize


LOCATE_CASES = [
    ("PA_NZ", "4,16,1,64", "bfloat16", 37, 20),
    ("PA_NZ", "3,32,1,512", "int8", 70, 511),
    ("PA_BSND", "4,16,1,576", "bfloat16", 63, 575),
    ("PA_BLK_NZ", "2,128,1,512", "bfloat16", 200, 17),
    ("TND", "10,1,64", "float16", 9, 3),
]


@pytest.mark.parametrize("mode, shape, dtype, slot, dim", LOCATE_CASES)
def test_locate_forward_and_reverse_agree(capsys, mode, shape, dtype, slot, dim):
    fwd = _locate(capsys, "--cache-mode", mode, "--shape", shape, "--dtype", dtype, "--slot", str(slot),
                  "--dim", str(dim))
    sizes = [int(v) for v in shape.split(",")]
    itemsize = {"bfloat16": 2, "float16": 2, "int8": 1}[dtype]
    if mode.endswith("NZ"):
        assert fwd["byte_offset"] == _nz_offset_by_hand(slot, dim, sizes[1], sizes[-1], itemsize)
    else:
        assert fwd["byte_offset"] == (slot * sizes[-1] + dim) * itemsize
    for k in range(itemsize):
        rev = _locate(capsys, "--cache-mode", mode, "--shape", shape, "--dtype", dtype, "--byte",
                      str(fwd["byte_offset"] + k))
        assert (rev["slot"], rev["dim"], rev["head"], rev["byte_in_element"]) == (slot, dim, 0, k)
        assert (rev["block"], rev["row"]) == (fwd["block"], fwd["row"])


def test_locate_slot_lists_nz_chunks(capsys):
    out = _locate(capsys, "--cache-mode", "PA_NZ", "--shape", "4,16,1,64", "--dtype", "bfloat16", "--slot", "37")
    assert out["chunk_bytes"] == 32
    assert [c["byte_offset"] for c in out["chunks"]] == [_nz_offset_by_hand(37, d, 16, 64, 2) for d in (0, 16, 32, 48)]
    assert [c["elements"] for c in out["chunks"]] == [[0, 16], [16, 32], [32, 48], [48, 64]]


@pytest.mark.parametrize("row_byte, field", [(0, ("k_nope", 0, 0)), (511, ("k_nope", 511, 0)),
                                             (512 + 2 * 3 + 1, ("k_rope", 3, 1)), (640 + 4 * 2, ("scale", 2, 0)),
                                             (655, ("scale", 3, 3))])
def test_locate_combined_names_the_field(capsys, row_byte, field):
    out = _locate(capsys, "--cache-mode", "PA_BSND", "--shape", "2,16,1,656", "--dtype", "int8", "--combined",
                  "--byte", str(5 * 656 + row_byte))
    assert (out["slot"], out["dim"]) == (5, row_byte)
    assert (out["field"], out["field_element"], out["field_byte"]) == field


@pytest.mark.parametrize("args, message", [
    (["--cache-mode", "PA_NZ", "--shape", "4,16,1,64", "--dtype", "bfloat16", "--byte", "8192"], "byte_offset"),
    (["--cache-mode", "PA_NZ", "--shape", "4,16,1,64", "--dtype", "bfloat16", "--slot", "64"], "slot"),
    (["--cache-mode", "PA_BSND", "--shape", "4,16,1,576", "--dtype", "int8", "--combined", "--slot", "1"],
     "combined"),
    (["--cache-mode", "PA_BSND", "--shape", "4,16,64", "--dtype", "int8", "--slot", "1"], "4-D"),
])
def test_locate_errors_exit_2_with_message(capsys, args, message):
    assert main(["locate", *args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("shape, dtype", [("4,10,1,64", "bfloat16"), ("2,24,1,512", "int8")])
def test_locate_rejects_block_sizes_no_op_accepts(capsys, shape, dtype):
    assert main(["locate", "--cache-mode", "PA_NZ", "--shape", shape, "--dtype", dtype, "--slot", "1"]) == 2
    assert "BlockSize" in capsys.readouterr().err


def test_locate_is_inspect_where_and_what(capsys):
    geo = ["--cache-mode", "PA_NZ", "--shape", "4,16,1,64", "--dtype", "bfloat16"]
    for loc, ins in ((["--slot", "37"], ["where", "--slot", "37"]), (["--byte", "4777"], ["what", "--byte", "4777"])):
        assert main(["locate", *geo, *loc]) == 0
        alias = capsys.readouterr().out
        assert main(["inspect", ins[0], *geo, *ins[1:]]) == 0
        assert capsys.readouterr().out == alias


# ------------------------------------------------------------------------------ inspect
def _inspect(capsys, *args, rc=0) -> dict:
    assert main(["inspect", *args, "--json"]) == rc
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def nz_files(tmp_path):
    """Two PA_NZ bf16 caches [4, 16, 1, 64] as .npz files: b = a with two bytes of slot 37 and one of slot
    3 changed; plus a's raw bytes as .bin and as a storage-shape .npy of int16."""
    import numpy as np

    from ascend_emu import inspect
    from ascend_emu.quant import BF16

    rng = np.random.default_rng(7)
    a = inspect.Cache.from_array(rng.standard_normal((4, 16, 1, 64)).astype(BF16), "PA_NZ")
    raw = a.raw.copy()
    changed = [4777, 4779, 3 * 32 + 1]  # slot 37 dims 20 and 21 (high bytes); slot 3 dim 0
    raw[changed] ^= 0x40
    b = inspect.Cache(spec=a.spec, raw=raw, shape=a.shape)
    a.raw.tofile(tmp_path / "a.bin")
    return {"a": inspect.save_cache(tmp_path / "a", a), "b": inspect.save_cache(tmp_path / "b", b),
            "bin": str(tmp_path / "a.bin"), "changed": changed, "cache": a}


def test_inspect_where_every_field_of_a_combined_row(capsys):
    geo = ["--cache-mode", "PA_BSND", "--shape", "2,16,1,656", "--dtype", "int8"]
    out = _inspect(capsys, "where", *geo, "--slot", "5")
    assert [(c["field"], c["byte_offset"], c["bytes"]) for c in out["chunks"]] == [
        ("k_nope", 5 * 656, 512), ("k_rope", 5 * 656 + 512, 128), ("scale", 5 * 656 + 640, 16)]
    out = _inspect(capsys, "where", *geo, "--slot", "5", "--field", "scale", "--element", "2")
    assert [(c["byte_offset"], c["bytes"]) for c in out["chunks"]] == [(5 * 656 + 648, 4)]
    assert main(["inspect", "where", *geo, "--slot", "5", "--field", "scale"]) == 0
    text = capsys.readouterr().out
    assert "scale" in text and "[3920, 3936)" in text


def test_inspect_where_a_token_lives(capsys):
    geo = ["--cache-mode", "PA_BLK_NZ", "--shape", "4,16,1,64", "--dtype", "bfloat16"]
    out = _inspect(capsys, "where", *geo, "--token", "18", "--index", "[[3,1]]", "--seq-lens", "20", "--dim", "5")
    assert (out["token"], out["slot"], out["byte_offset"]) == (18, 18, (16 * 64 + 2 * 16 + 5) * 2)
    assert main(["inspect", "where", *geo, "--token", "0", "--index", "[-1,1]", "--seq-lens", "20"]) == 2
    assert "skipped" in capsys.readouterr().err


def test_inspect_what_reads_geometry_from_a_file(capsys, nz_files):
    out = _inspect(capsys, "what", nz_files["a"], "--byte", "4777")
    assert (out["slot"], out["dim"], out["byte_in_element"], out["c0_chunk"], out["fractal"]) == (37, 20, 1, 1, 0)
    out = _inspect(capsys, "what", nz_files["bin"], "--cache-mode", "PA_NZ", "--shape", "4,4,16,16", "--dtype",
                   "bfloat16", "--byte", "4777")
    assert out["slot"] == 37 and out["cache"]["storage_shape"] == [4, 4, 16, 16]


def test_inspect_what_of_an_nz_weight_byte(capsys):
    byte = 2 * 32 * 16 * 2 + 33  # C0 chunk 2 starts after two [32 rows, 16] chunks; row 1, byte 1
    out = _inspect(capsys, "what", "--weight-shape", "20,40", "--dtype", "bfloat16", "--byte", str(byte))
    assert (out["padding"], out["index"], out["byte_in_element"], out["c0_chunk"]) == (False, [1, 32], 1, 2)
    out = _inspect(capsys, "what", "--weight-shape", "20,40", "--dtype", "bfloat16", "--byte", str(20 * 32))
    assert out["padding"] and out["storage_index"] == [0, 1, 4, 0]


def test_inspect_dump_a_slot(capsys, nz_files, monkeypatch):
    import numpy as np

    monkeypatch.setenv("COLUMNS", "200")  # the marks whole on one line (80 columns: tests/test_text_width.py)

    out = _inspect(capsys, "dump", nz_files["a"], "--slot", "37")
    rows = nz_files["cache"].rows()  # [64, 1, 64]
    assert [v for ln in out["lines"] for v in ln["values"]] == [float(v) for v in rows[37, 0]]
    assert [ln["c0_chunk"] for ln in out["lines"]] == [0, 1, 2, 3]
    assert main(["inspect", "dump", nz_files["a"], "--block", "2"]) == 0
    text = capsys.readouterr().out
    assert "fractal 0 of C0 chunk 3" in text
    assert "C0#3 F0" in text and "bytes [4096, 6144)" in text
    assert np.isfinite(rows).all()


def test_inspect_diff_text_json_exit_status_and_picture(capsys, nz_files, tmp_path):
    out = _inspect(capsys, "diff", nz_files["a"], nz_files["b"], rc=1)
    assert out["changed_bytes"] == sorted(nz_files["changed"])
    assert out["summary"]["slots"] == [3, 37]
    out = _inspect(capsys, "diff", nz_files["a"], nz_files["b"], "--expect-slots", "3,37", rc=0)
    assert out["summary"]["outside_expected_bytes"] == 0
    out = _inspect(capsys, "diff", nz_files["a"], nz_files["b"], "--expect-slots", "37", rc=1)
    assert out["summary"]["outside_expected_slots"] == [3]
    png = tmp_path / "diff.png"
    assert main(["inspect", "diff", nz_files["a"], nz_files["b"], "--png", str(png)]) == 1
    text = capsys.readouterr().out
    assert "3 differing byte(s) in 2 slot(s)" in text and png.stat().st_size > 2000
    assert main(["inspect", "diff", nz_files["a"], nz_files["a"]]) == 0


def test_inspect_grid_and_blocks_pictures(capsys, tmp_path):
    out = _inspect(capsys, "grid", "--cache-mode", "PA_NZ", "--shape", "2,16,1,64", "--dtype", "bfloat16",
                   "--block", "1", "--png", str(tmp_path / "g.png"))
    assert out["chunks"] == 4 and out["offset"][1][0] == 2048 + 512 and (tmp_path / "g.png").stat().st_size > 2000
    out = _inspect(capsys, "grid", "--weight-shape", "20,40", "--dtype", "bfloat16")
    assert out["logical_row"][0][20] == -1 and out["valid_cols"][2][0] == 8
    out = _inspect(capsys, "blocks", "--block-table", "[[0,1,9],[2,1,0]]", "--seq-lens", "20,17", "--block-size",
                   "16", "--num-blocks", "4", "--png", str(tmp_path / "b.png"))
    assert out["unused_blocks"] == [3] and out["shared_blocks"] == [1]
    assert (tmp_path / "b.png").stat().st_size > 2000


def test_inspect_reads_a_torch_save_dump(capsys, tmp_path):
    torch = pytest.importorskip("torch")
    kv = torch.randn(2, 16, 1, 512, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    torch.save(kv, tmp_path / "kv.pt")
    out = _inspect(capsys, "dump", str(tmp_path / "kv.pt"), "--cache-mode", "PA_BSND", "--slot", "17")
    got = [v for ln in out["lines"] for v in ln["values"]]
    assert got == [float(v) for v in kv.reshape(32, 512)[17].float()]


@pytest.mark.parametrize("args, message", [
    (["dump", "missing.npz", "--slot", "0"], "missing.npz"),
    (["where", "--cache-mode", "PA_NZ", "--shape", "4,16,1,64", "--slot", "0"], "--dtype"),
    (["dump", "x.bin", "--cache-mode", "PA_NZ", "--slot", "0"], "shape"),
])
def test_inspect_errors_exit_2_with_message(capsys, args, message):
    assert main(["inspect", *args]) == 2
    assert message in capsys.readouterr().err


def _one_line_error(capsys, args) -> str:
    rc = main(["inspect", *args])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("ascend-emu: inspect "), err
    return err


def test_inspect_block_table_from_a_json_file(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bt.json").write_text("[[0, 1], [2, 3]]")
    args = ["blocks", "--seq-lens", "20,5", "--block-size", "16", "--json", "--block-table"]
    from_file = _inspect(capsys, *args, "bt.json")
    assert from_file == _inspect(capsys, *args, "[[0, 1], [2, 3]]")
    assert [r["block"] for s in from_file["sequences"] for r in s["runs"]] == [0, 1, 2]
    err = _one_line_error(capsys, args[:-2] + ["--block-table", "missing.json"])
    assert "--block-table: expected an existing .json file" in err and "'missing.json': no such file" in err
    (tmp_path / "bad.json").write_text("[[0, 1], [2,")
    err = _one_line_error(capsys, args[:-2] + ["--block-table", "bad.json"])
    assert "--block-table: expected an integer array: a JSON list like [[0,1],[2,3]] or a .json" in err


def test_inspect_bare_dump_errors_say_what_to_give(capsys, tmp_path, monkeypatch):
    """A .npy of a bf16 cache viewed as int16 or saved untyped: --dtype bfloat16 named; a raw
    dump whose --shape / --dtype do not cover its bytes: the file's bytes, the shape's bytes and
    the elements the file holds, in that order."""
    import ml_dtypes

    monkeypatch.chdir(tmp_path)
    cache = np.zeros((2, 16, 1, 64), ml_dtypes.bfloat16)
    np.save("int16.npy", cache.view(np.int16))
    np.save("untyped.npy", cache)
    cache.tofile("c.bin")
    for name, what in (("int16.npy", "got int16 elements in 'int16.npy'"),
                       ("untyped.npy", "got untyped 2-byte (|V2) elements in 'untyped.npy'")):
        err = _one_line_error(capsys, ["dump", name, "--cache-mode", "PA_BSND", "--slot", "0"])
        assert what in err and "needs --dtype bfloat16" in err, err
        assert main(["inspect", "dump", name, "--cache-mode", "PA_BSND", "--slot", "0", "--dtype", "bfloat16"]) == 0
    capsys.readouterr()
    err = _one_line_error(capsys, ["dump", "c.bin", "--cache-mode", "PA_BSND", "--shape", "2,16,1,63", "--dtype",
                                   "bfloat16", "--slot", "0"])
    assert ("shape/dtype: expected a shape and dtype of exactly the 4096 bytes in 'c.bin', got shape "
            "[2, 16, 1, 63] of bfloat16 = 4032 bytes; it holds 2048 bfloat16 elements") in err


def test_inspect_torch_files_without_torch_give_the_install_hint(capsys, tmp_path, monkeypatch):
    from ascend_emu.install_hints import TORCH_HINT

    monkeypatch.chdir(tmp_path)
    (tmp_path / "kv.pt").write_bytes(b"not read")
    (tmp_path / "bt.pt").write_bytes(b"not read")
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails, as when it is not installed
    err = _one_line_error(capsys, ["dump", "kv.pt", "--cache-mode", "PA_BSND", "--slot", "0"])
    assert f"reading 'kv.pt' (a torch.save file) needs torch; {TORCH_HINT}" in err
    err = _one_line_error(capsys, ["blocks", "--block-table", "bt.pt", "--seq-lens", "5", "--block-size", "16"])
    assert f"reading --block-table 'bt.pt' (a torch.save file) needs torch; {TORCH_HINT}" in err


# ------------------------------------------------------------------------------ typos and short names
def _usage_error(capsys, monkeypatch, argv) -> list[str]:
    """stderr lines of a usage error (exit 2) at a fixed terminal width of 80 columns."""
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err.splitlines()


@pytest.mark.parametrize("argv, usage, error", [
    # a mistyped option of a subcommand with a required option: named, not "--slot is required"
    (["inspect", "where", "--cache-mode", "PA_NZ", "--shape", "4,16,1,64", "--dtype", "bfloat16", "--slott", "3"],
     "usage: ascend-emu inspect where",
     "ascend-emu inspect where: error: unrecognized argument '--slott' (did you mean '--slot'?)"),
    (["locate", "--cache-mode", "PA_NZ", "--shape", "4,16,1,64", "--dtype", "bf16", "--slott=3"],
     "usage: ascend-emu locate", "ascend-emu locate: error: unrecognized argument '--slott=3' (did you mean '--slot'?)"),
    # a subcommand's unknown option: its usage, not the top level's
    (["demo", "--contxt", "5"], "usage: ascend-emu demo",
     "ascend-emu demo: error: unrecognized argument '--contxt' (did you mean '--context'?)"),
    (["replay", "dump", "-o", "out", "--zzz"], "usage: ascend-emu replay",
     "ascend-emu replay: error: unrecognized argument '--zzz' (see ascend-emu replay --help)"),
])
def test_a_mistyped_option_is_named_with_the_closest_one(capsys, monkeypatch, argv, usage, error):
    lines = _usage_error(capsys, monkeypatch, argv)
    assert lines[0].startswith(usage), lines
    assert lines[-1] == error
    assert sum("error:" in line for line in lines) == 1 and len(lines) <= 16, lines  # its usage, one error


@pytest.mark.parametrize("argv, error_end", [
    (["dmeo"], "invalid choice: 'dmeo' (choose from 'run', 'demo', 'warmup', 'inspect', 'locate', 'record', "
               "'compare', 'replay', 'fidelity'); did you mean 'demo'?"),
    (["inspect", "wehre"], "did you mean 'where'?"),
    (["inspect", "where", "--cache-mode", "PA_BSDN", "--shape", "4,16,1,64", "--dtype", "bf16", "--slot", "3"],
     "did you mean 'PA_BSND'?"),
])
def test_a_mistyped_choice_names_the_closest_one(capsys, monkeypatch, argv, error_end):
    lines = _usage_error(capsys, monkeypatch, argv)
    assert lines[-1].endswith(error_end), lines


def test_script_arguments_are_not_taken_for_typos(capsys, monkeypatch):
    """After `run SCRIPT` every token is the script's, however close to an option of run."""
    assert main(["run", "no_such_script.py", "--forse", "--contxt"]) == 2
    assert capsys.readouterr().err == "ascend-emu: can't open file 'no_such_script.py': no such file\n"
    lines = _usage_error(capsys, monkeypatch, ["run", "--forse", "no_such_script.py", "--contxt"])
    assert lines[-1] == "ascend-emu run: error: unrecognized argument '--forse' (did you mean '--force'?)"


def test_bf16_is_accepted_wherever_a_dtype_is_named(capsys, tmp_path):
    from ascend_emu.inspect.cache import resolve_dtype
    from ascend_emu.quant import BF16

    assert resolve_dtype("bf16") == resolve_dtype("bfloat16") == np.dtype(BF16)
    assert resolve_dtype("fp16") == np.float16 and resolve_dtype("fp32") == np.float32
    geometry = ["--cache-mode", "PA_NZ", "--shape", "4,16,1,64", "--slot", "17", "--json"]
    assert main(["locate", *geometry, "--dtype", "bf16"]) == 0
    short = capsys.readouterr().out
    assert main(["locate", *geometry, "--dtype", "bfloat16"]) == 0
    assert capsys.readouterr().out == short and "bfloat16" in short
    assert main(["inspect", "what", "--weight-shape", "64,64", "--dtype", "bf16", "--byte", "100"]) == 0


def test_locate_help_names_no_file(capsys, monkeypatch):
    """`locate` takes no cache file (only the geometry): its help does not offer one."""
    monkeypatch.setenv("COLUMNS", "120")
    with pytest.raises(SystemExit):
        main(["locate", "--help"])
    out = capsys.readouterr().out
    assert "file" not in out.lower() and ".npz" not in out
    with pytest.raises(SystemExit):
        main(["inspect", "where", "--help"])
    assert ".npz" in capsys.readouterr().out  # where does read one


def test_inspect_dump_without_a_file_is_a_usage_error(capsys):
    err = _one_line_error(capsys, ["dump", "--cache-mode", "PA_NZ", "--shape", "4,16,1,64", "--dtype", "bf16",
                                   "--slot", "3"])
    assert err == ("ascend-emu: inspect dump: FILE: expected a cache file to read the bytes from (--cache-mode / "
                   "--shape / --dtype only describe it), got none\n")
