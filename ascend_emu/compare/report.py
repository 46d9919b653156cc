"""A comparison report over many calls: plain data, text (rich), JSON, CSV, PNG heat maps."""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..inspect.files import jsonable
from .calls import CallReport

#: CSV columns (msprobe's names where it has one).
CSV_COLUMNS = ("call", "op", "api", "call_status", "tensor", "role", "dtype", "shape", "status", "criterion",
               "mismatched", "size", "Cosine", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio",
               "Five Thousandths Err Ratio", "max_int_delta", "nan_mismatch", "inf_mismatch", "ulp_hist", "first_mismatch",
               "reason")

#: Columns of :meth:`Report.to_msprobe_csv`: msprobe's accuracy-check detail names (docs/sources.md#msprobe_metrics;
#: ``api_accuracy_checker/compare/compare_utils.py`` ``DETAIL_TEST_ROWS`` for the
#: "API Name", dtype, "Shape", "Status" and "Message" columns, msprobe compare's metric names).
MSPROBE_CSV_COLUMNS = ("API Name", "Bench Dtype", "DEVICE Dtype", "Shape", "Cosine", "MaxAbsErr", "MaxRelativeErr",
                       "One Thousandth Err Ratio", "Five Thousandths Err Ratio", "Status", "Message")
#: Call / tensor status -> msprobe's pass / warning / error / SKIP (no status maps to warning:
#: a tensor within the criterion passes).
MSPROBE_STATUS = {"identical": "pass", "pass": "pass", "fail": "error", "missing": "error", "emu error": "error",
                  "timeout": "error", "not replayable": "SKIP", "device error": "SKIP", "not compared": "SKIP",
                  "deduplicated": "SKIP"}


#: Call statuses the text report does not list unless asked (``--verbose``): the call passed.
QUIET_STATUSES = ("identical", "pass", "deduplicated")
#: Failing calls the text report lists at most unless asked (``--verbose``); all are in --json / --csv.
LISTED_CALLS = 50


