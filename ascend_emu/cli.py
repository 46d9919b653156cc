"""``ascend-emu``: run torch_npu scripts on the CPU, show a demo, map cache bytes.

Commands:

- ``ascend-emu run [--force] [--checked] [--poison] [--permute-blocks] [--traceback] SCRIPT [ARGS...]``: run SCRIPT
  as ``__main__`` with ``import torch_npu`` resolving to :mod:`ascend_emu.torch_npu`, as ``python
  SCRIPT ARGS...`` would: ``sys.argv``, an absolute ``__file__`` (and traceback paths), the
  script's directory in place of the launcher's ``sys.path[0]``, its exit status. An uncaught
  exception's traceback shows the script's frames as Python does and stops at its call into
  ``ascend_emu`` (a line says how many emulator frames were hidden); ``--traceback`` or env
  ``ASCEND_EMU_TRACEBACK=1`` shows them all. If a real torch_npu is installed the script runs
  against it unless ``--force`` is given.
- ``ascend-emu demo``: a DeepSeek-V3.2 decode step on the NumPy API (no torch needed): prefill
  into a per-tile int8 cache and a bf16 cache, then ``npu_mla_prolog_v3`` ->
  ``npu_lightning_indexer`` -> sparse attention on both paths (:mod:`ascend_emu.demo`), with
  per-op steady-state times (each op's first call, which compiles or loads its Numba kernels, apart;
  progress names each kernel as it compiles), a cache summary, one 656-byte row decoded and the
  int8 path's error; ``--save-cache PATH`` writes the int8 cache for ``ascend-emu inspect``. While
  the kernel cache lacks the demo's kernels, they compile in ``-j N`` worker processes (default:
  the cores) sharing the on-disk cache, and the demo loads them from there.
  ``ascend-emu demo --layout``: ``npu_mla_prolog_v3`` through the drop-in, then where one token's
  k_rope landed in a PA_NZ cache, checked byte by byte against a PA_BSND run.
  ``ascend-emu demo --model v4``: the DeepSeek-V4-Flash decode step (:mod:`ascend_emu.demo_v4`):
  a CSA and an HCA block with mHC on the A2 / A3 ops, per-op times and the caches.
- ``ascend-emu record | compare | replay``: the real NPU against the emulator (recordings, shadow
  runs, msprobe dumps; :mod:`ascend_emu.compare.cli`).
- ``ascend-emu warmup``: run every op once on tiny inputs, so its Numba kernels are compiled into
  the on-disk cache (:mod:`ascend_emu.warmup`).
- ``ascend-emu inspect where|what|dump|grid|diff|blocks``: bit-level cache debugging
  (:mod:`ascend_emu.inspect`, rendered by :mod:`ascend_emu.inspect.cli`); ``ascend-emu locate``
  is an alias of ``inspect where`` (``--slot``) / ``inspect what`` (``--byte``).
- ``ascend-emu fidelity``: per op and output, exact / bounded / known to differ / unverified, and
  against what (:mod:`ascend_emu.fidelity`; docs/fidelity.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

from ._version import __version__
from ._script import run_as_main, show_script_exception
from .cli_args import SuggestingParser
from .tracebacks import ENV_TRACEBACK
from .install_hints import TORCH_HINT


def _err(msg: str) -> None:
    print(f"ascend-emu: {msg}", file=sys.stderr)


# ---------------------------------------------------------------------------------------- run
def _install_emulator() -> bool:
    """Make ``import torch_npu`` resolve to the emulator; False (with the install hint) when
    torch cannot be imported."""
    try:
        import ascend_emu.torch_npu as drop_in
    except ImportError as exc:
        if not (exc.name or "").split(".")[0] == "torch":
            raise
        _err(f"torch is not installed, so `import torch_npu` cannot be emulated; {TORCH_HINT}")
        return False
    drop_in.install()
    return True


def cmd_run(ns: argparse.Namespace) -> int:
    """``ascend-emu run``: see the module doc."""
    script = ns.script  # sys.argv[0] as given; __file__ and tracebacks absolute (Python >= 3.9)
    if not os.path.isfile(script):
        _err(f"can't open file {ns.script!r}: no such file")
        return 2
    real = importlib.util.find_spec("torch_npu")
    if real is not None and not ns.force:
        _err(f"a real torch_npu is installed ({real.origin}); running {ns.script} against it "
             f"(pass --force to use the emulator instead)")
    else:
        if real is not None:
            _err(f"--force: using the emulator, not the installed torch_npu ({real.origin})")
        if not _install_emulator():
            return 2
    path = os.path.join(os.getcwd(), script)  # absolute, not normalised (as Python does)
    sys.argv = [script, *ns.args]
    if ns.permute_blocks:  # steps decorated with ascend_emu.block_permutation.permutation_checked
        from .block_permutation import ENV_PERMUTE_BLOCKS
        os.environ[ENV_PERMUTE_BLOCKS] = "1"
    if ns.checked or ns.poison:  # checked mode for the whole script
        from .checked_mode import enable
        enable(True, poison=ns.poison)
    if not getattr(sys.flags, "safe_path", False):  # python -P (3.11+) adds no script directory
        sys.path[0] = os.path.dirname(os.path.realpath(script))  # the launcher's entry (cwd / bin)
    try:
        run_as_main(path)
    except (SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # noqa: BLE001  (shown like Python shows it, then exit 1 / 130)
        show_script_exception(path, exc, full=ns.traceback or None)
        return 130 if isinstance(exc, KeyboardInterrupt) else 1
    return 0


# ---------------------------------------------------------------------------------------- demo
#: The demo fails below this cosine between its int8 and bf16 attention outputs (measured: 0.9998
#: at the default shapes; a wrong row or index drops it far lower).
DEMO_MIN_COSINE = 0.99
#: The :class:`ascend_emu.demo.DecodeStepConfig` fields ``ascend-emu demo`` has an option for.
DEMO_OPTIONS = ("context", "heads", "sparse_count", "block_size")
#: The file ``--save-cache`` is shown with in the closing hint when it was not given.
DEMO_CACHE_FILE = "kv_int8.npz"
#: ``ascend-emu demo --model v4``: its context when --context is not given, and its blocks (CSA, HCA).
V4_DEMO_CONTEXT = 508
V4_DEMO_RATIOS = (4, 128)


def _demo_value(name: str):
    """argparse type of the demo option for config field ``name``: an int the config accepts
    (:func:`ascend_emu.demo.config_problem`), else a usage error naming the option (exit 2)."""
    def parse(text: str) -> int:
        from .demo import config_problem

        try:
            value = int(text)
        except ValueError:
            value = text
        problem = config_problem(name, value)
        if problem is not None:
            raise argparse.ArgumentTypeError(f"expected {problem}, got {text!r}")
        return value
    return parse


def _writable_file(text: str) -> str:
    """argparse type of ``--save-cache``: a file path whose directory exists and is writable."""
    path = text if text.endswith(".npz") else text + ".npz"  # as save_cache writes it
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"expected a file path in an existing, writable directory, got {text!r}")
    return path


def _demo_argv(ns: argparse.Namespace, **extra: str) -> str:
    """``ascend-emu demo`` with the options of ``ns`` that differ from their defaults, then ``extra``."""
    from .demo import DecodeStepConfig

    default = DecodeStepConfig()
    given = [f"--{k.replace('_', '-')} {getattr(ns, k)}" for k in DEMO_OPTIONS if getattr(ns, k) != getattr(default, k)]
    given += [f"--{k.replace('_', '-')} {v}" for k, v in extra.items()]
    return " ".join(["ascend-emu demo", *given])


def cmd_demo(ns: argparse.Namespace) -> int:
    """``ascend-emu demo``: the decode step (:mod:`ascend_emu.demo`), or ``--layout``."""
    if ns.layout:
        return _layout_demo()
    if ns.model == "v4":
        return _v4_demo(ns)
    from rich.table import Table

    from .demo import DECODE_REPEATS, DecodeStepConfig, family_names, heads_share, run_decode_step
    from .inspect import Cache, save_cache
    from .textview import console as text_console
    from .mla import D_NOPE, D_ROPE, HCKV
    from .progress import Progress
    from .quant import MLA_ROW

    config = DecodeStepConfig(**{k: getattr(ns, k) for k in DEMO_OPTIONS})
    console = text_console()
    console.print(f"[bold]DeepSeek-V3.2 decode step[/bold], one layer: He={config.he} Hcq={config.hcq} "
                  f"Hckv={HCKV} D={D_NOPE} Dr={D_ROPE}, N={config.heads} query heads "
                  f"({heads_share(config.heads)}), context {config.context} tokens, indexer "
                  f"{config.indexer_heads}x{config.indexer_dim} top-{config.sparse_count}, PA_BSND blocks of "
                  f"{config.block_size}")
    if ns.jobs is None:
        from .workers import default_workers

        ns.jobs = default_workers()
    with Progress() as progress:
        report = run_decode_step(config, on_step=progress.step, jobs=ns.jobs)

    first = {f.step: f for f in report.first_calls}
    steps = Table(title="steps (NumPy API, emu backend)", title_justify="left")
    steps.add_column("step")
    steps.add_column("ms", justify="right")
    steps.add_column("first call ms", justify="right")
    for name, seconds in report.timings:
        steps.add_row(name, f"{seconds * 1e3:.1f}", f"{first[name].seconds * 1e3:.1f}" if name in first else "")
    steps.caption = (f"ms: steady state, the median of {DECODE_REPEATS} runs (decode) or one run (prefill) after "
                     "the op's first call (prefill's: on two tokens); first calls compile or load the op's Numba "
                     "kernels" + ("; this run shared the cores with the worker processes compiling them (run it "
                                  "again for quiet figures)" if report.workers else ""))
    steps.caption_justify = "left"
    console.print(steps)
    if report.worker_kernels:
        processes = f"{report.workers} worker process{'es' if report.workers > 1 else ''}"
        here = f"{report.kernels_compiled} Numba kernel{'' if report.kernels_compiled == 1 else 's'}"
        console.print(f"first calls: {report.compile_seconds:.1f} s compiling {here} here while {processes} compiled "
                      f"{report.worker_kernels} more for "
                      f"{family_names(report.worker_families)} ({report.worker_compile_seconds:.1f} s of compiling, "
                      "in parallel; first run only: cached on disk, later runs load them)")
    elif report.kernels_compiled:
        console.print(f"first calls: {report.compile_seconds:.1f} s compiling {report.kernels_compiled} Numba "
                      "kernels (first run only: cached on disk, later runs load them)")
    else:
        console.print("first calls: every kernel loaded from the Numba cache (compiled by an earlier run)")
    for failure in report.worker_failures:
        _err(f"a worker process failed to compile {failure} (compiled here instead)")

    cache = Table(title="caches", title_justify="left")
    cache.add_column("")
    cache.add_column("value")
    cache.add_row("blocks used / pool", f"{report.blocks_used} / {report.num_blocks} "
                  f"(block_table {report.block_table[:6].tolist()}{' ...' if report.blocks_used > 6 else ''})")
    for name, nbytes in report.cache_bytes.items():
        cache.add_row(name, f"{nbytes / 2**20:.2f} MiB")
    cache.add_row("indexer selected", f"{report.selected} of {config.context + 1} tokens")
    console.print(cache)

    fmt = MLA_ROW
    row = report.row
    console.print(f"[bold]the decoded token's 656-byte row[/bold] (slot {report.row_slot} = block "
                  f"{report.row_slot // config.block_size}, row {report.row_slot % config.block_size})")
    console.print(f"  bytes [{fmt.nope_offset}, {fmt.rope_offset}) int8 k_nope: {row[:8].view('int8').tolist()} ...")
    console.print(f"  dequantized k_nope (int8 x tile scale): "
                  f"{[round(float(v), 4) for v in report.row_k_nope[:6]]} ...")
    console.print(f"  bytes [{fmt.rope_offset}, {fmt.scale_offset}) bf16 k_rope: "
                  f"{[round(float(v), 4) for v in report.row_k_rope[:6]]} ...")
    console.print(f"  bytes [{fmt.scale_offset}, {fmt.row_bytes}) fp32 tile scales: "
                  f"{[float(f'{v:.4g}') for v in report.row_scales]}  (raw {bytes(row[fmt.scale_offset:]).hex()})")
    console.print(f"[bold]what int8 costs[/bold]: attention output of the int8 path vs the bf16 path "
                  f"[{config.heads}, {HCKV}]: max abs error {report.max_abs:.2g}, cosine {report.cosine:.4f}")
    inspect_row = f"ascend-emu inspect dump {{}} --slot {report.row_slot}"
    if ns.save_cache:
        saved = save_cache(ns.save_cache, Cache.from_array(report.kv_int8, "PA_BSND"))
        console.print(f"saved the int8 kv_cache to {saved}; every field of the row, dequantized: "
                      f"{inspect_row.format(saved)}")
    else:
        console.print(f"more: {_demo_argv(ns, save_cache=DEMO_CACHE_FILE)} saves the int8 kv_cache; then "
                      f"{inspect_row.format(DEMO_CACHE_FILE)} shows every field of the row, dequantized")
    if not report.cosine > DEMO_MIN_COSINE:
        _err(f"the int8 path's cosine {report.cosine:.6f} to the bf16 path is below {DEMO_MIN_COSINE}: "
             "a wrong cache row or index was read")
        return 1
    return 0


def _v4_demo(ns: argparse.Namespace) -> int:
    """``ascend-emu demo --model v4``: the DeepSeek-V4-Flash decode step (:mod:`ascend_emu.demo_v4`)."""
    from rich.table import Table

    from .demo import DecodeStepConfig
    from .errors import AscendEmuError
    from .demo_v4 import HEAD_DIM, HEADS, INDEX_TOPK, NOPE_DIM, ROPE_DIM, WINDOW, V4Config, run_v4_decode_step
    from .textview import console as text_console

    from . import soc

    context = V4_DEMO_CONTEXT if ns.context == DecodeStepConfig().context else ns.context
    cfg = V4Config(max_tokens=context + ns.decode_steps, block_size=ns.block_size)
    console = text_console()
    soc_before = os.environ.get(soc.SOC_NAME_ENV)  # restored after the run: main() may run in a caller's process
    if ns.path == "950":
        if not soc.is_ascend950():
            os.environ[soc.SOC_NAME_ENV] = soc.ASCEND950_EXAMPLE
            console.print(f"{soc.SOC_NAME_ENV}={soc.ASCEND950_EXAMPLE} for this run (the 950 path's ops)")
        what = "Ascend 950 path, 640-byte fp8 caches, fp8 indexer keys"
    else:
        what = "A2 / A3 path, bf16 caches, int8 indexer keys"
    console.print(f"[bold]DeepSeek-V4-Flash decode step[/bold] ({what}): hidden {cfg.hidden}, "
                  f"{HEADS} query heads, head dim {HEAD_DIM} = {NOPE_DIM} + {ROPE_DIM}, window {WINDOW}, mHC 4 copies; "
                  f"one CSA block (indexer top-{INDEX_TOPK}) and one HCA block (the model has 43 layers; the FFN / "
                  f"MoE half of each block is not run), context {context} tokens then {ns.decode_steps} decoded one "
                  f"by one; blocks of {cfg.block_size}")
    try:
        report = run_v4_decode_step(cfg, ratios=V4_DEMO_RATIOS, context=context, decode_steps=ns.decode_steps,
                                    path=ns.path)
    except AscendEmuError as exc:
        _err(str(exc))
        return 1
    finally:
        if soc_before is None:
            os.environ.pop(soc.SOC_NAME_ENV, None)
        else:
            os.environ[soc.SOC_NAME_ENV] = soc_before
    steps = Table(title="ops (NumPy API, emu backend), summed over the blocks", title_justify="left")
    for col in ("op", "prefill ms", "decode ms / token"):
        steps.add_column(col, justify="left" if col == "op" else "right")
    for name in report.decode_times:
        steps.add_row(name, f"{report.prefill_times.get(name, 0.0) * 1e3:.1f}", f"{report.decode_times[name] * 1e3:.2f}")
    steps.caption = ("prefill includes the ops' first calls (Numba compiles or loads their kernels); "
                     "'projections' are plain NumPy matmuls standing in for npu_quant_matmul")
    steps.caption_justify = "left"
    console.print(steps)
    caches = Table(title="caches", title_justify="left")
    for col in ("block", "cache", "shape", "dtype", "MiB"):
        caches.add_column(col)
    for layer, name, shape, dtype, nbytes in report.caches:
        kind = {4: "CSA", 128: "HCA"}.get(report.ratios[layer], "SWA")
        caches.add_row(f"{layer} ({kind})", name, str(list(shape)), dtype, f"{nbytes / 2**20:.2f}")
    console.print(caches)
    layer, pos, block, offset, values = report.swa_row
    decoded = " (its 640-byte fp8 row decoded)" if ns.path == "950" else ""
    console.print(f"the last token (position {pos}) in block {layer}'s SWA cache: block {block}, row {offset}"
                  f"{decoded}: {[round(float(v), 4) for v in values]} ...")
    console.print("compressed rows written: " + ", ".join(f"ratio {r}: {n}" for r, n in report.cmp_rows.items())
                  + (f"; the CSA indexer selected {report.selected} rows for the last token" if 4 in report.ratios
                     else ""))
    return 0


def _layout_demo() -> int:
    """``ascend-emu demo --layout``: npu_mla_prolog_v3 (bf16, PA_NZ) through the drop-in, then layout debugging."""
    if importlib.util.find_spec("torch") is None:
        _err(f"the demo needs torch; {TORCH_HINT}")
        return 2
    import numpy as np
    import torch

    import ascend_emu.torch_npu as torch_npu
    from ascend_emu.layouts import CacheLayout
    from ascend_emu.torch_npu._convert import resolve_op

    try:
        resolve_op("npu_mla_prolog_v3", "torch_npu.npu_mla_prolog_v3")
    except NotImplementedError as exc:
        _err(str(exc))
        return 1

    start = time.perf_counter()
    B, S, He, Hcq, Hckv, N, D, Dr = 2, 4, 7168, 1536, 512, 8, 128, 64
    block_size, block_num = 16, 4
    bf16 = torch.bfloat16
    gen = torch.Generator().manual_seed(0)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(bf16)

    token_x = randn(B, S, He)  # [B, S, He]
    w_dq = torch_npu.npu_format_cast(randn(He, Hcq, scale=He ** -0.5), 29)  # [He, Hcq] FRACTAL_NZ
    w_uq_qr = torch_npu.npu_format_cast(randn(Hcq, N * (D + Dr), scale=Hcq ** -0.5), 29)  # [Hcq, N*(D+Dr)]
    w_uk = randn(N, D, Hckv, scale=D ** -0.5)  # [N, D, Hckv]
    w_dkv_kr = torch_npu.npu_format_cast(randn(He, Hckv + Dr, scale=He ** -0.5), 29)  # [He, Hckv+Dr]
    gamma_cq = (1 + 0.1 * torch.randn(Hcq, generator=gen)).to(bf16)  # [Hcq]
    gamma_ckv = (1 + 0.1 * torch.randn(Hckv, generator=gen)).to(bf16)  # [Hckv]
    pos = torch.arange(S, dtype=torch.float32)  # [S]
    inv_freq = 10000.0 ** (-torch.arange(Dr // 2, dtype=torch.float32) / (Dr // 2))  # [Dr/2]
    angle = torch.cat([pos[:, None] * inv_freq] * 2, dim=-1)  # [S, Dr], half layout
    rope_cos = angle.cos().to(bf16).expand(B, S, Dr).contiguous()  # [B, S, Dr]
    rope_sin = angle.sin().to(bf16).expand(B, S, Dr).contiguous()  # [B, S, Dr]
    cache_index = torch.randperm(block_num * block_size, generator=gen)[: B * S].reshape(B, S)  # [B, S] slots

    def run(cache_mode):
        kv_cache = torch.zeros(block_num, block_size, 1, Hckv, dtype=bf16)  # [BlockNum, BlockSize, 1, Hckv]
        kr_cache = torch.zeros(block_num, block_size, 1, Dr, dtype=bf16)  # [BlockNum, BlockSize, 1, Dr]
        out = torch_npu.npu_mla_prolog_v3(token_x, w_dq, w_uq_qr, w_uk, w_dkv_kr, gamma_cq, gamma_ckv,
                                          rope_sin, rope_cos, kv_cache, kr_cache, cache_index=cache_index,
                                          cache_mode=cache_mode)
        return out, kv_cache, kr_cache

    (query, query_rope, *_), kv_nz, kr_nz = run("PA_NZ")
    (query_nd, query_rope_nd, *_), kv_nd, kr_nd = run("PA_BSND")
    took = time.perf_counter() - start
    print(f"torch_npu.npu_mla_prolog_v3 (bf16, cache_mode='PA_NZ'), B={B} S={S} He={He} Hcq={Hcq} N={N}: "
          f"{took:.2f} s for two calls (PA_NZ, PA_BSND) incl. setup")
    print(f"  query      {tuple(query.shape)} {query.dtype}")
    print(f"  query_rope {tuple(query_rope.shape)} {query_rope.dtype}")

    b, s = 1, 2
    slot = int(cache_index[b, s])
    layout = CacheLayout.from_declared("PA_NZ", kr_nz.shape, kr_nz.element_size(), name="kr_cache")
    block, row = divmod(slot, block_size)
    offsets = layout.chunk_offsets(np.array([slot]))[0]  # [Dr / C0] byte offsets
    print(f"\nwhere token (b={b}, s={s})'s k_rope landed: cache_index[{b}, {s}] = slot {slot} = block {block}, "
          f"row {row}")
    print(f"  kr_cache declared {list(kr_nz.shape)} bf16, PA_NZ memory order {list(layout.storage_shape())} "
          f"[BlockNum, Dr/C0, BlockSize, C0], C0 = {layout.c0}")
    raw = kr_nz.reshape(-1).view(torch.uint8)  # the cache's bytes
    chunks = []
    for j, off in enumerate(offsets):
        loc = layout.locate(int(off))
        chunks.append(raw[int(off): int(off) + layout.chunk_bytes])
        print(f"  k_rope[{j * layout.c0:2d}:{(j + 1) * layout.c0:2d}] -> bytes [{int(off)}, "
              f"{int(off) + layout.chunk_bytes})   (reverse map of byte {int(off)}: block {loc.block}, "
              f"row {loc.row}, dim {loc.dim})")
    from_bytes = torch.cat(chunks).view(bf16)  # [Dr]
    bsnd_row = kr_nd.reshape(-1, Dr)[slot]  # [Dr]
    same_row = torch.equal(from_bytes.view(torch.int16), bsnd_row.view(torch.int16))
    print(f"  row read back from the raw PA_NZ bytes == PA_BSND kr_cache row {slot}: {same_row}")

    def nz_rows(cache):  # [BlockNum*BlockSize, 1, D] int16, the PA_NZ blocks in row order
        lay = CacheLayout.from_declared("PA_NZ", cache.shape, cache.element_size())
        return lay.to_rows(cache.view(torch.int16).numpy())

    same_caches = all(np.array_equal(nz_rows(nz), nd.view(torch.int16).numpy().reshape(-1, 1, nd.shape[-1]))
                      for nz, nd in ((kv_nz, kv_nd), (kr_nz, kr_nd)))
    same_query = torch.equal(query.view(torch.int16), query_nd.view(torch.int16)) and torch.equal(
        query_rope.view(torch.int16), query_rope_nd.view(torch.int16))
    print(f"  whole kv_cache and kr_cache, PA_NZ bytes re-ordered to BSND == PA_BSND run: {same_caches}")
    print(f"  query / query_rope identical in both runs: {same_query}")
    print("\nmore: ascend-emu inspect where --cache-mode PA_NZ --shape "
          f"{','.join(map(str, kr_nz.shape))} --dtype bfloat16 --slot {slot}")
    return 0 if (same_row and same_caches and same_query) else 1


# ---------------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    """The ``ascend-emu`` argument parser."""
    parser = SuggestingParser(
        prog="ascend-emu", description="Emulate Huawei Ascend NPU (torch_npu) MLA operators on the CPU.")
    parser.add_argument("--version", action="version", version=f"ascend-emu {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a torch_npu script on the CPU emulator",
                         description="Run SCRIPT as __main__ with `import torch_npu` resolving to "
                                     "ascend_emu.torch_npu (unless a real torch_npu is installed and "
                                     "--force is not given).")
    run.add_argument("--force", action="store_true",
                     help="use the emulator even if a real torch_npu is installed")
    run.add_argument("--checked", action="store_true",
                     help="checked mode: uninitialised cache reads, duplicate slots and NaN / Inf outputs "
                          "raise (ascend_emu.checked_mode; env ASCEND_EMU_CHECKED=1)")
    run.add_argument("--poison", action="store_true",
                     help="with --checked (implied): fill each cache a writer op first sees with 0xFF bytes "
                          "(NaN / -1) before it writes (env ASCEND_EMU_POISON=1)")
    run.add_argument("--permute-blocks", action="store_true",
                     help="run every step decorated with ascend_emu.block_permutation.permutation_checked twice, "
                          "the second time with the paged caches' physical blocks permuted, and fail at the first "
                          "output that differs (env ASCEND_EMU_PERMUTE_BLOCKS=1)")
    run.add_argument("--traceback", action="store_true",
                     help="on an uncaught exception show the emulator's own frames too (by default the "
                          f"traceback stops at the script's call into ascend_emu; env {ENV_TRACEBACK}=1)")
    run.add_argument("script", help="the Python script to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script (its sys.argv[1:])")
    run.set_defaults(func=cmd_run)

    demo = sub.add_parser("demo", help="a DeepSeek-V3.2 decode step: prolog -> indexer -> sparse attention",
                          description="A DeepSeek-V3.2 decode step on the NumPy API (no torch needed): prefill "
                                      "into an int8 per-tile and a bf16 PA_BSND cache, then npu_mla_prolog_v3 -> "
                                      "npu_lightning_indexer -> sparse attention on both; per-op times, a cache "
                                      "summary and what int8 costs. --layout: the PA_NZ layout showcase "
                                      "through the torch_npu drop-in (needs torch).")
    demo.add_argument("--layout", action="store_true",
                      help="instead: where one token's k_rope lands in a PA_NZ cache (npu_mla_prolog_v3 through "
                           "the drop-in; needs torch)")
    from .demo import DecodeStepConfig, heads_share

    default = DecodeStepConfig()
    for name, help_text in (("context", "tokens in the cache before the step"),
                            ("heads", f"query heads N ({default.heads}: {heads_share(default.heads)})"),
                            ("sparse_count", "indexer top-k"), ("block_size", "cache block size")):
        demo.add_argument(f"--{name.replace('_', '-')}", type=_demo_value(name), default=getattr(default, name),
                          help=f"{help_text} (default {getattr(default, name)})")
    demo.add_argument("--model", choices=("v3.2", "v4"), default="v3.2",
                      help="v4: the DeepSeek-V4-Flash decode step (a CSA and an HCA block, mHC, A2 / A3 path; "
                           f"context {V4_DEMO_CONTEXT} unless --context is given)")
    demo.add_argument("--decode-steps", type=int, default=8, metavar="N",
                      help="--model v4: tokens decoded one by one after the context (default 8)")
    demo.add_argument("--path", choices=("a3", "950"), default="a3",
                      help="--model v4: a3 (Atlas A2 / A3, bf16 caches; default) or 950 (Ascend 950, 640-byte fp8 "
                           "caches)")
    demo.add_argument("--save-cache", metavar="PATH", type=_writable_file,
                      help="write the int8 kv_cache to PATH (.npz, for ascend-emu inspect)")
    from .warmup import _jobs

    demo.add_argument("-j", "--jobs", type=_jobs, default=None, metavar="N",
                      help="while the kernel cache lacks the kernels of the demo's op families (the prolog, the "
                           "sparse attentions, the indexer), compile them in up to N worker processes as the demo "
                           "runs (default: the number of cores this process may use; 1: everything in this "
                           "process)")
    demo.set_defaults(func=cmd_demo)

    warm = sub.add_parser("warmup", help="compile / load every Numba kernel by running each op once on tiny inputs",
                          description="Run every op once per scenario on tiny inputs so that its Numba kernels "
                                      "are compiled into the on-disk cache (run once after installing, or as a CI "
                                      "step before the tests). The last line names the cache directory and the "
                                      "folder to delete to clear it.")
    from .warmup import add_arguments as add_warmup_arguments
    from .warmup import run as run_warmup

    add_warmup_arguments(warm)
    warm.set_defaults(func=run_warmup)

    from .inspect.cli import add_inspect_parser, add_locate_parser

    add_inspect_parser(sub)
    add_locate_parser(sub)

    from .compare.cli import add_compare_parsers

    add_compare_parsers(sub)
    from .fidelity import add_fidelity_parser

    add_fidelity_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``ascend-emu`` console script and of ``python -m ascend_emu``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = build_parser().parse_args(argv)
    ns.argv = argv  # the raw command line: `compare SCRIPT -- ARGS` (argparse drops that `--`)
    return ns.func(ns)
