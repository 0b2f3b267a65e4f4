"""Small type checks for JSON values, shared by the parsers of weei.core.

JSON comes from JavaScript, where there is one number type: ``3`` and
``3.0`` are the same value, and ``true`` is not a number. So an "integer"
here is an int, or a float with an integral value (normalised to int), never
a bool; a "number" is a finite int or float, never a bool. Each helper takes
a ``fail(message)`` callback that raises the caller's own error type, so the
message can name the field in that error's terms.

``Where`` is the usual ``fail``: a path in the document plus the error type
and reason to raise there (``Where(ManifestError, ManifestReason.INVALID_PACKAGE,
"package").at("files")`` fails with ``package.files: <message>``). Its
``get``/``read`` take a field out of an object and check it in one step.

Untrusted JSON passes ``parse_json`` (bytes or text) or ``check_depth`` (a
value parsed elsewhere) before anything walks it recursively: deepcopy,
json.dumps and the parsers recurse once per level, so a 100,000-deep array
would otherwise escape as RecursionError. ``first_duplicate`` keeps
duplicate checks linear (a set, never ``list.count`` per item).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, TypeGuard, TypeVar

__all__ = [
    "Fail",
    "Where",
    "nullable",
    "as_sha256",
    "as_choice",
    "SAFE_INTEGER",
    "SHA256_HEX",
    "is_integer",
    "as_int",
    "as_number",
    "as_str",
    "as_bool",
    "as_object",
    "as_list",
    "require",
    "no_unknown_keys",
    "MAX_JSON_DEPTH",
    "check_depth",
    "parse_json",
    "first_duplicate",
]

Fail = Callable[[str], NoReturn]

#: JavaScript's Number.MAX_SAFE_INTEGER: larger counts are not exact there.
SAFE_INTEGER = 2**53 - 1
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
#: The deepest nesting of arrays and objects accepted from outside. Every
#: document of the spec nests under 16 levels; 64 leaves room and keeps any
#: recursive walk (deepcopy, json.dumps) far from the interpreter's limit.
MAX_JSON_DEPTH = 64

T = TypeVar("T")


@dataclass(frozen=True)
class Where:
    """A place in a JSON document, and the error raised for a bad value there.

    A ``Where`` is a ``Fail``: calling it with a message raises
    ``error(reason, f"{path}: {message}")``.
    """

    error: Callable[[Any, str], Exception]
    reason: Any  # a member of the error family's reason enum
    path: str

    def __call__(self, message: str) -> NoReturn:
        raise self.error(self.reason, f"{self.path}: {message}")

    def at(self, key: str | int) -> Where:
        """The place of a field (``path.key``) or an array entry (``path[i]``)."""
        if isinstance(key, int):
            return self._with_path(f"{self.path}[{key}]")
        return self._with_path(f"{self.path}.{key}" if self.path else key)

    def _with_path(self, path: str) -> Where:
        # One is made for every field a parser reads (peers' messages and diagnostics: ~190,000 for 1,000
        # Flower clients); a frozen dataclass's __init__ sets each field through object.__setattr__, 3x the
        # cost of filling the new instance's __dict__ at once. Still frozen, equal and hashed by its fields.
        where = object.__new__(Where)
        where.__dict__.update(error=self.error, reason=self.reason, path=path)
        return where

    def because(self, reason: Any) -> Where:
        """The same place, failing with another reason code."""
        return Where(self.error, reason, self.path)

    def get(self, obj: Mapping[str, Any], key: str, missing: str = "is required") -> Any:
        """``obj[key]``; fails at ``path.key`` when the key is absent."""
        if key not in obj:
            self.at(key)(missing)
        return obj[key]

    def read(self, obj: Mapping[str, Any], key: str, check: Callable[..., T], **options: Any) -> T:
        """``check(obj[key], <place of key>, **options)``: a required field, checked."""
        return check(self.get(obj, key), self.at(key), **options)

    def no_unknown_keys(self, obj: Mapping[str, Any], allowed: Collection[str]) -> None:
        """Fails at ``path.key`` for the first key of ``obj`` not in ``allowed``."""
        for key in obj:
            if key not in allowed:
                self.at(key)("is not a known field")


def nullable(check: Callable[..., T]) -> Callable[..., T | None]:
    """``check`` that lets ``None`` (JSON null) through as None."""

    def read(value: Any, fail: Fail, **options: Any) -> T | None:
        return None if value is None else check(value, fail, **options)

    return read


def is_integer(value: Any) -> TypeGuard[int | float]:
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


def as_number(value: Any, fail: Fail, minimum: float | None = None, maximum: float | None = None) -> float | int:
    """``value`` as a finite number (bool refused) in ``minimum..maximum``; ``fail`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        fail(f"must be a number, not {_describe(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        fail(f"must be finite, not {value}")
    if minimum is not None and value < minimum:
        fail(f"must be {minimum:g} or more, not {value!r}")
    if maximum is not None and value > maximum:
        fail(f"must be at most {maximum:g}, not {value!r}")
    return value


def as_str(value: Any, fail: Fail, *, nonempty: bool = True, max_chars: int | None = None) -> str:
    """``value`` as a str (non-empty unless told, at most ``max_chars`` long); ``fail`` otherwise."""
    if not isinstance(value, str):
        fail(f"must be a string, not {_describe(value)}")
    if nonempty and not value:
        fail("must not be empty")
    if max_chars is not None and len(value) > max_chars:
        fail(f"must be at most {max_chars} characters, not {len(value)}")
    return value


def as_sha256(value: Any, fail: Fail) -> str:
    """``value`` as a SHA-256 in 64 lowercase hex digits; ``fail`` otherwise."""
    if not isinstance(value, str) or not SHA256_HEX.fullmatch(value):
        fail("must be 64 lowercase hex digits")
    return value


def as_choice(value: Any, fail: Fail, allowed: Collection[str]) -> str:
    """``value`` as one of the strings ``allowed``; ``fail`` otherwise."""
    if not isinstance(value, str) or value not in allowed:
        shown = repr(value[:40]) if isinstance(value, str) else _describe(value)
        fail(f"must be one of {', '.join(allowed)}, not {shown}")
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


def check_depth(value: Any, fail: Fail, max_depth: int = MAX_JSON_DEPTH) -> None:
    """``fail`` when arrays and objects in ``value`` nest deeper than ``max_depth``.

    Iterative (an explicit stack), so it never recurses itself; it visits
    each container once, so it is linear in the size of ``value``.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth > max_depth:
            fail(f"nests deeper than {max_depth} levels")
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list, tuple)))


def parse_json(data: str | bytes | bytearray | memoryview, fail: Fail, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse untrusted JSON (UTF-8 bytes or text); ``fail`` for anything but JSON nesting at most ``max_depth``.

    NaN and Infinity are refused, as JSON.parse refuses them. Nesting is
    measured on the text before parsing: in Pyodide the C parser's recursion
    can exhaust the WebAssembly stack (a fatal error, not a RecursionError)
    before the interpreter's limit is reached.
    """
    try:
        text = data if isinstance(data, str) else bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        fail(f"is not UTF-8 ({exc.reason})")
    # Fewer brackets than the limit cannot nest past it: the count skips stripping strings, the costly part.
    if text.count("[") + text.count("{") > max_depth and _text_depth(text, max_depth) > max_depth:
        fail(f"nests deeper than {max_depth} levels")
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        fail(f"nests deeper than {max_depth} levels")
    except ValueError as exc:
        fail(f"is not valid JSON ({exc})")
    # No second walk of the value: in text that parsed, brackets outside strings are its containers,
    # so the text's depth is the value's (test_parser_hostile checks the two agree).
    return value


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')  # unrolled: one step per run of plain characters
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _text_depth(text: str, limit: int) -> int:
    """The deepest nesting of brackets outside strings, counted up to ``limit`` + 1 (linear time)."""
    depth = peak = 0
    for ch in _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)):
        depth += 1 if ch in "[{" else -1
        if depth > peak:
            peak = depth
            if peak > limit:
                break
    return peak


def first_duplicate(items: Iterable[T]) -> T | None:
    """The first item seen twice in ``items`` (hashable), or None; linear time."""
    seen: set[T] = set()
    for item in items:
        if item in seen:
            return item
        seen.add(item)
    return None


def _refuse_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


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
