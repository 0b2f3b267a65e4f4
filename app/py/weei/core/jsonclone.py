"""A deep copy of a JSON-shaped value, without ``copy.deepcopy``'s memo and dispatch (~4x its speed).

Stores copy what they hold on the way in and out (a coordinator writes its members record at every change
of who takes part), and a diagnostics recorder hands out its sections in every snapshot (several a message
at a Flower node): both hold dicts, lists and scalars only. Anything else is left to ``copy.deepcopy``.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["clone_json"]

_IMMUTABLE = frozenset({str, int, float, bool, bytes, type(None)})


def clone_json(value: Any) -> Any:
    """A deep copy of ``value``; its strings and numbers are shared (they cannot change)."""
    kind = type(value)
    if kind is dict:
        return {k: v if type(v) in _IMMUTABLE else clone_json(v) for k, v in value.items()}
    if kind is list:  # a job's members are a list of peer ids: their strings are kept, not called for
        return [v if type(v) in _IMMUTABLE else clone_json(v) for v in value]
    if kind in _IMMUTABLE:
        return value
    return copy.deepcopy(value)
