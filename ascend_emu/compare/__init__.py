"""The real NPU against the emulator: recordings, replays and comparison reports.

Pure and data-first: :func:`compare_tensor` / :func:`compare_call` return dataclasses
(``to_dict()``); :class:`Report` renders them as rich text, JSON, CSV or PNG heat maps. The
vocabulary is that of Ascend's own tools (msprobe compare, torch_npu's ``assertRtolEqual``), see
:mod:`.metrics`. :class:`Recorder` captures torch_npu op calls (:mod:`.record` documents the
on-disk format), :func:`replay` runs a call on the ``emu`` backend, :mod:`.msprobe` reads and
writes msprobe tensor dumps (a whole dump call by call, on the engines of :mod:`ascend_emu.workers`). The
``ascend-emu record | compare | replay`` commands live in :mod:`.cli`.
"""

from .calls import OPS, Call, CallReport, EmuResult, OpInfo, TensorValue, compare_call, replay
from .metrics import (RTOL_PREC, ULP_BINS, TensorComparison, compare_tensor, msprobe_metrics, rtol_equal,
                      ulp_distance)
from .record import FORMAT, VERSION, Recorder, RecordWriter, read_record
from .report import Report

__all__ = ["OPS", "Call", "CallReport", "EmuResult", "OpInfo", "TensorValue", "compare_call", "replay",
           "RTOL_PREC", "ULP_BINS", "TensorComparison", "compare_tensor", "msprobe_metrics", "rtol_equal",
           "ulp_distance", "FORMAT", "VERSION", "Recorder", "RecordWriter", "read_record", "Report"]
