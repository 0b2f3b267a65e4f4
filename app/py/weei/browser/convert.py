"""Moving values between Python and JavaScript in the page (Pyodide only).

Two directions, each in one place:

* :func:`to_js_value` — a JSON-like Python value (dicts, lists, strings,
  numbers, booleans, None) with ``bytes`` anywhere inside becomes a plain JS
  value: dicts become plain objects (not ``Map``), bytes a ``Uint8Array``
  holding a copy. IndexedDB clones what it is given at ``put`` time.
* :func:`from_js_value` — the reverse: plain objects become dicts, typed
  arrays and ``ArrayBuffer`` become ``bytes``, JS ``null`` (Pyodide's
  ``jsnull``) and ``undefined`` become ``None``.

:func:`json_text` serialises the API's state and results for the page:
JSON keeps ``null`` (``to_js`` would turn ``None`` into ``undefined``) and
refuses ``bytes``, so a state that would leak weights fails loudly here.
"""

from __future__ import annotations

import json
import math
from typing import Any

import js  # type: ignore[import-not-found]
from pyodide.ffi import JsProxy, to_js  # type: ignore[import-not-found]

try:  # JS null arrives as this sentinel in recent Pyodide (as None before)
    from pyodide.ffi import jsnull  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover
    jsnull = None

__all__ = ["to_js_value", "from_js_value", "json_text", "is_nullish", "js_bytes"]


def is_nullish(value: Any) -> bool:
    """True for JS ``null``/``undefined`` (and Python ``None``)."""
    return value is None or value is jsnull


def js_bytes(value: Any) -> bytes:
    """``bytes`` from an ``ArrayBuffer`` or typed array (one bulk copy).

    Raises ``TypeError`` for anything else.
    """
    if isinstance(value, JsProxy) and hasattr(value, "to_bytes"):
        return bytes(value.to_bytes())
    raise TypeError(f"expected an ArrayBuffer or a typed array, got {type(value).__name__}")


def to_js_value(value: Any) -> Any:
    """A plain JS value for a JSON-like Python value; bytes become ``Uint8Array`` copies."""
    return to_js(value, dict_converter=js.Object.fromEntries)


def _fix(value: Any) -> Any:
    if value is jsnull:
        return None
    if isinstance(value, memoryview):
        return value.tobytes()
    if isinstance(value, dict):
        return {str(k): _fix(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_fix(v) for v in value]
    if isinstance(value, JsProxy) and hasattr(value, "to_bytes"):
        return bytes(value.to_bytes())
    return value


def from_js_value(value: Any) -> Any:
    """The Python value of a structured-cloneable JS value (see the module docstring)."""
    if is_nullish(value):
        return None
    if isinstance(value, JsProxy):
        if hasattr(value, "to_bytes"):  # ArrayBuffer, typed arrays, DataView
            return bytes(value.to_bytes())
        return _fix(value.to_py())
    return value


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def json_text(value: Any) -> str:
    """JSON for the page. Non-finite floats become null (JSON has no NaN).

    Raises ``TypeError`` for bytes or other values JSON cannot hold.
    """
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"))
    except ValueError:
        return json.dumps(_finite(value), allow_nan=False, separators=(",", ":"))
