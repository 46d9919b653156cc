"""Environment variables read on every op call, cheaply.

``os.environ.get(name)`` of an unset variable raises and catches a KeyError inside ``os`` (about
0.7 us, more on cold caches); the settings read per call (the SoC, the backend, the widened-weight
limit) are usually unset, so :func:`getenv` answers an unset one with a dict look-up first.
"""

from __future__ import annotations

import os

#: Encoded keys of the names looked up so far (``os.environ``'s own key encoding).
_KEYS: dict[str, object] = {}


def getenv(name: str, default: str | None = None) -> str | None:
    """``os.environ.get(name, default)``, read at every call (a change is seen at once)."""
    env = os.environ
    data = getattr(env, "_data", None)  # os._Environ's encoded mapping; anything else: its own get
    if data is not None:
        key = _KEYS.get(name)
        if key is None:
            key = _KEYS[name] = env.encodekey(name)
        if key not in data:
            return default
    return env.get(name, default)
