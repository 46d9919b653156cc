"""``ascend-emu``: run torch_npu scripts on the CPU, show a demo, map cache bytes.

Commands:

- ``ascend-emu run [--force] SCRIPT [ARGS...]``: run SCRIPT as ``__main__`` with ``import torch_npu``
  resolving to :mod:`ascend_emu.torch_npu`, as ``python SCRIPT ARGS...`` would: ``sys.argv``,
  an absolute ``__file__`` (and traceback paths), the script's directory in place of the
  launcher's ``sys.path[0]``, its exit status. If a real torch_npu is installed the script runs
  against it unless ``--force`` is given.
- ``ascend-emu demo``: ``npu_mla_prolog_v3`` through the drop-in, then where one token's k_rope
  landed in a PA_NZ cache, checked byte by byte against a PA_BSND run.
- ``ascend-emu locate``: the forward / reverse map of a paged cache
  (:class:`ascend_emu.layouts.CacheLayout`): byte offset -> block, row, head, dim, byte; slot, dim
  -> byte offset; ``--combined`` names the field of a 656-byte row (:data:`ascend_emu.quant.MLA_ROW`).
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import io
import json
import os
import sys
import time
import types

from . import __version__

#: How to get torch when it is missing (the ``[torch]`` extra of this package).
TORCH_HINT = ('install it with:  pip install -e ".[torch]"   (or: pip install torch; CPU-only wheels: '
              "pip install torch --index-url https://download.pytorch.org/whl/cpu)")


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


def _show_script_exception(script: str, exc: BaseException) -> None:
    """Report ``exc`` as Python reports an uncaught exception of a script: traceback from the
    script's first frame on (the launcher's frames dropped), through ``sys.excepthook``."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    sys.excepthook(type(exc), exc.with_traceback(tb), tb)


