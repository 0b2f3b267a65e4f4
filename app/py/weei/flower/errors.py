"""What the Flower transport refuses in a Flower message: one reason per kind of problem (docs/flower.md)."""

from __future__ import annotations

from enum import Enum

from ..core.errors import WeeiError

__all__ = ["FlowerError", "FlowerReason"]


class FlowerReason(str, Enum):
    """Why a Flower message was not taken as Weei's (docs/flower.md, "Refusals")."""

    WRONG_RECORD = "wrong-record"
    """The content is not the RecordDict, ArrayRecord or ConfigRecord Weei writes there."""
    WRONG_STYPE = "wrong-stype"
    """An Array's serialization type is not numpy's."""
    WRONG_DTYPE = "wrong-dtype"
    """An Array's data type is not the one Weei writes (float32 weights, uint8 bytes)."""
    WRONG_SHAPE = "wrong-shape"
    """An Array is not one-dimensional, or its bytes are not whole values."""
    TOO_LARGE = "too-large"
    """An Array or the attachments together exceed the record limit."""
    BAD_ARRAY = "bad-array"
    """An Array's bytes do not decode."""
    HASH_MISMATCH = "hash-mismatch"
    """An attachment's bytes do not match the SHA-256 or size they travel under."""
    BAD_JSON = "bad-json"
    """A message's text is not one of Weei's wire messages."""
    MISSING_ATTACHMENT = "missing-attachment"
    """A message names attachments that are neither attached nor held by the node."""
    UNSAFE_STATE_DIR = "unsafe-state-dir"
    """A node's state directory (``weei-state-dir``) is not this user's own, closed to others (0700)."""
    RESIDENT_FAILED = "resident-failed"
    """A node's resident participant did not start, or failed to answer a message."""


class FlowerError(WeeiError):
    """A Flower message Weei does not take; ``reason`` names why (docs/flower.md)."""

    reasons = (FlowerReason,)
