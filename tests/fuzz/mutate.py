"""Seeded structural mutations of JSON values and bytes, shared by the fuzzer and the property tests.

Every function takes a ``random.Random``: the same seed gives the same
inputs, so a failure seen once can be replayed (``run.py --replay``). The
mutations are those issue 9 §4 names: wrong types, deep nesting, huge
numbers, duplicates, unicode, truncation and bit flips, plus deleted,
unknown and repeated fields. ``mutate_value`` keeps to what JSON (or a
JavaScript object) can hold; ``mutate_text`` and ``mutate_bytes`` work on
the serialized form, where the cases a parsed value cannot show live: a
5,000-digit integer, ``1e400``, NaN, a duplicate key, a lone surrogate,
bad UTF-8, 100,000 opening brackets.
"""

from __future__ import annotations

import json
import math
import random
import struct
from collections.abc import Callable
from typing import Any

__all__ = ["deep", "mutate_value", "mutate_text", "mutate_bytes", "mutate_json_bytes", "SCALARS"]

Path = tuple[Any, ...]

#: Replacement scalars: every JSON type, the edges of int and float, and awkward strings.
SCALARS: tuple[Any, ...] = (
    None, True, False, 0, 1, -1, 2, 3, 255, 256, 65535, 2**31 - 1, 2**31, 2**32, 2**53 - 1, 2**53, 2**63, 2**64 - 1,
    2**64, -2**63, 10**30, 10**300, 0.5, -0.0, 1e-320, 1.5e308, 3.0, 16.0, "", "0", "1", "-1", "x", "a" * 64, "0" * 64,
    "f" * 64, " ", "\x00", "\ud800", "\u202e", "é", "日本", "\U0001f600", "null", "true", "[]", "{}", "1e400",
    "18446744073709551616", "../../etc/passwd", "a" * 300,
)
#: Only for values handed over as objects (JavaScript can pass these; JSON text cannot).
NON_FINITE: tuple[float, ...] = (math.nan, math.inf, -math.inf)


