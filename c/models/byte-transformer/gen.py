"""Synthetic reasoning text for byte-transformer, deterministic from a seed.

Each line is one small task with its worked answer: additions and
subtractions with carries, sorting, bracket matching, copy and reverse,
boolean logic, maxima and counting. A chunk's text comes from its own
random stream seeded by (SEED, chunk number), so the same seed always gives
the same bytes, whatever Python version (``random.Random`` seeded with an
int is stable, and only ``randrange``/``choice``/``random`` are used).

Files (format weei-bytes-v1, transformer.h): ``b"WBT1"``, u32-le record
count, then records of ``RECORD`` bytes cut from the text at a stride of
``RECORD - 1`` (the last byte of a record, its final target, is the first
input of the next). ``build.py`` calls ``write_data`` for the committed
chunks under app/static/models/byte-transformer/data.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from pathlib import Path

__all__ = ["SEED", "CHUNKS", "RECORDS_PER_CHUNK", "VALIDATION_RECORDS", "RECORD", "MAGIC",
           "task_line", "text", "records_file", "write_data"]

SEED = 20251201
CHUNKS = 55
RECORDS_PER_CHUNK = 48     # 3,072 predicted bytes: about 1.2 s of local training in wasmtime
VALIDATION_RECORDS = 64
RECORD = 65                # TFM_T + 1
MAGIC = b"WBT1"
_VALIDATION_STREAM = 1_000_000  # far from every chunk number


def _digits(r: random.Random, lo: int, hi: int) -> int:
    return r.randrange(10 ** r.randrange(lo, hi + 1))


def _add(r: random.Random) -> str:
    a, b = _digits(r, 1, 4), _digits(r, 1, 4)
    return f"add {a}+{b}={a + b}"


def _sub(r: random.Random) -> str:
    a, b = _digits(r, 1, 4), _digits(r, 1, 4)
    a, b = max(a, b), min(a, b)
    return f"sub {a}-{b}={a - b}"


def _sort(r: random.Random) -> str:
    xs = [r.randrange(10) for _ in range(r.randrange(3, 7))]
    return f"sort {' '.join(map(str, xs))} -> {' '.join(map(str, sorted(xs)))}"


def _word(r: random.Random, lo: int, hi: int) -> str:
    return "".join(r.choice("abcdefghij") for _ in range(r.randrange(lo, hi + 1)))


def _copy(r: random.Random) -> str:
    w = _word(r, 3, 8)
    return f"copy {w} -> {w}"


def _reverse(r: random.Random) -> str:
    w = _word(r, 3, 8)
    return f"rev {w} -> {w[::-1]}"


def _balanced(r: random.Random, pairs: int) -> str:
    if pairs == 0:
        return ""
    inner = r.randrange(pairs)
    o, c = r.choice(("()", "[]", "{}"))
    return o + _balanced(r, inner) + c + _balanced(r, pairs - 1 - inner)


def _matches(s: str) -> bool:
    stack: list[str] = []
    for ch in s:
        if ch in "([{":
            stack.append({"(": ")", "[": "]", "{": "}"}[ch])
        elif not stack or stack.pop() != ch:
            return False
    return not stack


def _brackets(r: random.Random) -> str:
    s = _balanced(r, r.randrange(1, 5))
    if r.random() < 0.5:  # half of them broken: one bracket swapped for another
        k = r.randrange(len(s))
        s = s[:k] + r.choice([c for c in "()[]{}" if c != s[k]]) + s[k + 1:]
    return f"match {s} -> {'yes' if _matches(s) else 'no'}"


def _logic(r: random.Random) -> str:
    vals = [r.random() < 0.5 for _ in range(r.randrange(2, 5))]
    ops = [r.choice(("and", "or", "xor")) for _ in vals[1:]]
    acc = vals[0]
    expr = "TF"[not vals[0]]
    for op, v in zip(ops, vals[1:]):
        acc = (acc and v) if op == "and" else (acc or v) if op == "or" else (acc != v)
        expr += f" {op} {'TF'[not v]}"
    return f"logic {expr} = {'TF'[not acc]}"


def _max(r: random.Random) -> str:
    xs = [r.randrange(100) for _ in range(r.randrange(3, 6))]
    return f"max {' '.join(map(str, xs))} -> {max(xs)}"


def _count(r: random.Random) -> str:
    w = _word(r, 4, 10)
    c = r.choice(w)
    return f"count {c} in {w} -> {w.count(c)}"


_TASKS: tuple[Callable[[random.Random], str], ...] = (
    _add, _sub, _sort, _copy, _reverse, _brackets, _logic, _max, _count)


def task_line(r: random.Random) -> str:
    """One task and its answer, newline-terminated."""
    return r.choice(_TASKS)(r) + "\n"


def text(seed: int, stream: int, nbytes: int) -> bytes:
    """At least ``nbytes`` of task lines from stream ``stream`` of ``seed``."""
    r = random.Random(seed * 1_000_003 + stream)
    out: list[str] = []
    size = 0
    while size < nbytes:
        line = task_line(r)
        out.append(line)
        size += len(line)
    return "".join(out).encode("ascii")


def records_file(seed: int, stream: int, count: int) -> bytes:
    """A weei-bytes-v1 file of ``count`` records from one stream."""
    stride = RECORD - 1
    body = text(seed, stream, count * stride + 1)
    records = b"".join(body[k * stride:k * stride + RECORD] for k in range(count))
    return MAGIC + struct.pack("<I", count) + records


def write_data(out_dir: Path, seed: int = SEED) -> list[Path]:
    """Write training-001..055.bin and validation.bin into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for k in range(1, CHUNKS + 1):
        path = out_dir / f"training-{k:03d}.bin"
        path.write_bytes(records_file(seed, k, RECORDS_PER_CHUNK))
        written.append(path)
    path = out_dir / "validation.bin"
    path.write_bytes(records_file(seed, _VALIDATION_STREAM, VALIDATION_RECORDS))
    written.append(path)
    return written
