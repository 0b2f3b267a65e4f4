"""The importer's and exporter's refusals: one reason per kind of problem (docs/onnx.md)."""

from __future__ import annotations

from ..core.errors import WeeiError

__all__ = ["OnnxError"]


class OnnxError(WeeiError):
    """An ONNX file Weei does not import or export; ``reason`` names why (docs/onnx.md)."""
