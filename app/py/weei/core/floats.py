"""Finite checks over float32-le bytes, fast in pure Python.

Every weight array that crosses a trust boundary (a checkpoint file, an
update from a peer, a model's output) must hold only finite float32 values.
A Python loop over 16M floats takes seconds (six in Pyodide), so the check
works on whole byte strings instead: a float32 is NaN or infinite exactly
when its 8 exponent bits are all ones, that is bits 0-6 of byte 3 and bit 7
of byte 2 (little-endian). Two strided slices pick those bytes,
``bytes.translate`` maps each to 0 or 1, and the AND of the two masks read as
big integers has a set bit exactly at the non-finite values; the lowest set
bit gives the first index. Everything runs in C inside CPython.
"""

from __future__ import annotations

__all__ = ["BytesLike", "first_non_finite"]

# A float32 little-endian buffer; a memoryview must be C-contiguous bytes.
BytesLike = bytes | bytearray | memoryview

# Byte 3 contributes exponent bits 1-7 (its low 7 bits), byte 2 bit 0 (its top bit).
_HIGH = bytes(1 if (b & 0x7F) == 0x7F else 0 for b in range(256))
_LOW = bytes(1 if b & 0x80 else 0 for b in range(256))


def _as_bytes(data: BytesLike) -> bytes | bytearray | memoryview:
    # A memoryview is viewed as unsigned bytes: strided slices of it copy only
    # the quarter of the data they select.
    if isinstance(data, memoryview):
        return data.cast("B") if data.c_contiguous else memoryview(data.tobytes())
    return data


def first_non_finite(data: BytesLike) -> int | None:
    """Index of the first NaN or infinite float32 in little-endian ``data``.

    Takes: bytes-like, a multiple of 4 bytes long.
    Returns: the element index, or None when every value is finite.
    Raises: ValueError when the length is not a multiple of 4.
    """
    raw = _as_bytes(data)
    if len(raw) % 4:
        raise ValueError(f"{len(raw)} bytes is not a whole number of float32 values")
    high = bytes(raw[3::4]).translate(_HIGH)
    # Most arrays have no candidate at all: skip the big-integer work then.
    if b"\x01" not in high:
        return None
    low = bytes(raw[2::4]).translate(_LOW)
    both = int.from_bytes(high, "little") & int.from_bytes(low, "little")
    if not both:
        return None
    # Back to one byte per element (0 or 1): the first 1 is the first bad value.
    return both.to_bytes(len(high), "little").find(b"\x01")

