"""Small type checks for JSON values, shared by the parsers of weei.core.

JSON comes from JavaScript, where there is one number type: ``3`` and
``3.0`` are the same value, and ``true`` is not a number. So an "integer"
here is an int, or a float with an integral value (normalised to int), never
a bool; a "number" is a finite int or float, never a bool. Each helper takes
a ``fail(message)`` callback that raises the caller's own error type, so the
message can name the field in that error's terms.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any, NoReturn

__all__ = [
    "Fail",
    "SAFE_INTEGER",
    "SHA256_HEX",
    "is_integer",
    "as_int",
    "as_number",
    "as_str",
    "as_bool",
    "as_object",
    "as_list",
    "as_sha256",
    "require",
    "no_unknown_keys",
]

Fail = Callable[[str], NoReturn]

#: JavaScript's Number.MAX_SAFE_INTEGER: larger counts are not exact there.
SAFE_INTEGER = 2**53 - 1
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def is_integer(value: Any) -> bool:
    """True for an int or an integral finite float, never for a bool."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and math.isfinite(value) and value.is_integer()


def as_int(value: Any, fail: Fail, minimum: int | None = None, maximum: int = SAFE_INTEGER) -> int:
    """``value`` as an int in ``minimum..maximum``; ``fail`` otherwise."""
    if not is_integer(value):
        fail(f"must be an integer, not {_describe(value)}")
    number = int(value)
    if minimum is not None and number < minimum:
        fail(f"must be {minimum} or more, not {number}")
    if number > maximum:
        fail(f"must be at most {maximum}, not {number}")
    return number


def as_number(value: Any, fail: Fail) -> float | int:
    """``value`` as a finite number (bool refused); ``fail`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(f"must be a number, not {_describe(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        fail(f"must be finite, not {value}")
    return value


def as_str(value: Any, fail: Fail, *, nonempty: bool = True) -> str:
    """``value`` as a str (non-empty unless told); ``fail`` otherwise."""
    if not isinstance(value, str):
        fail(f"must be a string, not {_describe(value)}")
    if nonempty and not value:
        fail("must not be empty")
    return value


def as_bool(value: Any, fail: Fail) -> bool:
    """``value`` as a bool; ``fail`` otherwise."""
    if not isinstance(value, bool):
        fail(f"must be true or false, not {_describe(value)}")
    return value


def as_object(value: Any, fail: Fail) -> dict[str, Any]:
    """``value`` as a JSON object (a dict with str keys); ``fail`` otherwise."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        fail(f"must be an object, not {_describe(value)}")
    return value


def as_list(value: Any, fail: Fail, max_items: int | None = None) -> list[Any]:
    """``value`` as a JSON array (list or tuple); ``fail`` otherwise."""
    if not isinstance(value, (list, tuple)):
        fail(f"must be an array, not {_describe(value)}")
    if max_items is not None and len(value) > max_items:
        fail(f"must have at most {max_items} entries, not {len(value)}")
    return list(value)


def as_sha256(value: Any, fail: Fail) -> str:
    """``value`` as a SHA-256 in 64 lowercase hex digits; ``fail`` otherwise."""
    text = as_str(value, fail)
    if not SHA256_HEX.fullmatch(text):
        fail("must be 64 lowercase hex digits")
    return text


def require(obj: dict[str, Any], key: str, fail: Fail) -> Any:
    """``obj[key]``; ``fail("is required")`` when the key is missing (``fail`` names the key's path)."""
    if key not in obj:
        fail("is required")
    return obj[key]


def no_unknown_keys(obj: dict[str, Any], allowed: frozenset[str] | set[str], fail: Callable[[str], NoReturn]) -> None:
    """``fail(key)`` with the first key of ``obj`` not in ``allowed``."""
    for key in obj:
        if key not in allowed:
            fail(key)


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