@dataclass
class Report:
    """Per-call comparisons, in call order; ``meta`` holds a dump replay's summary (selection,
    first divergence, per-op counts: :func:`.msprobe.summarize`), None elsewhere."""

    calls: list[CallReport] = field(default_factory=list)
    meta: dict | None = None

    @property
    def summary(self) -> dict:
        """Counts per call status and whether everything is identical / passes."""
        counts: dict[str, int] = {}
        for c in self.calls:
            counts[c.status] = counts.get(c.status, 0) + 1
        out = {"calls": len(self.calls), "by_status": counts,
               "identical": all(c.status == "identical" for c in self.calls),
               "ok": all(c.status in ("identical", "pass") for c in self.calls)}
        if self.meta is not None:
            out.update(self.meta)
        return out

    def to_dict(self) -> dict:
        """Plain data: ``{"summary": ..., "calls": [...]}``."""
        return {"summary": self.summary, "calls": [c.to_dict() for c in self.calls]}

    def to_json(self) -> str:
        """One strict JSON document (NaN / inf as the strings "nan", "inf", "-inf")."""
        return json.dumps(jsonable(self.to_dict()), indent=1, default=str)

    def to_csv(self) -> str:
        """One row per compared tensor (and per call that was not compared)."""
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(CSV_COLUMNS)
        for c in self.calls:
            head = [c.index, c.op, c.api, c.status]
            if not c.tensors:
                w.writerow(head + [""] * (len(CSV_COLUMNS) - 5) + [c.reason or ""])
            for t in c.tensors:
                w.writerow(head + [t.name, t.role, t.dtype, "x".join(map(str, t.shape)), t.status, t.criterion,
                                   t.mismatched, t.size, t.cosine, t.max_abs_err, t.max_rel_err,
                                   t.one_thousandth_ratio, t.five_thousandths_ratio, t.max_int_delta,
                                   t.nan_mismatch, t.inf_mismatch, json.dumps(t.ulp_hist) if t.ulp_hist else "",
                                   json.dumps(t.mismatches[0]) if t.mismatches else "", t.note or c.reason or ""])
            for name, why in c.not_compared.items():
                w.writerow(head + [name, "output", "", "", "not compared"] + [""] * (len(CSV_COLUMNS) - 10) + [why])
        return buf.getvalue()

    def to_msprobe_csv(self) -> str:
        """msprobe's accuracy-check table: one row per output of each call (``API Name`` =
        ``{api}.output.{i}``, ``i`` the output's position; the emulator is the bench, the
        device the device), ``Status`` pass / error / SKIP (:data:`MSPROBE_STATUS`); a call
        that was not compared is one ``SKIP`` row named ``{api}`` with the reason."""
        from .calls import OPS

        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(MSPROBE_CSV_COLUMNS)
        for c in self.calls:
            names = OPS[c.op].outputs if c.op in OPS else ()

            def api(name: str, names=names, c=c) -> str:  # out[i]: an op whose outputs OPS does not name
                i = names.index(name) if name in names else name.removeprefix("out[").removesuffix("]")
                return f"{c.api}.output.{i}"

            if not c.tensors and not c.not_compared:
                w.writerow([c.api, "", "", "", "", "", "", "", "", MSPROBE_STATUS.get(c.status, "error"),
                            f"{c.status}: {c.reason}" if c.reason else c.status])
            for t in c.tensors:
                msg = "; ".join(x for x in (t.status, t.criterion, t.note) if x)
                w.writerow([api(t.name), t.dtype, t.dtype, json.dumps(list(t.shape)), _csv(t.cosine),
                            _csv(t.max_abs_err), _csv(t.max_rel_err), _csv(t.one_thousandth_ratio),
                            _csv(t.five_thousandths_ratio), MSPROBE_STATUS[t.status], msg])
            for name, why in c.not_compared.items():
                w.writerow([api(name), "", "", "", "", "", "", "", "", "SKIP", why])
        return buf.getvalue()

    def listed(self, *, verbose: bool = False, limit: int = LISTED_CALLS) -> tuple[list[CallReport], int, int]:
        """The calls :meth:`render` lists and what it leaves out: ``(calls, quiet, more)``.

        Verbose: every call, in call order (``quiet = more = 0``). Otherwise the calls that did
        not pass (status other than :data:`QUIET_STATUSES`), in call order, so the first
        divergence comes first (a dump replay's ``first_divergence`` is the first failing call in
        that order), at most ``limit`` of them; ``quiet`` counts the passing calls left out,
        ``more`` the failing ones beyond ``limit``."""
        if verbose:
            return list(self.calls), 0, 0
        failing = [c for c in self.calls if c.status not in QUIET_STATUSES]
        return failing[:limit], len(self.calls) - len(failing), max(len(failing) - limit, 0)

    def render(self, console=None, *, details: int = 8, verbose: bool = False, limit: int = LISTED_CALLS) -> None:
        """Print the report as text: the first divergence (a dump replay), one table of the calls
        that did not pass (every call with ``verbose``; at most ``limit`` otherwise:
        :meth:`listed`) and a line counting those left out, then the mismatches of each
        differing tensor of a listed call (at most ``details`` lines each), the calls that were
        not compared and the totals. The table fits ``console.width``
        (:func:`ascend_emu.textview.print_table`: the error ratios, the ulp histogram and the
        dtype are left out first, with a note; op names are split only where the table does not
        fit otherwise, e.g. at 80 columns, never at 120); default console:
        :func:`ascend_emu.textview.console`."""
        from rich.text import Text

        from ..textview import Col, console as text_console, fits, print_table

        console = console or text_console()
        if self.meta is not None:
            console.print(_divergence_line(self.meta))
        calls, quiet, more = self.listed(verbose=verbose, limit=limit)
        cols = [Col("call"), Col("op"), Col("tensor", wrap=True, min=8), Col("dtype", drop=1),
                Col("status", wrap=True), Col("cosine"), Col("max abs"), Col("max rel", drop=3), Col("1/1000", drop=4),
                Col("5/1000", drop=5), Col("mismatched", wrap=True), Col("bf16 ulps", wrap=True, drop=2)]
        style = {"identical": "green", "pass": "yellow", "fail": "red", "missing": "red"}
        rows = []
        for c in calls:
            if not c.tensors:
                rows.append([_label(c), c.op, "-", "-", Text(c.status, style="magenta"), *[""] * 7])
            for t in c.tensors:
                hist = (" ".join(f"{k}:{v}" for k, v in t.ulp_hist.items() if v) if t.ulp_hist else "")
                rows.append([_label(c), c.op, f"{t.name}\n({t.role})", t.dtype,
                             Text(t.status, style=style.get(t.status, "white")), _fmt(t.cosine), _fmt(t.max_abs_err),
                             _fmt(t.max_rel_err), _fmt(t.one_thousandth_ratio), _fmt(t.five_thousandths_ratio),
                             f"{t.mismatched}/{t.size}", hist])
        title = ("ascend-emu compare: device (expected) vs emulator" if verbose else
                 "ascend-emu compare: device (expected) vs emulator, the calls that did not pass")
        if rows and not fits(cols, rows, console.width):  # op names fold only where nothing else fits
            cols[1] = Col("op", wrap=True, min=14)
        if rows:
            print_table(console, title, cols, rows, more="--json / --csv")
        elif not verbose:
            console.print("every call identical or within the criterion")
        if quiet or more:
            left = [f"{quiet} call(s) identical or within the criterion" if quiet else "",
                    f"{more} more call(s) that did not pass" if more else ""]
            console.print(f"not listed: {' and '.join(x for x in left if x)} (-v / --verbose lists every call, "
                          "--json / --csv hold them all)")
        for c in calls:
            if c.reason and c.status != "deduplicated":  # counted in the selection line
                console.print(f"call {_label(c)} {c.api}: [magenta]{c.status}[/]: {c.reason}")
            for t in c.tensors:
                if t.status == "identical":
                    continue
                console.print(f"call {_label(c)} {c.api} {t.name}: {t.status} ({t.criterion}), {t.mismatched} "
                              f"element(s) differ" + (f"; {t.note}" if t.note else ""))
                for m in t.mismatches[:details]:
                    console.print("    " + _where(m))
                if len(t.mismatches) > details:
                    console.print(f"    ... {len(t.mismatches) - details} more listed in the JSON report")
        uncompared: dict[tuple[str, str], int] = {}
        for c in self.calls:
            for name, why in c.not_compared.items():
                uncompared[(f"{c.op} {name}", why)] = uncompared.get((f"{c.op} {name}", why), 0) + 1
        for (what, why), n in uncompared.items():
            console.print(f"{what}: [magenta]not compared[/] in {n} call(s): {why}")
        sources = [src for c in self.calls for src in c.weights.values()]
        if sources:
            n_file = sum(src.startswith("--weights") for src in sources)
            n_missing = sum(src.startswith("not rebuilt") for src in sources)
            n_dump = len(sources) - n_file - n_missing
            console.print(f"FRACTAL_NZ weights (not saved by msprobe): {n_dump} rebuilt from the npu_format_cast "
                          f"inputs in the dump, {n_file} from --weights, {n_missing} not rebuilt (each call's source: "
                          "--json, calls[].weights)")
        s = self.summary
        if self.meta is not None:
            statuses = sorted({k for v in self.meta["per_op"].values() for k in v})
            per_op = [[op, *(str(counts.get(k, 0)) for k in statuses)] for op, counts in self.meta["per_op"].items()]
            print_table(console, "per op", [Col("op")] + [Col(k) for k in statuses], per_op,
                        more="--json")
            sel = self.meta["selection"]
            asked = [f"{k} {','.join(map(str, v))}" for k, v in sel.items()
                     if k not in ("calls", "dedup") and v is not None]
            if sel.get("dedup"):
                n = sum(c.status == "deduplicated" for c in self.calls)
                asked.append(f"dedup: {n} call(s) not replayed, same signature as an earlier one")
            console.print(f"selection: {'; '.join(asked) if asked else 'every call'} ({sel['calls']} call(s))")
        console.print(f"{s['calls']} call(s): " + ", ".join(f"{v} {k}" for k, v in s["by_status"].items()))

    def text(self, width: int = 160, *, verbose: bool = False) -> str:
        """:meth:`render` into a string."""
        from rich.console import Console

        console = Console(file=io.StringIO(), width=width, color_system=None)
        self.render(console, verbose=verbose)
        return console.file.getvalue()

    def heatmaps(self, directory: str | os.PathLike) -> list[str]:
        """Write one PNG heat map (blocks x rows, differing bytes per slot) per mismatching cache
        into ``directory``, titled with the call, its API and the tensor; returns the paths. Needs
        matplotlib (the ``[plot]`` extra)."""
        from ..inspect.plot import plot_diff

        out = []
        Path(directory).mkdir(parents=True, exist_ok=True)
        for c in self.calls:
            for t in c.tensors:
                d = getattr(t, "_diff", None)
                if d is not None and not d.same:
                    title = (f"call {c.index} {c.api}\n{t.name} ({t.role}, {t.dtype} {list(t.shape)}): {t.status}; "
                             f"device (expected) vs emulator")
                    where = "" if c.where is None else f"step{c.where['step']}_rank{c.where['rank']}_"
                    out.append(plot_diff(d, Path(directory) / f"{where}call{c.index:05d}_{c.op}_{t.name}.png",
                                         title=title))
        return out


