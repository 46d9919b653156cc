"""The deterministic-mode switch (docs/numerics.md#deterministic): on, every product of every op
runs in one fixed accumulation order (:mod:`ascend_emu.emu.matmul`), the same bytes on every host,
BLAS, thread count and CPU feature set; off (the default), products run on the fastest engine.

Two ways in, read at every call:

- :data:`ENV` (``ASCEND_EMU_DETERMINISTIC``): ``1`` on, ``0`` or unset off; the NumPy API, the
  CLI and the drop-in all read it. Every op checks it when it picks its backend
  (:func:`ascend_emu.ops._backend.get_backend`), so another value is rejected before the op
  writes anything.
- :func:`scope`: the torch_npu drop-in runs each op inside ``scope(True)`` when
  ``torch.are_deterministic_algorithms_enabled()`` (``torch.use_deterministic_algorithms(True)``),
  which turns the mode on for that call whatever :data:`ENV` says (per thread / async context).
"""

from __future__ import annotations

import contextvars

from ._env import getenv
from .errors import ModeError, arg_error

#: Environment variable of the mode: ``1`` on, ``0`` or unset off (module doc).
ENV = "ASCEND_EMU_DETERMINISTIC"
_SCOPE: contextvars.ContextVar[bool] = contextvars.ContextVar("ascend_emu_deterministic", default=False)


def enabled() -> bool:
    """Whether products run in the fixed order now: inside :func:`scope` ``(True)``, or :data:`ENV`
    set to ``1``.

    Raises:
        ModeError: :data:`ENV` set to something other than ``0`` / ``1`` / empty.
    """
    if _SCOPE.get():
        return True
    text = getenv(ENV, "")
    if text in ("", "0"):
        return False
    if text == "1":
        return True
    raise arg_error(ModeError, ENV, "'1' (deterministic) or '0' / unset (fast)", repr(text))


class scope:  # noqa: N801 (used as a context manager, like contextlib's)
    """``with scope(on):`` the mode is on inside where ``on`` is true; a false ``on`` changes
    nothing (:data:`ENV` still decides)."""

    __slots__ = ("on", "token")

    def __init__(self, on: bool) -> None:
        self.on = bool(on)
        self.token = None

    def __enter__(self) -> scope:
        if self.on:
            self.token = _SCOPE.set(True)
        return self

    def __exit__(self, *exc) -> None:
        if self.token is not None:
            _SCOPE.reset(self.token)
            self.token = None
