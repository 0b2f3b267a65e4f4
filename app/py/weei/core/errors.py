"""The error types of Weei.

Two kinds, kept apart on purpose (as in h11): ``UsageError`` means our caller
asked for something not allowed now; every other ``WeeiError`` means some
input (a file, a manifest, a peer's message) is bad. Each carries a stable
``reason`` code so callers and tests can tell problems apart without parsing
prose, and the message names the field or file at fault.
"""

from __future__ import annotations

from enum import Enum

__all__ = [
    "WeeiError",
    "UsageError",
    "SettingsError",
    "ManifestError",
    "CheckpointError",
    "ModelError",
    "AggregationError",
]


class WeeiError(Exception):
    """Base of every Weei error: ``reason`` is a short kebab-case code.

    Each family lists its codes in a ``str`` enum (``FrameReason``,
    ``MessageReason``, ...); the error keeps the plain string value, so it
    compares, prints and crosses to JavaScript exactly as before.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason: str = reason.value if isinstance(reason, Enum) else reason
        self.message = message

    def __str__(self) -> str:
        return f"{self.message} [{self.reason}]"


class UsageError(WeeiError):
    """The caller asked for something not allowed in the current role or state."""


class SettingsError(WeeiError):
    """Training or aggregation settings are invalid; ``field`` names the culprit."""

    def __init__(self, field: str, message: str, reason: str = "invalid-setting") -> None:
        super().__init__(reason, f"settings.{field}: {message}")
        self.field = field


class ManifestError(WeeiError):
    """A dataset manifest, model package manifest or model info is invalid."""


class CheckpointError(WeeiError):
    """A .weei-checkpoint file failed a check when read (or could not be written)."""


class ModelError(WeeiError):
    """The model module was refused, or one of its operations failed."""


class AggregationError(WeeiError):
    """A round could not be aggregated (for example a non-finite result)."""