def _run_as_main(path: str) -> None:
    """Execute the script at absolute ``path`` as ``__main__``, as ``python path`` does (its own
    ``__main__`` module in ``sys.modules`` while it runs; no ``__future__`` flags of this file)."""
    with io.open_code(path) as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__cached__ = None
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    finally:
        sys.modules["__main__"] = saved


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
    if not getattr(sys.flags, "safe_path", False):  # python -P (3.11+) adds no script directory
        sys.path[0] = os.path.dirname(os.path.realpath(script))  # the launcher's entry (cwd / bin)
    try:
        _run_as_main(path)
    except (SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # noqa: BLE001  (shown like Python shows it, then exit 1 / 130)
        _show_script_exception(path, exc)
        return 130 if isinstance(exc, KeyboardInterrupt) else 1
    return 0


# ---------------------------------------------------------------------------------------- demo
def cmd_demo(ns: argparse.Namespace) -> int:
    """``ascend-emu demo``: npu_mla_prolog_v3 (bf16, PA_NZ) through the drop-in, then layout debugging."""
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

    def nz_to_bsnd(cache, dim):
        c0 = 32 // cache.element_size()
        return cache.reshape(block_num, dim // c0, block_size, c0).permute(0, 2, 1, 3).reshape(cache.shape)

    same_caches = all(torch.equal(nz_to_bsnd(nz, d).view(torch.int16), nd.view(torch.int16))
                      for nz, nd, d in ((kv_nz, kv_nd, Hckv), (kr_nz, kr_nd, Dr)))
    same_query = torch.equal(query.view(torch.int16), query_nd.view(torch.int16)) and torch.equal(
        query_rope.view(torch.int16), query_rope_nd.view(torch.int16))
    print(f"  whole kv_cache and kr_cache, PA_NZ bytes re-ordered to BSND == PA_BSND run: {same_caches}")
    print(f"  query / query_rope identical in both runs: {same_query}")
    print("\nmore: ascend-emu locate --cache-mode PA_NZ --shape "
          f"{','.join(map(str, kr_nz.shape))} --dtype bfloat16 --slot {slot}")
    return 0 if (same_row and same_caches and same_query) else 1


# ---------------------------------------------------------------------------------------- locate
def _parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(v) for v in text.replace("x", ",").split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 4,16,1,64, got {text!r}")
    if not shape or any(v <= 0 for v in shape):
        raise argparse.ArgumentTypeError(f"expected positive sizes, got {text!r}")
    return shape


def _name_row_field(info: dict, row_byte: int) -> str:
    """Add the 656-byte-row field of ``row_byte`` to ``info``; return the line saying it."""
    from .quant import MLA_ROW

    field, elem, k = MLA_ROW.field_of_byte(row_byte)
    info.update(field=field, field_element=elem, field_byte=k)
    return f"\n  656-byte row byte {row_byte}: {field}[{elem}], byte {k}"


def cmd_locate(ns: argparse.Namespace) -> int:
    """``ascend-emu locate``: see the module doc."""
    import numpy as np

    from .errors import AscendEmuError
    from .layouts import CacheLayout
    from .ops._check import DTYPES
    from .quant import MLA_ROW

    try:
        dtype = DTYPES[ns.dtype]
        layout = CacheLayout.from_declared(ns.cache_mode, ns.shape, dtype.itemsize, name="--shape")
        if ns.combined and (dtype.itemsize != 1 or layout.dim != MLA_ROW.row_bytes or layout.nz):
            raise AscendEmuError(f"--combined: expected an int8 ND-mode cache with D={MLA_ROW.row_bytes} "
                                 f"(656-byte rows), got {ns.dtype} D={layout.dim} cache_mode {layout.mode}")
        info = {"cache_mode": layout.mode, "shape": list(ns.shape), "dtype": ns.dtype,
                "storage_shape": list(layout.storage_shape()), "nbytes": layout.nbytes}
        if layout.nz:
            info["C0"] = layout.c0
        if ns.byte is not None:
            loc = layout.locate(ns.byte)
            info.update(byte_offset=ns.byte, block=loc.block, row=loc.row, slot=layout.slot_of(loc),
                        head=loc.head, dim=loc.dim, byte_in_element=loc.byte)
            text = (f"byte {ns.byte} -> block {loc.block}, row {loc.row} (slot {layout.slot_of(loc)}), "
                    f"head {loc.head}, dim {loc.dim}, byte {loc.byte} of the element")
            if ns.combined:
                text += _name_row_field(info, loc.dim)
        else:
            block, row = divmod(ns.slot, layout.block_size) if 0 <= ns.slot else (None, None)
            if ns.dim is not None:
                off = layout.byte_offset(ns.slot, ns.dim, ns.head)
                info.update(slot=ns.slot, block=block, row=row, head=ns.head, dim=ns.dim, byte_offset=off,
                            element_offset=off // layout.itemsize)
                text = (f"slot {ns.slot} (block {block}, row {row}), head {ns.head}, dim {ns.dim} -> bytes "
                        f"[{off}, {off + layout.itemsize}) (element offset {off // layout.itemsize})")
                if ns.combined:
                    text += _name_row_field(info, ns.dim)
            else:
                layout.byte_offset(ns.slot, 0)  # range check
                per_chunk = layout.chunk_bytes // layout.itemsize
                offsets = [int(o) for o in layout.chunk_offsets(np.array([ns.slot]))[0]]
                info.update(slot=ns.slot, block=block, row=row, chunk_bytes=layout.chunk_bytes,
                            chunks=[{"elements": [j * per_chunk, (j + 1) * per_chunk], "byte_offset": o}
                                    for j, o in enumerate(offsets)])
                lines = [f"slot {ns.slot} = block {block}, row {row}: {len(offsets)} contiguous chunk(s) of "
                         f"{layout.chunk_bytes} bytes"]
                what = "dims" if layout.heads == 1 else "elements (head-major)"
                lines += [f"  {what} [{j * per_chunk}, {(j + 1) * per_chunk}) -> bytes [{o}, "
                          f"{o + layout.chunk_bytes})" for j, o in enumerate(offsets)]
                text = "\n".join(lines)
    except (AscendEmuError, KeyError) as exc:
        _err(f"locate: {exc}")
        return 2
    print(json.dumps(info) if ns.json else text)
    return 0


# ---------------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    """The ``ascend-emu`` argument parser."""
    from .layouts import CACHE_MODE_ALIASES, CACHE_MODES

    parser = argparse.ArgumentParser(
        prog="ascend-emu", description="Emulate Huawei Ascend NPU (torch_npu) MLA operators on the CPU.")
    parser.add_argument("--version", action="version", version=f"ascend-emu {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a torch_npu script on the CPU emulator",
                         description="Run SCRIPT as __main__ with `import torch_npu` resolving to "
                                     "ascend_emu.torch_npu (unless a real torch_npu is installed and "
                                     "--force is not given).")
    run.add_argument("--force", action="store_true",
                     help="use the emulator even if a real torch_npu is installed")
    run.add_argument("script", help="the Python script to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script (its sys.argv[1:])")
    run.set_defaults(func=cmd_run)

    demo = sub.add_parser("demo", help="run npu_mla_prolog_v3 and show where k_rope lands in a PA_NZ cache",
                          description="A self-contained showcase (needs torch): npu_mla_prolog_v3 through "
                                      "the torch_npu drop-in, then bit-level cache layout debugging.")
    demo.set_defaults(func=cmd_demo)

    loc = sub.add_parser("locate", help="map cache byte offsets to (block, row, head, dim) and back",
                         description="Forward / reverse address map of a paged KV cache. Declared shapes: "
                                     "PA_* [BlockNum, BlockSize, Nkv, D]; BSND [B, S, Nkv, D]; TND [T, Nkv, D]; "
                                     "Norm [B, 1, cache_length, D].")
    loc.add_argument("--cache-mode", required=True, choices=list(CACHE_MODES) + list(CACHE_MODE_ALIASES),
                     help="cache layout")
    loc.add_argument("--shape", required=True, type=_parse_shape, help="declared cache shape, e.g. 4,16,1,64")
    loc.add_argument("--dtype", required=True, choices=["bfloat16", "float16", "float32", "int8"],
                     help="cache dtype")
    what = loc.add_mutually_exclusive_group(required=True)
    what.add_argument("--byte", type=int, help="reverse map: byte offset from the start of the cache")
    what.add_argument("--slot", type=int, help="forward map: global slot (block * BlockSize + row)")
    loc.add_argument("--dim", type=int, help="with --slot: element of the row (byte of the row with --combined)")
    loc.add_argument("--head", type=int, default=0, help="with --slot --dim: kv head (default 0)")
    loc.add_argument("--combined", action="store_true",
                     help="int8 cache of 656-byte rows (512 int8 k_nope | 64 bf16 k_rope | 4 fp32 scales): "
                          "name the field of the byte")
    loc.add_argument("--json", action="store_true", help="print one JSON object")
    loc.set_defaults(func=cmd_locate)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``ascend-emu`` console script and of ``python -m ascend_emu``."""
    ns = build_parser().parse_args(argv)
    if ns.command == "locate" and ns.byte is not None and (ns.dim is not None or ns.head != 0):
        build_parser().error("locate: --dim / --head go with --slot, not --byte")
    if ns.command == "locate" and ns.dim is None and ns.head != 0:
        build_parser().error("locate: --head needs --dim")
    return ns.func(ns)