def deep(depth: int, leaf: Any = 0) -> Any:
    """``depth`` nested arrays and objects, built without recursion."""
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def _paths(value: Any, limit: int = 2000) -> list[Path]:
    """Paths to the nodes of ``value`` (root first), iteratively, at most ``limit`` of them."""
    out: list[Path] = []
    stack: list[tuple[Path, Any]] = [((), value)]
    while stack and len(out) < limit:
        path, node = stack.pop()
        out.append(path)
        if isinstance(node, dict):
            stack.extend((path + (k,), v) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((path + (i,), v) for i, v in enumerate(node))
    return out


def _get(value: Any, path: Path) -> Any:
    for key in path:
        value = value[key]
    return value


def _set(value: Any, path: Path, new: Any) -> Any:
    """``value`` with the node at ``path`` replaced by ``new``; copies only the containers on the path.

    Iterative: paths into grafted deep values are longer than the interpreter's recursion limit."""
    chain = [value]
    for key in path[:-1]:
        chain.append(chain[-1][key])
    result = new
    for node, key in zip(reversed(chain), reversed(path)):
        copy: Any = dict(node) if isinstance(node, dict) else list(node)
        copy[key] = result
        result = copy
    return result


def _scalar(rng: random.Random, objects: bool) -> Any:
    if objects and rng.random() < 0.05:
        return rng.choice(NON_FINITE)
    return rng.choice(SCALARS)


def _factor(rng: random.Random, large: int, size: int = 1) -> int:
    """How many copies of something ``size`` long: mostly a few; now and then ``large`` (the inputs for
    linear-time checks), which cost the parser far more time than the rest, so they are kept rare. Never so
    many that the copies outgrow MAX_VALUE_JSON: a copy of a copy would otherwise reach gigabytes (a
    MemoryError in the harness, not a finding) before mutate_value's size check sees it."""
    copies = large if rng.random() < 0.1 else rng.choice((2, 3, 10, 50))
    return max(1, min(copies, MAX_VALUE_JSON // max(1, size)))


def _clamp(number: int) -> int:
    return max(-10**300, min(10**300, number))


def _tweak(rng: random.Random, node: Any, objects: bool) -> Any:
    """A value near ``node``: the same type with an edge value, or the same value as another type.

    Each option is a function, so only the chosen one is built (some are large).
    """
    options: tuple[Callable[[], Any], ...]
    if isinstance(node, bool):
        options = (lambda: not node, lambda: int(node), lambda: str(node).lower(), lambda: None)
    elif isinstance(node, int):
        # Kept within 10**300: a JSON text can carry larger (parse_json refuses past 4,300 digits; mutate_text
        # writes those), but as a value such an int could only come from this mutator.
        options = (lambda: node + 1, lambda: node - 1, lambda: -node, lambda: _clamp(node * 2**40),
                   lambda: node + 0.5 if abs(node) < 2**1000 else 0.5,
                   lambda: float(node) if abs(node) < 2**1000 else 1e308, lambda: str(node), lambda: 0,
                   lambda: _clamp(node * 10**20), lambda: [node], lambda: bool(node))
    elif isinstance(node, float):
        options = (lambda: node * 1e300, lambda: -node, lambda: node + 1, lambda: str(node),
                   lambda: int(node) if math.isfinite(node) else 0,
                   lambda: rng.choice(NON_FINITE) if objects else 1e308)
    elif isinstance(node, str):
        options = (lambda: node + "x", lambda: node[:-1], lambda: node.upper(),
                   lambda: node * _factor(rng, 5000, len(node)),
                   lambda: "", lambda: node + "\x00", lambda: node + "\ud800", lambda: "é" + node, lambda: node[::-1],
                   lambda: [node], lambda: {node: node}, lambda: len(node))
    elif isinstance(node, list):
        if not node:
            options = (lambda: [None], lambda: [[]], lambda: [{}], lambda: [0] * 1000)
        else:
            options = (lambda: node[:-1], lambda: node + node, lambda: node * _factor(rng, 2000, len(node)),
                       lambda: node[::-1], lambda: [node[0]] + node, lambda: node[1:] + [node[0]],
                       lambda: {str(i): v for i, v in enumerate(node)})
    elif isinstance(node, dict):
        return _tweak_object(rng, node, objects)
    else:
        return _scalar(rng, objects)
    return rng.choice(options)()


def _tweak_object(rng: random.Random, node: dict[str, Any], objects: bool) -> Any:
    keys = list(node)
    if not keys:
        return rng.choice(({"": None}, {"x": {}}, []))
    key = rng.choice(keys)
    changed = dict(node)
    choice = rng.randrange(6)
    if choice == 0:
        del changed[key]
    elif choice == 1:
        changed["unknownField" + str(rng.randrange(3))] = _scalar(rng, objects)
    elif choice == 2:
        changed[key.upper() if key != key.upper() else key + "_"] = node[key]
    elif choice == 3:
        changed = {k: node[k] for k in reversed(keys)}
    elif choice == 4:
        return list(node.values())
    else:
        changed = {f"k{i}": node[key] for i in range(_factor(rng, 3000))} | changed
    return changed


def mutate_value(rng: random.Random, value: Any, *, objects: bool = False, donors: tuple[Any, ...] = ()) -> Any:
    """One to four structural mutations of a JSON value (a fresh value; ``value`` is not changed).

    ``objects``: the value is handed over as an object (settings from the
    page), so NaN and infinities may appear. ``donors``: other valid samples
    whose nodes may be grafted in (the right shape in the wrong place).
    """
    for _ in range(rng.choice((1, 1, 1, 2, 2, 3, 4))):
        before = value
        value = _mutate_once(rng, value, objects, donors)
        if not _fits_json(value, MAX_VALUE_JSON):
            value = before  # copies of copies: a value no bounded JSON text could carry
    return value


#: The largest JSON text a value handed to a parser could have come from (above every size cap the
#: boundaries apply: 1 MiB metadata and records, the page's messages); larger values are harness artefacts.
MAX_VALUE_JSON = 4 << 20


def _fits_json(value: Any, limit: int) -> bool:
    """Whether ``value``'s JSON text is at most about ``limit`` bytes; stops walking once it is not."""
    size, stack = 0, [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            size += 2 + sum(len(k) + 4 for k in node)
            stack.extend(node.values())
        elif isinstance(node, list):
            size += 2 + len(node)
            stack.extend(node)
        elif isinstance(node, str):
            size += len(node) + 2
        else:
            size += 8
        if size > limit:
            return False
    return True


def _mutate_once(rng: random.Random, value: Any, objects: bool, donors: tuple[Any, ...]) -> Any:
    """One structural mutation of ``value`` (a fresh value)."""
    path = rng.choice(_paths(value))
    node = _get(value, path)
    kind = rng.randrange(10)
    if kind < 4:
        new = _tweak(rng, node, objects)
    elif kind < 6:
        new = _scalar(rng, objects)
    elif kind == 6:
        new = rng.choice(([], {}, [node], {"": node}, deep(rng.choice((8, 63, 64, 65, 66, 200, 600)), node)))
    elif kind == 7:  # another node of this or a donor sample: a valid shape in the wrong place
        source = rng.choice((value, *donors))
        new = _get(source, rng.choice(_paths(source)))
    elif kind == 8 and path:  # the parent holds this entry twice (arrays: a duplicate entry)
        parent = _get(value, path[:-1])
        if isinstance(parent, list):
            index = rng.randrange(len(parent) + 1)
            return _set(value, path[:-1], parent[:index] + [node] + parent[index:])
        new = node
    else:
        new = _tweak(rng, _tweak(rng, node, objects), objects)
    return _set(value, path, new)


_NUMBER_EDGES = ("1e400", "-1e400", "1" * 5000, "-0", "1E+2", "0.1e-400", "NaN", "Infinity", "-Infinity",
                 "123456789012345678901234567890", "1.0", "4294967296", "9007199254740993")


def mutate_text(rng: random.Random, text: str) -> str:
    """A textual mutation of JSON text: edge literals, duplicate keys, brackets, unicode, truncation."""
    kind = rng.randrange(9)
    n = len(text)
    at = rng.randrange(n + 1)
    if kind == 0:  # a number literal becomes an edge literal
        digits = [i for i in range(n) if text[i].isdigit() and (i == 0 or not text[i - 1].isdigit())]
        if digits:
            start = rng.choice(digits)
            end = start
            while end < n and (text[end].isdigit() or text[end] in ".eE+-"):
                end += 1
            return text[:start] + rng.choice(_NUMBER_EDGES) + text[end:]
        return text + rng.choice(_NUMBER_EDGES)
    if kind == 1:  # a duplicate key: the first "key": value of an object is repeated
        brace = text.find("{", at)
        if brace < 0 or brace + 1 >= n or text[brace + 1] != '"':
            brace = text.find('{"')
        if brace >= 0:
            colon = text.find(":", brace)
            comma = text.find(",", colon)
            if colon > 0 and comma > 0:
                pair = text[brace + 1:comma]
                return text[:brace + 1] + pair + "," + text[brace + 1:]
        return text
    if kind == 2:  # deep brackets, closed or not
        depth = rng.choice((65, 1000, 100_000))
        opener = rng.choice(("[", '{"a":'))
        closer = "]" if opener == "[" else "}"
        return text[:at] + opener * depth + "0" + closer * (depth if rng.random() < 0.5 else 0) + text[at:]
    if kind == 3:
        return text[:at]  # truncation
    if kind == 4:  # unicode and escapes
        return text[:at] + rng.choice(('\\ud800', '\\u0000', "é", "\U0001f600", "\\", '"', "\\x", "\u2028")) + text[at:]
    if kind == 5:  # delete a range
        return text[:at] + text[at + rng.randrange(1, 64):]
    if kind == 6:  # repeat a range
        piece = text[at:at + rng.randrange(1, 64)]
        return text[:at] + piece * rng.choice((2, 10)) + text[at:]
    if kind == 7:
        return text[:at] + rng.choice(("null", "true", "[]", "{}", ",", ":", "]", "}", "0", '""', " ")) + text[at:]
    return rng.choice(("", " ", "null", "[]", "{}", "0", '"x"', "[" * 100_000, "{" * 50_000, '{"a":' * 5000))


_INTERESTING = (0, 1, 7, 8, 0x7F, 0x80, 0xFF)
_WORDS = (0, 1, 0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, 65536, 4096)


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    """One to three byte-level mutations: bit flips, edge bytes and words, inserts, deletes, truncation."""
    buf = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 3))):
        n = len(buf)
        kind = rng.randrange(8)
        if kind == 0 and n:
            i = rng.randrange(n)
            buf[i] ^= 1 << rng.randrange(8)
        elif kind == 1 and n:
            buf[rng.randrange(n)] = rng.choice(_INTERESTING)
        elif kind == 2 and n >= 4:
            i = rng.randrange(n - 3)
            word = rng.choice(_WORDS + (n, n - 1, n + 1))
            buf[i:i + 4] = struct.pack("<I", word & 0xFFFFFFFF)
        elif kind == 3:
            i = rng.randrange(n + 1)
            buf[i:i] = rng.randbytes(rng.choice((1, 4, 16, 300)))
        elif kind == 4 and n:
            i = rng.randrange(n)
            del buf[i:i + rng.randrange(1, 64)]
        elif kind == 5:
            del buf[rng.randrange(n + 1):]
        elif kind == 6 and n:
            i = rng.randrange(n)
            buf[i:i] = buf[i:i + rng.randrange(1, 64)] * rng.choice((2, 8))
        else:
            buf += rng.randbytes(rng.choice((1, 8, 64)))
    return bytes(buf)


def mutate_json_bytes(rng: random.Random, value: Any, donors: tuple[Any, ...] = (),
                      dumps: Callable[[Any], str] | None = None) -> bytes:
    """A JSON document as UTF-8 bytes, mutated: in structure (mostly), in text, or in bytes."""
    kind = rng.random()
    if kind < 0.08:
        return (dumps or json.dumps)(value).encode()  # the valid sample itself now and then
    mutated = mutate_value(rng, value, donors=donors) if kind < 0.85 else value
    try:
        text = json.dumps(mutated, ensure_ascii=rng.random() < 0.5)
    except (ValueError, RecursionError):  # a value json cannot write (never from mutate_value, but be safe)
        text = json.dumps(value)
    if len(text) > 1 << 20:  # grafts of grafts: keep inputs near the sizes parsers are handed
        text = json.dumps(value)
    if kind >= 0.6:
        text = mutate_text(rng, text)
    data = text.encode("utf-8", "surrogatepass")
    if kind >= 0.9:
        data = mutate_bytes(rng, data)
    return data
