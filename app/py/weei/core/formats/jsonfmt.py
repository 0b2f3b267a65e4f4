"""JSON text exactly as JavaScript's ``JSON.stringify`` writes it.

Weei hashes JSON that browsers produce (the spec's inline package files are
described by the size and SHA-256 of ``JSON.stringify(value, null, 2) +
"\\n"``) and writes JSON that browsers read, so Python must produce the same
bytes as JavaScript, not merely equivalent JSON. The differences from
``json.dumps`` that matter:

* numbers follow ECMAScript Number::toString: ``1`` not ``1.0``, ``1e+21``,
  ``1e-7``, ``0.000001``, ``-0`` as ``0``; NaN and the infinities become
  ``null``; the digits are the shortest that round-trip (which is what
  Python's ``repr`` gives, only the layout differs);
* strings keep non-ASCII characters as they are and escape only ``"``,
  ``\\``, control characters (``\\b \\f \\n \\r \\t``, else ``\\u00xx`` in
  lowercase hex) and lone surrogates (``\\udxxx``);
* an object's keys that are array indices ("0", "17") come first in
  ascending numeric order, the other keys in insertion order, because that is
  the property order of a JavaScript object built by ``JSON.parse``;
* with an indent, empty containers stay ``[]`` and ``{}`` and the indent is
  clamped to 10 spaces, as in JavaScript.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any, NamedTuple

from ..errors import UsageError, UsageReason

__all__ = ["stringify", "number_to_string", "descriptor", "inline_file", "Descriptor"]

# Characters JSON.stringify escapes: '"', '\\', C0 controls and surrogates.
# A Python str can hold a surrogate *pair* as two code points; in JavaScript
# that is one well-formed character, which JSON.stringify keeps as it is.
_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f\ud800-\udfff]')
_PAIR = re.compile(r"[\ud800-\udbff][\udc00-\udfff]")
_SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Canonical array index: "0" or no leading zero, value below 2**32 - 1.
_INDEX = re.compile(r"0|[1-9][0-9]{0,9}")
_MAX_INDEX = 2**32 - 2
_SAFE_INTEGER = 2**53


class Descriptor(NamedTuple):
    """Size and SHA-256 of an inline package file, as a manifest describes it."""

    bytes: int
    sha256: str


def _escape_char(match: re.Match[str]) -> str:
    ch = match.group(0)
    short = _SHORT.get(ch)
    if short is not None:
        return short
    return f"\\u{ord(ch):04x}"


def _join_pair(match: re.Match[str]) -> str:
    hi, lo = (ord(c) for c in match.group(0))
    return chr(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))


def _quote(text: str) -> str:
    if _NEEDS_ESCAPE.search(text) is None:
        return f'"{text}"'
    # Join well-formed surrogate pairs first so only lone surrogates remain.
    text = _PAIR.sub(_join_pair, text)
    return '"' + _NEEDS_ESCAPE.sub(_escape_char, text) + '"'


def number_to_string(value: float) -> str:
    """ECMAScript Number::toString of a float, as JSON.stringify writes it.

    Takes: a float (ints go through :func:`stringify`).
    Returns: the JavaScript text; ``"null"`` for NaN and the infinities, as
    JSON.stringify gives.
    """
    if not math.isfinite(value):
        return "null"
    if value == 0:
        return "0"  # also -0: JavaScript writes "0"
    sign = "-" if value < 0 else ""
    text = repr(abs(value))
    # repr gives the shortest round-trip digits as "d.ddd", "ddd.d" or
    # "d.ddde+XX"; normalise to digits k and n with value = 0.digits * 10**n.
    mantissa, _, exp = text.partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    n = len(whole) + (int(exp) if exp else 0)
    if whole == "0":  # "0.000123": the leading zeros of frac shift n down
        stripped = frac.lstrip("0")
        n = -(len(frac) - len(stripped)) + (int(exp) if exp else 0)
        digits = stripped
    digits = digits.rstrip("0") or "0"
    k = len(digits)
    # The cases of ECMA-262 Number::toString(x), steps for radix 10.
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * (-n) + digits
    e = n - 1
    exp_text = ("+" if e >= 0 else "-") + str(abs(e))
    if k == 1:
        return sign + digits + "e" + exp_text
    return sign + digits[0] + "." + digits[1:] + "e" + exp_text


def _int_to_string(value: int) -> str:
    if -_SAFE_INTEGER < value < _SAFE_INTEGER:
        return str(value)
    # Beyond 2**53 a JavaScript number is the nearest double, and prints so.
    try:
        return number_to_string(float(value))
    except OverflowError:
        return "null"  # JavaScript parses such a literal as Infinity


def _ordered_items(obj: dict[Any, Any]) -> list[tuple[str, Any]]:
    indexed: list[tuple[int, str, Any]] = []
    named: list[tuple[str, Any]] = []
    for key, item in obj.items():
        if not isinstance(key, str):
            raise UsageError(UsageReason.UNSUPPORTED_JSON_KEY, f"JSON object keys must be strings, not {type(key).__name__}")
        if _INDEX.fullmatch(key) and int(key) <= _MAX_INDEX:
            indexed.append((int(key), key, item))
        else:
            named.append((key, item))
    if not indexed:
        return named
    indexed.sort(key=lambda entry: entry[0])
    return [(key, item) for _, key, item in indexed] + named


def _write(value: Any, indent: str, level: str, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(_quote(value))
    elif isinstance(value, int):
        out.append(_int_to_string(value))
    elif isinstance(value, float):
        out.append(number_to_string(value))
    elif isinstance(value, (list, tuple)):
        if not value:
            out.append("[]")
            return
        inner = level + indent
        sep = ",\n" + inner if indent else ","
        out.append("[\n" + inner if indent else "[")
        for i, item in enumerate(value):
            if i:
                out.append(sep)
            _write(item, indent, inner, out)
        out.append("\n" + level + "]" if indent else "]")
    elif isinstance(value, dict):
        items = _ordered_items(value)
        if not items:
            out.append("{}")
            return
        inner = level + indent
        sep = ",\n" + inner if indent else ","
        colon = ": " if indent else ":"
        out.append("{\n" + inner if indent else "{")
        for i, (key, item) in enumerate(items):
            if i:
                out.append(sep)
            out.append(_quote(key))
            out.append(colon)
            _write(item, indent, inner, out)
        out.append("\n" + level + "}" if indent else "}")
    else:
        raise UsageError(UsageReason.UNSUPPORTED_JSON_TYPE, f"cannot write {type(value).__name__} as JSON")


def stringify(value: Any, indent: int | None = None) -> str:
    """``JSON.stringify(value, null, indent)`` of JSON-shaped Python data.

    Takes: None, bool, int, float, str, list/tuple and dict with str keys,
    nested; ``indent`` as JavaScript's numeric space argument (clamped to
    0..10; 0 or None writes compact JSON).
    Returns: the same text JavaScript returns for the equivalent value.
    Raises: UsageError for any other type or a non-str key.
    """
    spaces = 0 if indent is None else max(0, min(10, int(indent)))
    out: list[str] = []
    _write(value, " " * spaces, "", out)
    return "".join(out)


def inline_file(value: Any) -> bytes:
    """The bytes of an inline package file: UTF-8 of ``stringify(value, 2) + "\\n"``.

    Takes: the file's JSON value. Returns: its bytes. Raises: as :func:`stringify`.
    """
    return (stringify(value, 2) + "\n").encode("utf-8")


def descriptor(value: Any) -> Descriptor:
    """Size and lowercase SHA-256 of :func:`inline_file` of ``value``.

    Takes: the file's JSON value. Returns: ``Descriptor(bytes, sha256)``,
    which unpacks as a tuple. Raises: as :func:`stringify`.
    """
    data = inline_file(value)
    return Descriptor(len(data), hashlib.sha256(data).hexdigest())
