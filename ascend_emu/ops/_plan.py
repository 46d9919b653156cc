"""The int32[1024] plans of the DeepSeek-V4 ``_metadata`` ops, encoded and checked in one place.

The NPU's metadata ops fill a core-split plan the attention / indexer reads; its content is not
public. The emulator's ``_metadata`` ops return a documented encoding of the call's shapes and
modes instead (word 0 a magic number, word 1 a version, then the fields, then a CRC-32 of the
words before it), and the consuming op rejects a missing plan, a zero-filled one, one another
op made and one built for other shapes, naming the field (docs/ops.md).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from ..errors import ModeError, ShapeError, arg_error
from ._check import check_dtype, required

#: Words in a plan (the NPU's ``int32[1024]``).
METADATA_SIZE = 1024


def crc(x) -> int:
    """CRC-32 of an int32 tensor's values (0 when absent), as a signed int32 plan word."""
    if x is None:
        return 0
    c = zlib.crc32(np.ascontiguousarray(x, dtype=np.int32).tobytes())
    return c - (1 << 32) if c >= 1 << 31 else c


@dataclass(frozen=True)
class PlanFormat:
    """One op's plan: ``fields`` (``magic``, ``version``, ..., then the checksum word),
    ``maker`` the metadata op's name, ``required_note`` why a plan is required, ``maxima`` the
    fields whose values bound the call's (e.g. ``max_seqlen_q``)."""

    magic: int
    version: int
    fields: tuple[str, ...]
    maker: str
    required_note: str
    maxima: tuple[str, str]

    def encode(self, words: list[int]) -> np.ndarray:
        """int32 ``[METADATA_SIZE]``: ``words`` (magic and version first), their checksum, zeros."""
        plan = np.zeros(METADATA_SIZE, np.int32)
        plan[:len(words)] = words
        plan[len(words)] = crc(plan[:len(words)])
        return plan

    def check(self, metadata, expect: dict, maxima: tuple[int, int]) -> None:
        """The consuming op's check: present, int32 ``[METADATA_SIZE]``, made by :attr:`maker`
        (magic, version, checksum) for this call (``expect``: field -> value; ``maxima`` the
        call's values the plan's :attr:`maxima` fields must bound).

        Raises:
            ShapeError: no plan, another shape. DTypeError: not int32.
            ModeError: not made by :attr:`maker`, or made for other values (the field named).
        """
        if metadata is None:
            raise arg_error(ShapeError, "metadata", f"the int32 [{METADATA_SIZE}] plan of {self.maker} "
                            f"({self.required_note})", None)
        plan = required(metadata, "metadata")
        check_dtype(plan, "metadata", ("int32",))
        if plan.shape != (METADATA_SIZE,):
            raise arg_error(ShapeError, "metadata", f"shape [{METADATA_SIZE}]", f"shape {list(plan.shape)}")
        n = len(self.fields) - 1
        head = [int(w) for w in plan[:n + 1]]
        if head[0] != self.magic or head[1] != self.version or head[n] != crc(plan[:n]):
            raise arg_error(ModeError, "metadata", f"a plan made by {self.maker} (magic {self.magic:#x}, version "
                            f"{self.version}, checksum word {n})", f"words[0:2] = {head[:2]}, checksum {head[n]}")
        for field, want in expect.items():
            got = head[self.fields.index(field)]
            if got != want:
                raise arg_error(ModeError, "metadata", f"a plan built for this call's {field} = {want}",
                                f"a plan built for {field} = {got}")
        bound = [head[self.fields.index(f)] for f in self.maxima]
        if maxima[0] > bound[0] or maxima[1] > bound[1]:
            raise arg_error(ModeError, "metadata", f"a plan whose {self.maxima[0]} / {self.maxima[1]} bound this "
                            f"call's {maxima[0]} / {maxima[1]}", f"{bound[0]} / {bound[1]}")
