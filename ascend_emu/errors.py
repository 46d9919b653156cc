"""Errors and warnings raised by ascend_emu.

Every error names the argument, what was expected and what was given, so a rejected call can be
fixed from the message alone. All errors subclass ``ValueError`` or ``TypeError`` (docs/numerics.md#errors),
so callers that already catch those keep working. The torch_npu drop-in raises them as
:func:`runtime_error_class` variants, which are ``RuntimeError`` too, as torch_npu's rejections
are (``assertRaisesRegex(RuntimeError, ...)`` and ``except ValueError`` both catch them).
"""

from __future__ import annotations

import functools

import numpy as np


class AscendEmuError(Exception):
    """Base class of every error this package raises on purpose."""


class ShapeError(AscendEmuError, ValueError):
    """An argument has the wrong shape, or two shapes disagree."""


class DTypeError(AscendEmuError, TypeError):
    """An argument has a dtype the op does not accept in the selected mode."""


class ModeError(AscendEmuError, ValueError):
    """An unknown mode string, or an illegal combination of modes."""


class IndexRangeError(AscendEmuError, ValueError):
    """An index (cache_index, block id, slot) lies outside the cache it addresses."""


class FormatError(AscendEmuError, ValueError):
    """A tensor is not in the storage format the op requires (e.g. FRACTAL_NZ)."""


class ArgumentError(AscendEmuError, TypeError):
    """A call does not fit the op's signature: too many positional arguments, an unknown keyword,
    an argument given twice or a required one missing (the drop-in's schemas)."""


class BackendUnavailable(AscendEmuError, RuntimeError):
    """The selected backend cannot run here (e.g. ``hw`` without the real torch_npu or an NPU
    device); the message names what is missing and how to get it."""


class DuplicateSlotWarning(UserWarning):
    """Two tokens write the same cache slot; on hardware the result is undefined."""


class HostTensorWarning(UserWarning):
    """Checked mode: an NPU op called with every tensor on the CPU (a forgotten ``.npu()``),
    which the hardware rejects."""


class UninitializedReadError(AscendEmuError, ValueError):
    """Checked mode: an op reads a cache slot never written since the cache was created or
    poisoned (:mod:`ascend_emu.checked_mode`)."""


class DuplicateSlotError(AscendEmuError, ValueError):
    """Checked mode: two tokens write the same cache slot (a :class:`DuplicateSlotWarning`
    outside checked mode)."""


class NonFiniteOutputError(AscendEmuError, ValueError):
    """Checked mode: an op's output holds a NaN or an Inf."""


class InputContractWarning(UserWarning):
    """A serving step's inputs break a contract the kernels rely on (non-decreasing prefix sums,
    block-table tails, slot padding, V4 state block 0, one block per request);
    :mod:`ascend_emu.input_contracts`."""


class InputContractError(AscendEmuError, ValueError):
    """Checked mode: an :class:`InputContractWarning` made an error."""


class NonFiniteInputError(AscendEmuError, ValueError):
    """An input the op quantizes holds a NaN or an Inf where the sources define no bytes for it
    (the DeepSeek-V4 fp8 / int8 cache quants, docs/v4.md)."""


class NotEmulatedError(AscendEmuError, NotImplementedError):
    """A framework-namespace op whose schema is registered (so code that looks it up finds it)
    but whose behaviour the public sources do not define well enough to emulate; the message
    names the op and what is missing (docs/v4.md)."""


class _RuntimeCompatible(RuntimeError):
    """Mixin of the :func:`runtime_error_class` variants (pickled as the variant of their base)."""

    def __reduce__(self):
        return _rebuild_runtime, (type(self).__mro__[1], self.args)


@functools.cache
def runtime_error_class(cls: type[AscendEmuError]) -> type[AscendEmuError]:
    """The variant of ``cls`` that is also a ``RuntimeError`` (same name and message; one class
    per ``cls``): what the torch_npu drop-in raises, since torch_npu rejects a call with a
    ``RuntimeError`` (docs/numerics.md#errors). ``cls`` itself when it already is one."""
    if issubclass(cls, RuntimeError):
        return cls
    return type(cls.__name__, (cls, _RuntimeCompatible), {
        "__module__": cls.__module__, "__qualname__": cls.__qualname__,
        "__doc__": f"{cls.__name__} raised through the torch_npu drop-in: also a RuntimeError."})


def as_runtime_error(error: AscendEmuError) -> AscendEmuError:
    """``error`` as its :func:`runtime_error_class` variant (the same message, traceback and
    cause; ``error`` itself when it already is a ``RuntimeError``)."""
    if isinstance(error, RuntimeError):
        return error
    new = runtime_error_class(type(error))(*error.args)
    new.__cause__, new.__suppress_context__ = error.__cause__, error.__suppress_context__
    return new.with_traceback(error.__traceback__)


