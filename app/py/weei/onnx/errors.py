"""The importer's and exporter's refusals: one reason per kind of problem (docs/onnx.md)."""

from __future__ import annotations

from enum import Enum

from ..core.errors import WeeiError

__all__ = ["OnnxError", "OnnxReason"]


class OnnxReason(str, Enum):
    """Why an ONNX file was not imported or exported (docs/onnx.md, "Refusals")."""

    ONNX_TOO_LARGE = "onnx-too-large"
    """A file over 256 MiB, or a message with too many fields."""
    MALFORMED_ONNX = "malformed-onnx"
    """Not a well-formed ONNX protobuf."""
    UNSUPPORTED_OPSET = "unsupported-opset"
    """An opset the importer does not implement."""
    TOO_MANY_NODES = "too-many-nodes"
    """More than 10,000 nodes."""
    TENSOR_TOO_LARGE = "tensor-too-large"
    """An initializer or constant over 2^26 elements."""
    EXTERNAL_DATA = "external-data"
    """Weights in a side file."""
    UNSUPPORTED_TYPE = "unsupported-type"
    """A tensor type other than the supported ones."""
    UNSUPPORTED_OPERATOR = "unsupported-operator"
    """An operator the importer does not implement."""
    UNSUPPORTED_ATTRIBUTE = "unsupported-attribute"
    """An attribute value the importer does not implement."""
    UNSUPPORTED_GRAPH = "unsupported-graph"
    """A graph shape the importer does not train (inputs, outputs, trained tensors)."""
    BAD_SHAPE = "bad-shape"
    """Shapes that do not fit, or an activation over 2^22 values per example."""
    BAD_GRAPH = "bad-graph"
    """The graph is malformed: a node reads what nothing produced, lacks an input or output, or has a bad value."""
    GRAPH_CYCLE = "graph-cycle"
    """The graph has a cycle."""
    BAD_SETTING = "bad-setting"
    """An import setting (loss, data, batch) does not fit the graph."""
    NO_DATA = "no-data"
    """No training data was given."""
    NOT_AN_ONNX_PACKAGE = "not-an-onnx-package"
    """Export was asked of a package not imported from ONNX."""
    CHECKPOINT_MISMATCH = "checkpoint-mismatch"
    """The checkpoint is not of this package's model."""
    WEIGHT_SIZE_MISMATCH = "weight-size-mismatch"
    """The weights' size differs from the graph's trained tensors."""
    BAD_RUNTIME = "bad-runtime"
    """The ONNX runtime module has no graph slot, or one in use."""


class OnnxError(WeeiError):
    """An ONNX file Weei does not import or export; ``reason`` names why (docs/onnx.md)."""

    reasons = (OnnxReason,)
