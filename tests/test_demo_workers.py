"""``ascend-emu demo -j N`` / ``run_decode_step(jobs=N)``: on a cold kernel cache the demo's op
families compile in worker processes (:data:`ascend_emu.demo.WORKER_FAMILIES`) while the demo waits
for each before that op's first call; on a warm cache no worker starts; the results do not change.

The workers here run in this process (a pool that calls the task itself, on this thread), so no
process is spawned and nothing compiles that the other demo tests do not compile anyway."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from ascend_emu import demo
from ascend_emu.cli import build_parser, main
from ascend_emu.workers import InProcess

SMALL = dict(context=40, sparse_count=16, heads=1, block_size=16)
FAMILIES = tuple(demo.WORKER_FAMILIES)


class _Pool(InProcess):
    """``ProcessPool(workers)`` stand-in: every task in this process; records what it was given."""

    made: list[int] = []
    items: list = []

    def __init__(self, workers: int):
        _Pool.made.append(workers)

    def run(self, fn, items, timeout):
        _Pool.items.extend(items)
        return super().run(fn, items, timeout)


class _NowThread:
    """``threading.Thread`` stand-in: runs its target when started, on the calling thread (the
    workers' results are all in before the demo's first call, whatever the machine's speed)."""

    def __init__(self, target, args, daemon):
        self._run = lambda: target(*args)

    def start(self):
        self._run()


@pytest.fixture
def in_process_workers(monkeypatch):
    """The demo's workers as :class:`_Pool` tasks run at once; each family reports 3 kernels in 1.5 s,
    except the indexer's, whose worker fails."""
    _Pool.made, _Pool.items = [], []
    monkeypatch.setattr("ascend_emu.workers.ProcessPool", _Pool)
    monkeypatch.setattr(demo, "threading", SimpleNamespace(Thread=_NowThread, Event=threading.Event))
    real = demo._compile_family
    ran = []

    def compile_family(item):
        ran.append(item[0])
        if item[0] == "npu_lightning_indexer":
            raise RuntimeError("no compiler")
        real(item)  # the family's first calls on stand-in inputs
        return 3, 1.5

    monkeypatch.setattr(demo, "_compile_family", compile_family)
    return ran


def _outputs(rep) -> bytes:
    return b"".join(np.ascontiguousarray(a).view(np.uint8).tobytes()
                    for a in (rep.kv_int8, rep.out_int8, rep.out_bf16, rep.row, rep.block_table))


def test_cold_families_follow_the_kernel_cache(monkeypatch, tmp_path):
    """A family is cold while the keyed cache holds no kernel of its emu module (another module's
    kernels, even one whose name ends like it, do not count)."""
    monkeypatch.setattr(demo, "kernel_cache_dir", lambda: tmp_path)
    assert demo.cold_families() == FAMILIES == ("npu_mla_prolog_v3", "sparse attention", "npu_lightning_indexer")
    (tmp_path / "emu").mkdir()
    for name in ("quant_lightning_indexer._score-1.py311.nbi", "kv_quant_sparse_flash_attention._x-2.py311.nbi",
                 "mla_preprocess._rows-3.py311.nbi", "mla_prolog._rows-4.py311.1.nbc"):
        (tmp_path / "emu" / name).write_bytes(b"")
    assert demo.cold_families() == FAMILIES
    (tmp_path / "emu" / "lightning_indexer._gather_keys_range-151.py311.nbi").write_bytes(b"")
    assert demo.cold_families() == ("npu_mla_prolog_v3", "sparse attention")
    (tmp_path / "emu" / "mla_prolog._cq_norm_rows-69.py311.nbi").write_bytes(b"")
    (tmp_path / "emu" / "sparse_flash_attention._gather-136.py311.nbi").write_bytes(b"")
    assert demo.cold_families() == ()
    assert demo.family_names(FAMILIES) == "npu_mla_prolog_v3, sparse attention and npu_lightning_indexer"


def test_cold_cache_compiles_in_workers_and_the_results_do_not_change(monkeypatch, capsys, in_process_workers):
    """Two workers for three families, longest to compile first, at the demo's shapes; each waited
    for at its op's first call; a failed one leaves its family to the demo; the same bytes as
    without workers; ``ascend-emu demo -j 2`` says what the workers compiled."""
    config = demo.DecodeStepConfig(**SMALL)
    serial = demo.run_decode_step(config)  # jobs=1: no worker, whatever the cache holds
    assert _Pool.made == [] and serial.workers == 0 and serial.worker_kernels == 0
    monkeypatch.setattr(demo, "cold_families", lambda: FAMILIES)
    steps = []
    rep = demo.run_decode_step(config, jobs=2, on_step=steps.append)
    assert _Pool.made == [2] and [family for family, _ in _Pool.items] == list(FAMILIES)
    assert all(c is config for _, c in _Pool.items) and in_process_workers == list(FAMILIES)
    assert steps[0] == ("compiling the kernels of npu_mla_prolog_v3, sparse attention and npu_lightning_indexer "
                        "in 2 worker processes (first run only)")
    assert rep.workers == 2 and rep.worker_families == FAMILIES
    assert rep.worker_failures == ["npu_lightning_indexer: error: RuntimeError: no compiler"]
    by_step = {f.step: (f.worker_kernels, f.worker_compile_seconds) for f in rep.first_calls}
    assert by_step == {**{f.step: (0, 0.0) for f in serial.first_calls},
                       "prefill 40 tokens: npu_mla_prolog_v3, int8 per-tile cache": (3, 1.5),
                       "decode: npu_kv_quant_sparse_flash_attention": (3, 1.5)}
    assert (rep.worker_kernels, rep.worker_compile_seconds) == (6, 3.0)
    assert _outputs(rep) == _outputs(serial) and rep.selected == serial.selected == 16
    assert rep.cosine == serial.cosine

    # the command line: -j, and the report of what the workers compiled
    assert build_parser().parse_args(["demo"]).jobs is None  # the cores (workers only while the cache is cold)
    assert build_parser().parse_args(["demo", "-j", "3"]).jobs == 3
    for bad in ("0", "two"):
        with pytest.raises(SystemExit) as exc:
            build_parser().parse_args(["demo", "--jobs", bad])
        assert exc.value.code == 2
    given = []

    def recording(config, on_step, jobs):
        given.append((config, jobs))
        return rep

    monkeypatch.setattr(demo, "run_decode_step", recording)
    argv = ["demo", "--context", "40", "--sparse-count", "16", "--heads", "1", "--block-size", "16", "-j", "2"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert given == [(config, 2)]
    out = " ".join(captured.out.split())
    assert re.search(r"first calls: \d+\.\d s compiling \d+ Numba kernels? here while 2 worker processes compiled "
                     r"6 more for npu_mla_prolog_v3, sparse attention and npu_lightning_indexer \(3\.0 s of "
                     r"compiling, in parallel; first run only", out), out
    assert "ascend-emu: a worker process failed to compile npu_lightning_indexer: error: RuntimeError: no compiler " \
           "(compiled here instead)" in captured.err


def test_warm_cache_or_one_job_starts_no_worker(monkeypatch, in_process_workers):
    given = []

    def recording(c, on_step, watch, workers):
        given.append(workers)
        return demo.DecodeStepReport(config=c)

    monkeypatch.setattr(demo, "_run_decode_step", recording)
    config = demo.DecodeStepConfig(**SMALL)
    monkeypatch.setattr(demo, "cold_families", lambda: ())
    demo.run_decode_step(config, jobs=4)
    monkeypatch.setattr(demo, "cold_families", lambda: FAMILIES)
    demo.run_decode_step(config, jobs=1)
    assert given == [None, None] and _Pool.made == [] and in_process_workers == []
    demo.run_decode_step(config, jobs=4)
    assert given[-1].processes == 3 and _Pool.made == [3]
    with pytest.raises(ValueError, match=r"jobs: expected an int >= 1, got 0"):
        demo.run_decode_step(config, jobs=0)


@pytest.mark.slow
def test_stand_in_first_calls_load_every_kernel_the_demo_uses():
    """In a fresh process, the workers' first calls (:func:`ascend_emu.demo._compile_family`) at the
    demo's shapes give every Numba kernel signature the demo then calls: the demo adds none (so,
    cold, it compiles nothing its workers did not)."""
    code = """if True:
        import sys
        from numba.core.registry import CPUDispatcher
        import ascend_emu.demo as demo

        def signatures():
            return {(f"{d.py_func.__module__}.{d.py_func.__qualname__}", str(sig))
                    for m in list(sys.modules.values()) if getattr(m, "__name__", "").startswith("ascend_emu")
                    for d in vars(m).values() if isinstance(d, CPUDispatcher) for sig in d.signatures}

        config = demo.DecodeStepConfig(context=40, sparse_count=16, heads=1, block_size=16)
        for family in demo.WORKER_FAMILIES:
            demo._compile_family((family, config))
        workers = signatures()
        demo.run_decode_step(config)
        added = signatures() - workers
        print(len(workers), sorted(added))
        sys.exit(1 if added or len(workers) < 20 else 0)
    """
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