def _rebuild_runtime(cls: type[AscendEmuError], args: tuple) -> AscendEmuError:
    return runtime_error_class(cls)(*args)


#: Longest value text a message carries; longer text (a tensor's repr) is cut with "...".
MAX_VALUE_CHARS = 120
#: Longest text a caller formats itself (shapes, hints) that a message carries.
MAX_FORMATTED_CHARS = 400
#: Values shown from an array.
SHOWN_VALUES = 4


def describe(value) -> str:
    """A short, one-line description of ``value`` for an error message.

    Arrays and tensors (anything with ``shape`` and ``dtype``, NumPy or torch) give their shape,
    dtype and at most :data:`SHOWN_VALUES` values, never the whole tensor; a list / tuple holding
    them its length and its first two elements so described; other values their ``repr``, cut
    to :data:`MAX_VALUE_CHARS` characters.
    """
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None and not isinstance(value, np.generic):
        try:
            shape = [int(s) for s in shape]
            size = int(np.prod(shape, dtype=np.int64))
            # element by element: no copy of a huge or strided array
            shown = [value[np.unravel_index(i, shape)] for i in range(min(size, SHOWN_VALUES))]
            shown = [str(v.item() if hasattr(v, "item") else v) for v in shown]
        except Exception:  # noqa: BLE001  (a description must never raise)
            return f"a {type(value).__name__}"
        dtype_text = str(dtype).replace("torch.", "")
        values = ", ".join(shown) + (", ..." if size > SHOWN_VALUES else "")
        kind = "tensor" if type(value).__module__.startswith("torch") else "array"
        return f"a {shape} {dtype_text} {kind}" + (f" ({values})" if size else "")
    if isinstance(value, (list, tuple)):
        head = value[:_SEQUENCE_HEAD]  # a long list is described by its head: never a scan of millions
        if any(_is_array(v) or isinstance(v, (list, tuple)) for v in head):
            # a sequence holding arrays: each element described, never an element's repr
            shown = "; ".join(describe(v) for v in value[:2]) + ("; ..." if len(value) > 2 else "")
            return _shorten(f"a {type(value).__name__} of {len(value)}: [{shown}]", MAX_FORMATTED_CHARS)
        if len(value) > _SEQUENCE_HEAD:
            text = repr(head)
            return _shorten(f"a {type(value).__name__} of {len(value)}: {text[:-1]}, ...{text[-1]}")
    return _shorten(repr(value))


#: Elements of a list / tuple :func:`describe` looks at.
_SEQUENCE_HEAD = 64


def _is_array(value) -> bool:
    return getattr(value, "shape", None) is not None and getattr(value, "dtype", None) is not None


def _shorten(text: str, limit: int = MAX_VALUE_CHARS) -> str:
    text = " ".join(text.split())  # one line
    return text if len(text) <= limit else text[:limit - 3] + "..."


def arg_error(cls: type[AscendEmuError], name: str, expected: str, got: object) -> AscendEmuError:
    """Build ``cls`` with the house message format: ``name: expected ..., got ...``.

    ``got`` is shown as given when it is a string the caller formatted (cut to one line of
    :data:`MAX_FORMATTED_CHARS`), else through :func:`describe` (an array: shape, dtype, a few
    values).
    """
    got = _shorten(got, MAX_FORMATTED_CHARS) if isinstance(got, str) else describe(got)
    return cls(f"{name}: expected {expected}, got {got}")


def not_emulated(owner: str, name: str, emulated, *, listed_in: str, mock: str) -> AttributeError:
    """The ``AttributeError`` for an op ``owner.name`` the emulator does not have.

    It says the op is not emulated (not that the module lacks an attribute), names the closest
    emulated op when one is close (``difflib``), where the emulated ones are listed
    (``listed_in``), and how to mock it for code that calls it (``mock``: the object to patch,
    e.g. ``torch_npu``). An ``AttributeError``, so ``hasattr`` / ``getattr(..., default)`` work
    as before.
    """
    import difflib

    emulated = sorted(emulated)
    near = difflib.get_close_matches(name, emulated, n=1, cutoff=0.75)
    closest = f" (did you mean {near[0]!r}?)" if near else ""
    return AttributeError(
        f"{owner}.{name} is not emulated by ascend_emu{closest}; the {len(emulated)} emulated "
        f"op{'' if len(emulated) == 1 else 's'} are listed in "
        f"{listed_in}; to run code that calls it, mock it, e.g. "
        f"monkeypatch.setattr({mock}, {name!r}, fake, raising=False) or "
        f"unittest.mock.patch.object({mock}, {name!r}, create=True)", name=name, obj=None)