def _label(c) -> str:
    """A call's number: its index, prefixed by step and rank in a dump replay (``s0 r1 7``)."""
    if c.where is None:
        return str(c.index)
    return f"s{c.where['step']} r{c.where['rank']} {c.index}"


def _divergence_line(meta: dict) -> str:
    d = meta.get("first_divergence")
    if d is None:
        return "first divergence: none (no call's outputs fail)"
    return (f"first divergence: step {d['step']}, rank {d['rank']}, call {d['call']} {d['api']} "
            f"(layer {d['layer']})")


def _csv(v) -> str:
    return "N/A" if v is None else repr(v)


def _fmt(v) -> str:
    if v is None:
        return ""
    return f"{v:.6g}"


def _where(m: dict) -> str:
    if "block" in m:
        extra = f", max ulp {m['max_ulp']}" if m.get("max_ulp") is not None else ""
        extra += f", max int delta {m['max_int_delta']}" if m.get("max_int_delta") is not None else ""
        els = m["elements"]
        shown = ",".join(map(str, els[:16])) + ("..." if len(els) > 16 else "")
        what = f"dims [{shown}]" if m["field"] == "element" else f"{m['field']}[{shown}]"
        return (f"block {m['block']}, row {m['row']} (slot {m['slot']}), head {m['head']}, {what}: "
                f"{m['bytes']} byte(s){extra}")
    return f"index {tuple(m['index'])}: expected {m['expected']!r}, emulator {m['actual']!r}"
